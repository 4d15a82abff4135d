"""`--autoscale` and `--prometheus-pods` as an operator writes them: what is accepted, and the
reason a malformed one is refused."""

from __future__ import annotations

import pytest

from router.deploy.k8s_options import Autoscaler, Scraper, parse_autoscaler, parse_scraper


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("interactive=hpa:2-6", Autoscaler("interactive", "hpa", 2, 6, 4.0)),
        ("batch=keda:1-4:8", Autoscaler("batch", "keda", 1, 4, 8.0)),
        (" rag.v2=keda:3-3:0.5 ", Autoscaler("rag.v2", "keda", 3, 3, 0.5)),
    ],
)
def test_an_autoscaler_names_its_pool_kind_range_and_target(text: str, parsed: Autoscaler) -> None:
    assert parse_autoscaler(text) == parsed


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("interactive:hpa:2-6", "expected POOL=hpa:MIN-MAX"),
        ("interactive=hpa:2", "expected POOL=hpa:MIN-MAX"),
        ("interactive=vpa:2-6", "autoscaler 'vpa' is neither hpa nor keda"),
        ("interactive=hpa:0-6", "need 1 ≤ MIN ≤ MAX"),
        ("interactive=hpa:6-2", "need 1 ≤ MIN ≤ MAX"),
        ("interactive=keda:1-2:0", "WAITING must be a positive number, not '0'"),
        ("interactive=keda:1-2:many", "WAITING must be a positive number, not 'many'"),
        ("interactive=keda:1-2:inf", "WAITING must be a positive number"),
    ],
)
def test_a_malformed_autoscaler_is_refused_with_its_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_autoscaler(text)


def test_prometheus_pods_are_a_namespace_and_labels() -> None:
    assert parse_scraper("monitoring:app=prometheus,team=obs") == Scraper(
        "monitoring", (("app", "prometheus"), ("team", "obs"))
    )
    assert parse_scraper("obs:app.kubernetes.io/name=prometheus") == Scraper("obs")


@pytest.mark.parametrize("text", ["monitoring", "monitoring:", "Monitoring:app=p", "monitoring:app"])
def test_malformed_prometheus_pods_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected NAMESPACE:LABEL=VALUE"):
        parse_scraper(text)
