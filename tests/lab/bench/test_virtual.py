from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest
import yaml

from router.config.load import parse_profile
from router.lab.bench.compare import CompareSpec, run_compare
from router.lab.bench.generate import generate
from router.lab.bench.plots import write_plots
from router.lab.bench.render import report_md
from router.lab.bench.results import comparison_from_json, comparison_json, merge
from router.lab.bench.stack import local_profile
from router.lab.bench.virtual import (
    VirtualOptions,
    allocate,
    pool_counts,
    profile_backends,
    run_virtual,
)
from router.lab.sim.timing import load_preset
from tests.lab.bench.lab import MODEL, one_pool, quick_workload, two_pools

PRESET = load_preset("cpu-tiny")
URLS = [f"http://127.0.0.1:{9000 + i}" for i in range(4)]


def test_pool_counts_fix_named_pools_and_share_the_rest() -> None:
    cfg = parse_profile(two_pools(URLS[:2], URLS[2:3]))
    assert pool_counts(cfg) == {"interactive": 2, "bulk": 1}
    assert pool_counts(cfg, 9) == {"interactive": 6, "bulk": 3}
    assert pool_counts(cfg, 8, {"bulk": 5, "absent": 2}) == {"interactive": 3, "bulk": 5}


def test_a_pool_found_by_dns_is_simulated_from_one_engine() -> None:
    data = two_pools(URLS[:2], URLS[2:3])
    data["pools"]["bulk"] = {
        **{k: v for k, v in data["pools"]["bulk"].items() if k != "backends"},
        "discovery": {"dns": "vllm-bulk.llm.svc.cluster.local"},
    }
    cfg = parse_profile(data)
    assert pool_counts(cfg) == {"interactive": 2, "bulk": 1}
    assert pool_counts(cfg, 6) == {"interactive": 4, "bulk": 2}
    local = parse_profile(local_profile(data, "k" * 32))
    assert local.pools["bulk"].discovery is None and len(local.pools["bulk"].backends) == 1


def test_allocate_keeps_proportions_and_one_engine_per_pool() -> None:
    assert allocate({"a": 4, "b": 2, "c": 1, "d": 1}, 8) == {"a": 4, "b": 2, "c": 1, "d": 1}
    assert allocate({"a": 4, "b": 2, "c": 1, "d": 1}, 16) == {"a": 8, "b": 4, "c": 2, "d": 2}
    assert allocate({"a": 1, "b": 1}, 5) in ({"a": 3, "b": 2}, {"a": 2, "b": 3})
    assert allocate({"a": 10, "b": 1}, 4) == {"a": 3, "b": 1}
    assert sum(allocate({"x": 3, "y": 3, "z": 2}, 32).values()) == 32
    with pytest.raises(ValueError):
        allocate({"a": 1, "b": 1, "c": 1}, 2)


def test_profile_backends_take_the_pools_vllm_settings() -> None:
    data = two_pools(URLS[:2], URLS[2:3])
    data["pools"]["bulk"]["vllm"] = {
        "max_model_len": 2048,
        "max_num_batched_tokens": 1024,
        "max_num_seqs": 8,
        "stream_interval": 3,
    }
    backends = profile_backends(parse_profile(data), PRESET, engines=6)
    pools = [b.pool for b in backends]
    assert pools.count("interactive") == 4 and pools.count("bulk") == 2
    bulk = next(b for b in backends if b.pool == "bulk")
    assert (bulk.config.max_num_seqs, bulk.config.stream_interval) == (8, 3)
    assert bulk.config.num_gpu_blocks == PRESET.engine.num_gpu_blocks  # hardware from the preset
    assert len({b.name for b in backends}) == 6


def test_virtual_run_routes_like_the_router_and_keeps_sessions_closed_loop() -> None:
    cfg = parse_profile(two_pools(URLS[:2], URLS[2:3]))
    workload = quick_workload()
    trace = generate(workload, model=MODEL, rate=20, duration=10)
    run = run_virtual(trace, cfg, PRESET, VirtualOptions(progress=False))
    outcomes = run.outcomes
    again = run_virtual(trace, cfg, PRESET, VirtualOptions(progress=False)).outcomes
    assert [o.to_json() for o in outcomes] == [o.to_json() for o in again]
    assert sorted(o.request_id for o in outcomes) == sorted(r.request_id for r in trace.requests())
    assert all(o.ok for o in outcomes)
    lanes = {o.cls: set() for o in outcomes}
    for o in outcomes:
        lanes[o.cls].add(o.lane)
    assert lanes["batch"] == {"batch"} and lanes["long_context"] == {"long_context"}
    assert lanes["agent"] == {"agent"}
    assert "rag" in lanes["rag"]  # from the third sighting of a document on
    assert {o.backend for o in outcomes if o.lane == "batch"} == {URLS[2]}
    assert run.pools["bulk"].engines == 1 and 0 < run.pools["bulk"].busy < 1
    assert run.pools["interactive"].prefix_hit_rate > 0  # the documents are cached
    plans = {r.request_id: r for r in trace.requests()}
    agent = sorted((o for o in outcomes if o.cls == "agent"), key=lambda o: (o.session or "", o.step))
    for a, b in itertools.pairwise(agent):
        if a.session == b.session:
            assert a.e2e is not None
            assert b.arrival == pytest.approx(a.arrival + a.e2e + plans[b.request_id].think_s)
    slow = [o for o in outcomes if o.cls == "slow_stream"]
    for o in slow:
        rate = plans[o.request_id].read_rate
        assert rate is not None and o.e2e is not None and o.ttft is not None
        assert o.e2e - o.ttft >= (o.output_tokens - 1) / rate * 0.99


