"""A pool whose lanes place on vLLM's KV events renders engines that publish them: prefix caching
on, `--kv-events-config` binding wildcard endpoints on the pool's ports (rank r at port + r), those
ports on the container, the headless Service and the router-only NetworkPolicy. Pools without
such lanes render as before."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from router.deploy.plan import plan_pools
from tests.deploy.k8s import container, deployed_profile, manifests, one, pools
from tests.deploy.samples import cfg, small
from tests.deploy.tools import K8S_VERSIONS


def _precise(**kv_events: Any) -> dict[str, Any]:
    data = small(chat={"kv_events": kv_events} if kv_events else {})
    data["lanes"]["rag"]["balance"] = "precise_prefix"
    data["models"]["org/chat"] = {"tokenizer": "simulator"}
    return data


def _serve(data: dict[str, Any], pool: str) -> tuple[str, ...]:
    plans = {p.name: p for p in plan_pools(cfg(data), "cpu")}
    return plans[pool].serve.args


def _kv_config(args: tuple[str, ...]) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(args[args.index("--kv-events-config") + 1])
    return config


def test_discovered_pool_publishes_on_the_default_wildcard_ports() -> None:
    args = _serve(_precise(), "chat")

    assert "--enable-prefix-caching" in args and "--no-enable-prefix-caching" not in args
    assert _kv_config(args) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5558",
    }


def test_named_ports_are_bound_and_prefix_caching_turned_on() -> None:
    data = _precise(port=6001, replay_port=6101, data_parallel_size=2)
    data["pools"]["chat"]["vllm"]["enable_prefix_caching"] = False
    args = _serve(data, "chat")

    assert "--no-enable-prefix-caching" not in args
    assert _kv_config(args)["endpoint"] == "tcp://*:6001"
    assert _kv_config(args)["replay_endpoint"] == "tcp://*:6101"


def test_follow_true_publishes_without_a_precise_lane() -> None:
    assert "--kv-events-config" in _serve(small(chat={"kv_events": {"follow": True, "port": 7000}}), "chat")


@pytest.mark.parametrize("data", [small(), _precise(follow=False)])
def test_pools_not_followed_render_as_before(data: dict[str, Any]) -> None:
    before = {p.name: p.serve.args for p in plan_pools(cfg(small()), "cpu")}
    after = {p.name: p.serve.args for p in plan_pools(cfg(data), "cpu")}

    assert after == before
    assert not any("--kv-events-config" in args for args in after.values())


def test_bulk_pool_of_a_precise_profile_renders_as_before() -> None:
    assert _serve(_precise(), "bulk") == _serve(small(), "bulk")


def test_k8s_exposes_every_rank_to_the_router_only() -> None:
    docs = manifests(cfg(_precise(port=6001, replay_port=6101, data_parallel_size=2)), device="cpu")
    ports = {6001, 6002, 6101, 6102}

    chat = pools(docs)["chat"]
    assert ports <= {p["containerPort"] for p in container(chat)["ports"]}
    assert {p["containerPort"] for p in container(pools(docs)["bulk"])["ports"]} == {8000}
    service = one(docs, "Service", chat["metadata"]["name"])
    assert ports <= {p["port"] for p in service["spec"]["ports"]}
    policy = one(docs, "NetworkPolicy", "vllm-pools-from-router-only")
    (rule,) = policy["spec"]["ingress"]
    assert {p["port"] for p in rule["ports"]} == {8000} | ports
    for version in K8S_VERSIONS:
        for doc in (chat, service, policy):
            kubernetes_validate.validate(doc, version, strict=True)


def test_k8s_policy_of_a_profile_without_events_is_unchanged() -> None:
    policy = one(manifests(cfg(small()), device="cpu"), "NetworkPolicy", "vllm-pools-from-router-only")
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8000}]


def test_deployed_profile_names_the_ports_the_engines_bind() -> None:
    chat = deployed_profile(manifests(cfg(_precise()), device="cpu")).pools["chat"]

    assert chat.kv_events is not None
    assert (chat.kv_events.port, chat.kv_events.replay_port) == (5557, 5558)
