"""The liveness keeper: a process of its own that vouches for the worker's running attempts.

The heartbeat pump (activities/heartbeats.py) beats from a thread of the worker, so a busy event loop
does not stop it; but nothing of a Python process runs while one thread holds the GIL. A full garbage
collection does: in a 4,200-ticket week the worker's grew to 0.94-1.64 s as its cache filled, longer
than the 0.7 s a beat had in a 1 s heartbeat timeout, and every attempt that began just before one was
timed out while it ran (docs/figures.md). A longer timeout alone would trade that for a slower resume.

So the worker starts a keeper (`python -m infra.liveness`) and tells it, over the keeper's stdin,
each attempt that declares a heartbeat timeout when it begins and when it ends. The keeper has its own
GIL and its own connection to Temporal, and beats for every attempt it holds, by task token, on the
pump's schedule, as long as the worker process runs:

- while the worker is stopped (SIGSTOP, a debugger: `/proc/<pid>/stat` says `T`) it sends nothing, so
  a paused worker's attempts time out as they always did and a retry takes over (the late waker is
  fenced in activities/effects.py);
- when the worker process ends (its end of the pipe closes: a crash, an OOM kill, a SIGKILL) the keeper
  fails each attempt it still holds at once with a retryable `WorkerLost`, instead of leaving the server
  to notice a missing heartbeat a timeout later, then exits. The retry verifies before it acts, as
  after any timeout (activities/effects.py). Each such attempt's run first forgets the dead worker's
  sticky queue, so the workflow task after the retry does not wait out the sticky timeout (10 s).

When the keeper is lost with the worker (the whole pod or process group killed), the server times the
attempts out as before. An attempt the keeper refused or never heard of still has the pump. The keeper
never vouches for an attempt the server no longer knows (its beat comes back not found and it forgets
it), and cancellation still reaches the attempt through the pump's beats, which the SDK's core sends.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import fcntl
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure
from temporalio.api.workflowservice.v1 import (
    RecordActivityTaskHeartbeatRequest,
    ResetStickyTaskQueueRequest,
    RespondActivityTaskFailedRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode, WorkflowService

from core.policies import FIRST_BEAT

log = logging.getLogger("agent.liveness")

# The failure an attempt gets when its worker process ended while it ran (devstack/chaos.py counts a retry
# after it as the kill's, like a heartbeat timeout).
WORKER_LOST = "WorkerLost"
# One beat per 0.3 x the timeout: a beat has 0.7 x it to reach the server, and a late one is followed by
# another before the timer can fire.
EVERY = 0.3
LOOK_EVERY = 1.0  # seconds between looks at the worker's process when nothing is due
STOPPED_LOOK_EVERY = 0.05  # the same while it is stopped: beats resume soon after it does
PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONNECT_AFTER_END = 10.0  # seconds a keeper still connecting waits, once its worker has ended, to fail its attempts
DRAIN_AFTER_END = 5.0  # seconds to read a gone worker's last lines; its pipe ends at once unless a child holds it
PIPE_BYTES = 1 << 20  # the worker's lines the pipe holds while the keeper is not reading (`_widen`)
MAX_LINE = 1 << 16  # the keeper's limit per line; the worker writes none longer than PIPE_BUF (4,096 bytes)
# A busy worker writes two lines per attempt, hundreds a second: the keeper takes them in batches, its pipe
# resting this long after each read, and beats in batches, every beat due this soon sent with the one due
# now. Each wake costs the keeper more than the lines it reads; a beat goes at most this much early, out of
# the 0.7 x the heartbeat timeout a beat has to reach the server.
GATHER = 0.05


RUNS, STOPPED, GONE = "runs", "stopped", "gone"


def process_state(pid: int) -> str:
    """RUNS, STOPPED (SIGSTOP, a debugger) or GONE (Linux: from its /proc state; elsewhere a process that
    exists counts as running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return GONE
    except OSError:  # no /proc here
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return GONE
        return RUNS
    state = stat.rsplit(")", 1)[1].split()[0]
    return STOPPED if state in ("T", "t") else GONE if state in ("Z", "X") else RUNS


# --- the worker's side -------------------------------------------------------------------------------


class Keeper:
    """The worker's end of one keeper process. `vouch` and `release` never block: a line the pipe cannot
    take now is dropped (the pump still beats for that attempt, and a beat for an ended attempt comes back
    not found), and a keeper that is gone is said once in the log."""

    def __init__(self, address: str, namespace: str) -> None:
        self.address, self.namespace = address, namespace
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._ready = -1
        self.is_ready = False
        self._said_dropped = False
        self._said_gone = False

    def start(self) -> None:
        with self._lock:
            if self._process is not None:
                return
            self._ready, told = os.pipe()
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "infra.liveness", "--parent", str(os.getpid()),
                     "--address", self.address, "--namespace", self.namespace, "--ready-fd", str(told)],
                    stdin=subprocess.PIPE, cwd=PROJECT_ROOT, pass_fds=(told,))
            finally:
                os.close(told)
            assert self._process.stdin is not None
            os.set_blocking(self._process.stdin.fileno(), False)
            _widen(self._process.stdin.fileno())

    def wait_ready(self, timeout: float) -> bool:
        """Whether the keeper has connected to Temporal within `timeout` seconds (a worker does not wait: until
        then its attempts have the pump alone, and a death is told once the keeper has connected)."""
        if not self.is_ready:
            ready, _, _ = select.select([self._ready], [], [], timeout)
            self.is_ready = bool(ready) and os.read(self._ready, 1) == b"1"
        return self.is_ready

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def vouch(self, task_token: bytes, heartbeat_timeout: float, started: datetime | None, workflow_id: str,
              run_id: str) -> None:
        self._send(vouch_line(task_token, heartbeat_timeout, started, workflow_id, run_id))

    def release(self, task_token: bytes) -> None:
        self._send(f"- {_b64(task_token)}\n")

    def _send(self, line: str) -> None:
        process = self._process
        data = line.encode()
        if process is None or process.stdin is None:
            return
        if len(data) > select.PIPE_BUF:  # a longer write to a pipe may be split, and another line cut in two
            self._drop(f"a line of {len(data)} bytes")
            return
        try:
            os.write(process.stdin.fileno(), data)  # at most PIPE_BUF: all of it or nothing
        except BlockingIOError:
            self._drop("the pipe was full")
        except (BrokenPipeError, OSError, ValueError):
            if not self._said_gone:
                self._said_gone = True
                log.warning("the liveness keeper (pid %s) is gone (exit %s): attempts are kept alive by the "
                            "heartbeat pump alone", process.pid, process.poll())


    def _drop(self, why: str) -> None:
        if not self._said_dropped:
            self._said_dropped = True
            log.warning("liveness keeper: a line not sent (%s): that attempt has the heartbeat pump alone", why)


