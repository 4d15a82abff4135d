"""Kubernetes manifests: valid against the API schemas, and consistent with each other — the
profile's backends are the pool pods' names, selectors select what they should, and only router
pods may reach the pools."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes_validate
import pytest
import yaml

from router.auth import build_keys, hash_key
from router.config.load import parse_profile
from router.config.models import ProfileConfig
from router.config.render import RenderError
from router.deploy.plan import plan_pools, router_secret_envs
from router.deploy.render_k8s import K8sOptions, render_k8s
from router.keyhygiene import key_issues
from tests.deploy.samples import cfg, example, small
from tests.deploy.tools import K8S_VERSIONS

Doc = dict[str, Any]


def manifests(profile: ProfileConfig | None = None, **options: Any) -> list[Doc]:
    return list(render_k8s(profile or example(), K8sOptions(**options)).documents)


def kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind_: str, name: str) -> Doc:
    [found] = [d for d in kind(docs, kind_) if d["metadata"]["name"] == name]
    return found


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def container(workload: Doc) -> Doc:
    [c] = workload["spec"]["template"]["spec"]["containers"]
    return c


def deployed_profile(docs: list[Doc]) -> ProfileConfig:
    text = one(docs, "ConfigMap", "lane-router-profile")["data"]["profile.yaml"]
    return parse_profile(yaml.safe_load(text))


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_valid_against_the_kubernetes_schemas(version: str) -> None:
    # The GPU and CPU renderings differ only in their pools: each distinct object is checked once.
    unique = {json.dumps(d, sort_keys=True): d for device in ("gpu", "cpu") for d in manifests(device=device)}
    assert len(unique) == 16 + 3 + 4  # + Redis; the CPU pools differ
    for doc in unique.values():
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_can_fail() -> None:
    deployment = copy.deepcopy(one(manifests(), "Deployment", "lane-router"))
    container(deployment)["livenesProbe"] = container(deployment).pop("livenessProbe")

    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_the_router_runs_replicated_with_probes_disruption_budget_and_autoscaler() -> None:
    docs = manifests()
    deployment = one(docs, "Deployment", "lane-router")
    router = container(deployment)
    selector = deployment["spec"]["selector"]["matchLabels"]

    assert deployment["spec"]["replicas"] >= 2
    assert selects(selector, pod_labels(deployment))
    assert router["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert router["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert [p["name"] for p in router["ports"]] == ["http"]
    pdb = one(docs, "PodDisruptionBudget", "lane-router")
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert 1 <= pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    hpa = one(docs, "HorizontalPodAutoscaler", "lane-router")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "lane-router",
    }
    assert hpa["spec"]["minReplicas"] == deployment["spec"]["replicas"] < hpa["spec"]["maxReplicas"]
    for name in ("lane-router", "lane-router-pods"):
        service = one(docs, "Service", name)
        assert service["spec"]["selector"] == selector
        assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_fewer_than_two_router_replicas_are_refused() -> None:
    with pytest.raises(RenderError, match="at least 2 replicas"):
        render_k8s(example(), K8sOptions(router_replicas=1))


def test_the_router_reads_the_profile_from_the_config_map() -> None:
    docs = manifests()
    deployment = one(docs, "Deployment", "lane-router")
    router = container(deployment)
    env = {e["name"]: e.get("value") for e in router["env"]}
    [mount] = [m for m in router["volumeMounts"] if m["name"] == "profile"]
    [volume] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "profile"]

    assert volume["configMap"]["name"] == "lane-router-profile"
    assert env["LANE_ROUTER_CONFIG"] == f"{mount['mountPath']}/profile.yaml"
    assert env["LANE_ROUTER_HOST"] == "0.0.0.0"
    assert mount["readOnly"] is True


def test_secrets_hold_every_variable_the_profile_names_and_nothing_real() -> None:
    profile = example()
    docs = manifests(profile)
    secret = one(docs, "Secret", "lane-router-secrets")
    router_env = {e["name"]: e for e in container(one(docs, "Deployment", "lane-router"))["env"]}

    names = set(router_secret_envs(profile, plan_pools(profile, "gpu")))
    assert names == {k.sha256_env for k in profile.keys} | {
        p.upstream_api_key_env for p in profile.pools.values()
    }
    assert set(secret["stringData"]) == names
    assert all(v.startswith("REPLACE") for v in secret["stringData"].values())
    for name in names:
        assert router_env[name]["valueFrom"]["secretKeyRef"] == {"name": "lane-router-secrets", "key": name}


def test_pool_backends_are_the_pool_pods() -> None:
    source = example()
    docs = manifests(source)
    profile = deployed_profile(docs)
    headless = {
        s["metadata"]["name"]: s for s in kind(docs, "Service") if s["spec"].get("clusterIP") == "None"
    }

    for name, pool in profile.pools.items():
        urls = [str(u) for u in pool.backends]
        [sts] = [
            s
            for s in kind(docs, "StatefulSet")
            if s["metadata"]["labels"]["lane-router/pool"] == f"vllm-{name}"
        ]
        service = headless[sts["spec"]["serviceName"]]
        port = service["spec"]["ports"][0]["port"]
        assert sts["spec"]["replicas"] == len(source.pools[name].backends)
        assert urls == [
            f"http://{sts['metadata']['name']}-{i}.{service['metadata']['name']}:{port}/"
            for i in range(sts["spec"]["replicas"])
        ]
        assert selects(service["spec"]["selector"], pod_labels(sts))
        assert selects(sts["spec"]["selector"]["matchLabels"], pod_labels(sts))
        vllm = container(sts)
        assert [p["containerPort"] for p in vllm["ports"] if p["name"] == "http"] == [port]
        assert vllm["args"][vllm["args"].index("--port") + 1] == str(port)
    assert profile.lanes == source.lanes and profile.keys == source.keys


def test_pool_servers_get_their_pool_key_and_model() -> None:
    profile = example()
    for sts in kind(manifests(profile), "StatefulSet"):
        pool = profile.pools[sts["metadata"]["labels"]["lane-router/pool"].removeprefix("vllm-")]
        vllm = container(sts)
        env = {e["name"]: e for e in vllm["env"]}
        [model_var] = [a[2:-1] for a in vllm["args"] if a.startswith("$(")]

        assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == pool.upstream_api_key_env
        assert env[model_var]["value"] == pool.model  # Kubernetes expands only variables it defines
        assert vllm["args"][vllm["args"].index("--served-model-name") + 1] == pool.model
        assert vllm["startupProbe"]["httpGet"]["path"] == "/health"


def test_gpu_pools_ask_for_every_accelerator_they_use() -> None:
    docs = manifests(cfg(small(bulk={"vllm": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}})))
    gpus = {
        s["metadata"]["name"]: container(s)["resources"]["limits"]["nvidia.com/gpu"]
        for s in kind(docs, "StatefulSet")
    }

    assert gpus == {"vllm-chat": "1", "vllm-bulk": "4"}
    assert {container(s)["image"] for s in kind(docs, "StatefulSet")} == {"vllm/vllm-openai:v0.32.0"}


def test_cpu_pools_run_the_cpu_image_as_non_root() -> None:
    for sts in kind(manifests(device="cpu"), "StatefulSet"):
        vllm = container(sts)
        assert vllm["image"] == "lane-router-vllm-cpu:0.32.0"
        assert vllm["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
        assert "nvidia.com/gpu" not in vllm["resources"]["limits"]
        assert sts["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
        assert "--gpu-memory-utilization" not in vllm["args"]


def test_only_router_pods_may_reach_the_pools() -> None:
    docs = manifests()
    policy = one(docs, "NetworkPolicy", "vllm-pools-from-router-only")
    router_pods = pod_labels(one(docs, "Deployment", "lane-router"))
    pool_pods = [pod_labels(s) for s in kind(docs, "StatefulSet")]
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


def test_the_router_refuses_to_start_on_the_key_hash_placeholders() -> None:
    docs = manifests()
    placeholders = one(docs, "Secret", "lane-router-secrets")["stringData"]
    profile = deployed_profile(docs)
    [first, *_] = profile.keys

    with pytest.raises(ValueError, match=f"key {first.name!r}: no valid sha256"):
        build_keys(profile.keys, placeholders)


def test_a_key_hash_placeholder_hashed_instead_of_replaced_is_refused_too() -> None:
    placeholders = one(manifests(), "Secret", "lane-router-secrets")["stringData"]
    profile = deployed_profile(manifests())
    environ = {name: hash_key(value) for name, value in placeholders.items()}

    issues = key_issues(profile.keys, environ)

    assert [i.path for i in issues] == [f"keys[{i}].sha256_env" for i in range(len(profile.keys))]
    assert all("a placeholder" in i.message for i in issues)


def test_only_router_pods_may_reach_the_shared_state() -> None:
    docs = manifests()
    redis = one(docs, "Deployment", "lane-router-redis")
    service = one(docs, "Service", "lane-router-redis")
    policy = one(docs, "NetworkPolicy", "redis-from-router-only")
    router_pods = pod_labels(one(docs, "Deployment", "lane-router"))
    others = [pod_labels(s) for s in kind(docs, "StatefulSet")]

    assert deployed_profile(docs).state.redis_url == "redis://lane-router-redis:6379/0"
    assert selects(service["spec"]["selector"], pod_labels(redis))
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels(redis))
    [rule] = policy["spec"]["ingress"]
    [source] = rule["from"]
    assert selects(source["podSelector"]["matchLabels"], router_pods)
    assert not any(selects(source["podSelector"]["matchLabels"], labels) for labels in others)
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    assert redis["spec"]["replicas"] == 1 and container(redis)["securityContext"]["readOnlyRootFilesystem"]


def test_an_external_redis_url_is_a_router_secret() -> None:
    data = small()
    data["state"] = {"redis_url_env": "LR_REDIS_URL"}
    docs = render_k8s(cfg(data)).documents

    assert not [d for d in docs if d["metadata"]["name"] == "lane-router-redis"]
    secret = one(list(docs), "Secret", "lane-router-secrets")["stringData"]
    assert secret["LR_REDIS_URL"].startswith("REPLACE with the shared-state Redis URL")
    env = {e["name"]: e for e in container(one(list(docs), "Deployment", "lane-router"))["env"]}
    assert env["LR_REDIS_URL"]["valueFrom"]["secretKeyRef"]["key"] == "LR_REDIS_URL"
