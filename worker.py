"""Runs a worker for the agent task queue: `python worker.py`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import stripe
from temporalio import activity
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import ResourceBasedSlotConfig, Worker, WorkerTuner

from activities import Database, ModelActivities, StripeGateway, ToolActivities
from activities.asking import AskingActivities
from activities.authority import AuthorityActivities, Deployment, public_key_from
from activities.effects import ProviderTerms
from activities.facts import FactActivities
from activities.interceptors import WorkerInterceptor
from activities.model import ModelBackend, ModelConfigError, make_backend
from activities.operations import OperationsActivities
from activities.reconcile import ReconcileActivities
from activities.records import MessageLimits
from activities.tools import tool_activities
from core import policies
from core.authority import Ceilings
from core.names import SEARCH_ATTRIBUTES
from core.tools import REGISTRY
from infra import connection, telemetry
from infra.bytecode import ensure_bytecode, load_code_once
from infra.exit import run_main
from infra.liveness import Keeper, keeper_at, keeper_for
from infra.redact import install_log_redaction, redact
from infra.sandbox import CompiledSandboxRunner
from infra.schedules import ensure_reconcile_schedule
from infra.settings import Settings, cores, load_settings
from workflows import AgentTaskWorkflow, ReconcileWorkflow

log = logging.getLogger("worker")


def fail(message: str) -> None:
    print(f"worker: {redact(message)}", file=sys.stderr)
    raise SystemExit(2)


async def connect(settings: Settings) -> Client:
    try:
        runtime = telemetry.runtime(settings.metrics_port)
    except Exception as err:  # the port is taken or not ours to bind
        fail(f"cannot serve metrics on 127.0.0.1:{settings.metrics_port}: {str(err).splitlines()[0]}")
        raise
    try:
        return await connection.connect(settings, runtime, telemetry.tracing_interceptors(settings.otel_tracing))
    except ValueError as err:  # a malformed encryption key or connection profile
        fail(str(err))
        raise
    except Exception as err:  # the SDK raises RuntimeError with a long transport message
        fail(f"cannot reach Temporal at {connection.address(settings)} "
             f"(namespace {connection.namespace(settings)}): {str(err).splitlines()[0]}")
        raise


async def check_search_attributes(client: Client, namespace: str) -> None:
    """Without our search attributes every workflow task would fail: say so at start instead."""
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace))
    except RPCError:
        return  # servers without the operator API (the time-skipping test server) cannot tell us
    missing = [name for name in SEARCH_ATTRIBUTES if name not in listed.custom_attributes]
    if missing:
        fail(f"namespace {namespace} lacks search attributes {', '.join(missing)}; register them with "
             + " && ".join(f"temporal operator search-attribute create --name {n} --type {SEARCH_ATTRIBUTES[n]}"
                           for n in missing))
    mistyped = [f"{name} is {IndexedValueType.Name(listed.custom_attributes[name]).removeprefix('INDEXED_VALUE_TYPE_')}"
                f", not {kind}" for name, kind in SEARCH_ATTRIBUTES.items()
                if listed.custom_attributes[name] != IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{kind.upper()}")]
    if mistyped:
        fail(f"namespace {namespace}: search attribute {'; '.join(mistyped)}: every task that upserts it would fail")


def model_backend(settings: Settings) -> ModelBackend:
    """The model MODEL_BACKEND names; the real ones read their keys from the environment."""
    return make_backend(settings.model_backend, settings.model_name,
                        timeout_seconds=settings.model_timeout_seconds, max_tokens=settings.model_max_tokens)


def provider_terms(settings: Settings) -> ProviderTerms:
    return ProviderTerms(honours_keys=settings.stripe_honours_keys,
                         request_timeout_seconds=settings.stripe_timeout_seconds,
                         processing_window_seconds=settings.stripe_processing_window_seconds,
                         lease_seconds=settings.effect_lease_seconds)


def message_limits(settings: Settings) -> MessageLimits:
    return MessageLimits(per_recipient=settings.messages_per_recipient, per_task=settings.messages_per_task)


# Worker options that size the worker's slots themselves; any of them replaces the tuner of the settings.
SLOT_OPTIONS = ("tuner", "max_concurrent_workflow_tasks", "max_concurrent_activities",
                "max_concurrent_local_activities", "max_concurrent_nexus_tasks")


def worker_tuner(settings: Settings) -> WorkerTuner:
    """Admission control: the slots the worker polls with. A fixed tuner takes at most the settings' slots
    of each kind; the resource-based one adds slots above one per core only while the machine's CPU and
    memory are under their targets, up to the same numbers. An attempt the worker has not polled waits in
    the task queue and no timeout of it runs; one it has polled is started at the server, its heartbeat
    and start-to-close timers running, so the worker polls only when it can run what it gets."""
    workflow, activities, local = settings.slots
    if settings.worker_tuner == "fixed":
        return WorkerTuner.create_fixed(workflow_slots=workflow, activity_slots=activities,
                                        local_activity_slots=local)
    floor = cores()
    return WorkerTuner.create_resource_based(
        target_memory_usage=settings.worker_target_memory, target_cpu_usage=settings.worker_target_cpu,
        workflow_config=ResourceBasedSlotConfig(minimum_slots=min(2 * floor, workflow), maximum_slots=workflow),
        activity_config=ResourceBasedSlotConfig(minimum_slots=min(floor, activities), maximum_slots=activities),
        local_activity_config=ResourceBasedSlotConfig(minimum_slots=min(floor, local), maximum_slots=local))


HEARTBEAT_FORWARD = 0.4  # of the heartbeat timeout: how often the core sends the latest heartbeat on


def worker_options(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """What every worker of ours gets (the bare side of devstack's comparisons too), `overrides` over it:
    the settings' tuner unless the overrides size the slots themselves, the settings' sticky queue timeout
    and workflow cache, and a graceful shutdown. The SDK runs each workflow activation on a thread of its
    own pool, one per activation at once, so never more than the workflow slots."""
    sized = any(overrides.get(name) is not None for name in SLOT_OPTIONS)
    return {**({} if sized else {"tuner": worker_tuner(settings)}),
            "sticky_queue_schedule_to_start_timeout": timedelta(seconds=settings.worker_sticky_timeout_seconds),
            "max_cached_workflows": settings.worker_cached_workflows,
            # The SDK's core forwards an attempt's heartbeats at most every 0.8 x its timeout, which leaves a
            # heartbeat a fifth of its timeout to reach a busy server; every 0.4 x leaves it three fifths.
            "max_heartbeat_throttle_interval": policies.TOOL_HEARTBEAT * HEARTBEAT_FORWARD,
            "graceful_shutdown_timeout": timedelta(seconds=5), **overrides}


@dataclass(frozen=True)
class Extensions:
    """What a worker registers beside or instead of ours: `workflow` in place of AgentTaskWorkflow (a change
    being tried against recorded histories), `replace` activities under the names of ours (the demo's naive
    refund tool, a test's fault), `more_tools` objects with `@tool` methods for opt-in tools (activities/courier.py); an
    opt-in tool that no object here implements is not offered to any task."""

    workflow: type = AgentTaskWorkflow
    replace: Sequence[Callable[..., Any]] = ()
    more_tools: Sequence[object] = ()


def build_worker(client: Client, settings: Settings, task_queue: str | None = None,
                 backend: ModelBackend | None = None, extensions: Extensions = Extensions(),
                 **overrides: Any) -> Worker:
    """A worker for the agent task queue. `overrides` go to temporalio's Worker over the settings
    of `worker_options()` (e.g. max_concurrent_activities or tuner instead of the settings' slots,
    max_cached_workflows, workflow_runner, sticky_queue_schedule_to_start_timeout). Every log line of
    the process is redacted from here on (infra/redact.py): a library's line may quote a URL with its
    secret path or token."""
    install_log_redaction()
    db = Database(settings.database)
    db.create()
    gateway = StripeGateway(settings.stripe_api_key.get_secret_value(), settings.stripe_api_base,
                            settings.stripe_timeout_seconds, settings.stripe_sdk_retries)
    ceilings = Ceilings(settings.approval_ceiling_cents, settings.payment_approval_ceiling_cents)
    tools = ToolActivities(db, gateway, ceilings, provider_terms(settings), message_limits(settings))
    activities = tools.activities() + [fn for extra in extensions.more_tools for fn in tool_activities(extra)]
    registered = {activity_name(a) for a in activities}
    not_opted_in = frozenset(name for name, spec in REGISTRY.items() if spec.opt_in and name not in registered)
    model = ModelActivities(backend or model_backend(settings))
    authority = AuthorityActivities(db, Deployment(
        {name: public_key_from(key) for name, key in settings.approver_keys.items()}, ceilings,
        settings.escalation_timeout_seconds, settings.disabled_tool_set | not_opted_in,
        settings.decision_max_lifetime_seconds))
    token = settings.alert_webhook_token.get_secret_value() if settings.alert_webhook_token else None
    operations = OperationsActivities(db, settings.alert_webhook_url, token)
    asking = AskingActivities(tools, operations, settings.unreadable_reads_before_asking)
    activities += [*operations.activities(), *authority.activities(), *asking.activities(),
                   ReconcileActivities(db, gateway).reconcile_ledger, model.model_turn,
                   FactActivities(db, gateway).check_facts]
    replaced = {activity_name(fn) for fn in extensions.replace}
    ensure_bytecode(extensions.workflow, ReconcileWorkflow)
    load_code_once(extensions.workflow, ReconcileWorkflow)
    return Worker(
        client,
        task_queue=task_queue or settings.task_queue,
        workflows=[extensions.workflow, ReconcileWorkflow],
        activities=[a for a in activities if activity_name(a) not in replaced] + list(extensions.replace),
        interceptors=[WorkerInterceptor(keeper_for(client) if settings.worker_liveness_keeper else None)],
        **worker_options(settings, **{"workflow_runner": CompiledSandboxRunner(), **overrides}),
    )


def activity_name(fn: Callable[..., Any]) -> str | None:
    """The name an activity is registered under; None for a dynamic activity."""
    return activity._Definition.must_from_callable(fn).name


def check_provider(settings: Settings) -> None:
    gateway = StripeGateway(settings.stripe_api_key.get_secret_value(), settings.stripe_api_base, 5.0)
    try:
        gateway.ping()
    except stripe.AuthenticationError:
        fail(f"the payment provider at {settings.stripe_api_base} refused STRIPE_API_KEY")
    except stripe.StripeError as err:
        fail(f"cannot reach the payment provider at {settings.stripe_api_base}: {type(err).__name__}")


def start_keeper(settings: Settings) -> Keeper | None:
    """The liveness keeper, started first: it connects while the worker does the rest of its start, and the
    worker does not wait for it (it says in the log if it cannot connect, and the pump still beats)."""
    if not settings.worker_liveness_keeper:
        return None
    try:
        options = connection.connect_options(settings)
    except ValueError:
        return None  # connect() says what is wrong with the configuration
    return keeper_at(options["target_host"], options["namespace"])


def freeze_startup_objects() -> None:
    """Take what start-up made out of the garbage collector's view: the modules, classes and the SDK's and
    pydantic's tables (about 130,000 objects) live as long as the process, yet each full collection scanned
    them all again (55 ms), holding every thread of the worker meanwhile. What start-up left as garbage is
    collected first. In `make load`: full collections 0.9-1.0 -> 0.5-0.8 ms of CPU a ticket."""
    gc.collect()
    gc.freeze()


KEEPER_READY_SECONDS = 60


def say_keeper_ready(keeper: Keeper) -> None:
    """The log line that says the keeper has connected: from then on a death of this worker is told at once."""
    if keeper.wait_ready(KEEPER_READY_SECONDS):
        log.info(f"liveness keeper ready (pid {keeper.pid})")
    else:
        log.warning(f"liveness keeper (pid {keeper.pid}) not connected after {KEEPER_READY_SECONDS} s: this worker's"
                    " attempts have the heartbeat pump alone, and its death is noticed by their heartbeat timeout")


async def main() -> None:
    settings = load_settings()
    telemetry.setup_logging()
    telemetry.watch_gc_pauses()
    try:
        model = model_backend(settings)
    except ModelConfigError as err:
        fail(str(err))
        raise
    async with contextlib.aclosing(model):  # closed however the start-up checks end
        keeper = start_keeper(settings)  # once the settings hold: a worker refused for them starts none
        check_provider(settings)
        client = await connect(settings)
        await check_search_attributes(client, client.namespace)
        if settings.reconcile_every_minutes:
            every = timedelta(minutes=settings.reconcile_every_minutes)
            await ensure_reconcile_schedule(client, settings.task_queue, every)
        worker = build_worker(client, settings, backend=model)
        freeze_startup_objects()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with worker:
            log.info(f"worker ready: task queue {settings.task_queue} on {client.service_client.config.target_host}, "
                     f"model {model.describe()}")
            if keeper is not None:  # a daemon thread: a keeper that never connects does not hold the exit up
                threading.Thread(target=say_keeper_ready, args=(keeper,), name="keeper-ready", daemon=True).start()
            await stop.wait()
    log.info("worker stopped")


if __name__ == "__main__":
    run_main(lambda: asyncio.run(main()))
