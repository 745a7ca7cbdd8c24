"""Data shapes shared by workflows and activities: pure pydantic, no I/O."""

from __future__ import annotations

import functools
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer


class TaskKind(StrEnum):
    """What a task is; core/kinds.py says what each kind may touch."""

    REFUND_TICKET = "refund_ticket"
    REFUND_REQUEST = "refund_request"
    SUPPLIER_PAYMENT = "supplier_payment"
    RETURN_PICKUP = "return_pickup"


class ToolClass(StrEnum):
    """How a tool may be retried; decides its retry policy and whether it needs a key."""

    READ = "read"
    IDEMPOTENT_WRITE = "idempotent_write"
    MONEY = "money"
    IRREVERSIBLE = "irreversible"


class Outcome(StrEnum):
    """The only four answers a write tool gives."""

    PERFORMED = "performed"
    ALREADY_PERFORMED = "already_performed"
    NOT_PERFORMED = "not_performed"
    UNKNOWN = "unknown"


SETTLED = (Outcome.PERFORMED, Outcome.ALREADY_PERFORMED)

TaskState = Literal[
    "running", "awaiting_human", "completed", "dead_lettered", "cancelled"
]


_EMPTY: tuple[Any, ...] = (None, "", [], {})


@functools.cache
def _empty_by_default(cls: type[BaseModel]) -> frozenset[str]:
    """The fields whose default is empty (None, "", [] or {})."""
    return frozenset(name for name, info in cls.model_fields.items()
                     if not info.is_required() and info.get_default(call_default_factory=True) in _EMPTY)


