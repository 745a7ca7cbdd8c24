"""Activity interceptors: steady heartbeats, and crash points around every activity."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.faults import crash_point

HEARTBEAT_EVERY_SECONDS = 0.5


class WorkerInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        """Heartbeat while the activity runs, so a dead worker is noticed in seconds, not minutes."""
        name = activity.info().activity_type
        crash_point(f"{name}:start")
        beat = asyncio.create_task(_heartbeat())
        try:
            result = await self.next.execute_activity(input)
        finally:
            beat.cancel()
        crash_point(f"{name}:end")
        return result


async def _heartbeat() -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(HEARTBEAT_EVERY_SECONDS)
