"""Who may decide and what a task may touch: pure functions the workflow and the tests share.

Authority comes from the deployment. The worker's configuration names the approvers (with their
public keys), the ceilings, the escalation deadline and each kind's tools; `narrow` lets a task
input lower a ceiling, shorten a deadline or drop an approver or a tool, never the other way.

A decision is signed by an approver's Ed25519 key over `signed_message` (the task id, the intent
key, the question it answers, the decision, who decides, the note, the provider's reference, the
expiry and a nonce). The workflow checks what it can decide alone (`screen`: is it waiting for this
question, is this decision allowed, is the signer an approver, is it expired or replayed), then an
activity verifies the signature with the public key the worker holds (activities/authority.py).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from core.keys import canonical_json
from core.kinds import FACT_OF_ARGUMENT, KINDS, fact_values
from core.models import DecisionStatus, Escalation, Policy, ResolveInput, TaskInput

SIGNING_CONTEXT = b"agent-decision/v1\n"
MAX_DECISION_BYTES = 8192
DECISIONS_KEPT = 20


@dataclass(frozen=True)
class Ceilings:
    """The deployment's ceilings, in cents, above which a person approves: refunds counted per task,
    item and order; payments per task and invoice (None: the refund ceiling)."""

    refund_cents: int
    payment_cents: int | None = None


def signature_holds(decision: ResolveInput, public_key: str) -> bool:
    """Whether the decision's signature verifies with this base64 Ed25519 public key. Pure and
    deterministic, so the workflow can tell a forged decision from a signed one without an activity;
    never raises."""
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key, validate=True))
        key.verify(base64.b64decode(decision.signature, validate=True), signed_message(decision))
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False


def signed_message(decision: ResolveInput) -> bytes:
    """The bytes an approver signs: every field but the signature, as canonical JSON. A decision that
    names no question is signed as before questions were numbered, so what was signed then still holds."""
    fields = decision.model_dump(mode="json", exclude={"signature"})  # (without `question` when it names none)
    return SIGNING_CONTEXT + canonical_json(fields).encode()


def narrow(policy: Policy, task: TaskInput) -> Policy:
    """The worker's policy for this task, narrowed (never widened) by the task input."""
    def lower(mine: int | None, asked: int | None) -> int | None:
        return mine if asked is None else asked if mine is None else min(mine, asked)

    return policy.model_copy(update={
        "tools": [t for t in policy.tools if task.tools is None or t in task.tools],
        "approvers": [a for a in policy.approvers if task.approvers is None or a in task.approvers],
        "refund_ceiling_cents": lower(policy.refund_ceiling_cents, task.refund_ceiling_cents),
        "payment_ceiling_cents": lower(policy.payment_ceiling_cents, task.payment_ceiling_cents),
        "escalation_timeout_seconds": lower(policy.escalation_timeout_seconds, task.escalation_timeout_seconds),
    })


def out_of_scope(tool: str, arguments: dict[str, Any], facts: dict[str, str], policy: Policy,
                 narrowed: bool = True) -> str | None:
    """Why a call reaches beyond its task's facts or parties, or None when it stays inside.

    The order or invoice the kind binds must be the task's own; an item, payee or recipient must
    be one the facts name, where they name any (core/kinds.py). The gate answers the model with the
    reason (`out_of_scope`): what lies outside the facts is for a person to decide. `narrowed=False`
    checks the order, invoice and parties only, as before items were bound: for a workflow that
    replays a history recorded then (`workflow.patched`).
    """
    kind = KINDS[policy.kind]
    for field in kind.binds:
        if field in arguments and arguments[field] != facts.get(field):
            return f"{field} {arguments[field]!r} is not this task's ({facts.get(field)!r})"
    for field in ("order_id", "invoice_id"):
        if field in arguments and field not in kind.binds:
            return f"a {policy.kind} task does not act on an {field}"
    for field in kind.narrows if narrowed else ():
        fact = FACT_OF_ARGUMENT.get(field, field)
        named = fact_values(facts, fact)
        if field in arguments and named and _same(field, arguments[field]) not in {_same(field, v) for v in named}:
            return (f"{field} {str(arguments[field])[:80]!r} is not among this task's {fact} facts "
                    f"({', '.join(named)[:200]}): a call outside the task's facts needs a person (escalate_to_human)")
    if "to" in arguments and arguments["to"] not in policy.parties:
        return f"{arguments['to']!r} is not a party on record for this task"
    return None


