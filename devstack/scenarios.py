"""Demo and test scenarios (the incidents of docs/design.md): the world they need and the task that starts them."""

from __future__ import annotations

from core.domain import Invoice, Item, Order
from core.kinds import TaskKind
from core.models import TaskInput

ORDERS = {
    "SU-88421": Order(
        order_id="SU-88421", customer_name="Maya Okafor", customer_email="maya.okafor@example.com",
        seller="Ashcombe Furniture", seller_email="orders@ashcombe.example",
        items=[Item(item_id="oak-shelf-4", description="4-shelf oak unit", amount_cents=11800)],
    ),
    "ORD-8841": Order(
        order_id="ORD-8841", customer_name="Tom Brennan", customer_email="tom.brennan@example.com",
        seller="Kettleworks", seller_email="support@kettleworks.example",
        items=[
            Item(item_id="kettle-01", description="Stovetop kettle", amount_cents=4500),
            Item(item_id="mugs-02", description="Set of four mugs", amount_cents=2400),
        ],
    ),
}

INVOICES = {
    "INV-9": Invoice(invoice_id="INV-9", payee="ACME", payee_email="ap@acme.example", amount_cents=420000),
}


def su_88421(order_id: str = "SU-88421", **model_options) -> TaskInput:
    return TaskInput(
        task_id=f"ticket-{order_id}", scenario="SU-88421", kind=TaskKind.REFUND_TICKET,
        brief=(f"Support ticket {order_id}: the buyer received the 4-shelf oak unit broken and asks for a "
               "refund. Check the order and the policy, refund the item, tell the seller, book the "
               "return pickup and tell the customer."),
        facts={"order_id": order_id}, model_options=model_options,
    )


def refund_8841(order_id: str = "ORD-8841", **model_options) -> TaskInput:
    """The refund request; its facts name the items the scripted model is told to refund (`item_id`,
    kettle-01 by default, and any `extra_refund_items`), since the facts bind the items (core/kinds.py)."""
    items = [model_options.get("item_id") or "kettle-01", *model_options.get("extra_refund_items", [])]
    return TaskInput(
        task_id="refund-8841" if order_id == "ORD-8841" else f"refund-{order_id}", scenario="refund-8841",
        kind=TaskKind.REFUND_REQUEST,
        brief=(f"Refund request for order {order_id}: the kettle arrived dented. Look up the order, refund "
               "the kettle, write the confirmation on the order and notify the customer."),
        facts={"order_id": order_id, "item_id": ",".join(items)}, model_options=model_options,
    )


def invoice_inv_9(**model_options) -> TaskInput:
    return TaskInput(
        task_id="invoice-INV-9", scenario="INV-9", kind=TaskKind.SUPPLIER_PAYMENT,
        brief="Accounts payable: invoice INV-9 from ACME is approved. Pay it and email ACME the remittance.",
        facts={"invoice_id": "INV-9"}, model_options=model_options,
    )


def long_run(turns: int = 100, task_id: str = "long-ORD-8841", **model_options) -> TaskInput:
    """A task of many turns on ORD-8841, for the history-size benchmark and continue-as-new tests."""
    return TaskInput(
        task_id=task_id, scenario="long-run", kind=TaskKind.REFUND_REQUEST, max_turns=turns + 5, window_messages=12,
        brief=(f"Watch order ORD-8841 for {turns} turns: refund the dented kettle (kettle-01, 4500 cents, usd) "
               "once, check the policy every turn."),
        facts={"order_id": "ORD-8841"}, model_options={"turns": turns, **model_options},
    )


SCENARIOS = {"SU-88421": su_88421, "refund-8841": refund_8841, "INV-9": invoice_inv_9}
REFUND_SCENARIOS = {"SU-88421": ("SU-88421", su_88421), "refund-8841": ("ORD-8841", refund_8841)}


def batch_order(n: int) -> Order:
    """A generated refund ticket's order, deterministic in n."""
    order_id = f"B-{n:05d}"
    return Order(
        order_id=order_id, customer_name=f"Customer {n}", customer_email=f"customer{n}@example.com",
        seller="Batch Seller", seller_email="seller@batch.example",
        items=[Item(item_id="item-1", description="Boxed item", amount_cents=1000 + (n * 37) % 9000)],
    )


def batch_ticket(n: int, **model_options) -> TaskInput:
    order = batch_order(n)
    return TaskInput(
        task_id=f"ticket-{order.order_id}", scenario="batch-refund", kind=TaskKind.REFUND_TICKET,
        brief=f"Support ticket {order.order_id}: item arrived damaged; refund it and tell the customer.",
        facts={"order_id": order.order_id, "item_id": "item-1"}, model_options=model_options,
    )
