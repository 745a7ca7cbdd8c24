"""The worker's own checks of a signed decision (activities/authority.py `verify_decision`), without a
Temporal server: a decision lives at most DECISION_MAX_LIFETIME_SECONDS, and its nonce is kept in the
ledger's database with the activity that first verified it, so it verifies once across runs,
redrives and workers; a Temporal retry of that same verification is the only second yes."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import sqlite3
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.testing import ActivityEnvironment

from activities.authority import AuthorityActivities, Deployment, decision_nonces, public_key_from, sign
from activities.db import MIGRATIONS, Database
from core.authority import Ceilings, signed_message
from core.models import ResolveInput, Verdict, VerifyInput
from infra.settings import Settings
from tests.approvers import ALICE, ALICE_KEY, APPROVERS, BOB, BOB_KEY

TASK = "ticket-SU-88421-unit"
KEY = "v1:issue_refund:0123456789abcdef0123456789abcdef"


@pytest.fixture
def db(tmp_path: Path) -> Database:
    made = Database(tmp_path / "agent.db")
    made.create()
    return made


def authority(db: Database, lifetime: int | None = None, approvers: str = APPROVERS) -> AuthorityActivities:
    keys = Settings(approvers=approvers).approver_keys
    extra = {} if lifetime is None else {"decision_max_lifetime_seconds": lifetime}
    return AuthorityActivities(db, Deployment({name: public_key_from(key) for name, key in keys.items()},
                                              Ceilings(10000), 3600, **extra))


def decision(valid_for: timedelta = timedelta(minutes=30), by: str = ALICE,
             signer: Ed25519PrivateKey | None = None, what: str = "approve") -> ResolveInput:
    unsigned = ResolveInput(task_id=TASK, intent_key=KEY, decision=what, decided_by=by, note="checked")
    return sign(unsigned, signer or {ALICE: ALICE_KEY, BOB: BOB_KEY}[by], valid_for)


def verify(auth: AuthorityActivities, request: ResolveInput, workflow_id: str = TASK, run_id: str = "run-1",
           activity_id: str = "7", attempt: int = 1) -> Verdict:
    """verify_decision as the activity with this identity (workflow, run, activity id) runs it."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_id=workflow_id, workflow_run_id=run_id,
                                   activity_id=activity_id, attempt=attempt)
    return asyncio.run(env.run(auth.verify_decision, VerifyInput(decision=request)))


# --- the lifetime cap ---------------------------------------------------------------------------

def test_the_cap_defaults_to_four_hours_and_is_read_from_the_environment(monkeypatch):
    assert Settings().decision_max_lifetime_seconds == 4 * 3600
    monkeypatch.setenv("DECISION_MAX_LIFETIME_SECONDS", "900")
    assert Settings().decision_max_lifetime_seconds == 900
    monkeypatch.setenv("DECISION_MAX_LIFETIME_SECONDS", "0")
    with pytest.raises(ValueError):
        Settings()


def test_a_decision_valid_for_ten_years_is_refused_with_the_cap_as_why(db: Database):
    auth = authority(db)
    verdict = verify(auth, decision(valid_for=timedelta(days=3650)))
    assert not verdict.valid
    assert "valid for at most 4 h" in verdict.why and "DECISION_MAX_LIFETIME_SECONDS" in verdict.why, verdict.why
    assert decision_nonces(db, TASK) == [], "a refused decision uses no nonce"
    assert verify(auth, decision(valid_for=timedelta(hours=4) - timedelta(minutes=1))).valid


def test_the_cap_is_the_workers_setting(db: Database):
    auth = authority(db, lifetime=600)
    verdict = verify(auth, decision(valid_for=timedelta(minutes=30)))
    assert not verdict.valid and "valid for at most 10 min" in verdict.why, verdict.why
    assert verify(auth, decision(valid_for=timedelta(minutes=9))).valid


def test_an_expired_decision_is_still_expired(db: Database):
    verdict = verify(authority(db), decision(valid_for=timedelta(seconds=-5)))
    assert not verdict.valid and verdict.why.startswith("expired at")


# --- nonces across runs --------------------------------------------------------------------------

def test_a_verified_decision_keeps_its_nonce_with_who_first_verified_it(db: Database):
    approval = decision()
    assert verify(authority(db), approval, run_id="run-1", activity_id="7").valid
    [row] = decision_nonces(db, TASK)
    assert (row["nonce"], row["task_id"], row["intent_key"], row["decided_by"], row["first_seen_by"]) == (
        approval.nonce, TASK, KEY, ALICE, f"{TASK}/run-1/7")


def test_a_temporal_retry_of_the_same_verification_is_accepted(db: Database):
    """The first attempt committed the nonce but its result was lost (the worker died): the retry
    is the same activity of the same run, so it verifies again."""
    approval = decision()
    auth = authority(db)
    assert verify(auth, approval, activity_id="7", attempt=1).valid
    assert verify(auth, approval, activity_id="7", attempt=2).valid
    assert verify(authority(db), approval, activity_id="7", attempt=3).valid, "any worker of the queue"
    assert len(decision_nonces(db, TASK)) == 1


