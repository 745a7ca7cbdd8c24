"""`make load` itself: a small run end to end, judged on what it reports and on the server's histories."""

from __future__ import annotations

import json
import subprocess
import sys

from devstack.load import split
from devstack.processes import PROJECT_ROOT


def test_latency_blocks_share_the_samples_out_evenly():
    assert split(30, 3) == [10, 10, 10]
    assert split(31, 3) == [11, 10, 10]
    assert split(2, 3) == [1, 1]
    assert split(0, 3) == [0]


def test_a_small_load_run_measures_both_sides_and_finds_nothing_timed_out_or_escalated():
    run = subprocess.run([sys.executable, "-m", "devstack.load", "--tickets", "8", "--latency", "4", "--rounds", "2",
                          "--json"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout[run.stdout.index("\n{") + 1:])
    assert {side: len(seconds) for side, seconds in result["latency"].items()} == {"harness": 4, "bare": 4}
    assert result["activities_per_task"] >= 5  # model turns and tool calls of a refund ticket
    assert [len(result["rounds"][side]) for side in ("harness", "bare")] == [2, 2]
    # every task of each side read back: 3 blocks of latency (3 unmeasured each, then 2, 1, 1), 2 rounds of 8
    for side, tally in result["honesty"].items():
        assert tally["tasks"] == 3 * 3 + 4 + 2 * 8, (side, tally)
        assert tally["live_timed_out"] == 0 and not tally["escalations"] and not tally["retries"], (side, tally)
