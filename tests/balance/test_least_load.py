"""`least_load`: the least scraped load among all candidates, as a lane config names it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from router.balance import STRATEGIES, make_balancer, scrapes_load
from router.balance.least_load import LeastLoad
from router.balance.settings import LeastLoadSettings
from router.config.load import parse_profile
from router.config.models import RequestClass
from router.fleet.scrape import scraped_pools
from router.observe.metrics import Metrics
from router.state.runtime import build_runtime
from tests.support.profiles import profile


@dataclass(frozen=True)
class Backend:
    name: str
    in_flight: int = 0
    load_score: float = 0.0


def test_the_least_loaded_backend_wins_wherever_it_is() -> None:
    for scores in ((5.0, 1.5, 7.0), (0.2, 3.0, 3.0), (9.0, 9.0, 2.0, 8.0)):
        backends = [Backend(f"b{i}", load_score=s) for i, s in enumerate(scores)]
        balancer = LeastLoad()
        for _ in range(6):
            assert balancer.pick(backends, None).load_score == min(scores)


def test_a_backend_loaded_by_someone_else_gets_nothing_while_others_are_lighter() -> None:
    # The router's own counts are zero everywhere; only the scrape shows backend 0's queue.
    backends = [Backend("b0", 0, 12.0), Backend("b1", 0, 1.0), Backend("b2", 0, 1.0)]
    balancer = LeastLoad()
    picks = Counter(balancer.pick(backends, None).name for _ in range(100))
    assert picks["b0"] == 0 and abs(picks["b1"] - picks["b2"]) <= 1


def test_it_is_registered_and_reads_scraped_load() -> None:
    assert STRATEGIES["least_load"].settings is LeastLoadSettings
    assert scrapes_load(LeastLoadSettings())
    assert make_balancer(LeastLoadSettings()).name == "least_load"


def test_a_lane_names_it_plainly_or_as_a_block_and_its_pool_is_scraped() -> None:
    for balance in ("least_load", {"strategy": "least_load"}):
        data = profile(["http://127.0.0.1:9301"], ["http://127.0.0.1:9302"])
        data["lanes"]["batch"]["balance"] = balance
        cfg = parse_profile(data)
        assert cfg.lanes[RequestClass.BATCH].balance == LeastLoadSettings()
        runtime = build_runtime(cfg, Metrics())
        pool = cfg.lanes[RequestClass.BATCH].pool
        assert pool in [p.name for p in scraped_pools(runtime)]
