"""Checks for the notebooks' exercises: each runs the learner's own code and prints pass or what is wrong.

A check never raises: it prints one line, so the notebook runs on whether or
not the exercise is done, and returns ``None``, so the cell shows only that
line. The line starts with one of three words, the same in every notebook:
``pass:`` for a right answer; ``not quite:`` for a wrong one, followed by what
was expected (the exception, the key, the return shape) and a hint; ``not
yet:`` only while the exercise's stub is unchanged (``...``, or a function that
raises ``NotImplementedError``). The parts of the engine in one file that
notebooks 02, 03, 04 and 06 have the learner write are checked the same way,
in ``parts.py``.
"""
from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any, Callable

from ...core.journal import Journal

PASS, NOT_YET, NOT_QUITE = "pass:", "not yet:", "not quite:"


def report(problem: str | None, success: str) -> None:
    """Print the check's one line: ``problem`` (its verdict word first), or ``pass:`` and ``success``."""
    print(f"{PASS} {success}" if problem is None else problem)


def _not_done(value: Any) -> bool:
    """True for the exercise stubs: ``...`` or a function that raises NotImplementedError."""
    return value is ...


# --- notebook 00: predict the bill -------------------------------------------------------------

PREDICT_NEEDED = 7  # the model calls notebook 00's task needs once

def check_predicted_calls(prediction: Any, ledger_count: int) -> None:
    """Compare a predicted number of model calls with the count the ledger recorded."""
    if _not_done(prediction):
        return report(f"{NOT_YET} replace ... with your prediction, an int, and run this cell again", "")
    if isinstance(prediction, bool) or not isinstance(prediction, int):
        return report(f"{NOT_QUITE} the prediction should be an int, got {type(prediction).__name__} "
                       f"{prediction!r}", "")
    if prediction != ledger_count:
        why = ("a restart does not resume where the crash happened: nothing was kept, so every attempt "
               "starts again at plan" if prediction <= PREDICT_NEEDED else
               "write down, attempt by attempt, the calls made before that attempt's crash point fires "
               "(a crash point after a call fires once that call returned); every attempt starts again at plan")
        return report(f"{NOT_QUITE} you predicted {prediction} model calls, the ledger counted {ledger_count}. "
                       f"Hint: {why}.", "")
    return report(None, f"{prediction} model calls, as the ledger counted")


# --- notebook 01: kill it harder ---------------------------------------------------------------

KILL_EXPECTED_STATE = {"source_calls": 2, "model_calls": 1, "evidence": 1, "findings": 1, "status": "complete"}


def run_kill_after_fetch(db: Path) -> tuple[int, dict]:
    """The kit's own run of notebook 01's exercise: SIGKILL at after_fetch, then a second attempt."""
    from ..agents.checkpoints import attempt_in_child, open_checkpoints, saved_state
    from ...harness.faults import arm, disarm_all

    conn = open_checkpoints(db)
    try:
        arm(conn, "after_fetch", "kill")
        exit_code = attempt_in_child(db)
        disarm_all(conn)
        attempt_in_child(db)
    finally:
        conn.close()
    return exit_code, saved_state(db)


