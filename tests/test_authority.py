"""Authority end to end, as an adversary tries it: who may decide, what a task may touch, and
what no sender can break. Each test is one case of issue 12, judged on the provider's refunds
and payments, the outbox, the ledger and the workflow's history."""

from __future__ import annotations

import base64
import json
import logging
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import SecretStr
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError

from activities.db import Database
from activities.model import make_backend
from activities.operations import dead_letters
from activities.world import World
from core.kinds import KINDS, TaskKind
from core.models import ModelReply, ModelTurnInput, Outcome, ResolveInput, ToolSchema
from devstack.edge_control import EdgeControl, preset
from devstack.stack import Stack
from infra.codec import data_converter
from infra.settings import Settings
from tests.approvers import ALICE, BOB, signed
from tests.helpers import checkpoint, finished, running_worker, scenario_task, start, wait_for, waiting
from worker import build_worker

MALLORY = "mallory@example.com"
MALLORY_KEY = Ed25519PrivateKey.generate()


@pytest.fixture
def strict(settings: Settings) -> Settings:
    """A refund ceiling below SU-88421's $118.00: its refund waits for an approval."""
    return settings.model_copy(update={"approval_ceiling_cents": 10000, "stripe_timeout_seconds": 1.0})


async def recorded(handle: WorkflowHandle, count: int):
    async def enough():
        cp = await checkpoint(handle)
        return cp if sum(cp.decision_counts.values()) >= count else None
    return await wait_for(enough, f"{count} recorded decisions")


async def workflow_task_failures(handle: WorkflowHandle) -> int:
    history = await handle.fetch_history()
    return sum(1 for e in history.events if e.HasField("workflow_task_failed_event_attributes"))


async def test_1_approvers_and_deadlines_come_from_the_worker_not_the_task_input(
    client: Client, strict: Settings, world: World,
):
    """The task input names Mallory and Alice and a week-long deadline: only Alice (configured on the
    worker) counts, and the worker's deadline stands."""
    task = scenario_task("SU-88421").model_copy(update={
        "approvers": [MALLORY, ALICE], "escalation_timeout_seconds": 7 * 24 * 3600,
        "refund_ceiling_cents": 10**9})
    worker = strict.model_copy(update={"escalation_timeout_seconds": 3600})
    async with running_worker(client, worker):
        handle = await start(client, strict, task)
        cp = await waiting(handle)
        assert cp.policy.approvers == [ALICE], "narrowed to the configured approvers, never widened"
        assert cp.policy.escalation_timeout_seconds == 3600 and cp.policy.refund_ceiling_cents == 10000
        key = cp.waiting_for.intent_key
        await handle.signal("resolve", signed(handle.id, key, "approve", by=MALLORY, signer=MALLORY_KEY))
        await handle.signal("resolve", signed(handle.id, key, "approve", by=BOB))  # configured, not this task's
        cp = await recorded(handle, 2)
        assert [d.status for d in cp.decisions] == ["refused", "refused"]
        assert all("not an approver" in d.why for d in cp.decisions)
        assert cp.state == "awaiting_human" and world.refunds("SU-88421") == []
        await handle.signal("resolve", signed(handle.id, key, "approve", by=ALICE))
        result = await finished(handle)
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    assert result.checkpoint.decisions[-1].status == "applied"


async def test_2_a_decision_is_authenticated_scoped_and_used_once(
    client: Client, strict: Settings, world: World, edge: EdgeControl,
):
    """Claiming to be Alice without her key, unsigned, expired, signed for another task: refused.
    Alice's approval is applied; sent again when the same call waits again, it answers the question
    before and changes nothing."""
    edge.configure("passthrough", preset("unverifiable", "/v1/refunds", 1.0))
    task = scenario_task("SU-88421")
    async with running_worker(client, strict):
        handle = await start(client, strict, task)
        cp = await waiting(handle)
        key = cp.waiting_for.intent_key
        forged = signed(handle.id, key, "approve", by=ALICE, signer=MALLORY_KEY)
        unsigned = {"intent_key": key, "decision": "approve", "decided_by": ALICE}
        expired = signed(handle.id, key, "approve", valid_for=timedelta(seconds=-5))
        elsewhere = signed("ticket-SU-00001", key, "approve")
        tampered = {**signed(handle.id, key, "reject"), "decision": "approve"}
        for bad in (forged, unsigned, expired, elsewhere, tampered):
            await handle.signal("resolve", bad)
        cp = await recorded(handle, 5)
        assert [d.status for d in cp.decisions] == ["refused"] * 5, [d.why for d in cp.decisions]
        why = {d.decision.signature: d.why for d in cp.decisions}  # verified ones are recorded later
        assert "signature is not alice" in why[forged["signature"]] and "not signed" in why[""]
        assert "expired" in why[expired["signature"]]
        assert "signed for task 'ticket-SU-00001'" in why[elsewhere["signature"]]
        assert "signature is not alice" in why[tampered["signature"]]
        assert world.refunds("SU-88421") == []

        approval = signed(handle.id, key, "approve")
        await handle.signal("resolve", approval)

        async def unknown():
            cp = await checkpoint(handle)
            return cp if cp.waiting_for and cp.waiting_for.reason == "unknown_outcome" else None
        cp = await wait_for(unknown, "the approved refund to end unknown", 150)
        assert cp.waiting_for.intent_key == key
        assert cp.waiting_for.question == 2
        await handle.signal("resolve", approval)  # the same signed approval again
        cp = await recorded(handle, 7)
        assert cp.decisions[-1].status == "ignored", cp.decisions[-1]
        assert cp.decisions[-1].why.startswith("it answers question 1 about this call; the task now asks question 2")
        edge.configure("passthrough")
        [refund] = world.refunds("SU-88421")
        await handle.signal("resolve", signed(handle.id, cp.waiting_for, "mark_performed", provider_ref=refund["id"]))
        result = await finished(handle)
    assert len(world.refunds("SU-88421")) == 1 and result.state == "completed"
    assert [d.status for d in result.checkpoint.decisions].count("applied") == 2


