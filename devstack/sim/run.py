"""One seeded run of the effect protocol, and an explorer over seeds.

What runs is the product's code: `activities/effects.py` Effects (perform, inspect, decide) over
`activities/ledger.py` EffectLedger on a real SQLite file, the product's intent keys, retry policy
and heartbeat timeout, and its send-by fence. What is modelled: Temporal (an attempt that fails,
dies or stops heartbeating is retried with the money policy's backoff or its own next_retry_delay),
the workflow's rules around a call (read the world before asking a person, ask again after a
not_performed, tell the customer what the call answered), the provider, and people.

Every step the scheduler picks one of: run a ready actor to its next pause point, pause or kill a
worker's attempt, wake a paused one, land / answer / refuse a request in transit, advance the
clock, or let a person decide (on a call waiting for one, or at any other moment). After every
step it checks:

- at most one refund per intent at the provider, and no item or order refunded past its price;
- the ledger never holds as performed what the provider does not show;
- a customer is never told of a refund the provider does not hold (amount, and for `performed`,
  made for this intent), and no two intents are told the same refund as their own;
- nobody is asked about an intent the provider already holds;
- no person's word is kept that the provider contradicts.

Then every worker is woken, the run drains, every request lands or is dropped, the clock passes
every horizon, and: the ledger converges to the provider (after the product's own inspection), and
no customer told "not refunded" has a refund.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from temporalio.exceptions import ApplicationError

from activities.db import Database
from activities.effects import Ask, Attempt, Effects, Intent, ProviderTerms
from activities.ledger import Hold
from core.keys import derive_intent_key
from core.models import SETTLED, Outcome, SettleInput, ToolInput, ToolResult
from core.policies import MONEY_POLICY, TOOL_HEARTBEAT
from core.tools import REGISTRY
from devstack.sim.scheduler import Actor, Scheduler
from devstack.sim.world import (
    INVOICE,
    INVOICE_ID,
    PROFILES,
    VARIANTS,
    Faults,
    Gateway,
    Post,
    Provider,
    SteppedLedger,
    Ticket,
    Variant,
    fresh_database,
)

ORDER = "ORD-SIM-1"
ITEMS = {"mug": 4000, "lamp": 2500}
LIMITS = {**ITEMS, INVOICE: 7000}  # what each subject may be refunded or paid in total
START = 1_800_000_000.0
MAX_ASKS = 3  # the model asks again after a retryable not_performed
WORLD_READS = 4  # workflows/_agent.py _WORLD_READS


class Violation(Exception):
    """An invariant failed: the run stops here."""


@dataclass
class Result:
    seed: int
    variant: str
    steps: int
    honours_keys: bool
    failure: str | None
    trace: list[str] = field(default_factory=list)
    profile: str = "default"

    @property
    def ok(self) -> bool:
        return self.failure is None


def _scenario(rng: random.Random) -> list[tuple[str, str, int]]:
    """The tickets of a run: (task, item, amount). Duplicate tickets for one item, and an item
    refunded in two halves, are where budgets and keys matter most."""
    shape = rng.choice(["one", "duplicate", "halves", "halves-and-duplicate", "two-items", "invoice",
                        "invoice-twice"])
    if shape == "invoice":  # send_payment: one hold, the invoice
        return [("T1", INVOICE, LIMITS[INVOICE])]
    if shape == "invoice-twice":  # two tasks paying one invoice share its intent key (no task in it)
        return [("T1", INVOICE, LIMITS[INVOICE]), ("T2", INVOICE, LIMITS[INVOICE])]
    if shape == "one":
        return [("T1", "mug", ITEMS["mug"])]
    if shape == "duplicate":
        return [("T1", "mug", ITEMS["mug"]), ("T2", "mug", ITEMS["mug"])]
    if shape == "halves":
        return [("T1", "mug", ITEMS["mug"] // 2), ("T2", "mug", ITEMS["mug"] // 2)]
    if shape == "halves-and-duplicate":
        return [("T1", "mug", ITEMS["mug"] // 2), ("T2", "mug", ITEMS["mug"] // 2), ("T3", "mug", ITEMS["mug"])]
    return [("T1", "mug", ITEMS["mug"]), ("T2", "lamp", ITEMS["lamp"])]


class Run:
    def __init__(self, seed: int, variant: Variant, template: Database, folder: str, steps: int,
                 faults: Faults | None = None) -> None:
        self.rng = random.Random(seed)
        self.seed, self.variant, self.budget = seed, variant, steps
        self.faults = faults or Faults()
        honours = variant.honours_keys if variant.honours_keys is not None else self.rng.random() < 0.5
        honours = honours if self.faults.honours_keys is None else self.faults.honours_keys
        self.terms = ProviderTerms(honours_keys=honours)
        self.sched = Scheduler(START)
        self.provider = Provider(honours, ORDER, ITEMS)
        self.db = fresh_database(template, os.path.join(folder, f"sim-{seed}.db"))
        ledger = variant.ledger(self.db, clock=self.sched.clock)
        self.ledger = ledger  # read directly (no pause points) by the checks
        stepped = SteppedLedger(ledger, self.sched)
        self.effects = Effects(stepped, self.terms, clock=self.sched.clock)  # type: ignore[arg-type]
        self.gateway = Gateway(self.sched, self.provider, self.rng, self.terms.request_timeout_seconds,
                               self.terms.processing_window_seconds, variant.fenced, self.faults)
        self.tickets = [self._ticket(t, item, amount) for t, item, amount in _scenario(self.rng)]
        self.attempts: list[Actor] = []
        self.stalled: dict[Actor, float] = {}  # attempt -> when Temporal times it out (paused or killed)
        self.abandoned: set[Actor] = set()
        self.paused_until: dict[Actor, float] = {}  # SIGSTOPped attempt -> its SIGCONT
        self.kept_not_performed: dict[str, list[Post]] = {}  # key -> its requests sent before the word was kept
        self.trace: list[str] = []
        self.step_count = 0

    def _ticket(self, task_id: str, item: str, amount: int) -> Ticket:
        tool = "send_payment" if item == INVOICE else "issue_refund"
        arguments: dict[str, object] = {"invoice_id": INVOICE_ID, "payee": "Sim Supplies", "amount_cents": amount,
                                        "currency": "usd"} if tool == "send_payment" else \
            {"order_id": ORDER, "item_id": item, "amount_cents": amount, "currency": "usd"}
        key = derive_intent_key(tool, REGISTRY[tool].key_fields, arguments, {"task_id": task_id})
        return Ticket(task_id, item, amount, key, arguments, tool)

    def log(self, line: str) -> None:
        self.trace.append(f"{self.step_count:4d} t+{self.sched.now - START:7.2f}s {line}")

    # --- the workflow's side of a call -------------------------------------------------------

    def _intent(self, ticket: Ticket, call: ToolInput) -> Intent:
        resources = self.provider.resources(ticket.item)  # the subject first; then, for a refund, the order
        limits = (LIMITS[ticket.item], sum(ITEMS.values()))[:len(resources)]
        return Intent(call=call, key=ticket.key, amount=ticket.amount,
                      holds=tuple(Hold(resource, limit, ticket.amount)
                                  for resource, limit in zip(resources, limits, strict=True)),
                      records=self.gateway.records(), send=self.gateway.refund(ticket.key, ticket.item, ticket.amount))

    def _activity(self, ticket: Ticket, ask: int) -> ToolResult:
        """Temporal running one tool activity: attempts under the money policy, an attempt that stops
        heartbeating (paused or killed) timed out after the heartbeat timeout and retried."""
        call = ToolInput(task_id=ticket.task_id, tool=ticket.tool, arguments=ticket.arguments,
                         intent_key=ticket.key)
        call_id, limit = f"{ticket.task_id}/run/{ask}", self.faults.attempts or MONEY_POLICY.maximum_attempts
        interval = MONEY_POLICY.initial_interval.total_seconds()
        scheduled = Ask(ticket.task_id, self.sched.now)  # Temporal's scheduled_time of this ask's activity
        for number in range(1, limit + 1):
            attempt = Attempt(call_id, number, number >= limit, scheduled)
            actor = self.sched.spawn(f"{ticket.task_id}/ask{ask}#{number}", "attempt",
                                     lambda a=attempt: self._perform(ticket, call, a))
            self.attempts.append(actor)
            self.sched.pause(f"awaiting attempt {number}", until=lambda a=actor: (a.done and not a.killed)
                             or a in self.abandoned)
            delay = interval
            if actor in self.abandoned:
                pass
            elif actor.error is not None:
                raise actor.error
            elif isinstance(actor.result, ToolResult):
                return actor.result
            elif isinstance(actor.result, ApplicationError) and actor.result.next_retry_delay is not None:
                delay = actor.result.next_retry_delay.total_seconds()
            if number == limit:
                break
            interval = min(interval * MONEY_POLICY.backoff_coefficient,
                           (MONEY_POLICY.maximum_interval or MONEY_POLICY.initial_interval).total_seconds())
            self.sched.pause("retry timer", wake_at=self.sched.now + delay)
        return ToolResult(tool=ticket.tool, outcome=Outcome.UNKNOWN, intent_key=ticket.key,
                          reason="attempts_exhausted", attempt=limit)

    def _perform(self, ticket: Ticket, call: ToolInput, attempt: Attempt) -> ToolResult | ApplicationError:
        try:
            return self.effects.perform(self._intent(ticket, call), attempt)
        except ApplicationError as err:
            return err

    def _read_world(self, ticket: Ticket) -> str:
        """workflows/_agent.py _read_world: the product's inspection, waiting out a request in flight."""
        view = None
        for _ in range(WORLD_READS):
            view = self.effects.inspect(ticket.key, self.gateway.records(faulty=False),
                                        Ask(ticket.task_id, self.sched.now))
            if view.status != "in_flight" or view.until is None:
                break
            self.sched.pause("world: in flight, waiting", wake_at=max(self.sched.now + 1.0, view.until + 0.5))
        assert view is not None
        if view.status == "performed":
            self._tell(ticket, Outcome.PERFORMED if view.task_id == ticket.task_id else Outcome.ALREADY_PERFORMED,
                       view.provider_ref, view.amount_cents)
        return view.status

    def _task(self, ticket: Ticket) -> None:
        self._calls(ticket)
        ticket.state = "done"

    def _calls(self, ticket: Ticket) -> None:
        for ask in range(1, MAX_ASKS + 1):
            result = self._activity(ticket, ask)
            self.log(f"{ticket.task_id} ask {ask}: {result.outcome} {result.reason or ''}")
            if result.outcome in SETTLED:
                assert result.outcome is not None
                self._tell(ticket, result.outcome, result.data.get("provider_ref"), result.data.get("amount_cents"))
                return
            if result.outcome is Outcome.NOT_PERFORMED:
                if result.retryable:
                    continue
                self._tell(ticket, Outcome.NOT_PERFORMED, None, None)
                return
            world = self._read_world(ticket)  # unknown: read the world before asking anyone
            if world == "performed":
                return
            if world == "not_performed":
                continue
            if self._ask_person(ticket) == "performed":
                return
        self._tell(ticket, Outcome.NOT_PERFORMED, None, None)

    def _ask_person(self, ticket: Ticket) -> str:
        held = self.provider.of_key(ticket.key)
        if held:
            raise Violation(f"{ticket.task_id} asks a person about {ticket.key[-8:]}, which the provider already "
                            f"holds as {held[0].ref}")
        ticket.state, ticket.awaiting_since, ticket.decision = "awaiting", self.sched.now, None
        self.sched.pause("awaiting a person", until=lambda: ticket.decision is not None)
        assert ticket.decision is not None
        status, ref = ticket.decision
        if status == "performed_by_world":  # the world check told the customer already
            return "performed"
        ticket.state = "running"
        if status == "performed":
            record = next((r for r in self.provider.refunds if r.ref == ref), None)
            self._tell(ticket, Outcome.PERFORMED, ref, record.amount if record else ticket.amount)
        return status

    def _person(self, ticket: Ticket, status: str, ref: str | None) -> None:
        """A person's resolve, through the product's record_human_decision (activities/tools.py): the
        provider's records read, then Effects.decide. For a waiting call the workflow first reads the
        world (a mark_not_performed is refused if the provider holds the intent)."""
        waiting = ticket.state == "awaiting"
        if waiting and status == "not_performed" and self._read_world(ticket) == "performed":
            ticket.decision = ("performed_by_world", None)
            return
        read_at = self.sched.now
        records = self.gateway.records(faulty=False)()
        settle = SettleInput(task_id=ticket.task_id, tool=ticket.tool, intent_key=ticket.key,
                             arguments=ticket.arguments, status="performed" if status == "performed" else
                             "not_performed", provider_ref=ref, decided_by="sim-person")
        # The workflow records the word of a person it waits for (an activity of its own); one given
        # unasked reaches the ledger with no ask of the task's (the sim's people may act on it directly).
        ask = Ask(ticket.task_id, self.sched.now) if waiting else None
        verdict = self.effects.decide(settle, records, self.provider.resources(ticket.item), read_at, ask)
        self.log(f"person on {ticket.task_id}: {status} {ref or ''} -> "
                 f"{'kept' if verdict.applied else 'refused: ' + (verdict.why or '')}")
        if not verdict.applied:
            return
        # What the provider held when the person's records were read: only a provider breaking its promise
        # lands a request of the intent after a read past its horizon (the late-provider profiles).
        held = [r for r in self.provider.of_key(ticket.key) if r.landed_at <= read_at]
        if status == "not_performed":
            if held:
                raise Violation(f"a person's not_performed on {ticket.task_id} kept while the provider holds "
                                f"{held[0].ref}")
            self.kept_not_performed[ticket.key] = [p for p in self.provider.posts if p.key == ticket.key]
        else:
            record = next((r for r in self.provider.refunds if r.ref == ref), None)
            if record is None or record.key != ticket.key:
                raise Violation(f"a person's performed {ref} on {ticket.task_id} kept; the provider shows "
                                f"{'no such refund' if record is None else 'it made for another intent'}")
        if waiting and ticket.state == "awaiting":
            ticket.decision = (status, ref)

    def _tell(self, ticket: Ticket, outcome: Outcome, ref: str | None, amount: int | None) -> None:
        """The customer's message: what the call answered, checked against the provider now."""
        ticket.told.append((outcome.value, ref, amount))
        ticket.state = "done"
        self.log(f"{ticket.task_id} tells the customer: {outcome.value} {ref or ''} {amount or ''}")
        if outcome not in SETTLED or ref is None:
            return
        record = next((r for r in self.provider.refunds if r.ref == ref), None)
        # already_performed for an item used up by earlier refunds names the first and their total
        item_total = sum(r.amount for r in self.provider.refunds if record and r.item == record.item)
        if record is None or record.item != ticket.item or amount not in (record.amount, item_total) \
                or (outcome is Outcome.PERFORMED and amount != record.amount):
            raise Violation(f"{ticket.task_id} tells its customer {outcome.value} {ref} ({amount}); the provider "
                            f"shows {'nothing' if record is None else f'{record.amount} on {record.item}'}")
        if outcome is Outcome.PERFORMED:
            if record.key != ticket.key:
                raise Violation(f"{ticket.task_id} tells its customer {ref} is its refund; the provider made it "
                                "for another intent")

    # --- the checks after every step ---------------------------------------------------------

    def check(self) -> None:
        by_key: dict[str, list[str]] = {}
        by_item: dict[str, int] = {}
        for r in self.provider.refunds:
            by_key.setdefault(r.key, []).append(r.ref)
            by_item[r.item] = by_item.get(r.item, 0) + r.amount
        for key, refs in by_key.items():
            if len(refs) > 1:
                raise Violation(f"paid twice: intent {key[-8:]} has refunds {', '.join(refs)} at the provider")
        for item, total in by_item.items():
            if total > LIMITS[item]:
                raise Violation(f"over-refunded: {item} refunded {total} of {LIMITS[item]} cents" if item in ITEMS
                                else f"paid twice: {INVOICE_ID} paid {total} of {LIMITS[item]} cents")
        if sum(total for item, total in by_item.items() if item in ITEMS) > sum(ITEMS.values()):
            raise Violation("over-refunded: the order")
        refs = {r.ref for r in self.provider.refunds}
        for effect in self.ledger.all():
            if effect.status == "performed" and effect.provider_ref not in refs:
                raise Violation(f"the ledger holds {effect.intent_key[-8:]} as performed by {effect.provider_ref}, "
                                "which the provider does not show")
        for key, posts in self.kept_not_performed.items():
            landed = next((p for p in posts if p.landed is not None and p.late_at is None), None)
            if landed is not None and landed.landed is not None:
                raise Violation(f"a person's not_performed on {key[-8:]} was kept while POST #{landed.number} could "
                                f"still land; it landed as {landed.landed.ref}")
        told: dict[str, str] = {}
        for t in self.tickets:
            for outcome, ref, _ in t.told:
                if outcome == Outcome.PERFORMED.value and ref is not None:
                    if told.setdefault(ref, t.key) != t.key:
                        raise Violation(f"two intents told {ref} as their own refund")

    # --- the scheduler's choices -------------------------------------------------------------

    def _choices(self, chaos: bool) -> list[tuple[float, str, Callable[[], None]]]:
        s, now = self.sched, self.sched.now
        out: list[tuple[float, str, Callable[[], None]]] = []
        for actor in s.actors:
            if s.ready(actor):
                out.append((10.0, f"run {actor.name} ({actor.label})", lambda a=actor: s.step(a)))
        for post in self.provider.posts:
            if post.held:
                continue
            if post.in_transit:
                out.append((2.0 if chaos else 0.5, f"provider lands POST #{post.number}",
                            lambda p=post: self._land(p)))
            if post.answer is None and not post.sender.done and now < post.timeout_at:
                out.append((4.0, f"provider answers POST #{post.number}", lambda p=post: self._answer(p)))
        for ticket in self.tickets:
            if ticket.state == "awaiting" and not self._deciding(ticket):
                out.append((2.0, f"a person decides {ticket.task_id}", lambda t=ticket: self._decide(t)))
        if chaos:
            for actor in self.attempts:
                if not actor.done and actor.paused_at is None and actor not in self.abandoned:
                    out.append((0.6 * self.faults.stops, f"SIGSTOP {actor.name} ({actor.label})",
                                lambda a=actor: self._stop(a)))
                    out.append((0.4 * self.faults.stops, f"SIGKILL {actor.name} ({actor.label})",
                                lambda a=actor: self._kill(a)))
            for ticket in self.tickets:
                if ticket.state == "running" and not self._deciding(ticket):
                    out.append((0.3, f"a person decides {ticket.task_id} unasked", lambda t=ticket: self._decide(t)))
        if self._next_timer() is not None:
            out.append((3.0 if chaos else 1.0, "the clock moves", self._tick))
        return out

    def _deciding(self, ticket: Ticket) -> bool:
        return any(a.kind == "person" and not a.done and a.name.endswith(ticket.task_id) for a in self.sched.actors)

    def _decide(self, ticket: Ticket) -> None:
        refs = [r.ref for r in self.provider.refunds]
        if refs and self.rng.random() < 0.5:
            status, ref = "performed", self.rng.choice(refs)
        else:
            status, ref = "not_performed", None
        self.log(f"a person answers {ticket.task_id}: {status} {ref or ''}")
        actor = self.sched.spawn(f"person on {ticket.task_id}", "person", lambda: self._person(ticket, status, ref))
        self.sched.step(actor)

    def _land(self, post: Post) -> None:
        refund = self.provider.land(post, self.sched.now)
        self.log(f"provider lands POST #{post.number} ({post.key[-8:]}) as {refund.ref}")

    def _answer(self, post: Post) -> None:
        if post.landed is not None:
            post.answer = self.rng.choice(["ok", "ok", "ok", "lost"])
        else:
            post.answer = self.rng.choice(["ok", "ok", "5xx", "rejected"])
            if post.answer == "ok":
                self.provider.land(post, self.sched.now)
            elif post.answer == "rejected":
                post.dropped = True
        self.log(f"provider answers POST #{post.number}: {post.answer}"
                 f"{' (' + post.landed.ref + ')' if post.landed else ''}")

    def _stop(self, actor: Actor) -> None:
        actor.paused_at = self.sched.now
        self.paused_until[actor] = self.sched.now + self.rng.choice(self.faults.pauses) * self.rng.random()
        self.stalled[actor] = self.sched.now + TOOL_HEARTBEAT.total_seconds()

    def _kill(self, actor: Actor) -> None:
        self.sched.kill(actor)
        self.stalled[actor] = self.sched.now + TOOL_HEARTBEAT.total_seconds()

    def _wake(self, actor: Actor) -> None:
        actor.paused_at = None
        self.paused_until.pop(actor, None)
        if actor not in self.abandoned:
            self.stalled.pop(actor, None)

    def _next_timer(self) -> float | None:
        now = self.sched.now
        times = [a.wake_at for a in self.sched.actors if not a.done and a.wake_at is not None and a.wake_at > now]
        times += [t for a, t in self.stalled.items() if a not in self.abandoned and t > now]
        times += [p.timeout_at for p in self.provider.posts if p.answer is None and not p.sender.done
                  and p.timeout_at > now]
        times += [p.latest if p.late_at is None or p.latest > now else p.late_at
                  for p in self.provider.posts if p.in_transit]
        times += [t for t in self.paused_until.values() if t > now]
        return min(times) if times else None

    def _tick(self) -> None:
        target = self._next_timer()
        assert target is not None
        if self.rng.random() < 0.4:  # part of the way: things happen between timers too
            target = self.sched.now + (target - self.sched.now) * self.rng.random()
        self.sched.now = max(self.sched.now, target)
        for actor, at in list(self.paused_until.items()):
            if at <= self.sched.now:
                self.log(f"SIGCONT {actor.name}")
                self._wake(actor)
        for actor, at in self.stalled.items():
            if at <= self.sched.now and actor not in self.abandoned and (actor.paused_at is not None or actor.killed):
                self.abandoned.add(actor)
                self.log(f"Temporal times {actor.name} out (no heartbeat)")
        for post in self.provider.posts:  # the provider keeps its promise: lands by `latest`, or never
            if post.in_transit and post.late_at is not None:
                if post.late_at <= self.sched.now:  # ...unless it breaks it
                    self.log(f"provider lands POST #{post.number} {post.late_at - post.latest:.1f} s after the "
                             "latest it promised")
                    self._land(post)
            elif post.in_transit and post.latest <= self.sched.now:
                if self.rng.random() < 0.5:
                    self._land(post)
                else:
                    post.dropped = True
                    self.log(f"provider drops POST #{post.number}")

    # --- the run -----------------------------------------------------------------------------

    def run(self) -> Result:
        failure = None
        try:
            for ticket in self.tickets:
                ticket.actor = self.sched.spawn(ticket.task_id, "task", lambda t=ticket: self._task(t))
            self._loop(chaos=True, budget=self.budget)
            for actor in self.attempts:
                if actor.paused_at is not None:
                    self.log(f"SIGCONT {actor.name} (drain)")
                    self._wake(actor)
            self._loop(chaos=False, budget=self.budget * 20)
            self._final()
        except Violation as err:
            failure = str(err)
            self.log(f"VIOLATION: {failure}")
        finally:
            self.sched.finish()
            self.db.engine.dispose()
        return Result(self.seed, self.variant.name, self.step_count, self.terms.honours_keys, failure, self.trace)

    def _loop(self, chaos: bool, budget: int) -> None:
        for _ in range(budget):
            choices = self._choices(chaos)
            if not choices:
                return
            weights = [w for w, _, _ in choices]
            _, what, act = self.rng.choices(choices, weights)[0]
            self.step_count += 1
            self.log(what)
            act()
            for actor in self.sched.actors:
                if actor.error is not None:
                    if isinstance(actor.error, Violation):
                        raise actor.error
                    raise Violation(f"{actor.name} raised {type(actor.error).__name__}: {actor.error}")
            self.check()

    def _final(self) -> None:
        stuck = [t.task_id for t in self.tickets if t.state == "running"]
        if stuck:
            raise Violation(f"not live: {', '.join(stuck)} neither finished nor waiting for a person")
        plain = Effects(self.ledger, self.terms, clock=self.sched.clock)
        for ticket in self.tickets:
            plain.inspect(ticket.key, self.provider.records)
            row = self.ledger.get(ticket.key)
            held = self.provider.of_key(ticket.key)
            if held and (row is None or row.status != "performed" or row.provider_ref != held[0].ref):
                raise Violation(f"the ledger does not converge: {ticket.task_id} holds {held[0].ref} at the provider, "
                                f"{'nothing' if row is None else row.status} in the ledger")
            if not held and row is not None and row.status == "performed":
                raise Violation(f"the ledger does not converge: {ticket.task_id} performed, nothing at the provider")
            # A payment's intent is the invoice's, shared by every task paying it: a task is answerable for
            # the requests its own attempts sent (another task may pay the invoice after this one was refused).
            mine = [p for p in self.provider.posts if p.key == ticket.key and p.landed is not None
                    and p.sender.name.split("/")[0] == ticket.task_id]
            if mine and any(outcome == "not_performed" for outcome, _, _ in ticket.told):
                late = [p for p in mine if p.late_at is not None]
                assert row is not None
                if not late or not row.detail.get("late_landing"):
                    raise Violation(f"{ticket.task_id} told its customer not refunded; the provider holds "
                                    f"{held[0].ref}{' (landed late, and not escalated)' if late else ''}")
                self.log(f"{ticket.task_id}: POST #{late[0].number} landed after its promised horizon, after the "
                         f"customer was told not refunded: escalated (the ledger row says late_landing)")


