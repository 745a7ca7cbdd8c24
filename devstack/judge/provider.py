"""The provider's records, read over its own HTTP API (Stripe's, as localstripe serves it).

Plain urllib, the secret key as a Bearer token, every page of a list (`starting_after` the last id
while `has_more`): nothing of the product's gateway, so a bug there cannot hide a refund from here.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

PAGE = 100
MONEY_MOVED = ("succeeded", "pending")  # a refund or payment in these states has moved (or will move) money


@dataclass(frozen=True)
class Refund:
    id: str
    amount: int
    status: str
    created: int                 # the provider's clock, whole seconds
    charge: str | None
    payment_intent: str | None
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def moved_money(self) -> bool:
        return self.status in MONEY_MOVED


@dataclass(frozen=True)
class Payment:
    """A PaymentIntent with its charge."""
    id: str
    amount: int
    status: str
    created: int
    customer: str | None
    charge: str | None
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def moved_money(self) -> bool:
        return self.status == "succeeded"


@dataclass(frozen=True)
class ProviderRecords:
    refunds: list[Refund]
    payments: list[Payment]

    def payment(self, payment_id: str | None) -> Payment | None:
        return next((p for p in self.payments if p.id == payment_id), None)

    def refunds_of(self, payment: Payment) -> list[Refund]:
        """The refunds that moved money back from this payment, by its id or by its charge."""
        return [r for r in self.refunds if r.moved_money and (
            r.payment_intent == payment.id or (payment.charge is not None and r.charge == payment.charge))]


class ProviderReader:
    def __init__(self, base_url: str, api_key: str, timeout: float = 30.0) -> None:
        self._base = base_url.rstrip("/")
        self._key = api_key
        self._timeout = timeout

    def read(self) -> ProviderRecords:
        return ProviderRecords(refunds=[_refund(o) for o in self.list_all("/v1/refunds")],
                               payments=[_payment(o) for o in self.list_all("/v1/payment_intents")])

    def list_all(self, path: str) -> list[dict[str, Any]]:
        """Every object of a list endpoint, page by page."""
        objects: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            params = {"limit": PAGE, **({"starting_after": after} if after else {})}
            page = self._get(f"{path}?{urllib.parse.urlencode(params)}")
            objects += page["data"]
            if not page.get("has_more") or not page["data"]:
                return objects
            after = page["data"][-1]["id"]

    def _get(self, path: str) -> dict[str, Any]:
        request = urllib.request.Request(self._base + path, headers={"Authorization": f"Bearer {self._key}"})
        with urllib.request.urlopen(request, timeout=self._timeout) as response:
            return json.loads(response.read())


def _refund(o: dict[str, Any]) -> Refund:
    return Refund(id=o["id"], amount=o["amount"], status=o["status"], created=o.get("created") or 0,
                  charge=_id(o.get("charge")), payment_intent=_id(o.get("payment_intent")),
                  metadata=dict(o.get("metadata") or {}))


def _payment(o: dict[str, Any]) -> Payment:
    return Payment(id=o["id"], amount=o["amount"], status=o["status"], created=o.get("created") or 0,
                   customer=_id(o.get("customer")), charge=_id(o.get("latest_charge")),
                   metadata=dict(o.get("metadata") or {}))


def _id(value: Any) -> str | None:
    """Stripe gives a related object as its id, or (expanded, as localstripe does) as the object."""
    if isinstance(value, dict):
        return value.get("id")
    return value