def _same(field: str, value: Any) -> str:
    """How a narrowed argument compares with a fact: addresses without case, ids exactly."""
    return str(value).strip().lower() if field == "to" else str(value).strip()


def read_decision(data: bytes) -> ResolveInput | str:
    """A decision from a payload's bytes, or why it cannot be one. Never raises."""
    if len(data) > MAX_DECISION_BYTES:
        return f"a decision is at most {MAX_DECISION_BYTES} bytes; this one is {len(data)}"
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as err:
        return f"not JSON: {str(err)[:120]}"
    if not isinstance(raw, dict):
        return "a decision is a JSON object"
    try:
        return ResolveInput.model_validate(raw)
    except Exception as err:  # pydantic's ValidationError, or a RecursionError on deep nesting
        lines = str(err).splitlines()
        return f"malformed decision: {' '.join(lines[:3])[:300]}"


@dataclass(frozen=True)
class Waiter:
    """A task as a decision meets it: what it waits on, under which policy, and what it has used.
    `approvers_now`: the signer is checked against the worker's approvers later (see `screen`)."""

    task_id: str
    wait: Escalation | None
    policy: Policy | None
    used_nonces: list[str]
    approvers_now: bool = False
    task_approvers: list[str] | None = None


def screen(decision: ResolveInput, waiter: Waiter, now: datetime) -> tuple[DecisionStatus, str] | None:
    """What the workflow can tell alone: (status, why) when the decision cannot apply, else None.

    `ignored` is a decision for something not waiting (another call, or an earlier or later question
    about this one); `refused` is one that could apply but is not authenticated: unsigned, naming no
    question where the task numbers them, expired, replayed, for another task, or not from an approver.

    A decision names the question it answers (`Escalation.question`): a person decides on what they
    were shown, and a signed answer to one question is never applied to a later one about the same
    call, which another person may see differently (the world read since, a decision refused since).

    With `approvers_now` the signer is checked against the worker's approvers when the signature is
    (activities/authority.py), not against the list frozen at the task's start: an approver added
    since can decide, one removed cannot. Only the task's own narrowing (`task_approvers`) is
    checked here.
    """
    task_id, wait, policy, used_nonces = waiter.task_id, waiter.wait, waiter.policy, waiter.used_nonces
    approvers_now, task_approvers = waiter.approvers_now, waiter.task_approvers
    if wait is None:
        return "ignored", "the task is not waiting for a decision"
    if decision.intent_key != wait.intent_key:
        return "ignored", f"no call with key {decision.intent_key} is waiting; waiting: {wait.intent_key}"
    if decision.question is not None and decision.question != wait.question:
        if not wait.question:  # (a worker from before numbering ignored it as malformed: a replay does the same)
            return "ignored", (f"it answers question {decision.question}; this question was asked before questions "
                               "were numbered: sign one that names none")
        return "ignored", (f"it answers question {decision.question} about this call; the task now asks "
                           f"question {wait.question} ({wait.reason}, since {wait.since})")
    if decision.decision not in wait.allowed:
        return "ignored", f"{decision.decision} does not apply to {wait.reason}; allowed: {wait.allowed}"
    if decision.decision == "mark_performed" and not decision.provider_ref:
        return "ignored", "mark_performed needs provider_ref (the provider's id of the effect)"
    if not (decision.signature and decision.nonce and decision.expires_at):
        return "refused", "not signed: a decision needs expires_at, nonce and signature (starter.py sign)"
    if wait.question and decision.question is None:
        return "refused", (f"it names no question: a decision answers one (question {wait.question}, the task's "
                           f"waiting_for.question) and is signed over it (starter.py sign)")
    allowed = (task_approvers if approvers_now else policy.approvers if policy else None)
    if policy is None or (allowed is not None and decision.decided_by not in allowed):
        return "refused", f"{decision.decided_by[:80]!r} is not an approver of this task"
    if decision.task_id != task_id:
        return "refused", f"signed for task {decision.task_id[:80]!r}, not {task_id}"
    expires = parse_time(decision.expires_at)
    if expires is None:
        return "refused", "expires_at is not an ISO 8601 time"
    if expires <= now:
        return "refused", f"expired at {decision.expires_at}"
    if decision.nonce in used_nonces:
        return "refused", "replayed: this signed decision was applied already"
    return None


def parse_time(text: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