def _widen(fd: int) -> None:
    """Room in the pipe for the attempts a worker begins before its keeper reads a line: the keeper takes
    0.3-1.5 s to import and start, and a worker restarted under load begins hundreds of attempts in that
    time. The default 64 KiB holds about 200 of them and the rest would be dropped: an attempt whose worker's
    death is then told by its heartbeat timeout, and whose next workflow task waits out the sticky timeout.
    1 MiB (about 3,000 attempts) is Linux's default ceiling for a pipe."""
    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        return  # not Linux: the system's pipe size
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except OSError as err:  # above /proc/sys/fs/pipe-max-size for an unprivileged process: say so, keep the default
        log.warning("liveness keeper: its pipe stays at the system's size (%s): a burst of attempts while it"
                    " starts may be left to the heartbeat pump", err.strerror)


def vouch_line(task_token: bytes, heartbeat_timeout: float, started: datetime | None, workflow_id: str,
               run_id: str) -> str:
    """The line that tells the keeper an attempt began (`Vouching.take` reads it)."""
    at = (started or datetime.now(UTC)).timestamp()
    return f"+ {_b64(task_token)} {heartbeat_timeout:.3f} {at:.3f} {_b64(workflow_id.encode())} {run_id}\n"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


_KEEPERS: dict[tuple[str, str], Keeper] = {}
_KEEPERS_LOCK = threading.Lock()


