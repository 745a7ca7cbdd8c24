"""A steady load beside a measurement: refund tickets kept in flight on the same workers.

`make resume RESUME_ARGS="--load 300"` measures kill -> resume while 300 other tickets run: as each
ends another starts, so the workers stay as busy as a 300-ticket load keeps them. The background
tickets are generated batch tickets numbered from FIRST (their task ids never match the crash
point's `CRASH_TASKS` prefix, so only the measured ticket's worker kills itself); each has its own
paid order, seeded before the clock. When the seeded orders run out, no more start, and the report
shows how many were in flight at each kill (the median and the fewest). After the run every
background ticket is awaited and the provider read: one refund of the item's price per order, or
the ticket is listed. Then every background ticket's history is read for timeouts that no kill
explains: an attempt or workflow task timed out on a worker that was alive, only busy.
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
from devstack.chaos import HANDED_TO_DEAD, resumptions
from devstack.chaos_faults import Kill
from devstack.scenarios import batch_order, batch_ticket
from infra.settings import Settings

FIRST = 10001  # batch_order(FIRST) is B-10001: never under the measured tickets' prefix, ticket-B-0
SETTLE_TIMEOUT = 300.0
STARTERS = 16
READERS = 16  # histories read at once after the run


@dataclass
class _Ticket:
    """A background ticket that started: its order's number, and its result as it is awaited."""

    n: int
    handle: Any
    result: asyncio.Future[Any]


@dataclass
class Background:
    client: Client
    settings: Settings
    in_flight: int
    orders: int  # seeded: batch orders FIRST .. FIRST + orders - 1
    taken: int = 0  # orders handed to a start, whether or not it started
    states: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    unattributed: Counter[str] = field(default_factory=Counter)  # timeouts no kill explains, by what timed out
    handed_to_dead: int = 0  # activities a dying worker's last completion scheduled, handed back to it
    _tickets: list[_Ticket] = field(default_factory=list)
    _feeder: asyncio.Future[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def started(self) -> int:
        return len(self._tickets)

    def now_in_flight(self) -> int:
        return sum(not t.result.done() for t in self._tickets)

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
        while not self._stop.is_set() and self.taken < self.orders:
            await room.acquire()
            if self._stop.is_set() or self.taken >= self.orders:
                room.release()
                break
            n = FIRST + self.taken
            self.taken += 1
            try:
                handle = await start_task(self.client, self.settings, batch_ticket(n))
            except BaseException:
                room.release()
                raise
            result = asyncio.ensure_future(handle.result())
            result.add_done_callback(lambda _: room.release())
            self._tickets.append(_Ticket(n, handle, result))

    async def finish(self, world: World) -> None:
        """Stop starting, wait (up to SETTLE_TIMEOUT in all) for every ticket started, then check each
        one's world. A ticket still running then (waiting for a person) is counted as such."""
        self._stop.set()
        if self._feeder is not None:
            self._feeder.cancel()
        pending = [t.result for t in self._tickets if not t.result.done()]
        if pending:
            await asyncio.wait(pending, timeout=SETTLE_TIMEOUT)
        for ticket in self._tickets:
            if not ticket.result.done():
                ticket.result.cancel()
                self.states["not ended"] += 1
                self.problems.append(f"{ticket.handle.id}: not ended within {SETTLE_TIMEOUT:.0f} s")
            elif ticket.result.exception() is not None:
                self.states["failed"] += 1
                self.problems.append(f"{ticket.handle.id}: {type(ticket.result.exception()).__name__}: "
                                     f"{ticket.result.exception()}")
            else:
                self.states[cast(TaskResult, ticket.result.result()).state] += 1
        for ticket in self._tickets:
            await asyncio.to_thread(self._check, world, ticket.n)

    def _check(self, world: World, n: int) -> None:
        order = batch_order(n)
        refunds = [r for r in world.refunds(order.order_id) if r["status"] in ("succeeded", "pending")]
        paid = sum(r["amount_cents"] for r in refunds)
        if len(refunds) != 1 or paid != order.items[0].amount_cents:
            self.problems.append(f"{order.order_id}: {len(refunds)} refunds, {paid} of "
                                 f"{order.items[0].amount_cents} cents")

    async def read_timeouts(self, kills: list[Kill]) -> None:
        """Count each timeout in the tickets' histories that none of `kills` explains (devstack/chaos.py
        `resumptions`: a kill explains the timeout of an activity scheduled before it or by its worker's
        last completion, and of its own worker's workflow tasks), and those handed to a dying worker."""
        reading = asyncio.Semaphore(READERS)

        async def read(ticket: _Ticket) -> None:
            async with reading:
                history = await ticket.handle.fetch_history()
            found, missed = resumptions(list(history.events), kills)
            self.unattributed.update(what for what, _ in missed)
            self.handed_to_dead += sum(kind == HANDED_TO_DEAD for kind, _, _ in found)

        await asyncio.gather(*(read(t) for t in self._tickets))

    def summary(self) -> dict[str, Any]:
        return {"in_flight": self.in_flight, "started": self.started, "states": dict(self.states),
                "problems": self.problems, "unattributed_timeouts": dict(self.unattributed),
                "handed_to_dead": self.handed_to_dead}
