"""The agent loop: model turn -> gated tool calls -> results back to the model.

Deterministic: every model turn and every tool call is an activity, so the event history
is the checkpoint and a restarted worker resumes at the first step not done. Where the
task cannot know or must not act alone, it waits for a human decision (signal `resolve`
or Update `decide`); a wait nobody answers ends as a stored, alerted dead letter.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from core import names, policies
    from core.gate import Rejection, validate_call
    from core.keys import call_signature, derive_intent_key
    from core.models import (
        SETTLED,
        AlertInput,
        Carry,
        Approval,
        ChatMessage,
        Checkpoint,
        DeadLetterInput,
        DecisionReceipt,
        DecisionRecord,
        Escalation,
        EscalationReason,
        ModelReply,
        ModelTurnInput,
        Outcome,
        ResolveInput,
        SettleInput,
        Step,
        TaskInput,
        TaskResult,
        ToolCall,
        ToolInput,
        ToolResult,
    )
    from core.tools import REGISTRY, ToolSpec
    from workflows._render import JOURNAL_NOTE, activity_summary, current_details, trail_line

SYSTEM_PROMPT = (
    "You are an operations agent. Use the tools. Every write tool answers performed, "
    "already_performed, not_performed (nothing changed; you may retry) or unknown "
    "(do not retry; a human decides). Never promise what a tool did not report as performed."
)

ALLOWED: dict[str, list[str]] = {
    "approval_required": ["approve", "reject", "abort"],
    "unknown_outcome": ["mark_performed", "mark_not_performed", "approve", "abort"],
    "attempts_exhausted": ["approve", "reject", "mark_performed", "mark_not_performed", "abort"],
    "model_request": ["approve", "reject", "abort"],
    "unusable_model_output": ["approve", "abort"],
}
OPS_TIMEOUT = timedelta(seconds=30)
_READ_STEPS_KEPT = 20
_UNUSABLE = ("unknown_tool", "invalid_arguments", "malformed_arguments")


class _Stop(Exception):
    """Ends the task early: aborted by a human, or a dead letter."""

    def __init__(self, state: str, reason: str) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason


@workflow.defn(name=names.WORKFLOW_NAME)
class AgentTaskWorkflow:
    @workflow.init
    def __init__(self, task: TaskInput) -> None:
        self._task = task
        self._decision: ResolveInput | None = None
        self._unusable = 0
        carry = task.carry
        if carry is None:
            self._checkpoint = Checkpoint(task_id=task.task_id, scenario=task.scenario)
            self._journal: dict[str, ToolResult] = {}
            self._step_by_key: dict[str, str] = {}
            self._transcript = [ChatMessage(role="system", content=SYSTEM_PROMPT),
                                ChatMessage(role="user", content=task.brief)]
            self._turn = 0
        else:
            self._checkpoint = carry.checkpoint
            self._checkpoint.runs += 1
            self._journal = dict(carry.journal)
            self._step_by_key = dict(carry.step_by_key)
            self._transcript = list(carry.transcript)
            self._turn = carry.turn

    @workflow.run
    async def run(self, task: TaskInput) -> TaskResult:
        self._set_state("running")
        try:
            final = await self._converse(task)
            self._checkpoint.final_answer = final
            self._set_state("completed")
        except _Stop as stop:
            self._checkpoint.final_answer = stop.reason
            if stop.state == "dead_lettered":
                await self._dead_letter(stop.reason)
            else:
                self._checkpoint.waiting_for = None
                self._set_state(stop.state)
        except asyncio.CancelledError:
            self._checkpoint.final_answer = "cancelled by an operator"
            self._set_state("cancelled")
        await workflow.wait_condition(workflow.all_handlers_finished)
        return TaskResult(task_id=task.task_id, state=self._checkpoint.state,
                          final_answer=self._checkpoint.final_answer, checkpoint=self._checkpoint)

    async def _converse(self, task: TaskInput) -> str:
        tools = sorted(REGISTRY)
        while self._turn < task.max_turns:
            if self._history_budget_spent(task):
                await self._continue_as_new(task)
            self._turn += 1
            turn = self._checkpoint.turns = self._turn
            try:
                reply: ModelReply = await workflow.execute_activity(
                    names.MODEL_TURN_ACTIVITY,
                    ModelTurnInput(task_id=task.task_id, scenario=task.scenario, turn=turn,
                                   messages=self._window(task), tools=tools, model_options=task.model_options),
                    result_type=ModelReply,
                    start_to_close_timeout=policies.MODEL_START_TO_CLOSE,
                    heartbeat_timeout=policies.TOOL_HEARTBEAT,
                    retry_policy=policies.MODEL_POLICY,
                    summary=f"model turn {turn}",
                )
            except ActivityError as err:
                raise _Stop("dead_lettered", f"model turn failed for good: {_cause(err)}") from None
            self._transcript.append(ChatMessage(role="assistant", content=reply.content,
                                                tool_calls=reply.tool_calls))
            if not reply.tool_calls:
                return reply.content
            usable = False
            for call in reply.tool_calls:
                result = await self._gate(task, call)
                usable = usable or result.reason not in _UNUSABLE
                self._transcript.append(ChatMessage(role="tool", tool_call_id=call.id, name=call.name,
                                                    content=result.model_dump_json(exclude_defaults=True)))
            self._transcript = self._compact(self._transcript, task.window_messages)
            self._unusable = 0 if usable else self._unusable + 1
            if self._unusable >= task.max_unusable_replies:
                await self._unusable_output(task, turn)
            self._touch()
        raise _Stop("dead_lettered", f"turn limit of {task.max_turns} reached without a final answer")

    async def _unusable_output(self, task: TaskInput, turn: int) -> None:
        """The model keeps calling tools that do not exist or with arguments that do not validate."""
        key = f"model-output:{task.task_id}:turn-{turn}"
        decision = await self._escalate("model_turn", {}, key, "unusable_model_output",
                                        f"{self._unusable} replies in a row with no usable tool call")
        if decision.decision == "abort":
            raise _Stop("cancelled", f"aborted by {decision.decided_by}: {decision.note}")
        self._unusable = 0

    # --- long runs -----------------------------------------------------------------------

    def _window(self, task: TaskInput) -> list[ChatMessage]:
        """What the model sees this turn: the system prompt, the task, the latest messages."""
        return self._compact(self._transcript, task.window_messages)

    @staticmethod
    def _compact(transcript: list[ChatMessage], window: int) -> list[ChatMessage]:
        """Keep the two pinned messages and the last `window`, never starting on an orphan tool result."""
        pinned, rest = transcript[:2], transcript[2:]
        if len(rest) <= window:
            return transcript
        rest = rest[-window:]
        while rest and rest[0].role == "tool":
            rest = rest[1:]
        return pinned + rest

    def _history_budget_spent(self, task: TaskInput) -> bool:
        info = workflow.info()
        return (info.is_continue_as_new_suggested()
                or info.get_current_history_length() > task.max_history_events
                or info.get_current_history_size() > task.max_history_bytes)

    async def _continue_as_new(self, task: TaskInput) -> None:
        """A fresh run with the journal, the checkpoint and a compacted transcript: keys stay settled."""
        await workflow.wait_condition(workflow.all_handlers_finished)
        checkpoint = self._checkpoint.model_copy(deep=True)
        reads = [name for name, step in checkpoint.steps.items() if step.intent_key is None]
        for name in reads[:-_READ_STEPS_KEPT]:
            del checkpoint.steps[name]
            checkpoint.compacted_steps += 1
        carry = Carry(checkpoint=checkpoint, journal=self._journal, step_by_key=self._step_by_key,
                      transcript=self._compact(self._transcript, task.window_messages), turn=self._turn)
        workflow.continue_as_new(task.model_copy(update={"carry": carry}))

    # --- the gate ------------------------------------------------------------------------

    async def _gate(self, task: TaskInput, call: ToolCall) -> ToolResult:
        """The one path every tool call takes: validate, key, dedupe, run, escalate, record."""
        checked = validate_call(call.name, call.arguments)
        if isinstance(checked, Rejection):
            return self._reject(call, checked.reason, checked.message)
        spec, arguments = checked

        key = None
        if spec.needs_key:
            key = derive_intent_key(spec.name, spec.key_fields, arguments, {"task_id": task.task_id},
                                    occurrence=self._occurrence(spec, arguments))
        step = self._step(spec.name, key, arguments)
        decision_key = key or f"call:{call_signature(spec.name, arguments)}"

        if key is not None and key in self._journal:
            result = ToolResult(tool=spec.name, outcome=Outcome.ALREADY_PERFORMED, intent_key=key,
                                data=self._journal[key].data, message=JOURNAL_NOTE)
            self._record(step, result)
            return result

        if spec.name == "escalate_to_human":
            result = await self._model_escalation(spec, arguments, key)
        elif key is not None and self._unsettled_asks(step) >= task.max_asks_per_call:
            result = await self._decide_and_run(task, spec, arguments, decision_key, step, "attempts_exhausted",
                                                f"asked {len(step.trail)} times without success", None)
        else:
            step.status = "running"
            self._touch()
            result = await self._run_tool(task, spec, arguments, key, None)
            step.attempts += result.attempt
            reason = _escalation_reason(spec, result)
            if reason is not None:
                result = await self._decide_and_run(task, spec, arguments, decision_key, step, reason,
                                                    result.message or result.reason or "", result)
        self._record(step, result)
        if key is not None and result.outcome in SETTLED:
            self._journal[key] = result
        return result

    async def _decide_and_run(self, task: TaskInput, spec: ToolSpec, arguments: dict, decision_key: str,
                              step: Step, reason: EscalationReason, detail: str, last: ToolResult | None
                              ) -> ToolResult:
        """Wait for a human on this exact call, then do what they decided; repeat if it escalates again.

        The decision names the call's intent key (reads: its canonical signature), so it applies to
        this tool with these arguments only; a call with other arguments has another key.
        """
        key = step.intent_key
        approval: Approval | None = None
        while True:
            if last is not None:
                self._record(step, last)
            decision = await self._escalate(spec.name, arguments, decision_key, reason, detail)
            if decision.decision == "abort":
                raise _Stop("cancelled", f"aborted by {decision.decided_by}: {decision.note}")
            if decision.decision == "reject":
                return ToolResult(tool=spec.name, outcome=Outcome.NOT_PERFORMED, intent_key=key,
                                  reason="rejected_by_human", message=f"{decision.decided_by}: {decision.note}",
                                  data={"source": "human", "decided_by": decision.decided_by})
            if decision.decision in ("mark_performed", "mark_not_performed"):
                if key is None:
                    return ToolResult(tool=spec.name, reason="marked_by_human", message=decision.note)
                return await self._settle(task, spec, arguments, key, decision)
            if reason == "approval_required":
                approval = Approval(intent_key=key, decided_by=decision.decided_by)
            result = await self._run_tool(task, spec, arguments, key, approval)
            step.attempts += result.attempt
            next_reason = _escalation_reason(spec, result)
            if next_reason is None:
                return result
            reason, detail, last = next_reason, result.message or result.reason or "", result

    async def _model_escalation(self, spec: ToolSpec, arguments: dict, key: str) -> ToolResult:
        decision = await self._escalate(spec.name, arguments, key, "model_request", arguments["reason"])
        if decision.decision == "abort":
            raise _Stop("cancelled", f"aborted by {decision.decided_by}: {decision.note}")
        outcome = Outcome.PERFORMED if decision.decision == "approve" else Outcome.NOT_PERFORMED
        return ToolResult(tool=spec.name, outcome=outcome, intent_key=key,
                          reason=None if outcome is Outcome.PERFORMED else "rejected_by_human",
                          message=f"{decision.decided_by}: {decision.note}",
                          data={"source": "human", "decided_by": decision.decided_by})

    async def _settle(self, task: TaskInput, spec: ToolSpec, arguments: dict, key: str,
                      decision: ResolveInput) -> ToolResult:
        performed = decision.decision == "mark_performed"
        await workflow.execute_activity(
            "record_human_decision",
            SettleInput(task_id=task.task_id, tool=spec.name, intent_key=key, arguments=arguments,
                        status="performed" if performed else "not_performed", provider_ref=decision.provider_ref,
                        decided_by=decision.decided_by, note=decision.note),
            start_to_close_timeout=OPS_TIMEOUT, retry_policy=policies.OPS_POLICY,
            summary=f"ledger: {decision.decision} {key} by {decision.decided_by}",
        )
        data = {"source": "human", "decided_by": decision.decided_by, "provider_ref": decision.provider_ref,
                **({"amount_cents": arguments["amount_cents"]} if "amount_cents" in arguments else {})}
        if performed:
            return ToolResult(tool=spec.name, outcome=Outcome.PERFORMED, intent_key=key, data=data,
                              message=decision.note)
        return ToolResult(tool=spec.name, outcome=Outcome.NOT_PERFORMED, intent_key=key, data=data,
                          reason="confirmed_not_performed", message=decision.note, retryable=True)

    async def _run_tool(self, task: TaskInput, spec: ToolSpec, arguments: dict, key: str | None,
                        approval: Approval | None) -> ToolResult:
        policy = policies.POLICY_BY_CLASS[spec.tool_class]
        try:
            return await workflow.execute_activity(
                spec.name,
                ToolInput(task_id=task.task_id, tool=spec.name, arguments=arguments, intent_key=key,
                          approval=approval),
                result_type=ToolResult,
                start_to_close_timeout=policies.TOOL_START_TO_CLOSE,
                heartbeat_timeout=policies.TOOL_HEARTBEAT,
                retry_policy=policy,
                summary=activity_summary(spec.name, arguments, key),
            )
        except ActivityError as err:
            return ToolResult(tool=spec.name, outcome=Outcome.UNKNOWN if spec.needs_key else None,
                              intent_key=key, reason="attempts_exhausted",
                              message=f"{policy.maximum_attempts} attempts failed: {_cause(err)}",
                              attempt=policy.maximum_attempts)

    # --- humans --------------------------------------------------------------------------

    async def _escalate(self, tool: str, arguments: dict, key: str, reason: EscalationReason,
                        detail: str) -> ResolveInput:
        now = workflow.now()
        deadline = now + timedelta(seconds=self._task.escalation_timeout_seconds)
        self._checkpoint.escalations += 1
        workflow.metric_meter().create_counter("agent_escalations", "Escalations to a human, by reason").add(
            1, {"reason": reason})
        self._checkpoint.waiting_for = Escalation(
            intent_key=key, tool=tool, arguments=arguments, reason=reason, detail=detail,
            since=_iso(now), deadline=_iso(deadline), allowed=ALLOWED[reason])
        self._set_state("awaiting_human", escalation=reason)
        await self._alert("escalation", reason, key, f"{tool} waits for a human: {reason}: {detail}")
        try:
            await workflow.wait_condition(lambda: self._decision is not None,
                                          timeout=timedelta(seconds=self._task.escalation_timeout_seconds))
        except asyncio.TimeoutError:
            raise _Stop("dead_lettered", f"no decision on {reason} for {key} within "
                                         f"{self._task.escalation_timeout_seconds} s") from None
        decision, self._decision = self._decision, None
        self._checkpoint.waiting_for = None
        self._set_state("running")
        return decision

    @workflow.signal(name="resolve")
    def resolve(self, raw: RawValue) -> None:
        """A decision from the Web UI or `temporal workflow signal`; a bad one is recorded and ignored."""
        try:
            data = workflow.payload_converter().from_payload(raw.payload, dict)
            decision = ResolveInput.model_validate(data)
        except Exception as err:  # any malformed payload: record it, never fail the workflow task
            self._log_decision("ignored", f"malformed decision: {str(err).splitlines()[0]}", None,
                               raw.payload.data.decode(errors="replace")[:500])
            return
        status, why = self._check(decision)
        if status != "applied":
            self._log_decision(status, why, decision)
            return
        self._accept(decision)

    @workflow.update(name="decide")
    async def decide(self, decision: ResolveInput) -> DecisionReceipt:
        """The same decision for callers that need an answer."""
        self._accept(decision)
        await workflow.wait_condition(lambda: self._decision is None)
        return DecisionReceipt(intent_key=decision.intent_key, decision=decision.decision,
                               decided_by=decision.decided_by, state=self._checkpoint.state)

    @decide.validator
    def _validate_decision(self, decision: ResolveInput) -> None:
        status, why = self._check(decision)
        if status != "applied":
            raise ValueError(why)

    def _check(self, decision: ResolveInput) -> tuple[str, str | None]:
        wait = self._checkpoint.waiting_for
        if self._task.approvers and decision.decided_by not in self._task.approvers:
            return "refused", f"{decision.decided_by!r} is not an approver of this task"
        if wait is None or self._decision is not None:
            return "ignored", "the task is not waiting for a decision"
        if decision.intent_key != wait.intent_key:
            return "ignored", f"no call with key {decision.intent_key} is waiting; waiting: {wait.intent_key}"
        if decision.decision not in wait.allowed:
            return "ignored", f"{decision.decision} does not apply to {wait.reason}; allowed: {wait.allowed}"
        if decision.decision == "mark_performed" and not decision.provider_ref:
            return "ignored", "mark_performed needs provider_ref (the provider's id of the effect)"
        return "applied", None

    def _accept(self, decision: ResolveInput) -> None:
        self._decision = decision
        self._log_decision("applied", None, decision)

    def _log_decision(self, status: str, why: str | None, decision: ResolveInput | None,
                      raw: str | None = None) -> None:
        self._checkpoint.decisions.append(DecisionRecord(received_at=_iso(workflow.now()), status=status, why=why,
                                                         decision=decision, raw=raw))
        self._touch()

    @workflow.query
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    async def _alert(self, kind: str, reason: str, key: str | None, summary: str) -> None:
        """An alert that cannot be delivered must not end the task: the wait and its search
        attributes stay visible, and the failure is in the checkpoint."""
        try:
            await workflow.execute_activity(
                "raise_alert",
                AlertInput(alert_key=f"{self._task.task_id}:{workflow.info().run_id}:{kind}:"
                                     f"{self._checkpoint.escalations}",
                           task_id=self._task.task_id, kind=kind, reason=reason, intent_key=key, summary=summary,
                           checkpoint=self._checkpoint.model_dump(mode="json")),
                start_to_close_timeout=OPS_TIMEOUT, retry_policy=policies.READ_POLICY,
                summary=f"alert: {kind} {reason}",
            )
        except ActivityError as err:
            self._checkpoint.alert_failures.append(f"{kind} {reason}: {_cause(err)}")
            self._touch()

    async def _dead_letter(self, reason: str) -> None:
        """Store the task with its whole checkpoint and alert: never a silent failure."""
        wait = self._checkpoint.waiting_for
        workflow.metric_meter().create_counter("agent_dead_letters", "Tasks ended as dead letters").add(1)
        self._checkpoint.dead_letter_reason = reason
        self._checkpoint.waiting_for = None
        self._set_state("dead_lettered", escalation=wait.reason if wait else "dead_letter")
        await workflow.execute_activity(
            "store_dead_letter",
            DeadLetterInput(task_id=self._task.task_id, run_id=workflow.info().run_id, reason=reason,
                            checkpoint=self._checkpoint.model_dump(mode="json")),
            start_to_close_timeout=OPS_TIMEOUT, retry_policy=policies.OPS_POLICY, summary=f"dead letter: {reason}",
        )
        await self._alert("dead_letter", reason, None, f"task {self._task.task_id} is a dead letter: {reason}")

    # --- bookkeeping ---------------------------------------------------------------------

    def _reject(self, call: ToolCall, reason: str, message: str) -> ToolResult:
        name = call.name[:64]  # a model may send anything as a name; keep the checkpoint small
        result = ToolResult(tool=name, outcome=Outcome.NOT_PERFORMED, reason=reason, message=message,
                            retryable=True, attempt=0)
        step = self._step(name, None, {})
        self._record(step, result)
        step.status = "rejected"
        return result

    def _step(self, tool: str, key: str | None, arguments: dict) -> Step:
        if key is not None and key in self._step_by_key:
            return self._checkpoint.steps[self._step_by_key[key]]
        count = self._checkpoint.calls.get(tool, 0)
        self._checkpoint.calls[tool] = count + 1
        name = tool if count == 0 else f"{tool}#{count + 1}"
        if key is not None:
            self._step_by_key[key] = name
        step = self._checkpoint.steps[name] = Step(tool=tool, status="running", intent_key=key, arguments=arguments)
        return step

    def _occurrence(self, spec: ToolSpec, arguments: dict) -> int:
        """For tools without business fields: performed identical calls so far, plus one."""
        if spec.key_fields:
            return 1
        same = [s for s in self._checkpoint.steps.values()
                if s.tool == spec.name and s.arguments == arguments and s.outcome in SETTLED]
        return len(same) + 1

    @staticmethod
    def _unsettled_asks(step: Step) -> int:
        return sum(1 for line in step.trail
                   if line.startswith("ask ") and not line.split(": ", 1)[1].startswith(("performed", "already")))

    def _record(self, step: Step, result: ToolResult) -> None:
        step.trail.append(trail_line(step.trail, result))
        step.outcome = result.outcome
        step.reason = result.reason
        step.result = {**result.data, **({"message": result.message} if result.message else {})}
        if result.outcome is None:
            step.status = "done" if result.reason is None else "not_performed"
        elif result.outcome in SETTLED:
            step.status = "done"
        elif result.outcome is Outcome.UNKNOWN:
            step.status = "unknown"
        else:
            step.status = "not_performed"
        self._touch()

    def _set_state(self, state: str, escalation: str | None = None) -> None:
        self._checkpoint.state = state
        workflow.upsert_search_attributes([
            names.STATUS_ATTR.value_set(state),
            names.SCENARIO_ATTR.value_set(self._checkpoint.scenario),
            names.ESCALATION_ATTR.value_set(escalation) if escalation else names.ESCALATION_ATTR.value_unset(),
        ])
        self._touch()

    def _touch(self) -> None:
        self._checkpoint.updated_at = _iso(workflow.now())
        workflow.set_current_details(current_details(self._checkpoint))


def _escalation_reason(spec: ToolSpec, result: ToolResult) -> EscalationReason | None:
    if result.reason == "approval_required":
        return "approval_required"
    if result.reason == "attempts_exhausted":
        return "attempts_exhausted"
    if result.outcome is Outcome.UNKNOWN:
        return "unknown_outcome"
    return None


def _cause(err: ActivityError) -> str:
    return getattr(err.cause, "message", None) or str(err.cause or err)


def _iso(moment) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
