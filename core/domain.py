"""The business records tasks act on: orders with their items, and supplier invoices."""

from __future__ import annotations

from pydantic import BaseModel


class Item(BaseModel):
    item_id: str
    description: str
    amount_cents: int


class Order(BaseModel):
    order_id: str
    currency: str = "usd"
    customer_name: str
    customer_email: str
    seller: str
    seller_email: str
    items: list[Item]

    @property
    def paid_cents(self) -> int:
        return sum(item.amount_cents for item in self.items)


class Invoice(BaseModel):
    invoice_id: str
    payee: str
    payee_email: str
    amount_cents: int
    currency: str = "usd"
