"""Task kinds: what a task of each kind may touch.

A kind offers the tools whose declaration names it (core/tools.py `ToolSpec.kinds`, so a tool is
declared in one place) and names the facts that bind it to business records: a refund ticket and
a refund request act on one order, a supplier payment on one invoice. The worker's configuration
may narrow a kind's tools; a task input may narrow them further, never widen them
(core/authority.py `narrow`).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.models import TaskKind
from core.tools import REGISTRY

__all__ = ["KINDS", "KindSpec", "TaskKind"]


@dataclass(frozen=True)
class KindSpec:
    """`binds` are the facts every business id in a call must match (`order_id`, `invoice_id`)."""

    tools: tuple[str, ...]
    binds: tuple[str, ...]


_BINDS = {
    TaskKind.REFUND_TICKET: ("order_id",),
    TaskKind.REFUND_REQUEST: ("order_id",),
    TaskKind.SUPPLIER_PAYMENT: ("invoice_id",),
    TaskKind.RETURN_PICKUP: ("order_id",),
}

KINDS: dict[TaskKind, KindSpec] = {
    kind: KindSpec(tools=tuple(name for name, spec in REGISTRY.items() if kind in spec.kinds), binds=binds)
    for kind, binds in _BINDS.items()
}
