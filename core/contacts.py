"""What a message to one party of an order may not say about the other (issue 22, item 7).

The customer's contact is not sent to the seller, nor the seller's to the customer: a message whose
text holds the other party's email or full name, as the order records them, is refused. Exact and
simple on purpose: the value as recorded, anywhere in the text, ignoring case.
"""

from __future__ import annotations


def contacts_in(text: str, withheld: dict[str, str]) -> list[str]:
    """The labels of `withheld` (label: value) whose value `text` holds, ignoring case."""
    folded = text.casefold()
    return [label for label, value in withheld.items() if value.strip() and value.strip().casefold() in folded]
