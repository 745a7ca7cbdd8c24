"""A deterministic simulation of the effect protocol (issue 24), the way FoundationDB and TigerBeetle
test theirs: the product's own Effects and EffectLedger (on a real SQLite file) driven by a seeded
scheduler with a virtual clock, a provider stand-in that delays, loses, refuses and lands requests
late, workers paused and killed between any two steps, and people who answer at any moment.

`python -m devstack.sim` explores seeds of the protocol and of its deliberately broken variants;
a failing seed replays exactly (`--seed N --variant V --trace`). tests/test_simulator.py runs it.
"""
