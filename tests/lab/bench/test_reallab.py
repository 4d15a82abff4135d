"""The real-vLLM lab's two profiles: same servers, only the routing differs."""

from __future__ import annotations

from pathlib import Path

from router.config.load import parse_profile
from router.config.models import RequestClass
from router.lab.bench.reallab import PROFILES, LabRun, servers_for
from router.lab.bench.workload import load_workload
from router.lab.realvllm.install import VllmInstall

URLS = ["http://127.0.0.1:9101", "http://127.0.0.1:9102"]
ROOT = Path(__file__).resolve().parents[3]


def test_both_profiles_are_valid_and_use_both_servers() -> None:
    for name, make in PROFILES.items():
        cfg = parse_profile(make(URLS), name)
        backends = sorted(str(b).rstrip("/") for pool in cfg.pools.values() for b in pool.backends)
        assert backends == URLS, name


def test_class_aware_keeps_long_prompts_off_the_interactive_server() -> None:
    cfg = parse_profile(PROFILES["class-aware"](URLS), "class-aware")
    pools = {name: {str(b).rstrip("/") for b in pool.backends} for name, pool in cfg.pools.items()}
    servers = {str(cls): pools[lane.pool] for cls, lane in cfg.lanes.items()}
    assert all(servers[c] == {URLS[1]} for c in ("long_context", "batch"))
    assert all(servers[c] == {URLS[0]} for c in ("chat", "rag", "agent", "slow_stream"))


def test_the_workload_fits_the_servers_and_splits_at_the_thresholds() -> None:
    """Every prompt plus output fits the servers' context, and the classifier's long-context line
    sits between the longest chat-shaped prompt and the shortest long one."""
    spec = load_workload(ROOT / "config/workloads/mixed-six-cpu.yaml")
    cfg = parse_profile(PROFILES["shared-pool"](URLS), "shared-pool")
    limit = cfg.pools["shared"].vllm.max_model_len
    long, chat = spec.classes[RequestClass.LONG_CONTEXT], spec.classes[RequestClass.CHAT]
    assert long.prompt_tokens is not None and chat.prompt_tokens is not None
    assert long.prompt_tokens.min > cfg.classify.long_context_tokens > chat.prompt_tokens.max
    assert long.prompt_tokens.max + long.output_tokens.max <= limit


def test_every_server_is_started_from_its_pool_settings(tmp_path: Path) -> None:
    install = VllmInstall(venv=tmp_path / "venv", models=tmp_path / "models", cache=tmp_path / "cache")
    data = PROFILES["class-aware"](URLS)
    run = LabRun(install, tmp_path, trace=None, warmup=None, drain_s=1.0)  # type: ignore[arg-type]
    servers = servers_for(run, data)
    assert [s.url for s in servers] == URLS
    # Same settings on both: the commands differ only in the port.
    assert [a for a in servers[0].command if a != "9101"] == [a for a in servers[1].command if a != "9102"]
    for server in servers:
        assert "--max-model-len" in server.command and "4096" in server.command
        assert server.served_model_name == "medium"
