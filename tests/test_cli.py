"""Configuration mistakes and unreachable services: one line on stderr and a non-zero exit."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.authority import AuthorityActivities, Deployment, new_key_file, public_key_from
from activities.db import Database
from core.authority import Ceilings
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


@pytest.mark.parametrize("script", ["worker.py", "devstack"])
def test_unreachable_payment_provider(script: str, stack: Stack):
    args = [script] if script == "worker.py" else ["-m", script, "scenario", "SU-88421"]
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
    """Offline (--key and --question given): the JSON to paste into the Web UI's signal form, signed over
    every field, the question it answers among them."""
    key_file = tmp_path / "ops.pem"
    made = run(["starter.py", "keygen", "ops@example.com", "--out", str(key_file)])
    public = made.stdout.split("ops@example.com=")[1].split()[0]
    done = run(["starter.py", "sign", "ticket-SU-88421", "mark_performed", "--by", "ops@example.com",
                "--key-file", str(key_file), "--key", "v1:issue_refund:abc", "--question", "2",
                "--provider-ref", "re_1", "--note", "seen in the dashboard"])
    assert done.returncode == 0, done.stderr
    decision = ResolveInput.model_validate_json(done.stdout)
    assert (decision.task_id, decision.intent_key, decision.question, decision.provider_ref) == (
        "ticket-SU-88421", "v1:issue_refund:abc", 2, "re_1")
    db = Database(tmp_path / "agent.db")  # where the verified decision's nonce is kept
    db.create()
    verify = AuthorityActivities(db, Deployment({"ops@example.com": public_key_from(public)}, Ceilings(0, 0), 1)).verify_decision
    verdict = asyncio.run(ActivityEnvironment().run(verify, VerifyInput(decision=decision)))
    assert verdict.valid, verdict.why
    for forged in (decision.model_copy(update={"provider_ref": "re_2"}), decision.model_copy(update={"question": 3}),
                   decision.model_copy(update={"question": None})):
        assert not asyncio.run(ActivityEnvironment().run(verify, VerifyInput(decision=forged))).valid, forged
    # Without --question, sign asks Temporal which question the task asks now.
    line = one_line(run(["starter.py", "sign", "ticket-SU-88421", "approve", "--by", "ops@example.com",
                         "--key-file", str(key_file), "--key", "v1:issue_refund:abc"], TEMPORAL_ADDRESS="127.0.0.1:1"))
    assert "127.0.0.1:1" in line, line


def test_a_key_file_that_is_not_a_key(tmp_path: Path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    line = one_line(run(["starter.py", "sign", "t", "approve", "--by", "me", "--key-file", str(junk), "--key", "k"]))
    assert f"cannot read an Ed25519 private key from {junk}" in line


@pytest.fixture
async def encrypted_waiting_task(stack: Stack, settings, world):
    """A task of an encrypted stack, waiting for an approval, with its worker running in this process."""
    from temporalio.client import Client

    from infra.codec import data_converter, new_key
    from tests.helpers import scenario_task, start, waiting
    from worker import build_worker

    key = new_key()
    encrypted = await Client.connect(stack.address, data_converter=data_converter(key))
    low_ceiling = settings.model_copy(update={"approval_ceiling_cents": 5000})
    task = scenario_task("SU-88421")
    async with build_worker(encrypted, low_ceiling):
        handle = await start(encrypted, low_ceiling, task)
        await waiting(handle)
        yield task.task_id, key, low_ceiling


@pytest.mark.parametrize("key_case", ["missing", "wrong"])
async def test_encrypted_tasks_without_the_right_key(key_case: str, encrypted_waiting_task, stack: Stack,
                                                     tmp_path: Path):
    """status, list, resolve and batch on encrypted tasks: one line and exit 2, naming the key."""
    import asyncio
    import json

    from infra.codec import new_key

    task_id, _, settings = encrypted_waiting_task
    wrong = new_key() if key_case == "wrong" else ""
    env = {"TEMPORAL_ADDRESS": stack.address, "STRIPE_API_BASE": stack.stripe_url, "TASK_QUEUE": settings.task_queue,
           "AGENT_DB_PATH": str(settings.agent_db_path), "PAYLOAD_ENCRYPTION_KEY": wrong}
    tickets = tmp_path / "t.jsonl"
    tickets.write_text(json.dumps({"kind": "support", "ticket_id": task_id.removeprefix("ticket-"),
                                   "text": "again", "facts": {"order_id": "SU-88421"}}) + "\n")
    key_file = tmp_path / "me.pem"
    new_key_file(key_file)
    for args in (["status", task_id], ["list"],
                 ["resolve", task_id, "approve", "--by", "me@example.com", "--key-file", str(key_file)],
                 ["start", "support", task_id.removeprefix("ticket-"), "--text", "again", "--order", "SU-88421"],
                 ["batch", str(tickets)]):
        line = one_line(await asyncio.to_thread(run, ["starter.py", *args], **env))
        assert "PAYLOAD_ENCRYPTION_KEY" in line, (args, line)


def test_connection_from_a_temporal_profile(stack: Stack, tmp_path: Path):
    """Temporal's own configuration file and profiles (temporalio.envconfig), no TEMPORAL_ADDRESS."""
    config = tmp_path / "temporal.toml"
    config.write_text(f'[profile.ours]\naddress = "{stack.address}"\nnamespace = "default"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update(TEMPORAL_CONFIG_FILE=str(config), TEMPORAL_PROFILE="ours", STRIPE_API_BASE=stack.stripe_url)
    done = subprocess.run([sys.executable, "starter.py", "list", "--status", "dead_lettered"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    env["TEMPORAL_PROFILE"] = "nobody"
    for script in (["starter.py", "list"], ["worker.py"]):
        done = subprocess.run([sys.executable, *script], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=60)
        assert "Profile 'nobody' not found" in one_line(done), done.stderr


async def test_resolve_without_a_key_says_which_call_it_decides(encrypted_waiting_task, stack: Stack,
                                                                tmp_path: Path):
    """Without --key, resolve decides what the task waits for when it runs: it names that call (tool,
    arguments, reason) and the --key that pins it, before the receipt."""
    import asyncio

    from cryptography.hazmat.primitives import serialization

    from tests.approvers import ALICE, ALICE_KEY

    task_id, key, settings = encrypted_waiting_task
    key_file = tmp_path / "alice.pem"
    key_file.write_bytes(ALICE_KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
    env = {"TEMPORAL_ADDRESS": stack.address, "STRIPE_API_BASE": stack.stripe_url, "TASK_QUEUE": settings.task_queue,
           "AGENT_DB_PATH": str(settings.agent_db_path), "PAYLOAD_ENCRYPTION_KEY": key}
    # A question the person did not see is never signed: the task asks question 1.
    line = one_line(await asyncio.to_thread(run, ["starter.py", "resolve", task_id, "approve", "--by", ALICE,
                                                  "--key-file", str(key_file), "--question", "2"], **env))
    assert f"{task_id} asks question 1 (approval_required on issue_refund), not --question 2" in line, line
    done = await asyncio.to_thread(run, ["starter.py", "resolve", task_id, "approve", "--by", ALICE,
                                         "--key-file", str(key_file), "--note", "checked"], **env)
    assert done.returncode == 0, done.stderr
    [notice] = [line for line in done.stderr.splitlines() if line.startswith("deciding")]
    assert "issue_refund" in notice and "approval_required" in notice and "--key v1:issue_refund:" in notice
    assert "--question 1 " in notice
    assert done.stdout.startswith(f"{task_id}: approve on v1:issue_refund:"), done.stdout
