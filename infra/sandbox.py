"""The workflow sandbox, with the snippets it runs compiled once instead of on every call.

The SDK's sandbox enters the sandboxed run through `exec` of a short source string: once per
activation and once per payload it encodes or decodes (to ask the run for its serialization
context). `exec` of a string compiles it every time, about 15 microseconds each, which a busy
worker's profile showed as a twelfth of its Python CPU. The strings are a handful of constants, so
each is compiled once here and the same code object runs; what runs, in which globals and under
which restrictions, is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import CodeType
from typing import Any

from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox._runner import _Instance

# The SDK's snippets are a few fixed strings; the bound only guards against a future SDK that
# formats values into them.
_SNIPPETS_KEPT = 64


@lru_cache(maxsize=_SNIPPETS_KEPT)
def _compiled(source: str) -> CodeType:
    return compile(source, "<string>", "exec")


class _CompiledOnce(_Instance):
    def _run_code(self, code: str, **extra_globals: Any) -> None:
        super()._run_code(_compiled(code), **extra_globals)  # type: ignore[arg-type]  # exec takes either


@dataclass(frozen=True)
class CompiledSandboxRunner(SandboxedWorkflowRunner):
    """SandboxedWorkflowRunner (same restrictions, same per-run re-import) with its snippets compiled once."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _CompiledOnce(det, self.runner_class, self.restrictions)
