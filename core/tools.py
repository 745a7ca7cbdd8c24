"""The tool registry: each tool declared once, with its class, arguments and key fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from core.headers import control_characters, one_line
from core.models import TaskKind, ToolClass, ToolSchema

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4000)]
Ident = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=64)]
Cents = Annotated[int, Field(strict=True, gt=0, le=100_000_000, description="Integer cents.")]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Money(_Args):
    currency: Annotated[str, StringConstraints(min_length=3, max_length=3)]

    @field_validator("currency")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


class GetOrderArgs(_Args):
    order_id: Ident


class SearchPolicyArgs(_Args):
    query: Text


class LookupInvoiceArgs(_Args):
    invoice_id: Ident


class IssueRefundArgs(_Money):
    order_id: Ident
    item_id: Ident
    amount_cents: Cents
    reason: Text


class WriteConfirmationArgs(_Args):
    order_id: Ident
    text: Text


_FREE_TEXT = ("The message in your own words, with no money facts: no amount, currency, reference or money word "
              "(refund, paid, credit, ...). Say what happened to the money with refund_status: the product "
              "checks it against its records and adds the sentence with the amount and the reference itself.")
_REFUND_STATUS = ("What the message says about this order's refund: issued, not_issued or pending_review, checked "
                  "against the records before it is sent (a false one is refused); null: it says nothing about money.")


class _ToParty(_Args):
    order_id: Ident
    message: Text = Field(description=_FREE_TEXT)
    refund_status: Literal["issued", "not_issued", "pending_review"] | None = Field(default=None,
                                                                                     description=_REFUND_STATUS)
    item_id: Ident | None = Field(default=None, description="The item refund_status speaks of; null: the whole order.")

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """Left out when not given, so a call that states no money fact has the arguments it always had
        (recorded histories and their steps stay as they were)."""
        data = super().model_dump(**kwargs)
        for name in ("refund_status", "item_id"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class NotifyCustomerArgs(_ToParty):
    pass


class MessageSellerArgs(_ToParty):
    pass


class SchedulePickupArgs(_Args):
    order_id: Ident
    item_id: Ident


class SendPaymentArgs(_Money):
    invoice_id: Ident
    payee: Text
    amount_cents: Cents


_PAYMENT_STATUS = ("What the email says about the invoice's payment: paid, not_paid or pending_review, checked "
                   "against the records before it is sent (a false one is refused); null: it says nothing about money.")


class SendEmailArgs(_Args):
    """`to` and `subject` become headers: a control character in `to` is refused, a subject's are
    written as spaces, so no CR LF ever starts a header of its own (core/headers.py)."""

    to: Annotated[str, StringConstraints(strip_whitespace=True, to_lower=True, pattern=r"^[^@\s]+@[^@\s]+$")]
    subject: Text = Field(description="One line, with no money facts; line breaks and other control characters "
                                      "become spaces.")
    body: Text = Field(description=_FREE_TEXT.replace("refund, paid", "payment, paid").replace(
        "refund_status", "payment_status"))
    payment_status: Literal["paid", "not_paid", "pending_review"] | None = Field(default=None,
                                                                             description=_PAYMENT_STATUS)
    invoice_id: Ident | None = Field(default=None, description="The invoice payment_status speaks of.")

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """Left out when not given, as for messages to an order's parties (`_ToParty.model_dump`)."""
        data = super().model_dump(**kwargs)
        for name in ("payment_status", "invoice_id"):
            if data.get(name) is None:
                data.pop(name, None)
        return data

    @field_validator("to", mode="before")
    @classmethod
    def _no_control_characters(cls, value: object) -> object:
        if isinstance(value, str) and control_characters(value):
            raise ValueError(f"an address holds no control characters; this one holds "
                             f"{', '.join(control_characters(value)[:5])}")
        return value

    @field_validator("subject", mode="before")
    @classmethod
    def _one_line(cls, value: object) -> object:
        return one_line(value) if isinstance(value, str) else value


class EscalateArgs(_Args):
    reason: Text


class BookCourierArgs(_Args):
    order_id: Ident
    item_id: Ident


