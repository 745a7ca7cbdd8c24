"""docker-compose.yml is accepted by `docker-compose config` and describes the whole system.

These machines have no Docker engine, so the compose file is checked, not run."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from core.names import SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parent.parent


def compose(*args: str) -> str:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed (make test installs Debian's docker-compose package)"
    done = subprocess.run([binary, "-f", str(ROOT / "docker-compose.yml"), *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_compose_config_accepts_the_file_and_lists_the_system():
    services = set(compose("config", "--services").split())
    assert services == {"postgresql", "temporal", "temporal-search-attributes", "temporal-ui", "localstripe",
                        "worker", "starter"}


def test_compose_registers_our_search_attributes_and_points_the_worker_at_the_cluster():
    config = compose("config")
    for name in SEARCH_ATTRIBUTES:
        assert name in config
    assert re.search(r"TEMPORAL_ADDRESS: temporal:7233", config)
    assert re.search(r"DB: postgres12", config)
    assert "STRIPE_API_KEY" in config and "sk_live" not in config


def test_the_image_holds_every_module_the_product_runs():
    """Every package of the application (all but the tests and the local stack) and its two entry points."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "devstack"}
    assert {"core", "workflows", "activities", "infra", "client", "cli"} <= packages
    for package in packages:
        assert re.search(rf"COPY {package} ", dockerfile), package
    for module in ("worker.py", "starter.py"):
        assert module in dockerfile, module
