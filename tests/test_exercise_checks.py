"""The exercise checks of notebooks 00, 01, 05, 08 and 09: they run the learner's code, pass a right answer, explain a
wrong one. Those of the engine in one file's parts (02, 03, 04, 06) are in ``test_part_checks.py``."""
from __future__ import annotations

import json

from durable_kit import reconcile_then_send, send_at_most_once, send_guarded
from durable_kit.workshop.lab import checks


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


def test_kill_after_fetch_runs_real_processes(capsys):
    checks.check_kill_after_fetch(stub)
    assert said(capsys).startswith("not yet:")
    checks.check_kill_after_fetch(checks.run_kill_after_fetch, {"exit_code": -9, "source_calls": 2})
    assert said(capsys) == ("pass: SIGKILL at after_fetch: exit code -9, two source calls, one passage, "
                            "one finding")
    checks.check_kill_after_fetch(checks.run_kill_after_fetch, {"exit_code": 13, "source_calls": 2})
    assert said(capsys).startswith("not quite: your code is right, your predictions are not: exit_code")

    def exits_politely(db):
        from durable_kit.workshop.agents.checkpoints import attempt_in_child, open_checkpoints, saved_state
        from durable_kit.harness.faults import arm, disarm_all
        conn = open_checkpoints(db)
        arm(conn, "after_fetch", "exit")
        code = attempt_in_child(db)
        disarm_all(conn)
        attempt_in_child(db)
        return code, saved_state(db)

    checks.check_kill_after_fetch(exits_politely)
    assert said(capsys).startswith("not quite: the database should show one crash point fired, "
                                   "'after_fetch (kill)'; it shows ['after_fetch (exit)']")


# --- notebook 09: find the double charge, then fix it (real worker processes, two bookings per journal) ---

def naive_charge(wf, cards, booking, amount):
    return send_guarded(wf, "charge", lambda: cards.charge(booking, amount))


def reconciled_charge(wf, cards, booking, amount):
    return reconcile_then_send(wf, "charge", lambda: next(iter(cards.effects("charge", booking=booking)), None),
                               lambda: cards.charge(booking, amount))["receipt"]


def any_charge_counts(wf, cards, booking, amount):
    return reconcile_then_send(wf, "charge", lambda: next(iter(cards.effects("charge")), None),
                               lambda: cards.charge(booking, amount))["receipt"]


def whole_result(wf, cards, booking, amount):
    return reconcile_then_send(wf, "charge", lambda: next(iter(cards.effects("charge", booking=booking)), None),
                               lambda: cards.charge(booking, amount))


def reserved_charge(wf, cards, booking, amount):
    return send_at_most_once(wf, "charge", lambda key: cards.charge(booking, amount))["receipt"]


def unwritten_charge(wf, cards, booking, amount):
    raise NotImplementedError("write my_charge")


def test_check_boundary_on_the_naive_checkout(capsys, tmp_path):
    rows = checks.checkout_rows(naive_charge, tmp_path, points=["after_send:charge", "after_commit:charge"])
    assert [(r["point"], r["workflow"], r["counts"]["cards effects"]) for r in rows] == [
        ("clean", None, 2), ("after_send:charge", "lab-1", 3), ("after_send:charge", "lab-2", 3),
        ("after_commit:charge", "lab-1", 2), ("after_commit:charge", "lab-2", 2)]
    checks.check_boundary(..., rows)
    assert said(capsys).startswith("not yet: Ellipsis is not a boundary of the checkout")
    checks.check_boundary("after_sending:charge", rows)
    assert said(capsys).startswith("not quite: 'after_sending:charge' is not a boundary")
    checks.check_boundary("after_commit:charge", rows)
    assert said(capsys).startswith("not quite: a worker killed at after_commit:charge left 2 charges for 2 bookings")
    checks.check_boundary("after_send:charge", rows)
    assert said(capsys) == ("pass: a worker killed at after_send:charge left 3 charges for 2 bookings: "
                            "one booking was charged twice")


