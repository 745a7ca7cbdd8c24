"""Load: the harness beside a bare Temporal workflow, on the same server, in one run.

    python -m devstack.load [--tickets 300] [--latency 30] [--rounds 2] [--profile [--profile-side bare|bare-io]]
        [--bare-io] [--worker-option NAME=VALUE ...] [--server-config KEY=VALUE ...]

On a fresh local stack (Temporal dev server with the project's pragmas, localstripe behind the
Stripe edge in dedupe mode with no faults) it runs:

- harness: generated refund tickets (`devstack.scenarios.batch_ticket`) through `worker.build_worker`,
  i.e. the agent workflow with its gate, intent keys, ledger, checkpoint and search attributes,
  the scripted model and the real stripe SDK against localstripe;
- bare: `bench_bare.BareTaskWorkflow`, which runs one plain activity per step a harness ticket
  takes (its model turns and tool calls, counted from a harness result), each a no-op: what the
  same steps cost on the same server with nothing of ours around them;
- bare-io, with `--bare-io`: the same bare workflow, whose steps where a ticket's tools run make the
  provider requests those tools make (`BareIO`), on paid orders of their own: what the provider's I/O
  alone costs, measured in the same run as the other two, beside the harness's ledger, checks and
  workflow.

Every side's worker gets `worker.worker_options` (the settings' slots: admission control), and
`--worker-option` over it. `--server-config` sets the dev server's dynamic config over the stack's
(`SERVER_PRAGMAS` in devstack/processes.py), for every side alike.

Throughput: N tasks started at once, from the first start to the last result (tasks/s and
activities/s); `--rounds` rotates which side goes first and the figures are the mean.
Latency: single tasks one after another, from start to result, p50/p99 (nearest rank), in three
blocks per side that alternate which side goes first (each block after a short warm-up of its freshly
started worker). Each side's worker runs in this process, alone while measured, with the same
options; the CPU seconds of the Temporal server, localstripe and this process during each
throughput phase show where the time goes. `--profile` runs one more round (of the harness, or of
`--profile-side`'s) sampled by py-spy (devstack/profile.py) and prints where
this process's Python CPU went.

Honesty: after the rounds, every task's history of each side is read (devstack/attempts.py) for the
attempts the server timed out while the worker ran them (no worker is killed here, so every timeout
is of a live attempt; the worker's own log lines count them too), the activity retries by cause and
the escalations to a person by cause. No fault is injected, so the run exits 1 when any attempt was
timed out or any task escalated.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.db import Database
from activities.payments import StripeGateway
from activities.records import Records
from client import start_task
from core.models import TaskResult
from devstack import attempts, targets
from devstack.bench_bare import BARE_ACTIVITY, BARE_IO_ACTIVITY, BareTaskWorkflow
from devstack.profile import Profile, sampled
from devstack.scenarios import batch_order, batch_ticket
from devstack.seed import seed_scenarios
from devstack.stack import STRIPE_API_KEY, Stack, add_server_config_option
from infra.bytecode import ensure_bytecode
from infra.codec import new_key
from infra.connection import converter_for
from infra.exit import run_main
from infra.liveness import keeper_pid
from infra.settings import Settings
from worker import build_worker, freeze_startup_objects, worker_options

WARMUP = 3  # unmeasured tasks after a worker starts, in each latency block
LATENCY_BLOCKS = 3
HARNESS_QUEUE, BARE_QUEUE = "load-harness", "load-bare"


@activity.defn(name=BARE_ACTIVITY)
async def bare_step(step: int) -> int:
    return step


# Where a harness ticket's tools run among its seven steps (model turn, get_order, turn, issue_refund, turn,
# notify_customer, turn), and the provider requests each of them makes: the payment's refunds listed by
# get_order, by issue_refund before its POST and by notify_customer for the money sentence.
PROVIDER_REQUESTS = {1: ("list",), 3: ("list", "refund"), 5: ("list",)}
# The harness ticket's model turns and tool calls that map assumes, checked against the first one measured.
TICKET_SHAPE = (4, {"get_order": 1, "issue_refund": 1, "notify_customer": 1})


def shape_differs(turns: int, calls: dict[str, int]) -> str | None:
    """Why `--bare-io` would not make the harness ticket's provider requests, or None when it would."""
    if (turns, calls) == TICKET_SHAPE:
        return None
    return (f"--bare-io assumes a ticket of {TICKET_SHAPE[0]} model turns and calls {TICKET_SHAPE[1]}; the harness's "
            f"ran {turns} turns and calls {calls}: change PROVIDER_REQUESTS and TICKET_SHAPE in devstack/load.py")