@contextmanager
def template_database() -> Iterator[tuple[Database, str]]:
    """A migrated empty ledger in a temporary folder, and the folder for the runs' copies."""
    with tempfile.TemporaryDirectory(prefix="effect-sim-") as folder:
        template = Database(os.path.join(folder, "template.db"))
        template.create()
        template.engine.dispose()
        yield template, folder


def simulate(seed: int, variant: str = "correct", steps: int = 200, template: Database | None = None,
             folder: str | None = None, profile: str = "default") -> Result:
    if template is None or folder is None:
        with template_database() as (made, where):
            return simulate(seed, variant, steps, made, where, profile)
    logging.getLogger("agent.ledger").setLevel(logging.CRITICAL)  # late landings log errors: the checks read them
    logging.getLogger("agent.effects").setLevel(logging.ERROR)
    result = Run(seed, VARIANTS[variant], template, folder, steps, PROFILES[profile]).run()
    result.profile = profile
    os.unlink(os.path.join(folder, f"sim-{seed}.db"))
    return result


@dataclass
class Exploration:
    variant: str
    seeds: int
    steps: int
    seconds: float
    failures: list[Result]

    @property
    def shortest(self) -> Result | None:
        return min(self.failures, key=lambda r: r.steps) if self.failures else None


def explore(variant: str, seeds: range, steps: int = 200, stop_after: int | None = None,
            profile: str = "default") -> Exploration:
    """Run `seeds` under a fault profile (devstack/sim/world.py PROFILES); stop early once `stop_after`
    of them failed."""
    started, total, failures, ran = time.monotonic(), 0, [], 0
    with template_database() as (template, folder):
        for seed in seeds:
            result = simulate(seed, variant, steps, template, folder, profile)
            ran += 1
            total += result.steps
            if not result.ok:
                failures.append(result)
                if stop_after is not None and len(failures) >= stop_after:
                    break
    return Exploration(variant, ran, total, time.monotonic() - started, failures)
