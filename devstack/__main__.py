"""`python -m devstack up|down|status|env|demo|scenario|compare|seed|batch`: the local stack for people.

`up` leaves the servers running after it returns (each in its own session) and
records them in <data dir>/stack.json; `down` stops exactly those process
groups, checking each PID's start time so a reused PID is never signalled.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from devstack.processes import (
    ManagedProcess,
    StackError,
    process_start_time,
    stop_group,
    tcp_accepts,
)
from devstack.stack import DEFAULT_DATA_DIR, Stack
from infra.exit import run_main
from infra.settings import load_settings


def state_path(data_dir: Path) -> Path:
    return data_dir / "stack.json"


def read_state(data_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads(state_path(data_dir).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise StackError(f"{state_path(data_dir)} is not valid JSON; remove it and stop the servers by hand") from None


def is_ours(entry: dict[str, Any]) -> bool:
    """The recorded PID still runs, leads its group, and is the same process (same start time)."""
    pid = entry["pid"]
    started = process_start_time(pid)
    recorded = entry.get("start_time")
    if isinstance(recorded, int):  # recorded by an earlier version: clock ticks since boot
        recorded = psutil.boot_time() + recorded / os.sysconf("SC_CLK_TCK")
    if started is None or (recorded is not None and abs(started - recorded) > 0.05):
        return False
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def describe(proc: ManagedProcess) -> dict[str, Any]:
    assert proc.pid is not None
    entry: dict[str, Any] = {
        "pid": proc.pid,
        "start_time": process_start_time(proc.pid),
        "log": str(proc.log_file),
        "ready_seconds": round(proc.ready_seconds or 0.0, 3),
    }
    entry["port"] = getattr(proc, "port", None)
    return entry


def build_state(stack: Stack) -> dict[str, Any]:
    processes = {p.name: describe(p) for p in stack.processes()}
    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "data_dir": str(stack.data_dir),
        "ports": {"temporal": stack.temporal_port, "ui": None if stack.headless else stack.ui_port,
                  "localstripe": stack.stripe_port},
        "codec_endpoint": stack.codec_url if stack.codec is not None else None,
        "ui_url": stack.ui_url,
        "env": stack.env(),
        "processes": processes,
    }


def print_state(state: dict[str, Any]) -> None:
    procs = state["processes"]
    ports = state["ports"]
    t = procs.get("temporal", {})
    s = procs.get("localstripe", {})
    print(f"Temporal     127.0.0.1:{ports['temporal']}  (pid {t.get('pid')}, log {t.get('log')})")
    if state.get("ui_url"):
        print(f"Web UI       {state['ui_url']}")
    print(f"localstripe  http://127.0.0.1:{ports['localstripe']}  (pid {s.get('pid')}, log {s.get('log')})")
    if "worker" in procs:
        print(f"worker       pid {procs['worker']['pid']}  (log {procs['worker']['log']})")
    if state.get("codec_endpoint"):
        print(f"codec server {state['codec_endpoint']}  (encrypted payloads: the Web UI uses it; for the temporal CLI "
              f"`--codec-endpoint {state['codec_endpoint']}`, or the TEMPORAL_CODEC_ENDPOINT export below)")
    print(f"data folder  {state['data_dir']}")
    print()
    print_exports(state["env"])


def print_exports(env: dict[str, str]) -> None:
    for key, value in env.items():
        print(f"export {key}={shlex.quote(value)}")


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = args.data_dir
    state = read_state(data_dir)
    if state is not None:
        if all(is_ours(e) for e in state["processes"].values()):
            print(f"The stack is already up (started {state['started_at']}).")
            print_state(state)
            return 0
        print("The stack was partly down; restarting it.")
        stop_recorded(state, quiet=True)
        state_path(data_dir).unlink(missing_ok=True)

    stack = Stack(
        data_dir=data_dir,
        temporal_port=args.temporal_port,
        ui_port=args.ui_port,
        stripe_port=args.stripe_port,
        headless=args.headless,
        with_worker=args.worker,
        detached=True,
    )
    stack.start()
    seed_demo_data(stack.env())
    state = build_state(stack)
    state_path(stack.data_dir).write_text(json.dumps(state, indent=2) + "\n")
    ready = ", ".join(f"{name} {secs:.1f}s" for name, secs in stack.startup_seconds.items())
    print(f"The stack is up (ready: {ready}). Stop it with `make down`.")
    print_state(state)
    return 0


def seed_demo_data(env: dict[str, str]) -> None:
    """The scenarios' and the example tickets' orders at the new stack's provider, so that every
    command in the README finds its order."""
    from devstack import demo_commands

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        demo_commands.seed(load_settings())
    except demo_commands.ClientError as err:
        raise StackError(f"could not seed the demo data: {err}") from None
    finally:
        os.environ.clear()
        os.environ.update(saved)


def stop_recorded(state: dict[str, Any], quiet: bool = False) -> list[str]:
    """Stop every recorded group that is still ours, workers first; returns what was stopped."""
    stopped = []
    rank = {"worker": 0, "localstripe": 1, "temporal": 2}
    for name, entry in sorted(state["processes"].items(), key=lambda kv: rank.get(kv[0], 0)):
        if is_ours(entry):
            gone = stop_group(entry["pid"], timeout=10.0)
            stopped.append(name)
            if not quiet:
                note = "" if gone else " (some of its processes would not die; check `ps -g`)"
                print(f"stopped {name} (pid {entry['pid']}){note}")
        elif not quiet:
            print(f"{name} (pid {entry['pid']}) was not running")
    return stopped


def cmd_down(args: argparse.Namespace) -> int:
    state = read_state(args.data_dir)
    if state is None:
        print(f"The stack is not up (no {state_path(args.data_dir)}).")
        return 0
    stop_recorded(state)
    state_path(args.data_dir).unlink(missing_ok=True)
    print("The stack is down.")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = read_state(args.data_dir)
    if state is None:
        print(f"The stack is not up (no {state_path(args.data_dir)}).")
        return 3
    all_up = True
    for name, entry in state["processes"].items():
        alive = is_ours(entry)
        port = entry.get("port")
        serving = alive and (port is None or tcp_accepts(port))
        all_up = all_up and serving
        where = f" port {port}" if port else ""
        what = "running" if serving else ("running, port not answering" if alive else "not running")
        print(f"{name:<12} {what} (pid {entry['pid']}{where})")
    if state.get("ui_url"):
        print(f"Web UI       {state['ui_url']}")
    print(f"data folder  {state['data_dir']}")
    if not all_up:
        print("Some parts are down: `make down && make up` restarts the stack.")
    return 0 if all_up else 3


def cmd_env(args: argparse.Namespace) -> int:
    state = read_state(args.data_dir)
    if state is None:
        raise StackError("the stack is not up; run `make up` first")
    print_exports(state["env"])
    return 0


def run_demo(demo_args: list[str]) -> int:
    """Thin hook: devstack.demo owns the demo and its arguments."""
    from devstack import demo

    return int(demo.main(demo_args) or 0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m devstack", description="Run the local stack.")
    sub = p.add_subparsers(dest="command", required=True)

    def with_data_dir(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--data-dir", type=lambda v: Path(v).resolve(), default=DEFAULT_DATA_DIR,
                        help=f"state, logs and databases (default {DEFAULT_DATA_DIR})")
        return sp

    up = with_data_dir(sub.add_parser("up", help="start Temporal and localstripe in the background"))
    up.add_argument("--temporal-port", type=int, default=7233)
    up.add_argument("--ui-port", type=int, default=8233)
    up.add_argument("--stripe-port", type=int, default=8420)
    up.add_argument("--headless", action="store_true", help="no Web UI")
    up.add_argument("--worker", action="store_true", help="also start worker.py")
    up.set_defaults(func=cmd_up)
    with_data_dir(sub.add_parser("down", help="stop what `up` started")).set_defaults(func=cmd_down)
    with_data_dir(sub.add_parser("status", help="show what runs (exit 3 if not up)")).set_defaults(func=cmd_status)
    with_data_dir(sub.add_parser("env", help="print export lines for a running stack")).set_defaults(func=cmd_env)
    sub.add_parser("demo", help="run the demo with all remaining arguments", add_help=False)
    from devstack import demo_commands

    demo_commands.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:
        args = argparse.Namespace(command="demo", func=lambda a: run_demo(argv[1:]))
    else:
        args = parser().parse_args(argv)
    if hasattr(args, "demo"):
        from devstack import demo_commands

        return demo_commands.run(args, load_settings())
    try:
        return args.func(args)
    except StackError as e:
        print(f"devstack {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    run_main(main)
