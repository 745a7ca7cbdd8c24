"""Bytecode for the workflow modules, written once when a worker starts.

The workflow sandbox imports a workflow's modules afresh for every workflow run. Without their
bytecode on disk (PYTHONDONTWRITEBYTECODE is set, or the checkout was never compiled) each of those
imports compiles the source again: measured at about a sixth of a busy worker's Python CPU.
"""

from __future__ import annotations

import importlib.util
import logging
import py_compile
import sys
from pathlib import Path

log = logging.getLogger("agent.worker")


def ensure_bytecode(*workflow_classes: type) -> None:
    """Compile every module of each workflow class's top-level package whose bytecode is missing or
    stale. A read-only installation is left as it is, with one warning: compile it when it is built
    (`python -m compileall`; pip does so for a regular install)."""
    packages = {sys.modules[cls.__module__].__name__.split(".")[0] for cls in workflow_classes}
    for package in sorted(packages):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            for source in sorted(Path(folder).rglob("*.py")):
                _compile(source)


def _compile(source: Path) -> None:
    cached = Path(importlib.util.cache_from_source(str(source)))
    if cached.exists() and cached.stat().st_mtime >= source.stat().st_mtime:
        return
    try:
        py_compile.compile(str(source), cfile=str(cached), doraise=True)
    except OSError as err:
        log.warning("cannot write the bytecode of %s (%s): every workflow run compiles it again; "
                    "run `python -m compileall` where it is installed", source, err)
