"""Issue 25: the Web UI lists a task's signals and Updates by name (from the worker's metadata
query), so `resolve` and `decide` are named handlers; any other name still reaches a dynamic
handler and is recorded as not a decision. A waiting task carries its reason, amount and deadline
as search attributes, for the list's columns, and drops them when it stops waiting.

The named handlers take their payload undecoded (a RawValue, read inside the guard) like the
dynamic ones: a payload the SDK could not decode must be recorded, never dropped or raised.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from activities.world import World
from core import names
from infra.settings import Settings
from tests.approvers import signed
from tests.helpers import checkpoint, finished, running_worker, scenario_task, start, wait_for, waiting
from workflows import AgentTaskWorkflow

NOT_JSON = RawValue(Payload(metadata={"encoding": b"json/plain"}, data=b"{"))


def test_resolve_and_decide_are_named_take_one_raw_payload_and_say_what_they_are():
    defn = workflow._Definition.from_class(AgentTaskWorkflow)  # what the SDK (and its metadata query) sees
    assert set(defn.signals) == {"resolve", None} and set(defn.updates) == {"decide", None}
    for handler in (defn.signals["resolve"], defn.updates["decide"]):
        assert handler.arg_types == [RawValue], "a typed parameter would be decoded before the guard"
        assert handler.description and "signed decision" in handler.description
    assert defn.updates["decide"].validator is not None


async def _ignored(handle, count: int):
    async def recorded():
        cp = await checkpoint(handle)
        return cp if cp.decision_counts.get("ignored", 0) >= count else None
    return await wait_for(recorded, f"{count} messages recorded as ignored", 30)


async def test_named_handlers_record_every_shape_and_the_wait_is_in_search_attributes(
    client: Client, settings: Settings, world: World,
):
    strict = settings.model_copy(update={"approval_ceiling_cents": 10000})
    async with running_worker(client, strict):
        handle = await start(client, strict, scenario_task("SU-88421"))
        wait = (await waiting(handle)).waiting_for
        assert wait is not None
        attrs = (await handle.describe()).typed_search_attributes
        assert attrs.get(names.WAIT_REASON_ATTR) == "approval_required: issue_refund"
        assert attrs.get(names.AMOUNT_ATTR) == 11800
        assert attrs.get(names.DEADLINE_ATTR) == datetime.strptime(wait.deadline, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=UTC)

        await handle.signal("resolve", args=[])  # no payload
        await handle.signal("resolve", NOT_JSON)  # one that does not decode: raw to the guard
        await handle.signal("resolve", args=[{"a": 1}, {"b": 2}])  # two that decode
        await handle.signal("Resolve", signed(handle.id, wait.intent_key, "approve"))  # another name
        cp = await _ignored(handle, 4)
        whys = [d.why or "" for d in cp.decisions]
        assert [d.via for d in cp.decisions] == ["signal"] * 4
        assert "got 0 arguments" in whys[0] and "got 2 arguments" in whys[2] and "no signal named 'Resolve'" in whys[3]
        assert cp.decisions[1].raw == "{"

        for args, why in (([], "got 0 arguments"), ([NOT_JSON], ""), ([{"a": 1}, {"b": 2}], "got 2 arguments")):
            try:
                await handle.execute_update("decide", args=args)
            except WorkflowUpdateFailedError as err:  # the validator answers; nothing reaches the history
                assert isinstance(err.cause, ApplicationError) and err.cause.type == "ValueError", err.cause
                assert why in err.cause.message
            else:
                raise AssertionError(f"decide with {args!r} was applied")
        # Two payloads of which one does not decode: the SDK decodes a wrong count without types, so
        # the Update is refused before its validator and the signal dropped (logged), unrecorded;
        # either way no workflow task fails.
        try:
            await handle.execute_update("decide", args=[NOT_JSON, NOT_JSON])
        except WorkflowUpdateFailedError:
            pass
        else:
            raise AssertionError("decide with two undecodable payloads was applied")
        await handle.signal("resolve", args=[NOT_JSON, NOT_JSON])

        await handle.execute_update("decide", signed(handle.id, wait.intent_key, "approve"))
        result = await finished(handle)
    assert result.state == "completed"
    assert result.checkpoint.decision_counts == {"ignored": 4, "applied": 1}, result.checkpoint.decision_counts
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    attrs = (await handle.describe()).typed_search_attributes
    assert [attrs.get(k) for k in (names.WAIT_REASON_ATTR, names.AMOUNT_ATTR, names.DEADLINE_ATTR)] == [None] * 3
    history = await handle.fetch_history()
    assert not [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
