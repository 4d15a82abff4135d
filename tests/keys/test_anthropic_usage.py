"""Anthropic's usage (the Messages API) read for the key's token charge: input, cached input and
output, from a whole message or a stream's last `message_delta`."""

from __future__ import annotations

from router.keys.ratelimit import parse_usage
from tests.support.anthropicapi import event


def test_a_whole_messages_usage_with_its_cached_input() -> None:
    body = (
        b'{"id":"m","type":"message","content":[{"type":"text","text":"hi"}],'
        b'"usage":{"input_tokens":30,"output_tokens":7,"cache_read_input_tokens":100}}'
    )
    assert parse_usage(body) == 137


def test_a_streams_usage_is_its_last_message_delta() -> None:
    start = event("message_start", {"message": {"usage": {"input_tokens": 30, "output_tokens": 1}}})
    delta = event(
        "message_delta",
        {"delta": {"stop_reason": "end_turn"}, "usage": {"input_tokens": 30, "output_tokens": 12}},
    )
    assert parse_usage(start + delta + event("message_stop", {})) == 42
