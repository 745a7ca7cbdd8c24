"""The Web UI's current details: a readable step table, suggested decisions that run as they are
shown and wrap in the pane (no code block, whose long lines the pane cuts), and what a task did."""

from __future__ import annotations

import re
import shlex

from core.kinds import TaskKind
from core.models import Checkpoint, Escalation, Outcome, Policy, Step
from starter import parser
from workflows._render import current_details

KEY = "v1:issue_refund:65571d48a87e350d25e9fdd7fc4c1a47"
ARGUMENTS = {"amount_cents": 11800, "currency": "usd", "order_id": "SU-88421", "item_id": "oak-shelf-4"}


def waiting_checkpoint() -> Checkpoint:
    policy = Policy(kind=TaskKind.REFUND_TICKET, tools=["issue_refund"], approvers=["alice@example.com"],
                    refund_ceiling_cents=10000, payment_ceiling_cents=500000, escalation_timeout_seconds=60)
    return Checkpoint(
        task_id="ticket-SU-88421", scenario="SU-88421", state="awaiting_human", turns=3, policy=policy,
        steps={"get_order": Step(tool="get_order", status="done", asks=1, attempts=1),
               "issue_refund": Step(tool="issue_refund", status="unknown", intent_key=KEY, asks=2, attempts=3,
                                    outcome=Outcome.UNKNOWN, reason="unverifiable", arguments=ARGUMENTS)},
        waiting_for=Escalation(intent_key=KEY, tool="issue_refund", arguments=ARGUMENTS,
                               reason="unknown_outcome", detail="ReadTimeout | lookup failed", since="s",
                               deadline="2026-12-02T21:29:02Z",
                               allowed=["mark_performed", "mark_not_performed", "approve", "abort"], question=2))


def cells(row: str) -> list[str]:
    return [cell.strip(" \u00a0") for cell in row.strip("|").split("|")]


def test_steps_are_a_markdown_table_padded_for_the_web_ui():
    text = current_details(waiting_checkpoint())
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert cells(rows[0]) == ["step", "outcome", "asks", "attempts"]
    assert set(cells(rows[1])) <= {":--", "--:"}
    assert [cells(r) for r in rows[2:]] == [["get_order", "done", "1", "1"],
                                            ["issue_refund", "unknown (unverifiable)", "2", "3"]]
    # The UI zeroes a cell's padding: without no-break spaces, "asks" and "attempts" run together.
    assert all(cell.endswith("\u00a0 ") for cell in rows[0].strip("|").split("|")[:-1])
    assert text.splitlines()[text.splitlines().index(rows[0]) - 1] == "", "a table needs a blank line before it"


def test_what_the_task_waits_for_and_no_code_block():
    text = current_details(waiting_checkpoint())
    assert "**Waiting for a person**: unknown_outcome on `issue_refund`, 118.00 USD, order SU-88421, item oak-shelf-4" \
        in text
    assert f"- intent key: `{KEY}`, question 2" in text and "- deadline: 2026-12-02T21:29:02Z" in text
    assert "```" not in text, "a code block's long lines are cut by the Web UI's pane; inline code wraps"


def test_suggested_decisions_run_as_shown():
    cp = waiting_checkpoint()
    commands = re.findall(r"^- `(python starter\.py sign [^`]+)`$", current_details(cp), re.MULTILINE)
    assert [shlex.split(c)[4] for c in commands] == cp.waiting_for.allowed
    for command in commands:
        args = parser().parse_args(shlex.split(command)[2:])
        assert (args.task_id, args.key, args.question) == (cp.task_id, KEY, cp.waiting_for.question)
        assert (args.provider_ref is not None) == (args.decision == "mark_performed")
        assert args.by is None and args.key_file is None, "the approver is APPROVER and APPROVER_KEY_FILE"
        resolve = parser().parse_args(shlex.split(command.replace(" sign ", " resolve "))[2:])
        assert (resolve.task_id, resolve.decision, resolve.key, resolve.question) == (
            args.task_id, args.decision, KEY, cp.waiting_for.question)


def test_a_completed_task_shows_what_it_did():
    cp = waiting_checkpoint()
    cp.state, cp.waiting_for, cp.final_answer = "completed", None, "Refunded the shelf."
    cp.steps["issue_refund"] = Step(tool="issue_refund", status="done", intent_key=KEY, asks=2, attempts=3,
                                    outcome=Outcome.PERFORMED, arguments=ARGUMENTS,
                                    result={"provider_ref": "re_123abc", "amount_cents": 11800})
    cp.steps["notify_customer"] = Step(tool="notify_customer", status="done", intent_key="v1:notify_customer:ab",
                                       outcome=Outcome.ALREADY_PERFORMED, arguments={"order_id": "SU-88421"},
                                       result={"recipient": "c@example.com", "kind": "email"})
    text = current_details(cp)
    done = text.split("**Done**\n\n")[1].split("\n\n")[0].splitlines()
    assert done == [
        f"- refund `re_123abc`: 118.00 USD, order SU-88421, item oak-shelf-4, key `{KEY}`",
        "- notify_customer: order SU-88421, sent (email), done before this task asked, key `v1:notify_customer:ab`",
    ]
    assert "c@example.com" not in text, "what was done, not to whom: a message's recipient stays in the checkpoint"
    assert "**Final answer**: Refunded the shelf." in text and "Waiting" not in text


def test_a_completed_task_that_did_nothing_says_so():
    cp = waiting_checkpoint()
    cp.state, cp.waiting_for = "completed", None
    assert "**Done**: no payment, refund or message." in current_details(cp)
