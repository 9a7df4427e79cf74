"""Notebook 06's paused owner, in real processes: SIGSTOP just before the payment, a takeover, SIGCONT.

The journal refuses the paused owner's late write in every strategy; its
late payment reaches the money only where the destination checks neither a
key nor the fencing token.
"""
from __future__ import annotations

import pytest

from durable_kit.workshop.agents.paused_owner import pause_before_payment

LEASE_LOST = ["refund-A-1001: lease lost to token 3; this worker stopped working on it", "worker stopped"]


@pytest.mark.parametrize("strategy, calls, refunds, owner_request, refused, status", [
    ("naive", 2, 2, "paid", "stale_write_refused", "complete"),
    ("reservation", 1, 1, "paid", "stale_write_refused", "escalated"),  # B found the key reserved; A's send is the one
    ("destination_key", 2, 1, "refused: older fencing token", "stale_write_refused", "complete"),
    ("outbox", 2, 1, "answered with the key's first refund", "outbox_answer_dropped", "complete"),
    ("reconciliation", 2, 1, "refused: older fencing token", "stale_write_refused", "complete"),
])
def test_the_paused_owners_late_payment_counts_per_strategy(tmp_path, strategy, calls, refunds, owner_request,
                                                            refused, status):
    row = pause_before_payment(tmp_path, strategy)
    assert (row["payment_calls"], row["refunds_at_destination"], row["owner_request"], row["journal_refused"],
            row["status"]) == (calls, refunds, owner_request, refused, status)
    if strategy != "outbox":  # the outbox's dispatcher holds no lease; its late answer is dropped instead
        assert row["owner_log"] == LEASE_LOST
        assert row["successor_log"][0] == "refund-A-1001: recovered"


def test_an_unknown_strategy_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="strategy must be one of"):
        pause_before_payment(tmp_path, "twice")
    assert list(tmp_path.iterdir()) == []
