"""Exactly once under chaos, small: 30 refund tickets through two worker processes that are
SIGKILLed and restarted, or paused (SIGSTOP) and woken 2-10 s later, at random (seeded) every
1-5 s, against a Stripe edge that faults a seeded fraction of refund requests (one fault holds a
refund longer than the client timeout), in both edge modes; some tickets refund an item another
ticket refunds, some split an item's refund (devstack/chaos.py, `make chaos`, is the same with
300 tickets). Judged on the quiet world by the independent judge (devstack/judge/): every worker
stopped and the settle horizons passed, the provider's refunds per order item, the ledger and the
outbox; one ticket in each mode is a negative control (the naive refund tool) the judge must flag.

Exit codes of killed workers (-9) are not failures; a worker that dies while nobody killed it is,
and so is a worker stopped at the end (SIGTERM) that exits with anything but 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.chaos import MODES, POST_FAULTS, SLOW_POST_SECONDS, fault_rules, run_chaos, table
from devstack.judge import table as judge_table

TICKETS = 30
RATE = 3.0  # tickets started per second: the chaos lasts at least 10 s, so the killer (1-5 s) fires
# Half the refund lookups answer in 0.6 s (under the 1 s client timeout), so that a few tasks are
# always in flight and a kill finds work to interrupt.
# The third refund POST is always held past the client timeout, whatever the draws give the others.
RULES = [{"fault": "slow", "method": "POST", "path": "/v1/refunds", "nth": [3], "delay_seconds": SLOW_POST_SECONDS},
         *fault_rules(post_probability=0.07, slow_probability=0.5, slow_seconds=0.6)]


@pytest.mark.parametrize("mode", MODES)
async def test_exactly_once_with_workers_killed_and_provider_faults(mode: str, tmp_path: Path):
    report = await run_chaos(mode, TICKETS, seed=20, data_dir=tmp_path / mode, rate=RATE, chaos_tail=30.0,
                             settle_timeout=90.0, say=lambda line: None, rules=RULES)
    shown = table([report]) + "\n" + judge_table(report.verdict)
    print(shown)
    verdict = report.verdict

    assert report.kills > 0 and report.pauses > 0, shown
    assert report.faults.get("slow:POST", 0) > 0, shown  # a refund held past the client timeout
    assert report.tickets["second"] > 0 and report.tickets["split"] > 0 and report.tickets["rest"] > 0, shown
    assert report.resume["activity"] or report.resume["workflow_task"], shown  # a kill cut into work
    assert sum(report.faults.get(f"{kind}:POST", 0) for kind in POST_FAULTS) > 0, shown
    assert report.unexpected_worker_exits == 0, shown
    assert report.stop_exit_codes and set(report.stop_exit_codes) == {0}, shown

    assert verdict.lost == [], shown
    assert sum(t.end.state == "completed" for t in verdict.tickets.values()) > TICKETS // 2, shown  # it did the work
    assert report.controls >= 1 and verdict.flagged == verdict.controls, shown  # the controls, and only them
    assert verdict.settled_escalations == [], shown
    assert report.passed, shown
