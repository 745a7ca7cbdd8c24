"""An encrypted stack as `make up` starts it (PAYLOAD_ENCRYPTION_KEY in its environment): it runs a
codec server and exports TEMPORAL_CODEC_ENDPOINT, so the README's `.venv/bin/temporal` commands show
tasks decrypted; without the endpoint the same query shows only ciphertext."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.__main__ import build_state, print_state, seed_demo_data
from devstack.stack import Stack
from infra.codec import new_key
from tests.test_readme import ROOT, runbook_blocks


@pytest.fixture
def encrypted_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    monkeypatch.setenv("PAYLOAD_ENCRYPTION_KEY", new_key())
    with Stack.for_tests(tmp_path / "stack", headless=True, with_worker=True) as stack:
        seed_demo_data(stack.env())
        yield stack


def shell(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_readmes_temporal_commands_read_an_encrypted_stack(encrypted_stack: Stack,
                                                               capsys: pytest.CaptureFixture[str]):
    print_state(build_state(encrypted_stack))
    printed = capsys.readouterr().out
    endpoint = encrypted_stack.codec_url
    assert f"--codec-endpoint {endpoint}" in printed and f"export TEMPORAL_CODEC_ENDPOINT={endpoint}" in printed
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "PAYLOAD_"))}
    env.update(dict(re.findall(r"^export (\w+)=(\S+)$", printed, flags=re.MULTILINE)))  # pasted, as `make up` says
    env = {k: v.strip("'") for k, v in env.items()}

    ran = shell(".venv/bin/python -m devstack scenario SU-88421", env)
    assert ran.returncode == 0, ran.stderr
    commands = [line.split("  #")[0] for block in runbook_blocks() for line in block.splitlines()
                if line.startswith(".venv/bin/temporal ")]
    assert any("workflow query" in c for c in commands), commands
    for command in commands:
        done = shell(command, env)
        assert done.returncode == 0, (command, done.stderr)
        assert "binary/encrypted" not in done.stdout, (command, done.stdout[:500])
        if "workflow query" in command:
            assert "issue_refund" in done.stdout and "ticket-SU-88421" in done.stdout, done.stdout[:500]
    without = shell(next(c for c in commands if "workflow query" in c),
                    {k: v for k, v in env.items() if k != "TEMPORAL_CODEC_ENDPOINT"})
    assert without.returncode == 0 and without.stdout.strip(), without.stderr
    assert "issue_refund" not in without.stdout, "without the codec server the CLI sees only ciphertext"
