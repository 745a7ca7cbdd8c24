"""python -m devstack.sim [--variant V] [--profile P] [--seeds N] [--seed S --trace]"""

from __future__ import annotations

import argparse
import sys

from devstack.sim.run import explore, simulate
from devstack.sim.world import PROFILES, VARIANTS


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.sim", description=__doc__)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default=None,
                        help="one variant (default: every one)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="where the chaos lies: default, stale-asks (attempts paused across asks), "
                             "late-provider (held requests landing after their promised horizon); "
                             "default: the variant's own")
    parser.add_argument("--seeds", type=int, default=300, help="seeds per variant (from 0)")
    parser.add_argument("--steps", type=int, default=200, help="chaos steps per run before it drains")
    parser.add_argument("--seed", type=int, default=None, help="replay one seed")
    parser.add_argument("--trace", action="store_true", help="print the run's trace (with --seed)")
    args = parser.parse_args()
    if args.seed is not None:
        result = simulate(args.seed, args.variant or "correct", args.steps,
                          profile=args.profile or VARIANTS[args.variant or "correct"].profile)
        if args.trace or not result.ok:
            print("\n".join(result.trace))
        keys = "honours" if result.honours_keys else "ignores"
        print(f"seed {result.seed} ({result.variant}, {result.profile}, provider {keys} "
              f"keys): {result.steps} steps, {result.failure or 'every invariant held'}")
        return 0 if result.ok else 1
    worst = 0
    for name in [args.variant] if args.variant else list(VARIANTS):
        found = explore(name, range(args.seeds), args.steps, profile=args.profile or VARIANTS[name].profile)
        rate = found.steps / found.seconds if found.seconds else 0.0
        print(f"{name:24} {found.seeds} seeds, {found.steps} steps in {found.seconds:.1f} s ({rate:,.0f} steps/s): "
              f"{len(found.failures)} failing")
        shortest = found.shortest
        if shortest is not None:
            print(f"  shortest: seed {shortest.seed}, {shortest.steps} steps: {shortest.failure}")
            worst = max(worst, 1 if name == "correct" else 0)
        elif name != "correct":
            print("  NOT CAUGHT")
            worst = 1
    return worst


if __name__ == "__main__":
    sys.exit(main())
