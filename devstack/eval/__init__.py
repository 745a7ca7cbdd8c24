"""An evaluation of agent runs graded on the world, not on the reply (`python -m devstack.eval`).

tickets.py (what to run and what should happen), conditions.py (provider faults, worker kills),
columns.py (model backends and tools, the naive baseline, a seeded defect), runner.py (the
runs on a real local stack), grade.py (the grading, from records only), report.py (outputs).
"""
