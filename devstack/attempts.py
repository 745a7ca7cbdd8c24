"""What the histories say about attempts: retries by cause, attempts timed out, escalations by cause.

`make load` and `make week` read every task's history of each side (the harness and bare Temporal)
after the run; the worker side (`WorkerNotices`) counts what the worker itself saw of the server
timing its attempts out. No worker is killed in those runs, so every attempt timed out was alive.

From a history:

- an activity that needed more than one attempt shows it only on its closing attempt's
  `ActivityTaskStarted` event (attempt N, and the failure of attempt N-1: the server keeps no other);
  so N-1 retries, one of them by that failure's cause (a heartbeat or start-to-close timeout, the
  error type an attempt raised) and N-2 by causes the history does not keep;
- an activity whose last attempt timed out closes with `ActivityTaskTimedOut`;
- a workflow task timed out (`WorkflowTaskTimedOut`) is counted beside them, by timeout:
  start-to-close (a worker took it and did not answer in time) or schedule-to-start (nobody took
  it from a worker's sticky queue within `WORKER_STICKY_TIMEOUT_SECONDS`, so it went to the shared
  queue);
- a workflow task failed (`WorkflowTaskFailed`) is counted by its failure's first words, decoded
  first where the payload codec encoded them: with no bug in the workflow, what fails one is the
  SDK's deadlock timer (`[TMPRL1101] Potential deadlock`), which runs from the moment an activation
  is handed to the worker's workflow threads, so also while it waits for one of them;
- an escalation is an upsert that sets `AgentEscalation` (workflows/_agent.py `_set_state`), by
  its value: `unknown_outcome`, `approval_required`, `attempts_exhausted`, `dead_letter`...

Live attempts timed out = retries caused by a timeout + activities closed by one (from the
histories; a lower bound when a retried attempt's earlier failures were timeouts too) or, if higher,
what the worker saw: the core's "Activity not found on completion" (a result the server no longer
wanted) and our interceptor's "attempt timed out while running" (a cancel the server sent in answer
to a heartbeat).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.converter import DataConverter

from core.names import ESCALATION_ATTR

# Lines of the SDK's Rust core and of our interceptor that mean "the server timed out an attempt this
# worker was still running".
REFUSED_COMPLETION = "not found on completion"
TIMED_OUT_WHILE_RUNNING = "attempt timed out while running"
GC_PAUSE = re.compile(r"garbage collection held the worker ([0-9.]+) s")
NOT_KEPT = "earlier attempts (cause not kept in the history)"


@dataclass
class Attempts:
    tasks: int = 0
    activities: int = 0
    retries: Counter[str] = field(default_factory=Counter)  # cause -> retries
    timeouts: Counter[str] = field(default_factory=Counter)  # "heartbeat timeout" -> attempts timed out
    workflow_task_timeouts: Counter[str] = field(default_factory=Counter)  # "schedule-to-start timeout" -> count
    workflow_task_failures: Counter[str] = field(default_factory=Counter)  # "[TMPRL1101] Potential deadlock" -> count
    escalations: Counter[str] = field(default_factory=Counter)  # reason -> escalations
    worker_saw: int = 0  # attempts the worker saw timed out while it ran them (WorkerNotices)

    def add(self, events: Sequence[HistoryEvent]) -> None:
        """One run's history (a task that continued as new: each run's)."""
        self.tasks += events[0].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED and not (
            events[0].workflow_execution_started_event_attributes.continued_execution_run_id)
        escalation: str | None = None
        for event in events:
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                started = event.activity_task_started_event_attributes
                self.activities += 1
                if started.attempt > 1:
                    cause = cause_of(started.last_failure)
                    self.retries[cause] += 1
                    self.retries[NOT_KEPT] += started.attempt - 2
                    if cause.endswith("timeout"):
                        self.timeouts[cause] += 1
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                self.timeouts[cause_of(event.activity_task_timed_out_event_attributes.failure)] += 1
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                kind = event.workflow_task_timed_out_event_attributes.timeout_type
                self.workflow_task_timeouts[_timeout_name(kind)] += 1
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                failure = event.workflow_task_failed_event_attributes.failure
                self.workflow_task_failures[failure.message.split(":")[0][:60] or "unknown"] += 1
            elif event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
                fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
                if ESCALATION_ATTR.name in fields:
                    value = _keyword(fields[ESCALATION_ATTR.name].data)
                    if value and value != escalation:
                        self.escalations[value] += 1
                    escalation = value
        self.retries = +self.retries  # drop zero counts

    @property
    def timed_out_in_histories(self) -> int:
        return sum(self.timeouts.values())

    @property
    def live_timed_out(self) -> int:
        return max(self.timed_out_in_histories, self.worker_saw)

    def __add__(self, other: Attempts) -> Attempts:
        return Attempts(self.tasks + other.tasks, self.activities + other.activities, self.retries + other.retries,
                        self.timeouts + other.timeouts, self.workflow_task_timeouts + other.workflow_task_timeouts,
                        self.workflow_task_failures + other.workflow_task_failures,
                        self.escalations + other.escalations, self.worker_saw + other.worker_saw)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempts:
        return cls(data["tasks"], data["activities"], Counter(data["retries"]), Counter(data["timeouts"]),
                   Counter(data["workflow_task_timeouts"]), Counter(data["workflow_task_failures"]),
                   Counter(data["escalations"]), data["worker_saw"])

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "activities": self.activities, "retries": dict(self.retries),
                "timeouts": dict(self.timeouts), "workflow_task_timeouts": dict(self.workflow_task_timeouts),
                "workflow_task_failures": dict(self.workflow_task_failures),
                "escalations": dict(self.escalations), "worker_saw": self.worker_saw,
                "live_timed_out": self.live_timed_out}


def rows(sides: dict[str, Attempts]) -> list[str]:
    """Markdown table rows, one column per side: live attempts timed out, retries and escalations by cause."""
    def cell(counter: Counter[str]) -> str:
        return ", ".join(f"{k} {v}" for k, v in counter.most_common()) or "none"
    def row(label: str, values: Iterable[object]) -> str:
        return f"| {label} | {' | '.join(str(v) for v in values)} |"
    parts = sides.values()
    return [row("live attempts timed out (histories / worker's log)",
                (f"{a.timed_out_in_histories} / {a.worker_saw}" for a in parts)),
            row("attempts timed out, by timeout", (cell(a.timeouts) for a in parts)),
            row("activity retries, by cause of the failed attempt", (cell(a.retries) for a in parts)),
            row("workflow tasks timed out, by timeout (schedule-to-start: a sticky queue's, the task went to the"
                " shared queue)", (cell(a.workflow_task_timeouts) for a in parts)),
            row("workflow tasks failed, by failure", (cell(a.workflow_task_failures) for a in parts)),
            row("escalations to a person, by cause", (cell(a.escalations) for a in parts))]


def cause_of(failure: Failure) -> str:
    """A failure's cause in a few words: `heartbeat timeout`, `start-to-close timeout`, an error's type."""
    if failure.HasField("timeout_failure_info"):
        return _timeout_name(failure.timeout_failure_info.timeout_type)
    if failure.HasField("application_failure_info"):
        return failure.application_failure_info.type or "application error"
    if failure.HasField("canceled_failure_info"):
        return "cancelled"
    if failure.HasField("cause"):
        return cause_of(failure.cause)
    return failure.message[:60] or "unknown"


def _timeout_name(kind: TimeoutType.ValueType) -> str:
    return f"{TimeoutType.Name(kind).removeprefix('TIMEOUT_TYPE_').lower().replace('_', '-')} timeout"


def _keyword(data: bytes) -> str | None:
    """A keyword search attribute's value as upserted (JSON; an unset one is null or an empty list)."""
    try:
        value = json.loads(data or b"null")
    except ValueError:
        return None
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, str) and value else None


