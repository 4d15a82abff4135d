"""The documented metric families are exposed with bounded labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Stack
from tests.support.fakebackend import Behaviour
from tests.support.profiles import MODEL, auth

DOCUMENTED = {
    "lane_router_requests": "counter",
    "lane_router_time_to_first_token_seconds": "histogram",
    "lane_router_inter_token_latency_seconds": "histogram",
    "lane_router_request_duration_seconds": "histogram",
    "lane_router_queue_time_seconds": "histogram",
    "lane_router_in_flight": "gauge",
    "lane_router_backend_up": "gauge",
    "lane_router_upstream_errors": "counter",
    "lane_router_retries": "counter",
    "lane_router_rejected": "counter",
    "lane_router_client_disconnects": "counter",
    "lane_router_slow_clients": "counter",
    "lane_router_stream_buffer_bytes": "gauge",
    "lane_router_prefix_affinity_hits": "counter",
    "lane_router_precise_prefix_estimated": "counter",
    "lane_router_kv_events_connected": "gauge",
    "lane_router_kv_events_blocks": "gauge",
    "lane_router_kv_events_batches": "counter",
    "lane_router_kv_events_gaps": "counter",
    "lane_router_kv_events_resets": "counter",
    "lane_router_kv_events_malformed": "counter",
    "lane_router_config_reloads": "counter",
    "lane_router_auth_failures": "counter",
}
ALLOWED_LABELS = {"class", "lane", "pool", "backend", "status", "reason", "phase", "result", "le"}


async def test_documented_families_exist_with_bounded_labels(stack: Stack) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    for b in stack.backends:
        b.behaviour = Behaviour(tokens=6, itl_s=0.01)  # paced, so each token is its own chunk
    async with stack.client() as client:
        for _ in range(3):
            await client.post("/v1/chat/completions", json=body, headers=auth("user"))
        await client.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer bad"})
        await client.post("/v1/chat/completions", content=b"{", headers=auth("user"))
        text = (await client.get("/metrics", headers=auth("scraper"))).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind in DOCUMENTED.items():
        assert name in families, name
        assert families[name].type == kind, name
    labels = {k for f in families.values() for s in f.samples for k in s.labels}
    assert labels <= ALLOWED_LABELS
    requests = [s for s in families["lane_router_requests"].samples if s.name.endswith("_total")]
    assert sum(s.value for s in requests if s.labels["status"] == "200") == 3
    ttft = families["lane_router_time_to_first_token_seconds"].samples
    assert any(s.name.endswith("_count") and s.value == 3 for s in ttft)
    itl = families["lane_router_inter_token_latency_seconds"].samples
    assert sum(s.value for s in itl if s.name.endswith("_count")) >= 3 * 4
    auth_failures = families["lane_router_auth_failures"].samples
    assert any(s.labels.get("reason") == "invalid_api_key" and s.value == 1 for s in auth_failures)
    rejected = families["lane_router_rejected"].samples
    assert any(s.labels.get("reason") == "invalid_json" for s in rejected)
