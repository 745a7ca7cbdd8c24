"""Continuous reconciliation: run on a Temporal Schedule, compare the ledger with the provider,
alert on findings. The report is the workflow's result and its `report` query."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.operations import OperationsActivities
    from activities.reconcile import ReconcileActivities
    from core import policies
    from core.models import AlertInput, ReconcileInput, ReconcileReport

RECONCILE_WORKFLOW = "Reconcile"


@workflow.defn(name=RECONCILE_WORKFLOW)
class ReconcileWorkflow:
    def __init__(self) -> None:
        self._report: ReconcileReport | None = None

    @workflow.run
    async def run(self, request: ReconcileInput) -> ReconcileReport:
        self._report = await workflow.execute_activity_method(
            ReconcileActivities.reconcile_ledger, request,
            start_to_close_timeout=policies.RECONCILE_START_TO_CLOSE, heartbeat_timeout=policies.TOOL_HEARTBEAT,
            retry_policy=policies.READ_POLICY, summary="compare ledger and provider")
        if self._report.findings:
            kinds = sorted({f.kind for f in self._report.findings})
            await workflow.execute_activity_method(
                OperationsActivities.raise_alert,
                AlertInput(alert_key=f"reconcile:{workflow.info().workflow_id}:{workflow.info().run_id}",
                           task_id=workflow.info().workflow_id, kind="reconciliation", reason=",".join(kinds),
                           summary=f"{len(self._report.findings)} reconciliation findings: {', '.join(kinds)}",
                           checkpoint=self._report.model_dump(mode="json")),
                start_to_close_timeout=policies.OPS_START_TO_CLOSE, retry_policy=policies.READ_POLICY,
                summary="alert: reconciliation findings")
        return self._report

    @workflow.query
    def report(self) -> ReconcileReport | None:
        return self._report
