"""The effect protocol: a side effect at a provider at most once per intent and per budget.

Any counted effect: a refund holds its amount in cents against an item and an order, a courier
booking holds one pickup against an item whose limit is one.

    read -> claim -> fence -> send -> settle

read    the provider's own records for the resource (one list call: read-after-write
        consistent). The intent's key found there means performed, whatever the ledger says.
claim   in one ledger transaction: the intent row (a fencing token), the amount held against
        each business resource, the approval ceiling over totals (activities/ledger.py).
fence   a request leaves only before the attempt's send-by time (activities/payments.py):
        a process paused between claim and send that wakes up late sends nothing.
send    one request carrying the intent key as idempotency key and in metadata.
settle  performed / not_performed / unknown, written under the attempt's fence.

What a provider promises decides what an ambiguous send (timeout, dropped connection, 5xx)
costs. Where it honours idempotency keys, resending the same key is safe: verify, then retry
at once. Where it does not, no second request for an intent leaves while an earlier one may
still land: the earlier one's settle horizon (its send-by time plus the request timeout plus the
provider's processing window) must pass first; then the provider is asked again. Found:
performed. Not found: nothing will land, and this attempt may send. Cannot say on the last
attempt: unknown, and a human decides.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict

import stripe
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.faults import crash_point
from activities.ledger import (
    Busy,
    Claimed,
    Doubtful,
    Effect,
    EffectLedger,
    Hold,
    HumanWord,
    MayLandLate,
    NeedsApproval,
    OverBudget,
    Request,
    Settled,
    Superseded,
)
from activities.payments import NotSent, send_before
from core.models import IntentView, Outcome, SettleInput, SettleVerdict, ToolInput, ToolResult, WorldStatus
from infra.redact import redact


class ProviderError(Exception):
    """What a gateway to a provider other than Stripe raises (Stripe's SDK has its own tree)."""


class Rejected(ProviderError):
    """The provider refused the request, or it never left: nothing changed."""


class Ambiguous(ProviderError):
    """The request may have landed: a timeout after sending, a dropped connection, a 5xx. `answered`: the
    provider answered it (a 5xx), so it is no longer on its way."""

    def __init__(self, message: str, answered: bool = False) -> None:
        super().__init__(message)
        self.answered = answered


AMBIGUOUS = (stripe.APIConnectionError, stripe.APIError, Ambiguous)
PROVIDER_ERRORS = (stripe.StripeError, ProviderError)
NOTHING_MOVED = frozenset({"failed", "canceled", "requires_payment_method"})  # a refund's, a payment's
log = logging.getLogger("agent.effects")


@dataclass(frozen=True)
class ProviderTerms:
    """What the provider promises, from configuration; the safe default assumes no key dedupe."""

    honours_keys: bool = False
    request_timeout_seconds: float = 5.0
    processing_window_seconds: float = 30.0
    lease_seconds: float = 5.0

    def horizon(self, send_by: float) -> float:
        """After this, no request that left before `send_by` can still land."""
        return send_by + self.request_timeout_seconds + self.processing_window_seconds


@dataclass(frozen=True)
class Ask:
    """Which step of a task's workflow touches an intent: the workflow (`caller`) and when Temporal
    scheduled the step's activity (`generation`). A workflow schedules a call's next ask, its reading of
    the world and a person's word only after the earlier ask ended, so later steps have later
    generations, across continue-as-new too; the ledger refuses an attempt of an earlier ask."""

    caller: str
    generation: float

    @classmethod
    def current(cls) -> Ask | None:
        """The running activity's, or None outside one."""
        if not activity.in_activity():
            return None
        info = activity.info()
        return cls(info.workflow_id or info.activity_id, info.scheduled_time.timestamp())


@dataclass(frozen=True)
class Attempt:
    """One attempt of one tool call: the call (workflow run, activity), Temporal's attempt number, and
    the ask it belongs to (None: not fenced by asks)."""

    call: str
    number: int
    last: bool
    ask: Ask | None = None

    @classmethod
    def current(cls) -> Attempt:
        info = activity.info()
        limit = info.retry_policy.maximum_attempts if info.retry_policy else 1
        return cls(f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}", info.attempt,
                   bool(limit) and info.attempt >= limit, Ask.current())


