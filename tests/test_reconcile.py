"""Continuous reconciliation: each kind of discrepancy, planted directly in localstripe and the
ledger, is reported, alerted and queryable; the schedule runs the same workflow."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

from temporalio.client import Client

from activities.db import Database
from activities.operations import alerts
from activities.reconcile import latest_report
from activities.world import World
from core.models import ReconcileInput, ReconcileReport
from devstack.edge_control import EdgeControl
from infra.schedules import ensure_reconcile_schedule
from infra.settings import Settings
from tests.helpers import run, running_worker, scenario_task, wait_for
from workflows import RECONCILE_WORKFLOW


def plant(world: World, db: Database, edge: EdgeControl) -> dict[str, str]:
    """One of each discrepancy; returns what identifies each."""
    performed = next(e for e in world.effects() if e["tool"] == "issue_refund")
    edge.fail_refund(performed["provider_ref"])  # as Stripe does days later when the card is closed
    ord_pi = world.records.order("ORD-8841").payment_intent_id
    su_pi = world.records.order("SU-88421").payment_intent_id
    stripe = world.gateway._client.v1
    stripe.refunds.create(params={"payment_intent": ord_pi, "amount": 100,
                                  "metadata": {"intent_key": performed["intent_key"]}})
    orphan = stripe.refunds.create(params={"payment_intent": su_pi, "amount": 500})
    now = time.time()
    with db.connect() as conn:
        conn.execute("INSERT INTO effects (intent_key, task_id, tool, arguments, status, owner, provider_ref,"
                     " created_at, updated_at) VALUES ('v1:issue_refund:ghost', 't', 'issue_refund', '{}',"
                     " 'performed', 'o', 're_ghost', :now, :now)", {"now": now})
        conn.execute("INSERT INTO effects (intent_key, task_id, tool, arguments, status, owner,"
                     " created_at, updated_at) VALUES ('v1:issue_refund:stale', 't', 'issue_refund', '{}',"
                     " 'intent', 'o', :then, :then)", {"then": now - 3600})
    return {"duplicate": performed["intent_key"], "orphan": orphan.id}


async def test_reconciliation_reports_every_kind_of_discrepancy(client: Client, settings: Settings, world: World,
                                                                edge: EdgeControl):
    db = Database(settings.agent_db_path)
    async with running_worker(client, settings):
        await run(client, settings, scenario_task("refund-8841"))
        clean: ReconcileReport = await client.execute_workflow(
            RECONCILE_WORKFLOW, ReconcileInput(), id=f"reconcile-{uuid.uuid4()}", task_queue=settings.task_queue,
            result_type=ReconcileReport)
        assert clean.findings == [] and clean.checked_ledger_rows == 1 and clean.checked_provider_effects == 1
        planted = plant(world, db, edge)
        report: ReconcileReport = await client.execute_workflow(
            RECONCILE_WORKFLOW, ReconcileInput(stale_after_seconds=900), id=f"reconcile-{uuid.uuid4()}",
            task_queue=settings.task_queue, result_type=ReconcileReport)
    kinds = {(f.kind, f.intent_key) for f in report.findings}
    assert ("duplicate", planted["duplicate"]) in kinds
    assert ("performed_unknown_to_provider", "v1:issue_refund:ghost") in kinds
    assert ("stale_intent", "v1:issue_refund:stale") in kinds
    assert ("failed_at_provider", planted["duplicate"]) in kinds
    orphans = [f for f in report.findings if f.kind == "orphan_provider_effect"]
    assert planted["orphan"] in {ref for f in orphans for ref in f.provider_refs}
    assert latest_report(db) == report
    [alert] = [a for a in alerts(db) if a["kind"] == "reconciliation"]
    assert set(alert["reason"].split(",")) == {"duplicate", "orphan_provider_effect",
                                               "performed_unknown_to_provider", "failed_at_provider",
                                               "stale_intent"}


async def test_the_schedule_runs_reconciliation(client: Client, settings: Settings, world: World):
    schedule_id = f"reconcile-{uuid.uuid4().hex[:8]}"
    assert await ensure_reconcile_schedule(client, settings.task_queue, timedelta(hours=1), schedule_id=schedule_id)
    assert not await ensure_reconcile_schedule(client, settings.task_queue, timedelta(hours=1),
                                               schedule_id=schedule_id)
    handle = client.get_schedule_handle(schedule_id)
    try:
        description = await handle.describe()
        assert description.schedule.action.workflow == RECONCILE_WORKFLOW
        async with running_worker(client, settings):
            await handle.trigger()

            async def completed_run():
                runs = [w async for w in client.list_workflows(f'WorkflowType = "{RECONCILE_WORKFLOW}"')
                        if w.id.startswith(f"{schedule_id}-run") and w.status.name == "COMPLETED"]
                return runs
            [execution] = await wait_for(completed_run, "the scheduled reconciliation to complete")
            report = await client.get_workflow_handle(execution.id, run_id=execution.run_id,
                                                      result_type=ReconcileReport).result()
        assert report.findings == [] and report.checked_provider_effects == 0
    finally:
        await handle.delete()
    assert json.loads(latest_report(Database(settings.agent_db_path)).model_dump_json())["findings"] == []
