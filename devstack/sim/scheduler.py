"""A virtual clock and actors that run one at a time, in an order a seeded random choice decides.

Each actor (a worker's attempt, a task, a person) is a thread that runs only while it holds the
baton: the scheduler hands it over (`step`), the actor runs the product's code until its next
`pause` (before every ledger call and every provider request) and hands it back. So exactly one
thread runs at a time, every interleaving is a sequence of choices, and a seed replays exactly.

A paused actor (SIGSTOP) is simply not handed the baton until it is woken; a killed one (SIGKILL)
raises `Killed` at its pause point, which unwinds its thread without running any more of its code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Killed(BaseException):
    """The actor's process died here: no handler of the product's catches it (it is not an Exception)."""


@dataclass(eq=False)
class Actor:
    name: str
    kind: str  # attempt / task / person
    label: str = "start"
    wake_at: float | None = None  # ready again once the clock reaches it
    until: Callable[[], bool] | None = None  # ready again once this holds
    paused_at: float | None = None
    killed: bool = False
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    @property
    def blocked(self) -> bool:
        return self.wake_at is not None or self.until is not None


class Scheduler:
    def __init__(self, start: float) -> None:
        self.now = start
        self.actors: list[Actor] = []
        self._back = threading.Semaphore(0)
        self._local = threading.local()

    def clock(self) -> float:
        return self.now

    def spawn(self, name: str, kind: str, body: Callable[[], Any]) -> Actor:
        actor = Actor(name, kind)

        def run() -> None:
            self._local.actor = actor
            actor.go.acquire()
            try:
                if not actor.killed:
                    actor.result = body()
            except Killed:
                pass
            except BaseException as err:
                actor.error = err
            finally:
                actor.done = True
                self._back.release()

        threading.Thread(target=run, name=name, daemon=True).start()
        self.actors.append(actor)
        return actor

    def ready(self, actor: Actor) -> bool:
        if actor.done or actor.paused_at is not None:
            return False
        if actor.wake_at is not None and self.now >= actor.wake_at:
            return True
        if actor.until is not None and actor.until():
            return True
        return not actor.blocked

    def step(self, actor: Actor) -> None:
        """Run `actor` until its next pause point (or its end)."""
        actor.wake_at, actor.until = None, None
        actor.go.release()
        self._back.acquire()

    def pause(self, label: str, wake_at: float | None = None, until: Callable[[], bool] | None = None) -> None:
        """Called by the running actor: hand the baton back; run again when chosen (and, if given,
        once the clock reaches `wake_at` or `until` holds)."""
        actor: Actor = self._local.actor
        actor.label, actor.wake_at, actor.until = label, wake_at, until
        self._back.release()
        actor.go.acquire()
        if actor.killed:
            raise Killed

    def current(self) -> Actor:
        actor: Actor = self._local.actor
        return actor

    def kill(self, actor: Actor) -> None:
        """SIGKILL: the actor's thread unwinds at once from where it stands."""
        actor.killed = True
        actor.paused_at = None
        self.step(actor)

    def finish(self) -> None:
        """End every actor still alive, so no thread outlives its run."""
        for actor in self.actors:
            if not actor.done:
                self.kill(actor)
