"""Peers: the same loads through lane-router, vLLM Router, nginx, a bare asyncio + httptools
proxy, and no proxy at all, on one machine in one run, with each proxy's own CPU time.

Each proxy runs on a core no other process of the benchmark uses; the fake backends
(`router.lab.bench.zero_backend`) and the load generator share the other, so the proxy's CPU
time, read from /proc over its process tree, holds nothing but its own work.
`scripts/bench-peers.sh` installs the peers and runs `python -m router.lab.bench.peers`.

- `scenarios`: what is measured, and the numbers one measurement yields;
- `loadgen`: the closed-loop client (a process of its own), SSE-aware; `wrk`: the non-streamed
  client when wrk is installed;
- `targets`: how each proxy is started; `nginx`: its configuration; `bare_proxy`: the Python floor;
- `cpu`: process trees and their CPU time; `harness`: the run; `report`: the markdown table.
"""
