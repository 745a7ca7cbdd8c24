"""Text for people: the trail of a step, activity summaries, the workflow's current details.

Rendered from the checkpoint's typed fields; the workflow never reads any of it back.
"""

from __future__ import annotations

import json
from typing import Any

from core.models import SETTLED, Checkpoint, Escalation, ToolResult

JOURNAL_NOTE = "settled earlier in this task; not run again"


def trail_line(asks: int, result: ToolResult) -> str:
    """One line per answer: `ask N: ...` for the model's Nth ask, `decision: ...` for a human's."""
    human = result.data.get("source") == "human"
    label = "decision" if human else f"ask {asks}"
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
    elif result.data.get("source") == "world":
        line += f", read from the ledger and the provider at {result.data.get('read_at')} before asking anyone"
    elif human:
        line += f", decided by {result.data.get('decided_by')}"
    elif "verified_by" in result.data:
        line += f", verified by provider lookup after {result.data.get('after', 'an earlier attempt')}"
    return line


def activity_summary(tool: str, arguments: dict[str, Any], key: str | None) -> str:
    parts = [tool]
    if "amount_cents" in arguments:
        parts.append(f"{arguments['amount_cents'] / 100:.2f} {arguments.get('currency', '').upper()}")
    for field in ("order_id", "invoice_id", "item_id"):
        if field in arguments:
            parts.append(str(arguments[field]))
    if key:
        parts.append(f"key {key}")
    return " | ".join(parts)


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def suggested_decisions(task_id: str, wait: Escalation) -> list[str]:
    """Commands that print a signed decision for each allowed choice, ready to send or paste."""
    lines = []
    for decision in wait.allowed:
        ref = " --provider-ref PROVIDER_REF" if decision == "mark_performed" else ""
        lines.append(f"python starter.py sign {task_id} {decision} --key {wait.intent_key} --by APPROVER "
                     f"--key-file APPROVER.pem{ref} --note 'why'")
    return lines


def decision_shape(task_id: str, wait: Escalation) -> str:
    """The JSON the `resolve` signal takes: every field, the signed ones filled in by `starter.py sign`."""
    shape = {"task_id": task_id, "intent_key": wait.intent_key, "decision": wait.allowed[0],
             "decided_by": "APPROVER", "note": "why", "provider_ref": None,
             "expires_at": "(from starter.py sign)", "nonce": "(from starter.py sign)",
             "signature": "(from starter.py sign)"}
    return json.dumps(shape, indent=2)


def current_details(cp: Checkpoint) -> str:
    """Markdown for the Web UI's "current details": the state, what it waits for, the steps."""
    lines = [f"**{cp.task_id}** ({cp.scenario}): **{cp.state}**, turn {cp.turns}", ""]
    wait = cp.waiting_for
    if wait is not None:
        lines += [
            f"**Waiting for a human**: {wait.reason} on `{wait.tool}` "
            f"{_cell(activity_summary(wait.tool, wait.arguments, None).removeprefix(wait.tool))}",
            "",
            f"- intent key: `{wait.intent_key}`",
            f"- why: {_cell(wait.detail)}",
            *([f"- read before asking: {_cell(wait.world)}"] if wait.world else []),
            f"- decisions: {', '.join(wait.allowed)}; deadline {wait.deadline}",
            "- approvers: " + (', '.join(cp.policy.approvers) if cp.policy and cp.policy.approvers
                               else 'none configured'),
            "",
            "Print a signed decision (paste it into Send a Signal > `resolve`), or send it with "
            "`starter.py resolve` and the same options:",
            "",
            "```",
            *suggested_decisions(cp.task_id, wait),
            "```",
            "",
            "The signal's JSON:",
            "",
            "```json",
            decision_shape(cp.task_id, wait),
            "```",
            "",
        ]
    lines += ["| step | status | asks | attempts | intent key |",
              "| --- | --- | --- | --- | --- |"]
    for name, step in cp.steps.items():
        status = step.outcome or step.status
        key = f"`{step.intent_key}`" if step.intent_key else "-"
        lines.append(f"| {_cell(name)} | {status}{f' ({step.reason})' if step.reason else ''} | {step.asks} "
                     f"| {step.attempts} | {key} |")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(cp.decision_counts.items()))
    if counts:
        lines += ["", f"Decisions received: {counts}."]
    return "\n".join(lines)
