"""Demo and test data: orders paid at the provider, and the payee of INV-9.

Seeding is safe to run from many processes at once: each order is created under an exclusive
database lock, so it is charged once and its record names that one payment.
"""

from __future__ import annotations

from activities.db import Database
from activities.payments import StripeGateway
from activities.records import Records
from core.domain import Invoice, Order
from devstack.scenarios import INVOICES, ORDERS, batch_order


def seed_order(records: Records, gateway: StripeGateway, order: Order) -> str:
    """Make sure the order exists and is paid at the provider; returns its PaymentIntent id."""
    with records.db.exclusive(f"seed:{order.order_id}") as conn:
        existing = records.order(order.order_id, conn)
        if existing and existing.payment_intent_id and gateway.payment_exists(existing.payment_intent_id):
            return existing.payment_intent_id
        customer = gateway.create_customer(order.customer_name, order.customer_email)
        payment = gateway.charge(customer, order.paid_cents, order.currency, {"order_id": order.order_id},
                                 key=f"seed:{order.order_id}:{customer}")
        records.put_order(order, customer, payment.id, conn)
        return payment.id


def seed_invoice(records: Records, gateway: StripeGateway, invoice: Invoice) -> None:
    with records.db.exclusive(f"seed:{invoice.invoice_id}") as conn:
        existing = records.invoice(invoice.invoice_id, conn)
        if existing and existing.customer_ref and gateway.customer_exists(existing.customer_ref):
            return
        records.put_invoice(invoice, gateway.create_customer(invoice.payee, invoice.payee_email), conn)


def seed_scenarios(db: Database, gateway: StripeGateway, batch: int = 0) -> None:
    db.create()
    records = Records(db)
    for order in ORDERS.values():
        seed_order(records, gateway, order)
    for n in range(1, batch + 1):
        seed_order(records, gateway, batch_order(n))
    for invoice in INVOICES.values():
        seed_invoice(records, gateway, invoice)
