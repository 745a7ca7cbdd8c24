"""docker-compose.yml and the Dockerfile describe a deployment that starts whole.

These machines have no Docker engine, so what can be checked without one is: `docker-compose config`
accepts the file (with an env file filled in as agent.env.example says); every service built from the
Dockerfile runs a command that resolves in its image stage (the module is in what the stage copies,
and every package its code imports, transitively, is installed there per pyproject.toml); every
variable the worker requires is set and valid for it; the ledger is PostgreSQL and migrated before
the worker starts; Temporal runs on current upstream images (not the deprecated auto-setup) with our
search attributes; the local Stripe stand-in is in the development profile only.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from activities.authority import new_key_file, public_key_text
from core.names import SEARCH_ATTRIBUTES
from devstack.processes import SERVER_PRAGMAS
from infra.codec import new_key
from infra.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
FIRST_PARTY = {p.parent.name for p in ROOT.glob("*/__init__.py")} | {p.stem for p in ROOT.glob("*.py")}
# What the worker cannot run without in a deployment: where Temporal and the ledger are, the provider,
# who may decide, and the key every payload is encrypted with.
WORKER_REQUIRES = ("TEMPORAL_ADDRESS", "DATABASE_URL", "STRIPE_API_BASE", "STRIPE_API_KEY", "APPROVERS",
                   "PAYLOAD_ENCRYPTION_KEY")


@pytest.fixture(scope="module")
def env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """agent.env.example, filled in as its comments say."""
    folder = tmp_path_factory.mktemp("compose")
    key = folder / "ops.pem"
    new_key_file(key)
    from activities.authority import load_key_file
    values = {"APPROVERS": f"ops@example.com={public_key_text(load_key_file(key))}",
              "PAYLOAD_ENCRYPTION_KEY": new_key()}
    lines = [f"{line}{values[line[:-1]]}" if line.endswith("=") and line[:-1] in values else line
             for line in (ROOT / "agent.env.example").read_text().splitlines()]
    path = folder / "agent.env"
    path.write_text("\n".join(lines) + "\n")
    return path


def compose(env_file: Path, *args: str) -> str:
    binary = shutil.which("docker-compose") or "/usr/bin/docker-compose"
    assert Path(binary).exists(), "docker-compose is not installed (make test installs Debian's docker-compose)"
    env = {k: v for k, v in os.environ.items() if k not in ("STRIPE_API_BASE", "STRIPE_API_KEY", "LEDGER_DB_PASSWORD")}
    done = subprocess.run([binary, "-f", str(ROOT / "docker-compose.yml"), "--profile", "dev", "--profile", "tools",
                           *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**env, "AGENT_ENV_FILE": str(env_file)})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def config(env_file: Path) -> dict[str, Any]:
    return yaml.safe_load(compose(env_file, "config"))


def test_the_whole_system_and_nothing_deprecated(config: dict[str, Any]):
    services = config["services"]
    assert set(services) == {"postgresql", "temporal-schema", "temporal", "temporal-setup", "temporal-ui",
                             "ledger-db", "ledger-migrate", "worker", "codec", "localstripe", "starter"}
    images = {name: s["image"] for name, s in services.items() if "image" in s}
    assert not any("auto-setup" in image for image in images.values()), images
    temporal = {image.split(":")[0]: image.split(":")[1] for image in images.values() if image.startswith("temporalio/")}
    assert set(temporal) == {"temporalio/server", "temporalio/admin-tools", "temporalio/ui"}
    assert temporal["temporalio/server"] == temporal["temporalio/admin-tools"], temporal
    # The same Temporal as the tests run against: the dev server bundled with the project's CLI.
    version = subprocess.run([str(ROOT / ".venv/bin/temporal"), "--version"], capture_output=True, text=True).stdout
    assert f"Server {temporal['temporalio/server']}," in version, version
    assert f"UI {temporal['temporalio/ui']})" in version, version
    # PostgreSQL for Temporal, the schema set up before the server, the namespace and our search
    # attributes registered before the worker.
    assert services["temporal"]["environment"]["DB"] == "postgres12"
    assert services["temporal"]["depends_on"]["temporal-schema"]["condition"] == "service_completed_successfully"
    setup = " ".join(services["temporal-setup"]["command"])
    for name, kind in SEARCH_ATTRIBUTES.items():
        assert f"{name}:{kind}" in setup, name
    dynamic = services["temporal"]["environment"]["DYNAMIC_CONFIG_FILE_PATH"]
    [mount] = [v for v in services["temporal"]["volumes"] if "dynamicconfig" in str(v)]
    folder = Path(mount.split(":")[0] if isinstance(mount, str) else mount["source"])
    flags = yaml.safe_load((folder / Path(dynamic).name).read_text())
    assert flags["activity.enableStandalone"] == [{"value": True}], "starter.py start's facts check needs it"
    # The history queues' read rates and timer look-ahead the dev stack runs with (retries on time under load).
    for key, value in SERVER_PRAGMAS.items():
        assert flags.get(key) == [{"value": json.loads(value)}], key


def test_the_ledger_is_postgresql_and_migrated_before_the_worker(config: dict[str, Any]):
    services = config["services"]
    worker = services["worker"]["environment"]
    url = urlsplit(worker["DATABASE_URL"])
    assert url.scheme == "postgresql+psycopg" and url.hostname == "ledger-db", url
    ledger = services["ledger-db"]["environment"]
    assert (url.username, url.password, url.path) == (ledger["POSTGRES_USER"], ledger["POSTGRES_PASSWORD"],
                                                      f"/{ledger['POSTGRES_DB']}")
    migrate = services["ledger-migrate"]
    assert migrate["command"] == ["python", "-m", "migrations"]
    assert migrate["environment"]["DATABASE_URL"] == worker["DATABASE_URL"]
    assert services["worker"]["depends_on"]["ledger-migrate"]["condition"] == "service_completed_successfully"
    assert services["worker"]["depends_on"]["temporal-setup"]["condition"] == "service_completed_successfully"


def test_every_variable_the_worker_requires_is_set_and_valid(config: dict[str, Any]):
    services = config["services"]
    env = services["worker"]["environment"]
    missing = [name for name in WORKER_REQUIRES if not str(env.get(name) or "").strip()]
    assert not missing, f"the worker's environment lacks {missing}"
    settings = Settings(**{k.lower(): v for k, v in env.items() if k.lower() in Settings.model_fields})
    assert settings.approver_keys and settings.payload_encryption_key is not None
    for name in ("TEMPORAL_ADDRESS",):
        assert env[name].split(":")[0] in services, env[name]
    assert urlsplit(env["STRIPE_API_BASE"]).hostname in services  # localstripe, in the dev profile
    # The codec server decrypts what the worker and the starter encrypt, and the Web UI uses it.
    for other in ("codec", "starter"):
        assert services[other]["environment"]["PAYLOAD_ENCRYPTION_KEY"] == env["PAYLOAD_ENCRYPTION_KEY"]
    codec_port = urlsplit(services["temporal-ui"]["environment"]["TEMPORAL_CODEC_ENDPOINT"]).port
    assert any(str(p.get("published") if isinstance(p, dict) else p).split(":")[-2:][0] == str(codec_port)
               or f":{codec_port}:" in str(p) for p in services["codec"]["ports"]), services["codec"]["ports"]


def test_the_local_stripe_stand_in_is_in_the_development_profile_only(config: dict[str, Any]):
    services = config["services"]
    assert services["localstripe"]["profiles"] == ["dev"]
    assert services["localstripe"]["build"]["target"] == "dev"
    for name, spec in services.items():
        if name != "localstripe":
            assert "localstripe" not in spec.get("depends_on", {}), f"{name} would not start without the dev profile"
            assert spec.get("build", {}).get("target", "product") == "product", name


# --- the images, from the Dockerfile ---------------------------------------------------------------


def dockerfile_stages() -> dict[str, dict[str, Any]]:
    """Each stage's copied paths (inherited from its base stage) and the distributions pip installs in it."""
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if m := re.match(r"FROM (\S+) AS (\S+)", line):
            base = stages.get(m.group(1), {"copies": set(), "installs": set()})
            current = stages[m.group(2)] = {"copies": set(base["copies"]), "installs": set(base["installs"])}
        elif m := re.match(r"COPY (.+) \S+$", line):
            current["copies"] |= set(m.group(1).split())
        elif m := re.match(r"RUN pip install --no-cache-dir (.+)$", line):
            for spec in m.group(1).split():
                spec = spec.strip("'\"")
                if spec == ".":
                    current["installs"] |= set(project()["dependencies"])
                else:
                    current["installs"].add(spec)
    return stages


