"""The local stack as one object: Temporal dev server + localstripe (+ workers).

Humans get fixed ports (7233, UI 8233, localstripe 8420) and `.local/`;
tests get free ports and their own folder via Stack.for_tests(), so parallel
runs never share a server, a provider store or a database.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from devstack.processes import (
    LOOPBACK,
    PROJECT_ROOT,
    CodecServer,
    ConfigError,
    LocalStripe,
    ManagedProcess,
    TemporalDevServer,
    WorkerProcess,
    free_port,
    port_in_use,
)

DEFAULT_DATA_DIR = PROJECT_ROOT / ".local"
STRIPE_API_KEY = "sk_test_local"
DEMO_APPROVER = "demo@example.com"
TASK_QUEUE = "agent-tasks"


def add_server_config_option(parser: argparse.ArgumentParser) -> None:
    """`--server-config KEY=VALUE`, repeatable: dynamic config for the dev server over `SERVER_PRAGMAS`."""
    parser.add_argument("--server-config", action="append", default=[], metavar="KEY=VALUE", type=_key_value,
                        help="a dynamic config value for the dev server over the stack's, "
                             "e.g. history.timerProcessorMaxPollRPS=20")


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not (key and sep and value):
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


@dataclass
class Stack:
    data_dir: Path = DEFAULT_DATA_DIR
    temporal_port: int = 7233
    ui_port: int = 8233
    stripe_port: int = 8420
    namespace: str = "default"
    task_queue: str = TASK_QUEUE
    headless: bool = False
    with_worker: bool = False
    timeout: float = 60.0
    detached: bool = False
    temporal: TemporalDevServer | None = field(default=None, init=False)
    localstripe: LocalStripe | None = field(default=None, init=False)
    codec: CodecServer | None = field(default=None, init=False)
    codec_port: int = 8888
    server_config: dict[str, str] = field(default_factory=dict)  # dynamic config values for the dev server
    workers: list[WorkerProcess] = field(default_factory=list, init=False)
    startup_seconds: dict[str, float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()

    @classmethod
    def for_tests(cls, data_dir: Path | str, *, headless: bool = True, with_worker: bool = False,
                  server_config: dict[str, str] | None = None) -> Stack:
        """A stack on free ports in data_dir (e.g. pytest's tmp_path), UI off by default."""
        return cls(
            data_dir=Path(data_dir),
            temporal_port=free_port(),
            ui_port=free_port(),
            stripe_port=free_port(),
            codec_port=free_port(),
            headless=headless,
            with_worker=with_worker,
            server_config=server_config or {},
        )

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.temporal_port}"

    @property
    def stripe_url(self) -> str:
        return f"http://{LOOPBACK}:{self.stripe_port}"

    @property
    def ui_url(self) -> str | None:
        return None if self.headless else f"http://{LOOPBACK}:{self.ui_port}"

    @property
    def agent_db(self) -> Path:
        return self.data_dir / "agent.db"

    @property
    def temporal_db(self) -> Path:
        return self.data_dir / "temporal.db"

    def log_file(self, name: str) -> Path:
        return self.data_dir / f"{name}.log"

    def env(self) -> dict[str, str]:
        """What worker.py, starter.py and the temporal CLI read to find this stack.

        With PAYLOAD_ENCRYPTION_KEY in the environment the stack runs encrypted, and a starter needs
        the same key: it is one of the lines (a local development key, in the git-ignored data folder).
        """
        env = {
            "TEMPORAL_ADDRESS": self.address,
            "TEMPORAL_NAMESPACE": self.namespace,
            "TASK_QUEUE": self.task_queue,
            "STRIPE_API_BASE": self.stripe_url,
            "STRIPE_API_KEY": STRIPE_API_KEY,
            "AGENT_DB_PATH": str(self.agent_db),
        }
        if self.ui_url:
            env["TEMPORAL_UI_URL"] = self.ui_url
        if not os.environ.get("APPROVERS"):  # the stack's own approver, to sign decisions with
            env["APPROVERS"] = f"{DEMO_APPROVER}={self.demo_approver_key()}"
            env["APPROVER"], env["APPROVER_KEY_FILE"] = DEMO_APPROVER, str(self.demo_approver_file)
        if os.environ.get("PAYLOAD_ENCRYPTION_KEY"):
            env["PAYLOAD_ENCRYPTION_KEY"] = os.environ["PAYLOAD_ENCRYPTION_KEY"]
        if self.encrypted:  # the temporal CLI's --codec-endpoint: it shows tasks decrypted
            env["TEMPORAL_CODEC_ENDPOINT"] = self.codec_url
        return env

    @property
    def encrypted(self) -> bool:
        return bool(os.environ.get("PAYLOAD_ENCRYPTION_KEY"))

    @property
    def codec_url(self) -> str:
        return f"http://{LOOPBACK}:{self.codec_port}"

    @property
    def demo_approver_file(self) -> Path:
        return self.data_dir / "demo-approver.pem"

    def demo_approver_key(self) -> str:
        """The local stack's one approver (unless APPROVERS is set): its private key stays in the data
        folder, and `make up` exports APPROVER and APPROVER_KEY_FILE for `starter.py resolve`."""
        from activities.authority import load_key_file, new_key_file, public_key_text

        path = self.demo_approver_file
        if not path.exists():  # written aside and linked in whole: a reader never sees half a key
            self.data_dir.mkdir(parents=True, exist_ok=True)
            aside = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
            new_key_file(aside)
            try:
                os.link(aside, path)
            except FileExistsError:
                pass
            finally:
                aside.unlink()
        return public_key_text(load_key_file(path))

    def check_ports(self) -> None:
        wanted = {"Temporal": self.temporal_port, "localstripe": self.stripe_port}
        if not self.headless:
            wanted["Temporal Web UI"] = self.ui_port
        if self.encrypted:
            wanted["codec server"] = self.codec_port
        if len(set(wanted.values())) < len(wanted):
            raise ConfigError(f"two components were given the same port: {wanted}")
        for what, port in wanted.items():
            if port_in_use(port):
                raise ConfigError(
                    f"port {port} for {what} is already in use on {LOOPBACK}; "
                    "stop whatever holds it (`make down` if it is an earlier stack) or choose another port"
                )

    def start(self) -> None:
        """Start Temporal and localstripe side by side, then the worker if asked; all ready on return.

        On any failure whatever was started is stopped again before the error propagates.
        """
        self.check_ports()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.encrypted:  # for the Web UI and the temporal CLI
            ui = f"http://{LOOPBACK}:{self.ui_port}"
            origins = [] if self.headless else [ui, ui.replace(LOOPBACK, "localhost")]
            self.codec = CodecServer(self.codec_port, self.log_file("codec"), origins)
            self.codec.detached = self.detached
            self.codec.start()
            self.startup_seconds["codec"] = self.codec.wait_ready(self.timeout)
        self.temporal = TemporalDevServer(
            self.temporal_port, self.ui_port, self.temporal_db, self.log_file("temporal"),
            namespace=self.namespace, headless=self.headless,
            codec_endpoint=self.codec.url if self.codec else None, dynamic_config=self.server_config,
        )
        self.localstripe = LocalStripe(self.stripe_port, self.log_file("localstripe"),
                                       self.data_dir / "localstripe.pickle")
        self.temporal.detached = self.localstripe.detached = self.detached
        try:
            for proc in (self.temporal, self.localstripe):
                proc.start()
            deadline = time.monotonic() + self.timeout
            for proc in (self.temporal, self.localstripe):
                self.startup_seconds[proc.name] = proc.wait_ready(max(0.0, deadline - time.monotonic()))
            if self.with_worker:
                self.start_worker()
        except BaseException:
            self.stop()
            raise

    def start_worker(self, log_file: Path | str | None = None, extra_env: dict[str, str] | None = None,
                     module: str | None = None) -> WorkerProcess:
        """Start one more worker against this stack (`python worker.py`, or `python -m module`) and wait
        for its ready line."""
        if log_file is None:
            log_file = self.log_file("worker" if not self.workers else f"worker-{len(self.workers) + 1}")
        worker = WorkerProcess({**self.env(), **(extra_env or {})}, log_file, module=module)
        worker.detached = self.detached
        worker.start()
        self.workers.append(worker)
        self.startup_seconds["worker"] = worker.wait_ready(self.timeout)
        return worker

    def processes(self) -> list[ManagedProcess]:
        return [p for p in (self.temporal, self.localstripe, self.codec, *self.workers) if p is not None]

    def stop(self) -> None:
        """Workers first (they talk to the others), then localstripe, then Temporal."""
        for worker in reversed(self.workers):
            worker.stop()
        if self.localstripe is not None:
            self.localstripe.stop()
        if self.codec is not None:
            self.codec.stop()
        if self.temporal is not None:
            self.temporal.stop()

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
