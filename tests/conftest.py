"""Fixtures: a real Temporal dev server and a real localstripe for the session; per test a
fresh task queue, a fresh database with its own paid orders, and unique task ids."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.db import Database
from activities.payments import StripeGateway
from activities.world import World
from devstack.edge_control import EdgeControl
from devstack.seed import seed_scenarios
from devstack.stack import STRIPE_API_KEY, Stack
from infra.settings import Settings
from tests.approvers import APPROVERS


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    with Stack.for_tests(tmp_path_factory.mktemp("stack")) as running:
        yield running


@pytest_asyncio.fixture(scope="session")
async def client(stack: Stack) -> Client:
    return await Client.connect(stack.address, data_converter=pydantic_data_converter)


@pytest.fixture
def settings(stack: Stack, tmp_path: Path) -> Settings:
    """Settings for one test: its own task queue and database, the session's servers."""
    return Settings(
        temporal_address=stack.address, task_queue=f"tq-{uuid.uuid4().hex[:12]}",
        stripe_api_base=stack.stripe_url, stripe_api_key=STRIPE_API_KEY,
        agent_db_path=tmp_path / "agent.db", stripe_timeout_seconds=5.0, approvers=APPROVERS,
        stripe_processing_window_seconds=1.0, effect_lease_seconds=2.0,
        # One more read a second later, not half a minute of them: many tests keep the provider unreadable.
        unreadable_reads_before_asking=2,
    )


@pytest.fixture
def edge(stack: Stack) -> EdgeControl:
    return EdgeControl(stack.stripe_url)


@pytest.fixture
def world(settings: Settings, edge: EdgeControl) -> World:
    """A fresh world: the edge forgets saved keys and rules, the orders are paid anew."""
    edge.configure("dedupe")
    db = Database(settings.agent_db_path)
    gateway = StripeGateway(settings.stripe_api_key.get_secret_value(), settings.stripe_api_base, 10.0)
    seed_scenarios(db, gateway)
    return World(db, gateway)


@pytest.fixture
def worker_env(settings: Settings) -> dict[str, str]:
    """Environment for a worker process serving this test's queue and database."""
    return {
        "TEMPORAL_ADDRESS": settings.temporal_address, "TASK_QUEUE": settings.task_queue,
        "STRIPE_API_BASE": settings.stripe_api_base, "STRIPE_API_KEY": STRIPE_API_KEY,
        "AGENT_DB_PATH": str(settings.agent_db_path), "APPROVERS": APPROVERS,
        "STRIPE_PROCESSING_WINDOW_SECONDS": str(settings.stripe_processing_window_seconds),
        "EFFECT_LEASE_SECONDS": str(settings.effect_lease_seconds),
        "UNREADABLE_READS_BEFORE_ASKING": str(settings.unreadable_reads_before_asking),
    }