def keeper_for(client: Client) -> Keeper:
    """This process's keeper for the client's server and namespace, started on first use."""
    return keeper_at(client.service_client.config.target_host, client.namespace)


def keeper_at(address: str, namespace: str) -> Keeper:
    """The same by address: a worker starts its keeper before it connects, so the two start side by side."""
    key = (address, namespace)
    with _KEEPERS_LOCK:
        keeper = _KEEPERS.get(key)
        if keeper is None:
            keeper = _KEEPERS[key] = Keeper(*key)
    keeper.start()
    return keeper


def keeper_pid(client: Client) -> int | None:
    """The pid of this process's keeper for the client's server, if one was started (benchmarks count its CPU)."""
    keeper = _KEEPERS.get((client.service_client.config.target_host, client.namespace))
    return keeper.pid if keeper else None


# --- the keeper's side -------------------------------------------------------------------------------


@dataclass
class _Held:
    timeout: float
    next_at: float  # time.time() of the next beat
    workflow_id: str  # base64: the task's run, whose next workflow task would wait on the dead worker's queue
    run_id: str

    def run(self) -> WorkflowExecution:
        return WorkflowExecution(workflow_id=base64.b64decode(self.workflow_id).decode(), run_id=self.run_id)


class Vouching:
    """What the keeper holds and does; `python -m infra.liveness` runs it over stdin."""

    def __init__(self, client: Client | None, namespace: str, parent: int) -> None:
        self.client, self.namespace, self.parent = client, namespace, parent
        self.identity = f"keeper-{parent}@{socket.gethostname()}"
        self.held: dict[bytes, _Held] = {}
        self._changed = asyncio.Event()
        self._wake_at = 0.0  # when the beating loop wakes next, unless told sooner
        self._sending: set[asyncio.Task[None]] = set()

    def _service(self) -> WorkflowService:
        if self.client is None:
            raise RuntimeError("the liveness keeper is not connected")
        return self.client.workflow_service

    def take(self, line: str) -> None:
        parts = line.split()
        try:
            if parts[0] == "+" and len(parts) == 6:
                token, timeout = base64.b64decode(parts[1], validate=True), float(parts[2])
                base64.b64decode(parts[4], validate=True)
                if not 0.01 <= timeout <= 86400 or not math.isfinite(float(parts[3])):
                    raise ValueError(line[:80])  # a beat per 0.3 x the timeout: never a spin
                held = self.held[token] = _Held(timeout, float(parts[3]) + FIRST_BEAT * timeout, parts[4], parts[5])
                if held.next_at < self._wake_at:
                    self._changed.set()
            elif parts[0] == "-" and len(parts) == 2:
                self.held.pop(base64.b64decode(parts[1], validate=True), None)
            else:
                raise ValueError(line[:80])
        except (ValueError, IndexError):
            log.warning("liveness keeper: not a line it understands: %r", line[:80])

    async def beat_until_the_worker_is_gone(self) -> None:
        """Beat for what is held while the worker runs; return once its process is gone (the pipe's end
        says so too, unless something else still holds it open). It wakes when a beat is due, when an
        attempt arrives that is due sooner, and at least every LOOK_EVERY seconds; most attempts end
        before their first beat, and their lines wake nothing. Each wake beats what is due within GATHER,
        so one attempt's beat brings the others' due just after it, and the next wake is GATHER later."""
        while (state := process_state(self.parent)) != GONE:
            now = time.time()
            if state == RUNS:
                for token, held in list(self.held.items()):
                    if held.next_at <= now + GATHER:
                        held.next_at = max(held.next_at + EVERY * held.timeout, now)
                        self._spawn(self._beat(token, timedelta(seconds=held.timeout)))
            else:  # stopped: vouch for nothing; look again soon
                for held in self.held.values():
                    held.next_at = max(held.next_at, now + STOPPED_LOOK_EVERY)
            self._wake_at = min((h.next_at for h in self.held.values()), default=now + LOOK_EVERY)
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(max(self._wake_at - time.time(), 0.0), LOOK_EVERY))
            except TimeoutError:
                pass

    def _spawn(self, coroutine) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(coroutine)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _beat(self, token: bytes, within: timedelta) -> None:
        try:
            await self._service().record_activity_task_heartbeat(
                RecordActivityTaskHeartbeatRequest(task_token=token, namespace=self.namespace,
                                                   identity=self.identity),
                timeout=within)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:  # the attempt ended or was timed out: nothing to keep
                self.held.pop(token, None)
            else:
                log.warning("liveness keeper: a heartbeat was not recorded: %s", err.message[:200])

    async def worker_ended(self) -> None:
        """Fail every attempt still held: their worker is gone, so each retry can start now. First each
        attempt's run forgets the dead worker's sticky queue, so the workflow task after the retry goes to
        the shared queue at once instead of waiting out the sticky timeout (WORKER_STICKY_TIMEOUT_SECONDS)."""
        failure = Failure(message=f"the worker process {self.parent} ended while this attempt ran",
                          source="liveness-keeper",
                          application_failure_info=ApplicationFailureInfo(type=WORKER_LOST, non_retryable=False))
        held = list(self.held.items())
        self.held.clear()
        service = self._service()
        within = timedelta(seconds=5)
        runs = {(h.workflow_id, h.run_id): h for _, h in held}
        await asyncio.gather(*(service.reset_sticky_task_queue(
            ResetStickyTaskQueueRequest(namespace=self.namespace, execution=h.run()), timeout=within)
            for h in runs.values()), return_exceptions=True)
        results = await asyncio.gather(*(service.respond_activity_task_failed(
            RespondActivityTaskFailedRequest(task_token=token, failure=failure, identity=self.identity,
                                             namespace=self.namespace), timeout=within)
            for token, _ in held), return_exceptions=True)
        failed = sum(not isinstance(r, BaseException) for r in results)
        if held:
            log.warning("liveness keeper: worker %d ended; %d of its %d running attempts failed as %s for their"
                        " retries", self.parent, failed, len(held), WORKER_LOST)


