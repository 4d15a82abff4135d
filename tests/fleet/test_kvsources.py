"""Where the router subscribes to a backend's KV events: the pool's `kv_events` block, vLLM's
`GET /kv_event_sources` answer, and which pools follow their engines at all."""

from __future__ import annotations

from typing import Any

import pytest

from router.balance import BalanceSettings
from router.config.load import ConfigError, parse_profile
from router.config.models import KVEventsConfig, ProfileConfig
from router.fleet.kvsources import Publisher, configured, followed, listed
from tests.support.profiles import profile

VLLM_RANK = {
    "enable_kv_cache_events": True,
    "publisher": "zmq",
    "endpoint": "tcp://*:19757",
    "replay_endpoint": "tcp://*:19758",
    "buffer_steps": 10000,
    "hwm": 100000,
    "max_queue_size": 100000,
    "topic": "",
}


def parsed(**kv_events: Any) -> ProfileConfig:
    data = profile(["http://10.0.0.5:8000"], tokenizer="simulator")  # ids the router can work out
    data["lanes"]["chat"]["balance"] = "precise_prefix"
    if kv_events:
        data["pools"]["interactive"]["kv_events"] = kv_events
    return parse_profile(data)


def balances(cfg: ProfileConfig, pool: str) -> list[BalanceSettings]:
    return [lane.balance for lane in cfg.lanes.values() if lane.pool == pool]


def test_a_pool_with_a_precise_prefix_lane_discovers_its_publishers_by_default() -> None:
    cfg = parsed()
    found = followed(cfg.pools["interactive"], balances(cfg, "interactive"))
    assert found is not None and found.discovers
    plain = parse_profile(profile(["http://10.0.0.5:8000"]))
    assert followed(plain.pools["interactive"], balances(plain, "interactive")) is None
    asked = plain.pools["interactive"].model_copy(update={"kv_events": KVEventsConfig(follow=True)})
    assert followed(asked, balances(plain, "interactive")) is not None
    off = parsed(follow=False)
    assert followed(off.pools["interactive"], balances(off, "interactive")) is None


def test_ports_are_on_the_backends_host_one_per_data_parallel_rank() -> None:
    cfg = KVEventsConfig(port=5557, replay_port=5600, data_parallel_size=2)
    assert configured("http://10.0.0.5:8000", cfg) == (
        Publisher("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5600"),
        Publisher("tcp://10.0.0.5:5558", "tcp://10.0.0.5:5601"),
    )
    assert configured("http://[fd00::5]:8000", KVEventsConfig(port=5557)) == (
        Publisher("tcp://[fd00::5]:5557", None),
    )


@pytest.mark.parametrize(
    ("kv_events", "says"),
    [
        ({"discover": False}, "without discover, give the publisher's port"),
        ({"discover": True, "port": 5557}, "either discover: true or port"),
        ({"replay_port": 5558}, "replay_port and data_parallel_size go with port"),
        ({"port": 70000}, "must be ≤ 65535"),
        ({"port": 5557, "endpoint": "tcp://*:5557"}, "endpoint: unknown key"),
    ],
)
def test_a_pool_block_that_cannot_find_publishers_is_refused_with_its_path(
    kv_events: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parsed(**kv_events)
    assert "pools.interactive.kv_events" in str(refused.value)
    assert says in str(refused.value)


def test_vllms_wildcard_endpoints_are_the_backends_own_host_rank_by_rank() -> None:
    second = {**VLLM_RANK, "endpoint": "tcp://*:19758", "replay_endpoint": "tcp://0.0.0.0:19759"}
    found = listed("http://10.0.0.5:8000", {"1": second, "0": VLLM_RANK})
    assert found.publishers == (
        Publisher("tcp://10.0.0.5:19757", "tcp://10.0.0.5:19758"),
        Publisher("tcp://10.0.0.5:19758", "tcp://10.0.0.5:19759"),
    )
    assert found.refused == ()
    # The address vLLM reports for tcp://*:0 is the one it bound: the backend's own host is kept.
    bound = {**VLLM_RANK, "endpoint": "tcp://10.0.0.5:41234", "replay_endpoint": None}
    assert listed("http://10.0.0.5:8000", {"0": bound}).publishers == (
        Publisher("tcp://10.0.0.5:41234", None),
    )


def test_a_publisher_that_connects_out_or_is_local_is_refused_with_the_reason() -> None:
    answer = {
        "0": {**VLLM_RANK, "endpoint": "tcp://collector.internal:5557"},
        "1": {**VLLM_RANK, "endpoint": "ipc:///tmp/kv"},
        "2": {**VLLM_RANK, "enable_kv_cache_events": False},
        "3": "nonsense",
    }
    found = listed("http://10.0.0.5:8000", answer)
    assert found.publishers == ()
    assert len(found.refused) == 4
    assert "connects out to it instead of binding" in found.refused[0] and "tcp://*:PORT" in found.refused[0]
    assert "not a TCP endpoint" in found.refused[1]
    assert "publishes no KV events" in found.refused[2]
    assert listed("http://10.0.0.5:8000", []).refused == ("/kv_event_sources did not answer a JSON object",)
    assert listed("http://10.0.0.5:8000", {}).publishers == ()  # events off: vLLM lists nothing


def test_a_replay_endpoint_on_another_host_is_never_asked() -> None:
    """The router connects only to the backend's own host: a replay endpoint naming any other
    (an internal service, a metadata address, ZMQ's `source;destination` form) is dropped with
    the reason, and the rank is followed without replays."""
    for replay in ("tcp://169.254.169.254:80", "tcp://collector.internal:5558", "tcp://*;10.9.9.9:5558"):
        found = listed("http://10.0.0.5:8000", {"0": {**VLLM_RANK, "replay_endpoint": replay}})
        assert found.publishers == (Publisher("tcp://10.0.0.5:19757", None),), replay
        assert len(found.refused) == 1 and replay in found.refused[0], replay
    own = {**VLLM_RANK, "replay_endpoint": "tcp://10.0.0.5:19758"}
    assert listed("http://10.0.0.5:8000", {"0": own}).publishers == (
        Publisher("tcp://10.0.0.5:19757", "tcp://10.0.0.5:19758"),
    )


@pytest.mark.parametrize(
    "answer",
    [
        {"²": VLLM_RANK},  # a digit to str.isdigit, not to int()
        {"0": {**VLLM_RANK, "endpoint": "tcp://*:²"}},
        {"0": {**VLLM_RANK, "endpoint": "tcp://*:١٩٧٥٧"}},  # Arabic-Indic digits: no ZMQ port
        {"0": {**VLLM_RANK, "endpoint": "tcp://*:99999"}},
        {"0": {**VLLM_RANK, "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:70000"}},
    ],
)
def test_ranks_and_ports_that_are_not_plain_numbers_are_refused_without_raising(
    answer: dict[str, Any],
) -> None:
    found = listed("http://10.0.0.5:8000", answer)
    for publisher in found.publishers:
        for endpoint in (publisher.endpoint, publisher.replay_endpoint):
            if endpoint is not None:
                port = int(endpoint.rpartition(":")[2])
                assert endpoint.isascii() and 0 < port < 65536
    assert found.publishers or found.refused