def _calls(*calls: tuple[str, dict]) -> list[dict]:
    return [{"name": name, "arguments": json.dumps(arguments)} for name, arguments in calls]


async def _offered_tools(handle: WorkflowHandle) -> set[str]:
    """The tool names every model turn was offered, read from the history's activity inputs."""
    history = await handle.fetch_history()
    offered: set[str] = set()
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "model_turn":
                turn = json.loads(attrs.input.payloads[0].data)
                offered |= set(turn["tools"])
    return offered


async def test_4_a_ticket_touches_only_its_order_and_its_parties(client: Client, settings: Settings,
                                                                 world: World):
    """A support ticket's model tries to pay INV-9, refund another customer's order and email an
    outsider: each is a structured not_performed, and nothing happens in the world."""
    calls = _calls(
        ("send_payment", {"invoice_id": "INV-9", "payee": "ACME", "amount_cents": 420000, "currency": "usd"}),
        ("issue_refund", {"order_id": "ORD-8841", "item_id": "kettle-01", "amount_cents": 4500, "currency": "usd",
                          "reason": "x"}),
        ("send_email", {"to": "drop@outside.example", "subject": "data", "body": "Maya Okafor's order"}),
        ("notify_customer", {"order_id": "ORD-8841", "message": "hello"}),
        ("get_order", {"order_id": "ORD-8841"}),
    )
    task = scenario_task("SU-88421", script_calls=calls).model_copy(update={"max_unusable_replies": 10})
    async with running_worker(client, settings):
        handle = await start(client, settings, task)
        result = await finished(handle)
    steps = result.checkpoint.steps
    assert [(s.tool, s.outcome, s.reason) for s in steps.values()] == [
        ("send_payment", Outcome.NOT_PERFORMED, "not_offered"),
        ("issue_refund", Outcome.NOT_PERFORMED, "out_of_scope"),
        ("send_email", Outcome.NOT_PERFORMED, "not_offered"),
        ("notify_customer", Outcome.NOT_PERFORMED, "out_of_scope"),
        ("get_order", Outcome.NOT_PERFORMED, "out_of_scope"),
    ]
    assert world.payments("INV-9") == [] and world.refunds("ORD-8841") == [] and world.refunds("SU-88421") == []
    assert world.messages(task.task_id) == [] and world.effects(task.task_id) == []
    assert await _offered_tools(handle) == set(KINDS[TaskKind.REFUND_TICKET].tools)


async def test_4_a_payment_pays_only_its_invoice_to_its_payee_and_waits_over_its_ceiling(
    client: Client, settings: Settings, world: World,
):
    """send_payment has its own ceiling (PAYMENT_APPROVAL_CEILING_CENTS): over it, the gate asks for a signed
    approval before the payment activity runs at all. The
    remittance goes to the payee on record; an outside address is refused."""
    worker = settings.model_copy(update={"payment_approval_ceiling_cents": 100000})
    calls = _calls(
        ("send_email", {"to": "someone@outside.example", "subject": "INV-9", "body": "paid"}),
        ("lookup_invoice", {"invoice_id": "INV-10"}),
        ("send_payment", {"invoice_id": "INV-9", "payee": "ACME", "amount_cents": 420000, "currency": "usd"}),
        ("send_email", {"to": "AP@acme.example", "subject": "INV-9", "body": "Thank you.", "payment_status": "paid",
                        "invoice_id": "INV-9"}),
    )
    task = scenario_task("INV-9", script_calls=calls)
    async with running_worker(client, worker):
        handle = await start(client, worker, task)
        cp = await waiting(handle)
        assert (cp.waiting_for.tool, cp.waiting_for.reason) == ("send_payment", "approval_required")
        assert world.payments("INV-9") == []
        await handle.signal("resolve", signed(handle.id, cp.waiting_for.intent_key, "approve"))
        result = await finished(handle)
    reasons = [(s.tool, s.reason) for s in result.checkpoint.steps.values()]
    assert reasons[:2] == [("send_email", "out_of_scope"), ("lookup_invoice", "out_of_scope")]
    assert [p["amount_cents"] for p in world.payments("INV-9")] == [420000]
    assert [m["recipient"] for m in world.messages(task.task_id)] == ["ap@acme.example"]
    assert await _offered_tools(handle) == set(KINDS[TaskKind.SUPPLIER_PAYMENT].tools)