def check_kill_after_fetch(kill_after_fetch: Callable[[Path], Any], predictions: dict | None = None) -> None:
    """Run the learner's ``kill_after_fetch(db)`` on a fresh database and compare what it did with the truth.

    The function must arm ``after_fetch`` with ``kill``, run a first attempt,
    disarm, run a second attempt, and return ``(first exit code, saved_state(db))``.
    The check reads the database and the ledger itself, so it does not trust
    the returned values alone. ``predictions`` (``{"exit_code": ..., "source_calls": ...}``)
    are compared with what happened.
    """
    from ..agents.checkpoints import saved_state

    with tempfile.TemporaryDirectory(prefix="exercise-01-") as folder:
        db = Path(folder) / "exercise_kill.db"
        try:
            returned = kill_after_fetch(db)
        except NotImplementedError:
            return report(f"{NOT_YET} write my_kill_after_fetch(db), then run this cell again", "")
        except Exception as error:  # the learner's code: say what broke and carry on
            return report(f"{NOT_QUITE} kill_after_fetch raised {type(error).__name__}: {error}", "")
        state = saved_state(db)
        fired = _fault_events(db)
    if fired != ["after_fetch (kill)"]:
        return report(f"{NOT_QUITE} the database should show one crash point fired, 'after_fetch (kill)'; "
                       f"it shows {fired}. Hint: arm(conn, 'after_fetch', 'kill') before the first attempt.", "")
    if state != KILL_EXPECTED_STATE:
        return report(f"{NOT_QUITE} after the second attempt the run should be {KILL_EXPECTED_STATE}, "
                       f"it is {state}. Hint: disarm_all(conn), then run a second attempt.", "")
    if not (isinstance(returned, tuple) and len(returned) == 2):
        return report(f"{NOT_QUITE} return (first exit code, saved_state(db)), got {returned!r}", "")
    exit_code, returned_state = returned
    if exit_code != -9:
        return report(f"{NOT_QUITE} the first exit code you returned is {exit_code!r}; a process killed by "
                       "SIGKILL reports -9 to subprocess. Hint: return what attempt_in_child gave you.", "")
    if returned_state != state:
        return report(f"{NOT_QUITE} you returned {returned_state}, the database holds {state}: "
                       "return saved_state(db) read after the second attempt.", "")
    if predictions is not None:
        wrong = [f"{key}: you predicted {predictions.get(key)!r}, it was {truth}"
                 for key, truth in (("exit_code", -9), ("source_calls", 2)) if predictions.get(key) != truth]
        if wrong:
            return report(f"{NOT_QUITE} your code is right, your predictions are not: {'; '.join(wrong)}. "
                           "Hint: subprocess reports death by signal N as -N; where the process died decides "
                           "what repeats, not how.", "")
    return report(None, "SIGKILL at after_fetch: exit code -9, two source calls, one passage, one finding")


