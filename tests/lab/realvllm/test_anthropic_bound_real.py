"""The router's prompt bound of Anthropic Messages bodies against vLLM's own reading of them:
each body the router accepts is one vLLM's request model validates, and the router's count is
never below the count of the chat request vLLM's own converter builds from it (what vLLM
renders), counted as the router counts chat."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.request.anthropic import parse_messages
from router.request.facts import parse_facts
from router.request.tokens import make_counter
from tests.lab.realvllm.conftest import require_install

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
TOOL = {
    "name": "weather",
    "description": "The weather in a city. " * 4,
    "input_schema": {"properties": {"city": {"type": "string", "description": "東京 or Paris"}}},
}


def _body(messages: list[Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 64, "messages": messages, **fields}


BODIES = [
    _body([{"role": "user", "content": "hello"}]),
    _body(
        [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, IMAGE]}],
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": " Very."}],
    ),
    _body(
        [
            {"role": "user", "content": "weather in 東京? 🌧️"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should call the tool", "signature": "sig"},
                    {"type": "text", "text": "Calling it."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "東京\u0001"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "晴れ"}, IMAGE],
                    },
                    {"type": "text", "text": "and tomorrow?"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [{"type": "text", "text": "é\u200b"}],
                    }
                ],
            },
        ],
        tools=[TOOL],
        tool_choice={"type": "tool", "name": "weather"},
    ),
    _body(
        [
            {
                "role": "system",
                "content": [
                    {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": TOOL}},
                    {"type": "text", "text": "system, inline"},
                ],
            },
            {"role": "user", "content": "x"},
        ],
        output_config={"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}},
        chat_template_kwargs={"enable_thinking": False},
        thinking={"type": "adaptive"},
    ),
]


def test_the_routers_bound_covers_the_chat_request_vllm_builds(tmp_path: Path) -> None:
    install = require_install(())
    bodies, chats = tmp_path / "bodies.json", tmp_path / "chats.json"
    bodies.write_text(json.dumps(BODIES))
    script = Path(__file__).with_name("anthropic_convert.py")
    subprocess.run([str(install.python), str(script), str(bodies), str(chats)], check=True, timeout=240)
    counter = make_counter(None)
    for body, chat in zip(BODIES, json.loads(chats.read_text()), strict=True):
        ours = parse_messages("messages", orjson.dumps(body), counter).prompt_tokens
        theirs = parse_facts("chat", orjson.dumps({"model": "m", **chat}), counter).prompt_tokens
        assert ours >= theirs, (body, chat)
