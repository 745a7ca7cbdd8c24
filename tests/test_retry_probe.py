"""The retry probe (devstack/retry_probe.py) measures what it says: every probe's retry, after its interval."""

from __future__ import annotations

import json
import subprocess
import sys

from devstack.probe_workflow import RETRY_AFTER
from devstack.processes import PROJECT_ROOT


def test_each_probe_reports_its_retry_started_no_sooner_than_its_interval_after_the_failure():
    run = subprocess.run([sys.executable, "-m", "devstack.retry_probe", "--in-flight", "10", "--probes", "5",
                          "--every", "0.1", "--limit", "600", "--json"],
                         cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert len(result["waits"]) == len(result["from_failure"]) == 5
    assert result["background_completed"] > 0
    # the server starts a retry no sooner than its interval after the failure, and after its own schedule time
    assert all(w >= RETRY_AFTER.total_seconds() for w in result["from_failure"]), result["from_failure"]
    assert all(w >= 0 for w in result["waits"]), result["waits"]
