"""A steady load beside a measurement: refund tickets kept in flight on the same workers.

`make resume RESUME_ARGS="--load 300"` measures kill -> resume while 300 other tickets run: as each
ends another starts, so the workers stay as busy as a 300-ticket load keeps them. The background
tickets are generated batch tickets numbered from FIRST (their task ids never match the crash
point's `CRASH_TASKS` prefix, so only the measured ticket's worker kills itself); each has its own
paid order, seeded before the clock. When the seeded orders run out, no more start, and the report
shows how many were in flight at each kill (the median and the fewest). After the run every
background ticket is awaited and the provider read: one refund of the item's price per order, or
the ticket is listed.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

from temporalio.client import Client

from activities.world import World
from client import start_task
from core.models import TaskResult
from devstack.scenarios import batch_order, batch_ticket
from infra.settings import Settings

FIRST = 10001  # batch_order(FIRST) is B-10001: never under the measured tickets' prefix, ticket-B-0
SETTLE_TIMEOUT = 300.0
STARTERS = 16


@dataclass
class Background:
    client: Client
    settings: Settings
    in_flight: int
    orders: int  # seeded: batch orders FIRST .. FIRST + orders - 1
    started: int = 0
    states: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    _running: set[asyncio.Future[Any]] = field(default_factory=set)
    _handles: list[Any] = field(default_factory=list)
    _feeder: asyncio.Future[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def now_in_flight(self) -> int:
        return len(self._running)

    def start(self) -> None:
        self._feeder = asyncio.ensure_future(self._feed())

    async def _feed(self) -> None:
        try:
            await self._keep_in_flight()
        except Exception as err:  # the load stopped: the report says so rather than the run dying
            self.problems.append(f"starting tickets stopped: {type(err).__name__}: {err}")

    async def _keep_in_flight(self) -> None:
        """STARTERS loops start tickets at once: a start waits for the worker's check of the ticket's
        facts, and one loop alone would start fewer a second than the workers finish."""
        room = asyncio.Semaphore(self.in_flight)
        await asyncio.gather(*(self._starter(room) for _ in range(STARTERS)))

    async def _starter(self, room: asyncio.Semaphore) -> None:
        while not self._stop.is_set() and self.started < self.orders:
            await room.acquire()
            if self._stop.is_set() or self.started >= self.orders:
                room.release()
                break
            n = FIRST + self.started
            self.started += 1
            handle = await start_task(self.client, self.settings, batch_ticket(n))
            self._handles.append(handle)
            done = asyncio.ensure_future(handle.result())
            self._running.add(done)
            done.add_done_callback(lambda f: (self._running.discard(f), room.release()))

    async def finish(self, world: World) -> None:
        """Stop starting, wait (up to SETTLE_TIMEOUT in all) for every ticket started, then check each
        one's world. A ticket still running then (waiting for a person) is counted as such."""
        self._stop.set()
        if self._feeder is not None:
            self._feeder.cancel()
        for running in list(self._running):  # their slots are no longer needed; finish awaits each anew
            running.cancel()
        results = [asyncio.ensure_future(h.result()) for h in self._handles]
        if results:
            await asyncio.wait(results, timeout=SETTLE_TIMEOUT)
        for handle, result in zip(self._handles, results, strict=True):
            if not result.done():
                result.cancel()
                self.states["not ended"] += 1
                self.problems.append(f"{handle.id}: not ended within {SETTLE_TIMEOUT:.0f} s")
            elif result.exception() is not None:
                self.states["failed"] += 1
                self.problems.append(f"{handle.id}: {type(result.exception()).__name__}: {result.exception()}")
            else:
                self.states[cast(TaskResult, result.result()).state] += 1
        for n in range(FIRST, FIRST + self.started):
            await asyncio.to_thread(self._check, world, n)

    def _check(self, world: World, n: int) -> None:
        order = batch_order(n)
        refunds = [r for r in world.refunds(order.order_id) if r["status"] in ("succeeded", "pending")]
        paid = sum(r["amount_cents"] for r in refunds)
        if len(refunds) != 1 or paid != order.items[0].amount_cents:
            self.problems.append(f"{order.order_id}: {len(refunds)} refunds, {paid} of "
                                 f"{order.items[0].amount_cents} cents")

    def summary(self) -> dict[str, Any]:
        return {"in_flight": self.in_flight, "started": self.started, "states": dict(self.states),
                "problems": self.problems}