class Compact(BaseModel):
    """A model whose JSON leaves out fields that are empty and empty by default: they read back as
    the same defaults. For what the event history repeats (every model turn carries the transcript
    window; every result the checkpoint)."""

    @model_serializer(mode="wrap")
    def _without_empty(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        empty = _empty_by_default(type(self))
        return {k: v for k, v in data.items() if k not in empty or v not in _EMPTY}


class ToolCall(BaseModel):
    """A tool call as a model emits it: arguments are the raw JSON text."""

    id: str
    name: str
    arguments: str = "{}"


class ChatMessage(Compact):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


class ToolSchema(BaseModel):
    """Provider-neutral tool description (JSON Schema parameters)."""

    name: str
    description: str
    parameters: dict[str, Any]


class TaskInput(Compact):
    """Starts one agent task. `facts` come from our systems, never from the model.

    Authority (approvers, ceilings, the escalation deadline, the tools) comes from the worker's
    configuration; the optional fields below can only narrow it (core/authority.py `narrow`).
    """

    task_id: str
    scenario: str
    kind: TaskKind
    brief: str
    facts: dict[str, str] = Field(default_factory=dict)
    max_turns: int = 40
    model_options: dict[str, Any] = Field(default_factory=dict)
    escalation_timeout_seconds: int | None = Field(default=None, gt=0, description="narrows the worker's")
    approvers: list[str] | None = Field(default=None, description="narrows the worker's approvers")
    tools: list[str] | None = Field(default=None, description="narrows the kind's tools")
    refund_ceiling_cents: int | None = Field(default=None, ge=0, description="narrows the worker's")
    payment_ceiling_cents: int | None = Field(default=None, ge=0, description="narrows the worker's")
    max_asks_per_call: int = Field(default=3, gt=0, description="asks of one intent before a human decides")
    max_unusable_replies: int = Field(default=3, gt=0, description="replies in a row with no usable tool call")
    redrive_of: str | None = None
    status_in_message_keys: bool | None = Field(
        default=None, description="set by a redrive, or a start of a ticket whose run failed or was stopped: "
                                  "whether the task began with messages' money status in their intent keys "
                                  "(None: as the run decides)")
    window_messages: int = Field(default=40, ge=4, description="transcript messages sent to the model per turn")
    max_history_events: int = Field(default=4000, gt=0, description="continue as new past this many events")
    max_history_bytes: int = Field(default=1_500_000, gt=0, description="continue as new past this size")
    carry: Carry | None = Field(default=None, description="state carried over a continue-as-new")


Decision = Literal["approve", "reject", "mark_performed", "mark_not_performed", "abort"]
EscalationReason = Literal["unknown_outcome", "approval_required", "attempts_exhausted", "model_request",
                           "unusable_model_output"]


class ResolveInput(BaseModel):
    """A human decision on the one call named by its intent key, signed by an approver.

    The signature (Ed25519, base64) covers every other field (core/authority.py `signed_message`),
    so it binds the decision to one task, one question about one intent key, and an expiry; the
    nonce makes it usable once. Every field is bounded: nothing a sender writes can grow the checkpoint.
    """

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(default="", max_length=200)
    intent_key: str = Field(min_length=1, max_length=200)
    decision: Decision
    decided_by: str = Field(min_length=1, max_length=254)
    note: str = Field(default="", max_length=1000)
    provider_ref: str | None = Field(default=None, max_length=200, description="required by mark_performed")
    question: int | None = Field(default=None, ge=1, le=1_000_000,
                                 description="the question it answers: the task's waiting_for.question")
    expires_at: str = Field(default="", max_length=40, description="ISO 8601 UTC, e.g. 2026-12-01T06:00:00Z")
    nonce: str = Field(default="", max_length=64)
    signature: str = Field(default="", max_length=200)

    @model_serializer(mode="wrap")
    def _question_only_when_named(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A decision naming no question is written as before questions were numbered: a worker from before
        # takes it (its decisions forbid unknown fields), and its signed bytes are the same.
        data: dict[str, Any] = handler(self)
        if data.get("question") is None:
            data.pop("question", None)
        return data


class DecisionReceipt(BaseModel):
    intent_key: str
    decision: Decision
    decided_by: str
    state: str


DecisionStatus = Literal["applied", "ignored", "refused"]
DecisionVia = Literal["signal", "update", "provider_check", "world_check"]


class DecisionRecord(BaseModel):
    """A decision received, applied or not, with who sent it and why it was not applied."""

    received_at: str
    via: DecisionVia = Field(
        default="signal", description="how it came; provider_check: a mark_performed / mark_not_performed that"
                                      " was applied, then refused because the provider's records contradict it;"
                                      " world_check: a decision refused when applied because the ledger and the"
                                      " provider show the intent performed")
    status: DecisionStatus
    why: str | None = None
    decision: ResolveInput | None = None
    raw: str | None = Field(default=None, description="the first characters of an unreadable payload")


class Escalation(BaseModel):
    """What the task waits for: one call, the reason, the decisions that apply."""

    intent_key: str
    tool: str
    arguments: dict[str, Any]
    reason: EscalationReason
    detail: str
    since: str
    deadline: str
    allowed: list[Decision]
    world: str | None = Field(default=None, description="what the ledger and the provider showed, and when, "
                                                         "just before the person was asked")
    ran: bool = Field(default=False, description="asked after the call ran (its outcome is in question), "
                                                 "not before it")
    question: int = Field(default=0, description="the task's count of questions when this one was asked (1, 2, "
                                                 "...): a decision names the question it answers. 0: asked before "
                                                 "questions were numbered, and any decision on its key answers it")


class Approval(BaseModel):
    intent_key: str
    decided_by: str


class Policy(BaseModel):
    """A task's authority, from the worker's configuration, narrowed by the task input."""

    kind: TaskKind
    tools: list[str]
    approvers: list[str]
    refund_ceiling_cents: int
    payment_ceiling_cents: int | None = Field(description="None: the deployment sets no payment ceiling")
    escalation_timeout_seconds: int
    parties: list[str] = Field(default_factory=list, description="addresses a message may go to")
    approver_keys: dict[str, str] = Field(default_factory=dict, description="the approvers' public keys at the "
                                          "task's start: a decision they sign skips the queue of signature checks")


class PolicyInput(BaseModel):
    task_id: str
    kind: TaskKind
    facts: dict[str, str]
    redrive_of: str | None = None  # the run a redrive starts again: its dead letter is marked redriven


class VerifyInput(BaseModel):
    decision: ResolveInput


class Verdict(BaseModel):
    valid: bool
    why: str | None = None


AlertKind = Literal["escalation", "escalation_withdrawn", "dead_letter", "reconciliation"]


class AlertInput(BaseModel):
    alert_key: str
    task_id: str
    kind: AlertKind
    reason: str
    intent_key: str | None = None
    summary: str
    checkpoint: dict[str, Any] = Field(default_factory=dict)


class DeadLetterInput(BaseModel):
    task_id: str
    run_id: str
    reason: str
    checkpoint: dict[str, Any]


class SettleInput(BaseModel):
    """A human's word on an intent's fate, written to the ledger."""

    task_id: str
    tool: str
    intent_key: str
    arguments: dict[str, Any]
    status: Literal["performed", "not_performed"]
    provider_ref: str | None = None
    decided_by: str
    note: str = ""


class SettleVerdict(BaseModel):
    """Whether a human's word on an intent was recorded: it must agree with the provider's records."""

    applied: bool
    why: str | None = None


class InspectInput(BaseModel):
    """One intent to read in the ledger and at the provider, before a person is asked or answered."""

    task_id: str
    tool: str
    intent_key: str
    arguments: dict[str, Any]


WorldStatus = Literal["performed", "not_performed", "in_flight", "unknown"]


class IntentView(BaseModel):
    """What the world shows for one intent at `read_at`.

    performed      the provider (or, for messages, the outbox) holds it: settled.
    not_performed  nothing was claimed, or nothing can land any more and the provider shows nothing.
    in_flight      a request may still land until `until`; ask again after it.
    unknown        the records cannot settle it (the provider cannot be read): a person decides.
    """

    status: WorldStatus
    read_at: str
    detail: str
    provider_ref: str | None = None
    amount_cents: int | None = None
    task_id: str | None = Field(default=None, description="the task whose request performed it")
    until: float | None = Field(default=None, description="epoch seconds: the settle horizon of a request in flight")
    unreadable: bool = Field(default=False, description="unknown because the provider could not be read")
    recheck_seconds: float | None = Field(default=None, description="unknown, and the records may settle it later "
                                          "without anyone (a late landing, the provider readable again): read again "
                                          "after this")
    final: bool = Field(default=False, description="not performed for good: the provider holds the intent's request "
                                                   "as failed or canceled, and sending it again makes nothing")


class AskInput(BaseModel):
    """Read the world on one intent and, in the same attempt, ask a person only if it leaves the intent
    open: what settled between a separate read and the ask would otherwise be put to someone."""

    intent: InspectInput
    alert: AlertInput
    not_done_settles: bool = Field(default=False, description="a not_performed read settles the call")


class AskAnswer(BaseModel):
    world: IntentView
    asked: bool = Field(description="the alert was delivered, after the read")
    failure: str | None = Field(default=None, description="why delivery failed: the workflow retries it")


class ModelTurnInput(Compact):
    """A bounded window of the transcript and the names of the tools offered.

    The activity expands tool names to schemas from the registry, so history does not carry
    the same schemas on every turn.
    """

    task_id: str
    scenario: str
    turn: int
    messages: list[ChatMessage]
    tools: list[str]
    model_options: dict[str, Any] = Field(default_factory=dict)


class ModelReply(BaseModel):
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ToolInput(Compact):
    """What a tool activity receives: validated arguments, the intent key, any approval."""

    task_id: str
    tool: str
    arguments: dict[str, Any]
    intent_key: str | None = None
    approval: Approval | None = None
    ceiling_cents: int | None = Field(default=None, description="the task's own approval ceiling, where it narrows "
                                                                "the worker's: counted over totals with the claim")


class ToolResult(BaseModel):
    """A tool's answer. Write tools always set `outcome`; reads leave it None."""

    tool: str
    outcome: Outcome | None = None
    intent_key: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    reason: str | None = None
    message: str | None = None
    retryable: bool = False
    attempt: int = 1

    @property
    def ok(self) -> bool:
        if self.outcome is None:
            return self.reason is None
        return self.outcome in SETTLED


class Step(Compact):
    """One tool call in the checkpoint, keyed by step name."""

    tool: str
    status: Literal["running", "done", "not_performed", "unknown", "rejected"]
    intent_key: str | None = None
    attempts: int = 0
    outcome: Outcome | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any] = Field(default_factory=dict)
    reason: str | None = None
    asks: int = Field(default=0, description="times the model asked for this call")
    unsettled_asks: int = Field(default=0, description="asks not answered performed or already_performed")
    trail: list[str] = Field(default_factory=list, description="for people: one line per answer")


class Checkpoint(Compact):
    task_id: str
    scenario: str
    state: TaskState = "running"
    turns: int = 0
    steps: dict[str, Step] = Field(default_factory=dict)
    final_answer: str | None = None
    waiting_for: Escalation | None = None
    escalations: int = 0
    policy: Policy | None = None
    decisions: list[DecisionRecord] = Field(default_factory=list, description="the latest decisions received")
    decision_counts: dict[str, int] = Field(default_factory=dict, description="all decisions received, by status")
    used_nonces: list[str] = Field(default_factory=list, description="nonces of applied decisions")
    dead_letter_reason: str | None = None
    alert_failures: list[str] = Field(default_factory=list)
    runs: int = Field(default=1, description="runs of this task, counting continue-as-new")
    calls: dict[str, int] = Field(default_factory=dict, description="calls per tool, for step names")
    compacted_steps: int = Field(default=0, description="read steps dropped from view at continue-as-new")
    status_in_message_keys: bool = Field(default=False, description="a message's money status is part of its "
                                         "intent key: decided at the task's first run, kept for its life")
    updated_at: str | None = None


class TaskResult(BaseModel):
    task_id: str
    state: TaskState
    final_answer: str | None
    checkpoint: Checkpoint


ToolInput.model_rebuild()


class Carry(BaseModel):
    """What a task takes across continue-as-new: its checkpoint, effect journal and a compacted transcript."""

    checkpoint: Checkpoint
    journal: dict[str, ToolResult]
    step_by_key: dict[str, str]
    transcript: list[ChatMessage]
    turn: int
    resume: list[ToolCall] = Field(default_factory=list, description="the calls of the last reply still to answer: "
                                                                      "a run that continued as new while waiting")


TaskInput.model_rebuild()


class ReconcileInput(BaseModel):
    stale_after_seconds: int = Field(default=900, gt=0, description="an `intent` row older than this is a finding")


class Finding(BaseModel):
    kind: Literal["duplicate", "orphan_provider_effect", "performed_unknown_to_provider", "failed_at_provider",
                  "stale_intent"]
    intent_key: str | None = None
    provider_refs: list[str] = Field(default_factory=list)
    detail: str


class ReconcileReport(BaseModel):
    checked_ledger_rows: int
    checked_provider_effects: int
    findings: list[Finding]
