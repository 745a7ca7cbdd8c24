"""The workflow sandbox, with the snippets it runs compiled once instead of on every call.

The SDK's sandbox enters the sandboxed run through `exec` of a short source string: once per
activation and once per payload it encodes or decodes (to ask the run for its serialization
context). `exec` of a string compiles it every time, about 15 microseconds each, which a busy
worker's profile showed as a twelfth of its Python CPU. The strings are a handful of constants, so
each is compiled once here and the same code object runs; what runs, in which globals and under
which restrictions, is unchanged.

The serialization and external-storage contexts of a payload are read without entering the sandbox:
the SDK asks the run for them once per payload sequence it encodes or decodes, and answers from the
run's own bookkeeping (its pending activities, children and signals, its info) with SDK code alone,
no workflow code. Each entry swaps the sandbox's builtins and import machinery in and out, and on a
busy worker those entries for contexts were 5.7% of its Python CPU, more than the contexts themselves.

Our modules outside the workflow package (`core`, `activities`) are passed through by the runner's
restrictions, not only where the workflow imports them (workflows/_outside.py): an import of one the
workflow makes later, in a helper, at run time, gets the worker's module instead of a second copy
executed inside the sandbox, whose classes would not be the worker's (a pydantic model built by the
payload converter would fail `isinstance` against the copy's).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import CodeType
from typing import Any, cast

from temporalio.converter import SerializationContext
from temporalio.converter._extstore import StorageDriverStoreContext
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker._command_aware_visitor import CommandInfo
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.worker.workflow_sandbox._in_sandbox import InSandbox
from temporalio.worker.workflow_sandbox._runner import _Instance

# The SDK's snippets are a few fixed strings; the bound only guards against a future SDK that
# formats values into them.
_SNIPPETS_KEPT = 64

# The SDK's restrictions, with the deterministic, state-free code the workflow calls (core) and the
# activities it names (activities) passed through.
RESTRICTIONS = SandboxRestrictions.default.with_passthrough_modules("core", "activities")


@lru_cache(maxsize=_SNIPPETS_KEPT)
def _compiled(source: str) -> CodeType:
    return compile(source, "<string>", "exec")


class _CompiledOnce(_Instance):
    def _run_code(self, code: str, **extra_globals: Any) -> None:
        super()._run_code(_compiled(code), **extra_globals)  # type: ignore[arg-type]  # exec takes either

    def _run(self) -> InSandbox:
        """The run's object inside the sandbox, which the SDK's snippets call into."""
        return cast(InSandbox, self.globals_and_locals["__temporal_in_sandbox"])

    def get_serialization_context(self, command_info: CommandInfo | None) -> SerializationContext | None:
        return self._run().get_serialization_context(command_info)

    def get_external_store_context(self, command_info: CommandInfo | None) -> StorageDriverStoreContext:
        return self._run().get_external_store_context(command_info)


@dataclass(frozen=True)
class CompiledSandboxRunner(SandboxedWorkflowRunner):
    """SandboxedWorkflowRunner (the SDK's restrictions with our modules outside the workflow package passed
    through, the same per-run re-import of the workflow's module) with its snippets compiled once."""

    restrictions: SandboxRestrictions = RESTRICTIONS

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _CompiledOnce(det, self.runner_class, self.restrictions)
