"""Configuration mistakes and unreachable services: one line on stderr and a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.stack import Stack

ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=60)


def one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.mark.parametrize("script", ["worker.py", "starter.py"])
def test_unreachable_payment_provider(script: str, stack: Stack):
    args = [script] if script == "worker.py" else [script, "scenario", "SU-88421"]
    line = one_line(run(args, TEMPORAL_ADDRESS=stack.address, STRIPE_API_BASE="http://127.0.0.1:9"))
    assert "payment provider at http://127.0.0.1:9" in line


@pytest.mark.parametrize("script", ["worker.py", "starter.py"])
def test_unreachable_temporal(script: str, stack: Stack):
    args = [script] if script == "worker.py" else [script, "status", "ticket-SU-88421"]
    line = one_line(run(args, TEMPORAL_ADDRESS="127.0.0.1:9", STRIPE_API_BASE=stack.stripe_url))
    assert "cannot reach Temporal at 127.0.0.1:9" in line


@pytest.mark.parametrize("name,value", [("APPROVAL_CEILING_CENTS", "a lot"), ("STRIPE_TIMEOUT_SECONDS", "-1"),
                                        ("PAYLOAD_ENCRYPTION_KEY", "not-base64!")])
def test_malformed_setting(name: str, value: str, stack: Stack):
    line = one_line(run(["worker.py"], TEMPORAL_ADDRESS=stack.address, STRIPE_API_BASE=stack.stripe_url,
                        **{name: value}))
    assert name in line or "PAYLOAD_ENCRYPTION_KEY" in line


def test_unknown_task_and_not_waiting(stack: Stack):
    line = one_line(run(["starter.py", "resolve", "no-such-task", "approve", "--by", "me"],
                        TEMPORAL_ADDRESS=stack.address, STRIPE_API_BASE=stack.stripe_url))
    assert "no task no-such-task" in line
