"""The registry: every strategy known by its settings' tag, the lane config's `balance:` forms,
and no module outside router/balance/ that knows a strategy by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from router.balance import STRATEGIES, make_balancer, strategy
from router.balance.settings import PrefixAffinitySettings
from router.config.load import ConfigError, parse_profile
from router.config.models import RequestClass
from tests.support.profiles import profile

ROUTER = Path(__file__).resolve().parents[2] / "router"


def _issues(**lanes: object) -> list[str]:
    data = profile(["http://127.0.0.1:9301"], ["http://127.0.0.1:9302"])
    for cls, lane in lanes.items():
        data["lanes"][cls] = {"pool": "interactive", **lane}  # type: ignore[dict-item]
    with pytest.raises(ConfigError) as err:
        parse_profile(data)
    return [str(issue) for issue in err.value.issues]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_each_strategy_builds_from_its_plain_name(name: str) -> None:
    data = profile(["http://127.0.0.1:9301"], ["http://127.0.0.1:9302"])
    data["lanes"]["chat"]["balance"] = name
    if STRATEGIES[name].token_ids:
        data["tokenizer"] = "simulator"  # a model whose token ids the router can work out
    settings = parse_profile(data).lanes[RequestClass.CHAT].balance
    assert settings.strategy == name and strategy(settings) is STRATEGIES[name]
    balancer = make_balancer(settings)
    assert balancer.name == name
    backends = [_Seen("http://10.0.0.1:8000"), _Seen("http://10.0.0.2:8000")]
    assert balancer.pick(backends, None) in backends


class _Seen:
    def __init__(self, name: str) -> None:
        self.name, self.in_flight, self.load_score = name, 0, 0.0


def test_each_lane_gets_its_own_balancer() -> None:
    settings = STRATEGIES["round_robin"].settings()
    a, b = make_balancer(settings), make_balancer(settings)
    backends = [_Seen("a"), _Seen("b"), _Seen("c")]
    a.pick(backends, None)
    assert b.pick(backends, None) is make_balancer(settings).pick(backends, None)


def test_a_lane_without_balance_is_least_outstanding() -> None:
    cfg = parse_profile(profile(["http://127.0.0.1:9301"], ["http://127.0.0.1:9302"]))
    assert cfg.lanes[RequestClass.BATCH].balance.strategy == "least_outstanding"


def test_prefix_affinity_takes_its_own_settings() -> None:
    data = profile(["http://127.0.0.1:9301"], ["http://127.0.0.1:9302"])
    data["lanes"]["agent"]["balance"] = {
        "strategy": "prefix_affinity",
        "affinity": "session",
        "min_tokens": 256,
        "slack": 0.5,
    }
    lane = parse_profile(data).lanes[RequestClass.AGENT]
    assert lane.balance == PrefixAffinitySettings(affinity="session", min_tokens=256, slack=0.5)


def test_problems_name_the_path_as_the_file_spells_it() -> None:
    assert _issues(chat={"balance": "fastest"}) == [
        "lanes.chat.balance: unknown strategy 'fastest' (one of "
        + ", ".join(repr(name) for name in STRATEGIES)
        + ")"
    ]
    assert _issues(agent={"balance": {"strategy": "prefix_affinity", "min_tokens": 0}}) == [
        "lanes.agent.balance.min_tokens: must be ≥ 1"
    ]
    assert _issues(chat={"balance": {"strategy": "round_robin", "affinity": "session"}}) == [
        "lanes.chat.balance.affinity: unknown key"
    ]


def test_the_old_flat_affinity_fields_say_where_they_went() -> None:
    (issue,) = _issues(rag={"balance": "prefix_affinity", "affinity_min_tokens": 256})
    assert issue.startswith("lanes.rag: affinity_min_tokens moved into balance:")
    assert "{strategy: prefix_affinity, affinity: prefix, min_tokens: 256}" in issue


def _name_comparisons(path: Path) -> list[str]:
    names = set(STRATEGIES)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                if isinstance(operand, ast.Constant) and operand.value in names:
                    found.append(f"{path.relative_to(ROUTER.parent)}:{node.lineno}")
    return found


def test_no_module_outside_the_registry_compares_strategy_names() -> None:
    outside = [p for p in ROUTER.rglob("*.py") if "balance" not in p.relative_to(ROUTER).parts[:1]]
    assert [hit for path in outside for hit in _name_comparisons(path)] == []
