"""Configuration mistakes and unreachable services: one line on stderr and a non-zero exit."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.authority import AuthorityActivities, public_key_from
from core.models import ResolveInput, VerifyInput

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
                                        ("PAYLOAD_ENCRYPTION_KEY", "not-base64!"), ("APPROVERS", "alice@example.com"),
                                        ("APPROVERS", "alice@example.com=bm90IGEga2V5")])
def test_malformed_setting(name: str, value: str, stack: Stack):
    line = one_line(run(["worker.py"], TEMPORAL_ADDRESS=stack.address, STRIPE_API_BASE=stack.stripe_url,
                        **{name: value}))
    assert name in line or "PAYLOAD_ENCRYPTION_KEY" in line


def test_unknown_task_and_not_waiting(stack: Stack, tmp_path: Path):
    key_file = tmp_path / "me.pem"
    made = run(["starter.py", "keygen", "me@example.com", "--out", str(key_file)])
    assert made.returncode == 0 and "APPROVERS" in made.stdout and "me@example.com=" in made.stdout, made.stderr
    assert key_file.stat().st_mode & 0o077 == 0, "the private key is readable by its owner only"
    assert "exists" in one_line(run(["starter.py", "keygen", "me@example.com", "--out", str(key_file)]))
    line = one_line(run(["starter.py", "resolve", "no-such-task", "approve", "--by", "me@example.com",
                         "--key-file", str(key_file)], TEMPORAL_ADDRESS=stack.address, STRIPE_API_BASE=stack.stripe_url))
    assert "no task no-such-task" in line


def test_sign_prints_a_decision_the_worker_can_verify(tmp_path: Path):
    """Offline (--key given): the JSON to paste into the Web UI's signal form, signed over every field."""
    key_file = tmp_path / "ops.pem"
    made = run(["starter.py", "keygen", "ops@example.com", "--out", str(key_file)])
    public = made.stdout.split("ops@example.com=")[1].split()[0]
    done = run(["starter.py", "sign", "ticket-SU-88421", "mark_performed", "--by", "ops@example.com",
                "--key-file", str(key_file), "--key", "v1:issue_refund:abc", "--provider-ref", "re_1",
                "--note", "seen in the dashboard"])
    assert done.returncode == 0, done.stderr
    decision = ResolveInput.model_validate_json(done.stdout)
    assert (decision.task_id, decision.intent_key, decision.provider_ref) == ("ticket-SU-88421",
                                                                               "v1:issue_refund:abc", "re_1")
    verify = AuthorityActivities(None, {"ops@example.com": public_key_from(public)}, 0, 0, 1).verify_decision
    verdict = asyncio.run(ActivityEnvironment().run(verify, VerifyInput(decision=decision)))
    assert verdict.valid, verdict.why
    forged = decision.model_copy(update={"provider_ref": "re_2"})
    assert not asyncio.run(ActivityEnvironment().run(verify, VerifyInput(decision=forged))).valid


def test_a_key_file_that_is_not_a_key(tmp_path: Path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    line = one_line(run(["starter.py", "sign", "t", "approve", "--by", "me", "--key-file", str(junk), "--key", "k"]))
    assert f"cannot read an Ed25519 private key from {junk}" in line
