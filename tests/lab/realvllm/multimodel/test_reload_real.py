"""A reload that removes a model: its requests are 404 at once, while a stream of the other
model, begun before the reload, runs to its last token on the real server."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.lab.realvllm.multimodel.front import chat, http
from tests.lab.realvllm.multimodel.profile import MODEL_A, MODEL_B, TwoModels
from tests.lab.realvllm.realrouter import real_router

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

# Long enough to be still running while the test reloads and asks again (≈4 s on this host);
# the stream's first event came before the reload either way.
STREAM_TOKENS = 1500


def without_second_model(profile: dict[str, Any]) -> dict[str, Any]:
    reduced = copy.deepcopy(profile)
    del reduced["pools"]["b"]
    del reduced["models"]
    reduced["keys"] = [k for k in reduced["keys"] if MODEL_B not in k.get("models", ())]
    return reduced


async def test_a_reload_removing_a_model_refuses_it_at_once_and_keeps_other_streams(
    two_models: TwoModels, tmp_path: Path
) -> None:
    full = two_models.profile()
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(full))
    body = chat(MODEL_A, "Tell me a story.", STREAM_TOKENS, stream=True, ignore_eos=True,
                stream_options={"include_usage": True})  # fmt: skip
    async with real_router(full, config_path=path) as front:
        await front.settled()
        async with http(front) as client, http(front) as other:
            assert (await other.post("/v1/chat/completions", json=chat(MODEL_B))).status_code == 200
            async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                assert stream.status_code == 200
                lines = stream.aiter_lines()
                first = await anext(lines)
                assert first.startswith("data: {"), first
                path.write_text(yaml.safe_dump(without_second_model(full)))
                outcome = await front.state.reload("test")
                assert outcome.ok, outcome.reason
                gone = await other.post("/v1/chat/completions", json=chat(MODEL_B))
                assert gone.status_code == 404, gone.text
                assert gone.json()["error"]["code"] == "model_not_found"
                assert (await other.post("/v1/chat/completions", json=chat(MODEL_A))).status_code == 200
                events = [first] + [line async for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    usage = orjson.loads(events[-2].removeprefix("data: "))["usage"]
    assert usage["completion_tokens"] == STREAM_TOKENS
