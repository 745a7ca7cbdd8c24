"""The judge's table: counts first (every kind of finding, zeros included, so a zero is seen to be
checked), then the two lines a run is read by, then each finding and each ticket a person has."""

from __future__ import annotations

from collections import Counter

from devstack.judge.verdict import KINDS, Verdict

# The states each kind of money can be in (checks.py), all listed, zeros too.
MONEY_STATES = {
    "item": ("as expected", "too many", "too few", "wrong amount", "refund of no ticket"),
    "order": ("as expected", "too many", "too few", "refund of no ticket's item", "beyond payment"),
    "invoice": ("as expected", "too many", "too few", "wrong amount"),
}


def table(verdict: Verdict, details: bool = True) -> str:
    v = verdict
    states = Counter(t.end.state if not t.end.lost else "lost" for t in v.tickets.values())
    out = [(f"judge: {len(v.tickets)} tickets ({len(v.controls)} negative controls), {len(v.items)} items, "
            f"{len(v.orders)} orders, {len(v.invoices)} invoices; the provider holds {v.provider_refunds} refunds "
            f"and {v.provider_payments} invoice payments of them"),
           "| | count |", "|---|---|"]
    for state in ("completed", "awaiting_human", "dead_lettered", "cancelled", "lost"):
        out.append(f"| end state: {state} | {states.get(state, 0)} |")
    for label, group in (("item", v.items), ("order", v.orders), ("invoice", v.invoices)):
        if group:
            counts = Counter(m.status for m in group.values())
            for status in MONEY_STATES[label]:
                out.append(f"| {label}s {status} | {counts.get(status, 0)} |")
    parties = Counter(_bucket(label) for t in v.tickets.values() for label in t.messages.values())
    for bucket in ("none", "one", "more than one, identical", "more than one, different"):
        out.append(f"| messages to a party: {bucket} | {parties.get(bucket, 0)} |")
    found = Counter(f.kind for f in v.findings)
    for kind in KINDS:
        out.append(f"| findings: {kind} | {found.get(kind, 0)} |")
    out.append(f"| escalations (with an intent) | {len(v.escalations)} |")
    others = v.flagged - v.controls
    out.append(f"| tickets flagged: negative controls / others | {len(v.flagged & v.controls)} / {len(others)} |")
    out.append("")
    out.append(f"negative control: {len(v.flagged & v.controls)} of {len(v.controls)} flagged")
    out.append(f"escalations about settled intents: {len(v.settled_escalations)}")
    if details:
        out += detail_lines(v)
    return "\n".join(out)


def detail_lines(v: Verdict, controls_too: bool = True) -> list[str]:
    """Each finding, each escalation about a settled intent, and each ticket not completed with its
    causes. `controls_too=False` leaves out the findings laid on negative controls alone (what they are
    for), with a line that counts them."""
    lines = []
    on_controls = [f for f in v.findings if f.tasks and all(v.tickets[t].ticket.control for t in f.tasks)]
    for f in v.findings:
        if controls_too or f not in on_controls:
            control = " (negative control)" if f in on_controls else ""
            lines.append(f"  {f.kind}: {f.where}: {f.detail} [{', '.join(f.tasks)}]{control}")
    if on_controls and not controls_too:
        lines.append(f"  ({len(on_controls)} findings on negative controls not listed)")
    for e in v.settled_escalations:
        lines.append(f"  escalation about a settled intent: {e.task_id} {e.intent_key} ({e.reason}): {e.settled}")
    for task, t in v.tickets.items():
        if t.end.state != "completed" or t.causes:
            lines.append(f"  {t.end.state}: {task}: {'; '.join(t.causes) or t.end.cause or '-'}")
        for note in t.notes:
            lines.append(f"  note: {task}: {note}")
    return lines


def _bucket(label: str) -> str:
    if label in ("none", "one"):
        return label
    return "more than one, identical" if label.endswith("identical") else "more than one, different"
