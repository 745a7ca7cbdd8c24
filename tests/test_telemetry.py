"""The worker's Prometheus endpoint carries the SDK's metrics and ours; logs carry task id, tool and
intent key; tracing produces spans for workflows and activities when switched on."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.world import World
from devstack.processes import free_port
from devstack.stack import Stack
from infra.settings import Settings
from infra.telemetry import JsonFormatter, runtime, tracing_interceptors
from tests.helpers import finished, run, scenario_task, start
from worker import build_worker


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def sample(metrics: str, name: str, **labels: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_metrics_endpoint_counts_outcomes_and_escalations(stack: Stack, settings: Settings, world: World):
    port = free_port()
    client = await Client.connect(stack.address, data_converter=pydantic_data_converter, runtime=runtime(port))
    strict = settings.model_copy(update={"approval_ceiling_cents": 10000})
    task = scenario_task("SU-88421", repeat_effects=1)
    async with build_worker(client, strict):
        handle = await client.start_workflow("AgentTask", task, id=task.task_id, task_queue=strict.task_queue)
        from tests.approvers import signed
        from tests.helpers import waiting
        cp = await waiting(handle)
        await handle.signal("resolve", signed(handle.id, cp.waiting_for.intent_key, "approve"))
        await finished(handle)
        metrics = scrape(port)
    assert "temporal_activity_execution_latency" in metrics or "temporal_workflow_completed" in metrics
    assert sample(metrics, "agent_tool_outcomes", tool="issue_refund", outcome="performed") == 1
    assert sample(metrics, "agent_tool_outcomes", tool="issue_refund", outcome="not_performed") == 1
    assert sample(metrics, "agent_tool_outcomes", tool="notify_customer", outcome="performed") == 1
    assert sample(metrics, "agent_escalations", reason="approval_required") == 1


def test_log_lines_are_json_with_task_tool_and_key():
    record = logging.LogRecord("agent.tools", logging.INFO, __file__, 1, "tool %s %s", ("issue_refund", "performed"),
                               None)
    record.task_id, record.tool, record.intent_key = "ticket-SU-88421", "issue_refund", "v1:issue_refund:abc"
    line = json.loads(JsonFormatter().format(record))
    assert (line["task_id"], line["tool"], line["intent_key"]) == ("ticket-SU-88421", "issue_refund",
                                                                   "v1:issue_refund:abc")
    assert line["message"] == "tool issue_refund performed"


async def test_tracing_is_off_by_default_and_spans_activities_when_on(stack: Stack, settings: Settings, world: World):
    assert tracing_interceptors(False) == []
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    client = await Client.connect(stack.address, data_converter=pydantic_data_converter,
                                  interceptors=tracing_interceptors(True))
    async with build_worker(client, settings):
        await run(client, settings, scenario_task("refund-8841"))
    names = {span.name for span in exporter.get_finished_spans()}
    assert "RunActivity:issue_refund" in names and any(n.startswith("RunWorkflow:AgentTask") for n in names)


async def test_the_worker_logs_what_its_tools_did_and_not_each_provider_request(
        stack: Stack, client: Client, settings: Settings, world: World, worker_env: dict[str, str], tmp_path: Path):
    log_file = tmp_path / "worker.log"
    worker = stack.start_worker(log_file, worker_env)
    try:
        task = scenario_task("refund-8841")
        result = await asyncio.wait_for((await start(client, settings, task)).result(), 90)
    finally:
        worker.stop()
    assert result.state == "completed"
    assert [r["amount_cents"] for r in world.refunds("ORD-8841")] == [4500]  # the provider was asked
    lines = [json.loads(line) for line in log_file.read_text().splitlines() if line.startswith("{")]
    ours = [line["message"] for line in lines if line["logger"] == "agent.tools"]
    assert any(m.startswith("tool issue_refund performed") for m in ours), ours
    assert any(m.startswith("tool notify_customer performed") for m in ours), ours
    assert [line for line in lines if line["logger"] == "stripe"] == []
