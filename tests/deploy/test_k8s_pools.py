"""The vLLM pools on Kubernetes: each a Deployment behind a headless Service of its ready pods,
found by the router through the `discovery:` block of its profile, probed on /health, draining
before it stops, and reachable from router pods alone."""

from __future__ import annotations

import pytest

from router.config.render import RenderError, pool_serve_args
from router.deploy.k8s_options import parse_autoscaler
from router.deploy.render_k8s import K8sOptions, render_k8s
from tests.deploy.k8s import (
    Doc,
    container,
    deployed_profile,
    kind,
    manifests,
    one,
    pod_labels,
    pools,
    selects,
)
from tests.deploy.samples import cfg, example, found_by_dns, small


def probe_path(probe: Doc) -> tuple[str, str]:
    return probe["httpGet"]["path"], probe["httpGet"]["port"]


def test_each_pool_is_a_deployment_behind_a_headless_service_of_its_ready_pods() -> None:
    source = example()
    docs = manifests(source)
    profile = deployed_profile(docs)

    assert not kind(docs, "StatefulSet")
    assert set(pools(docs)) == set(source.pools)
    for name, deployment in pools(docs).items():
        service = one(docs, "Service", deployment["metadata"]["name"])
        spec = service["spec"]
        assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is False
        assert selects(spec["selector"], pod_labels(deployment))
        assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels(deployment))
        assert not any(selects(spec["selector"], pod_labels(d)) for n, d in pools(docs).items() if n != name)
        [port] = spec["ports"]
        vllm = container(deployment)
        target = [p["containerPort"] for p in vllm["ports"] if p["name"] == port["targetPort"]]
        assert target == [port["port"]]
        assert vllm["args"][vllm["args"].index("--port") + 1] == str(port["port"])
        assert deployment["spec"]["replicas"] == len(source.pools[name].backends)

        pool = profile.pools[name]
        assert pool.backends == [] and pool.discovery is not None
        assert pool.discovery.dns == f"{service['metadata']['name']}.lane-router.svc.cluster.local"
        assert (pool.discovery.port, pool.discovery.interval_s) == (port["port"], 5)
    assert profile.lanes == source.lanes and profile.keys == source.keys


def test_the_discovery_block_is_what_the_profile_map_says() -> None:
    text = one(manifests(), "ConfigMap", "lane-router-profile")["data"]["profile.yaml"]

    assert (
        "    discovery:\n"
        "      dns: vllm-interactive.lane-router.svc.cluster.local\n"
        "      port: 8000\n"
        "      interval_s: 5\n"
    ) in text
    assert "backends:" not in text


def test_servers_run_their_pools_rendered_arguments() -> None:
    profile = example()
    for name, deployment in pools(manifests(profile)).items():
        args = container(deployment)["args"]
        rendered = list(pool_serve_args(profile.pools[name], device="gpu").args)
        assert args[-len(rendered) :] == rendered


def test_servers_are_ready_when_they_answer_health_and_may_take_their_time_to_load() -> None:
    for deployment in pools(manifests()).values():
        vllm = container(deployment)
        startup, ready, live = vllm["startupProbe"], vllm["readinessProbe"], vllm["livenessProbe"]

        assert probe_path(ready) == probe_path(startup) == probe_path(live) == ("/health", "http")
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60  # a model download
        assert ready["periodSeconds"] * ready["failureThreshold"] <= 15
        assert live["periodSeconds"] * live["failureThreshold"] >= 60  # a busy server is not killed at once


def test_a_leaving_server_serves_until_the_routers_stopped_choosing_it() -> None:
    docs = manifests()
    profile = deployed_profile(docs)
    for name, deployment in pools(docs).items():
        pod = deployment["spec"]["template"]["spec"]
        drain = container(deployment)["lifecycle"]["preStop"]["sleep"]["seconds"]
        pool = profile.pools[name]
        assert pool.discovery is not None

        # The router's next resolution, after the cluster DNS dropped the record (5 s TTL).
        assert drain >= pool.discovery.interval_s + 5
        assert pod["terminationGracePeriodSeconds"] >= drain + pool.response_head_timeout_s
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_pool_servers_get_their_pool_key_and_model() -> None:
    profile = example()
    for name, deployment in pools(manifests(profile)).items():
        pool = profile.pools[name]
        vllm = container(deployment)
        env = {e["name"]: e for e in vllm["env"]}
        [model_var] = [a[2:-1] for a in vllm["args"] if a.startswith("$(")]

        assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == pool.upstream_api_key_env
        assert env[model_var]["value"] == pool.model  # Kubernetes expands only variables it defines
        assert vllm["args"][vllm["args"].index("--served-model-name") + 1] == pool.model


