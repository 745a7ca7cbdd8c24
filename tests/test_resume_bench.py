"""Kill -> resume, small: the benchmark of devstack/resume.py with three kills in survivor mode.
Two worker processes; for each refund ticket the worker running `issue_refund` SIGKILLs itself
after the provider accepted the refund and before anything recorded it, and the other worker
takes the step over. Judged on the world (one refund of the item's price per ticket, the ledger
agrees, every task completed) and on the report (a kill -> resume figure for every kill, read
from the history), never on how long anything took.
"""

from __future__ import annotations

import signal
from pathlib import Path

from devstack.resume import DEFAULT_POINT, run_mode, table

KILLS = 3


async def test_a_worker_killed_mid_refund_is_taken_over_and_every_kill_has_a_figure(tmp_path: Path):
    report = await run_mode("survivor", KILLS, tmp_path / "survivor", say=lambda line: None)
    shown = table([report]) + "\n" + "\n".join(
        f"{r.ticket}: {r.problems + r.notes}" for r in report.records if r.problems or r.notes)
    print(shown)

    assert report.point == DEFAULT_POINT == "issue_refund:after_provider"
    assert len(report.records) == KILLS, shown
    for r in report.records:
        # the kill: the worker running the refund died by its own SIGKILL at the crash point
        assert r.kill_at is not None and r.victim_exit == -signal.SIGKILL, shown
        # the world: refunded once, in full, the ledger names that refund, the task completed
        assert r.state == "completed", shown
        assert len(r.provider_refunds) == 1 and r.refunded_cents == r.price_cents, shown
        assert r.ledger == "performed", shown
        assert r.problems == [], shown
        # the report: a figure per kill, from the history, for an attempt the survivor ran
        assert r.resume_s is not None, shown
        assert r.resumed_by_pid is not None and r.resumed_by_pid != r.victim_pid, shown
    assert report.world_ok and report.paid_twice == [], shown
    assert len(report.resume) == len(report.killed) == KILLS, shown
    summary = report.summary()
    assert summary["kills"] == summary["resumed"] == summary["refunded_once"] == summary["completed"] == KILLS


async def test_under_load_the_kill_is_aimed_at_the_measured_ticket_and_every_other_ticket_pays_once(tmp_path: Path):
    """`--load`: 10 other tickets kept in flight on the same two workers (from 300 orders). Only the
    measured ticket's refund kills its worker (CRASH_TASKS); the attempts of other tickets on that worker
    die with it and are retried elsewhere. Each kill has a figure, the first taken with other tickets in
    flight, and every other ticket ends completed with one refund of its item's price at the provider,
    with no timeout in its history that a kill does not explain (a live attempt timed out)."""
    report = await run_mode("survivor", 2, tmp_path / "loaded", say=lambda line: None, load=10, load_orders=300)
    shown = table([report]) + "\n" + "\n".join(report.background.get("problems", []))
    print(shown)

    assert len(report.killed) == 2 and all(r.victim_exit == -signal.SIGKILL for r in report.killed), shown
    assert all(r.resume_s is not None for r in report.killed) and report.killed[0].load_in_flight, shown
    assert all(r.state == "completed" and r.problems == [] for r in report.records), shown
    background = report.background
    assert background["started"] >= 10 and background["problems"] == [], shown
    assert background["states"] == {"completed": background["started"]}, shown
    assert background["unattributed_timeouts"] == {}, shown
    assert all(r.unattributed == [] for r in report.records), shown
    assert report.world_ok, shown
