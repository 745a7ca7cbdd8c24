"""The retry probe's workflow (devstack/retry_probe.py): one activity whose first attempt fails.

Workflow code only; the activity it calls by name, `probe_step`, is defined in devstack/retry_probe.py.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

PROBE_WORKFLOW = "RetryProbe"
PROBE_ACTIVITY = "probe_step"
RETRY_AFTER = timedelta(seconds=0.25)  # the first retry interval of our tool policies


@workflow.defn(name=PROBE_WORKFLOW)
class RetryProbeWorkflow:
    @workflow.run
    async def run(self, number: int) -> list[float]:
        """The seconds the retry waited: from its schedule time, and from the first attempt's failure, to its start."""
        return await workflow.execute_activity(
            PROBE_ACTIVITY, number, result_type=list[float], start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(initial_interval=RETRY_AFTER, backoff_coefficient=1.0, maximum_attempts=2))
