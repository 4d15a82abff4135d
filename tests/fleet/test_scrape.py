"""Backend load from vLLM's /metrics: parsing, storing with the in-flight count, live scraping."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from router.config.load import parse_profile
from router.fleet.scrape import LoadSample, LoadScraper, apply_sample, parse_vllm_load, scraped_pools
from router.observe.metrics import Metrics
from router.state.runtime import build_runtime
from tests.proxy.rawserver import Page, dribble, pages, raw_servers
from tests.support.profiles import profile

VLLM_V1 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7
vllm:num_requests_running_other{engine="0"} 99.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1234.0
"""


def test_engines_are_summed_and_kv_usage_averaged() -> None:
    sample = parse_vllm_load(VLLM_V1)

    assert sample is not None
    assert (sample.running, sample.waiting) == (5.0, 5.0)
    assert abs(sample.kv_usage - 0.6) < 1e-9


def test_older_kv_gauge_and_unlabelled_samples() -> None:
    text = (
        "vllm:num_requests_running 4\n"
        "vllm:num_requests_waiting 0\n"
        "vllm:gpu_cache_usage_perc 0.25 1700000000\n"
    )

    assert parse_vllm_load(text) == LoadSample(running=4.0, waiting=0.0, kv_usage=0.25)


def test_a_page_without_vllm_gauges_is_no_sample() -> None:
    assert parse_vllm_load("# nothing here\nprocess_cpu_seconds_total 3.0\n") is None
    assert parse_vllm_load('vllm:num_requests_running{engine="0"} not-a-number\n') is None


def _runtime(urls: list[str], balance: str = "power_of_two"):  # type: ignore[no-untyped-def]
    data = profile(urls)
    data["lanes"]["chat"]["balance"] = balance
    return build_runtime(parse_profile(data), Metrics())


def test_a_sample_is_stored_with_the_routers_in_flight_count() -> None:
    rt = _runtime(["http://127.0.0.1:9301"])
    backend = rt.pools["interactive"].backends[0]
    backend.in_flight = 2
    assert backend.load_score == 2.0  # unscraped: the router's own count

    apply_sample(backend, LoadSample(running=6, waiting=1, kv_usage=0.0))
    backend.in_flight = 3

    assert backend.scraped and backend.in_flight_at_scrape == 2
    assert backend.load_score == 6 + 1 + 1 + 1.0  # one sent since, one waiting (weighted twice)
    apply_sample(backend, None)
    assert not backend.scraped and backend.load_score == 3.0


def test_only_pools_with_a_power_of_two_lane_are_scraped() -> None:
    assert [p.name for p in scraped_pools(_runtime(["http://127.0.0.1:9302"]))] == ["interactive"]
    assert scraped_pools(_runtime(["http://127.0.0.1:9302"], balance="least_outstanding")) == []


async def test_an_unreachable_backend_loses_its_sample() -> None:
    rt = _runtime(["http://127.0.0.1:9"])
    backend = rt.pools["interactive"].backends[0]
    apply_sample(backend, LoadSample(1, 1, 0.1))
    scraper = LoadScraper(lambda: rt)
    try:
        await asyncio.wait_for(scraper.scrape(scraped_pools(rt), timeout=0.5), 5)
    finally:
        await scraper.stop()

    assert not backend.scraped


def _metrics_page(size: int) -> bytes:
    """VLLM_V1 padded with comment lines to `size` bytes."""
    filler = b"# " + b"x" * 1021 + b"\n"
    body = VLLM_V1.encode()
    return body + filler * ((size - len(body)) // len(filler))


def _framed(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body


async def _unframed_5mib(writer: asyncio.StreamWriter) -> None:
    """A body without a declared length, ending when the connection does: only counting the
    bytes as they arrive can stop it."""
    writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + _metrics_page(5 * 1024 * 1024))
    with contextlib.suppress(ConnectionError):
        await writer.drain()


async def _dribbled_metrics(writer: asyncio.StreamWriter) -> None:
    await dribble(writer, _framed(_metrics_page(0)))


@pytest.mark.parametrize(
    ("page", "sampled"),
    [
        (_framed(_metrics_page(1024 * 1024)), True),
        (_framed(_metrics_page(5 * 1024 * 1024)), False),
        (_unframed_5mib, False),
        (_dribbled_metrics, False),
    ],
    ids=["1MiB", "5MiB-declared", "5MiB-unframed", "dribbled"],
)
async def test_a_metrics_page_too_large_or_too_slow_is_no_sample(page: Page, sampled: bool) -> None:
    async with raw_servers() as start:
        server = await start(pages({b"/metrics": page}))
        rt = _runtime([server.origin])
        backend = rt.pools["interactive"].backends[0]
        apply_sample(backend, LoadSample(1, 1, 0.1))
        scraper = LoadScraper(lambda: rt)
        started = time.monotonic()
        try:
            await asyncio.wait_for(scraper.scrape(scraped_pools(rt), timeout=0.5), 10)
        finally:
            await scraper.stop()
    assert backend.scraped is sampled
    assert time.monotonic() - started < 0.5 + 1.0  # the timeout bounds the whole GET
