"""The world the protocol runs in, in process: a provider, a ledger that pauses before every call,
and the deliberately broken variants the simulator must catch.

The provider stand-in keeps refunds of one order's charge and payments of one supplier invoice (the
`invoice` subject: one hold, and an intent key every task paying it shares). A POST is a request in transit: the
provider may land it (create the refund) at any moment until its latest landing time (sent +
request timeout + processing window: what the product is told the provider promises), answer it,
lose its answer, answer 5xx and land it later, refuse it, or drop it. A provider that ignores
idempotency keys creates one refund per landed request; one that honours them returns the first.

The broken variants are injected here, never switched in the product: a ledger subclass, or a
gateway without the send-by fence.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from activities.db import Database
from activities.effects import Ambiguous, ProviderEffect, Rejected
from activities.ledger import Claim, Effect, EffectLedger, HumanWord, Request
from activities.payments import check_send_by
from devstack.sim.scheduler import Actor, Scheduler


@dataclass
class Refund:
    ref: str
    amount: int
    key: str
    item: str
    landed_at: float


@dataclass(eq=False)
class Post:
    """A refund request in transit."""

    number: int
    key: str
    amount: int
    item: str
    sent_at: float
    timeout_at: float  # the worker's client gives up here: ReadTimeoutError
    latest: float  # the provider lands it by then, or never
    sender: Actor
    held: bool = False  # the provider sits on it: it lands (or not) only at `latest`, unanswered
    late_at: float | None = None  # a provider breaking its promise lands it then, after `latest`
    landed: Refund | None = None
    dropped: bool = False
    answer: str | None = None  # ok / lost / 5xx / rejected

    @property
    def in_transit(self) -> bool:
        return self.landed is None and not self.dropped


INVOICE, INVOICE_ID = "invoice", "INV-SIM-1"  # the subject of send_payment intents


class Provider:
    def __init__(self, honours_keys: bool, order_id: str, items: dict[str, int]) -> None:
        self.honours_keys = honours_keys
        self.order_id = order_id
        self.items = items
        self.refunds: list[Refund] = []
        self.posts: list[Post] = []

    def resources(self, subject: str) -> tuple[str, ...]:
        """What an effect on `subject` holds, as activities/tools.py names it: an item of the order and the
        order, or the invoice."""
        if subject == INVOICE:
            return (f"invoice:{INVOICE_ID}",)
        return (f"item:{self.order_id}/{subject}", f"order:{self.order_id}")

    def records(self) -> list[ProviderEffect]:
        """The order's refunds and the invoice's payments, as the product's own readers map them
        (activities/tools.py; each intent reads only its own subject's, which holds the same keys)."""
        return [ProviderEffect(r.ref, r.amount, r.key, self.resources(r.item), "succeeded") for r in self.refunds]

    def land(self, post: Post, now: float) -> Refund:
        same = next((r for r in self.refunds if r.key == post.key), None) if self.honours_keys else None
        if same is None:
            prefix = "pi" if post.item == INVOICE else "re"
            same = Refund(f"{prefix}_{len(self.refunds) + 1:03d}", post.amount, post.key, post.item, now)
            self.refunds.append(same)
        post.landed = same
        return same

    def of_key(self, key: str) -> list[Refund]:
        return [r for r in self.refunds if r.key == key]


@dataclass(frozen=True)
class Faults:
    """How often the provider misbehaves when a worker reads it (the rest are scheduler choices)."""

    read_error: float = 0.05
    held: float = 0.3  # a request the provider holds until its latest landing time
    pauses: tuple[float, ...] = (0.5, 3.0, 12.0, 50.0, 120.0)  # a SIGSTOP lasts up to one of these (seconds)
    stops: float = 1.0  # the weight of SIGSTOP / SIGKILL choices, times the default
    attempts: int | None = None  # attempts per ask (None: the money policy's); fewer reach later asks sooner
    late: float = 0.0  # a held request the provider lands after its latest landing time: a broken promise
    late_by: float = 90.0  # ...by up to this many seconds
    honours_keys: bool | None = None  # None: the variant's, else the seed's choice


# Fault profiles: where a run's weight of chaos lies. `stale-asks` stops workers often and for long
# and gives each ask two attempts, so an attempt paused during one ask wakes after later asks settled
# the intent; `late-provider` lands held requests after the horizon the provider promised, at a
# provider that honours keys; `late-provider-ignoring-keys` the same at one that ignores them, where an
# unanswered request is never sent again on the protocol's own (past its horizon it goes to a person), and
# a person's kept not_performed followed by a landing later still can pay twice (docs/architecture.md).
PROFILES = {
    "default": Faults(),
    "stale-asks": Faults(stops=4.0, attempts=2, pauses=(12.0, 50.0, 120.0, 300.0)),
    "late-provider": Faults(late=0.5, honours_keys=True),
    "late-provider-ignoring-keys": Faults(late=0.5, honours_keys=False),
}


class Gateway:
    """What a worker's refund tool calls: reads and POSTs, each a point where the scheduler may
    switch to anything else, and the product's send-by fence just before the request leaves."""

    def __init__(self, sched: Scheduler, provider: Provider, rng: random.Random, terms_timeout: float,
                 window: float, fenced: bool, faults: Faults) -> None:
        self._sched, self._provider, self._rng = sched, provider, rng
        self._timeout, self._window, self._fenced, self._faults = terms_timeout, window, fenced, faults

    def records(self, faulty: bool = True) -> Callable[[], list[ProviderEffect]]:
        def read() -> list[ProviderEffect]:
            self._sched.pause("provider: list refunds")
            if faulty and self._rng.random() < self._faults.read_error:
                raise Ambiguous("503 from GET /v1/refunds")
            return self._provider.records()
        return read

    def refund(self, key: str, item: str, amount: int) -> Callable[[], ProviderEffect]:
        def send() -> ProviderEffect:
            self._sched.pause("provider: POST /v1/refunds (before the first byte)")
            if self._fenced:
                check_send_by("POST /v1/refunds", clock=self._sched.clock)
            now = self._sched.now
            latest = now + self._timeout + self._window
            held = self._rng.random() < self._faults.held
            late = held and self._rng.random() < self._faults.late
            post = Post(len(self._provider.posts) + 1, key, amount, item, now, now + self._timeout, latest,
                        self._sched.current(), held=held,
                        late_at=latest + 1.0 + self._faults.late_by * self._rng.random() if late else None)
            self._provider.posts.append(post)
            self._sched.pause(f"awaiting the answer to POST #{post.number}", wake_at=post.timeout_at,
                              until=lambda: post.answer is not None)
            if post.answer == "ok" and post.landed is not None:
                r = post.landed
                return ProviderEffect(r.ref, r.amount, r.key, self._provider.resources(r.item), "succeeded")
            if post.answer == "rejected":
                raise Rejected("400 from POST /v1/refunds: charge_already_refunded")
            if post.answer is None:
                raise Ambiguous("ReadTimeoutError")
            raise Ambiguous(f"{post.answer} from POST /v1/refunds", answered=True)
        return send


class SteppedLedger:
    """The real ledger, with a pause point before every call: a worker may stop, die or be overtaken
    between any two of its ledger writes."""

    def __init__(self, ledger: EffectLedger, sched: Scheduler) -> None:
        self._ledger, self._sched = ledger, sched

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ledger, name)
        if not callable(attr):
            return attr

        def stepped(*args: Any, **kwargs: Any) -> Any:
            self._sched.pause(f"ledger.{name}")
            return attr(*args, **kwargs)
        return stepped


