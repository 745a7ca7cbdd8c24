"""What a message to a person may say about money, and how the product says it.

A message tool takes the money facts it states as structured fields (`refund_status`, `item_id`);
the product checks them against the records (activities/claims.py) and writes the money sentence
itself from the ledger and the provider (`money_sentence`): the amount and the reference come from
the records, never from the model. The model's free text may state no money fact at all
(`money_in_text`): no amount, no currency, no money word, no provider reference. The rule is
deliberately wide: a refused message costs the model one more turn; a false one costs trust.

Pure: the message tools and the eval's grader (devstack/eval/grade.py) use the same functions.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Generic, Literal, TypedDict, TypeVar

__all__ = ["REFUND_STATUSES", "NamedRefund", "Paid", "PaymentStatus", "RefundStatus", "Refunded", "compose",
           "money_in_text", "money_sentence", "payment_sentence", "split_payment_statement", "split_statement"]

RefundStatus = Literal["issued", "not_issued", "pending_review"]
REFUND_STATUSES: tuple[str, ...] = ("issued", "not_issued", "pending_review")
PaymentStatus = Literal["paid", "not_paid", "pending_review"]

_WORDS = (
    r"refund\w*|re-?funds?|reimburs\w*|repa(?:y|id)\w*|credit\w*|debit\w*|money|monies|cash\w*|funds?|funded"
    r"|paid|pay|pays|paying|payments?|payout\w*|payable|charg\w*|chargeback\w*|dollars?|cents?|euros?|pounds?"
    r"|bucks?|quid|pence|penny|pennies|usd|eur|gbp|cad|aud|amounts?|sum|sums|price\w*|cost\w*|fees?"
    r"|balance\w*|bank\w*|cards?|accounts?|transfer\w*|wire|compensat\w*|owe|owed|owing|issued|process\w*"
    r"|revers\w*|deposit\w*|wallet\w*|invoice\w*|remit\w*|receipt\w*|reference|ref|transaction\w*|settle\w*"
    r"|hundreds?|thousands?|millions?|grand|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety"
)
_MONEY_WORD = re.compile(rf"(?<![a-z])(?:{_WORDS})(?![a-z])", re.IGNORECASE)
_CURRENCY = re.compile(r"[$€£¥₹¢₩₽₿]|\b(?:us|usd|eur|gbp)\s?\d", re.IGNORECASE)
# A number standing on its own (not part of an id such as SU-88421 or oak-shelf-4): an amount, maybe.
_NUMBER = re.compile(r"(?<![\w-])\d+(?:[.,']\d+)*(?![\w-])")
_REF = re.compile(r"\b(?:re|pi|ch|py|pm|txn|in|cus|src)_[A-Za-z0-9]+", re.IGNORECASE)
# Spelled out, spaced or hyphenated so that no word is seen: "r e f u n d", "re.fund", "m-o-n-e-y".
_HIDDEN = ("refund", "reimburs", "money", "payment", "dollar", "credit", "chargeback", "cashback")


def _plain(text: str) -> str:
    """Compatibility forms folded (full-width letters, ligatures), accents dropped, lower case."""
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text))
    return "".join(c for c in folded if not unicodedata.combining(c)).lower()


def money_in_text(text: str) -> list[str]:
    """The money facts `text` states or seems to state, as short descriptions; [] when it states none.

    Free text of a message to a person must return []: its money facts go in the tool's fields."""
    plain = _plain(text)
    found: list[str] = []
    found += [f"money word {m.group(0)!r}" for m in _MONEY_WORD.finditer(plain)]
    found += [f"currency {m.group(0).strip()!r}" for m in _CURRENCY.finditer(plain)]
    found += [f"number {m.group(0).strip()!r}" for m in _NUMBER.finditer(plain)]
    found += [f"reference {m.group(0)!r}" for m in _REF.finditer(plain)]
    letters = re.sub(r"[^a-z]", "", plain)
    if not found:
        found += [f"hidden money word {w!r}" for w in _HIDDEN if w in letters]
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Refunded:
    """One refund as the records hold it: the ledger row's amount and the provider's reference."""

    item_id: str | None  # None: a provider refund naming the task but no item (activities/claims.py)
    amount_cents: int
    currency: str
    provider_ref: str


@dataclass(frozen=True)
class Paid:
    """One supplier payment as the records hold it: the amount and the provider's reference."""

    amount_cents: int
    currency: str
    provider_ref: str


SEPARATOR = "\n\n"
_S = TypeVar("_S", bound=str)


def compose(free_text: str, statement: str | None) -> str:
    """A message's body: the model's free text, then the product's money sentence on its own paragraph."""
    return f"{free_text}{SEPARATOR}{statement}" if statement else free_text


@dataclass(frozen=True)
class _Statement(Generic[_S]):
    """One kind of money statement (refunds, payments): its three statuses, the sentence the product
    writes for each and the patterns that read them back. `done` is written once per effect, from the
    effect's fields (`amount` as 0.00, `currency` in capitals); `pending` and `none` from the names of
    what the statement speaks of. `whole` reads a whole statement, `each` one `done` sentence (with
    groups amount, currency and ref)."""

    statuses: tuple[_S, _S, _S]  # done, pending review, none
    done: str
    pending: str
    none: str
    whole: re.Pattern[str]
    each: re.Pattern[str]

    def sentence(self, status: _S, effects: Sequence[Refunded | Paid], **names: str) -> str:
        done, pending, _ = self.statuses
        if status == done:
            return " ".join(self.done.format_map({**names, **asdict(e), "amount": f"{e.amount_cents / 100:.2f}",
                                                  "currency": e.currency.upper()}) for e in effects)
        return (self.pending if status == pending else self.none).format_map(names)

    def split(self, body: str) -> tuple[str, tuple[_S, re.Match[str], list[re.Match[str]]] | None]:
        """A body back into (free text, (status, the statement's match, each `done` sentence's match));
        no statement: (body, None)."""
        head, sep, last = body.rpartition(SEPARATOR)
        match = self.whole.match(last) if sep else None
        if match is None:
            return body, None
        done, pending, none = self.statuses
        if last.startswith(_lead(self.done)):
            return head, (done, match, list(self.each.finditer(last)))
        return head, (pending if last.startswith(_lead(self.pending)) else none, match, [])


