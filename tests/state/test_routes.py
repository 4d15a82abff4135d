"""A runtime's model routes: every name a pool serves leads to its model's lanes, one per class,
and a lane is known across reloads by its name."""

from __future__ import annotations

from router.config.load import parse_profile
from router.config.models import ALL_CLASSES, RequestClass
from router.observe.metrics import Metrics
from router.state.runtime import build_runtime
from tests.support.profiles import CHAT_MODEL, EMBED_MODEL, RERANK_MODEL, multi_model_profile

URLS = ("http://127.0.0.1:9101", "http://127.0.0.1:9102", "http://127.0.0.1:9103", "http://127.0.0.1:9104")


def test_every_served_name_leads_to_its_models_lanes() -> None:
    rt = build_runtime(parse_profile(multi_model_profile(*URLS)), Metrics())

    assert set(rt.routes) == {CHAT_MODEL, "llama-chat", "sql-lora", EMBED_MODEL, RERANK_MODEL}
    chat = rt.routes[CHAT_MODEL]
    assert rt.routes["llama-chat"] is chat and rt.routes["sql-lora"] is chat
    assert chat.model == CHAT_MODEL and [p.name for p in chat.pools] == ["fast", "large"]
    assert chat.counter is rt.counters.get(CHAT_MODEL)  # each model its own (tokens of its tokenizer)
    assert chat.counter is not rt.routes[EMBED_MODEL].counter
    assert {cls: lane.pool.name for cls, lane in chat.lanes.items()} == {
        RequestClass.CHAT: "fast",
        RequestClass.RAG: "fast",
        RequestClass.AGENT: "fast",
        RequestClass.SLOW_STREAM: "fast",
        RequestClass.LONG_CONTEXT: "large",
        RequestClass.BATCH: "large",
    }
    assert [lane.name for lane in chat.lanes.values()] == [c.value for c in ALL_CLASSES]
    embed = rt.routes[EMBED_MODEL]
    assert {lane.name for lane in embed.lanes.values()} == {f"bge:{c.value}" for c in ALL_CLASSES}
    assert {lane.pool.name for lane in embed.lanes.values()} == {"embed"}
    assert all(lane.model == EMBED_MODEL and lane.cls is cls for cls, lane in embed.lanes.items())
    assert rt.lanes["bge:rag"] is embed.lanes[RequestClass.RAG]
    assert len(rt.lanes) == 3 * len(ALL_CLASSES)


def test_a_reload_keeps_each_lane_by_name_and_drops_a_removed_models() -> None:
    metrics = Metrics()
    first = build_runtime(parse_profile(multi_model_profile(*URLS)), metrics)
    data = multi_model_profile(*URLS)
    data["pools"].pop("embed")
    second = build_runtime(parse_profile(data), metrics, previous=first)

    assert second.lanes["chat"] is first.lanes["chat"]
    assert second.lanes["ranker:chat"] is first.lanes["ranker:chat"]
    assert EMBED_MODEL not in second.routes and not any(name.startswith("bge:") for name in second.lanes)


def test_a_lane_moved_to_another_model_keeps_its_counts_under_its_new_model() -> None:
    metrics = Metrics()
    first = build_runtime(parse_profile(multi_model_profile(*URLS[:3])), metrics)
    data = multi_model_profile(*URLS[:3])
    for pool in data["pools"].values():
        pool["model"] = "mistral" if pool["model"] == CHAT_MODEL else pool["model"]

    second = build_runtime(parse_profile(data), metrics, previous=first)

    assert second.lanes["chat"] is first.lanes["chat"] and second.lanes["chat"].model == "mistral"
    assert (
        CHAT_MODEL not in second.routes and second.routes["mistral"].lanes[RequestClass.CHAT].name == "chat"
    )
