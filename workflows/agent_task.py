"""The agent loop: model turn -> gated tool calls -> results back to the model.

Deterministic: every model turn and every tool call is an activity, so the event history
is the checkpoint and a restarted worker resumes at the first step not done.
"""

from __future__ import annotations

import json
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from core import names, policies
    from core.keys import derive_intent_key
    from core.models import (
        SETTLED,
        ChatMessage,
        Checkpoint,
        ModelReply,
        ModelTurnInput,
        Outcome,
        Step,
        TaskInput,
        TaskResult,
        ToolCall,
        ToolInput,
        ToolResult,
    )
    from core.tools import REGISTRY, ToolSpec, tool_schemas

SYSTEM_PROMPT = (
    "You are an operations agent. Use the tools. Every write tool answers performed, "
    "already_performed, not_performed (nothing changed; you may retry) or unknown "
    "(do not retry; escalate). Never promise what a tool did not report as performed."
)

_JOURNAL_NOTE = "settled earlier in this task; not run again"


@workflow.defn(name=names.WORKFLOW_NAME)
class AgentTaskWorkflow:
    @workflow.init
    def __init__(self, task: TaskInput) -> None:
        self._checkpoint = Checkpoint(task_id=task.task_id, scenario=task.scenario)
        self._journal: dict[str, ToolResult] = {}
        self._step_by_key: dict[str, str] = {}

    @workflow.run
    async def run(self, task: TaskInput) -> TaskResult:
        self._set_state("running")
        messages = [ChatMessage(role="system", content=SYSTEM_PROMPT), ChatMessage(role="user", content=task.brief)]
        schemas = tool_schemas()
        final: str | None = None
        for turn in range(1, task.max_turns + 1):
            self._checkpoint.turns = turn
            reply: ModelReply = await workflow.execute_activity(
                names.MODEL_TURN_ACTIVITY,
                ModelTurnInput(task_id=task.task_id, scenario=task.scenario, turn=turn, messages=messages,
                               tools=schemas, model_options=task.model_options),
                result_type=ModelReply,
                start_to_close_timeout=policies.MODEL_START_TO_CLOSE,
                retry_policy=policies.MODEL_POLICY,
                heartbeat_timeout=policies.TOOL_HEARTBEAT,
                summary=f"model turn {turn}",
            )
            messages.append(ChatMessage(role="assistant", content=reply.content, tool_calls=reply.tool_calls))
            if not reply.tool_calls:
                final = reply.content
                break
            for call in reply.tool_calls:
                result = await self._gate(task, call)
                messages.append(ChatMessage(role="tool", tool_call_id=call.id, name=call.name,
                                            content=result.model_dump_json(exclude_defaults=True)))
            self._touch()
        self._checkpoint.final_answer = final if final is not None else f"turn limit of {task.max_turns} reached"
        self._set_state("completed")
        return TaskResult(task_id=task.task_id, state=self._checkpoint.state,
                          final_answer=self._checkpoint.final_answer, checkpoint=self._checkpoint)

    @workflow.query
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    async def _gate(self, task: TaskInput, call: ToolCall) -> ToolResult:
        """The one path every tool call takes: validate, key, dedupe, run, record."""
        spec = REGISTRY.get(call.name)
        if spec is None:
            return self._reject(call, "unknown_tool", f"no tool named {call.name!r}; tools: {sorted(REGISTRY)}")
        try:
            raw = json.loads(call.arguments or "{}")
            if not isinstance(raw, dict):
                raise ValueError("arguments must be a JSON object")
            arguments = spec.args.model_validate(raw).model_dump(mode="json")
        except ValidationError as err:
            errors = [{"field": ".".join(map(str, e["loc"])), "error": e["msg"]} for e in err.errors()]
            return self._reject(call, "invalid_arguments", json.dumps(errors))
        except ValueError as err:
            return self._reject(call, "malformed_arguments", str(err))

        key = None
        if spec.needs_key:
            key = derive_intent_key(spec.name, spec.key_fields, arguments, {"task_id": task.task_id},
                                    occurrence=self._occurrence(spec, arguments))
        step_name = self._step_name(spec.name, key)
        step = self._checkpoint.steps.get(step_name) or Step(tool=spec.name, status="running", intent_key=key,
                                                             arguments=arguments)
        self._checkpoint.steps[step_name] = step

        if key is not None and key in self._journal:
            settled = self._journal[key]
            result = ToolResult(tool=spec.name, outcome=Outcome.ALREADY_PERFORMED, intent_key=key, data=settled.data,
                                message=_JOURNAL_NOTE)
            self._record(step, result)
            return result

        step.status = "running"
        self._touch()
        result = await self._run_tool(task, spec, arguments, key)
        step.attempts += result.attempt
        self._record(step, result)
        if key is not None and result.outcome in SETTLED:
            self._journal[key] = result
        return result

    async def _run_tool(self, task: TaskInput, spec: ToolSpec, arguments: dict, key: str | None) -> ToolResult:
        policy = policies.POLICY_BY_CLASS[spec.tool_class]
        try:
            return await workflow.execute_activity(
                spec.name,
                ToolInput(task_id=task.task_id, tool=spec.name, arguments=arguments, intent_key=key),
                result_type=ToolResult,
                start_to_close_timeout=policies.TOOL_START_TO_CLOSE,
                heartbeat_timeout=policies.TOOL_HEARTBEAT,
                retry_policy=policy,
                summary=_summary(spec.name, arguments, key),
            )
        except ActivityError as err:
            cause = getattr(err.cause, "message", None) or str(err.cause or err)
            if spec.needs_key:
                # The activity could not tell us what happened: never report a bare failure.
                return ToolResult(tool=spec.name, outcome=Outcome.UNKNOWN, intent_key=key, reason="tool_error",
                                  message=f"outcome unknown, do not retry: {cause}",
                                  attempt=policy.maximum_attempts)
            return ToolResult(tool=spec.name, reason="tool_error", message=cause, retryable=True,
                              attempt=policy.maximum_attempts)

    def _reject(self, call: ToolCall, reason: str, message: str) -> ToolResult:
        result = ToolResult(tool=call.name, outcome=Outcome.NOT_PERFORMED, reason=reason, message=message,
                            retryable=True, attempt=0)
        name = self._step_name(call.name, None)
        self._checkpoint.steps[name] = Step(tool=call.name, status="rejected", reason=reason,
                                            result={"message": message})
        self._touch()
        return result

    def _occurrence(self, spec: ToolSpec, arguments: dict) -> int:
        """For tools without business fields: performed identical calls so far, plus one."""
        if spec.key_fields:
            return 1
        same = [s for s in self._checkpoint.steps.values()
                if s.tool == spec.name and s.arguments == arguments and s.outcome in SETTLED]
        return len(same) + 1

    def _step_name(self, tool: str, key: str | None) -> str:
        if key is not None and key in self._step_by_key:
            return self._step_by_key[key]
        count = sum(1 for s in self._checkpoint.steps.values() if s.tool == tool)
        name = tool if count == 0 else f"{tool}#{count + 1}"
        if key is not None:
            self._step_by_key[key] = name
        return name

    def _record(self, step: Step, result: ToolResult) -> None:
        step.trail.append(_trail_line(len(step.trail) + 1, result))
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

    def _set_state(self, state: str) -> None:
        self._checkpoint.state = state
        workflow.upsert_search_attributes([
            names.STATUS_ATTR.value_set(state),
            names.SCENARIO_ATTR.value_set(self._checkpoint.scenario),
        ])
        self._touch()

    def _touch(self) -> None:
        self._checkpoint.updated_at = workflow.now().strftime("%Y-%m-%dT%H:%M:%SZ")


def _trail_line(ask: int, result: ToolResult) -> str:
    line = f"ask {ask}: {result.outcome or ('error' if result.reason else 'ok')}"
    if result.reason:
        line += f" ({result.reason})"
    elif result.message and result.outcome not in SETTLED:
        line += f" ({result.message})"
    if result.attempt > 1:
        line += f" after {result.attempt} attempts"
    if result.message == _JOURNAL_NOTE:
        line += ", from the task journal"
    elif result.data.get("source") == "ledger":
        line += ", from the ledger"
    elif "verified_by" in result.data:
        line += f", verified by provider lookup after {result.data.get('after', 'an earlier attempt')}"
    return line


def _summary(tool: str, arguments: dict, key: str | None) -> str:
    parts = [tool]
    if "amount_cents" in arguments:
        parts.append(f"{arguments['amount_cents'] / 100:.2f} {arguments.get('currency', '').upper()}")
    for field in ("order_id", "invoice_id", "item_id"):
        if field in arguments:
            parts.append(arguments[field])
    if key:
        parts.append(f"key {key}")
    return " | ".join(parts)
