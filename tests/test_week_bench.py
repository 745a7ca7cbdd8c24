"""`make week` itself: a small week end to end, judged on what it read of the provider, the ledger and the
server's histories."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devstack.processes import PROJECT_ROOT
from devstack.week import report


@pytest.mark.parametrize("encrypted", [False, True])
def test_a_small_week_pays_once_loses_nothing_and_stores_what_it_was_told(encrypted: bool):
    # A deadline well inside the test's own limit: a worker that cannot open its tickets loses them, and
    # the week says so, rather than outlasting the test.
    command = [sys.executable, "-m", "devstack.week", "--tickets", "40", "--deadline", "240", "--json",
               *(["--encrypted"] if encrypted else [])]
    run = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout[run.stdout.index("\n{") + 1:])
    world = result["world"]
    assert world["provider refunds"] > 0 and result["states"].get("completed", 0) > 0
    assert world["items paid twice (refunds above the price)"] == 0
    assert world["provider refunds per intent key above one"] == 0
    assert world["lost (not completed, dead-lettered or waiting)"] == 0
    assert result["bare_seconds"] > 0  # every bare task completed
    # What the server holds: the ticket's input as the client encoded it, its first step as the worker
    # process did (ciphertext only if that process had the key), and bare Temporal's as its worker did.
    sealed = "binary/encrypted" if encrypted else "json/plain"
    assert result["stored_encodings"] == {"ticket's input (the client's)": sealed,
                                          "ticket's first step (the worker's)": sealed,
                                          "bare task's first step": "json/plain"}
    assert (result["encrypted"], result["compressed"]) == (encrypted, encrypted)
    # Where each side's time went, read from the processes themselves: a meter on the wrong pid reads 0.
    cpu = result["cpu"]
    assert all(cpu[side]["worker"] > 0 and cpu[side]["Temporal server"] > 0 for side in ("harness", "bare"))
    assert cpu["harness"]["worker's liveness keeper"] > 0 and cpu["harness"]["localstripe"] > 0
    assert "| CPU a ticket, worker, harness / bare |" in report(result)
    # read against its targets: what the provider and the histories showed above, as the report says it
    assert "| paid twice | 0 | items 0 / orders 0 / intent keys 0 | met |" in report(result)
    assert "| tickets lost | 0 | harness 0 | met |" in report(result)
    assert "| live attempts timed out | 0 | harness 0 / bare 0 | met |" in report(result)
    assert f"the tickets' payloads {'encrypted and compressed' if encrypted else 'not encrypted'};" in report(result)
