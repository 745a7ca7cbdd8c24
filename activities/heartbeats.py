"""The heartbeat pump: an attempt's liveness, sent from a thread of its own.

(A pause of the whole process, such as a long garbage collection, stops this thread too: the liveness
keeper, infra/liveness.py, beats from a process of its own for that.)

An attempt that declares a heartbeat timeout (tool calls, model turns, the reconciliation) is timed
out by the server when no heartbeat reaches it within that timeout, whatever the attempt is doing.
Heartbeats sent from the activity's own event loop (an asyncio task) stop whenever the loop is busy:
a CPU-bound step, a slow payload encode, hundreds of workflow activations and completions queued
ahead of the beat. On a busy two-core machine that timed live attempts out by the hundred (issue 26).

So one daemon thread per worker process beats for every running attempt that declared a heartbeat
timeout. Each beat goes straight to the SDK's Rust core (`record_activity_heartbeat` on the bridge
worker, the call the SDK itself makes once a beat's details are encoded; ours carry none), which
throttles them to one per 0.4 s (worker.py `HEARTBEAT_FORWARD`) and sends them from its own threads.
Nothing on the way waits for the event loop; the thread needs the GIL for a few microseconds per beat, which a
CPU-bound Python step gives up every 5 ms (`sys.getswitchinterval()`).

When the SDK's core cannot be reached that way (a future SDK that moves it), a beat falls back to
the SDK's public heartbeat, handed to the event loop: liveness then depends on the loop again, and
the worker says so once in its log (tests/test_admission.py fails on it).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from temporalio.bridge.proto import ActivityHeartbeat

from core.policies import FIRST_BEAT

log = logging.getLogger("agent.heartbeats")

# Then five beats per timeout: the core forwards the latest every 0.4 x the timeout, so one is always
# waiting to go.
EVERY = 0.2

Send = Callable[[], None]


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    beat: Beat = field(compare=False)


class Beat:
    """One attempt's registration with the pump; `stop()` before the attempt's result goes back."""

    def __init__(self, pump: HeartbeatPump, send: Send, every: float, name: str) -> None:
        self._pump, self.send, self.every, self.name = pump, send, every, name
        self.live = True
        self.sent = 0
        self.first_sent: float | None = None  # time.monotonic() of the first beat handed to the core

    def stop(self) -> None:
        """No beat of this attempt is sent once this returns (a beat after the completion would reach a
        core that has forgotten the attempt)."""
        with self._pump.lock:
            self.live = False


class HeartbeatPump:
    """One thread beating for every registered attempt, each at its own pace."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._wake = threading.Condition(self.lock)
        self._due: list[_Due] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def start(self, send: Send, heartbeat_timeout: float, started: datetime | None, name: str) -> Beat:
        """Beat `send` for an attempt with this heartbeat timeout, which the server started at `started`:
        first at FIRST_BEAT x the timeout after that (at once if the attempt reached us later), then every
        EVERY x the timeout until `stop()`."""
        beat = Beat(self, send, EVERY * heartbeat_timeout, name)
        late = 0.0 if started is None else (datetime.now(UTC) - started).total_seconds()
        first = min(max(FIRST_BEAT * heartbeat_timeout - late, 0.0), FIRST_BEAT * heartbeat_timeout)
        due = _Due(time.monotonic() + first, next(self._seq), beat)
        with self.lock:
            heapq.heappush(self._due, due)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="heartbeat-pump", daemon=True)
                self._thread.start()
            if self._due[0] is due:  # due before whatever the pump waits for: wake it (else it would take the
                self._wake.notify()  # GIL from the event loop once per attempt for nothing)
        return beat

    def _run(self) -> None:
        with self.lock:
            while True:
                while self._due and not self._due[0].beat.live:
                    heapq.heappop(self._due)
                if not self._due:
                    self._wake.wait()
                    continue
                wait = self._due[0].at - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                due = heapq.heappop(self._due)
                self._send(due.beat)
                heapq.heappush(self._due, _Due(max(due.at + due.beat.every, time.monotonic()), next(self._seq),
                                               due.beat))

    @staticmethod
    def _send(beat: Beat) -> None:
        """Under the lock, so `stop()` never returns while a beat of its attempt is on the way."""
        try:
            beat.send()
            beat.sent += 1
            if beat.first_sent is None:
                beat.first_sent = time.monotonic()
        except Exception as err:  # the core refused it: the attempt is gone; its own completion says so
            log.warning("heartbeat of %s not recorded: %s", beat.name, err)
            beat.live = False


PUMP = HeartbeatPump()


def core_sender(outbound: object, task_token: bytes) -> Send | None:
    """A heartbeat without details for this attempt, recorded with the SDK's Rust core from any thread;
    None when this SDK's outbound interceptor chain does not lead to its activity worker."""
    while outbound is not None and not hasattr(outbound, "_worker"):
        outbound = getattr(outbound, "next", None)
    bridge = getattr(getattr(outbound, "_worker", None), "_bridge_worker", None)
    if not callable(bridge):
        return None
    record = bridge().record_activity_heartbeat
    message = ActivityHeartbeat(task_token=task_token)
    return lambda: record(message)
