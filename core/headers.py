"""Email header values hold one line: no control characters (issue 22, item 7).

A CR or LF in a header ends it and starts another ("Remittance\\r\\nBcc: x@evil"), and other control
characters and the Unicode line and paragraph separators are read as breaks or hidden by some mail
software. The tools' argument models refuse a recipient that holds one and write a subject's on one
line (core/tools.py); the outbox refuses a row that would still hold one (activities/records.py).
"""

from __future__ import annotations

import re

# Unicode category Cc (C0, DEL, C1) and the line and paragraph separators (U+2028, U+2029).
_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def control_characters(text: str) -> list[str]:
    """The control characters in `text`, as U+XXXX, each once."""
    return sorted({f"U+{ord(c):04X}" for run in _BREAKS.findall(text) for c in run})


def one_line(text: str) -> str:
    """`text` with each run of control characters written as one space, trimmed."""
    return _BREAKS.sub(" ", text).strip()
