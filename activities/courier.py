"""The courier: book a pickup of a returned item, once per item, whatever asks again.

The courier's API is not Stripe and makes its own promise: it may dedupe bookings on
`client_reference` for a while, or not at all (`CourierTerms`). The tool sends the intent key as
the client reference and goes through the effect protocol (activities/effects.py) like a refund:
read the courier's bookings for the order, claim one pickup of the item in the ledger (limit one),
send before the send-by time, settle; after a timeout it looks the booking up before anything is
sent again.

Who retries what: this gateway never retries (`fenced_pool`: no retries, no redirects); Temporal retries
the activity with the `irreversible` policy; every attempt sends the same client reference.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from activities.db import Database
from activities.effects import Ambiguous, Effects, Intent, ProviderEffect, ProviderTerms, Rejected
from activities.ledger import EffectLedger, Hold
from activities.payments import NotSent, fenced_pool, never_sent
from activities.records import Records
from activities.tools import not_performed, require_key, tool, tool_activities
from core.models import ToolInput, ToolResult
from core.tools import BookCourierArgs

__all__ = ["CourierActivities", "CourierGateway", "pickup_resource"]


def pickup_resource(order_id: str, item_id: str) -> str:
    return f"pickup:{order_id}/{item_id}"


class CourierGateway:
    """The courier's HTTP API: book a pickup, list an order's pickups (read-after-write consistent)."""

    def __init__(self, base_url: str, timeout_seconds: float = 5.0) -> None:
        self._base = base_url.rstrip("/")
        self._http = fenced_pool(self._base, timeout_seconds)

    def book(self, order_id: str, item_id: str, contact: str, client_reference: str) -> dict[str, Any]:
        body = {"order_id": order_id, "item_id": item_id, "contact": contact, "client_reference": client_reference}
        return self._call("POST", "/v1/pickups", body=json.dumps(body), headers={"Content-Type": "application/json"})

    def pickups(self, order_id: str) -> list[dict[str, Any]]:
        bookings: list[dict[str, Any]] = self._call("GET", "/v1/pickups", fields={"order_id": order_id})["data"]
        return bookings

    def _call(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, self._base + path, redirect=False, **options)
        except NotSent:
            raise
        except Exception as err:  # whatever stops the call: nothing was sent only if never connected
            if never_sent(err):
                raise Rejected(f"{method} {path}: the courier could not be reached") from err
            raise Ambiguous(f"{method} {path}: {type(err).__name__}") from err
        if response.status >= 500 or 300 <= response.status < 400:  # a redirect is not followed: it may have booked
            raise Ambiguous(f"{method} {path}: courier answered {response.status}", answered=True)
        if response.status >= 400:
            raise Rejected(f"{method} {path}: courier refused ({response.status}): "
                           f"{response.data[:200].decode(errors='replace')}")
        body: dict[str, Any] = response.json()  # the courier answers a JSON object
        return body


class CourierActivities:
    """The courier tool, with its own provider terms (does the courier dedupe on client_reference?)."""

    def __init__(self, db: Database, gateway: CourierGateway, terms: ProviderTerms) -> None:
        self._records = Records(db)
        self._gateway = gateway
        self._effects = Effects(EffectLedger(db), terms)

    def activities(self) -> list[Callable[..., Any]]:
        return tool_activities(self)

    @tool("book_courier")
    async def book_courier(self, call: ToolInput) -> ToolResult:
        args = BookCourierArgs.model_validate(call.arguments)
        key = require_key(call)
        record = await asyncio.to_thread(self._records.order, args.order_id)
        if record is None or not any(i.item_id == args.item_id for i in record.order.items):
            return not_performed(call, "unknown_item", f"order {args.order_id} has no item {args.item_id}")
        order = record.order
        return await asyncio.to_thread(self._effects.perform, Intent(
            call=call, key=key, amount=1, holds=(Hold(pickup_resource(order.order_id, args.item_id), 1, 1),),
            records=lambda: [_pickup_effect(p) for p in self._gateway.pickups(order.order_id)],
            send=lambda: _pickup_effect(self._gateway.book(order.order_id, args.item_id,
                                                           f"{order.customer_name} <{order.customer_email}>", key)),
        ))

def _pickup_effect(booking: dict[str, Any]) -> ProviderEffect:
    return ProviderEffect(
        ref=booking["id"], amount_cents=1, intent_key=booking.get("client_reference"),
        resources=(pickup_resource(booking["order_id"], booking["item_id"]),),
        status="succeeded" if booking["status"] == "booked" else booking["status"])
