"""Reading rendered Kubernetes objects in the deployment tests: rendering, finding objects,
selector matching, and the profile the router gets from its ConfigMap."""

from __future__ import annotations

from typing import Any

import yaml

from router.config.load import parse_profile
from router.config.models import ProfileConfig
from router.deploy.k8s_options import K8sOptions, parse_autoscaler
from router.deploy.render_k8s import render_k8s
from tests.deploy.samples import example

Doc = dict[str, Any]


def manifests(profile: ProfileConfig | None = None, *autoscale: str, **options: Any) -> list[Doc]:
    """The rendered objects; `autoscale` as on the command line (`POOL=hpa:MIN-MAX[:WAITING]`)."""
    scalers = tuple(parse_autoscaler(a) for a in autoscale)
    return list(render_k8s(profile or example(), K8sOptions(autoscalers=scalers, **options)).documents)


def kind(docs: list[Doc], kind_: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind_]


def one(docs: list[Doc], kind_: str, name: str) -> Doc:
    [found] = [d for d in kind(docs, kind_) if d["metadata"]["name"] == name]
    return found


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def selects_expressions(selector: Doc, labels: dict[str, str]) -> bool:
    """A full label selector: matchLabels and `In` expressions."""
    for rule in selector.get("matchExpressions", []):
        assert rule["operator"] == "In", rule
        if labels.get(rule["key"]) not in rule["values"]:
            return False
    return selects(selector.get("matchLabels", {}), labels)


def pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def container(workload: Doc) -> Doc:
    [c] = workload["spec"]["template"]["spec"]["containers"]
    return c


def pools(docs: list[Doc]) -> dict[str, Doc]:
    """The pool Deployments by pool name."""
    return {
        d["metadata"]["labels"]["lane-router/pool"].removeprefix("vllm-"): d
        for d in kind(docs, "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "pool"
    }


def deployed_profile(docs: list[Doc]) -> ProfileConfig:
    text = one(docs, "ConfigMap", "lane-router-profile")["data"]["profile.yaml"]
    return parse_profile(yaml.safe_load(text))