async def _serve(args: argparse.Namespace) -> None:
    from temporalio.envconfig import ClientConfigProfile

    # The worker's connection (TLS, API key: Temporal's environment configuration, as infra/connection.py
    # reads it), at the address and namespace the worker connected to; no data converter, no payloads.
    options = {**ClientConfigProfile.load().to_client_connect_config(), "target_host": args.address,
               "namespace": args.namespace}
    vouching = Vouching(None, args.namespace, args.parent)
    loop = asyncio.get_running_loop()
    lines = _Lines(vouching)
    await loop.connect_read_pipe(lambda: lines, sys.stdin)
    # The worker's lines are taken from the start (the worker does not wait for the keeper to connect). A
    # worker that ends while the keeper connects still has its attempts failed, once the keeper is connected;
    # one that could not reach Temporal either ends the keeper within CONNECT_AFTER_END seconds.
    reading = asyncio.create_task(lines.to_the_end())
    connecting = asyncio.create_task(Client.connect(**options))
    await asyncio.wait([reading, connecting], return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        connected, _ = await asyncio.wait([connecting], timeout=CONNECT_AFTER_END)
        if not connected:
            connecting.cancel()
            raise TimeoutError(f"its worker ended and Temporal did not answer within {CONNECT_AFTER_END:.0f} s:"
                               f" {len(vouching.held)} attempt(s) left to their heartbeat timeouts")
    vouching.client = connecting.result()
    try:
        os.write(args.ready_fd, b"1")
    except BrokenPipeError:  # the worker died while the keeper connected: no one to tell, its attempts to fail
        pass
    os.close(args.ready_fd)
    beating = asyncio.create_task(vouching.beat_until_the_worker_is_gone())
    done, _ = await asyncio.wait([beating, reading], return_when=asyncio.FIRST_COMPLETED)
    gone = beating in done and beating.exception() is None  # its process is gone, whatever its pipe says
    if gone and not reading.done():  # take the lines it wrote just before, up to its pipe's end
        await asyncio.wait([reading], timeout=DRAIN_AFTER_END)
    beating.cancel()
    reading.cancel()
    broken = [task.exception() for task in (beating, reading)
              if task.done() and not task.cancelled() and task.exception() is not None]
    if broken and not gone:  # our own fault, not the worker's end: leave its attempts to the pump and the server
        log.error("liveness keeper stopped: %s", broken[0])
        return
    if broken:
        log.warning("liveness keeper: the last lines of worker %d could not be read: %s", vouching.parent, broken[0])
    await vouching.worker_ended()


class _Lines(asyncio.Protocol):
    """The worker's lines, taken until its end of the pipe closes (an over-long line is skipped): all that
    one read brings, then the pipe rests GATHER seconds (it holds what the worker writes meanwhile), so a
    busy worker's hundreds of lines a second wake the keeper a few dozen times, not once each."""

    def __init__(self, vouching: Vouching) -> None:
        self._vouching = vouching
        self._partial = b""
        self._skipping = False  # the rest of an over-long line, up to its end
        self._pipe: asyncio.ReadTransport | None = None
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._pipe = cast(asyncio.ReadTransport, transport)

    def data_received(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            if self._skipping:
                self._skipping = False
            else:
                self._vouching.take(line.decode(errors="replace"))
        if len(self._partial) > MAX_LINE:
            if not self._skipping:
                log.warning("liveness keeper: a line over %d bytes skipped", MAX_LINE)
            self._partial, self._skipping = b"", True
        if self._pipe is not None and not self.ended.done():
            self._pipe.pause_reading()
            asyncio.get_running_loop().call_later(GATHER, self._resume)

    async def to_the_end(self) -> None:
        await self.ended

    def _resume(self) -> None:
        if self._pipe is not None and not self._pipe.is_closing():
            self._pipe.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ended.done():
            return
        if exc is None:
            self.ended.set_result(None)
        else:
            self.ended.set_exception(exc)


def main() -> None:
    parser = argparse.ArgumentParser(description="Keeps a worker's running attempts alive (started by the worker).")
    parser.add_argument("--parent", type=int, required=True, help="the worker's pid")
    parser.add_argument("--address", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--ready-fd", type=int, required=True, help="where to say it has connected")
    args = parser.parse_args()
    from infra.telemetry import setup_logging

    setup_logging()
    # Ctrl-C and a stop reach the worker's whole process group: the keeper stays until the worker is gone,
    # which it learns from its end of the pipe, so a worker shutting down gracefully is vouched for to the end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = 0
    try:
        asyncio.run(_serve(args))
    except Exception as err:  # it cannot reach Temporal: the worker says so itself, and runs on with the pump
        log.error("liveness keeper stopped: %s", str(err).splitlines()[0] if str(err) else type(err).__name__)
        code = 1
    # Out without the interpreter's finalization: the SDK's core threads may still call into Python while
    # it tears down ("Fatal Python error: PyGILState_Release", seen on the worker's stderr when a worker
    # with a bad model setting exited while its keeper was connecting). It holds no files of its own.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
