"""Bytecode for the workflow modules, written once when a worker starts.

The workflow sandbox imports a workflow's modules afresh for every workflow run. Without their
bytecode on disk (PYTHONDONTWRITEBYTECODE is set, or the checkout was never compiled) each of those
imports compiles the source again: measured at about a sixth of a busy worker's Python CPU.
"""

from __future__ import annotations

import _imp
import importlib.util
import logging
import py_compile
from pathlib import Path

log = logging.getLogger("agent.worker")


def ensure_bytecode(*workflow_classes: type) -> None:
    """Compile, where it is missing or stale, the bytecode of every module of each workflow class's
    top-level package (or of its module, when that is not in a package). Where it cannot be written
    (a read-only installation), one warning per package: compile it when it is built
    (`python -m compileall`; pip does so for a regular install)."""
    for top in sorted({cls.__module__.split(".")[0] for cls in workflow_classes}):
        failed = [source for source in _sources(top) if not _compiled(source)]
        if failed:
            log.warning("cannot write the bytecode of %d module(s) of %s (first: %s): every workflow run "
                        "compiles them again; run `python -m compileall` where it is installed",
                        len(failed), top, failed[0])


def _sources(top: str) -> list[Path]:
    spec = importlib.util.find_spec(top)
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return sorted(source for folder in spec.submodule_search_locations for source in Path(folder).rglob("*.py"))
    return [Path(spec.origin)] if spec.origin and spec.origin.endswith(".py") else []


def _compiled(source: Path) -> bool:
    """True when the source's bytecode is (now) what the import system would load."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    if fresh(source, cached):
        return True
    try:
        py_compile.compile(str(source), cfile=str(cached), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    except (OSError, py_compile.PyCompileError) as err:
        log.debug("bytecode of %s not written: %s", source, err)
        return False
    return True


def fresh(source: Path, cached: Path) -> bool:
    """The check the import system makes before it loads a .pyc instead of compiling the source: the
    magic number, then the source's mtime and size (timestamp .pyc), or its hash (a hash-based .pyc,
    as `compileall` writes under SOURCE_DATE_EPOCH, checked unless it says not to)."""
    try:
        with cached.open("rb") as f:
            head = f.read(16)
        stat = source.stat()
    except OSError:
        return False
    if len(head) != 16 or head[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = int.from_bytes(head[4:8], "little")
    if flags & ~0b11:
        return False
    if flags & 0b1:  # hash-based
        checked = _imp.check_hash_based_pycs != "never" and (flags & 0b10 or _imp.check_hash_based_pycs == "always")
        return not checked or head[8:16] == importlib.util.source_hash(source.read_bytes())
    mtime, size = (int.from_bytes(head[at:at + 4], "little") for at in (8, 12))
    return mtime == int(stat.st_mtime) & 0xFFFFFFFF and size == stat.st_size & 0xFFFFFFFF
