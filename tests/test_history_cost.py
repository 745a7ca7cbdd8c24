"""What a task costs the server beside its steps: a new run records one patch marker (and the one
TemporalChangeVersion search attribute the SDK upserts with it, a visibility write), not one per change
patched so far (workflows/_agent.py `_ONE_MARKER`). Judged on the history the server keeps."""

from __future__ import annotations

import base64
import json

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from activities.world import World
from core.names import FOLD_MARKER
from infra.settings import Settings
from tests.helpers import finished, running_worker, scenario_task, start
from tests.test_replay import HISTORIES
from workflows._agent import SINCE_FOLD

PATCH_MARKER = "core_patch"


async def test_a_new_task_records_one_patch_marker(client: Client, settings: Settings, world: World) -> None:
    task = scenario_task("SU-88421")  # order read, policy search, refund, seller and customer messages
    async with running_worker(client, settings):
        handle = await start(client, settings, task)
        result = await finished(handle)
    assert result.state == "completed", result.final_answer
    events = (await handle.fetch_history()).events
    markers = [e for e in events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
               and e.marker_recorded_event_attributes.marker_name == PATCH_MARKER]
    versions = [e for e in events if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
                and "TemporalChangeVersion" in e.upsert_workflow_search_attributes_event_attributes
                .search_attributes.indexed_fields]
    assert len(markers) == 1 and len(versions) == 1
    assert world.refunds("SU-88421")  # the task did its work on this path: a refund at the provider


def test_the_recorded_corpus_holds_one_patch_marker_per_run() -> None:
    """The corpus the replay test guards is of the current code (re-recorded with `make record`): each run
    records the fold's marker, and beside it only the markers of changes made since the fold, on the paths
    that reach them."""
    for path in HISTORIES.glob("*.json"):
        events = json.loads(path.read_text())["events"]
        markers = [json.loads(base64.b64decode(p["data"]))["id"] for e in events
                   if e.get("markerRecordedEventAttributes", {}).get("markerName") == PATCH_MARKER
                   for p in e["markerRecordedEventAttributes"]["details"]["patch-data"]["payloads"]]
        assert markers[:1] == [FOLD_MARKER], f"{path.name}: {markers}"
        assert set(markers[1:]) <= set(SINCE_FOLD), f"{path.name}: {markers}"
