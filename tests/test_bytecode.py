"""A worker leaves the workflow modules' bytecode on disk, so the sandbox's per-run imports load it
instead of compiling the source (this machine, like many images, sets PYTHONDONTWRITEBYTECODE)."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import py_compile
import sys
from pathlib import Path

import pytest
from temporalio.client import Client

import workflows.agent_task
from infra.bytecode import ensure_bytecode, fresh, load_code_once
from infra.settings import Settings
from worker import build_worker


def _cached(source: str | Path) -> Path:
    return Path(importlib.util.cache_from_source(str(source)))


def _import_without_bytecode(name: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.syspath_prepend(str(path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    return module


async def test_build_worker_writes_the_agent_workflows_bytecode(client: Client, settings: Settings) -> None:
    source = Path(workflows.agent_task.__file__)
    _cached(source).unlink(missing_ok=True)
    build_worker(client, settings)
    assert fresh(source, _cached(source))


def test_a_package_and_a_lone_module_are_both_compiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "shop_flows" / "deep").mkdir(parents=True)
    (tmp_path / "shop_flows" / "__init__.py").write_text("")
    (tmp_path / "shop_flows" / "flow.py").write_text("class Flow:\n    pass\n")
    (tmp_path / "shop_flows" / "deep" / "helper.py").write_text("X = 1\n")
    (tmp_path / "lone_flow.py").write_text("class Lone:\n    pass\n")
    flow = _import_without_bytecode("shop_flows.flow", tmp_path, monkeypatch)
    lone = _import_without_bytecode("lone_flow", tmp_path, monkeypatch)
    sources = [tmp_path / "shop_flows" / "flow.py", tmp_path / "shop_flows" / "deep" / "helper.py",
               tmp_path / "lone_flow.py"]
    assert not any(_cached(s).exists() for s in sources)

    ensure_bytecode(flow.Flow, lone.Lone)  # type: ignore[attr-defined]
    assert all(fresh(s, _cached(s)) for s in sources)

    sources[2].write_text("class Lone:\n    changed = True\n")  # stale now: a different size
    assert not fresh(sources[2], _cached(sources[2]))
    ensure_bytecode(lone.Lone)  # type: ignore[attr-defined]
    assert fresh(sources[2], _cached(sources[2]))


def test_unwritable_bytecode_is_one_warning_per_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    package = tmp_path / "stuck_flows"
    package.mkdir()
    for name in ("__init__", "one", "two"):
        (package / f"{name}.py").write_text("class Flow:\n    pass\n")
    (package / "__pycache__").write_text("a file where the bytecode folder would be")
    one = _import_without_bytecode("stuck_flows.one", tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="agent.worker"):
        ensure_bytecode(one.Flow)  # type: ignore[attr-defined]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "3 module(s) of stuck_flows" in warnings[0].getMessage()


def test_hash_based_bytecode_counts_as_the_import_system_counts_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`compileall` writes hash-based .pyc files under SOURCE_DATE_EPOCH (reproducible builds): a checked
    one is fresh while its source hash matches, an unchecked one always is; a fresh one is left alone."""
    source = tmp_path / "hashed_flow.py"
    source.write_text("class Flow:\n    pass\n")
    flow = _import_without_bytecode("hashed_flow", tmp_path, monkeypatch)
    for mode, after_edit in ((py_compile.PycInvalidationMode.CHECKED_HASH, False),
                             (py_compile.PycInvalidationMode.UNCHECKED_HASH, True)):
        source.write_text("class Flow:\n    pass\n")
        py_compile.compile(str(source), cfile=str(_cached(source)), doraise=True, invalidation_mode=mode)
        written = _cached(source).read_bytes()
        assert fresh(source, _cached(source))
        ensure_bytecode(flow.Flow)  # type: ignore[attr-defined]
        assert _cached(source).read_bytes() == written
        source.write_text("class Flow:\n    edited = 1\n")
        assert fresh(source, _cached(source)) is after_edit


def test_code_loaded_once_still_runs_each_import_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox re-imports a workflow's modules for every run: each import still executes the module in
    a namespace of its own (state never leaks from one run to the next), from a code object read once."""
    (tmp_path / "once_flows").mkdir()
    (tmp_path / "once_flows" / "__init__.py").write_text("")
    (tmp_path / "once_flows" / "flow.py").write_text("RUNS = []\nRUNS.append(1)\n\ndef step():\n    return len(RUNS)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = load_code_once(type("Flow", (), {"__module__": "once_flows.flow"}))
    try:
        first = importlib.import_module("once_flows.flow")
        first.RUNS.append(2)  # a run that changes its module's state
        for name in ("once_flows.flow", "once_flows"):
            del sys.modules[name]
        (tmp_path / "once_flows" / "flow.py").write_text("raise RuntimeError('read again')\n")
        second = importlib.import_module("once_flows.flow")
    finally:
        finder.tops.discard("once_flows")
        for name in ("once_flows.flow", "once_flows"):
            sys.modules.pop(name, None)
    assert second is not first and second.RUNS == [1] and second.step() == 1  # executed afresh
    assert second.step.__code__ is first.step.__code__  # from the same code, not read again
    assert isinstance(second.__spec__.loader, importlib.machinery.SourceFileLoader)
