"""Before a ticket's task starts: its facts name an order (or invoice) we hold and the provider knows.

The worker checks (activities/facts.py: it holds the ledger and the provider's key); the starter
asks it through Temporal with a standalone activity on the task queue, and starts nothing when the
answer names a problem.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio.client import ActivityFailureError, Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import TimeoutError, TimeoutType
from temporalio.service import RPCError

from client.errors import ClientError
from core.facts import CHECK_FACTS_ACTIVITY, FactsCheck, FactsVerdict
from core.models import TaskInput
from infra import connection
from infra.settings import Settings

WORKER_WAIT = timedelta(seconds=15)  # no worker polls the queue by then: say so rather than wait


async def check_facts(client: Client, settings: Settings, task: TaskInput) -> None:
    """Raise ClientError (one line) unless the worker finds the task's facts in our records and at the provider."""
    where = f"task queue {settings.task_queue}"
    try:
        verdict: FactsVerdict = await client.execute_activity(
            CHECK_FACTS_ACTIVITY, FactsCheck(kind=task.kind, facts=task.facts),
            id=f"check-facts-{task.task_id}-{uuid.uuid4().hex[:8]}", task_queue=settings.task_queue,
            result_type=FactsVerdict, schedule_to_start_timeout=WORKER_WAIT,
            start_to_close_timeout=timedelta(seconds=30), retry_policy=RetryPolicy(maximum_attempts=1),
            summary=f"check the facts of {task.task_id}")
    except ActivityFailureError as err:
        cause = err.cause
        if isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START:
            raise ClientError(f"{task.task_id} not started: no worker of {where} answered within "
                              f"{WORKER_WAIT.seconds} s to check its facts; is the worker up? "
                              f"(`make status`, or start worker.py)") from None
        raise ClientError(f"{task.task_id} not started: checking its facts failed on the worker: "
                          f"{getattr(cause, 'message', cause)}") from None
    except RPCError as err:
        raise ClientError(f"{task.task_id} not started: Temporal at {connection.address(settings)} would not run "
                          f"the facts check ({err.message}); it needs standalone activities (Temporal Server "
                          f"1.32+, or activity.enableStandalone)") from None
    if verdict.problems:
        raise ClientError(f"{task.task_id} not started: {'; '.join(verdict.problems)}")