def _lead(template: str) -> str:
    """A sentence's fixed words before its first field: what tells the three sentences of a kind apart."""
    return template[:template.index("{")]


def _money(match: re.Match[str]) -> tuple[int, str, str]:
    """A `done` sentence's amount in cents, currency (lower case) and reference."""
    return round(float(match.group("amount")) * 100), match.group("currency").lower(), match.group("ref")


# The refund and payment statements. The sentences the product writes, per kind: the first once per
# effect, with the effect's fields; the others with the names of what the statement speaks of.
_SENTENCES = {
    "refund": ("Refund issued: {amount} {currency} for item {item_id} of order {order_id}, reference {provider_ref}.",
               "Refund pending review: a refund for {subject} waits for a decision; we will write again.",
               "No refund has been issued for {subject}."),
    "payment": ("Payment sent: {amount} {currency} for invoice {invoice_id}, reference {provider_ref}.",
                "Payment pending review: the payment of invoice {invoice_id} waits for a decision; we will write "
                "again.",
                "No payment has been sent for invoice {invoice_id}."),
}
_STATEMENT = re.compile(
    r"^(?:(?:Refund issued: (?P<amount>\d+\.\d{2}) (?P<currency>[A-Z]{3}) for item (?P<item>\S+) of order "
    r"(?P<order>\S+), reference (?P<ref>\S+)\.(?: |$))+"
    r"|Refund pending review: a refund for (?:item (?P<pitem>\S+) of )?order (?P<porder>\S+) waits for a "
    r"decision; we will write again\."
    r"|No refund has been issued for (?:item (?P<nitem>\S+) of )?order (?P<norder>\S+)\.)$")
_ISSUED = re.compile(r"Refund issued: (?P<amount>\d+\.\d{2}) (?P<currency>[A-Z]{3}) for item (?P<item>\S+) of "
                     r"order (?P<order>\S+), reference (?P<ref>[^\s,]+)\.")
_PAYMENT_STATEMENT = re.compile(
    r"^(?:(?:Payment sent: \d+\.\d{2} [A-Z]{3} for invoice \S+, reference \S+\.(?: |$))+"
    r"|Payment pending review: the payment of invoice \S+ waits for a decision; we will write again\."
    r"|No payment has been sent for invoice \S+\.)$")
_SENT = re.compile(r"Payment sent: (?P<amount>\d+\.\d{2}) (?P<currency>[A-Z]{3}) for invoice (?P<invoice>\S+), "
                   r"reference (?P<ref>[^\s,]+)\.")
_REFUND = _Statement[RefundStatus](("issued", "pending_review", "not_issued"), *_SENTENCES["refund"], _STATEMENT,
                                   _ISSUED)
_PAYMENT = _Statement[PaymentStatus](("paid", "pending_review", "not_paid"), *_SENTENCES["payment"], _PAYMENT_STATEMENT,
                                     _SENT)


def money_sentence(status: RefundStatus, order_id: str, item_id: str | None,
                   refunded: Sequence[Refunded] = ()) -> str:
    """The money sentence the product writes for a checked status, from the records."""
    subject = f"item {item_id} of order {order_id}" if item_id else f"order {order_id}"
    return _REFUND.sentence(status, refunded, order_id=order_id, subject=subject)


class NamedRefund(TypedDict, total=False):
    """A refund a statement names: every field for `issued`, only the item (None: the whole order) otherwise."""

    item_id: str | None
    amount_cents: int
    currency: str
    provider_ref: str


def split_statement(body: str) -> tuple[str, tuple[RefundStatus, list[NamedRefund]] | None]:
    """A body back into (free text, the product's statement): the status and, for `issued`, each
    refund it names ({item_id, amount_cents, currency, provider_ref}); for the others the item
    named, if any ([{item_id}]). No statement: (body, None)."""
    head, found = _REFUND.split(body)
    if found is None:
        return body, None
    status, match, each = found
    if status == "issued":
        named: list[NamedRefund] = []
        for m in each:
            cents, currency, ref = _money(m)
            named.append({"item_id": m.group("item"), "amount_cents": cents, "currency": currency, "provider_ref": ref})
        return head, (status, named)
    return head, (status, [{"item_id": match.group("pitem" if status == "pending_review" else "nitem")}])


def payment_sentence(status: PaymentStatus, invoice_id: str, paid: Sequence[Paid] = ()) -> str:
    """The money sentence the product writes for a checked payment status, from the records."""
    return _PAYMENT.sentence(status, paid, invoice_id=invoice_id)


def split_payment_statement(body: str) -> tuple[str, tuple[PaymentStatus, list[Paid]] | None]:
    """An email's body back into (free text, the product's payment statement and the payments it names)."""
    head, found = _PAYMENT.split(body)
    if found is None:
        return body, None
    status, _, each = found
    return head, (status, [Paid(*_money(m)) for m in each])
