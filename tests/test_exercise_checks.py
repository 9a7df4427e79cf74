"""The exercise checks of notebooks 00 to 03: they run the learner's code, pass a right answer, explain a wrong one."""
from __future__ import annotations

import json

from durable_kit import immediate
from durable_kit.lab import checks
from durable_kit.retries import (AmbiguousEffect, FormatFailure, InvalidRequest, PolicyDenied, RateLimited,
                                 Transient)

FINISHED = "SELECT output FROM steps WHERE workflow_id = ? AND name = ? AND status = 'complete'"


def said(capsys) -> str:
    return capsys.readouterr().out.strip()


def stub(*args):
    raise NotImplementedError("not written yet")


def test_predicted_calls(capsys):
    checks.check_predicted_calls(..., 16)
    assert said(capsys).startswith("not yet:")
    checks.check_predicted_calls(15, 16)
    assert said(capsys).startswith("not quite: you predicted 15 model calls, the ledger counted 16.")
    checks.check_predicted_calls("16", 16)
    assert said(capsys).startswith("not quite: the prediction should be an int")
    checks.check_predicted_calls(16, 16)
    assert said(capsys) == "pass: 16 model calls, as the ledger counted"


def store_then_return(journal, workflow_id, name, activity, recheck):
    row = journal.conn.execute(FINISHED, (workflow_id, name)).fetchone()
    if row is not None:
        return json.loads(row["output"])
    output = activity()
    with immediate(journal.conn):
        row = journal.conn.execute(FINISHED, (workflow_id, name)).fetchone() if recheck else None
        if row is not None:
            return json.loads(row["output"])
        journal.conn.execute("INSERT INTO steps (workflow_id, name, status, output, attempts) VALUES (?, ?, 'complete', ?, 1)"
                             " ON CONFLICT (workflow_id, name) DO UPDATE SET output = excluded.output",
                             (workflow_id, name, json.dumps(output)))
    return output


def test_execute_step_passes_the_reference_and_catches_an_overwrite(capsys):
    checks.check_execute_step(stub)
    assert said(capsys).startswith("not yet:")
    checks.check_execute_step(lambda j, w, n, a: store_then_return(j, w, n, a, recheck=True))
    assert said(capsys).startswith("pass:")
    checks.check_execute_step(lambda j, w, n, a: store_then_return(j, w, n, a, recheck=False))
    assert said(capsys).startswith("not quite: the stored output was replaced")
    checks.check_execute_step(lambda j, w, n, a: a())  # never stores anything
    assert said(capsys).startswith("not quite: the step's row should be stored")


def reference_classify(response):
    status, message = response["status"], response.get("message", "")
    if status is None or status >= 500:
        return AmbiguousEffect(message) if response["sends"] else Transient(message)
    if status == 429:
        return RateLimited(message, retry_after=float(response["retry_after"]))
    if status == 403:
        return PolicyDenied(message)
    if status == 200:
        return FormatFailure("prose")
    return InvalidRequest(message)


def test_classify(capsys):
    checks.check_classify(stub)
    assert said(capsys).startswith("not yet:")
    checks.check_classify(reference_classify)
    assert said(capsys) == "pass: all 7 responses take the path they need"
    checks.check_classify(lambda r: Transient(r.get("message", "")))
    assert said(capsys).startswith("not quite: 5 of 7 responses take the wrong path")
    checks.check_classify(lambda r: "transient")
    assert "return an exception instance" in said(capsys)


def test_kill_after_fetch_runs_real_processes(capsys):
    checks.check_kill_after_fetch(stub)
    assert said(capsys).startswith("not yet:")
    checks.check_kill_after_fetch(checks.run_kill_after_fetch, {"exit_code": -9, "source_calls": 2})
    assert said(capsys) == ("pass: SIGKILL at after_fetch: exit code -9, two source calls, one passage, "
                            "one finding")
    checks.check_kill_after_fetch(checks.run_kill_after_fetch, {"exit_code": 13, "source_calls": 2})
    assert said(capsys).startswith("not quite: your code is right, your predictions are not: exit_code")

    def exits_politely(db):
        from durable_kit.agents.checkpoints import attempt_in_child, open_checkpoints, saved_state
        from durable_kit.faults import arm, disarm_all
        conn = open_checkpoints(db)
        arm(conn, "after_fetch", "exit")
        code = attempt_in_child(db)
        disarm_all(conn)
        attempt_in_child(db)
        return code, saved_state(db)

    checks.check_kill_after_fetch(exits_politely)
    assert said(capsys).startswith("not quite: the database should show one crash point fired, "
                                   "'after_fetch (kill)'; it shows ['after_fetch (exit)']")


