"""Workflows for tests/test_sandbox.py, in a module of their own: the sandbox re-imports a workflow's
module for every run, which is what the runner under test must keep doing."""

from __future__ import annotations

import datetime
from datetime import timedelta

from temporalio import workflow


@workflow.defn(name="SandboxEcho")
class EchoWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        echoed: str = await workflow.execute_activity("sandbox_echo", text, result_type=str,
                                                      start_to_close_timeout=timedelta(seconds=30))
        return echoed


@workflow.defn(name="SandboxReadsTheClock")
class ReadsTheClockWorkflow:
    @workflow.run
    async def run(self) -> str:
        return datetime.datetime.now().isoformat()  # not deterministic: the sandbox must refuse it


@workflow.defn(name="SandboxImportsLater")
class ImportsLaterWorkflow:
    @workflow.run
    async def run(self) -> str:
        from core import kinds  # the import at run time under test
        return str(getattr(kinds, "PROBE", "a copy executed inside the sandbox"))
