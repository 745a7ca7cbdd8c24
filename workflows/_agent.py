"""The agent task's state and steps: what each of `AgentTaskWorkflow`'s handlers hands over to.

Workflow code, sandboxed like workflows/agent_task.py: the sandbox imports this module afresh for every
run too. Its annotations are postponed (`from __future__ import annotations`), unlike agent_task.py's:
nothing reads these at run time, and an evaluated one is built again on every run's import. They were
about 140 of the 300 objects each run's copy of the steps kept alive, objects that every full garbage
collection of a busy worker walks while holding every thread of it (docs/figures.md).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from temporalio import workflow
from temporalio.common import RawValue, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError

with workflow.unsafe.imports_passed_through():  # one module: the sandbox passes each through on every run
    from workflows._outside import (
        DECISIONS_KEPT,
        JOURNAL_NOTE,
        MAX_WINDOW_BYTES,
        SETTLED,
        AlertInput,
        AlertKind,
        Approval,
        AskAnswer,
        AskingActivities,
        AskInput,
        AuthorityActivities,
        Carry,
        ChatMessage,
        Checkpoint,
        DeadLetterInput,
        Decided,
        Decision,
        DecisionReceipt,
        DecisionRecord,
        DecisionStatus,
        DecisionVia,
        Escalation,
        EscalationReason,
        GateCall,
        InspectInput,
        IntentView,
        ModelActivities,
        ModelReply,
        ModelTurnInput,
        OperationsActivities,
        Outcome,
        Policy,
        PolicyInput,
        Question,
        Refused,
        Rejection,
        ResolveInput,
        SettleInput,
        Step,
        TaskInput,
        TaskResult,
        TaskState,
        ToolActivities,
        ToolCall,
        ToolInput,
        ToolResult,
        ToolSpec,
        Unusable,
        Verdict,
        VerifyInput,
        Waiter,
        Waiting,
        activity_summary,
        bounded_reply,
        call_signature,
        current_details,
        derive_intent_key,
        names,
        narrow,
        out_of_scope,
        policies,
        read_decision,
        screen,
        signature_holds,
        trail_line,
        validate_call,
    )

ALLOWED: dict[EscalationReason, list[Decision]] = {
    "approval_required": ["approve", "reject", "abort"],
    "unknown_outcome": ["mark_performed", "mark_not_performed", "approve", "abort"],
    "attempts_exhausted": ["approve", "reject", "mark_performed", "mark_not_performed", "abort"],
    "model_request": ["approve", "reject", "abort"],
    "unusable_model_output": ["approve", "abort"],
}
_READ_STEPS_KEPT = 20
_UNUSABLE = frozenset(Unusable)
_MAX_VERIFYING = 4  # signature checks in flight at once; more are refused, so a flood cannot queue work


class _Stop(Exception):
    """Ends the task early: aborted by a human, or a dead letter."""

    def __init__(self, state: TaskState, reason: str) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason


class Agent:
    """One run of an agent task: its state and every step, behind AgentTaskWorkflow's handlers."""

    def __init__(self, task: TaskInput) -> None:
        self._task = task
        self._decision: ResolveInput | None = None
        self._verifying = 0
        self._unusable = 0
        # A run started since _FOLDED has every change below it, and one since _ONE_MARKER every change
        # before that; only an older run asks for each. A new run records the one marker, _FOLDED's.
        self._folded = workflow.patched(_FOLDED)
        self._current = self._folded or workflow.patched(_ONE_MARKER)
        self._lean = self._since(_LEAN)
        self._boundary = self._since(_BOUNDARY)
        self._wait_attrs = self._since(_WAIT_ATTRIBUTES)
        self._quiet_rollover = self._since(_QUIET_ROLLOVER)
        self._rolling = False  # continuing as new: a decision arriving now is refused, not verified
        self._counted_rollover = self._since(_COUNTED_ROLLOVER)
        # A waiting run's history as measured when the wait began, and what messages have added since.
        self._history_at_wait = (0, 0)
        self._messages = 0
        self._message_bytes = 0
        self._answers: list[tuple[ResolveInput, DecisionRecord]] = []  # what `decide` Updates answer
        self._alerts: list[asyncio.Future[None]] = []  # escalation alerts still being delivered
        self._withdrawn: ToolResult | None = None  # what the world settled while a person was asked (`_recheck`)
        carry = task.carry
        if carry is None:
            self._checkpoint = Checkpoint(task_id=task.task_id, scenario=task.scenario)
            # Keys are the task's, not a run's: a task begun since _FOLDED has messages' money status in them
            # for its life (the checkpoint carries it), and a redrive keeps what its task began with.
            if task.status_in_message_keys if task.status_in_message_keys is not None else self._folded:
                self._checkpoint.status_in_message_keys = True
            self._journal: dict[str, ToolResult] = {}
            self._step_by_key: dict[str, str] = {}
            # The system prompt is the worker's: the model activity puts it first (activities/model.py).
            self._transcript = [ChatMessage(role="user", content=task.brief)]
            self._turn = 0
            self._pending: list[ToolCall] = []
        else:
            self._checkpoint = carry.checkpoint
            self._checkpoint.runs += 1
            self._journal = dict(carry.journal)
            self._step_by_key = dict(carry.step_by_key)
            self._transcript = list(carry.transcript)
            self._turn = carry.turn
            self._pending = list(carry.resume)
        self._updates = 0  # Updates received by this run: the server takes a bounded number per run

    def _since(self, change: str) -> bool:
        """Whether this run has `change` (one made before _ONE_MARKER): every run started since _ONE_MARKER
        has it (and records no marker of its own for it); an older run has it when its history holds that
        change's marker."""
        return self._current or workflow.patched(change)

    def _since_folded(self, change: str) -> bool:
        """As `_since`, for a change made between _ONE_MARKER and _FOLDED."""
        return self._folded or workflow.patched(change)

    async def run(self, task: TaskInput) -> TaskResult:
        self._set_state("running")
        try:
            if self._checkpoint.policy is None:
                self._checkpoint.policy = await self._load_policy(task)
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
            if workflow.cancellation_reason() is None:
                # Not an operator's cancel: the worker is evicting this run from its cache (it cancels every
                # task of the run and must find none left), so nothing may be recorded or awaited here.
                raise
            self._checkpoint.final_answer = "cancelled by an operator"
            self._set_state("cancelled")
        await self._alerts_delivered()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return TaskResult(task_id=task.task_id, state=self._checkpoint.state,
                          final_answer=self._checkpoint.final_answer, checkpoint=self._checkpoint)

    @property
    def _policy(self) -> Policy:
        """Loaded before the first turn (and carried over continue-as-new), so never None here."""
        return cast(Policy, self._checkpoint.policy)

    async def _load_policy(self, task: TaskInput) -> Policy:
        """The worker's authority over this task, narrowed by its input; recorded in the history."""
        request = PolicyInput(task_id=task.task_id, kind=task.kind, facts=task.facts, redrive_of=task.redrive_of)
        try:
            if self._lean:  # a read of the worker's own configuration and records: no task of its own
                policy = await workflow.execute_local_activity_method(
                    AuthorityActivities.task_policy, request, schedule_to_close_timeout=policies.LOCAL_READ_TIMEOUT,
                    retry_policy=policies.READ_POLICY, summary=f"policy for a {task.kind} task")
            else:
                policy = await workflow.execute_activity_method(
                    AuthorityActivities.task_policy, request, start_to_close_timeout=policies.OPS_START_TO_CLOSE,
                    retry_policy=policies.READ_POLICY, summary=f"policy for a {task.kind} task")
        except ActivityError as err:
            raise _Stop("dead_lettered", f"could not load the task's policy: {_cause(err)}") from None
        except CancelledError:
            raise
        except FailureError as err:
            # A local activity's last failure arrives as its own error (ApplicationError, TimeoutError, ...),
            # not wrapped in an ActivityError; runs recorded before this patch failed the workflow here.
            if not self._since(_POLICY_FAILURE):
                raise
            raise _Stop("dead_lettered", f"could not load the task's policy: {_cause(err)}") from None
        return narrow(policy, task)

    async def _converse(self, task: TaskInput) -> str:
        if self._pending:  # the previous run continued as new while one of these calls waited for a person
            await self._answer_calls(task, self._pending)
        carried = self._checkpoint.waiting_for
        if carried is not None and carried.reason == "unusable_model_output":  # carried since _CARRIED_MODEL_QUESTION
            await self._await_decision(Question(carried.tool, carried.arguments, carried.intent_key, carried.reason,
                                                carried.detail))
        while self._turn < task.max_turns:
            if self._history_budget_spent(task):
                await self._continue_as_new(task)
            self._turn += 1
            turn = self._checkpoint.turns = self._turn
            try:
                reply: ModelReply = await workflow.execute_activity_method(
                    ModelActivities.model_turn,
                    ModelTurnInput(task_id=task.task_id, scenario=task.scenario, turn=turn,
                                   messages=self._window(task), tools=self._policy.tools,
                                   model_options=task.model_options),
                    start_to_close_timeout=policies.MODEL_START_TO_CLOSE,
                    heartbeat_timeout=policies.TOOL_HEARTBEAT,
                    retry_policy=policies.MODEL_POLICY,
                    summary=f"model turn {turn}",
                )
            except ActivityError as err:
                raise _Stop("dead_lettered", f"model turn failed for good: {_cause(err)}") from None
            if self._boundary:
                reply = bounded_reply(reply)
            self._transcript.append(ChatMessage(role="assistant", content=reply.content,
                                                tool_calls=reply.tool_calls))
            if not reply.tool_calls:
                return reply.content
            usable = await self._answer_calls(task, reply.tool_calls)
            self._transcript = self._compact(self._transcript, task.window_messages)
            self._unusable = 0 if usable else self._unusable + 1
            if self._unusable >= task.max_unusable_replies:
                await self._await_decision(Question(
                    "model_turn", {}, f"model-output:{task.task_id}:turn-{turn}", "unusable_model_output",
                    f"{self._unusable} replies in a row with no usable tool call"))
                self._unusable = 0
            self._touch()
        raise _Stop("dead_lettered", f"turn limit of {task.max_turns} reached without a final answer")

    async def _answer_calls(self, task: TaskInput, calls: list[ToolCall]) -> bool:
        """Each call through the gate, its answer into the transcript; whether any was usable."""
        usable = False
        for i, call in enumerate(calls):
            self._pending = calls[i:]
            result = await self._gate(task, call)
            usable = usable or result.reason not in _UNUSABLE
            self._transcript.append(ChatMessage(role="tool", tool_call_id=call.id, name=call.name,
                                                content=result.model_dump_json(exclude_defaults=True)))
        self._pending = []
        return usable

    # --- long runs -----------------------------------------------------------------------

    def _window(self, task: TaskInput) -> list[ChatMessage]:
        """What the model sees this turn: the system prompt, the task, the latest messages."""
        window = self._compact(self._transcript, task.window_messages)
        return _within_bytes(window, MAX_WINDOW_BYTES) if self._boundary else window

    @staticmethod
    def _compact(transcript: list[ChatMessage], window: int) -> list[ChatMessage]:
        """Keep the pinned messages (the task's brief, and the system prompt of tasks started before the
        worker supplied it) and the last `window`, never starting on an orphan tool result."""
        head = next((i for i, m in enumerate(transcript[:2]) if m.role not in ("system", "user")),
                    min(2, len(transcript)))
        pinned, rest = transcript[:head], transcript[head:]
        if len(rest) <= window:
            return transcript
        rest = rest[-window:]
        while rest and rest[0].role == "tool":
            rest = rest[1:]
        return pinned + rest

    def _rollover_due(self) -> bool:
        """While waiting, continue as new before signals or Updates exhaust the run's history or
        the server's Updates per run.

        What messages add is counted by the handlers, from the payloads they receive: the history's
        length and size as the server reports them change in activations that replay differently
        (a workflow task that only met an Update its validator refused leaves no event, yet its
        payload can count in the size; one with no command is replayed merged with the next), so a
        condition on them wakes the replay at another point than the run, and messages recorded
        after that point were lost from the run's carry."""
        if not self._boundary:
            return False
        if not self._counted_rollover:
            return self._updates >= _UPDATES_PER_RUN or self._history_budget_spent(self._task)
        events, size = self._history_at_wait
        return (self._updates >= _UPDATES_PER_RUN
                or events + self._messages * _EVENTS_PER_MESSAGE > self._task.max_history_events
                or size + self._message_bytes > self._task.max_history_bytes)

    def _received(self, args: Sequence[Any]) -> None:
        """A signal or an accepted Update: what it adds to the run's history. One payload arrives as a
        RawValue; two or more arrive decoded (`_raw_payloads`), measured by their text."""
        self._messages += 1
        self._message_bytes += _MESSAGE_OVERHEAD_BYTES + sum(
            arg.payload.ByteSize() if isinstance(arg, RawValue) else len(repr(arg)) for arg in args)

    def _history_budget_spent(self, task: TaskInput) -> bool:
        info = workflow.info()
        return (info.is_continue_as_new_suggested()
                or info.get_current_history_length() > task.max_history_events
                or info.get_current_history_size() > task.max_history_bytes)

    async def _continue_as_new(self, task: TaskInput) -> None:
        """A fresh run with the journal, the checkpoint and a compacted transcript: keys stay settled.
        Returns (without continuing) only when a decision was applied while it waited for handlers."""
        await self._alerts_delivered()
        # From here a handler schedules nothing: one that started an activity in the activation that
        # continues as new would put a command after the run's last (seen under a flood of signals).
        self._rolling = self._quiet_rollover
        # A `decide` Update applied while the handlers finish is a handler that waits for its answer: since
        # _DECIDED_WHILE_ROLLING the run acts on it at once instead of waiting for it (which never ended).
        acts_at_once = self._since_folded(_DECIDED_WHILE_ROLLING)
        await workflow.wait_condition(
            lambda: workflow.all_handlers_finished() or (acts_at_once and self._decision is not None))
        if self._decision is not None:  # a decision was applied while the handlers finished: act on it here
            self._rolling = False
            return
        checkpoint = self._checkpoint.model_copy(deep=True)
        reads = [name for name, step in checkpoint.steps.items() if step.intent_key is None]
        for name in reads[:-_READ_STEPS_KEPT]:
            del checkpoint.steps[name]
            checkpoint.compacted_steps += 1
        transcript = self._compact(self._transcript, task.window_messages)
        if self._boundary:  # the carried transcript alone must leave the next run room to work
            transcript = _within_bytes(transcript, task.max_history_bytes // 4)
        if not self._pending and not self._model_question_carried(checkpoint):
            checkpoint.waiting_for = None
        carry = Carry(checkpoint=checkpoint, journal=self._journal, step_by_key=self._step_by_key,
                      transcript=transcript, turn=self._turn, resume=self._pending)
        workflow.continue_as_new(task.model_copy(update={"carry": carry}))

    @staticmethod
    def _model_question_carried(checkpoint: Checkpoint) -> bool:
        """Since _CARRIED_MODEL_QUESTION a wait for a person on the model's unusable replies goes on in the
        next run; before, the next run went on asking the model, as if the person had approved."""
        waiting = checkpoint.waiting_for
        return waiting is not None and waiting.reason == "unusable_model_output" \
            and workflow.patched(_CARRIED_MODEL_QUESTION)

    # --- the gate ------------------------------------------------------------------------

    async def _gate(self, task: TaskInput, call: ToolCall) -> ToolResult:
        """The one path every tool call takes: validate, scope, key, dedupe, run, decide, record."""
        checked = validate_call(call.name, call.arguments, self._policy.tools)
        if isinstance(checked, Rejection):
            return self._reject(call.name, checked.reason, checked.message)
        spec, arguments = checked
        why = out_of_scope(spec.name, arguments, task.facts, self._policy, narrowed=self._boundary)
        if why is not None:
            return self._reject(spec.name, "out_of_scope", why)

        key = None
        if spec.needs_key:
            # A message's money status is part of its intent in a task begun since _FOLDED; an older task keeps
            # the keys it began with, so a message it sent is never sent again under a new key.
            extras = spec.key_extras if self._checkpoint.status_in_message_keys else ()
            key = derive_intent_key(spec.name, spec.key_fields, arguments, {"task_id": task.task_id},
                                    occurrence=self._occurrence(spec, arguments), extras=extras)
        target = GateCall(spec, arguments, key, key or f"call:{call_signature(spec.name, arguments)}",
                       self._step(spec.name, key, arguments))

        if key is not None and key in self._journal:
            result = ToolResult(tool=spec.name, outcome=Outcome.ALREADY_PERFORMED, intent_key=key,
                                data=self._journal[key].data, message=JOURNAL_NOTE)
        else:
            result = await self._run_and_decide(task, target)
        self._record(target.step, result)
        if key is not None and result.outcome in SETTLED:
            self._journal[key] = result
        return result

    async def _run_and_decide(self, task: TaskInput, call: GateCall) -> ToolResult:
        """Run the call; while its answer (or the call itself) needs a human, wait for a decision and
        do what it says (`_ACTIONS`). A decision names this call's key, so it applies to it alone.

        Before anyone is asked about a keyed call, and before an answer that rests on the world is
        kept, the ledger and the provider are read (`_read_world`): what they settle is not put to a
        person, and a decision they contradict is refused and recorded."""
        carried = self._checkpoint.waiting_for
        reason: EscalationReason | None
        result: ToolResult | Refused | None  # the tool's answer, or a decision's (`_ACTIONS`)
        # The previous run continued as new while this call waited: the same question, not a new run of it.
        # Since _CARRIED_QUESTION it is withdrawn when the world settles it.
        resumed = ran = False
        if self._boundary and carried is not None and carried.intent_key == call.decision_key:
            reason, detail = carried.reason, carried.detail
            resumed = self._since_folded(_CARRIED_QUESTION)
            # The call ran in the run that asked: since _CARRIED_RAN, "not performed" settles it here as it did there.
            ran = resumed and carried.ran and reason in _AFTER_RUNNING and workflow.patched(_CARRIED_RAN)
        else:
            reason, detail = self._needs_human_first(task, call)
        while True:
            if reason is None:
                result = await self._run_tool(task, call)
                ran = True
                reason = _escalation_reason(result)
                if reason is None:
                    return result
                detail = result.message or result.reason or ""
                self._record(call.step, result)
            world, asked = None, False
            question = Question(call.spec.name, call.arguments, call.decision_key, reason, detail,
                                keyed=call.key is not None, ran=ran)
            if self._boundary and call.key is not None and reason != "model_request":
                not_done_settles = ran and reason in _AFTER_RUNNING
                if self._since(_ASK_AFTER_READING) and not self._asked_already(question):
                    world, asked = await self._ask(task, call, question, not_done_settles)
                else:
                    world = await self._read_world(task, call)
                settled = self._settled_by(world, call, not_done_settles)
                if settled is not None:
                    if resumed and self._asked_already(question):  # asked in the run before: nobody is needed now
                        self._checkpoint.waiting_for = None
                        self._set_state("running")
                        self._withdraw(call, reason, settled)
                        self._drop_decision(settled)
                    return settled
            watcher = None
            if world is not None and world.status == "unknown" and world.recheck_seconds \
                    and self._since(_RECHECK_WHILE_ASKED):
                watcher = asyncio.ensure_future(self._recheck(task, call, world.recheck_seconds, not_done_settles))
            decision = await self._await_decision(question, world, answers_later=self._boundary, alerted=asked)
            if watcher is not None:  # (a wait that ends the run leaves it: the run's end drops its timer)
                watcher.cancel()
            if decision is not None:
                self._withdrawn = None  # a decision and the world in one workflow task: the decision is checked
            else:  # the world settled the call while a person was asked: nobody is needed any more
                withdrawn, self._withdrawn = cast(ToolResult, self._withdrawn), None
                self._withdraw(call, reason, withdrawn)
                return withdrawn
            if self._boundary and call.key is not None:
                checked = await self._check_against_world(task, call, decision, reason)
                if checked is not None:
                    self._answer(decision, checked[1])
                    if checked[0] is not None:
                        return checked[0]
                    detail = f"{decision.decision} by {decision.decided_by} refused: {checked[1].why}"
                    continue
            result = await _ACTIONS[decision.decision](self, task, call, decision, reason)
            if isinstance(result, Refused):  # the provider's records contradict the human: ask again
                self._answer(decision, self._checkpoint.decisions[-1])
                detail = f"{decision.decision} by {decision.decided_by} refused: {result.why}"
                continue
            self._answer(decision, None)
            if result is not None:
                return result
            reason, ran = None, False

    def _drop_decision(self, settled: ToolResult) -> None:
        """A decision applied to a carried question while the new run read the world, which then settled it:
        since _NUMBERED_QUESTIONS it is answered as not acted on; before, it was kept, and the task's next
        question took it at once, whatever that question was."""
        if self._decision is not None and workflow.patched(_NUMBERED_QUESTIONS):
            stale, self._decision = self._decision, None
            self._answer(stale, self._log_decision(
                "world_check", "ignored", f"the records settled the question first: {settled.message}",
                decision=stale))

    def _withdraw(self, call: GateCall, reason: EscalationReason, settled: ToolResult) -> None:
        """The world settled a call a person was asked about: the trail says so and the person is told."""
        call.step.trail.append(f"world: {settled.message}"[:500])
        self._alerts.append(asyncio.ensure_future(self._alert(
            "escalation_withdrawn", reason, call.decision_key,
            f"{call.spec.name} no longer waits for a human: {settled.message}"[:1000])))

    async def _read_world(self, task: TaskInput, call: GateCall) -> IntentView:
        """The ledger and the provider on this call's intent. A request that may still land is waited
        out (a durable timer to its settle horizon) before the world is read again."""
        for _ in range(_WORLD_READS):
            view = await self._inspect(task, call, "read the world")
            if view.status != "in_flight" or view.until is None:
                return view
            call.step.trail.append(f"world: in flight until {view.until:.0f}; waiting before anyone is asked")
            self._touch()
            await workflow.sleep(max(1.0, view.until - workflow.now().timestamp() + 0.5))
        return view

    async def _ask(self, task: TaskInput, call: GateCall, question: Question,
                   not_done_settles: bool) -> tuple[IntentView, bool]:
        """As `_read_world`, but the activity that reads also delivers the question's alert when what it
        read leaves the call open: nothing can settle between the read and the ask. Whether it asked."""
        for _ in range(_WORLD_READS):
            answer: AskAnswer = await workflow.execute_activity_method(
                AskingActivities.ask_a_person,
                AskInput(intent=_inspect_input(task, call),
                         alert=self._alert_input("escalation", question.reason, question.key,
                                                 question.alert_summary(), self._checkpoint.escalations + 1),
                         not_done_settles=not_done_settles),
                start_to_close_timeout=policies.OPS_START_TO_CLOSE, retry_policy=policies.OPS_POLICY,
                summary=f"read the world, then ask: {call.spec.name} {call.key}"[:200])
            view = answer.world
            if view.status != "in_flight" or view.until is None:
                return view, answer.asked  # a delivery that failed is retried by `_await_decision`
            call.step.trail.append(f"world: in flight until {view.until:.0f}; waiting before anyone is asked")
            self._touch()
            await workflow.sleep(max(1.0, view.until - workflow.now().timestamp() + 0.5))
        return view, False

    async def _recheck(self, task: TaskInput, call: GateCall, wait: float, not_done_settles: bool) -> None:
        """While a person is asked about an unknown outcome, read the world again (after `wait`, then twice
        as long each time, at most an hour apart): when it settles the call, the question is withdrawn
        (`_await_decision` wakes on `_withdrawn`). Cancelled when the wait ends."""
        while True:
            await workflow.sleep(wait)
            view = await self._inspect(task, call, "read the world again while a person is asked")
            settled = self._settled_by(view, call, not_done_settles)
            if settled is not None:
                self._withdrawn = settled.model_copy(update={
                    "message": f"settled by the world while a person was asked: {view.detail}"})
                return
            wait = min(wait * 2, _RECHECK_AT_MOST)

    async def _inspect(self, task: TaskInput, call: GateCall, why: str) -> IntentView:
        """One read of the ledger and the provider on this call's intent; `why` names it in the history."""
        view: IntentView = await workflow.execute_activity_method(
            ToolActivities.inspect_intent, _inspect_input(task, call),
            start_to_close_timeout=policies.OPS_START_TO_CLOSE, retry_policy=policies.OPS_POLICY,
            summary=f"{why}: {call.spec.name} {call.key}"[:200])
        return view

    def _asked_already(self, question: Question) -> bool:
        """The previous run continued as new while this question waited: it is not asked again."""
        earlier = self._checkpoint.waiting_for
        return earlier is not None and earlier.intent_key == question.key

    def _settled_by(self, world: IntentView, call: GateCall, not_done_settles: bool) -> ToolResult | None:
        """The call's answer when the world settles it: performed, not performed for good (the provider failed
        its request), or (after a run whose answer was unknown or exhausted) not performed. None: a person
        must decide."""
        if world.status == "performed":
            mine = world.task_id == self._task.task_id
            return ToolResult(tool=call.spec.name, outcome=Outcome.PERFORMED if mine else Outcome.ALREADY_PERFORMED,
                              intent_key=call.key, message=f"settled without asking anyone: {world.detail}",
                              data={"source": "world", "provider_ref": world.provider_ref,
                                    "amount_cents": world.amount_cents, "read_at": world.read_at})
        if world.status == "not_performed" and world.final:  # running it again, or asking anyone, changes nothing
            return ToolResult(tool=call.spec.name, outcome=Outcome.NOT_PERFORMED, intent_key=call.key,
                              reason="provider_failed", data={"source": "world", "read_at": world.read_at},
                              message=f"nothing was done: {world.detail}")
        if world.status == "not_performed" and not_done_settles:
            return ToolResult(tool=call.spec.name, outcome=Outcome.NOT_PERFORMED, intent_key=call.key,
                              reason="not_performed", retryable=True,
                              data={"source": "world", "read_at": world.read_at},
                              message=f"nothing was done: {world.detail}")
        return None

    async def _check_against_world(self, task: TaskInput, call: GateCall, decision: ResolveInput,
                                   reason: EscalationReason) -> tuple[ToolResult | None, DecisionRecord] | None:
        """A decision whose effect rests on the world (reject, mark_not_performed, a retry after an
        unknown outcome) is checked against it when it is applied. None: apply it. Otherwise the
        refusal, recorded, with the call's answer when the world settles it."""
        retry = decision.decision == "approve" and reason in ("unknown_outcome", "attempts_exhausted")
        if decision.decision not in ("reject", "mark_not_performed") and not retry:
            return None
        world = await self._read_world(task, call)
        if world.status != "performed":
            return None
        why = f"{decision.decision} refused: {world.detail} (read {world.read_at})"
        record = self._log_decision("world_check", "refused", why, decision=decision)
        return self._settled_by(world, call, False), record

    def _answer(self, decision: ResolveInput, refused: DecisionRecord | None) -> None:
        """What the `decide` Update answers: the decision as it was finally applied, or why not."""
        record = refused or DecisionRecord(received_at=_iso(workflow.now()), status="applied", decision=decision)
        self._answers = [*self._answers[-(_ANSWERS_KEPT - 1):], (decision, record)]

    def _answer_to(self, decision: ResolveInput) -> DecisionRecord | None:
        return next((record for sent, record in self._answers if sent is decision), None)

    def _needs_human_first(self, task: TaskInput, call: GateCall) -> tuple[EscalationReason | None, str]:
        """Why a human must decide before the call runs at all, if they must."""
        if call.spec.name == "escalate_to_human":
            return "model_request", call.arguments["reason"]
        if call.key is not None and call.step.unsettled_asks >= task.max_asks_per_call:
            return "attempts_exhausted", f"asked {call.step.asks} times without success"
        ceiling = self._ceiling(task, call.spec)
        amount = call.arguments.get("amount_cents")
        if ceiling is not None and amount is not None and amount > ceiling:
            return "approval_required", f"{amount} cents is over the {ceiling} cents ceiling for {call.spec.name}"
        return None, ""

    def _ceiling(self, task: TaskInput, spec: ToolSpec) -> int | None:
        """The approval ceiling the gate enforces: payments always; refunds when the task narrows the
        worker's ceiling (the refund activity enforces the worker's own, over the order's totals)."""
        if spec.name == "send_payment":
            return self._policy.payment_ceiling_cents
        if spec.name == "issue_refund" and task.refund_ceiling_cents is not None:
            return self._policy.refund_ceiling_cents
        return None

    async def _approve(self, task: TaskInput, call: GateCall, decision: ResolveInput,
                       reason: EscalationReason) -> ToolResult | None:
        """A model's request for a human is answered; anything else runs again, with the approval
        if one was asked for."""
        if call.spec.name == "escalate_to_human":
            return _human_result(call, Outcome.PERFORMED, decision)
        if reason == "approval_required":
            call.approval = Approval(intent_key=call.decision_key, decided_by=decision.decided_by)
        return None

    async def _reject_call(self, task: TaskInput, call: GateCall, decision: ResolveInput,
                           reason: EscalationReason) -> ToolResult:
        return _human_result(call, Outcome.NOT_PERFORMED, decision, reason=Decided.REJECTED_BY_HUMAN)

    async def _settle(self, task: TaskInput, call: GateCall, decision: ResolveInput,
                      reason: EscalationReason) -> ToolResult | Refused:
        """A human says what happened: the ledger records it, the model is told."""
        if call.key is None:
            return ToolResult(tool=call.spec.name, reason="marked_by_human", message=decision.note)
        performed = decision.decision == "mark_performed"
        verdict = await workflow.execute_activity_method(
            ToolActivities.record_human_decision,
            SettleInput(task_id=task.task_id, tool=call.spec.name, intent_key=call.key, arguments=call.arguments,
                        status="performed" if performed else "not_performed", provider_ref=decision.provider_ref,
                        decided_by=decision.decided_by, note=decision.note),
            start_to_close_timeout=policies.OPS_START_TO_CLOSE, retry_policy=policies.OPS_POLICY,
            summary=f"ledger: {decision.decision} {call.key} by {decision.decided_by}",
        )
        if self._since(_SETTLE_CHECKED) and verdict is not None and not verdict.applied:
            self._log_decision("provider_check", "refused", verdict.why, decision=decision)
            return Refused(verdict.why or "")
        data = {"source": "human", "decided_by": decision.decided_by, "provider_ref": decision.provider_ref,
                **({"amount_cents": call.arguments["amount_cents"]} if "amount_cents" in call.arguments else {})}
        if performed:
            return ToolResult(tool=call.spec.name, outcome=Outcome.PERFORMED, intent_key=call.key, data=data,
                              message=decision.note)
        return ToolResult(tool=call.spec.name, outcome=Outcome.NOT_PERFORMED, intent_key=call.key, data=data,
                          reason="confirmed_not_performed", message=decision.note, retryable=True)

    async def _run_tool(self, task: TaskInput, call: GateCall) -> ToolResult:
        policy = policies.POLICY_BY_CLASS[call.spec.tool_class]
        call.step.status = "running"
        self._touch()
        request = ToolInput(task_id=task.task_id, tool=call.spec.name, arguments=call.arguments, intent_key=call.key,
                            approval=call.approval, ceiling_cents=self._ceiling(task, call.spec))
        summary = activity_summary(call.spec.name, call.arguments, call.key)
        try:
            if not call.spec.needs_key and self._since(_LOCAL_READS):
                # A read changes nothing and takes milliseconds: it runs inside this workflow task, on this
                # worker, with no activity task of its own (tool activities are registered under their name).
                result: ToolResult = await workflow.execute_local_activity(
                    call.spec.name, request, result_type=ToolResult,
                    schedule_to_close_timeout=policies.LOCAL_READ_TIMEOUT, retry_policy=policy, summary=summary)
            else:
                result = await workflow.execute_activity(
                    call.spec.name, request, result_type=ToolResult,
                    start_to_close_timeout=policies.TOOL_START_TO_CLOSE, heartbeat_timeout=policies.TOOL_HEARTBEAT,
                    retry_policy=policy, summary=summary)
        except CancelledError:
            raise
        except FailureError as err:  # a local activity's last failure arrives unwrapped, not as an ActivityError
            result = ToolResult(tool=call.spec.name, outcome=Outcome.UNKNOWN if call.spec.needs_key else None,
                                intent_key=call.key, reason="attempts_exhausted",
                                message=f"{policy.maximum_attempts} attempts failed: {_cause(err)}",
                                attempt=policy.maximum_attempts)
        call.step.attempts += result.attempt
        return result

    # --- humans --------------------------------------------------------------------------

    async def _await_decision(self, question: Question, world: IntentView | None = None,
                              answers_later: bool = False, alerted: bool = False) -> ResolveInput | None:
        """Wait for an applied decision on the question's key. An abort ends the task here; so does the
        deadline. Unless the caller `answers_later` (it checks the decision against the world first),
        the decision is answered as applied when it is taken. `alerted`: the person was already asked
        (`_ask`), so no alert is raised here. None: no decision came, the world settled the question
        (`_recheck`, `_withdrawn`)."""
        tool, arguments, key, reason, detail = (question.tool, question.arguments, question.key, question.reason,
                                                question.detail)
        timeout = self._policy.escalation_timeout_seconds
        now = workflow.now()
        earlier = self._checkpoint.waiting_for
        # The same question, asked again by a run that continued as new while it waited: its deadline
        # stands, and it is neither counted nor alerted again.
        repeat = self._boundary and earlier is not None and earlier.intent_key == key
        if repeat:
            timeout = max(1, math.ceil((_parse_iso(cast(Escalation, earlier).deadline) - now).total_seconds()))
        else:
            self._checkpoint.escalations += 1
            workflow.metric_meter().create_counter("agent_escalations", "Escalations to a human, by reason").add(
                1, {"reason": reason})
        self._checkpoint.waiting_for = Escalation(
            intent_key=key, tool=tool, arguments=arguments, reason=reason, detail=detail[:2000],
            since=earlier.since if repeat and earlier else _iso(now),
            deadline=earlier.deadline if repeat and earlier else _iso(now + timedelta(seconds=timeout)),
            allowed=self._allowed(question), ran=question.ran, question=self._number(repeat, earlier),
            world=f"{world.status} at {world.read_at}: {world.detail}"[:500] if world else None)
        self._set_state("awaiting_human", escalation=reason)
        if not repeat and not alerted:
            alert = self._alert("escalation", reason, key, question.alert_summary())
            if self._boundary:  # the task waits (and can be decided) while the alert is delivered, retried on its own
                self._alerts.append(asyncio.ensure_future(alert))
            else:
                await alert
        if self._counted_rollover:  # main code, in a workflow task that starts the wait's timer: replays alike
            info = workflow.info()
            self._history_at_wait = (info.get_current_history_length(), info.get_current_history_size())
            self._messages = self._message_bytes = 0
        try:
            await workflow.wait_condition(
                lambda: self._decision is not None or self._withdrawn is not None or self._rollover_due(),
                timeout=timedelta(seconds=timeout))
        except TimeoutError:
            pass
        if self._decision is None and self._withdrawn is not None:
            self._checkpoint.waiting_for = None
            self._set_state("running")
            return None
        if self._decision is None and self._rollover_due():
            # What senders sent while it waited fills the history: the question goes on in a fresh run.
            await self._continue_as_new(self._task)
        if self._decision is None:  # a decision applied as the deadline passed still counts
            raise _Stop("dead_lettered", f"no decision on {reason} for {key} within {timeout} s")
        decision, self._decision = self._decision, None
        self._checkpoint.waiting_for = None
        if not answers_later or decision.decision == "abort":
            self._answer(decision, None)
        if decision.decision == "abort":
            raise _Stop("cancelled", f"aborted by {decision.decided_by}: {decision.note}")
        self._set_state("running")
        return decision

    def _number(self, repeat: bool, earlier: Escalation | None) -> int:
        """The question's number, which a decision names (core/authority.py `screen`): the task's count of
        questions, kept by the same question carried into a new run. Since _NUMBERED_QUESTIONS; 0 before."""
        if repeat and earlier is not None:
            return earlier.question
        return self._checkpoint.escalations if workflow.patched(_NUMBERED_QUESTIONS) else 0

    @staticmethod
    def _allowed(question: Question) -> list[Decision]:
        """The decisions that apply. Since _EXHAUSTED_KEYED, not `reject` for a keyed call that ran out of
        attempts: it may have happened, and a reject would tell the model nothing was done. (Asked before it
        ran, after the model asked for it too often without success, `reject` stays.)"""
        allowed = ALLOWED[question.reason]
        if question.reason == "attempts_exhausted" and question.keyed and question.ran \
                and workflow.patched(_EXHAUSTED_KEYED):
            return [d for d in allowed if d != "reject"]
        return allowed

    async def resolve(self, *args: Any) -> None:
        self._received(args)
        await self._consider("signal", args)

    async def on_signal(self, name: str, args: Sequence[RawValue]) -> None:
        self._received(args)
        self._log_decision("signal", "ignored", f"no signal named {name[:64]!r}; decisions go to `resolve`")

    async def decide(self, *args: Any) -> DecisionReceipt:
        self._updates += 1
        self._received(args)
        return await self._receipt(await self._consider("update", args))

    def admit_decision(self, *args: Any) -> None:
        if not self._boundary:
            return
        if len(args) != 1:
            raise ValueError(f"a decision is one JSON object; got {len(args)} arguments")
        parsed = read_decision(args[0].payload.data)
        if isinstance(parsed, str):
            raise ValueError(parsed)
        problem = self._screen(parsed)
        if problem is not None:
            raise ValueError(f"decision {problem[0]}: {problem[1]}")

    async def on_update(self, name: str, args: Sequence[RawValue]) -> DecisionReceipt:
        self._updates += 1
        self._received(args)
        record = self._log_decision("update", "ignored", f"no update named {name[:64]!r}; decisions go to `decide`")
        return await self._receipt(record)

    def admit_update(self, name: str, args: Sequence[RawValue]) -> None:
        if self._boundary:
            raise ValueError(f"no update named {name[:64]!r}; decisions go to `decide`")

    async def _receipt(self, record: DecisionRecord) -> DecisionReceipt:
        """What a `decide` Update answers: the decision once it is applied (or the task ended), else why not."""
        if record.status != "applied" or record.decision is None:
            raise ApplicationError(f"decision {record.status}: {record.why}", type="DecisionNotApplied",
                                   non_retryable=True)
        decision = record.decision
        if self._boundary:
            await workflow.wait_condition(lambda: self._answer_to(decision) is not None
                                          or self._checkpoint.state in _ENDED)
            answer = self._answer_to(decision)
            if answer is not None and answer.status != "applied":
                raise ApplicationError(f"decision {answer.status}: {answer.why}", type="DecisionNotApplied",
                                       non_retryable=True)
        else:
            await workflow.wait_condition(lambda: self._decision is not decision)
        return DecisionReceipt(intent_key=decision.intent_key, decision=decision.decision,
                               decided_by=decision.decided_by, state=self._checkpoint.state)

    async def _consider(self, via: DecisionVia, args: Sequence[RawValue]) -> DecisionRecord:
        """Read, screen and verify one decision; apply it if it holds. Never raises."""
        if len(args) != 1:
            return self._log_decision(via, "ignored", f"a decision is one JSON object; got {len(args)} arguments")
        payload = args[0].payload
        parsed = read_decision(payload.data)
        if isinstance(parsed, str):
            return self._log_decision(via, "ignored", parsed, raw=payload.data[:200].decode(errors="replace"))
        problem = self._screen(parsed)
        if problem is not None:
            return self._log_decision(via, *problem, decision=parsed)
        if self._rolling:
            return self._log_decision(via, "refused", "the task is continuing as new; send it again",
                                      decision=parsed)
        # A decision whose signature holds with its signer's key as the task knows it skips the queue: a
        # flood of forged ones (checked by an activity each, at most _MAX_VERIFYING at once) cannot starve it.
        known = self._policy_keys().get(parsed.decided_by)
        with workflow.unsafe.imports_passed_through():  # the library imports its exception types as it raises
            presigned = known is not None and signature_holds(parsed, known)
        if self._verifying >= _MAX_VERIFYING and not presigned:
            return self._log_decision(via, "refused", "too many decisions are being verified; send it again",
                                      decision=parsed)
        self._verifying += 0 if presigned else 1
        try:
            verdict = await workflow.execute_activity_method(
                AuthorityActivities.verify_decision, VerifyInput(decision=parsed),
                start_to_close_timeout=policies.OPS_START_TO_CLOSE, retry_policy=policies.READ_POLICY,
                summary=f"verify {parsed.decision} by {parsed.decided_by[:80]}")
        except ActivityError as err:
            verdict = Verdict(valid=False, why=f"could not be verified: {_cause(err)[:200]}")
        finally:
            self._verifying -= 0 if presigned else 1
        if not verdict.valid:
            return self._log_decision(via, "refused", verdict.why, decision=parsed)
        problem = self._screen(parsed)  # the task may have moved on while the signature was checked
        if problem is not None:
            return self._log_decision(via, *problem, decision=parsed)
        self._decision = parsed
        self._checkpoint.used_nonces.append(parsed.nonce)
        return self._log_decision(via, "applied", None, decision=parsed)

    def _policy_keys(self) -> dict[str, str]:
        policy = self._checkpoint.policy
        return policy.approver_keys if self._boundary and policy is not None else {}

    def _screen(self, decision: ResolveInput) -> tuple[DecisionStatus, str] | None:
        if self._decision is not None:
            return "ignored", "a decision was applied already; the task is acting on it"
        waiter = Waiter(self._task.task_id, self._checkpoint.waiting_for, self._checkpoint.policy,
                        self._checkpoint.used_nonces, approvers_now=self._boundary, task_approvers=self._task.approvers)
        return screen(decision, waiter, workflow.now())

    def _log_decision(self, via: DecisionVia, status: DecisionStatus, why: str | None,
                      decision: ResolveInput | None = None, raw: str | None = None) -> DecisionRecord:
        """Keep the latest decisions and a count of all of them: the checkpoint stays bounded."""
        record = DecisionRecord(received_at=_iso(workflow.now()), via=via, status=status,
                                why=why[:300] if why else None, decision=decision, raw=raw)
        cp = self._checkpoint
        cp.decisions = [*cp.decisions[-(DECISIONS_KEPT - 1):], record]
        cp.decision_counts[status] = cp.decision_counts.get(status, 0) + 1
        self._touch()
        return record

    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    async def _alert(self, kind: AlertKind, reason: str, key: str | None, summary: str) -> None:
        """An alert that cannot be delivered must not end the task: the wait and its search
        attributes stay visible, and the failure is in the checkpoint."""
        try:
            await workflow.execute_activity_method(
                OperationsActivities.raise_alert,
                self._alert_input(kind, reason, key, summary, self._checkpoint.escalations),
                start_to_close_timeout=policies.OPS_START_TO_CLOSE, retry_policy=policies.READ_POLICY,
                summary=f"alert: {kind} {reason}",
            )
        except ActivityError as err:
            self._checkpoint.alert_failures.append(f"{kind} {reason}: {_cause(err)}"[:500])
            self._touch()

    def _alert_input(self, kind: AlertKind, reason: str, key: str | None, summary: str, number: int) -> AlertInput:
        """`number`: the task's escalation count once this one is counted: one alert key per escalation."""
        return AlertInput(alert_key=f"{self._task.task_id}:{workflow.info().run_id}:{kind}:{number}",
                          task_id=self._task.task_id, kind=kind, reason=reason, intent_key=key, summary=summary,
                          checkpoint=self._checkpoint.model_dump(mode="json"))

    async def _alerts_delivered(self) -> None:
        """Escalation alerts finish (delivered, or their failure recorded) before the run ends."""
        pending, self._alerts = self._alerts, []
        for alert in pending:
            await alert

    async def _dead_letter(self, reason: str) -> None:
        """Store the task with its whole checkpoint and alert: never a silent failure."""
        wait = self._checkpoint.waiting_for
        workflow.metric_meter().create_counter("agent_dead_letters", "Tasks ended as dead letters").add(1)
        self._checkpoint.dead_letter_reason = reason
        self._checkpoint.waiting_for = None
        self._set_state("dead_lettered", escalation=wait.reason if wait else "dead_letter")
        await workflow.execute_activity_method(
            OperationsActivities.store_dead_letter,
            DeadLetterInput(task_id=self._task.task_id, run_id=workflow.info().run_id, reason=reason,
                            checkpoint=self._checkpoint.model_dump(mode="json")),
            start_to_close_timeout=policies.OPS_START_TO_CLOSE, retry_policy=policies.OPS_POLICY,
            summary=f"dead letter: {reason}"[:200],
        )
        await self._alert("dead_letter", reason, None, f"task {self._task.task_id} is a dead letter: {reason}")

    # --- bookkeeping ---------------------------------------------------------------------

    def _reject(self, tool: str, reason: str, message: str) -> ToolResult:
        name = tool[:64]  # a model may send anything as a name; keep the checkpoint small
        result = ToolResult(tool=name, outcome=Outcome.NOT_PERFORMED, reason=reason, message=message,
                            retryable=True, attempt=0)
        step = self._step(name, None, {})
        self._record(step, result)
        step.status = "rejected"
        return result

    def _step(self, tool: str, key: str | None, arguments: dict[str, Any]) -> Step:
        if key is not None and key in self._step_by_key:
            return self._checkpoint.steps[self._step_by_key[key]]
        count = self._checkpoint.calls.get(tool, 0)
        self._checkpoint.calls[tool] = count + 1
        name = tool if count == 0 else f"{tool}#{count + 1}"
        if key is not None:
            self._step_by_key[key] = name
        step = self._checkpoint.steps[name] = Step(tool=tool, status="running", intent_key=key, arguments=arguments)
        return step

    def _occurrence(self, spec: ToolSpec, arguments: dict[str, Any]) -> int:
        """For tools without business fields: performed identical calls so far, plus one."""
        if spec.key_fields:
            return 1
        same = [s for s in self._checkpoint.steps.values()
                if s.tool == spec.name and s.arguments == arguments and s.outcome in SETTLED]
        return len(same) + 1

    def _record(self, step: Step, result: ToolResult) -> None:
        """One answer on the step: typed counters first, the trail line for people from them."""
        if result.data.get("source") not in ("human", "world"):
            step.asks += 1
            if result.outcome not in SETTLED:
                step.unsettled_asks += 1
        step.trail.append(trail_line(step.asks, result))
        step.outcome = result.outcome
        step.reason = result.reason
        # A read's answer is in its activity's result and the transcript; the checkpoint (and so the
        # task's result) keeps what the writes did.
        data = result.data if step.intent_key is not None else {}
        step.result = {**data, **({"message": result.message} if result.message else {})}
        if result.outcome is None:
            step.status = "done" if result.reason is None else "not_performed"
        elif result.outcome in SETTLED:
            step.status = "done"
        elif result.outcome is Outcome.UNKNOWN:
            step.status = "unknown"
        else:
            step.status = "not_performed"
        self._touch()

    def _set_state(self, state: TaskState, escalation: str | None = None) -> None:
        self._checkpoint.state = state
        updates: list[SearchAttributeUpdate[Any]] = [
            names.STATUS_ATTR.value_set(state),
            names.SCENARIO_ATTR.value_set(self._checkpoint.scenario),
            names.ESCALATION_ATTR.value_set(escalation) if escalation else names.ESCALATION_ATTR.value_unset(),
        ]
        if self._wait_attrs:
            updates += self._wait_attributes(state)
        if self._lean:  # only what changed (the starter sets status and scenario with the start)
            current = workflow.info().typed_search_attributes
            updates = [u for u in updates if current.get(u.key) != u.value]
        if updates:
            workflow.upsert_search_attributes(updates)
        self._touch()

    def _wait_attributes(self, state: TaskState) -> list[SearchAttributeUpdate[Any]]:
        """While the task waits for a person: why, the amount at stake and the deadline, for the Web
        UI's list to show as columns. Kept when the task ends as a dead letter (the wait nobody
        answered, if that is how it died: AgentEscalation says so too); unset in every other state."""
        if state == "dead_lettered":
            return []
        wait = self._checkpoint.waiting_for if state == "awaiting_human" else None
        if wait is None:
            return [names.WAIT_REASON_ATTR.value_unset(), names.AMOUNT_ATTR.value_unset(),
                    names.DEADLINE_ATTR.value_unset()]
        amount = wait.arguments.get("amount_cents")
        at_stake = amount if isinstance(amount, int) and not isinstance(amount, bool) and 0 <= amount < 2**63 else None
        return [names.WAIT_REASON_ATTR.value_set(f"{wait.reason}: {wait.tool}"),
                names.AMOUNT_ATTR.value_set(at_stake) if at_stake is not None else names.AMOUNT_ATTR.value_unset(),
                names.DEADLINE_ATTR.value_set(_parse_iso(wait.deadline))]

    def _touch(self) -> None:
        self._checkpoint.updated_at = _iso(workflow.now())
        workflow.set_current_details(current_details(self._checkpoint))

# Since this change a new run records one patch marker, this one, and takes every change patched before it
# without recording theirs (`_since`). Each marker costs two events, the marker and the TemporalChangeVersion
# search attribute the SDK upserts beside it (a visibility write at the server): six of each per task before.
# A later change gets its own marker as usual, until the next such fold.
_ONE_MARKER = "one-marker-2026-12"
# The second fold: a new run records this marker alone and takes every change before it, those checked with
# `_since` and with `_since_folded`. Since it, in a task begun by such a run, a message's money status
# (refund_status, payment_status and the item or invoice they speak of) is part of the message's intent key
# (`ToolSpec.key_extras`): a message saying the refund was issued is sent after one that said it was not,
# whatever its free text. A task begun before keeps its keys in every later run, its continuations and its
# redrives (`Checkpoint.status_in_message_keys`): a change of keys mid-task would send a message twice.
_FOLDED = names.FOLD_MARKER
# Since this change the task's policy is a local activity and search attributes are upserted only
# when they change; older histories hold an activity for the policy and an upsert per state change.
_LEAN = "policy-local-upsert-changes"
# Since this change the workflow reads record_human_decision's verdict; older histories did not.
_SETTLE_CHECKED = "settle-checked-against-provider"
# Since this change a policy read that fails for good makes the task a dead letter; before, it failed.
_POLICY_FAILURE = "policy-failure-dead-letters"
# Since this change the world (ledger and provider) is read before a person is asked about a keyed call
# and before a decision that rests on it is kept (`_read_world`); a task's own ceiling goes to the tool.
_BOUNDARY = "human-boundary"
# Since this change a waiting task's reason, amount and deadline are search attributes
# (AgentWaitReason, AgentAmountCents, AgentDeadline), unset when it stops waiting but for a dead letter.
_WAIT_ATTRIBUTES = "wait-search-attributes"
# Handlers schedule nothing once the run has decided to continue as new (`_continue_as_new`).
_QUIET_ROLLOVER = "quiet-rollover"
# Since this change a waiting run continues as new on what its handlers counted, not on the history's
# length and size as the server reports them in the wait's condition (`_rollover_due`).
_COUNTED_ROLLOVER = "counted-rollover"
# Since this change a read tool (get_order, lookup_invoice, ...) is a local activity; before, an activity.
_LOCAL_READS = "local-reads"
# Since this change the read before a question and the question's alert are one activity (`_ask`);
# before, the alert was raised a workflow task after the read, and what landed between was asked about.
_ASK_AFTER_READING = "ask-after-reading"
# Since this change a task waiting for a person on an unknown outcome reads the world again now and then,
# and goes on without the person once it shows the outcome (`_recheck`).
_RECHECK_WHILE_ASKED = "recheck-while-asked"
# Since this change a question carried into a new run is withdrawn (waiting_for cleared, the person told) when
# the world settles it; before, it stood, and a decision on it was kept for the task's next question. Checked
# only where a carried question is taken up: other runs record no marker for it.
_CARRIED_QUESTION = "carried-question-settled"
# Since this change a run continuing as new acts on a decision a `decide` Update applied while the handlers
# finished; before, the run waited for that handler, which waited for the decision's answer. Checked only when
# a run continues as new.
_DECIDED_WHILE_ROLLING = "decided-while-rolling"
# Since this change a question carried into a new run about a call that ran (its outcome unknown, its attempts
# spent) is settled by the world's "not performed", as in the run that asked it; before, a person was still asked.
# Checked only where such a question is taken up.
_CARRIED_RAN = "carried-question-ran"
# Since this change a wait on the model's unusable replies goes on in the run that continues as new while it
# waits. Checked only when a run continues as new during that wait.
_CARRIED_MODEL_QUESTION = "carried-model-question"
# Since this change `reject` is not offered for a keyed call that ran out of attempts (`_allowed`). Checked only
# where such a call is asked about.
_EXHAUSTED_KEYED = "exhausted-keyed-no-reject"
# Since this change each question is numbered and a decision names the one it answers: a signed answer to one
# question no longer applies to a later question about the same call. Checked only where a person is asked.
_NUMBERED_QUESTIONS = "numbered-questions"
# The changes made since _FOLDED, each with its own marker (the next fold takes them in).
SINCE_FOLD = (_CARRIED_RAN, _CARRIED_MODEL_QUESTION, _EXHAUSTED_KEYED, _NUMBERED_QUESTIONS)
_AFTER_RUNNING = ("unknown_outcome", "attempts_exhausted")  # reasons a call is asked about once it ran
_RECHECK_AT_MOST = 3600.0  # seconds between two reads of the world while a person is asked
_EVENTS_PER_MESSAGE = 4  # its own event and, at worst, a workflow task of its own (scheduled, started, completed)
_MESSAGE_OVERHEAD_BYTES = 512  # an event's own fields beside the payload
_ANSWERS_KEPT = 8
_UPDATES_PER_RUN = 1000  # the server refuses Updates past 2,000 per run (limit.workflowExecution.maxTotalUpdates)
_ENDED = ("completed", "dead_lettered", "cancelled")
_WORLD_READS = 4  # reads of one intent per question: each after the last request in flight could land

_Action = Callable[[Agent, TaskInput, GateCall, ResolveInput, EscalationReason],
                   Awaitable["ToolResult | Refused | None"]]

# What each decision does to the call that waits for it (abort ends the task in _await_decision).
# An action answers the call, or returns None: run the call again.
_ACTIONS: dict[str, _Action] = {
    "approve": Agent._approve,
    "reject": Agent._reject_call,
    "mark_performed": Agent._settle,
    "mark_not_performed": Agent._settle,
}


def _human_result(call: GateCall, outcome: Outcome, decision: ResolveInput, reason: str | None = None) -> ToolResult:
    return ToolResult(tool=call.spec.name, outcome=outcome, intent_key=call.key, reason=reason,
                      message=f"{decision.decided_by}: {decision.note}",
                      data={"source": "human", "decided_by": decision.decided_by})


def _escalation_reason(result: ToolResult) -> EscalationReason | None:
    if result.reason == Waiting.APPROVAL_REQUIRED:
        return "approval_required"
    if result.reason == Waiting.ATTEMPTS_EXHAUSTED:
        return "attempts_exhausted"
    if result.outcome is Outcome.UNKNOWN:
        return "unknown_outcome"
    return None


def _within_bytes(transcript: list[ChatMessage], limit: int) -> list[ChatMessage]:
    """The transcript's pinned head (the brief) and as many of its latest messages as fit in `limit`
    bytes of JSON, never starting on an orphan tool result."""
    head = next((i for i, m in enumerate(transcript[:2]) if m.role not in ("system", "user")), min(2, len(transcript)))
    pinned, rest = transcript[:head], transcript[head:]
    size = sum(len(m.model_dump_json()) for m in pinned)
    kept: list[ChatMessage] = []
    for message in reversed(rest):
        size += len(message.model_dump_json())
        if size > limit:
            break
        kept.append(message)
    kept.reverse()
    while kept and kept[0].role == "tool":
        kept = kept[1:]
    return pinned + kept


def _inspect_input(task: TaskInput, call: GateCall) -> InspectInput:
    return InspectInput(task_id=task.task_id, tool=call.spec.name, intent_key=cast(str, call.key),
                        arguments=call.arguments)


def _cause(err: FailureError) -> str:
    return getattr(err.cause, "message", None) or str(err.cause or err)


def _parse_iso(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _iso(moment: datetime) -> str:
    # As strftime("%Y-%m-%dT%H:%M:%SZ"), which imports the time module on every call: through the
    # sandbox's import hook that was a third of a millisecond of a ticket, for a timestamp per step.
    return (f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
            f"T{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}Z")
