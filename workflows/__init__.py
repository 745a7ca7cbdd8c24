"""Workflow code only: deterministic, no I/O."""

from workflows.agent_task import AgentTaskWorkflow
from workflows.reconcile import RECONCILE_WORKFLOW, ReconcileWorkflow

__all__ = ["AgentTaskWorkflow", "RECONCILE_WORKFLOW", "ReconcileWorkflow"]
