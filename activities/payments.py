"""The payment provider seam: the real `stripe` SDK, pointed at Stripe or a local server.

Who retries what: the SDK never retries (max_network_retries=0), because its retries
happen inside one activity attempt where we cannot verify in between. Temporal retries
the activity; every attempt sends the same idempotency key (the intent key) and puts it
in the object's metadata, and an attempt that follows an ambiguous one looks the intent
up at the provider before sending anything.
"""

from __future__ import annotations

from typing import Any

import stripe

KEY_FIELD = "intent_key"


class StripeGateway:
    def __init__(self, api_key: str, api_base: str, timeout_seconds: float) -> None:
        self._client = stripe.StripeClient(
            api_key,
            base_addresses={"api": api_base},
            max_network_retries=0,
            http_client=stripe.RequestsClient(timeout=timeout_seconds),
        )

    def ping(self) -> None:
        self._client.v1.customers.list(params={"limit": 1})

    def create_customer(self, name: str, email: str) -> str:
        return self._client.v1.customers.create(params={"name": name, "email": email}).id

    def customer_exists(self, customer_id: str) -> bool:
        try:
            self._client.v1.customers.retrieve(customer_id)
            return True
        except stripe.InvalidRequestError:
            return False

    def charge(self, customer_id: str, amount_cents: int, currency: str, metadata: dict[str, str],
               key: str) -> Any:
        """A confirmed card payment (the customer's order, or our payment of an invoice)."""
        return self._client.v1.payment_intents.create(
            params={"amount": amount_cents, "currency": currency, "customer": customer_id,
                    "payment_method": "pm_card_visa", "confirm": True, "metadata": metadata},
            options={"idempotency_key": key},
        )

    def refund(self, payment_intent_id: str, amount_cents: int, key: str, metadata: dict[str, str]) -> Any:
        return self._client.v1.refunds.create(
            params={"payment_intent": payment_intent_id, "amount": amount_cents,
                    "metadata": {**metadata, KEY_FIELD: key}},
            options={"idempotency_key": key},
        )

    def refunds(self, payment_intent_id: str) -> list[Any]:
        """All refunds of a PaymentIntent. Stripe's list endpoints are read-after-write consistent."""
        page = self._client.v1.refunds.list(params={"payment_intent": payment_intent_id, "limit": 100})
        return list(page.auto_paging_iter())

    def find_refund(self, payment_intent_id: str, key: str) -> Any | None:
        return next((r for r in self.refunds(payment_intent_id) if _key_of(r) == key), None)

    def refunded_cents(self, payment_intent_id: str) -> int:
        return sum(r.amount for r in self.refunds(payment_intent_id) if r.status in ("succeeded", "pending"))

    def payment_exists(self, payment_intent_id: str) -> bool:
        try:
            return self._client.v1.payment_intents.retrieve(payment_intent_id).status == "succeeded"
        except stripe.InvalidRequestError:
            return False

    def payments_to(self, customer_id: str) -> list[Any]:
        """Our payments to a payee. Real Stripe filters by customer; localstripe lists all."""
        page = self._client.v1.payment_intents.list(params={"limit": 100})
        return [p for p in page.auto_paging_iter() if p.customer == customer_id]

    def find_payment(self, customer_id: str, key: str) -> Any | None:
        """Our payment to a payee, matched by intent key in metadata."""
        return next((p for p in self.payments_to(customer_id) if _key_of(p) == key), None)


def _key_of(obj: Any) -> str | None:
    metadata = obj.metadata.to_dict() if obj.metadata is not None else {}
    return metadata.get(KEY_FIELD)
