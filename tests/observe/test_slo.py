"""The SLO verdict of a finished request (router/observe/slo.py), a lane's SLO as its profile
states it or its class's default (router/config/slo.py), and the profile's rules for `slo:`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from router.config import ConfigError, RequestClass, parse_profile
from router.config.models import LaneConfig
from router.config.slo import CLASS_SLO, lane_slo
from router.lab.bench.workload import load_workload
from router.observe.metrics import Metrics
from router.observe.slo import E2E, FAILED, ITL, MET, TTFT, UNBOUNDED, Slo, judge
from router.state.runtime import build_runtime
from tests.support.profiles import profile

WORKLOADS = Path(__file__).resolve().parents[2] / "config" / "workloads"
CHAT = Slo(ttft_s=1.0, itl_s=0.06, e2e_s=UNBOUNDED)
ALL = Slo(ttft_s=1.0, itl_s=0.06, e2e_s=10.0)


def test_an_answered_request_within_every_bound_met_it() -> None:
    assert judge(ALL, 200, False, 0.5, 9.0, 40, 2) == MET


@pytest.mark.parametrize(
    ("ttft", "elapsed", "gaps", "late", "missed"),
    [
        (1.5, 2.0, 10, 0, TTFT),
        (1.5, 20.0, 10, 10, TTFT),  # every bound missed: the first one is named
        (0.5, 20.0, 10, 10, ITL),
        (0.5, 20.0, 10, 0, E2E),
    ],
)
def test_a_request_missed_by_the_first_bound_it_missed(
    ttft: float, elapsed: float, gaps: int, late: int, missed: str
) -> None:
    assert judge(ALL, 200, False, ttft, elapsed, gaps, late) == missed


@pytest.mark.parametrize(
    ("gaps", "late", "verdict"),
    [(20, 1, MET), (19, 1, ITL), (40, 2, MET), (40, 3, ITL), (0, 0, MET), (1, 1, ITL)],
)
def test_itl_bounds_the_requests_own_95th_percentile_gap_as_the_lab_does(
    gaps: int, late: int, verdict: str
) -> None:
    # Nearest rank: p95 is within the bound exactly when at most one gap in 20 is over it.
    assert judge(CHAT, 200, False, 0.1, 3.0, gaps, late) == verdict


def test_a_response_without_a_body_byte_takes_its_end_as_its_first_byte() -> None:
    assert judge(CHAT, 204, False, None, 0.2, 0, 0) == MET
    assert judge(CHAT, 200, False, None, 2.0, 0, 0) == TTFT


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, "error"])
def test_a_failed_or_refused_by_capacity_request_missed_it(status: int | str) -> None:
    assert judge(ALL, status, False, None, 0.01, 0, 0) == FAILED


@pytest.mark.parametrize("status", [400, 404, 413])
def test_a_request_refused_for_its_own_sake_is_not_counted(status: int) -> None:
    assert judge(ALL, status, False, 0.01, 0.01, 0, 0) is None


def test_a_client_that_left_counts_only_once_a_bound_was_missed() -> None:
    assert judge(ALL, "client_disconnect", True, None, 0.3, 0, 0) is None  # cancelled early
    assert judge(ALL, "client_disconnect", True, 0.2, 3.0, 30, 0) is None  # mid-stream, on time
    assert judge(ALL, "client_disconnect", True, None, 1.5, 0, 0) == TTFT  # gave up waiting
    assert judge(ALL, "client_disconnect", True, 0.2, 3.0, 10, 5) == ITL
    assert judge(ALL, 200, True, 0.2, 11.0, 100, 0) == E2E


def lane(**fields: Any) -> LaneConfig:
    return LaneConfig.model_validate({"pool": "p", **fields})


def test_a_lane_without_slo_has_its_classs_and_the_defaults_are_the_labs_classes() -> None:
    spec = load_workload(WORKLOADS / "mixed-six.yaml")
    for cls in RequestClass:
        slo = lane_slo(cls, lane())
        lab = spec.spec(cls.value).slo
        assert slo is not None and lab is not None
        for mine, theirs in ((slo.ttft_s, lab.ttft_s), (slo.itl_s, lab.itl_s), (slo.e2e_s, lab.e2e_s)):
            assert mine == (UNBOUNDED if theirs is None else theirs)
    assert set(CLASS_SLO) == set(RequestClass)


def test_a_lanes_own_slo_replaces_its_classs_and_null_or_empty_turns_it_off() -> None:
    own = lane_slo(RequestClass.CHAT, lane(slo={"e2e_ms": 2500}))
    assert own is not None and (own.ttft_s, own.itl_s, own.e2e_s) == (math.inf, math.inf, 2.5)
    assert lane_slo(RequestClass.CHAT, lane(slo=None)) is None
    assert lane_slo(RequestClass.AGENT, lane(slo={})) is None


def _issues(slo: Any) -> list[tuple[str, str]]:
    data = {
        "pools": {"p": {"backends": ["http://127.0.0.1:9"], "model": "m"}},
        "lanes": {"chat": {"pool": "p", "slo": slo}},
    }
    with pytest.raises(ConfigError) as info:
        parse_profile(data)
    return [(issue.path, issue.message) for issue in info.value.issues]


def test_slo_errors_name_their_dotted_path() -> None:
    assert _issues({"ttft_ms": 0}) == [("lanes.chat.slo.ttft_ms", "must be > 0.0")]
    [(path, _)] = _issues({"ttft_s": 1.0})
    assert path == "lanes.chat.slo.ttft_s"


def test_a_reload_gives_a_kept_lane_its_new_slo() -> None:
    data = profile(["http://127.0.0.1:9100"])
    metrics = Metrics()
    first = build_runtime(parse_profile(data), metrics)
    chat = first.lanes[RequestClass.CHAT]
    before = chat.settings.slo
    assert before is not None and (before.ttft_s, before.itl_s, before.e2e_s) == (1.0, 0.06, math.inf)

    data["lanes"]["chat"]["slo"] = {"e2e_ms": 500}
    second = build_runtime(parse_profile(data), metrics, previous=first)
    after = chat.settings.slo
    assert second.lanes[RequestClass.CHAT] is chat
    assert after is not None and (after.ttft_s, after.itl_s, after.e2e_s) == (math.inf, math.inf, 0.5)

    data["lanes"]["chat"]["slo"] = None
    build_runtime(parse_profile(data), metrics, previous=second)
    assert chat.settings.slo is None
