"""Runs the matrix on a real local stack and reads each run's world back from the records.

One stack (Temporal dev server, localstripe behind the Stripe edge) serves the whole matrix.
Runs go one at a time, because the edge's fault rules count requests across the whole stack.
Each run gets its own order (or invoice), seeded and paid at the provider, and its own task id;
each column has its own task queue served by an in-process worker built with
`worker.build_worker`. A run whose condition kills the worker gets a queue of its own: a worker
process for the column serves it until it SIGKILLs or SIGSTOPs itself, then an in-process one
finishes it (and a paused process is woken afterwards).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import stripe
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from activities.db import Database
from activities.payments import KEY_FIELD, StripeGateway, metadata_of
from activities.records import Records
from activities.world import World
from client import start_task
from core.models import Checkpoint, TaskInput, TaskResult
from devstack.chaos import task_state
from devstack.edge_control import EdgeControl
from devstack.eval.columns import MONEY_TOOLS, Column
from devstack.eval.conditions import Condition
from devstack.eval.grade import SETTLED, Grade, Observed, grade
from devstack.eval.tickets import Ticket
from devstack.polling import poll_until
from devstack.processes import WorkerProcess
from devstack.seed import seed_order
from devstack.stack import STRIPE_API_KEY, Stack
from infra import connection
from infra.settings import Settings
from worker import Extensions, build_worker

__all__ = ["Run", "Runner"]

CLIENT_TIMEOUT = 1.0  # seconds: a timeout after accept costs two
# How long a request may still land after the client gave up, and how long after its claim an attempt
# may still send: short, so an ambiguous send waits out its horizon in seconds (production: settings).
PROCESSING_WINDOW = 1.0
EFFECT_LEASE = 2.0
_RPC = timedelta(seconds=10)


@dataclass
class Run:
    ticket: str
    condition: str
    column: str
    baseline: bool
    task_id: str
    resource_id: str
    grade: Grade
    observed: Observed
    faults: dict[str, int] = field(default_factory=dict)
    ui_url: str | None = None
    worker_fault: bool | None = None  # for kill and pause conditions: whether the fault struck

    @property
    def passed(self) -> bool:
        return self.grade.passed


class _ColumnWorker(WorkerProcess):
    """`python -m devstack.eval._worker SPEC`: a worker process built like the column's in-process one."""

    def __init__(self, env: dict[str, str], log_file: Path, spec: str) -> None:
        super().__init__(env, log_file)
        self.spec = spec

    def command(self) -> list[str]:
        return [sys.executable, "-m", "devstack.eval._worker", self.spec]