# --- notebook 08: check_resume_context -----------------------------------------------------------------------------

def right_resume(run, store, gaps, planned_searches):
    for finding in store.findings.values():
        for passage_id in finding.cites:
            if passage_id not in store.passages:
                raise KeyError(f"finding {finding.id!r} cites passage {passage_id!r}, which is not stored")
    return {"request": run["request"], "source_scope": run["source_scope"], "user_input": list(run["user_input"]),
            "unresolved_gaps": dict(gaps), "planned_searches": list(planned_searches),
            "findings": [{**f.to_dict(), "evidence": [store.passages[p].to_dict() for p in f.cites]}
                         for f in store.findings.values()]}


def resume_variant(change):
    """The right answer with one change applied to the context it returns."""
    def resume(run, store, gaps, planned_searches):
        context = right_resume(run, store, gaps, planned_searches)
        change(context, store)
        return context
    return resume


def test_resume_context_passes_the_right_answer(capsys):
    checks.check_resume_context(right_resume)
    assert said(capsys) == ("pass: the next input holds the saved state and nothing else, and a dangling "
                            "citation is refused by name")
    checks.check_resume_context(stub)
    assert said(capsys).startswith("not yet:")


def test_resume_context_refuses_a_context_without_the_users_answer(capsys):
    checks.check_resume_context(resume_variant(lambda context, store: context.pop("user_input")))
    assert said(capsys).startswith("not quite: the context lacks ['user_input']")
    # The answer's words are in no passage: a context that drops user_input cannot pass by quoting one.
    run, store, gaps, planned = checks.resume_example()
    assert checks.RESUME_ANSWER not in json.dumps([store.to_dict(), gaps, planned])


def test_resume_context_refuses_an_unfinished_response(capsys):
    checks.check_resume_context(resume_variant(lambda context, store: context.update(last_response="Sure! …")))
    assert said(capsys).startswith("not quite: the context holds ['last_response'], which is not saved state")
    checks.check_resume_context(resume_variant(lambda context, store: context["user_input"].append("Sure! …")))
    assert said(capsys).startswith("not quite: context['user_input'] is")


def test_resume_context_refuses_findings_without_their_passages_or_merged_by_passage(capsys):
    def claims_only(context, store):
        for finding in context["findings"]:
            finding.pop("evidence")
    checks.check_resume_context(resume_variant(claims_only))
    assert said(capsys).startswith("not quite: finding 'f-share' should be finding.to_dict() plus 'evidence'")

    def one_per_passage(context, store):
        context["findings"] = list({f["cites"][0]: f for f in context["findings"]}.values())
    checks.check_resume_context(resume_variant(one_per_passage))
    assert said(capsys).startswith("not quite: the findings are ['f-risk'], the store holds ['f-risk', 'f-share']")
    checks.check_resume_context(resume_variant(lambda context, store: context.update(unresolved_gaps={})))
    assert said(capsys).startswith("not quite: context['unresolved_gaps'] is {}")


def test_resume_context_refuses_a_dangling_citation_skipped_or_unnamed(capsys):
    def skips_missing(run, store, gaps, planned_searches):
        context = right_resume(run, type(store)(passages=store.passages, findings={
            k: f for k, f in store.findings.items() if all(p in store.passages for p in f.cites)}), gaps,
            planned_searches)
        return context
    checks.check_resume_context(skips_missing)
    assert said(capsys).startswith("not quite: finding 'f-mill' cites 'tallis-fy2024-rf-99', which is not in the "
                                   "store, and no error was raised")

    def no_check(run, store, gaps, planned_searches):  # fails on the lookup with a KeyError naming the passage only
        return {**right_resume(run, type(store)(passages=store.passages), gaps, planned_searches),
                "findings": [{**f.to_dict(), "evidence": [store.passages[p].to_dict() for p in f.cites]}
                             for f in store.findings.values()]}
    checks.check_resume_context(no_check)
    assert said(capsys).startswith("not quite: the error for a dangling citation should name the finding 'f-mill'")


