"""The chaos run's fault drivers (devstack/chaos.py): what is done to the processes, and when.

One driver, the Killer, draws the next fault every 1-5 s (seeded) from a deck that holds every
enabled kind at least once per round (the first round puts the aimed faults first, while tickets are
still being started, so a crash point is reached soon after it is armed):

- `kill`: SIGKILL a random worker, restart it, wait until it is ready;
- `pause`: SIGSTOP a random worker, SIGCONT it 2-10 s later;
- `aimed SIGKILL` / `aimed SIGSTOP`: arm one of the product's own crash points (activities/faults.py,
  CRASH_ARMED) in a random worker: the first thread that reaches it signals itself there. A SIGKILL
  is restarted, a SIGSTOP woken (SIGCONT) 2-10 s later. Counted by point and signal; a point not
  reached within AIM_WAIT seconds is disarmed and counted as missed (the kind is drawn again later);
- `both paused`: SIGSTOP both workers together, SIGCONT both 2-10 s later;
- `temporal restart`: SIGKILL the Temporal dev server and start it again on the same port and the
  same SQLite file (--db-filename), so every history is still there;
- `provider restart`: stop the process that serves the Stripe edge and localstripe and start it
  again. It is stopped with SIGTERM, not SIGKILL: localstripe keeps its records in memory and saves
  them to its --store file at a clean stop (a real provider's records outlive its front ends). The
  connections in flight are cut, requests held at the edge are let through first, and the edge
  forgets its saved idempotency keys (as the chaos run's own lifting of faults does); its fault
  counters are read before the stop and added up here, and its rules are put back after the start;
- `ledger connections cut` (PostgreSQL ledger only): the shared PostgreSQL server on 127.0.0.1:5432
  cannot be killed, so for a 1-3 s window every connection to the run's own database is terminated
  (pg_terminate_backend) every 0.2 s: what a database failover looks like to its clients.

Intervals, choices and durations are the run's input (seeded), not waits for something; whatever
can be polled (a fired crash point, a stopped process, a server ready) is polled with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from devstack.edge_control import EdgeControl
from devstack.polling import poll_until
from devstack.processes import WorkerProcess
from devstack.stack import Stack

WORKER_KINDS = ("kill", "pause", "aimed SIGKILL", "aimed SIGSTOP", "both paused")
OUTAGE_KINDS = ("temporal restart", "provider restart", "ledger connections cut")
KINDS = (*WORKER_KINDS, *OUTAGE_KINDS)
# How often each kind is in a round of the deck after the first (which has each once).
WEIGHTS = {"kill": 3, "pause": 2, "aimed SIGKILL": 2, "aimed SIGSTOP": 2, "both paused": 1,
           "temporal restart": 1, "provider restart": 1, "ledger connections cut": 1}
# The product's crash points an aimed fault may pick (activities/interceptors.py, effects.py, tools.py),
# the thin ones of the effect protocol more often: between the ledger's claim and the POST, and between
# the provider's accept and the settle.
POINTS = ("issue_refund:before_provider", "issue_refund:before_provider", "issue_refund:after_provider",
          "issue_refund:after_provider", "issue_refund:start", "issue_refund:end", "notify_customer:after_send")
AIM_WAIT = 10.0   # seconds an armed point may wait to be reached before it is disarmed
AIM_RETRIES = 3   # an aimed kind missed this often is given up for the round
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass
class Kill:
    at: float          # time.time() just before SIGKILL (or SIGSTOP)
    slot: int
    pid: int | None
    exit_code: int | None
    paused_for: float = 0.0  # a pause: seconds from SIGSTOP to SIGCONT; 0 for a kill


def signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # it died meanwhile: check_alive restarts it
        pass


class Outages:
    """Restarts of the stack's servers and cuts of the ledger's connections; the edge's fault counters
    and marked requests summed over provider restarts."""

    def __init__(self, stack: Stack, edge_config: dict[str, Any], database_name: str | None = None) -> None:
        self.stack, self.edge_config, self.database_name = stack, edge_config, database_name
        self.edge_stats: Counter[str] = Counter()
        self.edge_marked: list[dict[str, Any]] = []
        self.down_seconds: dict[str, list[float]] = {"temporal restart": [], "provider restart": []}
        self.connections_cut = 0
        self.provider_up = threading.Event()  # cleared while the provider restarts
        self.provider_up.set()

    def restart_temporal(self, down: float) -> None:
        temporal = self.stack.temporal
        assert temporal is not None
        at = time.monotonic()
        temporal.kill()
        time.sleep(down)  # the outage's length: the run's input
        temporal.start()
        temporal.wait_ready(60.0)
        self.down_seconds["temporal restart"].append(time.monotonic() - at)

    def restart_provider(self, down: float) -> None:
        provider = self.stack.localstripe
        assert provider is not None
        self.take_edge_counts()
        at = time.monotonic()
        self.provider_up.clear()
        provider.stop(timeout=60.0)  # SIGTERM: the store is saved; held requests finish first
        time.sleep(down)
        provider.start()
        provider.wait_ready(30.0)
        restarts = len(self.down_seconds["provider restart"]) + 1  # other draws than before the restart
        EdgeControl(self.stack.stripe_url).restore({**self.edge_config,
                                                    "seed": self.edge_config.get("seed", 0) + restarts})
        self.provider_up.set()
        self.down_seconds["provider restart"].append(time.monotonic() - at)

    def take_edge_counts(self) -> None:
        """Add the edge's counters and marked requests to the totals (before it forgets them)."""
        edge = EdgeControl(self.stack.stripe_url)
        self.edge_stats.update(edge.stats())
        self.edge_marked += edge.marked()

    def cut_ledger(self, window: float, every: float = 0.2) -> int:
        """Terminate every connection to the run's database, every `every` s for `window` s."""
        import psycopg

        cut = 0
        end = time.monotonic() + window
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            while True:
                rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE datname = %s AND pid <> pg_backend_pid()", (self.database_name,)).fetchall()
                cut += sum(1 for (ok,) in rows if ok)
                if time.monotonic() >= end:
                    break
                time.sleep(every)  # the failover's cadence: the run's input
        self.connections_cut += cut
        return cut


