"""A fixture document source: filing passages from ``data/filings.json``."""
from __future__ import annotations

import json
from functools import lru_cache

from .ledger import Ledger
from . import data_dir


class SourceUnavailable(RuntimeError):
    """The source did not answer; no request reached it."""


@lru_cache(maxsize=1)
def load_filings() -> dict:
    """Every company's filings, keyed by company id."""
    raw = json.loads((data_dir() / "filings.json").read_text())
    return {company["id"]: company for company in raw["companies"]}


class FixtureSource:
    """Searches the fixture filings; every answered request is recorded in the ledger as ``source``."""

    def __init__(self, ledger: Ledger, workflow_id: str | None = None, available: bool = True):
        self.ledger, self.workflow_id, self.available = ledger, workflow_id, available

    def fetch_passage(self, company: str, period: str) -> dict:
        """The risk-factor passage of one company's filing for one period."""
        if not self.available:
            raise SourceUnavailable(f"filing source unavailable (asked for {company} {period})")
        companies = load_filings()
        if company not in companies:
            raise KeyError(f"no fixture company {company!r}; known: {sorted(companies)}")
        filing = next((f for f in companies[company]["filings"] if f["period"] == period), None)
        if filing is None:
            periods = [f["period"] for f in companies[company]["filings"]]
            raise KeyError(f"{company} has no filing for {period!r}; periods on file: {periods}")
        passage = filing["passages"][0]
        self.ledger.record("source", f"fetch {passage['id']}", self.workflow_id)
        return {"company": companies[company]["name"], "period": period, **passage}


@lru_cache(maxsize=1)
def load_orders() -> dict:
    """The shop's orders, keyed by order id."""
    return {order["id"]: order for order in json.loads((data_dir() / "orders.json").read_text())["orders"]}


@lru_cache(maxsize=1)
def load_refund_policy() -> dict:
    """The versioned refund policy: its rules and its approval thresholds."""
    return json.loads((data_dir() / "refund_policy.json").read_text())


class OrderDesk:
    """The shop's records: orders and the refund policy; every answered request is recorded as ``source``."""

    def __init__(self, ledger: Ledger, workflow_id: str | None = None):
        self.ledger, self.workflow_id = ledger, workflow_id

    def fetch_order(self, order_id: str) -> dict:
        """One order, with the customer's complaint."""
        orders = load_orders()
        if order_id not in orders:
            raise KeyError(f"no fixture order {order_id!r}; known: {sorted(orders)}")
        self.ledger.record("source", f"fetch order:{order_id}", self.workflow_id)
        return dict(orders[order_id])

    def fetch_policy_rule(self, reason: str) -> dict:
        """The policy rule for a refund reason, with the policy's version and its approval thresholds."""
        policy = load_refund_policy()
        rule = next((r for r in policy["rules"] if r["reason"] == reason), None)
        if rule is None:
            raise KeyError(f"the refund policy has no rule for reason {reason!r}")
        self.ledger.record("source", f"fetch {rule['id']}", self.workflow_id)
        return {**rule, "policy_version": policy["version"], "approval": policy["approval"]}