class Runner:
    def __init__(self, stack: Stack, data_dir: Path, settle_timeout: float = 90.0,
                 worker_env: dict[str, str] | None = None) -> None:
        self.stack = stack
        self.data_dir = data_dir
        self.settle_timeout = settle_timeout
        self.worker_env = worker_env or {}
        self.edge = EdgeControl(stack.stripe_url)
        self.db = Database(stack.agent_db)
        self.db.create()
        self.gateway = StripeGateway(STRIPE_API_KEY, stack.stripe_url, 10.0)
        self.records = Records(self.db)
        self.world = World(self.db, self.gateway)
        self._count = 0
        # Runs of two evals on one stack (the test session's) must not share an order or a task id.
        self._token = uuid.uuid4().hex[:4]

    def settings(self, task_queue: str) -> Settings:
        return Settings(temporal_address=self.stack.address, task_queue=task_queue,
                        stripe_api_base=self.stack.stripe_url, stripe_api_key=STRIPE_API_KEY,
                        agent_db_path=self.stack.agent_db, database_url=None, payload_encryption_key=None,
                        stripe_timeout_seconds=CLIENT_TIMEOUT, stripe_processing_window_seconds=PROCESSING_WINDOW,
                        effect_lease_seconds=EFFECT_LEASE, reconcile_every_minutes=0,
                        temporal_ui_url=self.stack.ui_url or "")

    async def run(self, tickets: list[Ticket], conditions: list[Condition], columns: list[Column],
                  done: Callable[[Run], None] = lambda run: None) -> list[Run]:
        """Every ticket under every condition in every column; `done` hears of each run as it ends."""
        client = await connection.connect(self.settings("eval"))
        runs: list[Run] = []
        async with contextlib.AsyncExitStack() as workers:
            for column in columns:
                settings = self.settings(f"eval-{column.name}-{self._token}")
                backend = await workers.enter_async_context(contextlib.aclosing(column.backend(settings)))
                extensions = Extensions(replace=column.replace(settings))
                await workers.enter_async_context(build_worker(client, settings, backend=backend,
                                                               extensions=extensions))
            for ticket in tickets:
                for condition in conditions:
                    for column in columns:
                        run = await self.one(client, ticket, condition, column)
                        runs.append(run)
                        done(run)
        return runs

    async def one(self, client: Client, ticket: Ticket, condition: Condition, column: Column) -> Run:
        self._count += 1
        fresh, resource = ticket.for_run(f"{self._token}{self._count}")
        await asyncio.to_thread(self._seed, fresh)
        task = fresh.task(f"eval-{ticket.id}-{condition.name}-{column.name}-{self._token}{self._count}")
        money_path = "/v1/refunds" if fresh.order is not None else "/v1/payment_intents"
        money_tool = MONEY_TOOLS[0] if fresh.order is not None else MONEY_TOOLS[1]
        fault = condition.worker_fault(money_tool, column.naive_tool)
        queue = f"eval-{column.name}-{self._token}"
        if fault is not None:
            queue += f"-{self._count}"
        settings = self.settings(queue)
        self.edge.configure(condition.mode, condition.rules(money_path, CLIENT_TIMEOUT))

        started = time.monotonic()
        struck = None
        if fault is None:
            handle = await start_task(client, settings, task)
            state, cp = await self._settle(handle)
        else:
            struck, state, cp = await self._fault_then_finish(client, settings, task, column, fault)
        seconds = time.monotonic() - started

        faults = {k.removeprefix("fault:"): v for k, v in self.edge.stats().items() if k.startswith("fault:")}
        self.edge.configure(condition.mode)  # lift the faults, so the eval itself can read the provider
        observed = await self._observe(cp, fresh, task.task_id, state, seconds)
        return Run(ticket=ticket.id, condition=condition.name, column=column.name, baseline=column.baseline,
                   task_id=task.task_id, resource_id=resource,
                   grade=grade(fresh, observed, condition.may_escalate), observed=observed, faults=faults,
                   ui_url=self._ui(task.task_id), worker_fault=struck)

    def _seed(self, ticket: Ticket) -> None:
        if ticket.order is not None:
            seed_order(self.records, self.gateway, ticket.order)
        else:
            invoice = ticket.invoice
            self.records.put_invoice(invoice, self.gateway.create_customer(invoice.payee, invoice.payee_email))

    async def _settle(self, handle: WorkflowHandle) -> tuple[str, Checkpoint | None]:
        """The task's state once it is settled (`lost (<state>)` at the deadline), and its checkpoint."""
        last: list[str | None] = [None]

        async def settled() -> bool:
            state, _ = await task_state(handle)
            last[0] = state
            return state is not None and (state in SETTLED or state.startswith("failed"))
        try:
            await poll_until(settled, f"{handle.id} to settle", self.settle_timeout, 0.1)
        except TimeoutError:
            return f"lost ({last[0] or 'running'})", await _checkpoint(handle)
        return last[0], await _checkpoint(handle)  # type: ignore[return-value]

    async def _fault_then_finish(self, client: Client, settings: Settings, task: TaskInput, column: Column,
                                 fault: tuple[str, str]) -> tuple[bool, str, Checkpoint | None]:
        """A worker process for the column serves the task until it kills or pauses itself at the
        point; an in-process worker then finishes the task. A paused process is woken after that
        and stopped gracefully, so whatever its attempt does on waking is in the world we grade.
        Returns whether the fault struck, the task's state and its checkpoint."""
        point, sig = fault
        logs = self.data_dir / "workers"
        logs.mkdir(parents=True, exist_ok=True)
        marker = logs / f"{task.task_id}.struck"
        env = {**self.stack.env(), **self.worker_env, "TASK_QUEUE": settings.task_queue,
               "STRIPE_TIMEOUT_SECONDS": str(CLIENT_TIMEOUT), "RECONCILE_EVERY_MINUTES": "0",
               "STRIPE_PROCESSING_WINDOW_SECONDS": str(PROCESSING_WINDOW), "EFFECT_LEASE_SECONDS": str(EFFECT_LEASE),
               "DATABASE_URL": "", "PAYLOAD_ENCRYPTION_KEY": "", "MODEL_BACKEND": "scripted",
               "CRASH_AT": point, "CRASH_SIGNAL": sig, "CRASH_MARKER": str(marker)}
        first = _ColumnWorker(env, logs / f"{task.task_id}.log", column.spec)
        await asyncio.to_thread(first.start)
        try:
            await asyncio.to_thread(first.wait_ready, 60)
            handle = await start_task(client, settings, task)

            async def struck_or_settled() -> bool:
                if first.returncode is not None or (marker.exists() and _stopped(first.pid)):
                    return True
                return (await task_state(handle))[0] is not None
            with contextlib.suppress(TimeoutError):
                await poll_until(struck_or_settled, f"the fault in {task.task_id}'s worker", self.settle_timeout, 0.1)
            struck = marker.exists()
            extensions = Extensions(replace=column.replace(settings))
            async with contextlib.aclosing(column.backend(settings)) as backend, \
                    build_worker(client, settings, backend=backend, extensions=extensions):
                state, cp = await self._settle(handle)
        finally:
            if first.pid is not None and first.returncode is None:
                os.kill(first.pid, signal.SIGCONT)  # wake a paused worker; its attempt goes on
            await asyncio.to_thread(first.stop)  # SIGTERM: running activities get the graceful shutdown
        return struck, state, cp

    async def _observe(self, cp: Checkpoint | None, ticket: Ticket, task_id: str, state: str,
                       seconds: float) -> Observed:
        refunds: list[dict[str, Any]] = []
        payments: list[dict[str, Any]] = []
        unreadable = None
        try:
            if ticket.order is not None:
                refunds = await asyncio.to_thread(self._refunds, ticket.order.order_id)
            else:
                payments = await asyncio.to_thread(self._payments, ticket.invoice.invoice_id)
        except stripe.StripeError as err:
            unreadable = f"{type(err).__name__}: {err.user_message or err}"
        effects = await asyncio.to_thread(self.world.effects, task_id)
        messages = await asyncio.to_thread(self.world.messages, task_id)
        return Observed(
            state=state, refunds=refunds, payments=payments,
            ledger=[e for e in effects if e["tool"] in MONEY_TOOLS], messages=messages, refused=_refused(cp),
            final_answer=cp.final_answer if cp else None, turns=cp.turns if cp else 0,
            trail={name: step.trail for name, step in cp.steps.items() if step.intent_key} if cp else {},
            tool_calls=sum(cp.calls.values()) if cp else 0, seconds=seconds, unreadable=unreadable)

    def _refunds(self, order_id: str) -> list[dict[str, Any]]:
        """The order's refunds at the provider, with the item each names (the naive tool names none)."""
        record = self.records.order(order_id)
        out = []
        for r in self.gateway.refunds(record.payment_intent_id):
            metadata = metadata_of(r)
            out.append({"id": r.id, "amount_cents": r.amount, "status": r.status,
                        "item_id": metadata.get("item_id"), "intent_key": metadata.get(KEY_FIELD)})
        return out

    def _payments(self, invoice_id: str) -> list[dict[str, Any]]:
        """The invoice's payments at the provider: every PaymentIntent of the account to its payee that
        names the invoice (read in full, so the grade depends on no filter of the provider's)."""
        record = self.records.invoice(invoice_id)
        out = []
        for p in self.gateway.payments():
            metadata = p.metadata.to_dict()
            if p.customer == record.customer_ref and metadata.get("invoice_id") == invoice_id:
                out.append({"id": p.id, "amount_cents": p.amount, "status": p.status,
                            "intent_key": metadata.get(KEY_FIELD)})
        return out

    def _ui(self, task_id: str) -> str | None:
        if not self.stack.ui_url:
            return None
        return f"{self.stack.ui_url}/namespaces/{self.stack.namespace}/workflows/{task_id}"


_REFUSALS = ("false_money_claim", "money_in_free_text")


def _refused(cp: Checkpoint | None) -> list[dict[str, Any]]:
    """The messages to people the tool refused for what they said (the checkpoint's steps keep them)."""
    if cp is None:
        return []
    return [{"tool": step.tool, "reason": step.reason, **step.arguments} for step in cp.steps.values()
            if step.tool in ("notify_customer", "message_seller", "send_email") and step.reason in _REFUSALS]


def _stopped(pid: int | None) -> bool:
    """The process is stopped (SIGSTOP), not merely slow."""
    try:
        return pid is not None and psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


async def _checkpoint(handle: WorkflowHandle) -> Checkpoint | None:
    """The task's checkpoint: from its result when it closed, else from the query."""
    try:
        described = await handle.describe(rpc_timeout=_RPC)
        if described.status == WorkflowExecutionStatus.COMPLETED:
            result: TaskResult = await handle.result(rpc_timeout=_RPC)
            return result.checkpoint
        if described.status == WorkflowExecutionStatus.RUNNING:
            return await handle.query("checkpoint", result_type=Checkpoint, rpc_timeout=_RPC)
    except RPCError:
        pass
    return None
