"""What a message tells a person about money, read by the judge's own plain rules (nothing of the
product's core/claims.py): the provider references it names, the amounts it states, and whether it
says money moved or says it did not. A claim is then weighed against the provider's records
(checks.py): a named reference the provider does not hold for the ticket, an amount no such object
has, "issued" with nothing at the provider, "not issued" with a refund of the ticket there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_REF = re.compile(r"\b(?:re|pi|py|ch)_[A-Za-z0-9]+")
_AMOUNT = re.compile(r"(?<![\w.])(\d{1,9}\.\d{2})(?!\d)")
_MONEY = r"(?:refund\w*|repaid|reimburs\w*|paid|payment\w*|money|issued|sent)"
_DENIAL = re.compile(rf"\b(?:no|not|never|nothing|unable|could ?n[o']t|can ?n[o']t|failed|declined)\b"
                     rf"[^.!?\n]{{0,60}}?\b{_MONEY}", re.IGNORECASE)
# A sentence speaks of money only when it names it: "your label has not been sent yet" denies nothing.
_NAMES_MONEY = re.compile(r"\b(?:refund\w*|repaid|reimburs\w*|paid|payment\w*|money)\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?\n](?!\d)")
_DONE = re.compile(r"\b(?:refund\w* (?:was |has been )?issued|refunded|payment (?:was |has been )?sent|paid"
                   r"|on its way)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Said:
    refs: tuple[str, ...]
    amounts: tuple[int, ...]  # cents
    done: bool                # says money moved
    denied: bool              # says money did not move


def read(body: str) -> Said:
    denied = any(_NAMES_MONEY.search(sentence) and _DENIAL.search(sentence)
                 for sentence in _SENTENCE_END.split(body))
    refs = tuple(dict.fromkeys(_REF.findall(body)))
    return Said(refs=refs, amounts=tuple(round(float(a) * 100) for a in _AMOUNT.findall(body)),
                done=bool(refs) or (bool(_DONE.search(body)) and not denied), denied=denied and not refs)