async def read(client: Client, workflow_ids: Iterable[str], concurrency: int = 16) -> Attempts:
    """Every run of each workflow, read from the server `concurrency` at a time."""
    tally = Attempts()
    gate = asyncio.Semaphore(concurrency)

    async def one(workflow_id: str) -> None:
        async with gate:
            run_id: str | None = None
            while True:  # the latest run first, then the runs it continued from
                events = (await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()).events
                await readable(client.data_converter, events)
                tally.add(events)
                first = events[0].workflow_execution_started_event_attributes
                run_id = first.continued_execution_run_id or None
                if run_id is None:
                    return
    await asyncio.gather(*(one(w) for w in workflow_ids))
    return tally


async def readable(converter: DataConverter, events: Sequence[HistoryEvent]) -> None:
    """Workflow task failures' messages as written, in place: under the payload codec a failure's message
    travels encoded and the server stores "Encoded failure" (infra/codec.py `data_converter`)."""
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failure = event.workflow_task_failed_event_attributes.failure
            if failure.HasField("encoded_attributes"):
                error = await converter.decode_failure(failure)
                failure.message = getattr(error, "message", str(error))


async def on_queue(client: Client, task_queue: str, concurrency: int = 16) -> Attempts:
    """What the histories of every workflow on a task queue say."""
    ids = {w.id async for w in client.list_workflows(f'TaskQueue = "{task_queue}"')}
    return await read(client, sorted(ids), concurrency)


class WorkerNotices(logging.Handler):
    """Counts, per task queue, the lines in which a worker in this process saw the server time out an
    attempt it was still running (attach with `watching()`; the core's lines need a runtime that forwards
    them, `forwarding_runtime()`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.lines: list[str] = []
        self.gc_pauses: list[float] = []  # seconds, from a worker's log (infra/telemetry.py watch_gc_pauses)

    def emit(self, record: logging.LogRecord) -> None:
        self.saw(record.getMessage())

    def saw(self, text: str) -> None:
        if pause := GC_PAUSE.search(text):
            self.gc_pauses.append(float(pause.group(1)))
        if REFUSED_COMPLETION in text.lower() or TIMED_OUT_WHILE_RUNNING in text:
            self.count += 1
            if len(self.lines) < 5:
                self.lines.append(text[:200])

    def taken(self) -> int:
        """The count since the last call."""
        count, self.count = self.count, 0
        return count


def seen_in_log(path: Path) -> WorkerNotices:
    """The same count from the log file of a worker that ran in a process of its own (`python worker.py`
    writes a JSON object per line, infra/telemetry.py)."""
    notices = WorkerNotices()
    for line in path.read_text(errors="replace").splitlines():
        try:
            message = json.loads(line).get("message", "")
        except (ValueError, AttributeError):
            message = line  # a line that is not ours (a crash's traceback)
        notices.saw(message)
    return notices


CORE_LOGGER = "temporal_core"


def forwarding_runtime() -> Any:
    """A Temporal runtime whose core warnings reach the Python logger `temporal_core`, where
    WorkerNotices can count them (by default the core writes them to stderr itself)."""
    from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
    return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
        forwarding=LogForwardingConfig(logger=logging.getLogger(CORE_LOGGER)))))


def watching(notices: WorkerNotices) -> None:
    """Attach the counter to the core's forwarded lines and our interceptor's."""
    for name in (CORE_LOGGER, "agent.tools"):
        logging.getLogger(name).addHandler(notices)
