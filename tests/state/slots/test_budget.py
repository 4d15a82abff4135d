"""A process's part of each limit: the parts of N workers sum to the limit, replicas without an
index get `limit // R`, the long-prefill part stays below the whole part, and `check` says it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from router.cli import main
from router.config.load import parse_profile
from router.lanes.admission import PrefillLimits
from router.server import warn_of_parts
from router.state.slots.budget import Share, budgets, prefill_parts, split
from tests.support.profiles import multi_model_profile, profile


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_the_parts_of_n_workers_sum_exactly_to_the_limit(limit: int, n: int) -> None:
    parts = [split(limit, n, i) for i in range(n)]
    assert sum(parts) == limit
    assert max(parts) - min(parts) <= 1
    assert parts == sorted(parts, reverse=True)  # the extra ones go to the lowest indexes


def test_replicas_without_an_index_get_the_floor_and_their_workers_split_it() -> None:
    assert [Share(1, 0, replicas=3).of(10)] == [3]
    assert [Share(2, i, replicas=3).of(10) for i in range(2)] == [2, 1]
    assert Share(4, 3).of(None) is None
    assert Share().alone and not Share(2, 1).alone and not Share(1, 0, 2).alone


def test_a_worker_index_must_be_within_the_workers() -> None:
    with pytest.raises(ValueError):
        Share(2, 2)


@given(st.integers(1, 64), st.integers(0, 63), st.integers(1, 16))
def test_the_long_part_stays_below_the_whole_part(whole: int, long: int, workers: int) -> None:
    long = min(long, whole - 1)  # as the profile validates
    for i in range(workers):
        part_whole, part_long = prefill_parts(Share(workers, i), whole, long)
        assert part_whole is not None and part_long is not None
        assert part_long < part_whole or part_whole == part_long == 0


def test_limits_of_a_process_alone_are_the_limits_themselves() -> None:
    limits = PrefillLimits(max_prefilling=8, max_long_prefilling=2)
    assert limits.part(Share()) is limits
    part = limits.part(Share(3, 2))
    assert (part.max_prefilling, part.max_long_prefilling, part.processes) == (2, 0, 3)
    assert part.refuses(long=True) and not part.refuses(long=False)
    assert PrefillLimits(max_prefilling=1).part(Share(2, 1)).refuses(long=False)


def shaped(**top: object) -> dict[str, object]:
    data = profile(["http://127.0.0.1:9"])
    data["lanes"]["chat"]["max_in_flight"] = 3
    data["lanes"]["batch"]["max_in_flight"] = 1
    data["pools"]["interactive"]["admission"] = {"max_prefilling": 4, "max_long_prefilling": 1}
    data.update(top)
    return data


def test_budgets_list_every_split_limit_with_each_workers_part() -> None:
    table = {b.path: b.parts for b in budgets(parse_profile(shaped()), 2)}
    assert table == {
        "lanes.chat.max_in_flight": (2, 1),
        "lanes.batch.max_in_flight": (1, 0),
        "pools.interactive.admission.max_prefilling": (2, 2),
        "pools.interactive.admission.max_long_prefilling": (1, 0),
    }


def test_check_prints_each_workers_part_and_warns_where_one_is_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(shaped()))
    assert main(["check", str(path), "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "processes: 2 workers; without state: each enforces its part below" in out
    assert "lanes.chat.max_in_flight" in out and "3   2 / 1" in out
    assert "pools.interactive.admission.max_prefilling" in out and "4   2 / 2" in out
    assert (
        "lanes.batch.max_in_flight: 1 split over 2 processes: worker 1 gets 0, "
        "so it refuses the lane's requests (503 no_share)"
    ) in out
    assert (
        "max_long_prefilling: 1 split over 2 processes: worker 1 gets 0, so it sends no long prompts" in out
    )

    assert main(["check", str(path)]) == 0
    assert "processes:" not in capsys.readouterr().out  # one process: nothing to split


def test_check_says_replicas_split_and_state_makes_parts_a_fallback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(shaped(replicas=3, state={"redis_url": "redis://127.0.0.1:6379/0"})))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 worker in each of 3 replicas" in out and "while Redis is unreachable" in out
    assert "lanes.chat.max_in_flight" in out and "3   1" in out
    assert "each of the 3 replicas gets 0" in out


def test_check_warns_that_rate_limits_are_counted_per_process_without_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = shaped()
    keys = data["keys"]
    assert isinstance(keys, list)
    keys[0] = {**keys[0], "rpm": 60}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["check", str(path), "--workers", "3"]) == 0
    name = keys[0]["name"]
    assert f"keys.{name}: without state: each of the 3 processes counts its rpm/tpm/max_concurrency" in (
        capsys.readouterr().out
    )

    path.write_text(yaml.safe_dump({**data, "state": {"redis_url": "redis://127.0.0.1:6379/0"}}))
    assert main(["check", str(path), "--workers", "3"]) == 0
    assert "counts its rpm" not in capsys.readouterr().out  # shared in Redis: exact


def test_serving_with_workers_logs_the_same_warnings_as_check(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="lane_router.server"):
        warn_of_parts(parse_profile(shaped()), 2)
    assert "lanes.batch.max_in_flight: 1 split over 2 processes: worker 1 gets 0" in caplog.text


def test_every_models_lane_limits_are_split_under_their_path() -> None:
    data = multi_model_profile(*(f"http://127.0.0.1:{port}" for port in range(9101, 9105)))
    data["lanes"]["chat"]["max_in_flight"] = 7
    data["models"] = {"ranker": {"lanes": {"batch": {"pool": "rerank", "max_in_flight": 5}}}}

    found = {b.path: b.parts for b in budgets(parse_profile(data), 2)}

    assert found == {"lanes.chat.max_in_flight": (4, 3), "models.ranker.lanes.batch.max_in_flight": (3, 2)}