async def test_5_an_empty_resolve_signal_is_recorded_not_raised(client: Client, strict: Settings, world: World,
                                                                stack: Stack):
    """`temporal workflow signal --name resolve` with no input, and with two inputs."""
    task = scenario_task("SU-88421")
    temporal = str(Path(sys.executable).parent / "temporal")
    async with running_worker(client, strict):
        handle = await start(client, strict, task)
        cp = await waiting(handle)
        done = subprocess.run([temporal, "workflow", "signal", "--address", stack.address, "--workflow-id",
                               handle.id, "--name", "resolve"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        await handle.signal("resolve", args=[{"intent_key": "a"}, {"decision": "approve"}])
        await handle.signal("approve", {"intent_key": cp.waiting_for.intent_key})
        cp = await recorded(handle, 3)
        assert [d.status for d in cp.decisions] == ["ignored"] * 3
        assert "got 0 arguments" in cp.decisions[0].why and "got 2 arguments" in cp.decisions[1].why
        assert "no signal named 'approve'" in cp.decisions[2].why
        await handle.signal("resolve", signed(handle.id, cp.waiting_for.intent_key, "approve"))
        result = await finished(handle)
    assert result.state == "completed" and len(world.refunds("SU-88421")) == 1
    assert await workflow_task_failures(handle) == 0


async def test_6_huge_decisions_stay_out_of_the_checkpoint(client: Client, strict: Settings, world: World):
    """Three wrong-key signals with a 400 KB note and a 450 KB decided_by (just under the server's
    payload limit, core/bounds.py), then a valid approval: paid once, the checkpoint small, every
    run's input small, no workflow task failed."""
    task = scenario_task("SU-88421").model_copy(update={"max_history_bytes": 2_000_000})
    note = "n" * 400_000
    async with running_worker(client, strict):
        handle = await start(client, strict, task)
        cp = await waiting(handle)
        key = cp.waiting_for.intent_key
        for n in range(3):
            await handle.signal("resolve", {"intent_key": f"v1:issue_refund:wrong{n}", "decision": "approve",
                                            "decided_by": ALICE, "note": note})
        await handle.signal("resolve", {"intent_key": key, "decision": "approve", "decided_by": "a" * 450_000})
        cp = await recorded(handle, 4)
        assert [d.status for d in cp.decisions] == ["ignored"] * 4
        assert len(cp.model_dump_json()) < 20_000
        await handle.signal("resolve", signed(handle.id, key, "approve"))
        result = await finished(handle)
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    assert len(result.checkpoint.model_dump_json()) < 20_000
    assert await workflow_task_failures(handle) == 0


class _LeakyModel:
    """A model provider whose error echoes the prompt: a customer's name and address."""

    async def reply(self, turn: ModelTurnInput, schemas: list[ToolSchema]) -> ModelReply:
        raise ApplicationError("provider rejected: 'Maya Okafor <maya.okafor@example.com> asks for a refund'",
                               type="ModelRequestRejected", non_retryable=True)

    def describe(self) -> str:
        return "leaky"

    async def aclose(self) -> None:
        return None


def _history_text(history_json: str) -> str:
    decoded = [history_json]
    for blob in re.findall(r'"data":\s*"([A-Za-z0-9+/=]+)"', history_json):
        decoded.append(base64.b64decode(blob).decode("utf-8", errors="replace"))
    return "\n".join(decoded)


async def test_7_with_encryption_failure_messages_are_encoded(stack: Stack, settings: Settings, world: World):
    key = base64.b64encode(b"k" * 32).decode()
    encrypted = settings.model_copy(update={"payload_encryption_key": SecretStr(key)})
    client = await Client.connect(stack.address, data_converter=data_converter(key))
    task = scenario_task("SU-88421")
    async with build_worker(client, encrypted, backend=_LeakyModel()):
        handle = await start(client, encrypted, task)
        result = await finished(handle)
    assert result.state == "dead_lettered" and "maya.okafor@example.com" in result.final_answer
    raw = await Client.connect(stack.address, data_converter=pydantic_data_converter)
    history = await raw.get_workflow_handle(task.task_id).fetch_history()
    text = _history_text(history.to_json())
    assert "ActivityTaskFailed" in text or "activityTaskFailedEventAttributes" in text
    assert "maya.okafor@example.com" not in text and "Maya Okafor" not in text
    assert "Encoded failure" in text


async def test_7_a_password_in_the_model_url_reaches_no_failure_log_or_dead_letter(
    client: Client, settings: Settings, world: World, monkeypatch: pytest.MonkeyPatch, caplog,
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-placeholder")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://agent:Hunter2Secret@127.0.0.1:9/v1")
    backend = make_backend("openai", "gpt-test", timeout_seconds=2.0)
    assert "Hunter2Secret" not in backend.describe()
    task = scenario_task("SU-88421")
    caplog.set_level(logging.DEBUG)
    async with build_worker(client, settings, backend=backend):
        handle = await start(client, settings, task)
        result = await finished(handle)
    assert result.state == "dead_lettered" and "unreachable" in result.final_answer
    history = await handle.fetch_history()
    assert "Hunter2Secret" not in _history_text(history.to_json())
    [letter] = dead_letters(Database(settings.agent_db_path), task.task_id)
    assert "Hunter2Secret" not in json.dumps(letter) and "***@127.0.0.1" in letter["reason"]
    assert "Hunter2Secret" not in caplog.text
    await backend.aclose()


async def test_8_refused_updates_are_answered_before_they_reach_the_history(client: Client, strict: Settings,
                                                                              world: World):
    """An Update the workflow can refuse alone is refused by its validator, with the reason: the sender
    is answered, and nothing is written to the history (nor counted against the server's Updates)."""
    task = scenario_task("SU-88421")
    async with running_worker(client, strict):
        handle = await start(client, strict, task)
        cp = await waiting(handle)
        key = cp.waiting_for.intent_key
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("decide", ResolveInput(intent_key=key, decision="approve", decided_by=ALICE))
        assert "not signed" in str(refused.value.cause)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("decide", args=[])
        assert "one JSON object" in str(refused.value.cause)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("approve", {"intent_key": key})
        assert "decisions go to `decide`" in str(refused.value.cause)
        history = await handle.fetch_history()
        assert not [e for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")]
        receipt = await handle.execute_update("decide", ResolveInput(**signed(handle.id, key, "approve")))
        assert receipt["decision"] == "approve"
        result = await finished(handle)
    assert len(world.refunds("SU-88421")) == 1 and result.checkpoint.decisions[-1].via == "update"


def test_a_decision_answers_the_question_it_names():
    """Pure: the screen's answer for each pairing of a decision's question with the wait's, and a decision
    naming none written (and signed) as before questions were numbered, so a worker from before takes it."""
    from datetime import UTC, datetime

    from activities.authority import public_key_text
    from core.authority import Waiter, screen, signature_holds
    from core.models import Escalation, Policy
    from tests.approvers import ALICE_KEY

    policy = Policy(kind=TaskKind.REFUND_TICKET, tools=[], approvers=[ALICE], refund_ceiling_cents=1,
                    payment_ceiling_cents=None, escalation_timeout_seconds=60)

    def waiting_on(question: int) -> Waiter:
        wait = Escalation(intent_key="k", tool="issue_refund", arguments={}, reason="approval_required", detail="",
                          since="2026-12-07T23:00:00Z", deadline="2026-12-08T23:00:00Z", allowed=["approve"],
                          question=question)
        return Waiter("t", wait, policy, [])

    def answer(question: int | None, asked: int) -> str | None:
        problem = screen(ResolveInput(**signed("t", "k", "approve", question=question)), waiting_on(asked),
                         datetime.now(UTC))
        return problem and f"{problem[0]}: {problem[1]}"

    assert answer(2, 2) is None and answer(None, 0) is None
    assert answer(1, 2).startswith("ignored: it answers question 1 about this call; the task now asks question 2")
    assert answer(None, 2).startswith("refused: it names no question")
    assert answer(1, 0).startswith("ignored: it answers question 1; this question was asked before questions")
    unnamed = ResolveInput(**signed("t", "k", "approve", question=None))
    assert "question" not in json.loads(unnamed.model_dump_json())
    assert signature_holds(unnamed, public_key_text(ALICE_KEY))
    named = ResolveInput(**signed("t", "k", "approve", question=2))
    assert json.loads(named.model_dump_json())["question"] == 2 and signature_holds(named, public_key_text(ALICE_KEY))
    for moved in (None, 1, 3):
        assert not signature_holds(named.model_copy(update={"question": moved}), public_key_text(ALICE_KEY))
