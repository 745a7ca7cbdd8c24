"""Hand-run check of devstack against the real binaries: `python -m devstack._selftest`.

Kept out of tests/ because it exercises the process plumbing itself (start-up
times, loopback-only binding, process-group cleanup), not the product.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import stripe

from devstack.processes import (
    PROJECT_ROOT,
    ConfigError,
    LocalStripe,
    StartupError,
    TemporalDevServer,
    WorkerProcess,
    free_port,
    group_members,
    temporal_binary,
)
from devstack.stack import Stack

FAKE_WORKER = """
import os, signal, subprocess, sys, time
mode = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FAKE_MODE", "ok")
if mode == "crash":
    print("boom: cannot connect", flush=True); sys.exit(3)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "child":
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(0.3)
print("worker ready on", os.environ["TASK_QUEUE"], os.environ["TEMPORAL_ADDRESS"])
while True:
    time.sleep(1)
"""


def check(label: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + detail) if detail else ''}", flush=True)
    if not ok:
        raise SystemExit(1)


def listeners(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp*) listening on port."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.append(addr)
    return found


def pids_alive(pids: list[int]) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,stat="], capture_output=True, text=True).stdout
    live = {int(p) for p, st in (line.split() for line in out.splitlines()) if not st.startswith("Z")}
    return [p for p in pids if p in live]


class FakeWorker(WorkerProcess):
    def __init__(self, env: dict[str, str], log_file: Path, script: Path, mode: str) -> None:
        super().__init__(env, log_file, script=script)
        self.mode = mode

    def command(self) -> list[str]:
        return [*super().command(), self.mode]


def check_stack(tmp: Path) -> None:
    stack = Stack.for_tests(tmp / "stack")
    t0 = time.monotonic()
    with stack:
        total = time.monotonic() - t0
        print(f"     start-up: {', '.join(f'{k} {v:.2f}s' for k, v in stack.startup_seconds.items())}; stack {total:.2f}s")
        pids = [p.pid for p in stack.processes() if p.pid]

        out = subprocess.run(
            [temporal_binary(), "operator", "search-attribute", "list", "--address", stack.address, "-o", "json"],
            capture_output=True, text=True, check=True,
        ).stdout
        custom = json.loads(out)["customAttributes"]
        check("search attributes registered", all(custom.get(k) == "INDEXED_VALUE_TYPE_KEYWORD"
                                                  for k in ("AgentStatus", "AgentScenario", "AgentEscalation")))

        from temporalio.client import Client

        async def describe() -> str:
            client = await Client.connect(stack.address, namespace=stack.namespace)
            return (await client.service_client.workflow_service.get_system_info(
                __import__("temporalio.api.workflowservice.v1", fromlist=["x"]).GetSystemInfoRequest()
            )).server_version

        check("temporalio client connects", bool(asyncio.run(describe())))
        for port in (stack.temporal_port, stack.stripe_port):
            addrs = listeners(port)
            check(f"port {port} listens on 127.0.0.1 only", addrs == ["0100007F"], str(addrs))

        env = stack.env()
        check("env has the six variables", sorted(env) == sorted(
            ["TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TASK_QUEUE", "STRIPE_API_BASE", "STRIPE_API_KEY", "AGENT_DB_PATH"]))
        client = stripe.StripeClient(env["STRIPE_API_KEY"], base_addresses={"api": env["STRIPE_API_BASE"]})
        t = time.monotonic()
        customer = client.v1.customers.create(params={"email": "buyer@example.com"})
        pi = client.v1.payment_intents.create(
            params={"amount": 11800, "currency": "usd", "payment_method": "pm_card_visa", "confirm": True})
        refund = client.v1.refunds.create(params={"payment_intent": pi.id, "metadata": {"intent_key": "v1:test"}})
        listed = client.v1.refunds.list(params={"payment_intent": pi.id})
        check("stripe SDK against localstripe", customer.id.startswith("cus_") and refund.status == "succeeded"
              and len(listed.data) == 1, f"{(time.monotonic() - t) * 1000:.0f} ms for 4 calls")
        check("no pickle written", not Path("/tmp/localstripe.pickle").exists())

        try:
            Stack(data_dir=tmp / "clash", temporal_port=stack.temporal_port, stripe_port=free_port(),
                  headless=True).start()
            check("port clash is a ConfigError", False)
        except ConfigError as e:
            check("port clash is a ConfigError", "already in use" in str(e), str(e))

        worker_checks(tmp, env)
    gone = all(not group_members(pid) for pid in pids)
    check("stack.stop() leaves no process", gone and not pids_alive(pids), f"pids {pids}")


def worker_checks(tmp: Path, env: dict[str, str]) -> None:
    script = tmp / "fake_worker.py"
    script.write_text(textwrap.dedent(FAKE_WORKER))
    log = tmp / "worker.log"

    w = FakeWorker(env, log, script, "ok")
    w.start()
    secs = w.wait_ready(10)
    check("worker ready line seen", secs >= 0.3, f"{secs:.2f}s")
    code = w.kill()
    check("kill() is SIGKILL", code == -signal.SIGKILL, str(code))
    w.start()
    secs = w.wait_ready(10)
    check("restart waits for a new ready line in the same log", secs >= 0.3, f"{secs:.2f}s")
    code = w.stop()
    check("stop() is SIGTERM", code == -signal.SIGTERM and not w.exited_cleanly(), str(code))

    try:
        FakeWorker(env, log, script, "crash").__enter__()
        check("early exit raises StartupError", False)
    except StartupError as e:
        check("early exit raises StartupError with log tail", "boom: cannot connect" in str(e))

    w = FakeWorker(env, log, script, "stubborn")
    w.start()
    w.wait_ready(10)
    t = time.monotonic()
    code = w.stop(timeout=1.0)
    check("stop() escalates to SIGKILL", code == -signal.SIGKILL and 1.0 <= time.monotonic() - t < 3.0,
          f"{time.monotonic() - t:.2f}s")

    w = FakeWorker(env, log, script, "child")
    w.start()
    w.wait_ready(10)
    members = group_members(w.pid or 0)
    w.stop()
    check("stop() ends the worker's children too", len(members) == 2 and not pids_alive(members), str(members))


def check_real_worker(tmp: Path) -> None:
    """worker.py (the other half of the project), if present: ready line, stop, restart, kill."""
    if not (PROJECT_ROOT / "worker.py").is_file():
        print("     (no worker.py yet; real worker not checked)")
        return
    with Stack.for_tests(tmp / "real", with_worker=True) as stack:
        first = stack.workers[0]
        code = first.stop()
        check("worker.py ready and stopped cleanly", first.exited_cleanly(),
              f"ready in {first.ready_seconds:.2f}s, exit {code}")
        second = stack.start_worker()
        code = second.kill()
        check("second worker.py killed", code == -signal.SIGKILL, f"ready in {second.ready_seconds:.2f}s")


def check_components(tmp: Path) -> None:
    port = free_port()
    with LocalStripe(port, tmp / "ls.log") as ls:
        client = stripe.StripeClient("sk_test_local", base_addresses={"api": ls.url})
        client.v1.customers.create(params={"email": "x@example.com"})
        print(f"     localstripe ready in {ls.ready_seconds:.2f}s")
    with LocalStripe(port, tmp / "ls.log") as ls:
        client = stripe.StripeClient("sk_test_local", base_addresses={"api": ls.url})
        check("each localstripe start is an empty store", len(client.v1.customers.list().data) == 0)

    db = tmp / "ui" / "temporal.db"
    db.parent.mkdir()
    for run in ("first", "second (same db file)"):
        server = TemporalDevServer(free_port(), free_port(), db, tmp / "ui" / "temporal.log")
        with server:
            sock = socket.create_connection(("127.0.0.1", server.ui_port), timeout=2)
            sock.close()
            print(f"     temporal with UI, {run} start: ready in {server.ready_seconds:.2f}s")
        check(f"temporal {run} stopped", not group_members(server.pid or 0))

    try:
        with TemporalDevServer(free_port(), free_port(), tmp / "nodir" / "x" / "t.db", tmp / "bad.log", headless=True):
            pass
        check("bad db path fails", False)
    except StartupError as e:
        check("bad db path raises StartupError quickly", "exited with code" in str(e), str(e).splitlines()[0])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="devstack-selftest-") as tmp:
        check_stack(Path(tmp))
        check_real_worker(Path(tmp))
        check_components(Path(tmp))
    print("devstack selftest passed")


if __name__ == "__main__":
    sys.exit(main())
