"""What a load run and a week are read against, printed under their reports as met or not.

Speed and CPU are ratios against bare Temporal in the same run, whose rounds alternate with the
harness's and rotate which side goes first: the machine's speed moves within a run too (bare's own
rounds ran at 13.5 to 15.8 tasks/s in one), so a ratio near its bound can fall either side of it from
run to run. A target missed is reported, not a failure: a run
fails (exits 1) only on what it finds dishonest, an attempt timed out while alive, a task handed to a
person for nothing, money paid twice or a ticket lost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# `make load`: the harness beside bare Temporal, 300 tickets at once.
LOAD_THROUGHPUT_MIN = 0.95  # harness tasks/s over bare's
LOAD_WORKER_CPU_MAX = 1.3  # worker + client CPU a task, harness over bare
LOAD_P50_MAX = 1.2  # one task end to end, harness's p50 over bare's
# `make week`: 4,200 tickets, the harness's wall time over bare Temporal's as many tasks.
WEEK_TIME_MAX = 1.1


@dataclass(frozen=True)
class Target:
    what: str
    bound: str
    figure: str
    met: bool


def rows(targets: Iterable[Target]) -> list[str]:
    """The targets as a Markdown table, one row each."""
    return ["| target | bound | this run | |", "|---|---|---|---|",
            *(f"| {t.what} | {t.bound} | {t.figure} | {'met' if t.met else 'NOT met'} |" for t in targets)]


def at_most(what: str, ratio: float, bound: float) -> Target:
    """A ratio that must not exceed `bound` (NaN, a side that never finished, does not meet it)."""
    return Target(what, f"<= {bound:.2f}x", "-" if math.isnan(ratio) else f"{ratio:.2f}x",
                  not math.isnan(ratio) and ratio <= bound)


def at_least(what: str, share: float, bound: float) -> Target:
    return Target(what, f">= {bound:.0%}", "-" if math.isnan(share) else f"{share:.0%}",
                  not math.isnan(share) and share >= bound)


def none(what: str, counts: Mapping[str, int]) -> Target:
    """A count that must be 0 on every side (`counts`: side -> count)."""
    return Target(what, "0", " / ".join(f"{side} {n}" for side, n in counts.items()), not any(counts.values()))


def load_targets(tasks_per_s: Mapping[str, float], worker_cpu: Mapping[str, float], p50: Mapping[str, float],
                 live_timed_out: Mapping[str, int], escalations: Mapping[str, int]) -> list[Target]:
    """`make load`'s targets from each side's figures: the ratios set the harness beside bare Temporal, the
    counts are every side's."""
    return [at_least("throughput, harness / bare", tasks_per_s["harness"] / tasks_per_s["bare"], LOAD_THROUGHPUT_MIN),
            at_most("worker + client CPU a task, harness / bare", worker_cpu["harness"] / worker_cpu["bare"],
                    LOAD_WORKER_CPU_MAX),
            at_most("one task end to end p50, harness / bare", p50["harness"] / p50["bare"], LOAD_P50_MAX),
            none("live attempts timed out", live_timed_out),
            none("escalations to a person (no fault is injected)", escalations)]


def week_targets(seconds: float, bare_seconds: float | None, live_timed_out: Mapping[str, int],
                 unexpected_escalations: int, paid_twice: Mapping[str, int], lost: int) -> list[Target]:
    """`make week`'s targets; the wall-time one only when bare Temporal's week ran beside it. `paid_twice`:
    items refunded above their price, orders beyond what was paid, intent keys refunded more than once."""
    timed = [] if bare_seconds is None else [
        at_most("wall time, harness / bare", seconds / bare_seconds if bare_seconds else math.nan, WEEK_TIME_MAX)]
    return [*timed,
            none("live attempts timed out", live_timed_out),
            none("escalations other than the tickets that may escalate (over the ceiling, a second ticket)",
                 {"harness": unexpected_escalations}),
            none("paid twice", paid_twice),
            none("tickets lost", {"harness": lost})]
