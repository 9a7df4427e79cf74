"""What both framework agents share on DBOS: the wait for the person's answer, and the keyed send of the answer.

``ask_person`` runs in workflow code (a framework's plain tool): it says what
it waits for (the event ``waiting_for``), then ``DBOS.recv`` on topic
``answer``. While a process runs, the wait holds one of its threads; with
none, the workflow is a pending row, and an answer sent meanwhile
(``DBOSClient.send``) is kept until it is received. ``send_answer`` is a
DBOS step that sends at least once; its key makes it one delivery.
"""
from __future__ import annotations

from dbos import DBOS

from ...effects import effect_key
from ...world.notifier import Notifier
from .kit_loop import REQUESTER, answer_text
from .points import boundary

ANSWER_TOPIC = "answer"
WAITING_EVENT = "waiting_for"  # the same event the port sets while it waits (``agents.WAITING_EVENT``)
WAIT_SECONDS = 7 * 24 * 3600


async def ask_person(question: str) -> str:
    """Wait for the answer to ``question`` (crash point ``waiting:ask_user`` once the wait is announced)."""
    await DBOS.set_event_async(WAITING_EVENT, {"name": "ask_user", "question": question})
    boundary("waiting:ask_user")
    reply = await DBOS.recv_async(ANSWER_TOPIC, timeout_seconds=WAIT_SECONDS)
    if reply is None:
        raise TimeoutError(f"workflow {DBOS.workflow_id!r}: nobody answered {question!r} within {WAIT_SECONDS} s")
    await DBOS.set_event_async(WAITING_EVENT, None)
    return reply


@DBOS.step(name="send_answer")
async def send_answer(world: str, answer: dict) -> dict:
    """Send the answer to the requester under the key of this workflow's send: one delivery, however many tries."""
    notifier = Notifier.beside(world, dedupe=True)
    try:
        delivery = notifier.send(REQUESTER, answer_text(answer), effect_key(DBOS.workflow_id, "send_answer"))
        boundary("after_send:send_answer")
        return delivery
    finally:
        notifier.close()
