"""Where this process's Python CPU goes: py-spy samples it from outside while a block of work runs.

Sampling (100 a second, without stopping the process) keeps the work's timing as it is, so
workflow tasks do not time out under the profiler; only samples of a thread holding the GIL count,
so waiting (a select, an idle pool thread) is not mistaken for work. `areas` sums the samples whose innermost frame
lies in each library, standard-library module or module of ours (own time); `functions` lists the
costliest innermost frames; `ours` counts, for each function of this project, the samples it was
anywhere on the stack (inclusive time). Threads of the SDK's Rust core run no Python and are not
seen: their cost shows in the process's CPU figure, not here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

OURS = {"core", "workflows", "activities", "infra", "devstack", "worker.py", "starter.py"}


@dataclass
class Profile:
    samples: int = 0
    areas: Counter = field(default_factory=Counter)
    functions: Counter = field(default_factory=Counter)
    ours: Counter = field(default_factory=Counter)

    def add(self, stack: list[str], count: int) -> None:
        self.samples += count
        self.areas[area(stack[-1])] += count
        self.functions[stack[-1]] += count
        for frame in set(stack):
            if area(frame).startswith("ours") and not area(frame).startswith(("ours: devstack", "ours: infra/exit")):
                self.ours[frame] += count

    def table(self, top: int = 20) -> str:
        def rows(counter: Counter, n: int) -> list[str]:
            return [f"| `{name}` | {count / self.samples:.1%} |" for name, count in counter.most_common(n)]
        return "\n".join([
            f"{self.samples:,} samples of the worker and client's Python threads (py-spy, 100/s)", "",
            "| where the CPU is spent (innermost frame) | share |", "|---|---|", *rows(self.areas, 15), "",
            "| costliest functions (innermost frame) | share |", "|---|---|", *rows(self.functions, top), "",
            "| our functions, with what they call | share |", "|---|---|", *rows(self.ours, top)])


def area(frame: str) -> str:
    """`asyncio.run (asyncio/runners.py:190)` -> `asyncio`; frames of this project -> `ours: <module>`."""
    where = frame.rsplit(" (", 1)[-1].rstrip(")").rsplit(":", 1)[0]
    top = where.split("/", 1)[0]
    if top in OURS:
        return f"ours: {where}"
    return top.removesuffix(".py") or frame


@contextmanager
def sampled(profile: Profile, keep: Path | None = None) -> Iterator[None]:
    """Samples this process while the block runs (the raw stacks copied to `keep`, for a flame graph);
    fails loudly if py-spy cannot attach."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("py-spy is not installed (it is in the dev extra: pip install -e '.[dev]')")
    with tempfile.TemporaryDirectory(prefix="profile-") as tmp:
        raw = Path(tmp) / "stacks.txt"
        process = subprocess.Popen([spy, "record", "--pid", str(os.getpid()), "--rate", "100", "--format", "raw",
                                    "--nonblocking", "--gil", "--output", str(raw)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            yield
        finally:
            process.send_signal(signal.SIGINT)  # py-spy writes what it sampled and exits
            _, err = process.communicate(timeout=60)
        if not raw.exists():
            raise RuntimeError(f"py-spy wrote no samples: {err.strip()[-500:]}")
        if keep is not None:
            shutil.copyfile(raw, keep)
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                profile.add(stack.split(";"), int(count))
