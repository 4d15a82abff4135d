"""Kubernetes manifests: valid against the API schemas, placed in one namespace, the router
replicated and reading its profile and secrets, and the shared state reachable from router pods
only. The pools: tests/deploy/test_k8s_pools.py; their autoscalers: test_k8s_autoscale.py."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes_validate
import pytest

from router.config.render import RenderError
from router.deploy.plan import plan_pools, router_secret_envs
from router.deploy.render_k8s import K8sOptions, render_k8s
from router.keys.auth import build_keys, hash_key
from router.keys.hygiene import key_issues
from tests.deploy.k8s import container, deployed_profile, kind, manifests, one, pod_labels, pools, selects
from tests.deploy.samples import cfg, example, example_data, small
from tests.deploy.tools import K8S_VERSIONS

SCALED = ("interactive=hpa:2-6", "batch=keda:1-4:8")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_valid_against_the_kubernetes_schemas(version: str) -> None:
    # The GPU and CPU renderings differ only in their pools: each distinct object is checked once.
    unique = {json.dumps(d, sort_keys=True): d for device in ("gpu", "cpu") for d in manifests(device=device)}
    assert len(unique) == 16 + 3 + 4  # + Redis; the CPU pools differ
    # Autoscaled: two Deployments without replicas, an HPA, the scrape policy (KEDA's ScaledObject
    # is no core kind: tests/deploy/test_k8s_autoscale.py checks it against its own schema).
    scaled = [d for d in manifests(None, *SCALED) if d["kind"] != "ScaledObject"]
    unique |= {json.dumps(d, sort_keys=True): d for d in scaled}
    assert len(unique) == 16 + 3 + 4 + 4
    for doc in unique.values():
        kubernetes_validate.validate(doc, version, strict=True)


def test_every_object_is_in_the_namespace_the_profile_names() -> None:
    docs = manifests(None, *SCALED, namespace="llm", cluster_domain="k8s.example")

    assert {d["metadata"]["namespace"] for d in docs} == {"llm"}
    dns = {p.discovery.dns for p in deployed_profile(docs).pools.values() if p.discovery}
    assert dns == {f"vllm-{name}.llm.svc.k8s.example" for name in example().pools}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"namespace": "LLM"}, "namespace 'LLM' is not a DNS label"),
        ({"namespace": "a" * 64}, "is not a DNS label"),
        ({"cluster_domain": "cluster.local."}, "is not a DNS name"),
        ({"router_replicas": 1}, "at least 2 replicas"),
    ],
)
def test_names_objects_are_found_by_must_be_valid(options: dict[str, Any], message: str) -> None:
    with pytest.raises(RenderError, match=message):
        render_k8s(example(), K8sOptions(**options))


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


@pytest.mark.parametrize("replicas", [None, 2, 3])
def test_the_router_runs_as_many_replicas_as_its_profile_assumes(replicas: int | None) -> None:
    data = example_data()
    if replicas is not None:
        data["replicas"] = replicas
    docs = manifests(cfg(data))
    deployment = one(docs, "Deployment", "lane-router")
    hpa = one(docs, "HorizontalPodAutoscaler", "lane-router")

    running = max(2, replicas or 1)
    assert deployment["spec"]["replicas"] == hpa["spec"]["minReplicas"] == running
    assert deployed_profile(docs).replicas == running  # each router's part is limit // running
    assert hpa["spec"]["maxReplicas"] == 10


def test_without_shared_state_the_router_count_is_fixed() -> None:
    # Each router enforces limit // replicas for ever: an autoscaler would multiply the limits.
    docs = manifests(cfg(small()))

    assert one(docs, "Deployment", "lane-router")["spec"]["replicas"] == 2
    assert deployed_profile(docs).replicas == 2
    assert kind(docs, "HorizontalPodAutoscaler") == []


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
    others = [pod_labels(d) for d in pools(docs).values()]

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


def exactness_note(notes: tuple[str, ...]) -> str:
    [note] = [n for n in notes if n.startswith("Limits hold exactly across router replicas")]
    return note


def test_limits_are_exact_across_replicas_only_with_shared_state_and_the_notes_say_so() -> None:
    shared = render_k8s(example())
    alone = render_k8s(cfg(small()))

    assert deployed_profile(list(shared.documents)).state.shared
    assert "max_in_flight" in exactness_note(shared.notes)
    assert exactness_note(shared.notes).endswith("which this profile has.")
    assert not deployed_profile(list(alone.documents)).state.shared
    assert "each replica counts alone" in exactness_note(alone.notes)
