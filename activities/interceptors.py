"""Activity interceptors: steady heartbeats, crash points, redacted failures, and the outcome of every
tool call as a metric and a structured log line (task id, tool, intent key)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.faults import crash_point
from core.models import ToolResult
from core.policies import TOOL_HEARTBEAT
from infra.redact import redacted_error

# Five beats per heartbeat timeout: the SDK forwards the latest one every 0.8 x the timeout, so one is
# always waiting to go unless the event loop stalls for 0.8 x the timeout (see core/policies.py).
HEARTBEAT_EVERY_SECONDS = TOOL_HEARTBEAT.total_seconds() / 5
# The first beat after 0.3 x the timeout, not at once. The server arms an attempt's heartbeat timer
# at its start plus the timeout; a heartbeat only makes it arm a later one when that fires, and a
# timer armed less than a second ahead fires up to a second late (the server's timer queue takes
# nothing sooner than `history.timerProcessorMaxTimeShift`, 1 s, ahead). A step that ends within
# 0.3 x the timeout (most do) sends no heartbeat, and a worker killed in one is timed out exactly one
# timeout after the attempt started; a stall of the event loop up to 0.7 x the timeout is survived.
FIRST_BEAT_AFTER_SECONDS = TOOL_HEARTBEAT.total_seconds() * 0.3

log = logging.getLogger("agent.tools")


class WorkerInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        """Heartbeat while the activity runs, so a dead worker is noticed in seconds, not minutes. An
        error it raises leaves redacted, cause chain included (infra/redact.py): whatever an HTTP
        client quoted (a URL's path and query, a key) never reaches the history or the worker's log."""
        info = activity.info()
        crash_point(f"{info.activity_type}:start")
        # A local activity (the task's policy) cannot heartbeat: it lives inside a workflow task.
        beat = None if info.is_local else asyncio.create_task(_heartbeat())
        try:
            result = await self.next.execute_activity(input)
        except Exception as err:
            clean = redacted_error(err)
            if isinstance(clean, ApplicationError) and clean.next_retry_delay is not None:
                # A planned wait (activities/effects.py `_wait`): its message says what it waits for, and
                # the server keeps a pending activity's last failure only while it is small; the stack of a
                # deliberate raise is noise that would replace the message with "Failure exceeds size limit".
                raise clean.with_traceback(None) from None
            if clean is err:
                raise
            raise clean from clean.__cause__
        finally:
            if beat is not None:
                beat.cancel()
        crash_point(f"{info.activity_type}:end")
        if isinstance(result, ToolResult):
            _record(info, result)
        return result


def _record(info: activity.Info, result: ToolResult) -> None:
    outcome = result.outcome.value if result.outcome else ("error" if result.reason else "ok")
    activity.metric_meter().create_counter(
        "agent_tool_outcomes", "Tool calls by tool and outcome (performed, already_performed, not_performed, "
        "unknown; reads: ok, error)").add(1, {"tool": result.tool, "outcome": outcome})
    log.info("tool %s %s", result.tool, outcome, extra={
        "task_id": info.workflow_id, "tool": result.tool, "intent_key": result.intent_key, "outcome": outcome,
        "reason": result.reason, "attempt": info.attempt})


async def _heartbeat() -> None:
    await asyncio.sleep(FIRST_BEAT_AFTER_SECONDS)
    while True:
        activity.heartbeat()
        await asyncio.sleep(HEARTBEAT_EVERY_SECONDS)