class BareIO:
    """`--bare-io`: bare Temporal's step making, where a ticket's tools run, the provider requests they make
    (PROVIDER_REQUESTS) through the same client, in a thread as the tools do; no ledger, no checks, nothing
    else of ours. What a worker that only talked to the provider would cost beside the harness."""

    def __init__(self, gateway: StripeGateway) -> None:
        self._gateway = gateway

    @activity.defn(name=BARE_IO_ACTIVITY)
    async def bare_io_step(self, step: int, payment_intent: str, amount_cents: int) -> int:
        requests = PROVIDER_REQUESTS.get(step, ())
        if requests:
            await asyncio.to_thread(self._make, requests, payment_intent, amount_cents)
        return step

    def refunds_made(self, payments: list[str]) -> list[int]:
        """How many refunds the provider holds for each payment: 1 each when every bare task made its requests."""
        return [len(self._gateway.refunds(payment)) for payment in payments]

    def _make(self, requests: tuple[str, ...], payment_intent: str, amount_cents: int) -> None:
        for request in requests:
            if request == "list":
                self._gateway.refunds(payment_intent)
            else:
                self._gateway.refund(payment_intent, amount_cents, f"bare-io:{payment_intent}", {})


# With --bare-io, a third side: bare Temporal whose steps make a ticket's provider requests.
BARE_IO = "bare-io"
SIDE_NAMES = {"harness": "harness", "bare": "bare Temporal", BARE_IO: "bare Temporal + the ticket's provider requests"}


def bare_worker(client: Client, task_queue: str, settings: Settings, io: BareIO | None = None,
                **options: Any) -> Worker:
    """The bare side's worker: build_worker's options for these settings (and `options` over them), no harness;
    with `io`, its step that makes a ticket's provider requests too."""
    ensure_bytecode(BareTaskWorkflow)  # as build_worker does for ours
    return Worker(client, task_queue=task_queue, workflows=[BareTaskWorkflow],
                  activities=[bare_step, *([io.bare_io_step] if io else [])], **worker_options(settings, **options))


def slots_described(settings: Settings, options: dict[str, Any]) -> str:
    """The admission control both sides ran with."""
    sized = [f"{k}={options[k]}" for k in ("tuner", "max_concurrent_workflow_tasks", "max_concurrent_activities",
                                           "max_concurrent_local_activities") if options.get(k) is not None]
    if sized:
        return ", ".join(sized)
    workflow, activity_slots, local = settings.slots
    return (f"{settings.worker_tuner} tuner, slots: {workflow} workflow tasks, {activity_slots} activities, "
            f"{local} local activities")


def rotated(sides: tuple[str, ...], n: int) -> tuple[str, ...]:
    """`sides` starting from the n-th (modulo their count): each goes first in turn."""
    n %= len(sides)
    return sides[n:] + sides[:n]


