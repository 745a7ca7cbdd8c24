"""Activity interceptors: heartbeats from the pump (activities/heartbeats.py), crash points, redacted
failures, and the outcome of every tool call as a metric and a structured log line (task id, tool,
intent key)."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from activities.faults import crash_point
from activities.heartbeats import PUMP, Beat, Send, core_sender
from core.models import ToolResult
from infra.liveness import Keeper
from infra.redact import redacted_error

log = logging.getLogger("agent.tools")
# Said once per process when a beat has to go through the event loop (see activities/heartbeats.py).
_FALLBACK_SAID: list[bool] = []


class WorkerInterceptor(Interceptor):
    """`keeper`: the liveness keeper (infra/liveness.py) that vouches for this worker's attempts from a
    process of its own; without one, the heartbeat pump alone keeps them alive."""

    def __init__(self, keeper: Keeper | None = None) -> None:
        self.keeper = keeper

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self.keeper)


class _Inbound(ActivityInboundInterceptor):
    _outbound: ActivityOutboundInterceptor | None = None

    def __init__(self, next: ActivityInboundInterceptor, keeper: Keeper | None) -> None:
        super().__init__(next)
        self._keeper = keeper

    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        self._outbound = outbound
        super().init(outbound)

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        """Heartbeat while an activity that declares a heartbeat timeout runs, from the pump's thread, so
        a dead worker is noticed in seconds and a busy one is not mistaken for dead. An
        error it raises leaves redacted, cause chain included (infra/redact.py): whatever an HTTP
        client quoted (a URL's path and query, a key) never reaches the history or the worker's log."""
        info = activity.info()
        reached = datetime.now(UTC)  # the server started the attempt at info.started_time; its timers run from then
        began = time.monotonic()  # the pump's clock: how long this attempt has run here
        crash_point(f"{info.activity_type}:start")
        beat = self._beat(info)
        keeper = self._keeper if beat is not None else None
        if keeper is not None and info.heartbeat_timeout:
            keeper.vouch(info.task_token, info.heartbeat_timeout.total_seconds(), info.started_time,
                         info.workflow_id or "", info.workflow_run_id or "")
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
        except asyncio.CancelledError:
            details = activity.cancellation_details()
            if details is not None and (details.timed_out or details.not_found):
                # The server timed this attempt out while it ran: the retry has it (devstack/attempts.py counts these).
                # How late the attempt reached this code says whether the worker was slow to begin it
                # (its event loop busy) or was slow while it ran.
                log.warning("attempt timed out while running: %s %s attempt %d (reached the worker %.2f s after"
                            " the server started it, ran %.2f s; %s)", info.workflow_id, info.activity_type,
                            info.attempt, (reached - info.started_time).total_seconds(),
                            time.monotonic() - began, _beats(beat, began))
            raise
        finally:
            if beat is not None:
                beat.stop()
            if keeper is not None:
                keeper.release(info.task_token)
        crash_point(f"{info.activity_type}:end")
        if isinstance(result, ToolResult):
            _record(info, result)
        return result

    def _beat(self, info: activity.Info) -> Beat | None:
        """The attempt's registration with the heartbeat pump, if it declared a heartbeat timeout. A local
        activity (the task's policy) has none: it lives inside a workflow task. Steps without one are short
        (their start-to-close timeout bounds them) and need no beats."""
        if info.is_local or not info.heartbeat_timeout or self._outbound is None:
            return None
        send = core_sender(self._outbound, info.task_token) or _through_loop(self._outbound)
        return PUMP.start(send, info.heartbeat_timeout.total_seconds(), info.started_time,
                          f"{info.workflow_id}/{info.activity_type}#{info.attempt}")


def _beats(beat: Beat | None, began: float) -> str:
    """What the pump sent for an attempt, for the line above: whether liveness left this process in time."""
    if beat is None:
        return "no heartbeat timeout"
    if beat.first_sent is None:
        return "the pump sent no beat"
    return f"the pump sent {beat.sent} beats, the first {beat.first_sent - began:.2f} s after it reached the worker"


def _through_loop(outbound: ActivityOutboundInterceptor) -> Send:
    """The SDK's public heartbeat, handed to the event loop: what a beat falls back to when the core
    cannot be reached from the pump's thread. Liveness then waits for the loop."""
    if not _FALLBACK_SAID:
        _FALLBACK_SAID.append(True)
        log.warning("heartbeats go through the event loop: this temporalio's core is not reachable from the "
                    "heartbeat pump (activities/heartbeats.py); a busy loop can time live attempts out")
    loop = asyncio.get_running_loop()

    def send() -> None:
        loop.call_soon_threadsafe(outbound.heartbeat)
    return send


def _record(info: activity.Info, result: ToolResult) -> None:
    outcome = result.outcome.value if result.outcome else ("error" if result.reason else "ok")
    activity.metric_meter().create_counter(
        "agent_tool_outcomes", "Tool calls by tool and outcome (performed, already_performed, not_performed, "
        "unknown; reads: ok, error)").add(1, {"tool": result.tool, "outcome": outcome})
    log.info("tool %s %s", result.tool, outcome, extra={
        "task_id": info.workflow_id, "tool": result.tool, "intent_key": result.intent_key, "outcome": outcome,
        "reason": result.reason, "attempt": info.attempt})
