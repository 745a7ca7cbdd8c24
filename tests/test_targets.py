"""The targets under `make load`'s and `make week`'s reports: each judged from the run's own figures."""

from __future__ import annotations

import math

from devstack.targets import Target, load_targets, rows, week_targets


def verdicts(targets: list[Target]) -> dict[str, bool]:
    return {t.what: t.met for t in targets}


def test_a_load_run_meets_its_targets_at_the_bounds_and_not_past_them():
    at_bounds = load_targets({"harness": 19.0, "bare": 20.0}, {"harness": 13.0, "bare": 10.0},
                             {"harness": 0.12, "bare": 0.1}, {"harness": 0, "bare": 0}, {"harness": 0, "bare": 0})
    assert all(verdicts(at_bounds).values()), at_bounds
    past = load_targets({"harness": 18.9, "bare": 20.0}, {"harness": 13.1, "bare": 10.0},
                        {"harness": 0.121, "bare": 0.1}, {"harness": 0, "bare": 1}, {"harness": 2, "bare": 0})
    assert not any(verdicts(past).values()), past
    table = "\n".join(rows(past))
    assert "| throughput, harness / bare | >= 95% | 94% | NOT met |" in table
    assert "| live attempts timed out | 0 | harness 0 / bare 1 | NOT met |" in table


def test_a_week_whose_bare_side_never_finished_does_not_meet_its_time():
    nothing_wrong = {"items": 0, "orders": 0, "intent keys": 0}
    unfinished = week_targets(300.0, math.nan, {"harness": 0, "bare": 0}, 0, nothing_wrong, 0)
    assert verdicts(unfinished)["wall time, harness / bare"] is False
    assert unfinished[0].figure == "-"
    alone = week_targets(300.0, None, {"harness": 0}, 0, nothing_wrong, 0)  # --no-bare: no time to judge
    assert "wall time, harness / bare" not in verdicts(alone) and all(verdicts(alone).values())
    paid_twice = week_targets(300.0, 280.0, {"harness": 0, "bare": 0}, 0, {**nothing_wrong, "intent keys": 1}, 0)
    assert verdicts(paid_twice) == {"wall time, harness / bare": True, "live attempts timed out": True,
                                    "escalations other than the tickets that may escalate (over the ceiling, "
                                    "a second ticket)": True, "paid twice": False, "tickets lost": True}