# --- the broken variants -------------------------------------------------------------------

class DecidedClearsHorizon(EffectLedger):
    """A person's mark_not_performed kept while a request may still land: the horizon is cleared first."""

    def decided(self, word: HumanWord, expected: tuple[str, ...], as_of: float | None = None) -> Effect:
        if word.status == "not_performed":
            with self._db.connect() as conn:
                conn.execute("UPDATE effects SET horizon = 0, lease_until = 0 WHERE intent_key = :key",
                             {"key": word.intent_key})
        return super().decided(word, expected, as_of)


class TakeoverAtLease(EffectLedger):
    """A claim that takes a lease over once it expires, without waiting out the stale holder's settle
    horizon, whatever the provider promises about keys."""

    def claim(self, request: Request, now: float | None = None) -> Claim:
        return super().claim(replace(request, takeover_after_lease=True), now)


class NoAskFence(EffectLedger):
    """The ledger before asks were fenced: only an older attempt of the call that holds the row is
    refused, so an attempt of an earlier ask that wakes after a later one settled the intent claims it."""

    def claim(self, request: Request, now: float | None = None) -> Claim:
        return super().claim(replace(request, caller=None, generation=None), now)

    def advance(self, key: str, caller: str, generation: float) -> None:
        return None


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    ledger: type[EffectLedger] = EffectLedger
    fenced: bool = True
    honours_keys: bool | None = None  # None: the seed chooses
    profile: str = "default"  # where a broken variant's test looks for it (PROFILES)


VARIANTS = {v.name: v for v in (
    Variant("correct", "the product's protocol, unchanged"),
    Variant("decided-clears-horizon", "a person's mark_not_performed clears the horizon and is kept while a request "
                                      "may still land", ledger=DecidedClearsHorizon, honours_keys=False),
    Variant("takeover-at-lease", "a claim takes a stale holder's lease over without waiting out its settle horizon",
            ledger=TakeoverAtLease, honours_keys=False),
    Variant("no-send-by", "the gateway sends without checking the attempt's send-by time", fenced=False,
            honours_keys=False),
    Variant("no-ask-fence", "an attempt of an earlier ask may claim an intent a later ask or the world read settled",
            ledger=NoAskFence, profile="stale-asks"),
)}


@dataclass
class Ticket:
    """One task refunding one item (all or part of it), or paying the invoice, as the simulator runs it."""

    task_id: str
    item: str
    amount: int
    key: str
    arguments: dict[str, Any]
    tool: str = "issue_refund"
    state: str = "running"  # running / awaiting / done
    awaiting_since: float | None = None
    decision: tuple[str, str | None] | None = None  # an applied person's word for the waiting call
    told: list[tuple[str, str | None, int | None]] = field(default_factory=list)  # (outcome, ref, amount)
    actor: Actor | None = None


def fresh_database(template: Database, path: str) -> Database:
    """A copy of a migrated, empty ledger database (migrating each run would cost more than the run)."""
    assert template.path is not None
    shutil.copyfile(template.path, path)
    return Database(path)
