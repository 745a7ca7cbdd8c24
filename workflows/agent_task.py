"""The agent loop: model turn -> gated tool calls -> results back to the model.

Deterministic: every model turn and every tool call is an activity, so the event history
is the checkpoint and a restarted worker resumes at the first step not done. The task's
authority (its tools, approvers, ceilings, deadline) comes from the worker once, through the
`task_policy` activity. Where the task cannot know or must not act alone, it waits for a signed
human decision (signal `resolve` or Update `decide`); a wait nobody answers ends as a stored,
alerted dead letter. Whatever a sender sends is answered or recorded, never raised.
"""

# Annotations here are evaluated, not postponed (no `from __future__ import annotations`): the SDK reads
# the handlers' type hints on every run's import, and a postponed one is compiled and evaluated there.
import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():  # one module: the sandbox passes each through on every run
    from workflows._outside import (
        Checkpoint,
        DecisionReceipt,
        TaskInput,
        TaskResult,
        names,
    )

from workflows._agent import Agent

# What the Web UI shows beside the names in its Send a Signal and Update pickers.
_RESOLVE_HELP = ("A person's signed decision on the call this task waits for: the JSON that starter.py sign "
                 "prints (Current details, in the User Metadata tab, give the command).")
_DECIDE_HELP = "The same signed decision as the `resolve` signal, answered: applied, or why not."
_Handler = TypeVar("_Handler", bound=Callable[..., Any])


def _raw_payloads(handler: _Handler) -> _Handler:
    """A named handler that gets each payload as it came (a RawValue), like a dynamic handler.

    The SDK decodes a named handler's payloads before any of its code runs, with the types its
    signature declares; a payload that does not decode would drop the signal, or fail the Update,
    unrecorded. So the SDK is shown a signature of one RawValue: one payload, whatever it holds,
    arrives undecoded and is read inside the handler's guard (`read_decision`). The handler itself
    takes `*args`: no payload arrives as none, and two or more arrive decoded without types (the
    SDK's rule when their count differs from the signature's), to be recorded as the wrong count."""
    parameters = list(inspect.signature(handler).parameters.values())[:1]  # self
    one = inspect.Parameter("payload", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RawValue)
    handler.__signature__ = inspect.Signature([*parameters, one])  # type: ignore[attr-defined]
    handler.__annotations__ = {"payload": RawValue, "return": handler.__annotations__.get("return")}
    return handler


@workflow.defn(name=names.WORKFLOW_NAME)
class AgentTaskWorkflow:
    """The agent task as Temporal sees it: its handlers, each handing over to the run's `Agent`.

    The sandbox imports this module afresh for every workflow run, and `@workflow.defn` then checks
    each member of the class, about 15 microseconds apiece: the task's fifty-odd steps live on a plain
    class (workflows/_agent.py) so that the check covers only these handlers."""

    @workflow.init
    def __init__(self, task: TaskInput) -> None:
        self._agent = Agent(task)

    @workflow.run
    async def run(self, task: TaskInput) -> TaskResult:
        return await self._agent.run(task)

    @workflow.signal(name="resolve", description=_RESOLVE_HELP)
    @_raw_payloads
    async def resolve(self, *args: Any) -> None:
        """A person's decision, from the Web UI or `temporal workflow signal`. A decision of any shape
        or size is recorded in the checkpoint; only a valid signed one changes anything."""
        await self._agent.resolve(*args)

    @workflow.signal(dynamic=True)
    async def on_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """Any other signal is recorded in the checkpoint and changes nothing."""
        await self._agent.on_signal(name, args)

    @workflow.update(name="decide", description=_DECIDE_HELP)
    @_raw_payloads
    async def decide(self, *args: Any) -> DecisionReceipt:
        """The same decision for callers that need an answer. A decision that does not apply is
        recorded too, and the caller gets why as the Update's failure."""
        return await self._agent.decide(*args)

    @decide.validator
    @_raw_payloads  # the SDK requires the validator's parameters to be the handler's
    def _admit_decision(self, *args: Any) -> None:
        """Refuse, before anything is written to the history, a decision the workflow can tell alone
        will not apply: an unreadable payload, one the screen refuses. The sender gets why; the
        history and the server's Updates per run are spent only on decisions whose signature is
        worth checking."""
        self._agent.admit_decision(*args)

    @workflow.update(dynamic=True)
    async def on_update(self, name: str, args: Sequence[RawValue]) -> DecisionReceipt:
        """Any other Update is recorded too (when it gets past the validator) and refused."""
        return await self._agent.on_update(name, args)

    @on_update.validator
    def _admit_update(self, name: str, args: Sequence[RawValue]) -> None:
        self._agent.admit_update(name, args)

    @workflow.query
    def checkpoint(self) -> Checkpoint:
        return self._agent.checkpoint()
