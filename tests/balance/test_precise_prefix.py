"""Precise prefix placement: the most cached leading tokens win, less a load penalty, within the
load bound; ties by rendezvous; backends without an event stream judged as approximate placement."""

from __future__ import annotations

from dataclasses import dataclass

from router.balance.precise_prefix import place
from router.balance.prefix_affinity import PrefixAffinity, rendezvous_score


@dataclass(frozen=True)
class Backend:
    name: str
    in_flight: int = 0
    load_score: float = 0.0


def pool(*loads: int) -> list[Backend]:
    return [Backend(f"http://10.0.0.{i}:8000", n, float(n)) for i, n in enumerate(loads)]


KEY = b"doc-17"


def test_the_backend_holding_the_most_leading_tokens_wins() -> None:
    backends = pool(0, 0, 0)
    cached = {backends[0].name: 512, backends[1].name: 4096, backends[2].name: 0}
    chosen, approximated = place(backends, cached, KEY, credit=512, slack=1.0, penalty=64)
    assert chosen is backends[1]
    assert approximated == 0


def test_the_load_penalty_weighs_against_cached_tokens() -> None:
    backends = pool(3, 0)
    cached = {backends[0].name: 1024, backends[1].name: 0}
    assert place(backends, cached, KEY, credit=0, slack=9.0, penalty=64)[0] is backends[0]
    assert place(backends, cached, KEY, credit=0, slack=9.0, penalty=512)[0] is backends[1]


def test_a_backend_past_the_load_bound_is_passed_over_whatever_it_holds() -> None:
    backends = pool(6, 0, 0)  # bound: ceil(2 × 7 / 3) = 5
    cached = {b.name: (8192 if i == 0 else 0) for i, b in enumerate(backends)}
    chosen, _ = place(backends, cached, KEY, credit=0, slack=1.0, penalty=0)
    assert chosen is not backends[0]


def test_equal_scores_go_by_rendezvous_rank() -> None:
    backends = pool(0, 0, 0, 0)
    for key in (b"a", b"b", b"c", b"d", b"e"):
        cached: dict[str, int | None] = {b.name: 256 for b in backends}
        chosen, _ = place(backends, cached, key, credit=0, slack=1.0, penalty=64)
        assert chosen is max(backends, key=lambda b: rendezvous_score(key, b.name))


def test_with_every_stream_silent_it_places_as_prefix_affinity() -> None:
    backends = pool(0, 0, 0, 0)
    silent: dict[str, int | None] = {}
    for key in (b"a", b"b", b"c", b"d", b"e", b"f"):
        chosen, approximated = place(backends, silent, key, credit=512, slack=1.0, penalty=64)
        assert chosen is PrefixAffinity().pick(backends, key)
        assert approximated == 4


def test_a_silent_backend_is_credited_only_where_approximate_placement_would_send() -> None:
    backends = pool(0, 0)
    preferred = max(backends, key=lambda b: rendezvous_score(KEY, b.name))
    other = backends[1] if preferred is backends[0] else backends[0]
    # The preferred backend is silent: its credit (512) beats the other's 256 known tokens…
    chosen, approximated = place(backends, {other.name: 256}, KEY, credit=512, slack=1.0, penalty=0)
    assert (chosen, approximated) == (preferred, 1)
    # …but not 1024 known ones.
    assert place(backends, {other.name: 1024}, KEY, credit=512, slack=1.0, penalty=0)[0] is other
    # A silent backend that rendezvous does not prefer is credited nothing.
    assert place(backends, {preferred.name: 0}, KEY, credit=512, slack=1.0, penalty=0)[0] is preferred
