"""Backend choice within a pool: least outstanding, round robin, power of two, prefix affinity."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.balance import (
    LeastOutstanding,
    PowerOfTwo,
    PrefixAffinity,
    RoundRobin,
    make_balancer,
    rendezvous_score,
)


@dataclass(frozen=True)
class Backend:
    name: str
    in_flight: int = 0
    load_score: float = 0.0


def pool(*loads: int) -> list[Backend]:
    return [Backend(f"http://10.0.0.{i}:8000", n, float(n)) for i, n in enumerate(loads)]


def fingerprint(i: int) -> bytes:
    return i.to_bytes(8, "big")


# --- least outstanding --------------------------------------------------------------------------


def test_least_outstanding_picks_the_minimum_wherever_it_is() -> None:
    for loads in ((5, 1, 7), (0, 3, 3), (9, 9, 2), (4, 2, 3, 8)):
        lo = LeastOutstanding()
        backends = pool(*loads)
        for _ in range(len(loads) * 2):
            assert lo.pick(backends, None).in_flight == min(loads)


def test_least_outstanding_rotates_among_ties_evenly() -> None:
    # The tied backends sit behind busier ones: each must still get an equal turn.
    lo = LeastOutstanding()
    backends = pool(2, 0, 0, 0, 5)
    picks = Counter(lo.pick(backends, None).name for _ in range(300))

    assert set(picks) == {b.name for b in backends[1:4]}
    assert max(picks.values()) - min(picks.values()) <= 1, picks


def test_least_outstanding_rotates_among_adjacent_ties() -> None:
    lo = LeastOutstanding()
    backends = pool(0, 0, 0)
    picks = [lo.pick(backends, None).name for _ in range(6)]

    assert picks[:3] == picks[3:]
    assert len(set(picks[:3])) == 3


# --- round robin --------------------------------------------------------------------------------


def test_round_robin_cycles_through_every_backend_in_turn() -> None:
    rr = RoundRobin()
    backends = pool(9, 0, 3)
    picks = [rr.pick(backends, None).name for _ in range(9)]

    assert picks[0:3] == picks[3:6] == picks[6:9]
    assert sorted(picks[0:3]) == sorted(b.name for b in backends)


def test_round_robin_ignores_load() -> None:
    rr = RoundRobin()
    backends = pool(100, 0)

    assert Counter(rr.pick(backends, None).name for _ in range(10)) == {b.name: 5 for b in backends}


# --- power of two -------------------------------------------------------------------------------


def test_power_of_two_with_two_backends_picks_the_less_loaded() -> None:
    p2 = PowerOfTwo(seed=1)
    backends = [Backend("a", 0, 0.7), Backend("b", 0, 0.2)]

    assert all(p2.pick(backends, None).name == "b" for _ in range(50))


def test_power_of_two_never_picks_the_most_loaded_and_favours_the_least() -> None:
    p2 = PowerOfTwo(seed=42)
    backends = [Backend(f"b{i}", 0, score) for i, score in enumerate((0.1, 0.4, 0.5, 0.6, 0.9))]
    picks = Counter(p2.pick(backends, None).name for _ in range(2000))

    assert "b4" not in picks
    assert picks.most_common(1)[0][0] == "b0"
    # The least loaded wins every pair it is drawn in: 4 of the 10 pairs.
    assert 0.32 < picks["b0"] / 2000 < 0.48


def test_power_of_two_is_reproducible_with_a_seed() -> None:
    backends = [Backend(f"b{i}", 0, s) for i, s in enumerate((0.3, 0.1, 0.2, 0.4))]
    a, b = PowerOfTwo(seed=7), PowerOfTwo(seed=7)

    assert [a.pick(backends, None).name for _ in range(50)] == [
        b.pick(backends, None).name for _ in range(50)
    ]


def test_power_of_two_single_backend() -> None:
    only = Backend("only", 3, 1.0)

    assert PowerOfTwo(seed=0).pick([only], None) is only


# --- prefix affinity ----------------------------------------------------------------------------


def test_same_fingerprint_same_backend_across_independent_replicas() -> None:
    backends = pool(0, 0, 0, 0, 0)
    replica_a, replica_b = PrefixAffinity(), PrefixAffinity()

    for i in range(200):
        fp = fingerprint(i)
        chosen = replica_a.pick(backends, fp)
        assert replica_b.pick(list(reversed(backends)), fp).name == chosen.name
        assert replica_a.pick(backends, fp).name == chosen.name
        assert chosen.name == PrefixAffinity.preferred(backends, fp).name


def test_different_fingerprints_spread_across_backends() -> None:
    backends = pool(0, 0, 0, 0)
    picks = Counter(PrefixAffinity().pick(backends, fingerprint(i)).name for i in range(4000))

    assert set(picks) == {b.name for b in backends}
    assert all(800 < n < 1200 for n in picks.values()), picks


def test_no_fingerprint_falls_back_to_least_outstanding() -> None:
    backends = pool(4, 1, 6)

    assert PrefixAffinity().pick(backends, None).in_flight == 1


def test_preferred_backend_far_above_the_mean_is_passed_over() -> None:
    backends = pool(0, 0, 0, 0)
    fp = fingerprint(12345)
    preferred = PrefixAffinity.preferred(backends, fp)
    loaded = [
        replace(b, in_flight=10) if b.name == preferred.name else replace(b, in_flight=1) for b in backends
    ]

    chosen = PrefixAffinity(epsilon=0.25).pick(loaded, fp)

    assert chosen.name != preferred.name
    assert chosen.in_flight == 1


def test_preferred_backend_at_the_mean_is_kept() -> None:
    backends = pool(5, 5, 5, 5)
    for i in range(50):
        fp = fingerprint(i)
        assert PrefixAffinity().pick(backends, fp).name == PrefixAffinity.preferred(backends, fp).name


@settings(max_examples=200, deadline=None)
@given(
    loads=st.lists(st.integers(0, 50), min_size=2, max_size=8),
    epsilon=st.sampled_from([0.0, 0.1, 0.25, 1.0]),
    fp=st.binary(min_size=8, max_size=8),
)
def test_bounded_load_choice(loads: list[int], epsilon: float, fp: bytes) -> None:
    backends = pool(*loads)
    chosen = PrefixAffinity(epsilon=epsilon).pick(backends, fp)
    bound = math.ceil((1 + epsilon) * (sum(loads) + 1) / len(loads))
    ranked = sorted(backends, key=lambda b: rendezvous_score(fp, b.name), reverse=True)
    fits = [b for b in ranked if b.in_flight + 1 <= bound]

    # After placement the chosen backend stays within (1 + ε) × the mean, and it is the
    # best-ranked backend that does: affinity is given up only as far as the bound demands.
    assert chosen.in_flight + 1 <= bound
    assert chosen.name == fits[0].name


def test_a_hot_prefix_cannot_melt_one_backend() -> None:
    backends = pool(0, 0, 0, 0)
    balancer = PrefixAffinity(epsilon=0.25)
    hot = fingerprint(7)
    for placed in range(1, 401):
        chosen = balancer.pick(backends, hot)
        backends = [replace(b, in_flight=b.in_flight + 1) if b.name == chosen.name else b for b in backends]
        assert max(b.in_flight for b in backends) <= math.ceil(1.25 * placed / 4)


@settings(max_examples=100, deadline=None)
@given(
    names=st.lists(
        st.text("abcdefghij0123456789", min_size=1, max_size=6), min_size=2, max_size=8, unique=True
    ),
    removed_index=st.integers(0, 7),
    fps=st.lists(st.binary(min_size=1, max_size=16), min_size=1, max_size=60),
)
def test_removing_a_backend_only_remaps_its_own_keys(
    names: list[str], removed_index: int, fps: list[bytes]
) -> None:
    backends = [Backend(n) for n in names]
    removed = backends[removed_index % len(backends)]
    remaining = [b for b in backends if b is not removed]
    balancer = PrefixAffinity()

    for fp in fps:
        before = balancer.pick(backends, fp)
        after = balancer.pick(remaining, fp)
        if before is not removed:
            assert after is before


def test_single_backend_is_always_chosen() -> None:
    only = pool(100)

    assert PrefixAffinity().pick(only, fingerprint(1)) is only[0]


# --- factory ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["least_outstanding", "round_robin", "power_of_two", "prefix_affinity"])
def test_make_balancer_builds_each_strategy(name: str) -> None:
    balancer = make_balancer(name)

    assert balancer.name == name
    assert balancer.pick(pool(0, 0), None).name.startswith("http://")


def test_make_balancer_gives_independent_instances() -> None:
    a, b = make_balancer("round_robin"), make_balancer("round_robin")
    backends = pool(0, 0, 0)
    a.pick(backends, None)

    assert b.pick(backends, None).name == RoundRobin().pick(backends, None).name
