"""The balancers of least outstanding, round robin, power of two and prefix affinity, and the
scraped load they share."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.balance import KV_WEIGHT, AffinityKey, corrected_load
from router.balance.least_outstanding import LeastOutstanding
from router.balance.power_of_two import PowerOfTwo
from router.balance.prefix_affinity import PrefixAffinity, PrefixMemory, rendezvous_score
from router.balance.round_robin import RoundRobin
from router.request.facts import prefix_chain


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


# --- prefix memory: the longest prefix wins ----------------------------------------------------


def chain(text: str) -> tuple[bytes, ...]:
    return prefix_chain(text)


def conversation(turns: int, system: str = "You are a careful agent. " * 40) -> str:
    """The text a chat body's messages make (role, content, …), after `turns` agent steps."""
    parts = ["system", system]
    for i in range(turns):
        parts += ["user", f"step {i}: " + "call the tool with these arguments please " * 8]
        parts += ["assistant", f"tool result {i} " * 30]
    return "\n".join(parts)


def test_the_prompt_chain_covers_every_message_not_only_the_first() -> None:
    one, three = chain(conversation(1)), chain(conversation(3))
    assert len(three) > len(one)
    assert three[: len(one)] == one  # a continuation shares every full block of its past
    assert chain(conversation(3, system="another system prompt " * 40))[-1] != three[-1]


def test_memory_finds_the_longest_earlier_prompt_this_one_extends() -> None:
    memory = PrefixMemory()
    memory.record(chain(conversation(1)), "b1")
    past = chain(conversation(2))
    memory.record(past, "b2")

    assert memory.longest(chain(conversation(4)), min_depth=1) == "b2"
    assert memory.longest(chain(conversation(4)), min_depth=len(past) + 1) is None
    assert memory.longest(chain("unrelated text " * 200), min_depth=1) is None


def test_a_shared_prefix_alone_is_no_match() -> None:
    """Two conversations with one system prompt: the second is not pulled to the first's backend."""
    memory = PrefixMemory()
    memory.record(chain(conversation(1, system="common instructions " * 100)), "b1")
    other = chain(conversation(1, system="common instructions " * 100).replace("step 0", "other task"))

    assert memory.longest(other, min_depth=1) is None


def test_memory_is_bounded_and_forgets_the_oldest_first() -> None:
    memory = PrefixMemory(max_entries=16)
    old = chain("old document " * 300)
    memory.record(old, "b1")
    for i in range(40):
        memory.record(chain(f"document {i} " * 300), "b2")

    assert len(memory) == 16
    assert memory.longest(old, min_depth=1) is None


def test_a_growing_agent_context_follows_its_backend_even_with_a_shared_system_prompt() -> None:
    """Sessions share one long system prompt, so their rendezvous keys are equal; the memory
    still keeps each session where its previous step went, while bounded load spreads them."""
    backends = pool(0, 0, 0, 0)
    balancer = PrefixAffinity(epsilon=0.25)
    homes: dict[int, str] = {}
    keys: set[bytes] = set()
    for step in range(1, 5):
        for session in range(8):
            text = conversation(step, system="shared system prompt " * 120)
            blocks = chain(text.replace("step 0:", f"session {session} step 0:"))
            key = AffinityKey(blocks[7], blocks, min_depth=8)
            keys.add(key.key)
            # In flight: the other sessions' current steps (a session's own last step is done).
            others = [h for s, h in homes.items() if s != session]
            current = [replace(b, in_flight=others.count(b.name)) for b in backends]
            chosen = balancer.pick(current, key).name
            homes.setdefault(session, chosen)
            assert chosen == homes[session], (session, step)
    assert len(keys) == 1
    assert len(set(homes.values())) >= 3


def test_a_memory_match_on_an_overloaded_backend_falls_back_to_the_rank() -> None:
    backends = pool(0, 0, 0, 0)
    memory = PrefixMemory()
    text = chain("long shared context " * 200)
    memory.record(text, backends[0].name)
    overloaded = [replace(b, in_flight=20) if b is backends[0] else b for b in backends]

    chosen = PrefixAffinity(memory=memory).pick(overloaded, AffinityKey(text[3], text, 4))

    assert chosen.name != backends[0].name


def test_hits_are_reported_for_preferred_picks_only() -> None:
    hits: list[int] = []
    backends = pool(0, 0, 0, 0)
    fp = fingerprint(3)
    preferred = PrefixAffinity.preferred(backends, fp)
    balancer = PrefixAffinity(epsilon=0.0, on_hit=lambda: hits.append(1))

    balancer.pick(backends, fp)
    assert len(hits) == 1
    loaded = [replace(b, in_flight=4) if b.name == preferred.name else b for b in backends]
    assert balancer.pick(loaded, fp).name != preferred.name
    assert len(hits) == 1
    balancer.pick(backends, None)  # no key: nothing to hit
    assert len(hits) == 1


# --- corrected scraped load ---------------------------------------------------------------------


def test_unscraped_load_is_the_in_flight_count() -> None:
    assert corrected_load(3, 0, 50.0, 10.0, 0.9, scraped=False) == 3.0


def test_scraped_load_is_corrected_by_requests_sent_since_the_scrape() -> None:
    at_scrape = corrected_load(2, 2, running=6, waiting=0, kv_usage=0.0, scraped=True)
    two_more = corrected_load(4, 2, running=6, waiting=0, kv_usage=0.0, scraped=True)
    one_done = corrected_load(1, 2, running=6, waiting=0, kv_usage=0.0, scraped=True)

    assert at_scrape == 6.0
    assert two_more == 8.0
    assert one_done == 5.0


def test_waiting_requests_and_a_full_kv_cache_weigh_on_the_score() -> None:
    idle = corrected_load(0, 0, running=4, waiting=0, kv_usage=0.1, scraped=True)
    queued = corrected_load(0, 0, running=4, waiting=2, kv_usage=0.1, scraped=True)
    full = corrected_load(0, 0, running=4, waiting=0, kv_usage=0.95, scraped=True)

    assert queued > idle + 2
    assert full == pytest.approx(idle + KV_WEIGHT * 0.85)


def test_the_routers_own_count_is_a_floor() -> None:
    # Other requests of this router are certainly there, whatever a stale scrape said.
    assert corrected_load(9, 9, running=0, waiting=0, kv_usage=0.0, scraped=True) == 9.0