def _fault_events(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [row[0] for row in conn.execute("SELECT detail FROM history WHERE event = 'fault_fired' ORDER BY seq")]
    finally:
        conn.close()


# --- notebook 09: find the double charge, then fix it ------------------------------------------

CHECKOUT_SERVICES = '''from durable_kit.world.service import KeyedService, UnkeyedService


class Cards(UnkeyedService):
    """A card processor without idempotency keys; it can list the charges it made."""
    name = "cards"

    def charge(self, booking, amount):
        return self.request("charge", {"booking": booking, "amount": amount})


class Mail(KeyedService):
    """A mail service that sends one message per key."""
    name = "mail"
'''

CHECKOUT_AGENT = '''from durable_kit import effect_key, send_guarded, workflow
from charges import charge
from shop_services import Cards, Mail


@workflow("checkout")
def checkout(wf):
    cards, mail = Cards.beside(wf.db_path), Mail.beside(wf.db_path)
    total = wf.execute_step("total", lambda: round(sum(item["price"] for item in wf.input["items"]), 2))
    receipt = wf.execute_step("charge", lambda: charge(wf, cards, wf.id, total))
    wf.execute_step("mail_receipt", lambda: send_guarded(
        wf, "mail_receipt", lambda: mail.request("send", {"to": wf.input["email"]}, effect_key(wf.id, "mail_receipt"))))
    return {"charged": receipt["effect_id"], "total": total}
'''

CHECKOUT_ORDERS = [
    {"items": [{"sku": "kettle", "price": 39.5}, {"sku": "filters", "price": 6.25}], "email": "li@example.com"},
    {"items": [{"sku": "kettle", "price": 39.5}], "email": "ana@example.com"},
]
CHARGE_POINTS = ["before_send:charge", "after_send:charge", "after_activity:charge", "after_commit:charge"]
CHARGES_HEADER = "from durable_kit import effect_key, reconcile_then_send, send_at_most_once, send_guarded\n\n\n"


def checkout_rows(charge: Callable, folder: str | Path, points: list[str] | None = None) -> list[dict]:
    """Write ``charge`` as ``charges.py`` beside the checkout, then explore two checkouts in one journal.

    ``points`` None explores every boundary; ``[]`` only the clean run. Each
    point is crashed in each checkout (its row's ``workflow``). Every row's
    ``counts["cards effects"]`` is the charges the processor made for both
    bookings together.
    """
    import inspect

    from ...harness.crashlab import explore

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    source = inspect.getsource(charge).replace(f"def {charge.__name__}(", "def charge(", 1)
    (folder / "shop_services.py").write_text(CHECKOUT_SERVICES)
    (folder / "shop.py").write_text(CHECKOUT_AGENT)
    (folder / "charges.py").write_text(CHARGES_HEADER + source)
    return explore("checkout", CHECKOUT_ORDERS, module=folder / "shop.py", actions=("exit",), points=points,
                   folder=folder / "runs", parallel=2)


def _charges(row: dict) -> int:
    return row["counts"].get("cards effects", 0)


def check_boundary(boundary: Any, rows: list[dict]) -> None:
    """Pass if a worker killed at ``boundary`` of the naive checkout (``rows``) left a booking charged twice."""
    points = [row["point"] for row in rows[1:]]
    if _not_done(boundary) or boundary not in points:
        verdict = NOT_YET if _not_done(boundary) else NOT_QUITE
        return report(f"{verdict} {boundary!r} is not a boundary of the checkout; set my_boundary to one "
                       "of the points printed above, a str such as \"next_step\"", "")
    row = next(r for r in rows[1:] if r["point"] == boundary)
    needed = _charges(rows[0])
    if _charges(row) <= needed:
        return report(f"{NOT_QUITE} a worker killed at {boundary} left {_charges(row)} charges for "
                       f"{len(CHECKOUT_ORDERS)} bookings, as many as the clean run. Hint: the window is after the "
                       "processor acted and before the step's output was committed", "")
    return report(None, f"a worker killed at {boundary} left {_charges(row)} charges for {len(CHECKOUT_ORDERS)} "
                         "bookings: one booking was charged twice")


def check_charge(charge: Callable, folder: str | Path | None = None) -> None:
    """Run two checkouts with ``charge`` in real workers, clean and killed around the charge; pass if each
    booking was charged exactly once every time."""
    if _not_done(charge):
        return report(f"{NOT_YET} define my_charge(wf, cards, booking, amount) with def, then run this cell again",
                       "")
    if not callable(charge):
        return report(f"{NOT_QUITE} expected a function my_charge(wf, cards, booking, amount) that returns the "
                       f"receipt, got {type(charge).__name__}", "")
    if charge.__name__ == "<lambda>":
        return report(f"{NOT_QUITE} write my_charge with def in a cell: it is saved to charges.py, and a lambda "
                       "cannot be", "")
    with tempfile.TemporaryDirectory(prefix="check-charge-") as spare:
        where = Path(folder) if folder is not None else Path(spare)
        try:
            clean = checkout_rows(charge, where / "clean", points=[])[0]
        except Exception as error:  # the checkout did not even start: say why, and keep the notebook going
            return report(f"{NOT_QUITE} the checkout could not run: {error}", "")
        needed = len(CHECKOUT_ORDERS)
        if clean["status"] != "complete":
            errors = "; ".join(f"{i}: {e}" for i, e in (clean["error"] or {}).items())
            if "NotImplementedError" in errors:
                return report(f"{NOT_YET} write my_charge, then run this cell again", "")
            return report(f"{NOT_QUITE} without any crash the checkouts ended {clean['status']}: {errors}. "
                           "Hint: return the processor's receipt, a dict with 'effect_id'", "")
        if _charges(clean) != needed:
            return report(f"{NOT_QUITE} without any crash the processor made {_charges(clean)} charges for "
                           f"{needed} bookings. Hint: ask only about this booking's charges: "
                           "cards.effects(\"charge\", booking=booking); another booking's charge is not this one's",
                           "")
        rows = checkout_rows(charge, where / "crashes", points=CHARGE_POINTS)[1:]
    wrong = [(f"{r['point']} in {r['workflow']}", _charges(r), r["status"]) for r in rows
             if _charges(r) != needed or r["status"] != "complete"]
    if wrong:
        return report(f"{NOT_QUITE} after a crash, (point, charges for {needed} bookings, status) = {wrong}. Hint: "
                       "ask the processor for this booking's charges before sending (reconcile_then_send), and "
                       "return the receipt either way", "")
    return report(None, f"{charge.__name__} charged each of {needed} bookings once, without a crash and after a "
                         f"crash at each of {len(CHARGE_POINTS)} boundaries")

# --- notebook 08: the search tool as a step -----------------------------------------------------------

SEARCH_CASE = "three_companies_fy2025"
SEARCH_MODULE = '''from __future__ import annotations

from durable_kit import workflow
from durable_kit.workshop.agents.loop import run_loop, search_source


{source}


@workflow("search_exercise", version="search-exercise-1", inputs={{"case": str}})
def search_exercise(wf):
    return run_loop(wf, search={name})
'''
SEARCH_HINT = ("Hint: return wf.execute_step(f\"turn:{turn}:search\", lambda: search_source(wf, args[\"query\"], "
               "args.get(\"period\")), args)")


def run_search_exercise(search: Callable, folder: str | Path) -> dict:
    """Run notebook 08's loop with ``search`` as its search tool in real worker processes; what each run did.

    ``search``'s source is written to a module beside the databases (it runs in child processes, which do
    not see the notebook). Three workflows, each in its own database: ``clean`` runs once; ``killed-before``
    is killed (SIGKILL) right after the search's activity answered, before its step committed, and
    ``killed-after`` right after the step committed; each killed one is run again to the end.
    """
    import inspect

    from ...harness.runner import run_in_child
    from ...world.ledger import Ledger

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    module = folder / "search_exercise.py"
    module.write_text(SEARCH_MODULE.format(source=inspect.getsource(search).strip(), name=search.__name__))
    runs = {}
    for workflow_id, crash_at in (("clean", None), ("killed-before", "after_activity:turn:1:search"),
                                  ("killed-after", "after_commit:turn:1:search")):
        db = folder / f"{workflow_id}.db"
        journal = Journal(db)
        journal.start("search_exercise", {"case": SEARCH_CASE}, workflow_id, registered_elsewhere=True)
        children = [run_in_child(db, workflow_id, crash_at, "kill", module=module)] if crash_at else []
        children.append(run_in_child(db, workflow_id, module=module))
        ledger = Ledger.beside(db)
        steps = {s["name"]: s for s in journal.steps(workflow_id)}
        row = journal.workflow(workflow_id)
        runs[workflow_id] = {"exit codes": [c.exit_code for c in children], "status": row["status"],
                             "error": row["error"], "stderr": children[-1].stderr, "output": row["output"],
                             "searches": sum(1 for c in ledger.calls("source", workflow_id)
                                             if c["operation"].startswith("search ")),
                             "turn 1 steps": sorted(n for n in steps if n.startswith("turn:1:")),
                             "search step": steps.get("turn:1:search")}
        ledger.close()
        journal.close()
    return runs


def _kit_search_answer(folder: Path) -> tuple[dict, dict, list]:
    """The kit's own loop on the same case, in this process: its answer, turn 1's arguments and its search output."""
    from ...core.journal import run_workflow

    journal = Journal(folder / "kit.db")
    try:
        journal.start("agent_loop", {"case": SEARCH_CASE}, "kit")
        run_workflow(journal, "kit")
        steps = {s["name"]: s for s in journal.steps("kit")}
        return journal.workflow("kit")["output"], steps["turn:1:search"]["input"], steps["turn:1:search"]["output"]
    finally:
        journal.close()


def check_search_step(search: Callable) -> None:
    """Run the learner's ``search(wf, turn, args)`` as the loop's search tool in killed and restarted workers."""
    if _not_done(search):
        return report(f"{NOT_YET} define my_search(wf, turn, args), then run this cell again", "")
    if not callable(search) or getattr(search, "__name__", "<lambda>") == "<lambda>":
        return report(f"{NOT_QUITE} write my_search(wf, turn, args) with def in a cell: it is saved to a module "
                       "that the worker processes import, and only a def can be", "")
    with tempfile.TemporaryDirectory(prefix="exercise-08-") as folder:
        kit_answer, args, hits = _kit_search_answer(Path(folder))
        runs = run_search_exercise(search, folder)
    problem = _search_problem(runs, kit_answer, args, hits)
    report(problem, f"one step turn:1:search per run; killed before its commit the search ran "
                     f"{runs['killed-before']['searches']} times, after it {runs['killed-after']['searches']} time; "
                     "every run gave the kit's answer")


def _search_problem(runs: dict, kit_answer: dict, args: dict, hits: list) -> str | None:
    clean = runs["clean"]
    if clean["status"] != "complete":
        said = [line for line in clean["stderr"].splitlines() if line.strip()]
        if any("NotImplementedError" in line for line in said):
            return f"{NOT_YET} my_search still raises NotImplementedError; write it, then run this cell again"
        return (f"{NOT_QUITE} the loop with your search ended {clean['status']!r}: "
                f"{clean['error'] or (said[-1] if said else 'no error printed')}. It runs in a worker process: use "
                f"only wf, turn, args and search_source. {SEARCH_HINT}")
    if clean["search step"] is None:
        return (f"{NOT_QUITE} turn 1's search should be the step 'turn:1:search'; turn 1 stored "
                f"{clean['turn 1 steps'] or 'no step'}. Name the step from its turn. {SEARCH_HINT}")
    if clean["search step"]["output"] != hits:
        return (f"{NOT_QUITE} the step 'turn:1:search' stored {clean['search step']['output']!r}; it should store "
                f"what search_source returned: {hits!r}. {SEARCH_HINT}")
    if clean["search step"]["input"] != args:
        return (f"{NOT_QUITE} the step's input should be the model's args, {args!r}; it is "
                f"{clean['search step']['input']!r}. A replay compares a step's input with the one it stored. "
                f"{SEARCH_HINT}")
    for name, run in runs.items():
        if (run["status"], run["output"]) != ("complete", kit_answer):
            return (f"{NOT_QUITE} the run {name} ended {run['status']!r} {run['error'] or ''} with another answer "
                    f"than the kit's loop. Return the step's output. {SEARCH_HINT}")
    before, after = runs["killed-before"], runs["killed-after"]
    if before["exit codes"] != [-9, 0] or after["exit codes"] != [-9, 0]:
        return (f"{NOT_QUITE} the workers killed at turn:1:search exited {before['exit codes']} and "
                f"{after['exit codes']}, not [-9, 0]: the crash points around the step never fired. {SEARCH_HINT}")
    if after["searches"] != 1:
        return (f"{NOT_QUITE} killed right after the step 'turn:1:search' committed, the restarted run searched "
                f"the source again ({after['searches']} searches, 1 expected): the search ran outside the step's "
                f"activity, so every replay repeats it. {SEARCH_HINT}")
    if before["searches"] != 2:
        return (f"{NOT_QUITE} killed after the search answered and before the step committed, the source was "
                f"searched {before['searches']} times; 2 expected (the answer was lost with the process). "
                f"{SEARCH_HINT}")
    return None


# --- notebook 08: rebuild the next input from saved state ----------------------------------------

RESUME_KEYS = ("request", "source_scope", "findings", "unresolved_gaps", "planned_searches", "user_input")
# Dana's answer, a phrase that appears in no passage, finding, gap or plan of the check's store, so a context
# that drops `user_input` cannot pass by quoting a passage that happens to hold the same words.
RESUME_ANSWER = "Dana: compare the FY2025 filings only"


def resume_example():
    """(run, store, gaps, planned_searches): the saved state check_resume_context rebuilds from (notebook 08)."""
    from ..agents.loop import fixture_passage
    from ..memory import EvidenceStore

    store = EvidenceStore()
    for passage_id in ("northwind-fy2025-rf-07", "tallis-fy2025-rf-04"):
        store.add_passage(fixture_passage(passage_id))
    store.add_finding({"id": "f-share", "claim": "One supplier: 38% of spend.", "cites": ["northwind-fy2025-rf-07"],
                       "gap": "northwind", "turn": 3})
    store.add_finding({"id": "f-risk", "claim": "Its interruption could halt assembly.",
                       "cites": ["northwind-fy2025-rf-07"], "gap": "northwind", "turn": 4})
    run = {"request": "Compare supplier concentration.", "source_scope": {"companies": ["northwind", "tallis"]},
           "user_input": [RESUME_ANSWER]}
    return run, store, {"tallis": "how Tallis describes it"}, [{"query": "carton board", "period": "FY2025"}]


def check_resume_context(resume: Callable) -> None:
    """Run ``resume(run, store, gaps, planned_searches)`` on saved state; print pass or what is wrong.

    It must return a dict with exactly the keys of ``RESUME_KEYS``, each
    value copied from saved state (the findings as ``finding.to_dict()`` plus
    ``"evidence"``, the cited passages' ``to_dict()``), and raise an error
    naming the finding and the passage when a citation is not in the store.
    """
    report(_resume_problem(resume), "the next input holds the saved state and nothing else, and a dangling "
                                     "citation is refused by name")


def _resume_problem(resume: Callable) -> str | None:
    from ..memory import EvidenceStore, Finding

    run, store, gaps, planned = resume_example()
    try:
        context = resume(json.loads(json.dumps(run)), store, dict(gaps), list(planned))
    except NotImplementedError:
        return f"{NOT_YET} my_resume_context still raises NotImplementedError; write it, then run this cell again"
    except Exception as error:
        return f"{NOT_QUITE} it raised {type(error).__name__}: {error} on a store whose citations all resolve"
    if not isinstance(context, dict):
        return f"{NOT_QUITE} return a dict, not {type(context).__name__}"
    extra = sorted(set(context) - set(RESUME_KEYS))
    if extra:
        return (f"{NOT_QUITE} the context holds {extra}, which is not saved state. Hint: a resumed model sees "
                "only what the journal kept; an unfinished provider response was never kept")
    missing = [key for key in RESUME_KEYS if key not in context]
    if missing:
        return (f"{NOT_QUITE} the context lacks {missing}. Hint: each of the six keys carries one part of what "
                "is known; a resumed model knows nothing you leave out (the user's answer included)")
    expected = {"request": run["request"], "source_scope": run["source_scope"], "unresolved_gaps": gaps,
                "planned_searches": planned, "user_input": run["user_input"]}
    for key, value in expected.items():
        if json.loads(json.dumps(context[key], default=str)) != value:
            return (f"{NOT_QUITE} context[{key!r}] is {context[key]!r}; saved state holds {value!r}. Hint: copy "
                    "it from the saved state as it is; add nothing, drop nothing")
    findings = context["findings"]
    ids = [f.get("id") for f in findings] if isinstance(findings, list) and all(
        isinstance(f, dict) for f in findings) else None
    if ids is None:
        return f"{NOT_QUITE} context['findings'] should be a list of dicts, one per finding; got {findings!r}"
    if sorted(ids) != sorted(store.findings):
        return (f"{NOT_QUITE} the findings are {ids}, the store holds {sorted(store.findings)}. Hint: a finding "
                "has its own id; two findings that cite one passage are two findings")
    for finding in findings:
        cited = [store.passages[p].to_dict() for p in store.findings[finding["id"]].cites]
        if finding.get("evidence") != cited or finding.get("claim") != store.findings[finding["id"]].claim:
            return (f"{NOT_QUITE} finding {finding['id']!r} should be finding.to_dict() plus 'evidence': the "
                    f"passages it cites, each passage.to_dict(); it is {finding!r}. Hint: a claim without its "
                    "passage is a conclusion the model cannot inspect")
    dangling = EvidenceStore(passages=dict(store.passages), findings=dict(store.findings))
    dangling.findings["f-mill"] = Finding("f-mill", "One mill supplies all board.", ("tallis-fy2024-rf-99",))
    try:
        resume(json.loads(json.dumps(run)), dangling, dict(gaps), list(planned))
    except Exception as error:
        if "f-mill" in str(error) and "tallis-fy2024-rf-99" in str(error):
            return None
        return (f"{NOT_QUITE} the error for a dangling citation should name the finding 'f-mill' and the passage "
                f"'tallis-fy2024-rf-99'; it said: {error}")
    return (f"{NOT_QUITE} finding 'f-mill' cites 'tallis-fy2024-rf-99', which is not in the store, and no error "
            "was raised. Hint: look up every citation before you build anything; one that does not resolve stops "
            "the resume")


# --- notebook 05: a notification sent once -------------------------------------------------------

NOTIFY_MESSAGE = {"to": "r.okafor@example.com", "message": "Your refund R-0001 is on its way."}
_notify_runs = 0


def run_notify_exercise(notify: Callable) -> dict:
    """Run ``notify(wf, message)`` in a one-step workflow ``notify-1``, stop its first attempt right after the
    send (the fault ``after_activity:notify`` with ``fail``), replay, and count at the notifier."""
    from ...world.notifier import Notifier
    from ...harness.faults import InjectedFailure, arm
    from ...core.journal import run_workflow, workflow
    from ...admin import resume

    global _notify_runs
    _notify_runs += 1
    kind = f"notify_exercise:{_notify_runs}"

    @workflow(kind)
    def notify_exercise(wf):
        return notify(wf, dict(NOTIFY_MESSAGE))

    path = Path(tempfile.mkdtemp(prefix="notify-")) / "notify.db"
    journal = Journal(path)
    journal.start(kind, {}, "notify-1")
    arm(journal.conn, "after_activity:notify", "fail")  # the send happens; its output is never stored
    try:
        run_workflow(journal, "notify-1")
    except InjectedFailure:
        pass
    if journal.workflow("notify-1")["status"] == "failed":  # a failed workflow runs again only after a resume
        resume(journal, "notify-1", by="the check")
    run_workflow(journal, "notify-1")
    notifier = Notifier.beside(path)
    steps = journal.steps("notify-1")
    counts = {"attempts": next((s["attempts"] for s in steps if s["name"] == "notify"), 0),
              "requests": notifier.request_count(), "delivery keys": [d["key"] for d in notifier.deliveries()]}
    journal.close()
    return counts


def check_notify(notify: Callable) -> None:
    """Run ``notify`` as ``run_notify_exercise`` does; print pass, or what is wrong and a hint."""
    try:
        counts = run_notify_exercise(notify)
    except NotImplementedError:
        return report(f"{NOT_YET} my_notify still raises NotImplementedError: write its body, then run its cell "
                       "again", "")
    except Exception as error:
        return report(f"{NOT_QUITE} your function raised {type(error).__name__}: {error}. It should run one step "
                       "named 'notify' and return that step's output (what the notifier's send returned)", "")
    keys = counts["delivery keys"]
    if counts["attempts"] != 2:
        return report(f"{NOT_QUITE} the notify step ran {counts['attempts']} time(s), not 2. Hint: send inside "
                       "one wf.execute_step named 'notify', so the replay repeats exactly that step", "")
    if len(keys) > 1 and None not in keys and len(set(keys)) == len(keys):
        return report(f"{NOT_QUITE} each attempt sent a new key ({keys}), so the notifier saw {len(keys)} "
                       "different messages. Hint: a key names what the workflow does, never the attempt", "")
    if len(keys) != 1:
        return report(f"{NOT_QUITE} {counts['requests']} requests reached the notifier and the customer got "
                       f"{len(keys)} messages. Hint: it takes both halves: a key, and a notifier that deduplicates "
                       "by it", "")
    if keys[0] != "notify-1:notify":
        return report(f"{NOT_QUITE} the key was {keys[0]!r}. Hint: make it from the workflow and the action, "
                       "so two workflows never share one", "")
    return report(None, f"{counts['requests']} requests, 1 delivery, key 'notify-1:notify'")
