"""Per-key limits: token buckets for requests and tokens, concurrency, refusals that cost nothing.
The pure limiter is checked through the memory store, which only holds its levels."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.errors import RateLimited
from router.keys.rateheaders import KeyRates, duration
from router.keys.rateheaders import refusal as key_refusal
from router.keys.ratelimit import (
    USAGE_TAIL_BYTES,
    Levels,
    Limits,
    MemoryRateStore,
    Verdict,
    charge,
    estimate_tokens,
    judge,
    parse_usage,
    refill,
    usage_at,
)


def rate_headers(verdict: Verdict, limits: Limits) -> list[tuple[bytes, bytes]]:
    """The OpenAI headers a verdict of a key with `limits` answers with."""
    out: list[tuple[bytes, bytes]] = []
    assert verdict.levels is not None
    KeyRates(limits).openai(out, verdict.levels)
    return out


def refusal(verdict: Verdict, limits: Limits) -> RateLimited:
    return key_refusal(verdict, KeyRates(limits))


async def test_requests_per_minute_allow_a_burst_then_pace() -> None:
    store, limits = MemoryRateStore(), Limits(rpm=3)
    verdicts = [await store.acquire("k", limits, 0, 0.0) for _ in range(4)]

    assert [v.allowed for v in verdicts] == [True, True, True, False]
    assert [v.remaining_requests for v in verdicts[:3]] == [2, 1, 0]
    refused = verdicts[3]
    assert refused.reason == "requests"
    assert refused.retry_after_s == pytest.approx(20.0)  # one request refills in 60/3 s
    assert not (await store.acquire("k", limits, 0, 19.0)).allowed
    assert (await store.acquire("k", limits, 0, 20.0)).allowed


async def test_tokens_per_minute_are_charged_the_estimate() -> None:
    store, limits = MemoryRateStore(), Limits(tpm=1000)

    first = await store.acquire("k", limits, 600, 0.0)
    second = await store.acquire("k", limits, 600, 0.0)

    assert first.allowed and first.remaining_tokens == 400
    assert not second.allowed and second.reason == "tokens"
    assert second.retry_after_s == pytest.approx((600 - 400) * 60 / 1000)


async def test_a_refused_request_consumes_no_quota() -> None:
    store, limits = MemoryRateStore(), Limits(rpm=10, tpm=1000)
    assert (await store.acquire("k", limits, 900, 0.0)).allowed

    refused = await store.acquire("k", limits, 500, 0.0)  # tokens short, requests fine

    assert not refused.allowed
    assert refused.remaining_requests == 9 and refused.remaining_tokens == 100
    after = await store.acquire("k", limits, 100, 0.0)
    assert after.allowed and after.remaining_requests == 8 and after.remaining_tokens == 0


async def test_a_request_larger_than_the_whole_minute_is_refused_as_too_large() -> None:
    verdict = await MemoryRateStore().acquire("k", Limits(tpm=100), 101, 0.0)

    assert not verdict.allowed and verdict.reason == "too_large"


async def test_concurrency_is_released_when_the_request_settles() -> None:
    store, limits = MemoryRateStore(), Limits(max_concurrency=2)
    assert (await store.acquire("k", limits, 0, 0.0)).allowed
    assert (await store.acquire("k", limits, 0, 0.0)).allowed
    refused = await store.acquire("k", limits, 0, 0.0)
    assert not refused.allowed and refused.reason == "concurrency"

    await store.settle("k", limits, 0, None, 0.1)

    assert (await store.acquire("k", limits, 0, 0.1)).allowed


async def test_actual_usage_corrects_the_estimate_both_ways() -> None:
    store, limits = MemoryRateStore(), Limits(tpm=1000)
    await store.acquire("k", limits, 500, 0.0)
    await store.settle("k", limits, 500, 100, 0.0)  # overestimated by 400: given back
    assert (await store.acquire("k", limits, 0, 0.0)).remaining_tokens == 900

    await store.acquire("k", limits, 100, 0.0)
    await store.settle("k", limits, 100, 1500, 0.0)  # underestimated: owed from what comes next
    blocked = await store.acquire("k", limits, 1, 0.0)
    assert not blocked.allowed and blocked.remaining_tokens == 0


async def test_refund_gives_back_request_and_tokens() -> None:
    store, limits = MemoryRateStore(), Limits(rpm=2, tpm=100, max_concurrency=1)
    await store.acquire("k", limits, 80, 0.0)

    await store.refund("k", limits, 80, 0.0)

    again = await store.acquire("k", limits, 80, 0.0)
    assert again.allowed and again.remaining_requests == 1 and again.remaining_tokens == 20


async def test_keys_have_separate_counters() -> None:
    store, limits = MemoryRateStore(), Limits(rpm=1)
    assert (await store.acquire("a", limits, 0, 0.0)).allowed
    assert (await store.acquire("b", limits, 0, 0.0)).allowed
    assert not (await store.acquire("a", limits, 0, 0.0)).allowed


async def test_refill_never_exceeds_one_minute_of_allowance() -> None:
    store, limits = MemoryRateStore(), Limits(rpm=2)
    await store.acquire("k", limits, 0, 0.0)

    assert (await store.acquire("k", limits, 0, 3600.0)).remaining_requests == 1


def test_estimate_is_the_prompt_plus_every_sequence_s_bound() -> None:
    assert estimate_tokens(100, 50) == 150
    assert estimate_tokens(100, 50, sequences=4) == 300
    assert estimate_tokens(100, None) == 100


async def test_refusal_is_a_429_with_retry_after_and_remaining_headers() -> None:
    store, limits = MemoryRateStore(), Limits(rpm=1, tpm=1000)
    await store.acquire("k", limits, 10, 0.0)
    err = refusal(await store.acquire("k", limits, 10, 0.0), limits)

    assert isinstance(err, RateLimited) and err.status == 429
    assert err.code == "rate_limit_requests"
    headers = dict(err.headers())
    assert headers[b"retry-after"] == b"60"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"990"


async def test_headers_only_for_configured_limits() -> None:
    limits = Limits(rpm=5)
    verdict = await MemoryRateStore().acquire("k", limits, 0, 0.0)
    assert rate_headers(verdict, limits) == [
        (b"x-ratelimit-limit-requests", b"5"),
        (b"x-ratelimit-remaining-requests", b"4"),
        (b"x-ratelimit-reset-requests", b"12s"),  # one request of 5 a minute
    ]


async def test_reset_headers_say_when_each_bucket_is_full_again() -> None:
    store, limits = MemoryRateStore(), Limits(rpm=120, tpm=6000)
    verdict = await store.acquire("k", limits, 1500, 0.0)
    headers = dict(rate_headers(verdict, limits))

    assert headers[b"x-ratelimit-limit-tokens"] == b"6000"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"4500"
    assert headers[b"x-ratelimit-reset-tokens"] == b"15s"  # 1500 tokens at 100 a second
    assert headers[b"x-ratelimit-reset-requests"] == b"500ms"  # one request at 2 a second
    later = await store.acquire("k", limits, 1500, 10.0)  # 1000 tokens refilled meanwhile
    assert dict(rate_headers(later, limits))[b"x-ratelimit-reset-tokens"] == b"20s"


async def test_a_refusal_retries_when_the_bucket_holds_enough_again() -> None:
    store, limits = MemoryRateStore(), Limits(tpm=6000)
    await store.acquire("k", limits, 5800, 0.0)
    refused = await store.acquire("k", limits, 500, 0.0)  # 300 short, at 100 tokens a second
    assert dict(refusal(refused, limits).headers())[b"retry-after"] == b"3"
    assert (await store.acquire("k", limits, 500, 3.0)).allowed


async def test_a_debt_longer_than_a_minute_is_told_a_minute() -> None:
    store, limits = MemoryRateStore(), Limits(tpm=600)
    await store.acquire("k", limits, 600, 0.0)
    await store.settle("k", limits, 600, 1800, 0.0)  # used three times its charge: -1200 left
    refused = await store.acquire("k", limits, 100, 0.0)
    assert refused.retry_after_s > 60.0
    assert dict(refusal(refused, limits).headers())[b"retry-after"] == b"60"


async def test_a_request_larger_than_the_limit_is_told_not_to_retry() -> None:
    limits = Limits(tpm=600)
    refused = await MemoryRateStore().acquire("k", limits, 601, 0.0)
    headers = dict(refusal(refused, limits).headers())
    assert headers[b"x-should-retry"] == b"false"
    store, once = MemoryRateStore(), Limits(rpm=1)
    await store.acquire("k", once, 1, 0.0)
    ordinary = await store.acquire("k", once, 1, 0.0)
    assert b"x-should-retry" not in dict(refusal(ordinary, once).headers())


def test_durations_are_written_as_openai_writes_them() -> None:
    assert [duration(s) for s in (0.0, 0.0204, 0.999, 1.0, 1.5, 59.5, 60.0, 360.0, 61.25)] == [
        b"0ms",
        b"21ms",
        b"999ms",
        b"1s",
        b"2s",
        b"1m0s",
        b"1m0s",
        b"6m0s",
        b"1m2s",
    ]


def test_usage_from_a_json_body_tail() -> None:
    body = orjson.dumps(
        {
            "choices": [{"message": {"content": "x" * 100}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42},
        }
    )
    assert parse_usage(body[-300:]) == 42


def test_usage_from_the_last_sse_event_and_without_a_total() -> None:
    events = (
        b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert parse_usage(events) == 12


def test_usage_is_looked_for_in_the_tails_last_bytes_only() -> None:
    report = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5}}\n\n'
    before = report + b"x" * USAGE_TAIL_BYTES
    assert usage_at(before) == -1 and parse_usage(before) is None
    within = b"x" * USAGE_TAIL_BYTES + report + b"x" * (USAGE_TAIL_BYTES - len(report))
    assert usage_at(within) == USAGE_TAIL_BYTES + report.index(b'"usage"')
    assert parse_usage(within) == 12 == parse_usage(within[-USAGE_TAIL_BYTES:])
    # A key cut by the window's start is not a key.
    cut = report[report.index(b'"usage"') + 1 :]
    assert parse_usage(b"{" + report + b"x" * (USAGE_TAIL_BYTES - len(cut))) is None


def test_no_usage_is_none() -> None:
    assert parse_usage(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n') is None
    assert parse_usage(b'{"usage": null}') is None


def test_the_pure_limiter_reports_what_remains_after_the_charge() -> None:
    limits = Limits(rpm=10, tpm=1000, max_concurrency=3)
    levels = Levels(requests=4.5, tokens=300.0, in_flight=2)

    verdict = judge(levels, limits, 200)

    assert verdict.allowed and verdict.remaining_requests == 3 and verdict.remaining_tokens == 100
    assert charge(levels, limits, 200) == Levels(3.5, 100.0, 3)
    full = judge(Levels(4.5, 300.0, 3), limits, 200)
    assert not full.allowed and full.reason == "concurrency"


def test_the_longest_wait_names_the_refusal() -> None:
    limits = Limits(rpm=60, tpm=600)
    # One request is 0.5 s away, the tokens 10 s away: the tokens are the reason.
    verdict = judge(Levels(requests=0.5, tokens=0.0), limits, 100)
    assert not verdict.allowed and verdict.reason == "tokens"
    assert verdict.retry_after_s == pytest.approx(10.0)


def test_refill_is_continuous_and_capped() -> None:
    limits = Limits(rpm=60, tpm=6000)
    assert refill(Levels(0.0, -600.0), limits, 1.5) == Levels(1.5, -450.0)
    assert refill(Levels(0.0, 0.0), limits, 3600) == Levels(60.0, 6000.0)
    assert refill(Levels(2.0, 5.0), Limits(), 100) == Levels(2.0, 5.0)  # no limit, no refill


# The usage report as JSON allows it, by regular expression: the scan parse_usage runs must
# read the same number from any text.
_REFERENCE = {
    name: re.compile(rb'"' + name + rb'"\s*:\s*(\d+)')
    for name in (b"total_tokens", b"prompt_tokens", b"completion_tokens")
}


def _reference_usage(tail: bytes) -> int | None:
    at = tail.rfind(b'"usage"')
    if at < 0:
        return None
    usage = tail[at:]
    total = _REFERENCE[b"total_tokens"].search(usage)
    if total is not None:
        return int(total.group(1))
    prompt = _REFERENCE[b"prompt_tokens"].search(usage)
    completion = _REFERENCE[b"completion_tokens"].search(usage)
    if prompt is None or completion is None:
        return None
    return int(prompt.group(1)) + int(completion.group(1))


_USAGE_PARTS = st.sampled_from(
    [
        b'"usage"',
        b'"total_tokens"',
        b'"prompt_tokens"',
        b'"completion_tokens"',
        b":",
        b" ",
        b"\t",
        b"\n",
        b"\x0b",
        b"\x0c",
        b"\r",
        b"0",
        b"7",
        b"42",
        b"-1",
        b",",
        b"{",
        b"}",
        b"null",
        b'"',
    ]
)


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.one_of(_USAGE_PARTS, st.binary(max_size=3)), max_size=24).map(b"".join))
def test_usage_is_read_as_the_json_grammar_reads_it(tail: bytes) -> None:
    assert parse_usage(tail) == _reference_usage(tail)


def test_usage_with_whitespace_around_the_colon_and_a_false_start() -> None:
    body = b'{"usage": {"total_tokens" x, "prompt_tokens" :\n 3, "completion_tokens"\t:9}}'
    assert parse_usage(body) == 12
    assert parse_usage(b'"usage" "total_tokens": , "total_tokens" : 5') == 5
