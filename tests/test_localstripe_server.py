"""The local provider lists from its indexes (by type; a charge's refunds) exactly what Stripe would, across
a stop and start."""

from __future__ import annotations

from pathlib import Path

import pytest
import stripe

from activities.payments import StripeGateway
from devstack.edge_control import EdgeControl
from devstack.processes import LocalStripe, free_port


def _world(gateway: StripeGateway, payments: list[str]) -> tuple[list[str], list[list[tuple[int, str]]]]:
    customers = [c.id for c in gateway._client.v1.customers.list(params={"limit": 100}).auto_paging_iter()]
    refunds = [sorted((r.amount, r.payment_intent) for r in gateway.refunds(p)) for p in payments]
    return customers, refunds


def test_lists_read_their_own_type_and_survive_a_restart(tmp_path: Path) -> None:
    store = tmp_path / "stripe.pickle"
    with LocalStripe(free_port(), tmp_path / "a.log", store) as provider:
        gateway = StripeGateway(LocalStripe.api_key, provider.url, 10.0)
        customers = [gateway.create_customer(f"C{n}", f"c{n}@example.com") for n in range(3)]
        payments = [gateway.charge(c, 1000 * (n + 1), "usd", {"order_id": f"O{n}"}, key=f"seed:{n}").id
                    for n, c in enumerate(customers)]
        gateway.refund(payments[0], 300, "k1", {})
        gateway.refund(payments[0], 200, "k2", {})
        gateway.refund(payments[2], 3000, "k3", {})
        before = _world(gateway, payments)
    assert sorted(before[0]) == sorted(customers)
    assert before[1] == [[(200, payments[0]), (300, payments[0])], [], [(3000, payments[2])]]

    with LocalStripe(free_port(), tmp_path / "b.log", store) as provider:
        gateway = StripeGateway(LocalStripe.api_key, provider.url, 10.0)
        gateway.refund(payments[1], 2000, "k4", {})  # before any list: the charge index is built as it is made
        assert _world(gateway, payments) == (before[0], [before[1][0], [(2000, payments[1])], before[1][2]])
        assert gateway.refunded_cents(payments[0]) == 500
        with pytest.raises(stripe.InvalidRequestError):  # as localstripe's own list: no such PaymentIntent
            gateway.refunds("pi_missing")
        # localstripe crashes on a refund of a payment not yet confirmed (it has no charge): its 500 is the
        # key's answer, kept and replayed by the edge as Stripe keeps a request's result once it has begun
        unconfirmed = gateway._client.v1.payment_intents.create(
            params={"amount": 100, "currency": "usd", "payment_method": "pm_card_visa"}).id
        for _ in range(2):
            with pytest.raises(stripe.APIError) as crashed:
                gateway.refund(unconfirmed, 50, "k-crash", {})
            assert crashed.value.http_status == 500
        assert EdgeControl(provider.url).stats()["idempotency_replay"] == 1


def test_a_payments_refunds_are_read_page_after_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with LocalStripe(free_port(), tmp_path / "a.log", tmp_path / "stripe.pickle") as provider:
        gateway = StripeGateway(LocalStripe.api_key, provider.url, 10.0)
        customer = gateway.create_customer("C", "c@example.com")
        payment = gateway.charge(customer, 1000, "usd", {"order_id": "O"}, key="seed").id
        made = [gateway.refund(payment, 10 + n, f"k{n}", {"item_id": f"i{n}"}) for n in range(5)]
        monkeypatch.setattr(StripeGateway, "PAGE", 2)
        listed = gateway.refunds(payment)
    assert sorted(listed, key=lambda r: r.amount) == made  # each once, as made: amount, status, metadata
    assert [r.metadata for r in made] == [{"item_id": f"i{n}", "intent_key": f"k{n}"} for n in range(5)]


def test_a_customers_payments_are_listed_by_the_provider(tmp_path: Path) -> None:
    with LocalStripe(free_port(), tmp_path / "a.log", tmp_path / "stripe.pickle") as provider:
        gateway = StripeGateway(LocalStripe.api_key, provider.url, 10.0)
        alice, bob = (gateway.create_customer(n, f"{n}@example.com") for n in ("alice", "bob"))
        paid = {c: [gateway.charge(c, 100 * (n + 1), "usd", {}, key=f"{c}:{n}").id for n in range(2)] for c in (alice, bob)}
        listed = {c: [p.id for p in gateway._client.v1.payment_intents.list(params={"customer": c})] for c in paid}
        every = [p.id for p in gateway._client.v1.payment_intents.list()]
        with pytest.raises(stripe.InvalidRequestError):
            gateway._client.v1.payment_intents.list(params={"customer": "pi_not_a_customer"})
        with pytest.raises(stripe.InvalidRequestError):  # a filter it does not keep: refused, as before
            gateway._client.v1.payment_intents.list(params={"customer": alice, "created": 1})
        assert [p.id for p in gateway.payments_to(alice)] == listed[alice]
    assert {c: sorted(ids) for c, ids in listed.items()} == {c: sorted(ids) for c, ids in paid.items()}
    assert [i for i in every if i in paid[alice]] == listed[alice]  # the full list's order, only the customer's