@dataclass(frozen=True)
class ProviderEffect:
    """The provider's record of one effect (a refund, a payment) and the resources it consumed."""

    ref: str
    amount_cents: int
    intent_key: str | None
    resources: tuple[str, ...]
    status: str


@dataclass(frozen=True)
class Intent:
    """One counted effect as a tool declares it: the call, what it holds, how to read and send it.

    `amount` is in the resources' units (cents for money, pickups for a courier booking).

    The first hold is the intent's subject (the item, the invoice): when an earlier effect
    already used all of it, the call is answered already_performed with that effect.
    """

    call: ToolInput
    key: str  # the call's intent key, required before an effect is declared (activities/tools.py require_key)
    amount: int
    holds: tuple[Hold, ...]
    records: Callable[[], list[ProviderEffect]]
    send: Callable[[], ProviderEffect]
    ceiling_cents: int | None = None


class _Earlier(TypedDict):
    """An earlier performed effect that holds the resource, as a tool's answer names it."""

    provider_ref: str | None
    amount_cents: int | None
    task_id: str


class Effects:
    def __init__(self, ledger: EffectLedger, terms: ProviderTerms, clock: Callable[[], float] = time.time) -> None:
        """`clock` gives epoch seconds: the wall clock, or a simulator's (devstack/sim runs this same code)."""
        self._ledger = ledger
        self._terms = terms
        self._clock = clock

    def perform(self, intent: Intent, attempt: Attempt | None = None) -> ToolResult:
        """The one path of every counted effect. Raises only to let Temporal retry this same call.
        `attempt` defaults to the running activity's."""
        attempt = attempt or Attempt.current()
        records = self._look(intent, attempt, "before sending", "found at the provider before sending")
        if isinstance(records, ToolResult):
            return records
        now = self._clock()
        send_by = now + self._terms.lease_seconds
        claim = self._ledger.claim(Request(
            intent_key=intent.key, task_id=intent.call.task_id, tool=intent.call.tool,
            arguments=intent.call.arguments, owner=attempt.call, attempt=attempt.number,
            amount_cents=intent.amount, holds=intent.holds, lease_until=send_by,
            horizon=self._terms.horizon(send_by), ceiling_cents=intent.ceiling_cents,
            approved=intent.call.approval is not None and intent.call.approval.intent_key == intent.call.intent_key,
            external_cents=self._external(records), takeover_after_lease=self._terms.honours_keys,
            caller=attempt.ask.caller if attempt.ask else None,
            generation=attempt.ask.generation if attempt.ask else None), now)
        if isinstance(claim, Settled):
            return self._answer_from_ledger(intent.call, attempt, claim.effect)
        if isinstance(claim, Superseded):
            return _To(intent.call, attempt).not_performed("superseded", f"{claim.why}: this attempt sends nothing")
        if isinstance(claim, Doubtful):
            return _To(intent.call, attempt).unknown("in_doubt", "an earlier attempt's outcome is unknown")
        if isinstance(claim, MayLandLate):
            return _To(intent.call, attempt).unknown(
                "may_land_late", f"an earlier request left and got no answer, and the provider, which ignores "
                f"idempotency keys, shows nothing of it past its settle horizon ({_clock(claim.effect.horizon)}); "
                "sending again would pay twice if it lands late, so nothing is sent")
        if isinstance(claim, Busy):
            return self._wait(intent.call, attempt, claim.effect, claim.until,
                              "another attempt holds this intent and its request may still land")
        if isinstance(claim, OverBudget):
            return self._over_budget(intent, attempt, claim)
        if isinstance(claim, NeedsApproval):
            return _To(intent.call, attempt).not_performed("approval_required",
                                  f"refunded in total with this call, {claim.scope} would reach {claim.total_cents} "
                                  f"cents, over the {claim.ceiling_cents} cents approval ceiling")
        return self._send(intent, attempt, claim)

    def decide(self, settle: SettleInput, records: list[ProviderEffect] | None,
               resources: tuple[str, ...], read_at: float | None = None, ask: Ask | None = None) -> SettleVerdict:
        """A human's word on an intent, checked against the provider's records before the ledger
        keeps it. `resources` are the intent's (its subject first); no records: not a provider effect.
        `read_at`: when the records were read (a not_performed needs them read after the horizon).
        `ask`: the workflow step recording it; every earlier ask's attempts are stale from then on."""
        if ask is not None:
            self._ledger.advance(settle.intent_key, ask.caller, ask.generation)
        found = None
        if records is not None:
            why = self._contradiction(settle, records, resources)
            if why is not None:
                log.warning("human decision refused", extra={"intent_key": settle.intent_key, "why": why})
                return SettleVerdict(applied=False, why=why)
            found = next((r for r in records if r.ref == settle.provider_ref), None)
        effect = self._ledger.decided(HumanWord(
            settle.intent_key, settle.status, settle.provider_ref, found.amount_cents if found else None,
            {"decided_by": settle.decided_by, "note": settle.note[:500], "source": "human"},
            settle.task_id, settle.tool, settle.arguments, f"human:{settle.decided_by}",
            resources if records is not None else ()),
            expected=("intent", "unknown", "not_performed"), as_of=read_at if records is not None else None)
        as_of = min(self._clock(), read_at) if records is not None and read_at is not None else self._clock()
        if effect.status != settle.status and settle.status == "not_performed" and effect.horizon > as_of:
            return SettleVerdict(applied=False, why=f"a request of this intent may still land until "
                                                    f"{_clock(effect.horizon)}: nothing is decided before then")
        if effect.status != settle.status or (found and effect.provider_ref != found.ref):
            return SettleVerdict(applied=False, why=f"the ledger holds this intent as {effect.status} "
                                                    f"({effect.provider_ref}); performed is final")
        return SettleVerdict(applied=True)

    def inspect(self, key: str, records: Callable[[], list[ProviderEffect]] | None,
                ask: Ask | None = None) -> IntentView:
        """What the ledger and the provider show for an intent now: read before a person is asked about
        it and before their answer is kept. `records` is None for effects with no provider to read (the
        outbox commits with the ledger row). Moves the ledger only towards what the provider shows.
        `ask`: the workflow step reading it; the workflow has moved past every earlier ask, whose
        attempts claim nothing from now on (a not_performed read here may be told to the customer)."""
        if ask is not None:
            self._ledger.advance(key, ask.caller, ask.generation)
        now = self._clock()
        row = self._ledger.get(key)
        mine, unreadable = None, None
        if records is not None and row is not None and row.status != "performed":
            try:
                mine = self._mine(records(), key)
            except PROVIDER_ERRORS as err:
                unreadable = describe(err)
        if mine is not None and not moved(mine):
            self._ledger.failed(key, mine.ref, {"status": mine.status, "verified_by": "inspection",
                                                "reason": "provider_failed"})
            return _view("not_performed", now, f"the provider holds it as {mine.ref}, {mine.status}: no money moved",
                         final=True)
        if mine is not None:
            row = self._ledger.found(key, mine.ref, mine.amount_cents,
                                     {"status": mine.status, "verified_by": "inspection"}) or row
            return _held(now, f"the provider holds it as {mine.ref} ({mine.amount_cents})", mine.ref,
                         mine.amount_cents, row.task_id if row else None)
        if row is None:
            return _view("not_performed", now, "no request of it was ever claimed")
        if row.status == "performed":
            return _held(now, f"the ledger holds it as performed ({row.provider_ref})", row.provider_ref,
                         row.amount_cents, row.task_id)
        if row.status == "not_performed":  # only a definite answer or a person after the horizon writes it
            return _view("not_performed", now, "the ledger holds it as not performed")
        if row.horizon > now:
            return _view("in_flight", now, f"a request may still land until {_clock(row.horizon)}",
                         until=row.horizon)
        # Unknown, but the provider may yet show it: read again a processing window later (the workflow
        # doubles the wait each time), and a person asked meanwhile is no longer needed if it does.
        recheck = max(1.0, self._terms.processing_window_seconds)
        if records is None or unreadable is not None:
            view = _view("unknown", now, f"the ledger holds it as {row.status} and the provider's records cannot be "
                                         f"read{': ' + unreadable if unreadable else ''}",
                         recheck=recheck if records is not None else None)
            return view.model_copy(update={"unreadable": records is not None})
        if row.unanswered and not self._terms.honours_keys:
            if row.status == "intent":
                self._ledger.unknown(row, {"reason": "may_land_late", "verified_by": "inspection"})
            return _view("unknown", now, f"a request of it left and got no answer, and the provider, which ignores "
                                         f"idempotency keys, shows nothing of it past its horizon "
                                         f"({_clock(row.horizon)}): it may still land late; only a person can say",
                         recheck=recheck)
        self._ledger.unseen(row, {"reason": "not_found_after_horizon", "verified_by": "inspection"}, now)
        return _view("not_performed", now, f"the provider shows nothing of it after its horizon "
                                           f"({_clock(row.horizon)})")

    def _contradiction(self, settle: SettleInput, records: list[ProviderEffect],
                       resources: tuple[str, ...]) -> str | None:
        mine = self._mine(records, settle.intent_key)
        if settle.status == "not_performed":
            return f"the provider holds this intent as {mine.ref}: it was performed" if mine and moved(mine) else None
        if mine is not None and moved(mine) and mine.ref != settle.provider_ref:
            return f"the provider holds this intent as {mine.ref}, not {settle.provider_ref}"
        record = next((r for r in records if r.ref == settle.provider_ref), None)
        if record is None:
            return f"the provider has no effect {settle.provider_ref} on {resources[0]}"
        if record.intent_key and record.intent_key != settle.intent_key:
            # Another intent's request made it, and its worker may not have recorded it yet (found by
            # devstack/sim: the ledger's by_ref below cannot see it then).
            return f"{record.ref} was made for intent {record.intent_key}, not this one"
        if record.resources[:1] != resources[:1] and not (record.resources and record.resources[0] in resources[1:]):
            return f"{record.ref} is an effect on {record.resources[0] if record.resources else 'nothing of ours'}, " \
                   f"not on {resources[0]}"
        wanted = settle.arguments.get("amount_cents")
        if wanted is not None and record.amount_cents != wanted:
            return f"{record.ref} is {record.amount_cents} cents; this intent is {wanted} cents"
        if record.status not in ("succeeded", "pending"):
            return f"{record.ref} is {record.status}"
        taken = [e.intent_key for e in self._ledger.by_ref(record.ref) if e.intent_key != settle.intent_key]
        if taken:
            return f"{record.ref} is already recorded for intent {taken[0]}"
        return None

    # --- steps ----------------------------------------------------------------------------

    def _send(self, intent: Intent, attempt: Attempt, claim: Claimed) -> ToolResult:
        effect = claim.effect
        if claim.previous is not None and claim.previous.status == "intent":
            # Taken over from an attempt whose horizon has passed: whatever it sent has landed by now.
            answer = self._look(intent, attempt, "after taking the intent over",
                                "an earlier attempt's request landed")
            if isinstance(answer, ToolResult):
                return answer
        crash_point(f"{intent.call.tool}:before_provider")
        if not self._ledger.leaving(effect, self._clock()):
            return _To(intent.call, attempt).not_performed("superseded", "another attempt took the intent over "
                                                           "before this one's request left: it sends nothing")
        try:
            with send_before(effect.lease_until):
                sent = intent.send()
        except NotSent as err:
            if self._earlier_may_land(claim):
                self._ledger.release(effect)  # nothing is decided before the earlier request's horizon
            else:
                self._ledger.not_performed(effect, {"reason": "not_sent", "message": str(err)})
            raise ApplicationError(str(err), type="NotSent") from None
        except AMBIGUOUS as err:
            if getattr(err, "http_status", None) is not None or getattr(err, "answered", False):
                self._ledger.answered(effect, self._clock())
            return self._after_ambiguous(intent, attempt, effect, describe(err))
        except PROVIDER_ERRORS as err:
            message = redact(str(getattr(err, "user_message", None) or describe(err)))
            if self._earlier_may_land(claim):  # refusing this request says nothing of the earlier one
                return self._after_ambiguous(intent, attempt, effect, f"{message} (an earlier request may land)")
            self._ledger.not_performed(effect, {"reason": "provider_rejected", "message": message})
            return _To(intent.call, attempt).not_performed("provider_rejected", message)
        crash_point(f"{intent.call.tool}:after_provider")
        if sent.status in NOTHING_MOVED:
            if self._earlier_may_land(claim):  # this request moved nothing; the earlier one may yet
                return self._after_ambiguous(intent, attempt, effect, f"{sent.ref} is {sent.status} (an earlier "
                                                                      "request may land)")
            self._ledger.not_performed(effect, {"status": sent.status, "reason": "provider_failed"}, ref=sent.ref)
            return _failed(intent.call, attempt, ProviderEffect(sent.ref, sent.amount_cents, intent.key, (),
                                                                sent.status))
        self._ledger.performed(effect, sent.ref, sent.amount_cents, {"status": sent.status})
        return _To(intent.call, attempt).performed(
            Outcome.PERFORMED, {"provider_ref": sent.ref, "amount_cents": sent.amount_cents, "status": sent.status})

    def _earlier_may_land(self, claim: Claimed) -> bool:
        """This attempt took the intent over from a holder whose request may still land (a provider that
        honours keys lets the lease go before the horizon): found by devstack/sim, where a not_performed
        written then freed the item's budget for another intent and the late request over-refunded it."""
        previous = claim.previous
        return previous is not None and previous.status == "intent" and previous.sent_at is not None \
            and previous.horizon > self._clock()

    def _after_ambiguous(self, intent: Intent, attempt: Attempt, effect: Effect, error: str) -> ToolResult:
        """The request may or may not have landed: ask, never guess, never resend blind."""
        try:
            mine = self._mine(intent.records(), intent.call.intent_key)
        except PROVIDER_ERRORS as err:
            mine, error = None, f"{error}; the lookup failed: {describe(err)}"
        if mine is not None:
            return self._found(intent, attempt, mine, error)
        if not self._terms.honours_keys:
            # Not found means nothing yet: the request may still be on its way to the provider.
            return self._wait(intent.call, attempt, effect, effect.horizon,
                              f"{error}; the request may still land until its settle horizon")
        if attempt.last:
            self._ledger.unknown(effect, {"reason": "unverified", "message": error})
            return _To(intent.call, attempt).unknown("unverified", f"{error}; the provider shows no effect yet")
        self._ledger.release(effect)  # the same key again is safe: the provider dedupes it
        raise ApplicationError(f"{error}; not found yet; resending the same key", type="OutcomeUnverified")

    def _wait(self, call: ToolInput, attempt: Attempt, effect: Effect, until: float, why: str) -> ToolResult:
        """Let Temporal run this call again once `until` has passed; on the last attempt, unknown."""
        if attempt.last:
            self._ledger.unknown(effect, {"reason": "unsettled", "message": why})
            return _To(call, attempt).unknown("unsettled", why)
        delay = max(0.5, until - self._clock() + 0.25)
        raise ApplicationError(f"{why}; asking the provider again in {delay:.1f} s", type="OutcomeUnverified",
                               next_retry_delay=timedelta(seconds=delay))

    def _look(self, intent: Intent, attempt: Attempt, when: str, how: str) -> list[ProviderEffect] | ToolResult:
        """The provider's records, or the answer they give: this intent is there, or they cannot be read."""
        records = self._read(intent, attempt, when)
        if isinstance(records, ToolResult):
            return records
        for record in records:
            if not moved(record):
                self._ledger.failed_after(record.ref, {"reason": "failed_after_performed", "status": record.status,
                                                       "provider_ref": record.ref, "verified_by": "lookup"})
        mine = self._mine(records, intent.call.intent_key)
        return self._found(intent, attempt, mine, how) if mine is not None else records

    def _read(self, intent: Intent, attempt: Attempt, when: str) -> list[ProviderEffect] | ToolResult:
        try:
            return intent.records()
        except PROVIDER_ERRORS as err:
            why = f"could not read the provider's records {when}: {describe(err)}"
        if not attempt.last:
            raise ApplicationError(why, type="OutcomeUnverified")
        effect = self._ledger.get(intent.key)
        if effect is None or effect.status == "not_performed":
            return _To(intent.call, attempt).not_performed("provider_unavailable", why, retryable=True)
        if effect.status == "performed":
            return self._answer_from_ledger(intent.call, attempt, effect)
        if effect.status == "intent":
            self._ledger.unknown(effect, {"reason": "unverifiable", "message": why})
        return _To(intent.call, attempt).unknown("unverifiable", why)

    def _found(self, intent: Intent, attempt: Attempt, found: ProviderEffect, how: str) -> ToolResult:
        call = intent.call
        if not moved(found):
            row = self._ledger.failed(intent.key, found.ref, {"status": found.status, "verified_by": "lookup",
                                                              "reason": "provider_failed"})
            if row is not None and row.status == "performed":  # a person recorded its effect: another record
                return self._answer_from_ledger(call, attempt, row)
            return _failed(call, attempt, found)
        effect = self._ledger.found(intent.key, found.ref, found.amount_cents,
                                    {"status": found.status, "verified_by": "lookup"})
        mine = effect is None or effect.owner == attempt.call  # `found` never changes the owner
        outcome = Outcome.PERFORMED if mine and (effect is None or effect.provider_ref == found.ref) \
            else Outcome.ALREADY_PERFORMED
        return _To(call, attempt).performed(outcome, {"provider_ref": found.ref, "amount_cents": found.amount_cents,
                                                      "status": found.status, "verified_by": "lookup", "after": how})

    def _answer_from_ledger(self, call: ToolInput, attempt: Attempt, effect: Effect) -> ToolResult:
        outcome = Outcome.PERFORMED if effect.owner == attempt.call else Outcome.ALREADY_PERFORMED
        return _To(call, attempt).performed(outcome, {"provider_ref": effect.provider_ref or "",
                                                      "amount_cents": effect.amount_cents or 0, "source": "ledger",
                                                      **effect.detail})

    def _over_budget(self, intent: Intent, attempt: Attempt, claim: OverBudget) -> ToolResult:
        call = intent.call
        if claim.in_flight:
            if attempt.last:
                return _To(call, attempt).not_performed("budget_in_flight",
                                      f"another intent on {claim.resource} is still in flight", retryable=True)
            raise ApplicationError(f"another intent on {claim.resource} is in flight", type="BudgetInFlight",
                                   next_retry_delay=timedelta(seconds=1))
        if claim.in_doubt:
            return _To(call, attempt).not_performed("budget_in_doubt",
                                  f"an earlier intent on {claim.resource} has an unknown outcome; a human decides it "
                                  "first")
        earlier: list[_Earlier] = [{"provider_ref": h.provider_ref, "amount_cents": h.amount_cents,
                                    "task_id": h.task_id} for h in claim.holders if h.status == "performed"]
        if claim.available_cents == 0 and claim.resource == intent.holds[0].resource:
            total = sum(e["amount_cents"] or 0 for e in earlier) + claim.external_cents
            return ToolResult(
                tool=call.tool, outcome=Outcome.ALREADY_PERFORMED, intent_key=call.intent_key, attempt=attempt.number,
                reason="done_earlier",
                message=f"{claim.resource} was already used in full ({total} of {claim.limit_cents} cents) by "
                        "earlier effects; nothing was sent",
                data={"provider_ref": earlier[0]["provider_ref"] if earlier else None, "amount_cents": total,
                      "earlier": earlier, "external_cents": claim.external_cents, "resource": claim.resource})
        return _To(call, attempt).not_performed("exceeds_budget",
                              f"{claim.resource} has {claim.available_cents} of {claim.limit_cents} cents left",
                              data={"available_cents": claim.available_cents, "earlier": earlier,
                                    "resource": claim.resource})

    def _mine(self, records: list[ProviderEffect], key: str | None) -> ProviderEffect | None:
        """The intent's record at the provider: one that moved money, else (at a provider that honours keys,
        where the intent's key only ever answers with that record) a failed or canceled one. At a provider
        that ignores keys a failed record says nothing of the intent's other requests, one of which may be
        on its way (found by review): it is no record of the intent at all."""
        mine = [r for r in records if key and r.intent_key == key]
        found = next((r for r in mine if moved(r)), None)
        if found is None and self._terms.honours_keys:
            found = next(iter(mine), None)
        return found

    def _external(self, records: list[ProviderEffect]) -> dict[str, int]:
        """Amounts the provider holds that no live hold of ours counts: they use up the budgets too. By
        resource: an intent performed with no hold on it (it landed after it was settled not performed,
        whose holds went back) is counted from the provider's record, as a refund made elsewhere is. A
        record that names no intent is ours when a person recorded it as an intent's effect."""
        unnamed = [r.ref for r in records if r.intent_key is None and moved(r)]
        recorded = self._ledger.keys_of(unnamed) if unnamed else {}  # most lists have none: no read
        keys = {r.ref: r.intent_key or recorded.get(r.ref) for r in records}
        held = self._ledger.live_holds([k for k in keys.values() if k])
        external: dict[str, int] = {}
        for record in records:
            if not moved(record):
                continue
            for resource in record.resources:
                if (keys[record.ref], resource) not in held:
                    external[resource] = external.get(resource, 0) + record.amount_cents
        return external


