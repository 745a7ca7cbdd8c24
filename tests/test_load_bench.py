"""`make load` itself: a small run end to end, judged on what it reports and on the server's histories."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from devstack.load import (
    ENDED,
    NATIVE,
    THREAD_GROUPS,
    cpu_by_thread_group,
    host_ticks,
    report,
    shape_differs,
    split,
    stolen_share,
    thread_cpu,
)
from devstack.processes import PROJECT_ROOT, SERVER_PRAGMAS
from devstack.stack import Stack


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


async def test_cpu_is_told_apart_by_the_thread_it_ran_on():
    """CPU burnt in a call handed to asyncio's default executor (as the tools' blocking calls are) shows in
    the tools' row, not in the workflow activations' or the event loop's."""
    before = thread_cpu()

    def burn() -> None:  # the pool's thread may have run earlier tests' calls: its clock is not at zero
        start = time.thread_time()
        while time.thread_time() - start < 0.2:
            pass
    await asyncio.to_thread(burn)
    spent = cpu_by_thread_group(before, thread_cpu(), total=0.0)
    assert spent[THREAD_GROUPS["asyncio_"]] >= 0.1, spent
    assert spent[THREAD_GROUPS["temporal_workflow_"]] == 0, spent
    assert spent[THREAD_GROUPS["MainThread"]] < spent[THREAD_GROUPS["asyncio_"]], spent


def test_a_pool_of_threads_each_running_less_than_a_clock_tick_is_counted():
    """Six pool threads of 4 ms each (a few provider requests each, as in a small --bare-io round): read in
    whole clock ticks, each would truncate to nothing and the row would read 0."""
    burnt, release = threading.Semaphore(0), threading.Event()

    def burn() -> None:
        start = time.thread_time()
        while time.thread_time() - start < 0.004:
            pass
        burnt.release()
        release.wait(60)  # alive at the second reading, as the default executor's threads are
    with ThreadPoolExecutor(6, thread_name_prefix="asyncio_") as pool:
        before = thread_cpu()
        futures = [pool.submit(burn) for _ in range(6)]
        try:
            assert all(burnt.acquire(timeout=60) for _ in futures)
            spent = cpu_by_thread_group(before, thread_cpu(), total=0.0)
        finally:
            release.set()
        for future in futures:
            future.result()
    assert spent[THREAD_GROUPS["asyncio_"]] >= 6 * 0.004, spent


def test_a_thread_id_used_again_starts_from_nothing():
    before = {7: (THREAD_GROUPS["asyncio_"], 5.0)}
    spent = cpu_by_thread_group(before, {7: (NATIVE, 2.0)}, total=5.0)
    assert spent[NATIVE] == 2 and spent[THREAD_GROUPS["asyncio_"]] == 0
    assert spent[ENDED] == 3  # the process's total less what the living threads account for


def test_the_dev_server_runs_with_a_server_config_in_place_of_the_stacks(tmp_path: Path):
    key = "history.timerProcessorMaxPollRPS"
    assert key in SERVER_PRAGMAS and SERVER_PRAGMAS[key] != "20"
    with Stack.for_tests(tmp_path, server_config={key: "20"}) as stack:
        assert stack.temporal is not None and stack.temporal.pid is not None
        argv = Path(f"/proc/{stack.temporal.pid}/cmdline").read_bytes().split(b"\0")
    values = [argv[i + 1].decode() for i, arg in enumerate(argv) if arg == b"--dynamic-config-value"]
    assert [v for v in values if v.startswith(f"{key}=")] == [f"{key}=20"]
    assert all(f"{k}={v}" in values for k, v in SERVER_PRAGMAS.items() if k != key)


@cache
def small_run(encrypted: bool, compression: bool) -> subprocess.CompletedProcess[str]:
    """Run once for each test that reads it (a failed run too: it is not run again)."""
    command = [sys.executable, "-m", "devstack.load", "--tickets", "8", "--latency", "4", "--rounds", "2", "--json",
               "--server-config", "history.timerProcessorMaxPollRPS=20", *(["--encrypted"] if encrypted else [])]
    env = {**os.environ, "PAYLOAD_COMPRESSION": str(compression).lower()}
    return subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600, env=env)


def small_result(encrypted: bool, compression: bool) -> dict[str, Any]:
    run = small_run(encrypted, compression)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(run.stdout[run.stdout.index("\n{") + 1:])