# --- notebook 05: check_notify ---------------------------------------------------------------------------------------

def notify_with(key=lambda wf: f"{wf.id}:notify", dedupe=True, step="notify"):
    from durable_kit.fakes.notifier import Notifier

    def notify(wf, message):
        notifier = Notifier.beside(wf.db_path, dedupe=dedupe)
        return wf.execute_step(step, lambda: notifier.send(message["to"], message["message"], key(wf)), message)
    return notify


def test_notify_passes_a_key_sent_to_a_deduplicating_notifier(capsys):
    checks.check_notify(notify_with())
    assert said(capsys) == "pass: 2 requests, 1 delivery, key 'notify-1:notify'"
    checks.check_notify(stub)
    assert said(capsys).startswith("not yet:")


def test_notify_refuses_each_half_missing_and_a_key_from_the_attempt(capsys):
    import uuid
    checks.check_notify(notify_with(key=lambda wf: None, dedupe=False))  # the naive version
    assert said(capsys).startswith("not quite: 2 requests reached the notifier and the customer got 2 messages")
    checks.check_notify(notify_with(dedupe=False))  # a key, to a notifier that ignores keys
    assert said(capsys).startswith("not quite: 2 requests reached the notifier and the customer got 2 messages")
    checks.check_notify(notify_with(key=lambda wf: None))  # a deduplicating notifier, sent no key
    assert said(capsys).startswith("not quite: 2 requests reached the notifier and the customer got 2 messages")
    checks.check_notify(notify_with(key=lambda wf: f"{wf.id}:notify:{uuid.uuid4()}"))  # new on every attempt
    assert said(capsys).startswith("not quite: each attempt sent a new key")
    checks.check_notify(notify_with(key=lambda wf: "notify"))  # the action alone: every workflow shares it
    assert said(capsys).startswith("not quite: the key was 'notify'")
    checks.check_notify(notify_with(step="send"))
    assert said(capsys).startswith("not quite: the notify step ran 0 time(s), not 2")


# --- notebook 06: check_fenced_write ---------------------------------------------------------------------------------

INSERT_STEP = ("INSERT INTO steps (workflow_id, name, status, output, attempts) VALUES (?, ?, 'complete', ?, 1)")


def save_with(fence):
    from durable_kit.leases import check

    def save(conn, lease, step, output):
        if fence == "before":
            check(conn, lease)  # outside the write's transaction
        with immediate(conn):
            if fence == "inside":
                check(conn, lease)
            conn.execute(INSERT_STEP, (lease.workflow_id, step, json.dumps(output)))
    return save


def test_fenced_write_passes_a_check_inside_the_transaction(capsys):
    checks.check_fenced_write(save_with("inside"))
    assert said(capsys) == "pass: refused token 1; stored worker-b's output with token 2"
    checks.check_fenced_write(stub)
    assert said(capsys).startswith("not yet:")


def test_fenced_write_refuses_no_check_a_check_before_begin_and_refusing_everyone(capsys):
    from durable_kit.leases import LeaseLost

    checks.check_fenced_write(save_with(None))
    assert said(capsys).startswith("not quite: worker-a wrote with token 1 after token 2 was granted to worker-b")
    checks.check_fenced_write(save_with("before"))
    assert said(capsys).startswith("not quite: the token was not read inside the write's transaction")

    def refuses_all(conn, lease, step, output):
        raise LeaseLost(f"token {lease.token} refused")
    checks.check_fenced_write(refuses_all)
    assert said(capsys).startswith("not quite: the current owner's write was refused too (token 2 refused)")

    def autocommit_then_check(conn, lease, step, output):  # writes outside any transaction, then checks
        from durable_kit.leases import check
        conn.execute(INSERT_STEP, (lease.workflow_id, step, json.dumps(output)))
        conn.commit()
        check(conn, lease)
    checks.check_fenced_write(autocommit_then_check)
    assert said(capsys).startswith("not quite: the refused write changed the steps table")
