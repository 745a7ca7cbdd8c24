"""Waiting for something that can be polled, with a deadline: never a bare sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def poll_until(predicate: Callable[[], Awaitable[Any]], what: str, timeout: float = 60.0,
                     every: float = 0.2) -> Any:
    """Await `predicate` until it returns something truthy and return it; TimeoutError after `timeout` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(every)
