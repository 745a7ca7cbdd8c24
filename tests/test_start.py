"""Running one's own tickets (`starter.py start`, `batch FILE`), the product commands without the
dev package, scenarios with a fault as fresh tasks, and a fault that never outlives its scenario.

Judged on the world: provider refunds, Temporal's executions, the edge's configuration.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from activities.db import Database
from activities.payments import StripeGateway
from activities.records import Records
from activities.world import World
from client import Ticket, start_task, start_ticket
from core.domain import Order
from core.models import Checkpoint, ModelReply, ModelTurnInput
from core.names import MODEL_TURN_ACTIVITY
from devstack.edge_control import EdgeControl
from devstack.polling import poll_until
from devstack.seed import seed_order
from devstack.stack import STRIPE_API_KEY
from infra.settings import Settings
from tests.helpers import finished, running_worker

ROOT = Path(__file__).resolve().parent.parent


def starter(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "starter.py", *args], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout)


def devstack(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "devstack", *args], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout)


def seed_tickets(settings: Settings, tickets: list[dict]) -> None:
    """The tickets' orders exist in "your" system (the local stack's records) and are paid at the provider."""
    gateway = StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, 10.0)
    db = Database(settings.agent_db_path)
    db.create()
    for ticket in tickets:
        seed_order(Records(db), gateway, Order.model_validate(ticket["order"]))


def own_ticket(kind: str = "support", cents: int = 8900) -> dict:
    n = uuid.uuid4().hex[:8]
    return {"kind": kind, "ticket_id": f"T-{n}", "text": "The table arrived with a split leg; please refund it.",
            "facts": {"order_id": f"W-{n}"},
            "order": {"order_id": f"W-{n}", "customer_name": "Priya Raman",
                      "customer_email": "priya.raman@example.com", "seller": "Northwood Studio",
                      "seller_email": "hello@northwood.example",
                      "items": [{"item_id": "table", "description": "Walnut side table", "amount_cents": cents}]}}


def world_of(settings: Settings) -> World:
    return World(Database(settings.agent_db_path), StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, 10.0))


async def test_own_ticket_from_a_file_twice_runs_once_with_one_refund(client: Client, settings: Settings,
                                                                      worker_env: dict[str, str], tmp_path: Path):
    ticket = own_ticket()
    path = tmp_path / "ticket.json"
    path.write_text(json.dumps(ticket))
    seed_tickets(settings, [ticket])
    async with running_worker(client, settings):
        first = await asyncio.to_thread(starter, ["start", "--file", str(path), "--json"], worker_env)
        second = await asyncio.to_thread(starter, ["start", "--file", str(path), "--json"], worker_env)
    for done in (first, second):
        assert done.returncode == 0, done.stderr
    task_id = f"ticket-{ticket['ticket_id']}"
    runs = [e async for e in client.list_workflows(f'WorkflowId="{task_id}"')]
    assert len(runs) == 1, runs
    refunds = world_of(settings).refunds(ticket["order"]["order_id"])
    assert [r["amount_cents"] for r in refunds] == [8900]
    description = await client.get_workflow_handle(task_id).describe()
    summary = await description.static_summary()
    assert summary == f"support · {task_id} · order {ticket['order']['order_id']} · $89.00", summary


async def test_batch_of_a_jsonl_file(client: Client, settings: Settings, worker_env: dict[str, str],
                                     tmp_path: Path):
    tickets = [own_ticket("refund", 1000 + n) for n in range(3)]
    path = tmp_path / "tickets.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in tickets) + "\n")
    seed_tickets(settings, tickets)
    async with running_worker(client, settings):
        done = await asyncio.to_thread(starter, ["batch", str(path)], worker_env)
    assert done.returncode == 0, done.stderr
    world = world_of(settings)
    assert [[r["amount_cents"] for r in world.refunds(t["order"]["order_id"])] for t in tickets] == \
        [[1000], [1001], [1002]]


async def test_start_ticket_function_attaches_to_the_same_ticket(client: Client, settings: Settings):
    raw = own_ticket("refund", 2500)
    seed_tickets(settings, [raw])
    ticket = Ticket.model_validate(raw)
    async with running_worker(client, settings):
        first = await start_ticket(client, settings, ticket)
        second = await start_ticket(client, settings, ticket)
        result = await finished(second)
    assert first.id == second.id == f"ticket-{ticket.ticket_id}"
    assert result.state == "completed"
    assert len(world_of(settings).refunds(ticket.order.order_id)) == 1


def held_model_turn() -> Callable[[ModelTurnInput], Awaitable[ModelReply]]:
    """A model that never answers: the task's first run stays at its first turn."""
    @activity.defn(name=MODEL_TURN_ACTIVITY)
    async def model_turn(turn: ModelTurnInput) -> ModelReply:
        await asyncio.Event().wait()
        raise AssertionError("never answered")
    return model_turn


