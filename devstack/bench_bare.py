"""The bare baseline for `devstack.load`: a Temporal workflow that runs N plain activities in a row.

No gate, no intent keys, no ledger, no checkpoint, no search attributes: what the same number of
activities per task costs on the same server with nothing of ours around it. Workflow code only
(the activity it calls by name, `bare_step`, is defined in devstack/load.py).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

BARE_WORKFLOW = "BareTask"
BARE_ACTIVITY = "bare_step"


@workflow.defn(name=BARE_WORKFLOW)
class BareTaskWorkflow:
    @workflow.run
    async def run(self, activities: int, per_run: int = 0) -> int:
        """`activities` steps; with `per_run`, a fresh run (continue-as-new) after every `per_run` of them,
        as a long task must to stay within Temporal's history limits."""
        for step in range(activities):
            if per_run and step == per_run:
                workflow.continue_as_new(args=[activities - per_run, per_run])
            await workflow.execute_activity(BARE_ACTIVITY, step, result_type=int,
                                            start_to_close_timeout=timedelta(seconds=60))
        return activities
