"""`make load` itself: a small run end to end, judged on what it reports and on the server's histories."""

from __future__ import annotations

import json
import subprocess
import sys

from devstack.load import host_ticks, split, stolen_share
from devstack.processes import PROJECT_ROOT


def test_latency_blocks_share_the_samples_out_evenly():
    assert split(30, 3) == [10, 10, 10]
    assert split(31, 3) == [11, 10, 10]
    assert split(2, 3) == [1, 1]
    assert split(0, 3) == [0]


def test_the_stolen_share_is_of_the_whole_machine_between_two_readings():
    assert stolen_share((10, 1000), (40, 1300)) == 0.1
    assert stolen_share((10, 1000), (10, 1000)) == 0.0  # no time passed: nothing to share out
    stolen, total = host_ticks()
    assert 0 <= stolen <= total and total > 0


def test_a_small_load_run_measures_both_sides_and_finds_nothing_timed_out_or_escalated():
    run = subprocess.run([sys.executable, "-m", "devstack.load", "--tickets", "8", "--latency", "4", "--rounds", "2",
                          "--json", "--server-config", "history.timerProcessorMaxPollRPS=20"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout[run.stdout.index("\n{") + 1:])
    assert {side: len(seconds) for side, seconds in result["latency"].items()} == {"harness": 4, "bare": 4}
    assert result["activities_per_task"] >= 5  # model turns and tool calls of a refund ticket
    assert [len(result["rounds"][side]) for side in ("harness", "bare")] == [2, 2]
    assert all(0 <= r["stolen"] < 1 for side in ("harness", "bare") for r in result["rounds"][side])
    assert result["server_config"] == {"history.timerProcessorMaxPollRPS": "20"}
    # every task of each side read back: 3 blocks of latency (3 unmeasured each, then 2, 1, 1), 2 rounds of 8
    for side, tally in result["honesty"].items():
        assert tally["tasks"] == 3 * 3 + 4 + 2 * 8, (side, tally)
        assert tally["live_timed_out"] == 0 and not tally["escalations"] and not tally["retries"], (side, tally)
