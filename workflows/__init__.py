"""Workflow code only: deterministic, no I/O.

The names below resolve on first use: the workflow sandbox imports this package afresh for every
workflow run, and an agent task should not pay for importing the reconciliation workflow too.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the type checker sees the names themselves; at run time __getattr__ imports them
    from workflows.agent_task import AgentTaskWorkflow as AgentTaskWorkflow
    from workflows.reconcile import RECONCILE_WORKFLOW as RECONCILE_WORKFLOW
    from workflows.reconcile import ReconcileWorkflow as ReconcileWorkflow

_MODULE_OF = {"AgentTaskWorkflow": "workflows.agent_task", "ReconcileWorkflow": "workflows.reconcile",
              "RECONCILE_WORKFLOW": "workflows.reconcile"}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> object:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'workflows' has no attribute {name!r}")
    return getattr(import_module(_MODULE_OF[name]), name)
