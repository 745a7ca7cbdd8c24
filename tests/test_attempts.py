"""What `make load` and `make week` read from a history: a workflow task's failure by its own words, also
when the payload codec moved them into an encoded payload (the server then stores "Encoded failure")."""

from __future__ import annotations

from collections import Counter

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent, WorkflowTaskFailedEventAttributes

from devstack.attempts import Attempts, readable
from infra.codec import data_converter, new_key

DEADLOCK = "[TMPRL1101] Potential deadlock detected: workflow didn't yield within 2 second(s)."


@pytest.mark.parametrize("key", [new_key(), None], ids=["encrypted", "plain"])
async def test_a_workflow_task_failure_is_tallied_by_its_message(key: str | None):
    converter = data_converter(key)
    failure = Failure()
    await converter.encode_failure(RuntimeError(DEADLOCK), failure)
    assert (failure.message == "Encoded failure") == (key is not None)  # what the server stores
    events = [HistoryEvent(event_type=EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
                           workflow_task_failed_event_attributes=WorkflowTaskFailedEventAttributes(failure=failure))]

    await readable(converter, events)
    tally = Attempts()
    tally.add(events)

    assert tally.workflow_task_failures == Counter({"[TMPRL1101] Potential deadlock detected": 1})
