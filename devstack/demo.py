"""`make demo`: the whole local stack, the three scenarios, then the Web UI until Ctrl-C.

Without a terminal (CI, scripts) it stops everything it started and exits 0 once the
scenarios are done, so it leaves no process behind either way.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import threading

from devstack.demo_commands import StarterError, cmd_compare, run_tasks, seed
from devstack.processes import StackError
from devstack.scenarios import SCENARIOS
from devstack.stack import STRIPE_API_KEY, Stack
from infra.exit import run_main
from infra.settings import PROJECT_ROOT, Settings

DATA_DIR = PROJECT_ROOT / ".local" / "demo"
CLIENT_TIMEOUT = 2.0  # seconds; the injected "timeout after accept" answers one second later


def settings_for(stack: Stack) -> Settings:
    return Settings(temporal_address=stack.address, task_queue=stack.task_queue, stripe_api_base=stack.stripe_url,
                    stripe_api_key=STRIPE_API_KEY, agent_db_path=stack.agent_db, database_url=None,
                    temporal_ui_url=stack.ui_url or "", model_backend="scripted")


def run_scenarios(settings: Settings) -> list[dict]:
    seed(settings)
    summaries = []
    for name, build in SCENARIOS.items():
        print(f"\n### scenario {name}", flush=True)
        summaries += asyncio.run(run_tasks(settings, [build()], as_json=False))
    return summaries


def run_incident_2(settings: Settings) -> None:
    """SU-88421's timeout after accept, through our refund tool and through a naive one."""
    print("\n### incident 2: timeout after accept, our refund tool next to a naive one", flush=True)
    for mode in ("dedupe", "passthrough"):
        asyncio.run(cmd_compare(argparse.Namespace(name="SU-88421", fault="timeout-after-accept", edge_mode=mode),
                                settings))


def main(argv: list[str] | None = None) -> int:
    shutil.rmtree(DATA_DIR, ignore_errors=True)  # each demo starts from an empty world
    stack = Stack(data_dir=DATA_DIR)
    try:
        stack.start()
        stack.start_worker(extra_env={"STRIPE_TIMEOUT_SECONDS": str(CLIENT_TIMEOUT), "MODEL_BACKEND": "scripted",
                                      "DATABASE_URL": "", "PAYLOAD_ENCRYPTION_KEY": ""})
        print(f"Temporal {stack.address}, Web UI {stack.ui_url}, localstripe {stack.stripe_url}, data {DATA_DIR}")
        settings = settings_for(stack).model_copy(update={"stripe_timeout_seconds": CLIENT_TIMEOUT})
        summaries = run_scenarios(settings)
        print("\n== one effect per intent:")
        for s in summaries:
            counts = {kind: len(s["world"][kind]) for kind in ("refunds", "payments", "messages")}
            print(f"   {s['task_id']:<18} {s['state']:<10} {counts}")
        run_incident_2(settings)
        if sys.stdin.isatty() and sys.stdout.isatty():
            print(f"\nWeb UI: {stack.ui_url}/namespaces/default/workflows  (Ctrl-C stops everything)", flush=True)
            threading.Event().wait()
        return 0
    except (StackError, StarterError) as err:
        print(f"demo: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    run_main(lambda: main(sys.argv[1:]))