def test_gpu_pools_ask_for_every_accelerator_they_use() -> None:
    docs = manifests(cfg(small(bulk={"vllm": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}})))
    gpus = {name: container(d)["resources"]["limits"]["nvidia.com/gpu"] for name, d in pools(docs).items()}

    assert gpus == {"chat": "1", "bulk": "4"}
    assert {container(d)["image"] for d in pools(docs).values()} == {"vllm/vllm-openai:v0.32.0"}


def test_cpu_pools_run_the_cpu_image_as_non_root() -> None:
    for deployment in pools(manifests(device="cpu")).values():
        vllm = container(deployment)
        assert vllm["image"] == "lane-router-vllm-cpu:0.32.0"
        assert vllm["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
        assert "nvidia.com/gpu" not in vllm["resources"]["limits"]
        assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
        assert "--gpu-memory-utilization" not in vllm["args"]


@pytest.mark.parametrize("autoscale", [(), ("interactive=hpa:1-3", "slow=keda:1-2")])
def test_only_router_pods_may_reach_the_pools(autoscale: tuple[str, ...]) -> None:
    docs = manifests(None, *autoscale)
    policy = one(docs, "NetworkPolicy", "vllm-pools-from-router-only")
    router_pods = pod_labels(one(docs, "Deployment", "lane-router"))
    pool_pods = [pod_labels(d) for d in pools(docs).values()]
    spec = policy["spec"]

    assert spec["policyTypes"] == ["Ingress"]
    assert all(selects(spec["podSelector"]["matchLabels"], labels) for labels in pool_pods)
    assert not selects(spec["podSelector"]["matchLabels"], router_pods)
    [rule] = spec["ingress"]
    [source] = rule["from"]
    assert set(source) == {"podSelector"}  # this namespace's pods only, no namespace or IP block
    assert selects(source["podSelector"]["matchLabels"], router_pods)
    assert not any(selects(source["podSelector"]["matchLabels"], labels) for labels in pool_pods)
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    policies = {p["metadata"]["name"] for p in kind(docs, "NetworkPolicy")}
    assert ("vllm-metrics-from-prometheus" in policies) == bool(autoscale)


def test_an_autoscaled_pool_leaves_its_replicas_to_the_autoscaler() -> None:
    deployments = pools(manifests(None, "interactive=hpa:2-6", "batch=keda:1-4"))

    assert "replicas" not in deployments["interactive"]["spec"]
    assert "replicas" not in deployments["batch"]["spec"]
    assert deployments["prefix"]["spec"]["replicas"] == 2


def test_a_pool_the_profile_finds_by_dns_is_deployed_as_the_routers_own_service() -> None:
    docs = manifests(cfg(found_by_dns(interval_s=2, max_backends=8, nameservers=["10.0.0.53"])))
    discovery = deployed_profile(docs).pools["chat"].discovery

    assert discovery is not None
    assert discovery.dns == "vllm-chat.lane-router.svc.cluster.local" and discovery.port == 8000
    assert (discovery.interval_s, discovery.max_backends, discovery.nameservers) == (2, 8, ())
    assert "replicas" not in pools(docs)["chat"]["spec"]  # no size in the profile: `kubectl scale`
    assert pools(docs)["bulk"]["spec"]["replicas"] == 1


def test_an_autoscaler_beyond_the_routers_cap_is_refused_or_raises_it() -> None:
    raised = deployed_profile(manifests(cfg(small()), "chat=hpa:2-100")).pools["chat"].discovery
    assert raised is not None and raised.max_backends == 100
    default = deployed_profile(manifests(cfg(small()), "chat=hpa:2-64")).pools["chat"].discovery
    assert default is not None and default.max_backends == 64

    capped = K8sOptions(autoscalers=(parse_autoscaler("chat=keda:1-9"),))
    with pytest.raises(RenderError, match=r"pools\.chat\.discovery\.max_backends: .* at most 8 servers"):
        render_k8s(cfg(found_by_dns(max_backends=8)), capped)
