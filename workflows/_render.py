"""Text for people: the trail of a step, activity summaries, the workflow's current details.

Rendered from the checkpoint's typed fields; the workflow never reads any of it back.
"""

from __future__ import annotations

from typing import Any

from core.models import SETTLED, Checkpoint, Escalation, Outcome, Step, ToolResult

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


def _money(cents: object, currency: object) -> str:
    return f"{cents / 100:.2f} {str(currency or '').upper()}".rstrip() if isinstance(cents, int) else ""


# The Web UI renders current details with every margin and padding zeroed (its own stylesheet; a
# page's styles are refused): a table's cells end in no-break spaces, or their words run together.
_PAD = "\u00a0" * 3


def _row(*cells: object) -> str:
    return "| " + f"{_PAD} | ".join(_cell(c) for c in cells) + " |"


def suggested_decisions(task_id: str, wait: Escalation) -> list[str]:
    """Commands that print a signed decision for each allowed choice, ready to send or paste. The
    approver is APPROVER and APPROVER_KEY_FILE (or --by and --key-file); the key names the call and
    the question number the question about it (one asked again is a new question)."""
    lines = []
    question = f" --question {wait.question}" if wait.question else ""
    for decision in wait.allowed:
        ref = " --provider-ref PROVIDER_REF" if decision == "mark_performed" else ""
        lines.append(f"python starter.py sign {task_id} {decision} --key {wait.intent_key}{question}{ref}"
                     " --note 'why'")
    return lines


def _facts(amount_cents: object, arguments: dict[str, Any]) -> list[str]:
    """118.00 USD, order SU-88421, item oak-shelf-4"""
    money = _money(amount_cents, arguments.get("currency"))
    return [money] * bool(money) + [f"{field.removesuffix('_id')} {_cell(arguments[field])}"
                                    for field in ("order_id", "item_id", "invoice_id") if field in arguments]


def done_line(name: str, step: Step) -> str:
    """What one settled write did, from its recorded result: the provider's reference and the amount."""
    data = step.result
    what = {"issue_refund": "refund", "send_payment": "payment"}.get(step.tool, name)
    ref = data.get("provider_ref")
    facts = _facts(data.get("amount_cents", step.arguments.get("amount_cents")), step.arguments)
    if data.get("kind"):
        facts.append(f"sent ({_cell(data['kind'])})")
    if step.outcome == Outcome.ALREADY_PERFORMED:
        facts.append("done before this task asked")
    if data.get("source") == "human":
        facts.append(f"as {_cell(data.get('decided_by'))} decided")
    elif data.get("source") == "world":
        facts.append("found at the provider")
    if step.intent_key:
        facts.append(f"key `{step.intent_key}`")
    return f"{what}{f' `{_cell(ref)}`' if ref else ''}: {', '.join(facts) if facts else step.outcome}"


def _waiting(cp: Checkpoint, wait: Escalation) -> list[str]:
    return [
        f"**Waiting for a person**: {wait.reason} on `{wait.tool}`"
        + "".join(f", {fact}" for fact in _facts(wait.arguments.get("amount_cents"), wait.arguments)),
        "",
        f"- intent key: `{wait.intent_key}`" + (f", question {wait.question}" if wait.question else ""),
        f"- why: {_cell(wait.detail)}",
        *([f"- read before asking: {_cell(wait.world)}"] if wait.world else []),
        f"- decisions: {', '.join(wait.allowed)}",
        f"- deadline: {wait.deadline} (then a dead letter)",
        "- approvers: " + (', '.join(cp.policy.approvers) if cp.policy and cp.policy.approvers
                           else 'none configured'),
        "",
        "To decide, run one of these as APPROVER with APPROVER_KEY_FILE (or add `--by NAME --key-file FILE`) "
        "and paste the JSON it prints into More Actions > Send a Signal > `resolve`; or run it with "
        "`resolve` in place of `sign`, which sends it:",
        "",
        *(f"- `{command}`" for command in suggested_decisions(cp.task_id, wait)),
        "",
    ]


def current_details(cp: Checkpoint) -> str:
    """Markdown for the Web UI's "current details" (User Metadata): the state, what the task waits
    for and how to decide, what it did (references and amounts), its steps. Long values are inline
    code, which wraps: the pane is narrow and cuts a code block's long lines."""
    lines = [f"**{cp.task_id}** ({cp.scenario}): **{cp.state}**, turn {cp.turns}", ""]
    if cp.waiting_for is not None:
        lines += _waiting(cp, cp.waiting_for)
    done = [done_line(name, step) for name, step in cp.steps.items()
            if step.intent_key is not None and step.outcome in SETTLED]
    if done:
        lines += ["**Done**", "", *(f"- {line}" for line in done), ""]
    elif cp.state == "completed":
        lines += ["**Done**: no payment, refund or message.", ""]
    if cp.dead_letter_reason and cp.state == "dead_lettered":
        lines += [f"**Dead letter**: {_cell(cp.dead_letter_reason)}", ""]
    if cp.final_answer and cp.state in ("completed", "cancelled"):
        answer = _cell(cp.final_answer)
        lines += [f"**Final answer**: {answer[:600]}{'…' if len(answer) > 600 else ''}", ""]
    lines += ["**Steps**", "", _row("step", "outcome", "asks", "attempts"), "| :-- | :-- | --: | --: |"]
    for name, step in cp.steps.items():
        outcome = f"{step.outcome or step.status}{f' ({step.reason})' if step.reason else ''}"
        lines.append(_row(name, outcome, step.asks, step.attempts))
    counts = ", ".join(f"{n} {s}" for s, n in sorted(cp.decision_counts.items()))
    if counts:
        lines += ["", f"Decisions received: {counts}."]
    return "\n".join(lines)
