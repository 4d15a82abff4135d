from __future__ import annotations

import itertools
from collections import defaultdict

import pytest

from router.config.load import parse_profile
from router.lab.bench.generate import generate
from router.lab.bench.loadclient import Endpoint
from router.lab.bench.outcome import Outcome
from router.lab.bench.realtime import RealtimeOptions, run_realtime
from router.lab.bench.report import summarize
from router.lab.procs import free_ports
from router.lab.sim.profile import profile_specs
from router.lab.sim.serve import SimCluster
from router.lab.sim.timing import load_preset
from router.server import build_state
from router.settings import Settings
from tests.lab.bench.lab import KEY, MODEL, quick_workload, two_pools
from tests.support.processes import wait_ready
from tests.support.servers import server_group


@pytest.mark.timeout(60)
async def test_a_short_mixed_run_through_the_router() -> None:
    ports = free_ports(3)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    cfg = parse_profile(two_pools(urls[:2], urls[2:]))
    workload = quick_workload()
    trace = generate(workload, model=MODEL, rate=10, duration=2.5)
    assert {r.cls for r in trace.requests()} == set(workload.class_names())  # the seed shows all six
    async with SimCluster(profile_specs(cfg, load_preset("cpu-tiny"))), server_group() as group:
        url = await group.serve_router(build_state(cfg, None), Settings(watch_config=False))
        await wait_ready(url)
        outcomes = await run_realtime(trace, Endpoint(url, KEY), RealtimeOptions(drain_s=30, progress=False))

    assert sorted(o.request_id for o in outcomes) == sorted(r.request_id for r in trace.requests())
    failed = [(o.request_id, o.status, o.error) for o in outcomes if not o.ok]
    assert failed == []
    by_cls: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_cls[o.cls].append(o)
        assert o.output_tokens == o.max_tokens and o.e2e is not None and o.ttft is not None
        assert 0 < o.ttft <= o.e2e
    assert set(by_cls) == set(workload.class_names())
    # The lane comes from the router's debug headers, and the router saw the signals.
    assert {o.lane for o in by_cls["batch"]} == {"batch"}
    assert {o.lane for o in by_cls["long_context"]} == {"long_context"}
    assert {o.lane for o in by_cls["agent"]} == {"agent"}
    for o in by_cls["chat"] + by_cls["slow_stream"]:
        # A server that fell behind a reader sends several tokens in one event.
        assert 1 <= len(o.gaps) <= o.output_tokens - 1
    # Slow readers never read faster than their speed allows (the first event is free).
    for o in by_cls["slow_stream"]:
        req = next(r for r in trace.requests() if r.request_id == o.request_id)
        assert req.read_rate is not None and o.e2e is not None and o.ttft is not None
        assert o.e2e - o.ttft >= (o.output_tokens - 2) / req.read_rate
    # Agent steps are closed loop: each is sent only after the previous answer plus think time.
    steps = sorted(by_cls["agent"], key=lambda o: (o.session or "", o.step))
    plans = {r.request_id: r for r in trace.requests()}
    for a, b in itertools.pairwise(steps):
        if a.session == b.session:
            assert a.e2e is not None
            assert b.arrival >= a.arrival + a.e2e + plans[b.request_id].think_s - 0.01
    stats = summarize(outcomes, workload, trace.duration)
    assert stats.accepted_share == 1.0 and stats.passed
