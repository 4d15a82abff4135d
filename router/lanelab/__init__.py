"""Lane-policy experiments: each routing policy measured end to end against simulated pools.

The router runs as its own process (`lane-router serve`, exactly as deployed); the simulated vLLM
servers and the load run in this process. `python -m router.lanelab --help` lists the
experiments; each prints a markdown table (docs/lane-policies.md holds the measured ones).
"""
