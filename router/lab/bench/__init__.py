"""The benchmark harness: one stack that starts simulated engines and the router (`stack`), one
load client (`loadclient`), and the experiments run on them.

* the router's own cost: `overhead` against its zero-delay upstream (`zero_backend`), and
  `sharedstate_overhead`, `upstream_micro`, `hotpath` for single parts of it, and `wirepath` for
  the request path with its sockets (the server, the app and the upstream client);
* the mixed-traffic lab: workload files (`workload`) → seeded traces (`generate`) → real-time
  (`realtime`) or virtual-clock runs (`virtual`, `routing`, `reader`) → per-class statistics
  (`report`), comparisons (`compare`, `comparecmd`, `results`, `render`, `plots`), the demo
  (`demo`) and the same comparison on two real vLLM servers (`reallab`);
* the lane-policy experiments: seeded plans (`laneplans`) through the same runner and client
  (`lanepolicies`).

Capacity evidence from a run is router/lab/evidence/measure.py.
"""