def describe(err: Exception) -> str:
    """A short name for a provider error: `ReadTimeoutError`, `APIError 500`."""
    if not isinstance(err, stripe.StripeError):
        return redact(f"{type(err).__name__}: {err}") if str(err) else type(err).__name__
    if isinstance(err, stripe.APIConnectionError) and err.__cause__ is not None:
        return type(err.__cause__).__name__
    return f"{type(err).__name__} {err.http_status}" if err.http_status else type(err).__name__


def _view(status: WorldStatus, now: float, detail: str, until: float | None = None,
          recheck: float | None = None, final: bool = False) -> IntentView:
    return IntentView(status=status, read_at=_clock(now), detail=detail, until=until, recheck_seconds=recheck,
                      final=final)


def _held(now: float, detail: str, ref: str | None, amount: int | None, task_id: str | None) -> IntentView:
    """Performed: the provider's (or the ledger's) reference and amount, and the task whose request it was."""
    return IntentView(status="performed", read_at=_clock(now), detail=detail, provider_ref=ref, amount_cents=amount,
                      task_id=task_id)


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def moved(record: ProviderEffect) -> bool:
    """The provider's record moved money or may still: everything but a failed or canceled one."""
    return record.status not in NOTHING_MOVED


def _failed(call: ToolInput, attempt: Attempt, record: ProviderEffect) -> ToolResult:
    return _To(call, attempt).not_performed(
        "provider_failed", f"the provider holds this request as {record.ref}, {record.status}: no money moved, "
                           "and this intent is not sent again",
        data={"provider_ref": record.ref, "status": record.status})


@dataclass(frozen=True)
class _To:
    """The answers one attempt of one call can give: performed (or already), not performed, unknown."""

    call: ToolInput
    attempt: Attempt

    def performed(self, outcome: Outcome, data: dict[str, Any]) -> ToolResult:
        """`data` holds the provider's reference and amount (`provider_ref`, `amount_cents`) and how we know."""
        return ToolResult(tool=self.call.tool, outcome=outcome, intent_key=self.call.intent_key,
                          attempt=self.attempt.number, data=data)

    def not_performed(self, reason: str, message: str, retryable: bool = False,
                      data: dict[str, Any] | None = None) -> ToolResult:
        return ToolResult(tool=self.call.tool, outcome=Outcome.NOT_PERFORMED, intent_key=self.call.intent_key,
                          reason=reason, message=message, retryable=retryable, attempt=self.attempt.number,
                          data=data or {})

    def unknown(self, reason: str, why: str) -> ToolResult:
        return ToolResult(tool=self.call.tool, outcome=Outcome.UNKNOWN, intent_key=self.call.intent_key,
                          reason=reason, message=f"{why}. It may have happened: do not retry; a human must check.",
                          retryable=False, attempt=self.attempt.number)
