"""The liveness keeper's own checks (infra/liveness.py), without a server: what it reads of the
worker's process, and the lines it takes from the worker. The keeper against a real server and a real
worker: tests/test_admission.py (a held GIL) and tests/test_crash_resume.py (a SIGKILL)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable

from activities.heartbeats import HeartbeatPump
from devstack.polling import poll_until
from infra.liveness import GONE, MAX_LINE, RUNS, STOPPED, Keeper, Vouching, _Lines, process_state


async def _state_becomes(pid: int, state: str) -> None:
    async def now() -> bool:
        return process_state(pid) == state
    await poll_until(now, f"process {pid} {state}", timeout=10, every=0.02)


async def test_a_stopped_worker_is_not_vouched_for_and_a_dead_one_is_gone():
    child = subprocess.Popen(["sleep", "60"])
    try:
        await _state_becomes(child.pid, RUNS)
        os.kill(child.pid, signal.SIGSTOP)
        await _state_becomes(child.pid, STOPPED)
        os.kill(child.pid, signal.SIGCONT)
        await _state_becomes(child.pid, RUNS)
        child.kill()
        await _state_becomes(child.pid, GONE)  # a zombie until reaped: gone all the same
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) == GONE


def test_a_burst_of_attempts_while_the_keeper_starts_is_kept_for_it(caplog):
    """A worker restarted under load begins hundreds of attempts before its keeper, still importing, reads a
    line: the pipe holds them all. With the system's 64 KiB, lines were dropped, and a dropped attempt of a
    worker killed soon after would wait out its heartbeat timeout and its sticky queue."""
    keeper = Keeper("127.0.0.1:1", "default")  # it never connects; its lines are all this test reads
    keeper.start()
    try:
        for n in range(2000):  # about 700 KB, written long before a new Python process reads stdin
            keeper.vouch(os.urandom(200), 2.0, None, f"load-{n}", f"run-{n}")
    finally:
        assert keeper.pid is not None
        os.kill(keeper.pid, signal.SIGKILL)
    assert "a line not sent" not in caplog.text


def test_lines_it_does_not_understand_change_nothing(caplog):
    vouching = Vouching(None, "default", os.getpid())  # not connected: lines are judged before any call
    token = "dG9rZW4="  # base64 of b"token"
    vouching.take(f"+ {token} 1.000 {time.time():.3f} d2YtMQ== run-1\n")
    now = time.time()
    for line in ("", "+", "+ !!! 1 2 3 4", f"+ {token} x {now} d2Y= r", "- ", "* anything", f"+ {token} 0 {now} d2Y= r",
                 f"+ {token} nan {now} d2Y= r", f"+ {token} 1 inf d2Y= r", f"+ {token} -1 {now} d2Y= r", "-" * 5000,
                 f"- {token} extra"):
        vouching.take(line)
    assert list(vouching.held) == [b"token"] and vouching.held[b"token"].timeout == 1.0
    assert "not a line it understands" in caplog.text
    vouching.take(f"- {token}\n")
    assert not vouching.held


async def test_lines_are_taken_whole_across_reads_and_an_over_long_one_is_skipped(caplog):
    """The keeper reads its pipe in batches: a line cut between two reads is taken once whole, a line over
    its limit is skipped to its end (the lines after it are taken), and the pipe's end ends the reading."""
    vouching = Vouching(None, "default", os.getpid())
    lines = _Lines(vouching)
    read_end, write_end = os.pipe()
    now = time.time()

    async def written(data: bytes) -> None:  # from a thread: a write over the pipe's size waits for the keeper
        await asyncio.to_thread(os.write, write_end, data)

    async def seen(what: str, check: Callable[[], bool]) -> None:
        async def now_seen() -> bool:
            return check()
        await poll_until(now_seen, what, timeout=10, every=0.01)

    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        await asyncio.get_running_loop().connect_read_pipe(lambda: lines, pipe)
        await written(f"+ dG9rZW4= 2.000 {now:.3f} d2YtMQ==".encode())  # b"token", its line cut here
        await seen("the first half read", lambda: lines._partial != b"")
        await written(b" run-1\n+ " + b"A" * (MAX_LINE + 100))
        await seen("the long line skipped", lambda: lines._skipping)
        await written(b"A" * 100 + f" 2.000 {now:.3f} d2YtMg== run-2\n".encode())
        await written(f"+ b3RoZXI= 2.000 {now:.3f} d2YtMw== run-3\n- bm9uZQ==\n".encode())  # b"other"
        os.close(write_end)
        await asyncio.wait_for(lines.to_the_end(), 30)
    assert sorted(vouching.held) == [b"other", b"token"]
    assert caplog.text.count("skipped") == 1 and "not a line it understands" not in caplog.text


async def test_the_pump_beats_an_attempt_due_sooner_than_the_one_it_waits_for():
    """The pump is woken only for an attempt due before the one it waits for; that one beats on time."""
    pump = HeartbeatPump()
    sent = {"slow": 0, "quick": 0}

    def counter(name: str) -> Callable[[], None]:
        def send() -> None:
            sent[name] += 1
        return send
    slow = pump.start(counter("slow"), 600.0, None, "slow")  # first beat in 180 s
    quick = pump.start(counter("quick"), 0.1, None, "quick")  # first in 0.03 s, then every 0.02 s

    async def beaten() -> bool:
        return sent["quick"] >= 3
    try:
        await poll_until(beaten, "the quick attempt's beats", timeout=30, every=0.01)
    finally:
        slow.stop()
        quick.stop()
    assert sent["slow"] == 0