async def workflow_task_done(handle: WorkflowHandle) -> bool:
    return any([e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED async for e in handle.fetch_history_events()])


@pytest.mark.parametrize("began_before_the_fold", [True, False])
async def test_a_ticket_started_again_after_its_run_was_terminated_keeps_the_intent_keys_it_began_with(
        client: Client, settings: Settings, began_before_the_fold: bool):
    """A start of a ticket whose run was terminated runs it again; the new run derives its messages' intent
    keys as the task did when it began (a task begun before the second fold without their money status, one
    begun since with it), so nothing it sent goes again under another key. Without a worker the first run
    never moves: it is only what its input and its first workflow task recorded."""
    raw = own_ticket("refund", 2500)
    seed_tickets(settings, [raw])
    ticket = Ticket.model_validate(raw)
    first = ticket.task_input().model_copy(update={"status_in_message_keys": False} if began_before_the_fold else {})
    async with running_worker(client, settings, replace=[held_model_turn()]):
        handle = await start_task(client, settings, first)
        await poll_until(lambda: workflow_task_done(handle), "the first run's first workflow task", timeout=60)
        await handle.terminate("an operator stops it")
    async with running_worker(client, settings):
        again = await start_ticket(client, settings, ticket)
        result = await finished(again)
    assert again.id == handle.id and result.state == "completed"
    assert result.checkpoint.status_in_message_keys is not began_before_the_fold


