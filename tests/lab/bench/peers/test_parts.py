"""The pure parts of the peers benchmark: wrk's summary, nginx's configuration, the profile, the
rounds summed and compared."""

from __future__ import annotations

from pathlib import Path

from router.config.load import parse_profile
from router.lab.bench.peers import nginx, wrk
from router.lab.bench.peers.harness import Run
from router.lab.bench.peers.report import ratios
from router.lab.bench.peers.scenarios import MODEL, Load, Measure, TargetResult, combined
from router.lab.bench.peers.targets import Target, Tools, lane_router_profile, lane_router_targets, missing
from router.lab.bench.zero_backend import MODEL as BACKEND_MODEL


def test_the_loads_ask_for_the_fake_backends_model() -> None:
    assert MODEL == BACKEND_MODEL


def test_wrk_summary_counts_failed_answers_and_socket_errors_as_errors() -> None:
    out = (
        "Running 8s test @ http://127.0.0.1:1/v1/chat/completions\n"
        "  43530 requests in 8.00s, 19.34MB read\n"
        "  Socket errors: connect 0, read 1, write 0, timeout 2\n"
        "  Non-2xx or 3xx responses: 3\n"
        "Requests/sec:   5441.13\n"
    )
    load = wrk.parse(out)
    assert (load.requests, load.errors, load.elapsed_s, load.client) == (43527, 6, 8.0, "wrk")
    assert wrk.parse("  10 requests in 500.00ms, 1KB read\n").elapsed_s == 0.5


def test_wrk_script_sends_the_key_and_a_non_streamed_body(tmp_path: Path) -> None:
    text = wrk.write_script(tmp_path / "post.lua", "k-123", 16).read_text()
    assert 'wrk.headers["Authorization"] = "Bearer k-123"' in text
    assert '\\"max_tokens\\":16' in text and '\\"stream\\":false' in text


def test_nginx_config_keeps_everything_under_its_prefix(tmp_path: Path) -> None:
    conf = nginx.write_config(tmp_path / "ng", 8123, ["127.0.0.1:9001", "127.0.0.1:9002"], cpu=1)
    text = conf.read_text()
    assert "worker_cpu_affinity 10;" in text and nginx.affinity_mask(0) == "1"
    assert "listen 127.0.0.1:8123" in text and "proxy_buffering off;" in text
    assert "server 127.0.0.1:9001;" in text and "server 127.0.0.1:9002;" in text
    assert (tmp_path / "ng" / "logs").is_dir() and (tmp_path / "ng" / "tmp" / "proxy").is_dir()
    assert nginx.command("nginx", conf) == ["nginx", "-p", str(conf.parent), "-c", str(conf)]


def test_lane_router_profile_has_admission_and_a_rate_limited_key() -> None:
    cfg = parse_profile(lane_router_profile("http://127.0.0.1:9001", "bench-key-0123456789"))
    (pool,) = cfg.pools.values()
    assert pool.admission.max_prefilling is not None
    (key,) = cfg.keys
    assert key.rpm and key.tpm and key.max_concurrency


def test_several_source_trees_get_a_column_each_and_a_tree_without_the_router_is_reported(
    tmp_path: Path,
) -> None:
    here = Path(__file__).resolve().parents[4]
    (only,) = lane_router_targets([], here)
    assert (only.label, only.src) == ("lane-router", here)
    empty = tmp_path / "empty"
    empty.mkdir()
    two = lane_router_targets([here, empty], here)
    assert [t.src for t in two] == [here, empty.resolve()]
    assert two[0].label != two[1].label and all(t.label.startswith("lane-router ") for t in two)
    tools = Tools("python", "vllm-router", "nginx", None)
    assert missing(two[0], tools) is None
    assert missing(two[1], tools) == f"no router package under {empty.resolve()}"
    absent = Tools("python", str(tmp_path / "vllm-router"), str(tmp_path / "nginx"), None)
    assert (
        missing(Target("vllm-router", "vLLM Router"), absent) == f"not installed ({tmp_path / 'vllm-router'})"
    )
    assert missing(Target("nginx", "nginx"), absent) == f"not installed ({tmp_path / 'nginx'})"


def _paced(chunks: int, cpu_s: float | None, ttft_p50: float, user_s: float | None = None) -> Measure:
    return Measure(Load(chunks // 64, chunks, 0, 0, 5.0, ttft_p50, 2 * ttft_p50), cpu_s, user_s)


def test_rounds_are_summed_and_their_ttft_is_the_median() -> None:
    total = combined(
        [_paced(6400, 0.2, 21.0, 0.1), _paced(12800, 0.6, 25.0, 0.2), _paced(6400, 0.2, 22.0, 0.1)]
    )
    assert (total.load.chunks, total.load.requests, total.load.elapsed_s) == (25600, 400, 15.0)
    assert total.us_per_chunk == 1e6 * 1.0 / 25600  # CPU over chunks of all rounds, not a mean of means
    assert total.user_us_per_chunk == 1e6 * (0.1 + 0.2 + 0.1) / 25600
    assert (total.load.ttft_p50_ms, total.load.ttft_p99_ms) == (22.0, 44.0)
    assert combined([_paced(64, None, 1.0)]).proxy_cpu_s is None


def test_lane_router_is_compared_with_vllm_router_over_the_run_and_round_by_round() -> None:
    ours = TargetResult(
        "lane-router",
        {"paced": [_paced(6400, 0.18, 21.5), _paced(6400, 0.22, 21.0), _paced(6400, 0.30, 22.0)]},
    )
    theirs = TargetResult(
        "vLLM Router", {"paced": [_paced(6400, 0.2, 21.0), _paced(6400, 0.2, 21.5), _paced(6400, 0.2, 21.0)]}
    )
    run = Run(results=[ours, theirs, TargetResult("nginx", {}, "not installed")])
    (line,) = ratios(run)
    assert line == (
        "lane-router ÷ vLLM Router, CPU per request or chunk: paced 1.17 (median 1.10; rounds 0.90, 1.10, "
        "1.50); paced TTFT p50 +0.5 ms (rounds +0.5, -0.5, +1.0)."
    )
    assert ratios(Run(results=[ours])) == []  # nothing to compare with
    # Trees compared with one another, without vLLM Router: each later one against the first.
    other = TargetResult("lane-router abc1234", theirs.rounds)
    (line,) = ratios(Run(results=[other, ours]))
    assert line.startswith(
        "lane-router ÷ lane-router abc1234, CPU per request or chunk: paced 1.17 (median 1.10;"
    )