def test_check_charge_refuses_an_unwritten_a_naive_and_a_reserved_charge(capsys, tmp_path):
    checks.check_charge(...)
    assert said(capsys).startswith("not yet: define my_charge")
    checks.check_charge(unwritten_charge, tmp_path / "unwritten")
    assert said(capsys) == "not yet: write my_charge, then run this cell again"
    checks.check_charge(naive_charge, tmp_path / "naive")
    assert said(capsys).startswith("not quite: after a crash, (point, charges for 2 bookings, status) = "
                                   "[('after_send:charge in lab-1', 3, 'complete'), ('after_send:charge in lab-2', 3, "
                                   "'complete'), ('after_activity:charge in lab-1', 3, 'complete'), "
                                   "('after_activity:charge in lab-2', 3, 'complete')]")
    checks.check_charge(reserved_charge, tmp_path / "reserved")
    assert said(capsys).startswith("not quite: after a crash, (point, charges for 2 bookings, status) = "
                                   "[('before_send:charge in lab-1', 1, 'lab-1: failed; lab-2: complete'), "
                                   "('before_send:charge in lab-2', 1, 'lab-1: complete; lab-2: failed')")


def test_check_charge_refuses_reconciliation_on_every_booking_and_a_wrong_return(capsys, tmp_path):
    checks.check_charge(any_charge_counts, tmp_path / "unfiltered")  # cards.effects("charge") with no booking filter
    assert said(capsys).startswith("not quite: without any crash the processor made 1 charges for 2 bookings. "
                                   "Hint: ask only about this booking's charges")
    checks.check_charge(whole_result, tmp_path / "whole")
    assert said(capsys).startswith("not quite: without any crash the checkouts ended failed")
    checks.check_charge(lambda wf, cards, booking, amount: None)
    assert said(capsys).startswith("not quite: write my_charge with def")


def test_check_charge_passes_reconciliation_by_booking(capsys, tmp_path):
    checks.check_charge(reconciled_charge, tmp_path)
    assert said(capsys) == ("pass: reconciled_charge charged each of 2 bookings once, without a crash and after a "
                            "crash at each of 4 boundaries")
# --- notebooks 00 and 01: one wrong answer per common misunderstanding, and a right one ----------

def test_predicted_calls_names_the_misunderstanding(capsys):
    checks.check_predicted_calls(7, 16)  # "a restart resumes where it crashed"
    assert "a restart does not resume where the crash happened" in said(capsys)
    checks.check_predicted_calls(10, 16)  # the second crash point forgotten: 3 + 7
    assert said(capsys).startswith("not quite: you predicted 10 model calls, the ledger counted 16. Hint: write")
    checks.check_predicted_calls(15, 16)  # the kill fires before recommend's call
    assert "fires once that call returned" in said(capsys)
    checks.check_predicted_calls(True, 16)
    assert said(capsys).startswith("not quite: the prediction should be an int, got bool")
    checks.check_predicted_calls(16.0, 16)
    assert said(capsys).startswith("not quite: the prediction should be an int, got float")


def test_kill_after_fetch_refuses_each_misunderstanding(capsys):
    from durable_kit.workshop.agents.checkpoints import attempt_in_child, open_checkpoints, saved_state
    from durable_kit.harness.faults import arm, disarm_all

    def run(point="after_fetch", action="kill", disarm=True, returned=None):
        def kill_after_fetch(db):
            conn = open_checkpoints(db)
            arm(conn, point, action)
            code = attempt_in_child(db)
            if disarm:
                disarm_all(conn)
            attempt_in_child(db)
            conn.close()
            return returned(code, db) if returned else (code, saved_state(db))
        return kill_after_fetch

    right = {"exit_code": -9, "source_calls": 2}
    checks.check_kill_after_fetch(run(point="after_evidence"), right)  # armed at the wrong boundary
    assert "it shows ['after_evidence (kill)']" in said(capsys)
    checks.check_kill_after_fetch(run(returned=lambda code, db: (13, saved_state(db))), right)  # the exit code made up
    assert "the first exit code you returned is 13" in said(capsys)
    checks.check_kill_after_fetch(run(returned=lambda code, db: code), right)  # not a tuple
    assert said(capsys) == "not quite: return (first exit code, saved_state(db)), got -9"
    checks.check_kill_after_fetch(run(), {"exit_code": -9, "source_calls": 1})  # "SIGKILL loses nothing more"
    assert "source_calls: you predicted 1, it was 2" in said(capsys)
    checks.check_kill_after_fetch(run(), right)
    assert said(capsys).startswith("pass:")