def split(total: int, parts: int) -> list[int]:
    """`total` in `parts` near-equal shares, none empty: split(30, 3) == [10, 10, 10]."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if n < total % parts else 0) for n in range(parts)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


class Collections:
    """Time the garbage collector held this process, by generation: CPU no profile line names (a
    collection is sampled in whatever frame allocated when it began)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self._began = 0.0
        gc.callbacks.append(self._watch)

    def _watch(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._began


def context_switches() -> int:
    """This process's context switches so far, voluntary (a thread waiting) and not (preempted)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


# This process's threads by what runs on them (Python's thread names). A thread Python did not start is
# the SDK's core, whose Rust threads run its polls, RPCs and state machines (one that once called into
# Python, to forward a log line, is listed as a dummy thread: it is still the core's).
THREAD_GROUPS = {"MainThread": "the event loop (client, SDK, codec, async activities)",
                 "temporal_workflow_": "workflow activations (the sandbox, our workflow code)",
                 "asyncio_": "the tools' blocking calls (SQLite, provider HTTP)"}
OTHER_PYTHON = "other Python threads (heartbeat pump, ...)"
NATIVE = "the SDK's core (Rust threads)"
ENDED = "threads that ended during the round (the rest of the total)"


def thread_group(thread: threading.Thread | None) -> str:
    if thread is None or isinstance(thread, threading._DummyThread):
        return NATIVE
    return next((group for prefix, group in THREAD_GROUPS.items() if thread.name.startswith(prefix)), OTHER_PYTHON)


def thread_cpu() -> dict[int, tuple[str, float]]:
    """(group, CPU seconds) of each of this process's threads now.

    From the scheduler's own clock (schedstat, nanoseconds) where the kernel has it: the clock-tick counters
    in stat truncate each thread to whole ticks (10 ms), so a pool of threads that each ran a few ms reads
    as nothing at all."""
    tids = os.listdir("/proc/self/task")
    threads = {t.native_id: t for t in threading.enumerate()}  # after the listing: every Python one in it
    spent = {}
    for tid in tids:
        try:
            seconds = thread_seconds(Path(f"/proc/self/task/{tid}"))
        except OSError:
            continue  # it ended between the listing and the read
        spent[int(tid)] = (thread_group(threads.get(int(tid))), seconds)
    return spent


def thread_seconds(task: Path) -> float:
    try:
        return int(task.joinpath("schedstat").read_text().split()[0]) / 1e9
    except FileNotFoundError:  # a kernel built without it: whole clock ticks from stat
        fields = task.joinpath("stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_thread_group(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                        total: float) -> dict[str, float]:
    """CPU seconds each group spent between two readings of the threads, and `total` (the process's
    CPU over the same time) less theirs: the share of threads that ended in between."""
    spent = dict.fromkeys([*THREAD_GROUPS.values(), OTHER_PYTHON, NATIVE], 0.0)
    for tid, (group, seconds) in after.items():
        was = before.get(tid)
        # A thread id used again by a new thread (another group, or less CPU) starts from nothing.
        start = was[1] if was is not None and was[0] == group and was[1] <= seconds else 0.0
        spent[group] += seconds - start
    spent[ENDED] = max(0.0, total - sum(spent.values()))
    return spent


def bare_client(client: Client) -> Client:
    """`client`'s connection with the SDK's own converter: how bare Temporal's tasks are started."""
    return Client(**{**client.config(), "data_converter": pydantic_data_converter})


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process (and its waited-for children) from /proc; 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def host_ticks() -> tuple[int, int]:
    """(stolen, all) CPU ticks of the whole machine since boot, from /proc/stat; (0, 0) where unknown.

    Stolen: time a virtual machine's CPUs were ready to run but the host ran another guest. On a
    shared host it varies from run to run and slows both sides alike, so it is printed beside them."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]  # user .. steal
    except OSError:
        return 0, 0
    ticks = [int(f) for f in fields]
    return (ticks[7] if len(ticks) == 8 else 0), sum(ticks)


def stolen_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    elapsed = after[1] - before[1]
    return (after[0] - before[0]) / elapsed if elapsed > 0 else 0.0


def sandbox_option(kind: str) -> dict[str, Any]:
    """`default`: the SDK's sandbox, which re-imports the workflow modules for every workflow run;
    `passthrough`: the sandbox, with our (deterministic, state-free) workflow modules imported once;
    `off`: no sandbox (an upper bound of what the sandbox costs, not a recommendation)."""
    if kind == "passthrough":
        restrictions = SandboxRestrictions.default.with_passthrough_modules("workflows", "core", "bench_bare")
        return {"workflow_runner": SandboxedWorkflowRunner(restrictions=restrictions)}
    if kind == "off":
        return {"workflow_runner": UnsandboxedWorkflowRunner()}
    return {}


def parse_option(text: str) -> tuple[str, Any]:
    """NAME=VALUE for temporalio's Worker; *_timeout values are seconds."""
    name, _, raw = text.partition("=")
    value: Any = json.loads(raw)
    if name.endswith("_timeout"):
        value = timedelta(seconds=float(value))
    return name, value


class Load:
    def __init__(self, client: Client, settings: Settings, stack: Stack, options: dict[str, Any],
                 io: BareIO | None = None, first_bare_order: int = 0) -> None:
        self.client, self.settings, self.stack, self.options = client, settings, stack, options
        self.io, self.next_bare_order = io, first_bare_order
        self.sides = ("harness", "bare", *((BARE_IO,) if io else ()))
        self.bare_payments: list[str] = []  # each bare-io task's, to read its refunds back
        self.records = Records(Database(settings.agent_db_path))
        # Bare Temporal as a team would run it: the SDK's pydantic converter, no codec of ours.
        self.bare_client = bare_client(client)
        self.next_ticket = 1
        self.activities_per_task = 0
        self.history: dict[str, tuple[int, int]] = {}
        self.ids: dict[str, list[str]] = {side: [] for side in self.sides}
        self.notices = attempts.WorkerNotices()
        self.worker_saw: dict[str, int] = dict.fromkeys(self.sides, 0)
        self.collections = Collections()
        attempts.watching(self.notices)

    def tickets(self, count: int) -> list:
        tasks = [batch_ticket(n) for n in range(self.next_ticket, self.next_ticket + count)]
        self.next_ticket += count
        return tasks

    def harness_worker(self) -> Worker:
        return build_worker(self.client, self.settings, HARNESS_QUEUE, **self.options)

    def bare_worker(self, side: str) -> Worker:
        io = self.io if side == BARE_IO else None
        return bare_worker(self.bare_client, BARE_QUEUE, self.settings, io, **self.options)

    def worker(self, side: str) -> Worker:
        return self.harness_worker() if side == "harness" else self.bare_worker(side)

    def seen(self, side: str) -> None:
        """What the worker of `side`, just stopped, saw of its attempts being timed out."""
        self.worker_saw[side] += self.notices.taken()

    async def honesty(self) -> dict[str, attempts.Attempts]:
        sides = {side: await attempts.read(self.client, ids) for side, ids in self.ids.items()}
        for side, tally in sides.items():
            tally.worker_saw = self.worker_saw[side]
        return sides

    # one task of each side, started; returns an awaitable of its end
    async def start_harness(self, task) -> Callable[[], Awaitable[Any]]:
        handle = await start_task(self.client, self.settings.model_copy(update={"task_queue": HARNESS_QUEUE}), task)
        self.ids["harness"].append(handle.id)
        return handle.result

    def tasks(self, side: str, count: int, name: str) -> list:
        """`count` tasks of `side`, made before anything is measured: tickets for the harness; (id, payment
        intent, amount) for the bare sides, the bare-io side's each on a paid order of its own (the orders
        after the harness's)."""
        if side == "harness":
            return self.tickets(count)
        tasks = []
        for n in range(count):
            payment, amount = "", 0
            if side == BARE_IO:
                assert self.io is not None
                record = self.records.order(batch_order(self.next_bare_order).order_id)
                assert record is not None, f"order {self.next_bare_order} was not seeded"
                payment, amount = record.payment_intent_id, record.order.items[0].amount_cents
                self.next_bare_order += 1
                self.bare_payments.append(payment)
            tasks.append((f"{side}-{name}-{n}-{time.time_ns()}", payment, amount))
        return tasks

    async def start_bare(self, side: str, task: tuple[str, str, int]) -> Callable[[], Awaitable[Any]]:
        task_id, payment, amount = task
        handle = await self.bare_client.start_workflow(BareTaskWorkflow.run,
                                                       args=[self.activities_per_task, 0, payment, amount],
                                                       id=task_id, task_queue=BARE_QUEUE,
                                                       task_timeout=timedelta(seconds=3))
        self.ids[side].append(handle.id)
        return handle.result

    async def latency(self, side: str, count: int) -> list[float]:
        """`count` tasks one after another, after WARMUP unmeasured ones (the worker was just started)."""
        seconds = []
        for i in range(WARMUP + count):
            ticket = self.tasks(side, 1, f"latency-{i}")[0]
            started = time.perf_counter()
            if side == "harness":
                result: TaskResult = await (await self.start_harness(ticket))()
                assert result.state == "completed", result.final_answer
                last = result.task_id
            else:
                last = ticket[0]
                await (await self.start_bare(side, ticket))()
            if i >= WARMUP:
                seconds.append(time.perf_counter() - started)
            if side == "harness" and not self.activities_per_task:
                # The bare side runs as many steps as a team would write: one per model turn and tool call.
                self.activities_per_task = result.checkpoint.turns + sum(result.checkpoint.calls.values())
                if self.io is not None and (why := shape_differs(result.checkpoint.turns, result.checkpoint.calls)):
                    raise SystemExit(why)
        history = await self.client.get_workflow_handle(last).fetch_history()
        self.history[side] = (len(history.events), sum(e.ByteSize() for e in history.events))
        return seconds

    async def throughput(self, side: str, count: int, round_no: int) -> dict[str, float]:
        # Made before the CPU is read: generating tickets is this benchmark's work, not the harness's.
        tasks = self.tasks(side, count, f"round-{round_no}")
        # The liveness keeper is the worker's (infra/liveness.py): a process of its own beside it.
        pids = {"temporal": self.stack.temporal.pid, "localstripe": self.stack.localstripe.pid,
                "liveness keeper": keeper_pid(self.client)}
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        own, switches, collected = os.times(), context_switches(), list(self.collections.seconds)
        threads = thread_cpu()
        host = host_ticks()
        sem = asyncio.Semaphore(50)

        async def one(task) -> Any:
            async with sem:
                waiter = await (self.start_harness(task) if side == "harness" else self.start_bare(side, task))
            return await waiter()
        started = time.perf_counter()
        results = await asyncio.gather(*(one(t) for t in tasks))
        elapsed = time.perf_counter() - started
        if side == "harness":
            bad = [r.task_id for r in results if r.state != "completed"]
            assert not bad, f"harness tasks not completed: {bad[:5]}"
        after_own = os.times()
        cpu = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
        cpu["load (client + worker)"] = (after_own.user + after_own.system) - (own.user + own.system)
        # The kernel's share and the thread switches: where CPU that no Python profile sees goes
        # (thread hand-offs, sockets, SQLite's writes).
        cpu["load, of it in the kernel"] = after_own.system - own.system
        for generation, seconds in enumerate(self.collections.seconds):
            cpu[f"load, of it collecting garbage, generation {generation}"] = seconds - collected[generation]
        for group, seconds in cpu_by_thread_group(threads, thread_cpu(), cpu["load (client + worker)"]).items():
            cpu[f"load, of it on {group}"] = seconds
        return {"context_switches": context_switches() - switches,
                "seconds": elapsed, "tasks_per_s": count / elapsed, "stolen": stolen_share(host, host_ticks()),
                "activities_per_s": count * self.activities_per_task / elapsed,
                **{f"cpu:{k}": v for k, v in cpu.items()}}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    options = {**dict(parse_option(o) for o in args.worker_option), **sandbox_option(args.sandbox)}
    loop = asyncio.get_running_loop()
    if args.gc_threshold:
        gc.set_threshold(args.gc_threshold, 20, 20)
    if args.threads:
        loop.set_default_executor(ThreadPoolExecutor(max_workers=args.threads, thread_name_prefix="asyncio"))
    with tempfile.TemporaryDirectory(prefix="load-") as tmp, \
            Stack.for_tests(Path(tmp), server_config=dict(args.server_config)) as stack:
        key = new_key() if args.encrypted else None
        settings = Settings(temporal_address=stack.address, task_queue=HARNESS_QUEUE, payload_encryption_key=key,
                            stripe_api_base=stack.stripe_url, stripe_api_key=STRIPE_API_KEY,
                            agent_db_path=Path(tmp) / "agent.db")
        orders = LATENCY_BLOCKS * WARMUP + args.latency + (args.rounds + args.profile) * args.tickets
        started = time.perf_counter()
        # With --bare-io the bare side refunds orders of its own, the ones after the harness's.
        await asyncio.to_thread(seed_scenarios, Database(settings.agent_db_path),
                                StripeGateway(STRIPE_API_KEY, stack.stripe_url, 10.0), orders * (1 + args.bare_io))
        print(f"seeded {orders * (1 + args.bare_io)} paid orders in {time.perf_counter() - started:.1f}s", flush=True)
        # The harness's payloads go through the product's converter (infra/connection.py), encrypted with
        # --encrypted as the deployment runs them (docker-compose.yml), compressed as PAYLOAD_COMPRESSION says.
        client = await Client.connect(stack.address, data_converter=converter_for(settings),
                                      runtime=attempts.forwarding_runtime())
        gateway = StripeGateway(settings.stripe_api_key.get_secret_value(), settings.stripe_api_base,
                                settings.stripe_timeout_seconds, settings.stripe_sdk_retries)  # as build_worker's
        io = BareIO(gateway) if args.bare_io else None
        load = Load(client, settings, stack, options, io, first_bare_order=orders + 1)
        freeze_startup_objects()  # as worker.py does once it has built its worker

        # In blocks, alternating which side goes first, so that a drift of the machine or of the server's
        # database over the phase weighs on both sides alike.
        latency: dict[str, list[float]] = {side: [] for side in load.sides}
        for block, share in enumerate(split(args.latency, LATENCY_BLOCKS)):
            for side in rotated(load.sides, block):
                async with load.worker(side):
                    latency[side] += await load.latency(side, share)
                load.seen(side)
        print(f"latency measured; {load.activities_per_task} steps per task", flush=True)

        rounds: dict[str, list[dict[str, float]]] = {side: [] for side in load.sides}
        for r in range(args.rounds):
            for side in rotated(load.sides, r + 1):
                async with load.worker(side):
                    rounds[side].append(await load.throughput(side, args.tickets, r))
                load.seen(side)
                print(f"round {r + 1} {side}: {rounds[side][-1]['tasks_per_s']:.1f} tasks/s", flush=True)
        profile = Profile()
        if args.profile:
            async with load.worker(args.profile_side):
                with sampled(profile, args.profile_out):
                    await load.throughput(args.profile_side, args.tickets, args.rounds)
            load.seen(args.profile_side)
            print("profiled round done", flush=True)
        honesty = await load.honesty()
        server_config = stack.server_config
        bare_refunds = await asyncio.to_thread(io.refunds_made, load.bare_payments) if io else None
    shown = {k: v for k, v in options.items() if k != "workflow_runner"}
    if args.sandbox != "default":
        shown["sandbox"] = args.sandbox
    if args.gc_threshold:
        shown["gc"] = f"gen0 threshold {args.gc_threshold}"
    return {"options": {k: str(v) for k, v in shown.items()}, "slots": slots_described(settings, options),
            "bare_refunds": bare_refunds,
            "threads": args.threads, "encrypted": args.encrypted,
            "compressed": args.encrypted and settings.payload_compression,
            "honesty": {side: tally.as_dict() for side, tally in honesty.items()},
            "notices": load.notices.lines,
            "activities_per_task": load.activities_per_task, "history": load.history, "latency": latency,
            "rounds": rounds,
            "tickets": args.tickets, "server_config": server_config,
            "profile": profile.table() if args.profile else None, "profile_side": args.profile_side}


ENCRYPTED_HELP = ("the harness's payloads encrypted with a fresh key, as the deployment runs them (compressed "
                  "first where that makes them shorter, unless PAYLOAD_COMPRESSION=false); bare Temporal's "
                  "stay unencrypted")


def payloads_described(result: dict[str, Any]) -> str:
    if not result.get("encrypted"):
        return "not encrypted"
    return "encrypted and compressed" if result["compressed"] else "encrypted, not compressed"


def report(result: dict[str, Any]) -> str:
    sides = list(result["rounds"])
    # harness / bare always; with the bare-io side, the harness over it and it over bare too: the floor the
    # provider's requests alone set, and the harness's distance from it, in the same run
    pairs = [("harness", "bare"), *((("harness", BARE_IO), (BARE_IO, "bare")) if BARE_IO in sides else ())]
    ticket = result["tickets"]
    def mean(side: str, key: str) -> float:
        return statistics.mean(r[key] for r in result["rounds"][side])
    def row(label: str, cell: Callable[[str], str], ratio: Callable[[str, str], str] | None = None) -> str:
        ratios = [ratio(a, b) if ratio else "" for a, b in pairs]
        return f"| {label} | {' | '.join([*(cell(side) for side in sides), *ratios])} |"
    def tps_ratio(key: str) -> Callable[[str, str], str]:
        return lambda a, b: f"{mean(a, key) / mean(b, key):.0%}"
    def lat(side: str, q: float) -> float:
        return percentile(result["latency"][side], q)
    def latency_row(q: int) -> str:
        return row(f"one task end to end, p{q} s", lambda side: f"{lat(side, q):.3f}",
                   lambda a, b: f"{lat(a, q) / lat(b, q):.2f}x")
    def cpu_row(key: str) -> str:
        return row(f"CPU s per task: {key[4:]}", lambda side: f"{mean(side, key) / ticket * 1000:.1f} ms")
    lines = [
        f"{ticket} tasks at once x {len(result['rounds']['harness'])} rounds per side, "
        f"{result['activities_per_task']} activities per task; {result['slots']}; "
        f"worker options {result['options'] or 'as build_worker'}; harness payloads "
        f"{payloads_described(result)}"
        + (f", {result['threads']} threads for blocking I/O" if result["threads"] else "")
        + f"; server config over the stack's: {result.get('server_config') or 'none'}",
        "",
        f"| | {' | '.join([*(SIDE_NAMES[side] for side in sides), *(f'{a} / {b}' for a, b in pairs)])} |",
        "|---|" + "---|" * (len(sides) + len(pairs)),
        row("throughput, tasks/s", lambda side: f"{mean(side, 'tasks_per_s'):.1f}", tps_ratio("tasks_per_s")),
        row("throughput, activities/s", lambda side: f"{mean(side, 'activities_per_s'):.0f}",
            tps_ratio("activities_per_s")),
        row("throughput per round, tasks/s",
            lambda side: ", ".join(f"{r['tasks_per_s']:.1f}" for r in result["rounds"][side])),
        *(latency_row(q) for q in (50, 99)),
        row("history per task: events / bytes",
            lambda side: f"{result['history'][side][0]} / {result['history'][side][1]:,}"),
    ]
    for key in [k for k in result["rounds"]["harness"][0] if k.startswith("cpu:")]:
        lines.append(cpu_row(key))
    if "context_switches" in result["rounds"]["harness"][0]:
        lines.append(row("thread switches per task: load (client + worker)",
                         lambda side: f"{mean(side, 'context_switches') / ticket:.0f}"))
    if "stolen" in result["rounds"]["harness"][0]:
        lines.append(row("host CPU stolen by other guests during the rounds",
                         lambda side: f"{mean(side, 'stolen'):.0%}"))
    tallies = honest(result)
    lines += attempts.rows(tallies)
    lines += ["", "What the run is read against (devstack/targets.py):", "", *targets.rows(targets.load_targets(
        {side: mean(side, "tasks_per_s") for side in sides},
        {side: mean(side, "cpu:load (client + worker)") for side in sides}, {side: lat(side, 50) for side in sides},
        {side: tally.live_timed_out for side, tally in tallies.items()},
        {side: sum(tally.escalations.values()) for side, tally in tallies.items()}))]
    if result["notices"]:
        lines += ["", "The worker's first lines about attempts timed out while running:", "",
                  *(f"    {line}" for line in result["notices"])]
    if result.get("profile"):
        lines += ["", f"Profile of one more {result['profile_side']} round (worker and client in this process):", "",
                  result["profile"]]
    return "\n".join(lines)


def honest(result: dict[str, Any]) -> dict[str, attempts.Attempts]:
    return {side: attempts.Attempts.from_dict(tally) for side, tally in result["honesty"].items()}


def dishonest(result: dict[str, Any]) -> list[str]:
    """Why the run fails: attempts timed out while alive, workflow tasks failed, escalations where no fault
    was injected."""
    return [f"{side}: {why}" for side, tally in honest(result).items()
            for why in ([f"{tally.live_timed_out} live attempt(s) timed out"] if tally.live_timed_out else [])
            + ([f"workflow tasks failed {dict(tally.workflow_task_failures)}"] if tally.workflow_task_failures
               else [])
            + ([f"escalated {dict(tally.escalations)} with no fault injected"] if tally.escalations else [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tickets", type=int, default=300)
    parser.add_argument("--latency", type=int, default=30, help="sequential single tasks per side")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker-option", action="append", default=[], metavar="NAME=VALUE",
                        help="a temporalio Worker option for both sides, e.g. max_concurrent_activities=200")
    parser.add_argument("--threads", type=int, default=0,
                        help="size of the thread pool the tools' blocking SQLite/HTTP calls run in "
                             "(default: asyncio's, min(32, cores + 4))")
    parser.add_argument("--sandbox", choices=["default", "passthrough", "off"], default="default",
                        help="default: the SDK's sandbox (re-imports the workflow modules for every run); "
                             "passthrough: our workflow modules imported once; off: no sandbox (an upper bound)")
    parser.add_argument("--encrypted", action="store_true",
                        help=ENCRYPTED_HELP)
    parser.add_argument("--bare-io", action="store_true",
                        help="a third side: bare Temporal whose steps make a ticket's four provider requests (three "
                             "lists of the payment's refunds and a refund) through the same client, on orders of "
                             "their own: what the provider's I/O alone costs, beside the harness in the same run")
    parser.add_argument("--gc-threshold", type=int, default=0,
                        help="this gen0 threshold (Python's default: 700)")
    parser.add_argument("--profile", action="store_true",
                        help="after the measured rounds, one more round sampled by py-spy: where the "
                             "worker's Python CPU goes, by library and by function")
    parser.add_argument("--profile-side", choices=("harness", "bare", BARE_IO), default="harness",
                        help="with --profile: which side's extra round is sampled (bare, or bare-io with --bare-io: "
                             "to set a profile beside)")
    parser.add_argument("--profile-out", type=Path, metavar="FILE",
                        help="with --profile: keep py-spy's raw stacks here (collapsed format, for a flame graph)")
    add_server_config_option(parser)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.profile_side == BARE_IO and not args.bare_io:
        raise SystemExit("python -m devstack.load: --profile-side bare-io needs --bare-io")
    result = asyncio.run(run(args))
    print()
    print(json.dumps(result, indent=1) if args.json else report(result))
    failures = dishonest(result)
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    run_main(main)
