"""Trace context and tracing, end to end: a real `lane-router serve` process between a client and
a recording backend, and (when tracing is configured) a real OTLP/HTTP receiver on loopback.

Off, the router passes a client's valid `traceparent`/`tracestate` through unchanged and drops an
invalid one; on, it joins the client's trace (or starts one), sends the backend its upstream
span as the parent, and exports the request's spans, which carry no key and no prompt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fakebackend import FakeBackend
from tests.support.otlpreceiver import Receiver, Span, otlp_receiver
from tests.support.profiles import KEYS, MODEL, UPSTREAM_KEY, auth, profile
from tests.support.scaleout import router, write_profile
from tests.support.servers import server_group

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CLIENT_SPAN}-01"
TRACESTATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
PROMPT = "a confidential prompt about tigers"
REPO = Path(__file__).resolve().parents[2]


def body(stream: bool) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 4,
        "stream": stream,
    }
    if stream:
        request["stream_options"] = {"include_usage": True}
    return request


@pytest.fixture
async def backend() -> AsyncIterator[tuple[FakeBackend, str]]:
    fake = FakeBackend()
    async with server_group() as group:
        yield fake, await group.start(fake)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as r:
        yield r


def tracing_env(receiver: Receiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.url}/v1/traces",
        "OTEL_SERVICE_NAME": "lane-router-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export within 50 ms instead of 5 s
    }


async def post(url: str, stream: bool, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        return await http.post("/v1/chat/completions", json=body(stream), headers={**auth("user"), **headers})


async def test_without_tracing_the_clients_context_passes_unchanged_and_an_invalid_one_not_at_all(
    tmp_path: Path, backend: tuple[FakeBackend, str]
) -> None:
    fake, url = backend
    config = write_profile(tmp_path / "p.yaml", profile([url]))
    async with router(config) as r:
        ok = await post(r.url, False, traceparent=TRACEPARENT, tracestate=TRACESTATE)
        upper = await post(r.url, False, traceparent=TRACEPARENT.upper(), tracestate=TRACESTATE)
        zero = await post(r.url, True, traceparent=f"00-{'0' * 32}-{CLIENT_SPAN}-01")
        bad_state = await post(r.url, True, traceparent=TRACEPARENT, tracestate="Rojo=1")
        none = await post(r.url, False)
    assert [x.status_code for x in (ok, upper, zero, bad_state, none)] == [200] * 5
    sent = [s.headers for s in fake.seen]
    assert (sent[0]["traceparent"], sent[0]["tracestate"]) == (TRACEPARENT, TRACESTATE)
    for headers in (sent[1], sent[2], sent[4]):
        assert "traceparent" not in headers and "tracestate" not in headers
    assert sent[3]["traceparent"] == TRACEPARENT and "tracestate" not in sent[3]


def by_name(spans: list[Span]) -> dict[str, Span]:
    named = {s.name: s for s in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


def one_request(trace_id: str, spans: int) -> Any:
    return lambda found: sum(s.trace_id == trace_id for s in found) >= spans


async def test_with_tracing_the_backend_is_a_child_of_the_routers_upstream_span(
    tmp_path: Path, backend: tuple[FakeBackend, str], receiver: Receiver
) -> None:
    fake, url = backend
    config = write_profile(tmp_path / "p.yaml", profile([url]))
    async with router(config, **tracing_env(receiver)) as r:
        answer = await post(r.url, True, traceparent=TRACEPARENT, tracestate=TRACESTATE)
        assert answer.status_code == 200 and "[DONE]" in answer.text
        spans = receiver.wait_for(one_request(TRACE, 7))
    sent = fake.seen[0].headers
    version, trace_id, upstream_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE, "01")
    assert upstream_id != CLIENT_SPAN
    assert sent["tracestate"] == TRACESTATE

    named = by_name([s for s in spans if s.trace_id == TRACE])
    root = named["POST /v1/chat/completions"]
    assert root.service == "lane-router-test" and root.parent_id == CLIENT_SPAN
    assert root.kind == 2  # SERVER
    assert root.attributes["lane_router.class"] == "chat"
    assert root.attributes["lane_router.lane"] == "chat"
    assert root.attributes["lane_router.pool"] == "interactive"
    assert root.attributes["lane_router.backend"] == 0
    assert root.attributes["lane_router.retries"] == 0
    assert root.attributes["http.response.status_code"] == 200
    upstream = named["upstream"]
    assert upstream.span_id == upstream_id and upstream.parent_id == root.span_id
    assert upstream.kind == 3  # CLIENT
    for phase in ("auth_classify", "queue"):
        assert named[phase].parent_id == root.span_id
    for phase in ("upstream.connect", "upstream.first_byte", "upstream.stream"):
        assert named[phase].parent_id == upstream.span_id
    assert root.start_ns <= named["auth_classify"].start_ns <= named["queue"].start_ns
    assert named["queue"].end_ns <= upstream.start_ns <= named["upstream.stream"].start_ns <= root.end_ns

    exported = b"".join(receiver.bodies)
    for secret in (KEYS["user"], UPSTREAM_KEY, PROMPT, "tigers"):
        assert secret.encode() not in exported


async def test_with_tracing_and_no_client_context_the_router_starts_the_trace(
    tmp_path: Path, backend: tuple[FakeBackend, str], receiver: Receiver
) -> None:
    fake, url = backend
    config = write_profile(tmp_path / "p.yaml", profile([url]))
    env = {**tracing_env(receiver), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}  # the base form
    del env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    async with router(config, **env) as r:
        answer = await post(r.url, False)
        assert answer.status_code == 200
        refused = await post(r.url, False, authorization="Bearer wrong-key")
        assert refused.status_code == 401
        _, trace_id, upstream_id, flags = fake.seen[0].headers["traceparent"].split("-")
        spans = receiver.wait_for(lambda found: len({s.trace_id for s in found}) >= 2)
    assert flags == "01" and "tracestate" not in fake.seen[0].headers
    named = by_name([s for s in spans if s.trace_id == trace_id])
    assert named["POST /v1/chat/completions"].parent_id == ""
    assert named["upstream"].span_id == upstream_id
    assert named["upstream.stream"].parent_id == upstream_id
    # The refused request is a trace of its own: the request span and its auth phase, no upstream.
    (other,) = {s.trace_id for s in spans} - {trace_id}
    rejected = by_name(receiver.trace(other))
    assert set(rejected) == {"POST /v1/chat/completions", "auth_classify"}
    assert rejected["POST /v1/chat/completions"].attributes["http.response.status_code"] == 401
    assert rejected["POST /v1/chat/completions"].attributes["error.type"] == "invalid_api_key"


async def test_a_sampler_that_drops_everything_still_propagates_an_unsampled_context(
    tmp_path: Path, backend: tuple[FakeBackend, str], receiver: Receiver
) -> None:
    fake, url = backend
    config = write_profile(tmp_path / "p.yaml", profile([url]))
    env = {**tracing_env(receiver), "OTEL_TRACES_SAMPLER": "always_off"}
    async with router(config, **env) as r:
        assert (await post(r.url, False)).status_code == 200
    _, trace_id, _, flags = fake.seen[0].headers["traceparent"].split("-")
    assert flags == "00" and len(trace_id) == 32
    assert receiver.spans == []  # the router's shutdown flushed its exporter


# Builds the app as `lane-router serve` does and lists the tracing modules then loaded: the
# router's own, the SDK's tracing, the exporters, the protobuf messages. (redis-py 8 imports
# OpenTelemetry's metrics SDK by itself whenever it is installed; that is none of these.)
TRACING_MODULES = (
    "router.observe.otel",
    "opentelemetry.sdk.trace",
    "opentelemetry.exporter",
    "opentelemetry.proto",
)
LOADED = """
import json, sys
import router.server
built = {}
router.server.run = lambda app, settings, *rest: built.update(app=app)
from router.cli import main
code = main(["serve", "--config", sys.argv[1], "--port", "0", "--access-log", sys.argv[2]])
print(json.dumps({"code": code, "otel": sorted(m for m in sys.modules if m.startswith(tuple(sys.argv[3:])))}))
"""


def loaded_otel(config: Path, env: dict[str, str], log: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", LOADED, str(config), str(log), *TRACING_MODULES],
        capture_output=True, text=True, timeout=60, cwd=REPO, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["code"] == 0
    modules: list[str] = result["otel"]
    return modules


def test_tracing_off_imports_no_tracing_module(tmp_path: Path) -> None:
    config = write_profile(tmp_path / "p.yaml", profile(["http://127.0.0.1:9"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO)
    assert loaded_otel(config, env, tmp_path / "access.log") == []
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    on = loaded_otel(config, env, tmp_path / "access.log")
    assert "router.observe.otel" in on and "opentelemetry.sdk.trace" in on
    assert "opentelemetry.exporter.otlp.proto.http.trace_exporter" in on