def test_a_small_virtual_comparison(tmp_path: Path) -> None:
    workload_path = tmp_path / "quick.yaml"
    workload_path.write_text(yaml.safe_dump(quick_workload().model_dump(mode="json")))
    profiles = []
    for data in (one_pool(URLS[:3]), two_pools(URLS[:2], URLS[2:3])):
        path = tmp_path / f"{data['profile']}.yaml"
        path.write_text(yaml.safe_dump(data))
        profiles.append(path)
    spec = CompareSpec(
        workload_path=workload_path,
        profile_paths=tuple(profiles),
        rates=(10.0, 40.0),
        duration=8.0,
        requests=None,
        engines=3,
        preset="cpu-tiny",
    )
    c = run_compare(spec)
    assert c.profiles == ["one-pool", "two-pools"]
    assert [(p.profile, p.rate) for p in c.points] == [
        ("one-pool", 10.0),
        ("two-pools", 10.0),
        ("one-pool", 40.0),
        ("two-pools", 40.0),
    ]
    low = c.point("two-pools", 10.0)
    assert low is not None and low.stats.sent == low.requests > 50
    # The same seeded trace for every profile at one load.
    assert c.point("one-pool", 10.0).requests == low.requests  # type: ignore[union-attr]
    data = orjson.loads(orjson.dumps(comparison_json(c)))
    assert set(data["capacity"]) == {"one-pool", "two-pools"}
    assert data["points"][0]["classes"]["chat"]["sent"] > 0
    back = comparison_from_json(data)  # results.json carries all a report needs
    assert report_md(back, [], "x") == report_md(c, [], "x")
    assert back.capacity("two-pools")[0] == c.capacity("two-pools")[0]
    both = merge([("base", c), ("again", back)])
    assert both.profiles == ["one-pool", "two-pools", "one-pool (again)", "two-pools (again)"]
    assert len(both.points) == 8 and both.point("two-pools (again)", 40.0) is not None
    assert low.pools["interactive"].engines == 2 and low.pools["bulk"].engines == 1
    plots = write_plots(c, tmp_path / "out")
    assert [p.name for p in plots] == ["ttft-cdf.png", "slo-attainment.png", "goodput-vs-load.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
    report = report_md(c, [p.name for p in plots], "lane-router bench compare …")
    assert "| profile | highest passing load" in report and "![ttft-cdf.png](ttft-cdf.png)" in report
    row = next(line for line in report.splitlines() if line.startswith("| two-pools | bulk"))
    assert "bulk 1 × " in row and "interactive 2 × " in row


def test_slow_readers_are_learned_and_moved_to_their_lane() -> None:
    data = two_pools(URLS[:2], URLS[2:3], slow_stream={"pool": "bulk"})
    data["slow_clients"] = {"lag_bytes": 2048}  # about ten pieces behind
    cfg = parse_profile(data)
    workload = quick_workload()
    trace = generate(workload, model=MODEL, rate=20, duration=20)
    outcomes = run_virtual(trace, cfg, PRESET, VirtualOptions(progress=False)).outcomes
    slow = sorted((o for o in outcomes if o.cls == "slow_stream"), key=lambda o: o.arrival)
    firsts: dict[str, str | None] = {}
    for o in slow:
        firsts.setdefault(o.client_id, o.lane)
    # A client's first stream is taken for chat; once it lagged, its streams go to slow_stream.
    assert set(firsts.values()) == {"chat"}
    assert [o.reason for o in slow].count("slow_client") >= len(slow) - 2 * len(firsts)
    assert {o.lane for o in slow if o.reason == "slow_client"} == {"slow_stream"}
    assert all(o.lane != "slow_stream" for o in outcomes if o.cls == "chat")
