"""The noisy-tenant lab: tenants in the workload, the router's own lane queue on the virtual
clock, and quiet tenants that keep their SLO under fair queueing where first come first served
loses it."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.cli import main
from router.config.load import ConfigError, parse_profile
from router.config.models import ProfileConfig
from router.keys.auth import hash_key
from router.keys.tenant import Tenant
from router.lab.bench.generate import Request, generate
from router.lab.bench.lanequeue import VirtualGate
from router.lab.bench.routing import VirtualRouter
from router.lab.bench.tenants import load_lab_profile, run_tenants
from router.lab.bench.tenantsreal import counted_by, keyed_items, tenant_keys
from router.lab.bench.workload import load_workload, parse_workload
from router.lab.sim.config import EngineConfig
from router.lab.sim.timing import StepTimeModel, load_preset
from router.lab.sim.vclock import (
    WAIT,
    BackendState,
    RequestRecord,
    TraceRequest,
    VirtualBackend,
    VirtualCluster,
)

ROOT = Path(__file__).resolve().parents[3]
NOISY = ROOT / "config/workloads/noisy-tenant.yaml"
NOISY_LONG = ROOT / "config/workloads/noisy-tenant-long.yaml"
PROFILE = ROOT / "router/lab/data/noisy-tenant-profile.yaml"
BASE: dict[str, Any] = yaml.safe_load(NOISY.read_text())
PRESET = load_preset("h100-llama3-8b")
QUIET = ("web", "mobile", "reports")


def issues(data: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as exc:
        parse_workload(data, "test.yaml")
    return {i.path: i.message for i in exc.value.issues}


def with_tenant(index: int, **fields: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["tenants"][index].update(fields)
    return data


# -- the workload -------------------------------------------------------------------------------


def test_the_noisy_tenant_workloads_name_a_flooder_and_three_quiet_tenants() -> None:
    for path in (NOISY, NOISY_LONG):
        spec = load_workload(path)
        assert [t.name for t in spec.tenants] == ["scraper", *QUIET]
        flood, quiet = spec.tenants[0], spec.tenants[1:]
        assert all(flood.rate_at(10) > 3 * q.rate_at(10) for q in quiet)
        assert spec.slo_of("chat", "reports").e2e_s == 5.0
        assert spec.slo_of("chat", "web").ttft_s == 1.0


@pytest.mark.parametrize(
    ("fields", "path", "message"),
    [
        ({"weight": 0}, "tenants[1].weight", "must be > 0"),
        ({"tier": 101}, "tenants[1].tier", "must be ≤ 100"),
        ({"share": 0.5}, "tenants[1]", "exactly one of share"),
        ({"colour": "red"}, "tenants[1].colour", "unknown key"),
        ({"bursts": {"period_s": 4, "duty": 1.5}}, "tenants[1].bursts.duty", "must be ≤ 1"),
        ({"slo": {"ttft_s": -1}}, "tenants[1].slo.ttft_s", "must be > 0"),
    ],
)
def test_a_bad_tenant_is_refused_at_its_dotted_path(fields: dict[str, Any], path: str, message: str) -> None:
    found = issues(with_tenant(1, **fields))
    assert message in found[path], found


def test_tenants_must_agree_with_the_workload() -> None:
    data = with_tenant(2, name="web", classes={"batch": 1.0})
    found = issues(data)
    assert "named twice" in found["tenants[2].name"]
    assert found["tenants[2].classes.batch"] == "not a class of this workload"
    found = issues(with_tenant(0, share=0.5))
    assert "tenant shares must add up to 1" in found["tenants"]


def test_each_tenant_sends_its_share_and_a_flood_comes_in_bursts() -> None:
    spec = load_workload(NOISY)
    trace = generate(spec, model="m", rate=10, duration=32)
    requests = list(trace.requests())
    assert len({r.request_id for r in requests}) == len(requests)
    counts = {t.name: sum(r.tenant == t.name for r in requests) for t in spec.tenants}
    assert 0.75 < counts["scraper"] / len(requests) < 0.95
    bursts = spec.tenant("scraper").bursts
    assert bursts is not None
    on = bursts.period_s * bursts.duty
    assert all(r.arrival % bursts.period_s < on for r in requests if r.tenant == "scraper")
    assert any(r.arrival % bursts.period_s >= on for r in requests if r.tenant == "web")
    assert generate(spec, model="m", rate=10, duration=32).digest() == trace.digest()


# -- the router's queue on the virtual clock ---------------------------------------------------


def one_slot() -> ProfileConfig:
    lab = load_lab_profile()
    data = lab.model_dump(mode="json", exclude_unset=True)
    data["lanes"]["chat"].update(max_in_flight=1, queue_limit=3, queue_timeout_s=5.0)
    return parse_profile(data)


STATES = [BackendState(0, "http://127.0.0.1:18101", "shared", 0, 0, 0, 0.0)]


def arrive(router: VirtualRouter, rid: str, tenant: Tenant, at: float) -> int | None:
    router.tenants[rid] = tenant
    body = {
        "model": "meta-llama/Meta-Llama-3-8B-Instruct",
        "messages": [{"role": "user", "content": f"Question {rid}: what is the time?"}],
        "max_tokens": 50,
        "stream": True,
    }
    return router.pick(STATES, TraceRequest(rid, at, body))


@pytest.mark.parametrize(("quiet_key", "second"), [("quiet", "q-0"), ("flood", "f-2")])
def test_the_virtual_router_serves_a_quiet_key_before_the_flooders_queue(quiet_key: str, second: str) -> None:
    """A key per tenant: the quiet key's request goes before the flooder's second waiter (their
    first tags tie; the earlier waiter goes first). One key for both: it waits its turn."""
    gate = VirtualGate()
    router = VirtualRouter(one_slot(), gate=gate)
    flood = Tenant("flood")
    try:
        assert arrive(router, "f-0", flood, 0.0) == 0  # the one slot
        assert [arrive(router, f"f-{i}", flood, 0.01 * i) for i in (1, 2)] == [WAIT, WAIT]
        assert arrive(router, "q-0", Tenant(quiet_key), 0.1) == WAIT
        assert router.finished("f-0", 1.0) == ["f-1"]
        assert router.pick(STATES, TraceRequest("f-1", 0.0, {})) == 0  # placed without parsing again
        assert router.finished("f-1", 2.0) == [second]
    finally:
        gate.close()


def test_a_full_queue_makes_room_for_another_key_and_waiters_time_out() -> None:
    gate = VirtualGate()
    router = VirtualRouter(one_slot(), gate=gate)
    flood = Tenant("flood")
    try:
        assert [arrive(router, f"f-{i}", flood, 0.0) for i in range(4)] == [0, WAIT, WAIT, WAIT]
        assert arrive(router, "f-4", flood, 0.1) is None  # queue_limit 3, all the flooder's
        assert arrive(router, "q-0", Tenant("quiet"), 0.2) == WAIT
        assert gate.refused == ["f-3"]  # the flooder's newest gave its place up
        assert router.finished("f-0", 6.0) == []  # the others waited past queue_timeout_s
        assert sorted(gate.refused) == ["f-1", "f-2", "f-3", "q-0"]
    finally:
        gate.close()


def test_quiet_tenants_meet_their_slo_more_often_with_fair_queueing() -> None:
    spec = load_workload(NOISY)
    fifo, fair = run_tenants(spec, load_lab_profile(), PRESET, rate=10, duration=12, modes=("fifo", "fair"))
    for name in QUIET:
        assert fair.of(name).attainment > fifo.of(name).attainment + 0.3, name
        assert fair.of(name).ttft_p95 < fifo.of(name).ttft_p95
    # The flooder still gets the lane when the others do not need it.
    assert fair.of("scraper").answered > 0.8 * fifo.of("scraper").answered


def test_bench_tenants_writes_the_table_and_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "bench",
            "tenants",
            "--duration",
            "6",
            "--workload",
            str(NOISY),
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 0
    table = (tmp_path / "tenants.md").read_text()
    assert "| web |" in table and "fifo: met SLO" in table and "fair: met SLO" in table
    assert (tmp_path / "tenants.png").stat().st_size > 10_000
    assert "| scraper |" in capsys.readouterr().out
    assert main(["bench", "tenants", "--modes", "fifo,lifo", "--out", str(tmp_path)]) == 2


def test_in_real_time_each_tenant_sends_with_its_own_key_or_all_with_one() -> None:
    spec = load_workload(NOISY)
    trace = generate(spec, model="m", rate=4, duration=4)
    for per_tenant, names in ((True, {t.name for t in spec.tenants}), (False, {"shared"})):
        entries, secrets = tenant_keys(spec, per_tenant)
        assert {e["name"] for e in entries} == names
        assert {e["sha256"] for e in entries} == {hash_key(k) for k in secrets.values()}
        items = keyed_items(trace, secrets)
        assert len(items) == len(trace.items)
        for item in items:
            assert isinstance(item, Request)
            assert ("authorization", f"Bearer {secrets[item.tenant]}") in item.headers
    entries, _ = tenant_keys(spec, True)
    assert all(e["weight"] == 1.0 and e["tier"] == 0 for e in entries)


def test_in_real_time_fair_tokens_has_every_lane_count_turns_in_tokens() -> None:
    data = yaml.safe_load(PROFILE.read_text())
    counted = counted_by(data, "tokens")
    cfg = parse_profile(counted)
    assert {lane.fair_by for lane in cfg.lanes.values()} == {"tokens"}
    assert {lane.get("fair_by") for lane in data["lanes"].values()} == {None}  # the input is kept


def test_the_simulator_holds_a_waiting_request_until_it_is_released_or_refused() -> None:
    """`pick` answers WAIT: the request reaches an engine only when released (its wait counted
    in its TTFT), or is answered the refusal's status without reaching one."""
    config = EngineConfig(
        max_model_len=4096, max_num_batched_tokens=2048, max_num_seqs=8, num_gpu_blocks=1024
    )
    timing = StepTimeModel(c0=0.005, c_prefill=1e-4, c_decode=1e-3, c_ctx=0.0)
    cluster = VirtualCluster([VirtualBackend("http://sim-0", "p", config, timing)])
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi " * 40}], "max_tokens": 20}
    trace = [TraceRequest(f"r-{i}", 0.01 * i, body) for i in range(3)]
    done: dict[str, float] = {}
    released: set[str] = set()

    def pick(states: Sequence[BackendState], req: TraceRequest) -> int | None:
        return 0 if req.request_id == "r-0" or req.request_id in released else WAIT

    def on_done(rec: RequestRecord, now: float) -> list[TraceRequest]:
        done[rec.request_id] = now
        if rec.request_id == "r-0":
            released.add("r-1")
            cluster.release("r-1", now)
            cluster.refuse("r-2", 503, now)
        return []

    records = {r.request_id: r for r in cluster.run(trace, pick, on_done).records}
    first, second, third = records["r-0"], records["r-1"], records["r-2"]
    assert first.finish is not None and second.first_token is not None
    assert second.first_token > first.finish  # it reached the engine only after r-0 ended
    assert second.ttft is not None and second.ttft > first.finish - second.arrival
    assert (second.status, second.backend, second.output_tokens) == (200, 0, 20)
    assert (third.status, third.backend, third.first_token) == (503, None, None)
    assert done["r-2"] == done["r-0"]
