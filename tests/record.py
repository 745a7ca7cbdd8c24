"""Record the replay corpus: `python -m tests.record` (or `make record`).

Runs every path that matters against a fresh dev server and localstripe, with the current
workflow code, and writes each run's event history to tests/histories/<name>.json, with a
note per history in tests/histories/README.md. Re-recording changes what the replay test
guards: do it on purpose, after a change that is meant to break replay of old runs, and say
so in the commit. One known-bad history (an activity swapped for another) is derived from
a recorded one; the replay test must reject it.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from activities.db import Database
from activities.payments import StripeGateway
from activities.records import Records
from client import redrive, start_task
from core.models import Checkpoint, DecisionReceipt, ResolveInput, TaskInput
from devstack.edge_control import EdgeControl, preset
from devstack.polling import poll_until
from devstack.scenarios import SCENARIOS, long_run
from devstack.seed import seed_scenarios
from devstack.stack import STRIPE_API_KEY, Stack
from infra.exit import run_main
from infra.settings import Settings
from tests.approvers import APPROVERS, BOB, signed
from tests.helpers import waiting
from worker import build_worker

HISTORIES = Path(__file__).parent / "histories"
BAD = HISTORIES / "known-bad"


@dataclass
class Path_:
    name: str
    note: str
    run: Callable[[Recorder], Awaitable[list[WorkflowHandle]]]


class Recorder:
    def __init__(self, stack: Stack, client: Client, root: Path) -> None:
        self.stack, self.client, self.root = stack, client, root
        self.edge = EdgeControl(stack.stripe_url)
        self.count = 0

    def settings(self, **changes) -> Settings:
        """A fresh world (database, paid orders, edge keys) for each path."""
        self.count += 1
        db = self.root / f"agent-{self.count}.db"
        settings = Settings(temporal_address=self.stack.address, task_queue=f"record-{self.count}",
                            stripe_api_base=self.stack.stripe_url, stripe_api_key=STRIPE_API_KEY,
                            agent_db_path=db, stripe_timeout_seconds=1.0, approvers=APPROVERS,
                            ).model_copy(update=changes)
        self.edge.configure("dedupe")
        seed_scenarios(Database(db), StripeGateway(STRIPE_API_KEY, self.stack.stripe_url, 10.0))
        return settings


def task(name: str, suffix: str, **options) -> TaskInput:
    base = SCENARIOS[name](**options)
    return base.model_copy(update={"task_id": f"{base.task_id}-{suffix}"})


async def happy(r: Recorder, name: str) -> list[WorkflowHandle]:
    settings = r.settings()
    async with build_worker(r.client, settings):
        handle = await start_task(r.client, settings, task(name, "happy"))
        await handle.result()
    return [handle]


async def timeout_after_accept(r: Recorder) -> list[WorkflowHandle]:
    settings = r.settings()
    r.edge.configure("passthrough", preset("timeout-after-accept", "/v1/refunds", 1.0))
    async with build_worker(r.client, settings):
        handle = await start_task(r.client, settings, task("SU-88421", "timeout-after-accept", repeat_effects=1))
        await handle.result()
    return [handle]


async def unknown_resolved(r: Recorder) -> list[WorkflowHandle]:
    settings = r.settings()
    r.edge.configure("passthrough", preset("unverifiable", "/v1/refunds", 1.0))
    async with build_worker(r.client, settings):
        handle = await start_task(r.client, settings, task("SU-88421", "unknown-resolved"))
        cp = await waiting(handle)
        r.edge.configure("passthrough")
        gateway = StripeGateway(STRIPE_API_KEY, r.stack.stripe_url, 10.0)
        pi = Records(Database(settings.agent_db_path)).order("SU-88421").payment_intent_id
        [refund] = gateway.refunds(pi)
        await handle.signal("resolve", signed(handle.id, cp.waiting_for.intent_key, "mark_performed",
                                              provider_ref=refund.id))
        await handle.result()
    return [handle]


async def approval(r: Recorder, decision: str) -> list[WorkflowHandle]:
    settings = r.settings(approval_ceiling_cents=10000)
    async with build_worker(r.client, settings):
        handle = await start_task(r.client, settings, task("SU-88421", f"approval-{decision}"))
        cp = await waiting(handle)
        await handle.signal("resolve", "not a decision")
        await handle.signal("resolve", signed(handle.id, "v1:issue_refund:other", decision))
        await handle.signal("resolve", {"intent_key": cp.waiting_for.intent_key, "decision": decision,
                                        "decided_by": "alice@example.com"})  # unsigned: refused
        if decision == "approve":
            await handle.execute_update("decide", ResolveInput(**signed(handle.id, cp.waiting_for.intent_key,
                                                                        "approve")),
                                        result_type=DecisionReceipt)
        else:
            await handle.signal("resolve", signed(handle.id, cp.waiting_for.intent_key, decision,
                                                  note="not without a photo"))
        await handle.result()
    return [handle]


async def dead_letter_and_redrive(r: Recorder) -> list[WorkflowHandle]:
    settings = r.settings(escalation_timeout_seconds=2)
    r.edge.configure("passthrough", preset("unverifiable", "/v1/refunds", 1.0))
    async with build_worker(r.client, settings):
        first = await start_task(r.client, settings, task("SU-88421", "dead-letter"))
        await first.result()
        r.edge.configure("passthrough")
        second, _, _ = await redrive(r.client, settings, first.id)
        await second.result()
    return [r.client.get_workflow_handle(first.id, run_id=first.result_run_id), second]


async def policy_unreadable(r: Recorder) -> list[WorkflowHandle]:
    settings = r.settings()
    with sqlite3.connect(settings.agent_db_path) as conn:  # the worker's records, unreadable
        conn.execute("ALTER TABLE orders RENAME TO orders_away")
    async with build_worker(r.client, settings):
        first = await start_task(r.client, settings, task("SU-88421", "policy-unreadable"))
        await first.result()
        with sqlite3.connect(settings.agent_db_path) as conn:
            conn.execute("ALTER TABLE orders_away RENAME TO orders")
        second, _, _ = await redrive(r.client, settings, first.id)
        await second.result()
    return [r.client.get_workflow_handle(first.id, run_id=first.result_run_id), second]


async def crash_and_resume(r: Recorder) -> list[WorkflowHandle]:
    settings = r.settings()
    env = {"TEMPORAL_ADDRESS": settings.temporal_address, "TASK_QUEUE": settings.task_queue,
           "STRIPE_API_BASE": settings.stripe_api_base, "STRIPE_API_KEY": STRIPE_API_KEY,
           "AGENT_DB_PATH": str(settings.agent_db_path)}
    crashing = r.stack.start_worker(r.root / "crashing.log", {**env, "CRASH_AT": "issue_refund:after_provider",
                                                              "CRASH_MARKER": str(r.root / "crashed")})
    handle = await start_task(r.client, settings, task("refund-8841", "crash-resume"))
    await asyncio.to_thread(crashing.process.wait, 60)
    fresh = r.stack.start_worker(r.root / "fresh.log", env)
    try:
        await handle.result()
    finally:
        fresh.stop()
    return [handle]


async def continue_as_new(r: Recorder) -> list[WorkflowHandle]:
    settings = r.settings()
    long = long_run(turns=60, task_id="long-ORD-8841-continue-as-new").model_copy(
        update={"max_history_events": 200})
    async with build_worker(r.client, settings):
        handle = await start_task(r.client, settings, long)
        await handle.result()
    runs = [w async for w in r.client.list_workflows(f'WorkflowId = "{long.task_id}"')]
    return [r.client.get_workflow_handle(long.task_id, run_id=w.run_id) for w in sorted(runs, key=lambda w: w.start_time)]


async def refused_by_the_world(r: Recorder) -> list[WorkflowHandle]:
    settings = r.settings()
    r.edge.configure("passthrough", [
        {"method": "POST", "path": "/v1/refunds", "fault": "timeout_after_accept", "nth": [1], "delay_seconds": 2.0},
        {"method": "GET", "path": "/v1/refunds", "fault": "fail", "after_rule": 0}])
    async with build_worker(r.client, settings):
        handle = await start_task(r.client, settings, task("SU-88421", "refused-by-the-world"))
        cp = await waiting(handle)
        r.edge.configure("passthrough")
        try:
            await handle.execute_update("decide", ResolveInput(**signed(handle.id, cp.waiting_for.intent_key,
                                                                        "mark_not_performed")))
        except WorkflowUpdateFailedError:
            pass  # refused: the provider shows the refund
        await handle.result()
    return [handle]


async def flooded_wait(r: Recorder) -> list[WorkflowHandle]:
    settings = r.settings(approval_ceiling_cents=10000)
    async with build_worker(r.client, settings):
        first = await start_task(r.client, settings, task("SU-88421", "flooded-wait"))
        cp = await waiting(first)
        for _ in range(8):
            await first.signal("resolve", "x" * 480_000)

        async def rolled_over():
            now = await first.query("checkpoint", result_type=Checkpoint)
            return now if now.runs > 1 and now.state == "awaiting_human" else None
        await poll_until(rolled_over, "the wait to go on in a fresh run", 60)
        await first.signal("resolve", signed(first.id, cp.waiting_for.intent_key, "approve"))
        result = await first.result()

    async def every_run():
        runs = [e async for e in r.client.list_workflows(f'WorkflowId="{first.id}"')]
        return runs if len(runs) == result.checkpoint.runs else None
    runs = sorted(await poll_until(every_run, "every run to be listed", 30), key=lambda e: e.start_time)
    return [r.client.get_workflow_handle(first.id, run_id=e.run_id) for e in runs]


async def _every_run(r: Recorder, handle: WorkflowHandle, count: int) -> list[WorkflowHandle]:
    async def listed():
        runs = [e async for e in r.client.list_workflows(f'WorkflowId="{handle.id}"')]
        return runs if len(runs) == count else None
    runs = sorted(await poll_until(listed, "every run to be listed", 30), key=lambda e: e.start_time)
    return [r.client.get_workflow_handle(handle.id, run_id=e.run_id) for e in runs]


async def _rolled_over(handle: WorkflowHandle) -> Checkpoint:
    async def check():
        try:
            now = await handle.query("checkpoint", result_type=Checkpoint)
        except RPCError:  # the continue-as-new is being retried by the server meanwhile
            return None
        return now if now.runs > 1 else None
    return await poll_until(check, "the wait to go on in a fresh run", 60)


async def unusable_wait_rolled(r: Recorder) -> list[WorkflowHandle]:
    settings = r.settings()
    long_wait = task("SU-88421", "unusable-wait-rolled", bad_calls=3).model_copy(update={"max_history_bytes": 200_000})
    async with build_worker(r.client, settings):
        first = await start_task(r.client, settings, long_wait)
        await waiting(first)
        await first.signal("resolve", "x" * 300_000)
        cp = await _rolled_over(first)
        await first.signal("resolve", signed(first.id, cp.waiting_for.intent_key, "approve"))
        result = await first.result()
    return await _every_run(r, first, result.checkpoint.runs)


async def carried_question_ran(r: Recorder) -> list[WorkflowHandle]:
    settings = r.settings(stripe_honours_keys=True, stripe_processing_window_seconds=20.0)
    r.edge.configure("dedupe", [
        {"method": "POST", "path": "/v1/refunds", "fault": "drop_before_commit", "from_nth": 1},
        {"method": "GET", "path": "/v1/refunds", "fault": "fail", "after_rule": 0}])
    long_wait = task("SU-88421", "carried-question-ran").model_copy(update={"max_history_bytes": 200_000})
    async with build_worker(r.client, settings):
        first = await start_task(r.client, settings, long_wait)
        await waiting(first)
        r.edge.configure("dedupe")
        await first.signal("resolve", "x" * 300_000)
        result = await first.result()
    return await _every_run(r, first, result.checkpoint.runs)


async def question_asked_again(r: Recorder) -> list[WorkflowHandle]:
    settings = r.settings(approval_ceiling_cents=10000, stripe_timeout_seconds=1.0)
    r.edge.configure("passthrough", [  # the refund lands, its answer is lost, and nobody can read the refunds
        {"method": "POST", "path": "/v1/refunds", "fault": "timeout_after_accept", "nth": [1], "delay_seconds": 2.0},
        {"method": "GET", "path": "/v1/refunds", "fault": "fail", "after_rule": 0}])
    async with build_worker(r.client, settings):
        handle = await start_task(r.client, settings, task("SU-88421", "question-asked-again"))
        first = (await waiting(handle)).waiting_for
        late = signed(handle.id, first, "approve", by=BOB)
        await handle.signal("resolve", signed(handle.id, first, "approve"))

        async def asked_again() -> Checkpoint | None:
            cp = await handle.query("checkpoint", result_type=Checkpoint)
            return cp if cp.waiting_for is not None and cp.waiting_for.question == 2 else None
        second = (await poll_until(asked_again, "the second question", 120)).waiting_for
        await handle.signal("resolve", late)  # answers question 1: ignored
        r.edge.configure("passthrough")
        await handle.signal("resolve", signed(handle.id, second, "approve"))
        await handle.result()
    return [handle]


PATHS = [
    Path_("su-88421-happy", "support ticket: order, policy, refund, seller, pickup, customer",
          lambda r: happy(r, "SU-88421")),
    Path_("refund-8841-happy", "the four-step refund worker", lambda r: happy(r, "refund-8841")),
    Path_("inv-9-happy", "payables: invoice, payment, remittance email", lambda r: happy(r, "INV-9")),
    Path_("su-88421-timeout-after-accept", "refund accepted, client timed out, verified by lookup; the model "
          "asks again and gets already_performed from the journal", timeout_after_accept),
    Path_("su-88421-unknown-resolved", "refund unverifiable -> unknown -> awaiting_human -> mark_performed by signal",
          unknown_resolved),
    Path_("su-88421-approval-granted", "over the ceiling: a malformed, a wrong-key and an unsigned signal "
          "change nothing, then a signed decide Update approves", lambda r: approval(r, "approve")),
    Path_("su-88421-approval-rejected", "over the ceiling, rejected by a signed signal; no refund",
          lambda r: approval(r, "reject")),
    Path_("su-88421-dead-letter", "unknown refund nobody decides on -> dead letter (run 1) and its redrive, "
          "where the refund comes back already_performed (run 2)", dead_letter_and_redrive),
    Path_("su-88421-policy-unreadable", "the task's policy cannot be read (its records table is gone) -> the "
          "local activity's retries are spent -> dead letter (run 1); the table back, its redrive pays (run 2)",
          policy_unreadable),
    Path_("refund-8841-crash-resume", "worker SIGKILLed after the provider accepted the refund; a fresh "
          "worker verifies and finishes", crash_and_resume),
    Path_("su-88421-refused-by-the-world", "refund landed while the provider could not be read -> unknown -> "
          "the world read before asking -> a mark_not_performed Update refused by the world check -> completed "
          "with the refund", refused_by_the_world),
    Path_("su-88421-flooded-wait", "over the ceiling; 480 KB signals fill the waiting run's history -> it "
          "continues as new and asks the same question -> approved in the last run", flooded_wait),
    Path_("long-run-continue-as-new", "60 turns with a 200-event budget: each run continues as new, carrying "
          "the journal", continue_as_new),
    Path_("su-88421-unusable-wait-rolled", "three unusable model replies -> a person asked; a 300 KB signal rolls "
          "the wait into a new run, which still waits -> approved there", unusable_wait_rolled),
    Path_("su-88421-carried-question-ran", "every refund request dropped and the refunds unreadable -> unknown -> "
          "a person asked; the provider readable again and a 300 KB signal rolls the wait over -> the new run finds "
          "nothing landed past the horizon, withdraws the question and refunds", carried_question_ran),
    Path_("su-88421-question-asked-again", "over the ceiling, approved (question 1); the refund's answer lost and the "
          "refunds unreadable -> unknown (question 2, the same call); a second approval of question 1 is ignored; "
          "the provider readable again, question 2 approved or settled by the world", question_asked_again),
]


async def record(only: set[str]) -> None:
    HISTORIES.mkdir(exist_ok=True)
    BAD.mkdir(exist_ok=True)
    notes = ["# Recorded histories", "", "Written by `python -m tests.record` from real runs on the dev server; "
             "replayed by tests/test_replay.py with the current workflow code.", ""]
    with tempfile.TemporaryDirectory() as tmp, Stack.for_tests(Path(tmp)) as stack:
        client = await Client.connect(stack.address, data_converter=pydantic_data_converter)
        recorder = Recorder(stack, client, Path(tmp))
        for path in PATHS:
            if only and path.name not in only:
                continue
            handles = await path.run(recorder)
            files = []
            for n, handle in enumerate(handles, start=1):
                history = await handle.fetch_history()
                name = path.name if len(handles) == 1 else f"{path.name}-run{n}"
                (HISTORIES / f"{name}.json").write_text(json.dumps(json.loads(history.to_json()), indent=1))
                files.append(f"`{name}.json` ({len(history.events)} events)")
            notes.append(f"- {', '.join(files)}: {path.note}")
            print(f"recorded {path.name}: {', '.join(files)}", flush=True)
    write_known_bad()
    notes += ["", "`known-bad/swapped-activity.json`: su-88421-happy with its refund's activity type changed to "
              "another tool's; the replayer must reject it.", "",
              "`earlier/<change>/`: histories recorded before a patched change (see each folder's README). Tasks "
              "started then may still be running, so they keep replaying; a folder goes once its patch is removed."]
    if not only:
        (HISTORIES / "README.md").write_text("\n".join(notes) + "\n")


def write_known_bad() -> None:
    history = json.loads((HISTORIES / "su-88421-happy.json").read_text())
    for event in history["events"]:
        scheduled = event.get("activityTaskScheduledEventAttributes")
        if scheduled and scheduled["activityType"]["name"] == "issue_refund":
            scheduled["activityType"]["name"] = "send_payment"
            break
    (BAD / "swapped-activity.json").write_text(json.dumps(history, indent=1))


if __name__ == "__main__":
    run_main(lambda: asyncio.run(record(set(sys.argv[1:]))))
