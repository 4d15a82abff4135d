"""Admission counts across router processes.

- budget.py: a process's part of each limit when several enforce it without shared state
- arithmetic.py: the pure arithmetic of shared slots, which the scripts mirror
- scripts.py: the Lua scripts that take, give back, re-home and reap slots in Redis
- store.py: a process's slots in Redis, its holder and heartbeat, and the fallback to its parts
- gate.py: `SharedPoolGate`, admission to a pool with counts shared through the store
- counting.py: which gate a runtime's pools get, and this process's share
"""
