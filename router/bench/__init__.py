"""Benchmarks: the router's own cost (`overhead`, `fake_backend`) and the mixed-traffic lab —
workload files (`workload`) → seeded traces (`generate`) → real-time (`realtime`, `client`,
`stack`) or virtual-clock runs (`virtual`, `routing`, `reader`) → per-class statistics
(`report`), comparisons (`compare`, `results`, `render`, `plots`) and capacity evidence
(`evidence`)."""