@dataclass(frozen=True)
class ToolSpec:
    """A tool's declaration. `key_fields` name argument fields or context facts (task_id);
    `kinds` are the task kinds that offer the tool (core/kinds.py reads them from here). An
    `opt_in` tool is offered only by a worker that was given its implementation (worker.py)."""

    name: str
    tool_class: ToolClass
    args: type[BaseModel]
    description: str
    key_fields: tuple[str, ...] = ()
    kinds: tuple[TaskKind, ...] = ()
    opt_in: bool = False
    # Optional fields that make another intent when given: a message that says the refund was issued is
    # not the one that said it was not, whatever its free text (core/keys.py).
    key_extras: tuple[str, ...] = ()

    @property
    def needs_key(self) -> bool:
        return self.tool_class is not ToolClass.READ

    def schema(self) -> ToolSchema:
        return ToolSchema(name=self.name, description=self.description, parameters=self.args.model_json_schema())


_TICKET, _REQUEST, _PAYMENT, _PICKUP = (TaskKind.REFUND_TICKET, TaskKind.REFUND_REQUEST,
                                       TaskKind.SUPPLIER_PAYMENT, TaskKind.RETURN_PICKUP)

_REFUND_CLAIM = ("refund_status", "item_id")  # what a message to an order's party says of its refund

# The order here is the order a kind offers its tools in.
_SPECS = (
    ToolSpec("get_order", ToolClass.READ, GetOrderArgs,
             "Look up an order: items, amounts paid, refunded_cents, customer and seller.",
             kinds=(_TICKET, _REQUEST, _PICKUP)),
    ToolSpec("search_policy", ToolClass.READ, SearchPolicyArgs, "Search the refund and returns policy.",
             kinds=(_TICKET, _REQUEST)),
    ToolSpec("lookup_invoice", ToolClass.READ, LookupInvoiceArgs, "Look up a supplier invoice.", kinds=(_PAYMENT,)),
    ToolSpec("issue_refund", ToolClass.MONEY, IssueRefundArgs,
             "Refund one item of an order to the original payment method.",
             ("task_id", "order_id", "item_id", "amount_cents"), (_TICKET, _REQUEST)),
    ToolSpec("write_confirmation", ToolClass.IDEMPOTENT_WRITE, WriteConfirmationArgs,
             "Write the confirmation note on an order (replaces any earlier note of this task).",
             ("task_id", "order_id"), (_REQUEST,)),
    ToolSpec("message_seller", ToolClass.IRREVERSIBLE, MessageSellerArgs,
             "Message the order's seller.", ("task_id", "order_id", "message"), (_TICKET,),
             key_extras=_REFUND_CLAIM),
    ToolSpec("schedule_pickup", ToolClass.IRREVERSIBLE, SchedulePickupArgs,
             "Book a courier pickup of an item from the customer.", ("task_id", "order_id", "item_id"), (_TICKET,)),
    ToolSpec("book_courier", ToolClass.IRREVERSIBLE, BookCourierArgs,
             "Book the courier to collect a returned item from the customer (one pickup per item).",
             ("order_id", "item_id"), (_PICKUP,), opt_in=True),
    ToolSpec("notify_customer", ToolClass.IRREVERSIBLE, NotifyCustomerArgs,
             "Email the order's customer.", ("task_id", "order_id", "message"), (_TICKET, _REQUEST, _PICKUP),
             key_extras=_REFUND_CLAIM),
    ToolSpec("send_payment", ToolClass.MONEY, SendPaymentArgs,
             "Pay a supplier invoice.", ("invoice_id", "payee", "amount_cents"), (_PAYMENT,)),
    ToolSpec("send_email", ToolClass.IRREVERSIBLE, SendEmailArgs,
             "Send an email.", ("task_id", "to", "subject", "body"), (_PAYMENT,),
             key_extras=("payment_status", "invoice_id")),
    ToolSpec("escalate_to_human", ToolClass.IRREVERSIBLE, EscalateArgs,
             "Hand the task to a human operator, with the reason.", ("task_id", "reason"), tuple(TaskKind)),
)

REGISTRY: dict[str, ToolSpec] = {spec.name: spec for spec in _SPECS}


def tool_schemas() -> list[ToolSchema]:
    return [spec.schema() for spec in _SPECS]
