"""The bare baseline for `devstack.load`: a Temporal workflow that runs N plain activities in a row.

No gate, no intent keys, no ledger, no checkpoint, no search attributes: what the same number of
activities per task costs on the same server with nothing of ours around it. Workflow code only
(the activities it calls by name, `bare_step` and `bare_io_step`, are defined in devstack/load.py).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

BARE_WORKFLOW = "BareTask"
BARE_ACTIVITY = "bare_step"
BARE_IO_ACTIVITY = "bare_io_step"


@workflow.defn(name=BARE_WORKFLOW)
class BareTaskWorkflow:
    @workflow.run
    async def run(self, activities: int, per_run: int = 0, payment_intent: str = "", amount_cents: int = 0) -> int:
        """`activities` steps; with `per_run`, a fresh run (continue-as-new) after every `per_run` of them,
        as a long task must to stay within Temporal's history limits. With `payment_intent`, each step is
        `bare_io_step`, which makes a ticket's provider requests at the steps where a ticket's tools run
        (devstack/load.py `--bare-io`)."""
        for step in range(activities):
            if per_run and step == per_run:
                workflow.continue_as_new(args=[activities - per_run, per_run, payment_intent, amount_cents])
            if payment_intent:
                await workflow.execute_activity(BARE_IO_ACTIVITY, args=[step, payment_intent, amount_cents],
                                                result_type=int, start_to_close_timeout=timedelta(seconds=60))
            else:
                await workflow.execute_activity(BARE_ACTIVITY, step, result_type=int,
                                                start_to_close_timeout=timedelta(seconds=60))
        return activities
