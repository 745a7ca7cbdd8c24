"""The Web UI's current details: a readable table with whole intent keys, and suggested decisions
that run as they are shown."""

from __future__ import annotations

import shlex

from core.kinds import TaskKind
from core.models import Checkpoint, Escalation, Policy, ResolveInput, Step
from starter import parser
from workflows._render import current_details, decision_shape

KEY = "v1:issue_refund:65571d48a87e350d25e9fdd7fc4c1a47"


def waiting_checkpoint() -> Checkpoint:
    policy = Policy(kind=TaskKind.REFUND_TICKET, tools=["issue_refund"], approvers=["alice@example.com"],
                    refund_ceiling_cents=10000, payment_ceiling_cents=500000, escalation_timeout_seconds=60)
    return Checkpoint(
        task_id="ticket-SU-88421", scenario="SU-88421", state="awaiting_human", turns=3, policy=policy,
        steps={"get_order": Step(tool="get_order", status="done", asks=1, attempts=1),
               "issue_refund": Step(tool="issue_refund", status="unknown", intent_key=KEY, asks=2, attempts=3,
                                    reason="unverifiable")},
        waiting_for=Escalation(intent_key=KEY, tool="issue_refund", arguments={"amount_cents": 11800, "currency": "usd",
                                                                               "order_id": "SU-88421"},
                               reason="unknown_outcome", detail="ReadTimeout | lookup failed", since="s",
                               deadline="d", allowed=["mark_performed", "mark_not_performed", "approve", "abort"]))


def test_steps_are_a_markdown_table_with_whole_keys():
    text = current_details(waiting_checkpoint())
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert rows[0] == "| step | status | asks | attempts | intent key |" and rows[1].startswith("| --- |")
    assert all(row.count(" | ") == 4 for row in rows), rows
    assert f"`{KEY}`" in rows[3] and "unverifiable" in rows[3]
    assert text.splitlines()[text.splitlines().index(rows[0]) - 1] == "", "a table needs a blank line before it"


def test_suggested_decisions_run_as_shown():
    cp = waiting_checkpoint()
    commands = [line for line in current_details(cp).splitlines() if line.startswith("python starter.py sign")]
    assert [shlex.split(c)[4] for c in commands] == cp.waiting_for.allowed
    for command in commands:
        args = parser().parse_args(shlex.split(command)[2:])
        assert (args.task_id, args.key) == (cp.task_id, KEY)
        assert (args.provider_ref is not None) == (args.decision == "mark_performed")
    shape = ResolveInput.model_validate_json(decision_shape(cp.task_id, cp.waiting_for))
    assert set(shape.model_fields_set) == set(ResolveInput.model_fields), "every field, signature ones too"