@cache
def project() -> dict[str, Any]:
    import tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def installed_closure(specs: set[str]) -> set[str]:
    """The distributions pip installs for these requirements: them and what they require, as resolved here."""
    seen: set[str] = set()
    todo = [Requirement(s) for s in specs]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        for extra in req.extras or {""}:
            for sub in metadata.requires(req.name) or []:
                r = Requirement(sub)
                if r.marker is None or r.marker.evaluate({"extra": extra}):
                    todo.append(r)
    return seen


def imports_of(module_file: Path, seen: set[Path] | None = None) -> tuple[set[str], set[Path]]:
    """Third-party top-level imports of a module and of every first-party module it imports, transitively."""
    seen = set() if seen is None else seen
    third: set[str] = set()
    if module_file in seen:
        return third, seen
    seen.add(module_file)
    for node in ast.walk(ast.parse(module_file.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:  # `from infra import codec` too
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            names = []
        for name in names:
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                for target in first_party_files(name):
                    more, _ = imports_of(target, seen)
                    third |= more
            elif top not in sys.stdlib_module_names and top != "__future__":
                third.add(top)
    return third, seen


def first_party_files(dotted: str) -> list[Path]:
    parts = dotted.split(".")
    found = []
    for n in range(1, len(parts) + 1):
        base = ROOT.joinpath(*parts[:n])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.exists():
                found.append(candidate)
    return found


def command_module(command: list[str]) -> Path:
    assert command[0] == "python", command
    if command[1] == "-m":
        module = ROOT.joinpath(*command[2].split("."))
        path = module / "__main__.py" if module.is_dir() else module.with_suffix(".py")
    else:
        path = ROOT / command[1]
    assert path.exists(), f"{command}: no {path.relative_to(ROOT)}"
    return path


@pytest.mark.parametrize("service", ["worker", "codec", "ledger-migrate", "localstripe", "starter"])
def test_every_command_resolves_in_its_image(service: str, config: dict[str, Any]):
    spec = config["services"][service]
    build = spec["build"]
    assert Path(build["context"]).resolve() == ROOT and build.get("dockerfile", "Dockerfile") == "Dockerfile"
    stages = dockerfile_stages()
    stage = stages[build["target"]] if "target" in build else stages[list(stages)[-1]]  # docker builds the last
    command = spec.get("entrypoint") or spec["command"]
    main = command_module(command)
    third, files = imports_of(main)
    for path in files:
        top = path.relative_to(ROOT).parts[0]
        assert top in stage["copies"], f"{service}: {path.relative_to(ROOT)} is not copied into the image"
    provided = metadata.packages_distributions()
    installed = installed_closure(stage["installs"])
    for name in sorted(third):
        dists = {canonicalize_name(d) for d in provided.get(name, [])}
        assert dists & installed, f"{service}: `import {name}` ({sorted(dists) or 'not installed here'}) " \
                                  f"is not installed in the image (pyproject.toml, Dockerfile)"


def test_the_images_stay_lean():
    """The product's stage installs pyproject's dependencies only; the dev stage adds exactly the
    localstripe the `dev` extra names, and the devstack/ code that serves it."""
    stages = dockerfile_stages()
    assert stages["product"]["installs"] == set(project()["dependencies"])
    assert "devstack" not in stages["product"]["copies"] and "tests" not in stages["product"]["copies"]
    extra = stages["dev"]["installs"] - stages["product"]["installs"]
    dev = {Requirement(r).name: r for r in project()["optional-dependencies"]["dev"]}
    assert extra == {dev["localstripe"]}, extra
    assert "devstack" in stages["dev"]["copies"]


def test_migrations_bring_an_empty_ledger_to_the_newest_schema(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run([sys.executable, "-m", "migrations"], cwd=ROOT, capture_output=True, text=True,
                          env={**env, "AGENT_DB_PATH": str(tmp_path / "agent.db")}, timeout=60)
    assert done.returncode == 0, done.stderr
    from activities.db import Database
    with Database(tmp_path / "agent.db").connect() as conn:
        tables = {r["name"] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
    assert {"effects", "orders", "alembic_version"} <= tables, tables
