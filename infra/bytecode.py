"""Bytecode for the workflow modules: written once when a worker starts, and loaded once per process.

The workflow sandbox imports a workflow's modules afresh for every workflow run. Without their
bytecode on disk (PYTHONDONTWRITEBYTECODE is set, or the checkout was never compiled) each of those
imports compiles the source again: measured at about a sixth of a busy worker's Python CPU. With it,
each import still finds the file, reads it and unmarshals it: 7% of a busy worker's Python CPU in
`make load`. `load_code_once` serves those imports the code object loaded the first time. Each run
still executes the module afresh, in a namespace of its own (what the sandbox's re-import is for);
only the reading is shared. A worker also keeps one version of its workflow code from its start
whatever happens to the files, as it does for every module it imported normally.
"""

from __future__ import annotations

import _imp
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import py_compile
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import CodeType

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


class _LoadedOnce(importlib.machinery.SourceFileLoader):
    """A source file's loader whose code object is read from disk once per process."""

    def __init__(self, fullname: str, path: str, codes: dict[str, CodeType]) -> None:
        super().__init__(fullname, path)
        self._codes = codes

    def get_code(self, fullname: str) -> CodeType | None:
        code = self._codes.get(self.path)
        if code is None:
            code = super().get_code(fullname)
            if code is not None:
                self._codes[self.path] = code
        return code


class CodeOnce(importlib.abc.MetaPathFinder):
    """Finds the modules of some top-level packages as the path finder does, once, and loads them with
    `_LoadedOnce`; every other module is left to the finders after it."""

    def __init__(self, tops: set[str]) -> None:
        self.tops = tops
        self._found: dict[str, tuple[str, list[str] | None]] = {}
        self._codes: dict[str, CodeType] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: object = None) -> ModuleSpec | None:
        if fullname.partition(".")[0] not in self.tops:
            return None
        found = self._found.get(fullname)
        if found is None:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.origin is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
                return None  # a namespace package, an extension module: not ours to serve
            found = self._found[fullname] = (spec.origin, spec.submodule_search_locations)
        origin, locations = found
        loader = _LoadedOnce(fullname, origin, self._codes)
        if locations is None:
            return importlib.util.spec_from_file_location(fullname, origin, loader=loader)
        return importlib.util.spec_from_file_location(fullname, origin, loader=loader,
                                                      submodule_search_locations=list(locations))


def load_code_once(*workflow_classes: type) -> CodeOnce:
    """Serve the modules of each workflow class's top-level package from code loaded once per process
    (installed first on sys.meta_path, once)."""
    finder = next((f for f in sys.meta_path if isinstance(f, CodeOnce)), None)
    if finder is None:
        finder = CodeOnce(set())
        sys.meta_path.insert(0, finder)
    finder.tops.update(cls.__module__.split(".")[0] for cls in workflow_classes)
    return finder
