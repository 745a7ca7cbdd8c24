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