@pytest.mark.parametrize(("encrypted", "compression"), [(False, True), (True, True), (True, False)])
def test_a_small_load_run_measures_both_sides_and_finds_nothing_timed_out_or_escalated(encrypted: bool,
                                                                                       compression: bool):
    result = small_result(encrypted, compression)
    assert {side: len(seconds) for side, seconds in result["latency"].items()} == {"harness": 4, "bare": 4}
    assert result["activities_per_task"] >= 5  # model turns and tool calls of a refund ticket
    assert [len(result["rounds"][side]) for side in ("harness", "bare")] == [2, 2]
    assert all(0 <= r["stolen"] < 1 for side in ("harness", "bare") for r in result["rounds"][side])
    assert result["server_config"] == {"history.timerProcessorMaxPollRPS": "20"}
    # nothing is compressed without a key: compression is the encryption codec's
    assert (result["encrypted"], result["compressed"]) == (encrypted, encrypted and compression)
    # every task of each side read back: 3 blocks of latency (3 unmeasured each, then 2, 1, 1), 2 rounds of 8
    for side, tally in result["honesty"].items():
        assert tally["tasks"] == 3 * 3 + 4 + 2 * 8, (side, tally)
        assert tally["live_timed_out"] == 0 and not tally["escalations"] and not tally["retries"], (side, tally)
    # the refunds' ledger and provider calls ran on the tools' threads
    assert all(r[f"cpu:load, of it on {THREAD_GROUPS['asyncio_']}"] > 0 for r in result["rounds"]["harness"])
    described = {(False, True): "not encrypted", (True, True): "encrypted and compressed",
                 (True, False): "encrypted, not compressed"}[(encrypted, compression)]
    text = report(result)
    assert f"harness payloads {described};" in text
    assert f"| CPU s per task: load, of it on {THREAD_GROUPS['asyncio_']} |" in text
    # read against its targets: what the histories showed above, as the report says it
    assert "| live attempts timed out | 0 | harness 0 / bare 0 | met |" in text
    assert "| escalations to a person (no fault is injected) | 0 | harness 0 / bare 0 | met |" in text
    assert "| throughput, harness / bare | >= 95% |" in text


def test_the_harness_payloads_are_compressed_as_the_settings_say():
    """The same tickets' histories, encrypted with PAYLOAD_COMPRESSION on and off: the harness's converter is the
    deployment's (a converter of its own would compress either way, or never)."""
    (_, compressed), (_, plain) = (small_result(True, c)["history"]["harness"] for c in (True, False))
    assert compressed < plain * 0.95, (compressed, plain)


def test_bare_io_refuses_a_ticket_of_another_shape():
    """A scripted ticket that changed shape would leave --bare-io making the wrong requests, silently."""
    assert shape_differs(4, {"get_order": 1, "issue_refund": 1, "notify_customer": 1}) is None
    why = shape_differs(5, {"get_order": 1, "issue_refund": 2, "notify_customer": 1})
    assert why is not None and "PROVIDER_REQUESTS" in why and "5 turns" in why


def test_bare_io_makes_a_tickets_provider_requests_on_orders_of_its_own():
    """`--bare-io`: a third side, beside the harness and plain bare Temporal in the same run, whose every task
    refunded its own order once at the provider (read back after the rounds)."""
    command = [sys.executable, "-m", "devstack.load", "--tickets", "6", "--latency", "2", "--rounds", "2",
               "--bare-io", "--json"]
    run = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout[run.stdout.index("\n{") + 1:])
    assert list(result["rounds"]) == ["harness", "bare", "bare-io"]
    tasks = 2 * (3 + 1) + 2 * 6  # 2 latency blocks (split(2, 3)) of 3 unmeasured tasks and 1; 2 rounds of 6
    assert result["bare_refunds"] == [1] * tasks
    for side, tally in result["honesty"].items():
        assert tally["tasks"] == tasks and tally["live_timed_out"] == 0 and not tally["escalations"], (side, tally)
    # A process's CPU is read in whole clock ticks (10 ms), about a round's 24 requests here: summed over both
    assert sum(r["cpu:localstripe"] for r in result["rounds"]["bare-io"]) > 0
    tools = {side: sum(r[f"cpu:load, of it on {THREAD_GROUPS['asyncio_']}"] for r in result["rounds"][side])
             for side in ("bare", "bare-io")}
    assert tools["bare-io"] > tools["bare"], tools  # plain bare's steps make no blocking call
    text = report(result)
    assert ("| | harness | bare Temporal | bare Temporal + the ticket's provider requests | harness / bare | "
            "harness / bare-io | bare-io / bare |") in text
    assert text.count("| throughput, tasks/s |") == 1


def test_profiling_the_bare_io_side_without_it_is_one_line_and_no_run():
    command = [sys.executable, "-m", "devstack.load", "--profile", "--profile-side", "bare-io"]
    run = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and run.stdout == ""
    assert run.stderr.splitlines() == ["python -m devstack.load: --profile-side bare-io needs --bare-io"]
