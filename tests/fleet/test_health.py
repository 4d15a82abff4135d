"""Backends leave rotation when they fail and come back when they recover; a probe of a backend
answering too much or too slowly fails."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
import pytest

from router.config.load import parse_profile
from router.fleet.backend import Backend, Health
from router.fleet.health import HealthChecker
from router.observe.metrics import Metrics
from router.state.runtime import build_runtime
from tests.conftest import Stack
from tests.proxy.rawserver import Handler, Page, dribble, pages, raw_servers
from tests.support.profiles import MODEL, auth, profile

WHOLE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def _until_health(stack: Stack, index: int, state: Health) -> None:
    backend = stack.state.runtime.pools["interactive"].backends[index]
    async with asyncio.timeout(5):
        while backend.health is not state:
            await asyncio.sleep(0.02)


async def test_failing_probe_ejects_and_recovery_readmits(stack: Stack) -> None:
    await _until_health(stack, 0, Health.UP)
    stack.backends[0].healthy = False
    await _until_health(stack, 0, Health.DOWN)
    async with stack.client() as client:
        for _ in range(6):
            assert (
                await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
            ).status_code == 200
        assert len(stack.backends[0].seen) == 0 and len(stack.backends[1].seen) == 6
        assert (await client.get("/ready")).status_code == 200
        metrics = (await client.get("/metrics", headers=auth("ops"))).text
        assert (
            f'lane_router_backend_up{{backend="{stack.backend_urls[0]}",pool="interactive"}} 0.0' in metrics
        )

        stack.backends[0].healthy = True
        await _until_health(stack, 0, Health.UP)
        for _ in range(6):
            assert (
                await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
            ).status_code == 200
        assert len(stack.backends[0].seen) > 0


async def test_ready_is_503_when_a_lane_has_no_healthy_backend_and_requests_get_503(stack: Stack) -> None:
    await _until_health(stack, 0, Health.UP)
    for b in stack.backends:
        b.healthy = False
    await _until_health(stack, 0, Health.DOWN)
    await _until_health(stack, 1, Health.DOWN)
    async with stack.client() as client:
        ready = await client.get("/ready")
        resp = await client.post("/v1/chat/completions", json=WHOLE, headers=auth("user"))
    assert ready.status_code == 503 and ready.json() == {"status": "not_ready"}
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_healthy_backend"
    assert int(resp.headers["retry-after"]) >= 1
    assert stack.forwarded() == 0


def _answer(body: bytes, *fields: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(f + b"\r\n" for f in fields)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def _probed(handler: Handler, *, check_drift: bool = False) -> tuple[Backend, float]:
    """One probe round of a backend served by `handler` (probe timeout 0.5 s); the backend's
    state after it and how long the round took."""
    async with raw_servers() as start:
        server = await start(handler)
        runtime = build_runtime(parse_profile(profile([server.origin])), Metrics())
        checker = HealthChecker(lambda: runtime, runtime.metrics)
        started = time.monotonic()
        try:
            await asyncio.wait_for(checker.probe_all(runtime, check_drift=check_drift), 10)
        finally:
            await checker.stop()
        return runtime.pools["interactive"].backends[0], time.monotonic() - started


async def _dribbled_health(writer: asyncio.StreamWriter) -> None:
    await dribble(writer, _answer(b"{}"))


HUGE_FIELD = b"X-Big: " + b"a" * (1024 * 1024)


@pytest.mark.parametrize(
    ("health", "ok"),
    [
        (_answer(b"{}"), True),
        # httpcore gives h11 a 100 KiB bound on an incomplete response head.
        (_answer(b"{}", HUGE_FIELD), False),
        (_answer(b"{}", *(b"X-F%d: v" % i for i in range(20_000))), False),
        (_answer(b" " * (64 * 1024 + 1)), False),
        (_answer(b"{}", b"Content-Encoding: gzip"), False),
        (_dribbled_health, False),
    ],
    ids=["plain", "1MB-head-field", "20000-fields", "body-over-64KiB", "compressed", "dribbled"],
)
async def test_a_probe_fails_on_a_response_too_large_or_too_slow(health: Page, ok: bool) -> None:
    backend, took = await _probed(pages({b"/health": health}))
    if ok:
        assert backend.health is Health.UP
    else:
        assert backend.health is not Health.UP and backend.consecutive_failures == 1
    assert took < 0.5 + 1.0  # the probe's timeout bounds the whole GET, not each read


@pytest.mark.parametrize(("padding", "drift"), [(0, True), (1024 * 1024, False)])
async def test_a_models_page_over_its_cap_is_not_read(padding: int, drift: bool) -> None:
    models = orjson.dumps({"data": [{"id": "another-model", "pad": " " * padding}]})
    answers: dict[bytes, Page] = {
        b"/health": _answer(b"{}"),
        b"/version": _answer(orjson.dumps({"version": "0.32.0"})),
        b"/v1/models": _answer(models),
    }
    backend, _ = await _probed(pages(answers), check_drift=True)
    assert backend.health is Health.UP
    # Read, the page shows the pool's model missing; over its cap it is no answer at all.
    assert any(finding.startswith("model:") for finding in backend.drift) is drift


async def test_a_probe_logs_nothing_at_info_and_a_health_change_still_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    answers: dict[bytes, Page] = {
        b"/health": _answer(b"{}"),
        b"/version": _answer(orjson.dumps({"version": "0.32.0"})),
        b"/v1/models": _answer(orjson.dumps({"data": [{"id": MODEL, "max_model_len": 2048}]})),
    }
    backend, _ = await _probed(pages(answers), check_drift=True)
    assert backend.health is Health.UP
    assert [r.getMessage() for r in caplog.records if r.name.startswith(("httpx", "httpcore"))] == []
    assert [r.levelno for r in caplog.records if "is now up" in r.getMessage()] == [logging.WARNING]


async def test_probe_lines_show_at_debug_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    backend, _ = await _probed(pages({b"/health": _answer(b"{}")}))
    assert backend.health is Health.UP
    lines = [r for r in caplog.records if r.name == "httpx" and "/health" in r.getMessage()]
    assert lines and {r.levelno for r in lines} == {logging.DEBUG}