class Killer:
    """Draws the faults (see the module's docstring), one at a time. A worker found dead that we did
    not kill is an unexpected exit: recorded (a real failure) and restarted."""

    def __init__(self, stack: Stack, slots: list[WorkerProcess], env: dict[str, str], rng: random.Random,
                 logs: Path, kinds: tuple[str, ...] = WORKER_KINDS, outages: Outages | None = None,
                 min_s: float = 1.0, max_s: float = 5.0, pause_s: tuple[float, float] = (2.0, 10.0)) -> None:
        self.stack, self.slots, self.env, self.rng, self.logs = stack, slots, env, rng, logs
        self.kinds, self.outages = kinds, outages
        self.min_s, self.max_s, self.pause_s = min_s, max_s, pause_s
        self.kills: list[Kill] = []
        self.pauses: list[Kill] = []
        self.counts: Counter[str] = Counter()
        self.aimed: Counter[str] = Counter()   # "<point> <SIGNAL>" -> fired
        self.missed: Counter[str] = Counter()  # aimed kind -> armed but not reached in time
        self.unexpected: list[tuple[int, int | None, str]] = []
        self.rounds = 0
        self._deck: list[str] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def worker_env(self, slot: int) -> dict[str, str]:
        return {**self.env, "CRASH_ARMED": str(self.arm_file(slot))} if self._aims else dict(self.env)

    @property
    def _aims(self) -> bool:
        return any(k.startswith("aimed") for k in self.kinds)

    def arm_file(self, slot: int) -> Path:
        return self.logs / f"crash-armed-{slot + 1}"

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop drawing faults; one under way is finished first, so both workers serve on return."""
        self._stop.set()
        if self._task is not None:
            await self._task
        self.disarm()
        self.check_alive()

    def check_alive(self) -> None:
        for slot, worker in enumerate(self.slots):
            if not worker.is_running():
                self.unexpected.append((slot, worker.returncode, worker.new_log_tail(20)))
                self.slots[slot] = self._start(slot)

    def _start(self, slot: int) -> WorkerProcess:
        return self.stack.start_worker(self.logs / f"worker-{slot + 1}.log", self.worker_env(slot))

    def _draw(self) -> str:
        if not self._deck:
            if self.rounds == 0:  # each kind once, the aimed ones first (while there is work to aim at)
                aimed = [k for k in self.kinds if k.startswith("aimed")]
                rest = [k for k in self.kinds if not k.startswith("aimed")]
                self.rng.shuffle(aimed)
                self.rng.shuffle(rest)
                self._deck = aimed + rest
            else:
                self._deck = [k for k in self.kinds for _ in range(WEIGHTS[k])]
                self.rng.shuffle(self._deck)
            self.rounds += 1
        return self._deck.pop(0)

    @property
    def first_round_done(self) -> bool:
        return self.rounds > 1 or (self.rounds == 1 and not self._deck)

    async def _run(self) -> None:
        while not self._stop.is_set():
            interval = self.rng.uniform(self.min_s, self.max_s)  # the run's input, not a wait for something
            try:
                await asyncio.wait_for(self._stop.wait(), interval)
                return
            except TimeoutError:
                pass
            await asyncio.to_thread(self.check_alive)
            kind = self._draw()
            done = await self._do(kind)
            if done:
                self.counts[kind] += 1
            elif self.missed[kind] <= AIM_RETRIES * self.rounds:
                self._deck.insert(min(len(self._deck), 1), kind)  # aimed and not reached: again soon

    async def _do(self, kind: str) -> bool:
        slot = self.rng.randrange(len(self.slots))
        if kind == "kill":
            victim = self.slots[slot]
            at = time.time()
            code = await asyncio.to_thread(victim.kill)
            self.kills.append(Kill(at, slot, victim.pid, code))
            self.slots[slot] = await asyncio.to_thread(self._start, slot)
        elif kind == "pause":
            await self._pause([slot], time.time())
        elif kind == "both paused":
            await self._pause(list(range(len(self.slots))), time.time())
        elif kind.startswith("aimed"):
            return await self._aim(kind.split()[1])
        elif kind == "temporal restart" and self.outages is not None:
            await asyncio.to_thread(self.outages.restart_temporal, self.rng.uniform(1.0, 3.0))
        elif kind == "provider restart" and self.outages is not None:
            await asyncio.to_thread(self.outages.restart_provider, self.rng.uniform(1.0, 3.0))
        elif kind == "ledger connections cut" and self.outages is not None:
            await asyncio.to_thread(self.outages.cut_ledger, self.rng.uniform(1.0, 3.0))
        else:
            return False
        return True

    async def _pause(self, slots: list[int], at: float, stopped: bool = False) -> None:
        """SIGSTOP the workers' process groups (unless a crash point `stopped` its own), SIGCONT them
        after 2-10 s (sooner if the chaos stops): processes that wake up late, their heartbeats missed
        and their leases possibly taken over."""
        pids = [(slot, self.slots[slot].pid) for slot in slots]
        if not stopped:
            for _, pid in pids:
                if pid is not None:
                    signal_group(pid, signal.SIGSTOP)
        try:
            await asyncio.wait_for(self._stop.wait(), self.rng.uniform(*self.pause_s))  # the run's input
        except TimeoutError:
            pass
        finally:
            for _, pid in pids:
                if pid is not None:
                    signal_group(pid, signal.SIGCONT)
        self.pauses += [Kill(at, slot, pid, None, time.time() - at) for slot, pid in pids if pid is not None]

    async def _aim(self, sig: str) -> bool:
        """Arm a crash point in every worker; the first thread to reach it fires and the others are
        disarmed. A SIGKILLed worker is restarted, a SIGSTOPped one woken 2-10 s later. Half the wait
        on the point drawn, then on any of POINTS, so a fault lands while there is work to hit."""
        point = self.rng.choice(POINTS)
        slots = range(len(self.slots))
        fired = [Path(f"{self.arm_file(slot)}.fired") for slot in slots]
        for slot in slots:
            fired[slot].unlink(missing_ok=True)
            self._arm(slot, f"{sig} {point}")

        async def reached() -> bool:
            return any(f.exists() for f in fired) or self._stop.is_set()
        for wait, widen in ((AIM_WAIT / 2, True), (AIM_WAIT / 2, False)):
            try:
                await poll_until(reached, f"crash point {point}", wait, 0.05)
                break
            except TimeoutError:
                if widen:
                    for slot in slots:
                        self._arm(slot, f"{sig} {','.join(sorted(set(POINTS)))}")
        for slot in slots:
            try:
                self.arm_file(slot).unlink()  # disarmed before anyone reached it
            except FileNotFoundError:  # claimed: its .fired follows at once
                await poll_until(lambda f=fired[slot]: asyncio.to_thread(f.exists), "the fired crash point", 5.0, 0.01)
        hit = [slot for slot in slots if fired[slot].exists()]
        if not hit:
            self.missed[f"aimed {sig}"] += 1
            return False
        for slot in hit:
            self.aimed[fired[slot].read_text().strip()] += 1
        await asyncio.gather(*(self._after_aim(slot, sig, fired[slot].stat().st_mtime) for slot in hit))
        return True

    def _arm(self, slot: int, text: str) -> None:
        aside = self.arm_file(slot).with_suffix(".tmp")
        aside.write_text(text)
        try:  # whole, at once: a worker never reads half of it
            aside.rename(self.arm_file(slot))
        except OSError:
            aside.unlink(missing_ok=True)

    async def _after_aim(self, slot: int, sig: str, at: float) -> None:
        victim = self.slots[slot]
        if sig == "SIGKILL":
            await poll_until(lambda: asyncio.to_thread(lambda: not victim.is_running()), "the aimed kill", 10.0, 0.05)
            code = await asyncio.to_thread(victim.kill)  # reaps it, and anything left in its group
            self.kills.append(Kill(at, slot, victim.pid, code))
            self.slots[slot] = await asyncio.to_thread(self._start, slot)
        else:
            await poll_until(lambda: asyncio.to_thread(_stopped, victim.pid), "the aimed pause", 10.0, 0.05)
            await self._pause([slot], at, stopped=True)

    def disarm(self) -> None:
        for slot in range(len(self.slots)):
            self.arm_file(slot).unlink(missing_ok=True)


def _stopped(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def run_database(ledger: str, sqlite_file: Path, name: str) -> str:
    """The run's ledger database: the SQLite file, or a new PostgreSQL database `name` (its URL)."""
    if ledger == "sqlite":
        return str(sqlite_file)
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def drop_database(url: str) -> None:
    """Drop the run's PostgreSQL database (a SQLite file stays with the data folder)."""
    if not url.startswith("postgresql"):
        return
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[-1]}" WITH (FORCE)')