@pytest.mark.parametrize("args,expected", [
    (["start", "support", "T-1"], "needs a kind, a ticket id and --text"),
    (["start", "payables", "T-1", "--text", "pay it"], "needs the fact(s) invoice_id"),
    (["start", "support", "bad id!", "--text", "x", "--order", "O-1"], "ticket_id"),
    (["batch", "no-such-file.jsonl"], "cannot read no-such-file.jsonl"),
])
def test_bad_tickets_get_one_line_and_exit_2(args: list[str], expected: str, worker_env: dict[str, str]):
    done = starter(args, worker_env)
    assert done.returncode == 2 and expected in done.stderr, (done.returncode, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


async def test_product_commands_run_without_the_dev_package(client: Client, settings: Settings,
                                                            worker_env: dict[str, str]):
    """`devstack` made unimportable: start, status and list work; the demo commands are devstack's alone."""
    blocked = ("import runpy, sys; sys.modules['devstack'] = None; sys.argv = ['starter.py', *sys.argv[1:]]; "
               "runpy.run_path('starter.py', run_name='__main__')")

    def run_blocked(args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", blocked, *args], cwd=ROOT, env={**os.environ, **worker_env},
                              capture_output=True, text=True, timeout=120)

    raw = own_ticket("refund", 3100)
    seed_tickets(settings, [raw])
    ticket = Ticket.model_validate(raw)
    async with running_worker(client, settings):
        started = await asyncio.to_thread(run_blocked, ["start", "refund", ticket.ticket_id, "--text", ticket.text,
                                                        "--order", ticket.order.order_id])
        status = await asyncio.to_thread(run_blocked, ["status", f"ticket-{ticket.ticket_id}"])
        listed = await asyncio.to_thread(run_blocked, ["list"])
    assert started.returncode == 0, started.stderr
    assert status.returncode == 0 and status.stdout.startswith(f"ticket-{ticket.ticket_id}: completed"), status
    assert listed.returncode == 0 and listed.stdout.strip(), listed
    demo = await asyncio.to_thread(run_blocked, ["scenario", "SU-88421"])
    assert demo.returncode == 2 and "invalid choice: 'scenario'" in demo.stderr, demo.stderr


async def test_list_shows_a_waiting_task_whose_worker_is_down(client: Client, settings: Settings, world: World,
                                                               worker_env: dict[str, str]):
    from tests.helpers import scenario_task, start, waiting

    low = settings.model_copy(update={"approval_ceiling_cents": 5000})
    task = scenario_task("SU-88421")
    async with running_worker(client, low):
        await waiting(await start(client, low, task))
        listed = await asyncio.to_thread(starter, ["list"], worker_env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith(task.task_id) and "approval_required on issue_refund" in listed.stdout, listed
    down = await asyncio.to_thread(starter, ["list"], worker_env)  # no worker for its queue now
    assert down.returncode == 0, down.stderr
    assert down.stdout.startswith(task.task_id) and "did not answer" in down.stdout, down.stdout
    await client.get_workflow_handle(task.task_id).terminate("test over")


async def test_redrive_can_change_the_escalation_deadline(client: Client, settings: Settings, world: World):
    from client import redrive
    from core.models import TaskInput
    from tests.helpers import scenario_task, start, waiting

    low = settings.model_copy(update={"approval_ceiling_cents": 5000})
    task = scenario_task("SU-88421")
    async with running_worker(client, low):
        handle = await start(client, low, task)
        await waiting(handle)
        await handle.terminate("the operator wants a shorter deadline")
        new, redriven, was = await redrive(client, low, task.task_id, escalation_timeout_seconds=7)
        cp = await waiting(new)
        await new.terminate("done looking")
    history = await new.fetch_history()
    [started] = await client.data_converter.decode(
        history.events[0].workflow_execution_started_event_attributes.input.payloads, [TaskInput])
    assert was == "terminated" and started.escalation_timeout_seconds == 7 == redriven.escalation_timeout_seconds
    since, deadline = (datetime.fromisoformat(t.replace("Z", "+00:00"))
                       for t in (cp.waiting_for.since, cp.waiting_for.deadline))
    assert (deadline - since).total_seconds() == 7
    assert len(world.refunds("SU-88421")) == 0


async def test_a_redrive_of_a_run_that_continued_as_new_starts_from_the_tasks_input(
        client: Client, settings: Settings, world: World):
    """A waiting run rolled into a new one (a junk signal filled its history) and was stopped: its redrive
    starts from the task's own input, not the stopped run's carry. It reads the task's policy again, so the
    redrive's deadline holds, and asks its question afresh (before, it took up the carried question with
    the stopped run's deadline)."""
    from client import redrive
    from tests.helpers import checkpoint, scenario_task, start, wait_for, waiting

    low = settings.model_copy(update={"approval_ceiling_cents": 5000})
    task = scenario_task("SU-88421").model_copy(update={"max_history_bytes": 200_000})
    async with running_worker(client, low):
        handle = await start(client, low, task)
        await waiting(handle)
        await handle.signal("resolve", "x" * 300_000)

        async def rolled():
            cp = await checkpoint(handle)
            return cp if cp.runs == 2 and cp.state == "awaiting_human" else None
        await wait_for(rolled, "the wait rolled into a new run", 60)
        await handle.terminate("the operator wants a shorter deadline")
        new, redriven, was = await redrive(client, low, task.task_id, escalation_timeout_seconds=7)
        cp = await waiting(new)
        await new.terminate("done looking")
    assert was == "terminated" and redriven.carry is None and cp.runs == 1, cp.runs
    since, deadline = (datetime.fromisoformat(t.replace("Z", "+00:00"))
                       for t in (cp.waiting_for.since, cp.waiting_for.deadline))
    assert (deadline - since).total_seconds() == 7 and cp.waiting_for.question == 1
    assert len(world.refunds("SU-88421")) == 0


async def test_scenario_with_a_fault_is_a_fresh_task_and_leaves_the_edge_as_found(
        client: Client, settings: Settings, world: World, worker_env: dict[str, str], edge: EdgeControl):
    before = edge.current()
    async with running_worker(client, settings):
        runs = []
        for _ in range(2):
            done = await asyncio.to_thread(devstack, ["scenario", "SU-88421", "--fault", "timeout-after-accept",
                                                     "--task-id", f"fault-{uuid.uuid4().hex[:8]}", "--json"],
                                           worker_env)
            assert done.returncode == 0, done.stderr
            runs.append(json.loads(done.stdout))
            assert edge.current() == before
    assert runs[0]["task_id"] != runs[1]["task_id"]
    for summary in runs:
        assert summary["state"] == "completed"
        assert len(summary["world"]["refunds"]) == 1, summary["world"]
        trail = summary["checkpoint"]["steps"]["issue_refund"]["trail"]
        assert "verified by provider lookup" in trail[0], trail  # the fault was injected into this run


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_an_interrupted_scenario_still_restores_the_edge(client: Client, settings: Settings, world: World,
                                                               worker_env: dict[str, str], edge: EdgeControl):
    """`unverifiable` leaves the task waiting for a person; Ctrl-C on the demo command puts the edge back."""
    before = edge.current()
    task_id = f"interrupted-{uuid.uuid4().hex[:8]}"
    async with running_worker(client, settings):
        proc = subprocess.Popen([sys.executable, "-m", "devstack", "scenario", "SU-88421", "--fault", "unverifiable",
                                 "--task-id", task_id], cwd=ROOT,
                                env={**os.environ, **worker_env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                # Ctrl-C as at a terminal: a suite started in the background (`make test &`)
                                # ignores SIGINT, and a child would inherit that and never see the signal.
                                preexec_fn=_interruptible)
        try:
            async def waits():
                try:
                    cp = await client.get_workflow_handle(task_id).query("checkpoint", result_type=Checkpoint)
                except Exception:
                    return None
                return cp if cp.waiting_for is not None else None
            await poll_until(waits, f"{task_id} to wait for a person", 90.0)
            assert edge.current() != before, "the fault is on while the scenario runs"
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
            reader.start()
            hint = "Ctrl-C stops watching; the task keeps waiting."
            async def hinted():
                return any(hint in line for line in lines)
            await poll_until(hinted, "the starter's Ctrl-C hint", 30.0)
            proc.send_signal(signal.SIGINT)
            await asyncio.to_thread(proc.wait, 60)  # a process that hangs as it ends fails here, not in a read
            err = await asyncio.to_thread(proc.stderr.read)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert "stopped watching; started tasks go on in Temporal" in err
    assert edge.current() == before


async def test_a_ticket_whose_facts_do_not_hold_is_refused_and_nothing_starts(
        client: Client, settings: Settings, world: World, worker_env: dict[str, str]):
    """The worker checks the facts (our records, the provider) before the task exists: one line, exit 2."""
    from core.domain import Invoice, Item
    from devstack.seed import seed_invoice

    records = Records(Database(settings.agent_db_path))
    gateway = StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, 10.0)
    n = uuid.uuid4().hex[:8]
    unpaid = Order(order_id=f"U-{n}", customer_name="Ana Silva", customer_email="ana@example.com", seller="S",
                   seller_email="s@example.com", items=[Item(item_id="lamp", description="Lamp", amount_cents=900)])
    records.put_order(unpaid, "cus_nobody", "pi_nowhere")  # in our records, never paid at the provider
    gone = Invoice(invoice_id=f"INV-{n}", payee="Nobody Ltd", payee_email="ap@nobody.example", amount_cents=100)
    seed_invoice(records, gateway, gone)
    records.put_invoice(gone, "cus_unknown_to_the_provider")
    cases = [
        (["support", f"T-{n}-1", "--order", f"NOPE-{n}"], f"no order NOPE-{n} in our records"),
        (["refund", f"T-{n}-2", "--order", "SU-88421", "--item", "no-such-item"], "order SU-88421 has no item no-such-item"),
        (["refund", f"T-{n}-3", "--order", unpaid.order_id], "the provider holds no succeeded payment pi_nowhere"),
        (["payables", f"T-{n}-4", "--invoice", f"INV-NOPE-{n}"], f"no invoice INV-NOPE-{n} in our records"),
        (["payables", f"T-{n}-5", "--invoice", gone.invoice_id], "the provider does not know its payee"),
    ]
    async with running_worker(client, settings):
        done = [await asyncio.to_thread(starter, ["start", *args[:2], "--text", "please", *args[2:]], worker_env)
                for args, _ in cases]
        fine = await asyncio.to_thread(starter, ["start", "refund", f"T-{n}-6", "--text", "the shelf broke",
                                                 "--order", "SU-88421", "--no-wait"], worker_env)
    for (args, expected), refused in zip(cases, done):
        assert refused.returncode == 2, (args, refused)
        line = refused.stderr.strip()
        assert len(line.splitlines()) == 1 and f"ticket-{args[1]} not started: " in line and expected in line, line
        assert refused.stdout == "", refused.stdout
        assert [e async for e in client.list_workflows(f'WorkflowId="ticket-{args[1]}"')] == []
    assert fine.returncode == 0 and fine.stdout.startswith(f"ticket-T-{n}-6: started"), fine
    await client.get_workflow_handle(f"ticket-T-{n}-6").terminate("test over")


def test_without_a_worker_the_check_says_so(settings: Settings, worker_env: dict[str, str]):
    done = starter(["start", "support", "T-no-worker", "--text", "x", "--order", "SU-88421"], worker_env)
    assert done.returncode == 2, done
    assert "no worker of task queue" in done.stderr and "is the worker up?" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


async def test_a_long_safety_wait_says_what_it_waits_for_and_until_when(
        client: Client, settings: Settings, world: World, worker_env: dict[str, str], edge: EdgeControl):
    """A payment whose request was answered with a 500, at a provider that ignores keys: nothing is resent
    until the request's settle horizon; the progress says so, with the time, instead of only `running`."""
    import re

    slow = settings.model_copy(update={"stripe_processing_window_seconds": 5.0})
    async with running_worker(client, slow):
        done = await asyncio.to_thread(devstack, ["scenario", "INV-9", "--fault", "error-before-commit", "--edge-mode",
                                                  "passthrough", "--task-id", f"wait-{uuid.uuid4().hex[:8]}"],
                                       worker_env)
    assert done.returncode == 0, done.stderr
    waits = [line for line in done.stdout.splitlines() if "send_payment" in line and "waits until" in line]
    assert waits, done.stdout
    assert re.search(r"send_payment +waits until \d\d:\d\d:\d\d UTC \(in \d+ s\), then runs again \(attempt 2\): "
                     r".*the request may still land until its settle horizon$", waits[0]), waits
