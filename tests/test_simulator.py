"""The effect protocol under a deterministic simulation (devstack/sim): the product's Effects and
EffectLedger on a real SQLite file, a seeded scheduler interleaving workers' attempts, crashes,
pauses, a provider that holds, loses and refuses requests, and people answering at any moment.

The correct protocol keeps every invariant over a bounded number of seeds; each deliberately broken
variant (injected in the simulator, never switched in the product) is caught within its budget, and
its failing seed replays exactly."""

from __future__ import annotations

import pytest

from devstack.sim.run import explore, simulate
from devstack.sim.world import VARIANTS

CORRECT_SEEDS = 300
BROKEN_BUDGET = 300  # seeds within which a broken variant must be caught


def test_the_protocol_keeps_every_invariant_over_its_seeds() -> None:
    found = explore("correct", range(CORRECT_SEEDS))
    print(f"correct: {found.seeds} seeds, {found.steps} steps in {found.seconds:.1f} s")
    shortest = found.shortest
    assert shortest is None, f"seed {shortest.seed} ({shortest.steps} steps): {shortest.failure}\n" + \
        "\n".join(shortest.trace)


@pytest.mark.parametrize("variant", [name for name in VARIANTS if name != "correct"])
def test_a_broken_protocol_is_caught_within_the_budget(variant: str) -> None:
    found = explore(variant, range(BROKEN_BUDGET), stop_after=2)
    shortest = found.shortest
    assert shortest is not None, f"{variant} ({VARIANTS[variant].what}) not caught in {found.seeds} seeds"
    print(f"\n{variant}: caught after {found.seeds} seeds ({found.steps} steps); shortest: seed {shortest.seed}, "
          f"{shortest.steps} steps: {shortest.failure}\n" + "\n".join(shortest.trace))
    assert any(word in shortest.failure for word in ("paid twice", "over-refunded", "could still land")), \
        shortest.failure
    again = simulate(shortest.seed, variant)  # a failing seed replays exactly
    assert (again.failure, again.trace) == (shortest.failure, shortest.trace)