def test_the_same_decision_in_another_verification_is_refused(db: Database):
    approval = decision()
    auth = authority(db)
    assert verify(auth, approval, run_id="run-1", activity_id="7").valid
    again = verify(auth, approval, run_id="run-1", activity_id="12")  # sent twice to one run
    assert not again.valid and "this decision was used already" in again.why, again.why
    redriven = verify(auth, approval, run_id="run-2", activity_id="7")  # a redrive: same id, another run
    assert not redriven.valid and "this decision was used already" in redriven.why
    elsewhere = verify(authority(db), approval, workflow_id="other-task", run_id="run-9", activity_id="1")
    assert not elsewhere.valid and "this decision was used already" in elsewhere.why
    [row] = decision_nonces(db, TASK)
    assert row["first_seen_by"] == f"{TASK}/run-1/7"


def test_the_nonces_survive_the_worker(tmp_path: Path):
    """A new worker on the same database (a restart, another host) knows the nonces."""
    first = Database(tmp_path / "agent.db")
    first.create()
    approval = decision()
    assert verify(authority(first), approval, run_id="run-1").valid
    second = Database(tmp_path / "agent.db")
    second.create()
    assert not verify(authority(second), approval, run_id="run-2").valid


def test_a_decision_that_does_not_verify_burns_no_nonce(db: Database):
    """Whoever cannot sign as an approver cannot spend an approver's nonce."""
    auth = authority(db)
    approval = decision()
    forged = approval.model_copy(update={"decision": "reject"})
    assert not verify(auth, forged, run_id="run-1").valid
    stranger = approval.model_copy(update={"decided_by": "mallory@example.com"})
    assert not verify(auth, stranger, run_id="run-1").valid
    assert decision_nonces(db, TASK) == []
    assert verify(auth, approval, run_id="run-2").valid


def test_a_decision_signed_without_a_nonce_is_refused(db: Database):
    """Signed by Alice's key over an empty nonce (not by `starter.py sign`): it could never be used once."""
    unsigned = ResolveInput(task_id=TASK, intent_key=KEY, decision="approve", decided_by=ALICE, note="checked",
                            expires_at=(datetime.now(UTC) + timedelta(minutes=30)).strftime(
                                "%Y-%m-%dT%H:%M:%SZ"))
    signature = base64.b64encode(ALICE_KEY.sign(signed_message(unsigned))).decode()
    verdict = verify(authority(db), unsigned.model_copy(update={"signature": signature}))
    assert not verdict.valid and "nonce" in verdict.why, verdict.why
    assert decision_nonces(db, TASK) == []


def test_the_signers_current_key_map_decides(db: Database):
    """verify_decision checks the approvers this worker is configured with now, not at a task's start."""
    only_bob = f"{BOB}={APPROVERS.split(BOB + '=')[1]}"
    auth = authority(db, approvers=only_bob)
    verdict = verify(auth, decision(by=ALICE))
    assert not verdict.valid and "not an approver on this worker" in verdict.why
    assert verify(auth, decision(by=BOB)).valid


def test_long_expired_nonces_are_pruned_and_recent_ones_kept(db: Database):
    """A nonce is needed only while its decision could verify: after its expiry (and an hour for the
    workers' clocks) the decision is refused as expired anyway, so the table stays small."""
    now = time.time()
    with db.connect() as conn:
        for nonce, expires in (("old", now - 2 * 3600), ("recent", now - 60), ("live", now + 600)):
            conn.execute("INSERT INTO decision_nonces (nonce, task_id, intent_key, decided_by, first_seen_by,"
                         " expires_at, created_at) VALUES (:n, :t, :k, :b, :s, :e, :c)",
                         {"n": nonce, "t": TASK, "k": KEY, "b": ALICE, "s": "x/y/1", "e": expires, "c": now - 3 * 3600})
    assert verify(authority(db), decision()).valid
    kept = {r["nonce"] for r in decision_nonces(db, TASK)}
    assert "old" not in kept and {"recent", "live"} <= kept


def test_concurrent_verifications_of_one_decision_verify_once(db: Database):
    """Two signals with the same decision, verified by different activities at the same moment."""
    approval = decision()
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def one(i: int) -> None:
        auth = authority(Database(db.url))
        barrier.wait()
        results.append(verify(auth, approval, run_id="run-1", activity_id=str(i)).valid)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]


# --- the migration -------------------------------------------------------------------------------

def test_a_ledger_at_the_previous_migration_gets_the_nonce_table(tmp_path: Path):
    db = Database(tmp_path / "agent.db")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with db.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0002")
    db.create()
    with sqlite3.connect(db.path) as conn:
        head = ScriptDirectory.from_config(config).get_current_head()
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == head
        columns = [r[1] for r in conn.execute("PRAGMA table_info(decision_nonces)")]
    assert columns == ["nonce", "task_id", "intent_key", "decided_by", "first_seen_by", "expires_at", "created_at"]
    with db.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0002")
    with sqlite3.connect(db.path) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'decision_nonces'").fetchone()[0] == 0
