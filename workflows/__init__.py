"""Workflow code only: deterministic, no I/O."""

from workflows.agent_task import AgentTaskWorkflow

__all__ = ["AgentTaskWorkflow"]
