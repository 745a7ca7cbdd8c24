"""The ledger on PostgreSQL (127.0.0.1:5432, a database of its own per test): migrations,
intent uniqueness under concurrency from several processes, and the end-to-end paths."""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from pydantic import SecretStr
from temporalio.client import Client

from activities.db import Database
from activities.ledger import Claimed, EffectLedger, Hold, Request
from activities.payments import StripeGateway
from activities.world import World
from core.models import Outcome
from devstack.edge_control import EdgeControl, preset
from devstack.seed import seed_scenarios
from devstack.stack import STRIPE_API_KEY, Stack
from infra.settings import Settings
from tests.helpers import run, running_worker, scenario_task, start

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture
def pg_url():
    name = f"agent_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as err:
        pytest.fail(f"PostgreSQL at 127.0.0.1:5432 is not reachable: {err}")
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def pg(settings: Settings, pg_url: str, edge: EdgeControl) -> tuple[Settings, World]:
    edge.configure("dedupe")
    pg_settings = settings.model_copy(update={"database_url": SecretStr(pg_url)})
    db = Database(pg_url)
    gateway = StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, 10.0)
    seed_scenarios(db, gateway)
    return pg_settings, World(db, gateway)


def test_migrations_create_the_schema_and_are_idempotent(pg_url: str):
    db = Database(pg_url)
    db.create()
    db.create()
    with db.connect() as conn:
        tables = {r["table_name"] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'").fetchall()}
        version = conn.execute("SELECT version_num FROM alembic_version").fetchone()["version_num"]
        columns = {r["column_name"] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'effects'").fetchall()}
    assert {"effects", "orders", "outbox", "alerts", "dead_letters", "reconciliations", "budgets", "holds",
            "decision_nonces", "effect_asks"} <= tables
    assert {"sent_at", "answered_at"} <= columns
    assert version == "0006"


def _claim_many(url: str, key: str, threads: int, go, results) -> None:
    import threading

    ledger = EffectLedger(Database(url))
    barrier = threading.Barrier(threads)

    def one(i: int) -> None:
        barrier.wait()
        now = time.time()
        claim = ledger.claim(Request(
            intent_key=key, task_id="task", tool="issue_refund", arguments={"n": 1}, amount_cents=100,
            owner=f"{multiprocessing.current_process().pid}-{i}", attempt=1, lease_until=now + 60, horizon=now + 90,
            holds=(Hold(f"item:{key}", 100, 100),)))
        results.put((isinstance(claim, Claimed), claim.effect.owner))

    go.wait(30)
    workers = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()


def test_exactly_one_intent_row_wins_across_processes(pg_url: str):
    Database(pg_url).create()
    key = f"v1:issue_refund:{uuid.uuid4().hex}"
    ctx = multiprocessing.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    processes = [ctx.Process(target=_claim_many, args=(pg_url, key, 8, go, results)) for _ in range(4)]
    for p in processes:
        p.start()
    go.set()
    claims = [results.get(timeout=60) for _ in range(32)]
    for p in processes:
        p.join(30)
    winners = [owner for fresh, owner in claims if fresh]
    assert len(winners) == 1
    assert {owner for _, owner in claims} == set(winners), "every loser saw the winner's row"
    with Database(pg_url).connect() as conn:
        assert conn.execute("SELECT count(*) AS n FROM effects").fetchone()["n"] == 1


def _verify_many(url: str, decision_json: str, approvers: str, threads: int, go, results) -> None:
    """verify_decision of one signed decision from `threads` activities of this process at once."""
    import dataclasses
    import threading

    from temporalio.testing import ActivityEnvironment

    from activities.authority import AuthorityActivities, Deployment, public_key_from
    from core.authority import Ceilings
    from core.models import ResolveInput, VerifyInput

    keys = Settings(approvers=approvers).approver_keys
    authority = AuthorityActivities(Database(url), Deployment({n: public_key_from(k) for n, k in keys.items()}, Ceilings(0), 60))
    request = VerifyInput(decision=ResolveInput.model_validate_json(decision_json))
    barrier = threading.Barrier(threads)

    def one(i: int) -> None:
        env = ActivityEnvironment()
        seen_by = f"{multiprocessing.current_process().pid}-{i}"
        env.info = dataclasses.replace(env.info, workflow_id="task", workflow_run_id=seen_by, activity_id="1")
        barrier.wait()
        verdict = asyncio.run(env.run(authority.verify_decision, request))
        results.put((verdict.valid, seen_by, verdict.why))

    go.wait(30)
    workers = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()


def test_a_signed_decision_verifies_once_across_processes(pg_url: str):
    """Its nonce is spent once in PostgreSQL, whichever worker verifies it first; the others are told."""
    from activities.authority import decision_nonces, sign
    from core.models import ResolveInput
    from tests.approvers import ALICE, ALICE_KEY, APPROVERS

    Database(pg_url).create()
    decision = sign(ResolveInput(task_id="task", intent_key="v1:issue_refund:abc", decision="approve",
                                 decided_by=ALICE), ALICE_KEY).model_dump_json()
    ctx = multiprocessing.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    processes = [ctx.Process(target=_verify_many, args=(pg_url, decision, APPROVERS, 4, go, results))
                 for _ in range(4)]
    for p in processes:
        p.start()
    go.set()
    verdicts = [results.get(timeout=60) for _ in range(16)]
    for p in processes:
        p.join(30)
    winners = [seen_by for valid, seen_by, _ in verdicts if valid]
    assert len(winners) == 1, verdicts
    assert all("this decision was used already" in why for valid, _, why in verdicts if not valid)
    [row] = decision_nonces(Database(pg_url), "task")
    assert row["first_seen_by"] == f"task/{winners[0]}/1"


async def test_scenarios_and_faults_end_to_end_on_postgres(client: Client, pg, edge: EdgeControl):
    settings, world = pg
    fast = settings.model_copy(update={"stripe_timeout_seconds": 1.0})
    async with running_worker(client, fast):
        await run(client, fast, scenario_task("INV-9"))
        await run(client, fast, scenario_task("refund-8841", repeat_effects=1))
        edge.configure("passthrough", preset("timeout-after-accept", "/v1/refunds", 1.0))
        result = await run(client, fast, scenario_task("SU-88421"))
    edge.configure("dedupe")
    assert len(world.payments("INV-9")) == 1
    assert len(world.refunds("ORD-8841")) == 1 and len(world.refunds("SU-88421")) == 1
    assert "verified by provider lookup" in result.checkpoint.steps["issue_refund"].trail[0]
    statuses = {e["status"] for e in world.effects()}
    assert statuses == {"performed"} and len(world.effects()) == 8


async def test_crash_after_accept_resumes_on_postgres(stack: Stack, client: Client, pg, worker_env, tmp_path: Path):
    settings, world = pg
    env = {**worker_env, "DATABASE_URL": settings.database}
    crashing = stack.start_worker(tmp_path / "crashing.log", {**env, "CRASH_AT": "issue_refund:after_provider",
                                                              "CRASH_MARKER": str(tmp_path / "crashed")})
    handle = await start(client, settings, scenario_task("refund-8841"))
    assert await asyncio.to_thread(crashing.process.wait, 60) == -signal.SIGKILL
    fresh = stack.start_worker(tmp_path / "fresh.log", env)
    try:
        result = await asyncio.wait_for(handle.result(), 90)
    finally:
        fresh.stop()
    assert [r["amount_cents"] for r in world.refunds("ORD-8841")] == [4500]
    assert result.checkpoint.steps["issue_refund"].outcome is Outcome.PERFORMED
