"""Text for people: the trail of a step, activity summaries, the workflow's current details."""

from __future__ import annotations

from core.models import SETTLED, Checkpoint, ToolResult

JOURNAL_NOTE = "settled earlier in this task; not run again"


def trail_line(trail: list[str], result: ToolResult) -> str:
    """One line per answer: `ask N: ...` for each time the model asked, `decision: ...` for a human's."""
    if result.data.get("source") == "human":
        label = "decision"
    else:
        label = f"ask {sum(1 for line in trail if line.startswith('ask ')) + 1}"
    line = f"{label}: {result.outcome or ('error' if result.reason else 'ok')}"
    if result.reason:
        line += f" ({result.reason})"
    elif result.message and result.outcome not in SETTLED:
        line += f" ({result.message})"
    if result.attempt > 1:
        line += f" after {result.attempt} attempts"
    if result.message == JOURNAL_NOTE:
        line += ", from the task journal"
    elif result.data.get("source") == "ledger":
        line += ", from the ledger"
    elif result.data.get("source") == "human":
        line += f", decided by {result.data.get('decided_by')}"
    elif "verified_by" in result.data:
        line += f", verified by provider lookup after {result.data.get('after', 'an earlier attempt')}"
    return line


def activity_summary(tool: str, arguments: dict, key: str | None) -> str:
    parts = [tool]
    if "amount_cents" in arguments:
        parts.append(f"{arguments['amount_cents'] / 100:.2f} {arguments.get('currency', '').upper()}")
    for field in ("order_id", "invoice_id", "item_id"):
        if field in arguments:
            parts.append(arguments[field])
    if key:
        parts.append(f"key {key}")
    return " | ".join(parts)


def current_details(cp: Checkpoint) -> str:
    """Markdown for the Web UI's "current details": the state, what it waits for, the steps."""
    lines = [f"**{cp.task_id}** ({cp.scenario}): **{cp.state}**, turn {cp.turns}"]
    wait = cp.waiting_for
    if wait is not None:
        lines += [
            "",
            f"Waiting for a human: **{wait.reason}** on `{wait.tool}` "
            f"{activity_summary(wait.tool, wait.arguments, None).removeprefix(wait.tool + ' | ')}",
            f"- intent key: `{wait.intent_key}`",
            f"- {wait.detail}",
            f"- decisions: {', '.join(wait.allowed)}; deadline {wait.deadline}",
            f"- signal `resolve` with "
            f'`{{"intent_key": "{wait.intent_key}", "decision": "{wait.allowed[0]}", "decided_by": "you"}}`',
        ]
    lines += ["", "| step | status | attempts | intent key |", "|---|---|---|---|"]
    for name, step in cp.steps.items():
        lines.append(f"| {name} | {step.outcome or step.status} | {step.attempts} | {step.intent_key or ''} |")
    return "\n".join(lines)
