"""`redrive` and `reconcile`: dead letters again, and the ledger against the provider now."""

from __future__ import annotations

import argparse

from temporalio.common import WorkflowIDConflictPolicy

from cli.output import Progress, print_report
from client import connect, follow, redrive
from core.models import ReconcileInput, ReconcileReport
from infra.settings import Settings
from workflows import RECONCILE_WORKFLOW


async def cmd_redrive(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings)
    handle, task, was = await redrive(client, settings, args.task_id, args.force, args.escalation_timeout)
    print(f"redriving {task.task_id} (was {was}, run {task.redrive_of}) as run {handle.result_run_id}; "
          f"waits {task.escalation_timeout_seconds} s for a person if it escalates", flush=True)
    if args.no_wait:
        return 0
    progress = Progress()
    result = await follow(handle, progress, on_wait=progress.waits)
    assert result is not None
    print_report(settings, result)
    return 0


async def cmd_reconcile(args: argparse.Namespace, settings: Settings) -> int:
    """Compare the ledger with the provider now (the schedule does it every few minutes)."""
    client = await connect(settings)
    report = await client.execute_workflow(
        RECONCILE_WORKFLOW, ReconcileInput(stale_after_seconds=args.stale_after), id="reconcile-ledger-now",
        task_queue=settings.task_queue, result_type=ReconcileReport,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
    print(f"checked {report.checked_ledger_rows} ledger rows and {report.checked_provider_effects} provider "
          f"effects: {len(report.findings)} findings")
    for finding in report.findings:
        print(f"  {finding.kind:<31} {finding.intent_key or '-':<50} {' '.join(finding.provider_refs)}  "
              f"{finding.detail}")
    return 1 if report.findings else 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    rd = sub.add_parser("redrive", help="start a dead-lettered task again; done effects are not repeated")
    rd.add_argument("task_id")
    rd.add_argument("--force", action="store_true", help="also redrive a completed task")
    rd.add_argument("--escalation-timeout", type=int, metavar="SECONDS",
                    help="how long the new run waits for a person (default: as the first run)")
    rd.add_argument("--no-wait", action="store_true")
    rd.set_defaults(run=cmd_redrive)
    rc = sub.add_parser("reconcile", help="compare the ledger with the provider now; exit 1 on findings")
    rc.add_argument("--stale-after", type=int, default=900, metavar="SECONDS")
    rc.set_defaults(run=cmd_reconcile)