def test_kill_after_fetch_refuses_a_second_attempt_that_was_never_disarmed(capsys):
    from durable_kit.workshop.agents.checkpoints import attempt_in_child, open_checkpoints, saved_state
    from durable_kit.harness.faults import arm

    def arms_twice(db):  # re-arms instead of disarming: the second attempt dies too
        conn = open_checkpoints(db)
        arm(conn, "after_fetch", "kill")
        code = attempt_in_child(db)
        arm(conn, "after_fetch", "kill")
        attempt_in_child(db)
        conn.close()
        return code, saved_state(db)

    checks.check_kill_after_fetch(arms_twice, {"exit_code": -9, "source_calls": 2})
    assert said(capsys).startswith("not quite: the database should show one crash point fired")


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
    from durable_kit.world.notifier import Notifier

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


# --- notebook 08: check_search_step (the loop's search tool as a step, in killed and restarted workers) --------------

def right_search(wf, turn, args):
    from durable_kit.workshop.agents.loop import search_source
    return wf.execute_step(f"turn:{turn}:search", lambda: search_source(wf, args["query"], args.get("period")), args)


def search_outside_the_step(wf, turn, args):
    from durable_kit.workshop.agents.loop import search_source
    hits = search_source(wf, args["query"], args.get("period"))  # runs on every replay
    return wf.execute_step(f"turn:{turn}:search", lambda: hits, args)


def search_named_once(wf, turn, args):
    from durable_kit.workshop.agents.loop import search_source
    return wf.execute_step("search", lambda: search_source(wf, args["query"], args.get("period")), args)


def search_without_input(wf, turn, args):
    from durable_kit.workshop.agents.loop import search_source
    return wf.execute_step(f"turn:{turn}:search", lambda: search_source(wf, args["query"], args.get("period")))


def test_search_step_passes_the_kit_s_own_tool_and_refuses_a_stub(capsys):
    from durable_kit.workshop.agents.loop import search_step

    checks.check_search_step(...)
    assert said(capsys).startswith("not yet:")
    checks.check_search_step(stub)
    assert said(capsys).startswith("not yet: my_search still raises NotImplementedError")
    checks.check_search_step(right_search)
    assert said(capsys) == ("pass: one step turn:1:search per run; killed before its commit the search ran 2 times, "
                            "after it 1 time; every run gave the kit's answer")
    checks.check_search_step(search_step)
    assert said(capsys).startswith("pass:")


def test_search_step_names_what_was_expected(capsys):
    checks.check_search_step(search_outside_the_step)
    assert said(capsys).startswith("not quite: killed right after the step 'turn:1:search' committed, the restarted "
                                   "run searched the source again (2 searches, 1 expected)")
    checks.check_search_step(search_named_once)
    assert said(capsys).startswith("not quite: turn 1's search should be the step 'turn:1:search'; turn 1 stored "
                                   "no step")
    checks.check_search_step(search_without_input)
    assert said(capsys).startswith("not quite: the step's input should be the model's args, "
                                   "{'query': 'supplier concentration'}; it is None")
    checks.check_search_step(lambda wf, turn, args: [])
    assert said(capsys).startswith("not quite: write my_search(wf, turn, args) with def")
