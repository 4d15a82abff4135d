"""A lane's plain settings follow its config and its pool's through reloads: the lane is the
same object, and what its requests read is the new profile's."""

from __future__ import annotations

from router.config.load import parse_profile
from router.config.models import RequestClass
from router.observe.metrics import Metrics
from router.state.runtime import build_runtime
from tests.support.profiles import MODEL, profile


def test_a_reload_gives_the_kept_lane_its_new_settings() -> None:
    data = profile(["http://127.0.0.1:9100"])
    metrics = Metrics()
    first = build_runtime(parse_profile(data), metrics)
    chat = first.lanes[RequestClass.CHAT]
    before = chat.settings
    assert (before.decouple, before.max_output_tokens, before.shaped, before.affinity) == (
        False,
        None,
        False,
        False,
    )
    assert before.models == frozenset({MODEL})
    assert first.lanes[RequestClass.RAG].settings.affinity

    data["lanes"]["chat"] |= {"decouple": True, "max_output_tokens": 64, "priority": 3}
    data["pools"]["interactive"]["aliases"] = ["other-name"]
    data["pools"]["interactive"]["vllm"] |= {"max_model_len": 1024, "scheduling_policy": "priority"}
    second = build_runtime(parse_profile(data), metrics, previous=first)

    assert second.lanes[RequestClass.CHAT] is chat
    after = chat.settings
    assert (after.decouple, after.max_output_tokens, after.shaped, after.priority) == (True, 64, True, 3)
    assert after.models == frozenset({MODEL, "other-name"})
    assert (after.max_model_len, after.by_priority) == (1024, True)
