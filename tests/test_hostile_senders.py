"""Nothing a sender sends can break a task: 10,000 hostile signals and Updates, of every shape, to
tasks waiting for an approval, half to a worker whose payloads are encrypted and half to one whose
are not, both with the product's own codec (infra/codec.py), sent by a client with no codec so
they reach Temporal exactly as written. Property: no workflow task fails, every message is answered
(Update) or recorded (signal) within a bounded checkpoint, nothing happens in the world until a
real, signed decision arrives, and then each task accepts it and the item is refunded once.

The messages come from a seeded generator (printed on failure): raw bytes under any encoding,
forged encryption and external-storage metadata, sizes up to 600 KB, JSON nested thousands deep, missing, extra and mistyped fields, no argument or
several, unknown signal and Update names, and decisions that look right but are unsigned, forged,
expired, for another task, from a non-approver or for another call.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import SecretStr
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHandle, WorkflowHistory, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Replayer

from activities.world import World
from core.authority import DECISIONS_KEPT
from infra import connection
from infra.codec import new_key
from infra.settings import Settings
from tests.approvers import ALICE, BOB, signed
from tests.helpers import checkpoint, finished, running_worker, scenario_task, start, wait_for, waiting
from workflows import AgentTaskWorkflow

SEED = 20261201
TASKS = 4
MESSAGES_PER_TASK = 1250  # 5,000 per worker, 10,000 in all; the server itself turns some away
BATCH = 40
OUTSIDER = Ed25519PrivateKey.generate()
ENCODINGS = [b"json/plain", b"binary/plain", b"binary/null", b"json/protobuf", b"binary/encrypted", b"", b"\xff\xfe",
             b"json/external-storage-reference", b"json/undecodable"]
# Metadata a sender may add beside the encoding: our key id, another, the SDK's external-storage marker.
METADATA = [{}, {"encryption-key-id": b"agent-payloads-v1"}, {"encryption-key-id": b"agent-payloads-v9"},
            {"__temporal_external_storage_reference": b"true"}, {"messageType": b"x"}]


@dataclass
class Message:
    via: str  # "signal" or "update"
    name: str
    args: list[Any]


def _raw(data: bytes, encoding: bytes = b"json/plain", extra: dict[str, bytes] | None = None) -> RawValue:
    return RawValue(Payload(metadata={"encoding": encoding, **(extra or {})}, data=data))


def _junk(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(8 if depth < 3 else 5)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False, 0, -1, 2**63, 1e308, -0.0])
    if pick == 2:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0xD7FF), 0x1F600]))
                       for _ in range(rng.randrange(40)))
    if pick == 3:
        return rng.choice(["approve", "abort", "mark_performed", "", "v1:issue_refund:", ALICE])
    if pick == 4:
        return rng.randrange(-10**6, 10**6)
    if pick == 5:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["intent_key", "decision", "decided_by", "note", "signature", "x", ""]): _junk(rng, depth + 1)
            for _ in range(rng.randrange(5))}


def _lookalike(rng: random.Random, task_id: str, key: str) -> dict:
    """A decision for the waiting call that must still change nothing."""
    pick = rng.randrange(11)
    if pick == 0:
        return {"intent_key": key, "decision": "approve", "decided_by": ALICE}  # unsigned
    if pick == 1:
        return signed(task_id, key, "approve", by=ALICE, signer=OUTSIDER)  # forged
    if pick == 2:
        return signed(task_id, key, "approve", valid_for=timedelta(seconds=-rng.randrange(1, 10**6)))  # expired
    if pick == 3:
        return signed(f"{task_id}-other", key, "approve")  # another task
    if pick == 4:
        return signed(task_id, key, "approve", by="mallory@example.com", signer=OUTSIDER)  # not an approver
    if pick == 5:
        return signed(task_id, f"{key}x", "approve")  # another call
    if pick == 6:
        return signed(task_id, key, "mark_performed", provider_ref="re_123")  # not allowed for an approval
    if pick == 7:
        return {**signed(task_id, key, "reject"), "decision": "approve"}  # tampered after signing
    if pick == 8:
        return {**signed(task_id, key, "approve"), "skip_checks": True}  # extra field
    if pick == 9:
        good, dropped = signed(task_id, key, "approve", by=BOB), rng.choice(["intent_key", "decision", "decided_by"])
        return {k: v for k, v in good.items() if k != dropped}  # a real approval, minus a required field
    return {**signed(task_id, key, "approve"), "decision": rng.choice([5, None, ["approve"], "APPROVE"])}


def _message(rng: random.Random, task_id: str, key: str) -> Message:
    via = rng.choice(["signal", "signal", "update"])
    name = "resolve" if via == "signal" else "decide"
    if rng.random() < 0.06:
        name = rng.choice(["approve", "", "Resolve", "resolve ", "decide\x00", "x" * 200, "\u00e9\u2603"])
    shape = rng.randrange(10)
    if shape == 0:
        args: list[Any] = []
    elif shape == 1:
        args = [_lookalike(rng, task_id, key) for _ in range(rng.randrange(2, 4))]
    elif shape == 2:
        args = [_raw(rng.randbytes(rng.choice([0, 1, 64, 4096, 20_000])), rng.choice(ENCODINGS),
                     rng.choice(METADATA))]
    elif shape == 3:
        depth = rng.choice([50, 900, 2000, 4000])
        args = [_raw(("[" * depth + "]" * depth).encode())]
    elif shape == 4:
        size = rng.choice([9_000, 100_000, 600_000]) if rng.random() < 0.1 else rng.choice([100, 5_000])
        args = [{"intent_key": key, "decision": "approve", "decided_by": ALICE, "note": "n" * size}]
    elif shape == 5:
        args = [_raw(rng.choice([b"{", b"null", b'"\\ud800"', b"\xff\xfe{}", b"{\"intent_key\": NaN}",
                                 json.dumps({"intent_key": key}).encode() * 3]))]
    elif shape in (6, 7):
        args = [_junk(rng)]
    else:
        args = [_lookalike(rng, task_id, key)]
    return Message(via, name, args)


async def _runs(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """Every run of a task, oldest first."""
    runs = sorted([w async for w in client.list_workflows(f"WorkflowId = '{workflow_id}'")], key=lambda w: w.start_time)
    return [await client.get_workflow_handle(workflow_id, run_id=w.run_id).fetch_history() for w in runs]


async def _where(client: Client, handles: list[WorkflowHandle], sent: dict[str, int], folder: Path) -> list[str]:
    """Per task: messages delivered and recorded, and for each of its runs the signals and accepted
    Updates in its history and its failed and timed-out workflow tasks (histories saved in `folder`)."""
    lines = []
    for handle in handles:
        per_run = []
        for history in await _runs(client, handle.id):
            (folder / f"{handle.id}-{history.run_id}.json").write_text(history.to_json())
            events = history.events
            per_run.append(
                f"run {history.run_id[:8]}: "
                f"{sum(e.HasField('workflow_execution_signaled_event_attributes') for e in events)} signals, "
                f"{sum(e.HasField('workflow_execution_update_accepted_event_attributes') for e in events)} updates, "
                f"{sum(e.HasField('workflow_task_failed_event_attributes') for e in events)} task failures, "
                f"{sum(e.HasField('workflow_task_timed_out_event_attributes') for e in events)} task timeouts")
        try:
            cp = await checkpoint(handle)
            recorded = f"recorded {sum(cp.decision_counts.values())} {cp.decision_counts}, state {cp.state}"
        except RPCError as err:
            recorded = f"query failed: {err.message}"
        lines.append(f"{handle.id}: delivered {sent[handle.id]}, {recorded}; " + "; ".join(per_run))
    return lines


async def _send(handle: WorkflowHandle, message: Message) -> str:
    """`recorded` for a signal accepted by the server; for an Update, how the task answered it
    (`answered`: refused by its validator, before the history; `refused`: recorded, then refused);
    `server` when the server itself turned the message away (an empty name, say)."""
    try:
        if message.via == "signal":
            await handle.signal(message.name, args=message.args)
            return "recorded"
        await handle.execute_update(message.name, args=message.args)
    except RPCError:
        return "server"
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type == "ValueError":
            return "answered"
        return "refused" if isinstance(cause, ApplicationError) and cause.type == "DecisionNotApplied" else repr(cause)
    return "applied"


@pytest.mark.parametrize("keyed", [False, True], ids=["payloads in the clear", "payloads encrypted"])
async def test_hostile_signals_and_updates_fail_no_workflow_task_and_change_nothing(
    keyed: bool, client: Client, settings: Settings, world: World, tmp_path: Path,
):
    key = new_key() if keyed else None
    strict = settings.model_copy(update={"approval_ceiling_cents": 10000,
                                         "payload_encryption_key": SecretStr(key) if key else None})
    product = await connection.connect(strict)  # the product's client: its data converter and codec
    rng = random.Random(SEED + keyed)
    async with running_worker(product, strict):
        handles = [await start(product, strict, scenario_task("SU-88421")) for _ in range(TASKS)]
        keys = [(await waiting(h)).waiting_for.intent_key for h in handles]
        senders = [client.get_workflow_handle(h.id) for h in handles]  # no codec: sent exactly as written
        ledger = world.effects()  # each refund's intent, left not_performed: approval_required
        plan = [(s, _message(rng, s.id, k)) for _ in range(MESSAGES_PER_TASK) for s, k in zip(senders, keys)]
        answers: list[str] = []
        for start_at in range(0, len(plan), BATCH):
            batch = plan[start_at:start_at + BATCH]
            answers += await asyncio.gather(*(_send(s, m) for s, m in batch))
        delivered = [(s, m) for (s, m), a in zip(plan, answers) if a not in ("server", "answered")]
        sent = {s.id: sum(1 for g, _ in delivered if g is s) for s in senders}

        async def all_recorded():
            """Every message recorded, and every task back at its question (a run that has just
            continued as new reads the world before it asks again)."""
            cps = [await checkpoint(h) for h in handles]
            return cps if all(sum(cp.decision_counts.values()) >= sent[cp.task_id] and cp.state == "awaiting_human"
                              for cp in cps) else None
        try:
            cps = await wait_for(all_recorded, "every message to be recorded", 300)
        except (TimeoutError, RPCError) as err:  # RPCError: a query met a failed workflow task
            raise AssertionError(f"seed {SEED}: {await _where(product, handles, sent, tmp_path)} (histories in {tmp_path})") from err

        updates = [a for (_, m), a in zip(plan, answers) if m.via == "update" and a != "server"]
        assert len(plan) == TASKS * MESSAGES_PER_TASK
        assert len(delivered) >= 3000 and len(updates) > 700, (len(delivered), len(updates))
        assert set(updates) <= {"refused", "answered"}, f"seed {SEED}: {[a for a in updates if a != 'refused'][:3]}"
        for cp in cps:
            assert cp.state == "awaiting_human" and cp.decision_counts.get("applied", 0) == 0, cp.decision_counts
            assert sum(cp.decision_counts.values()) == sent[cp.task_id]
            assert len(cp.decisions) == DECISIONS_KEPT and len(cp.model_dump_json()) < 60_000
        assert world.refunds("SU-88421") == [] and world.effects() == ledger

        # Each task still takes one valid signed decision: the first is approved, the rest aborted.
        for n, (handle, intent_key) in enumerate(zip(handles, keys)):
            decision = "approve" if n == 0 else "abort"
            await handle.signal("resolve", signed(handle.id, intent_key, decision, note="end of the test"))
        results = [await finished(h) for h in handles]
    assert [r.state for r in results] == ["completed"] + ["cancelled"] * (TASKS - 1)
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    assert all(world.messages(h.id) == [] for h in handles[1:])
    for handle in handles:
        history = await handle.fetch_history()
        failed = [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
        assert failed == [], f"seed {SEED}: {failed[0].workflow_task_failed_event_attributes.failure.message}"
    # Every run the flood produced replays: no message changed what the workflow commands on replay.
    replayer = Replayer(workflows=[AgentTaskWorkflow], data_converter=product.data_converter)
    for handle in handles:
        for history in await _runs(product, handle.id):
            await replayer.replay_workflow(history)
