"""The local stack and the tools around it (demo, chaos, load, bench, eval), a dev extra.

Imports nothing: the bare baseline's workflow (devstack/bench_bare.py) is loaded into the
workflow sandbox, which re-imports this package for every workflow run.
"""
