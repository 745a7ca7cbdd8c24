"""The worker's sandbox runner (infra/sandbox.py) compiles the SDK's entry snippets once, reads
payload contexts without entering the sandbox, and keeps the sandbox: a workflow that reads the wall
clock is still refused."""

from __future__ import annotations

import gc
import uuid
from datetime import timedelta
from importlib._bootstrap_external import _LoaderBasics  # type: ignore[import-not-found]
from types import ModuleType

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker, WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox._importer import Importer

import core.kinds
from devstack.polling import poll_until
from infra import sandbox
from infra.sandbox import CompiledSandboxRunner
from tests.sandbox_workflows import EchoWorkflow, ImportsLaterWorkflow, ReadsTheClockWorkflow
from workflows.agent_task import AgentTaskWorkflow


@activity.defn(name="sandbox_echo")
async def sandbox_echo(text: str) -> str:
    return text


def _worker(client: Client, queue: str) -> Worker:
    return Worker(client, task_queue=queue, workflows=[EchoWorkflow, ReadsTheClockWorkflow, ImportsLaterWorkflow],
                  activities=[sandbox_echo], workflow_runner=CompiledSandboxRunner(), max_cached_workflows=0)


async def test_runs_compile_each_snippet_once(client: Client) -> None:
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    sandbox._compiled.cache_clear()
    async with _worker(client, queue):
        for n in range(5):
            text = f"run {n}"
            assert await client.execute_workflow(EchoWorkflow.run, text, id=f"{queue}-{n}", task_queue=queue) == text
    info = sandbox._compiled.cache_info()
    # 5 runs, each several activations replayed from scratch (no cache): a few snippets, compiled once each.
    assert 0 < info.currsize <= 8
    assert info.hits > 5 * info.misses


async def test_payload_contexts_are_read_without_entering_the_sandbox(client: Client,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    entered: list[str] = []
    run_code = sandbox._CompiledOnce._run_code

    def recorded(self: sandbox._CompiledOnce, code: str, **extra: object) -> None:
        entered.append(code)
        run_code(self, code, **extra)

    monkeypatch.setattr(sandbox._CompiledOnce, "_run_code", recorded)
    asked: list[object] = []
    context = sandbox._CompiledOnce.get_serialization_context

    def answered(self: sandbox._CompiledOnce, command_info: object) -> object:
        asked.append(command_info)
        return context(self, command_info)  # type: ignore[arg-type]

    monkeypatch.setattr(sandbox._CompiledOnce, "get_serialization_context", answered)
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with _worker(client, queue):
        assert await client.execute_workflow(EchoWorkflow.run, "hello", id=f"{queue}-ctx", task_queue=queue) == "hello"
    assert asked, "the SDK asked the run for no payload context"
    assert entered and all("context" not in code for code in entered)


async def test_the_sandbox_still_refuses_the_wall_clock(client: Client) -> None:
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with _worker(client, queue):
        handle = await client.start_workflow(ReadsTheClockWorkflow.run, id=f"{queue}-clock", task_queue=queue)

        async def failed_task() -> str | None:
            async for event in handle.fetch_history_events():
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                    return event.workflow_task_failed_event_attributes.failure.message
            return None

        message = await poll_until(failed_task, timeout=30, what="the workflow task to fail")
        await handle.terminate("test over")
    assert message.startswith("Cannot access datetime.datetime.now")


async def test_an_agent_run_imports_its_own_module_afresh_and_one_module_of_ours_from_outside(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's import costs per module: the workflow takes what it needs from outside the sandbox
    through workflows/_outside.py alone, and nothing of ours but the workflow package's modules of the
    agent task (its handlers, its steps) is executed again inside the sandbox (a fresh copy of core/
    there would also hold classes of its own)."""
    passed: list[str] = []
    executed: list[str] = []
    pass_through = Importer._maybe_passthrough_module
    execute = _LoaderBasics.exec_module

    def recorded_pass(self: Importer, name: str) -> ModuleType | None:
        module = pass_through(self, name)
        if module is not None:
            passed.append(name)
        return module

    def recorded_exec(self: _LoaderBasics, module: ModuleType) -> None:
        executed.append(module.__name__)
        execute(self, module)

    runner = CompiledSandboxRunner()
    defn = workflow._Definition.must_from_class(AgentTaskWorkflow)
    runner.prepare_workflow(defn)  # the first import also loads what the worker had not imported yet
    monkeypatch.setattr(Importer, "_maybe_passthrough_module", recorded_pass)
    monkeypatch.setattr(_LoaderBasics, "exec_module", recorded_exec)
    runner.prepare_workflow(defn)  # one run's instance, as the worker creates it
    ours = {"activities", "cli", "client", "core", "infra", "workflows"}
    assert [name for name in passed if name.split(".")[0] in ours] == ["workflows._outside"]
    assert sorted(executed) == ["workflows", "workflows._agent", "workflows.agent_task"]


# Tracked objects one agent run's sandboxed instance keeps alive (its copy of the workflow modules, the SDK's
# instance): 383 while the agent's steps had evaluated annotations, 258 since (workflows/_agent.py).
RUN_OBJECTS_AT_MOST = 300


async def test_a_run_in_the_cache_keeps_few_objects_for_each_full_garbage_collection_to_walk() -> None:
    """A worker holds every run in flight in its cache (thousands in a burst), and each full collection walks
    all their objects while holding every thread of the worker, the heartbeat pump's too: a week's longest
    grew to about 2 s (docs/figures.md). So a run's own copy of the workflow code keeps only what it needs."""
    runner = CompiledSandboxRunner()
    defn = workflow._Definition.must_from_class(AgentTaskWorkflow)
    runner.prepare_workflow(defn)  # the first import also loads what the worker had not imported yet
    kept: list[object] = []
    create = runner.create_instance

    def keep(det: WorkflowInstanceDetails) -> WorkflowInstance:
        kept.append(instance := create(det))
        return instance

    object.__setattr__(runner, "create_instance", keep)  # a frozen dataclass
    runs = 20
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(runs):
        runner.prepare_workflow(defn)  # one run's instance, as the worker creates it
    gc.collect()
    per_run = (len(gc.get_objects()) - before) / runs
    assert len(kept) == runs
    assert per_run <= RUN_OBJECTS_AT_MOST, f"{per_run:.0f} tracked objects per cached run"


async def test_a_module_of_ours_imported_at_run_time_is_the_workers_own(client: Client,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A workflow that imports one of our modules in a helper, after its own module was loaded, gets the
    module the worker holds, not a copy executed again inside the sandbox with classes of its own."""
    monkeypatch.setattr(core.kinds, "PROBE", "the worker's module", raising=False)
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with _worker(client, queue):
        seen = await client.execute_workflow(ImportsLaterWorkflow.run, id=f"{queue}-late", task_queue=queue,
                                             execution_timeout=timedelta(seconds=30))
    assert seen == "the worker's module"
