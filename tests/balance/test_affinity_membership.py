"""Prefix affinity across membership changes: rendezvous hashing over backend origins moves only
the keys of the backend that left or the share the new one takes — about 1/N of them."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from router.balance.base import AffinityKey
from router.balance.prefix_affinity import PrefixAffinity

KEYS = [b"document-%d" % i for i in range(20_000)]


@dataclass
class _Candidate:
    name: str
    in_flight: int = 0
    load_score: float = 0.0


def _pool(n: int, first: int = 1) -> list[_Candidate]:
    return [_Candidate(f"http://10.0.0.{i}:8000") for i in range(first, first + n)]


def _owners(pool: list[_Candidate]) -> dict[bytes, str]:
    return {key: PrefixAffinity.preferred(pool, key).name for key in KEYS}


def moved_fraction(before: dict[bytes, str], after: dict[bytes, str]) -> float:
    return sum(before[k] != after[k] for k in KEYS) / len(KEYS)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_removing_one_of_n_backends_moves_only_its_keys_about_one_in_n(n: int) -> None:
    pool = _pool(n)
    before = _owners(pool)
    gone = pool[n // 2]
    after = _owners([c for c in pool if c is not gone])

    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(before[k] == gone.name for k in moved)  # nothing else moved
    assert len(moved) == sum(owner == gone.name for owner in before.values())
    fraction = len(moved) / len(KEYS)
    print(f"remove 1 of {n}: moved {fraction:.4f} (1/N = {1 / n:.4f})")
    assert abs(fraction - 1 / n) < 0.2 / n


@pytest.mark.parametrize("n", [4, 8, 16])
def test_adding_a_backend_to_n_moves_only_the_keys_it_takes_about_one_in_n_plus_one(n: int) -> None:
    pool = _pool(n)
    before = _owners(pool)
    new = _Candidate("http://10.0.0.200:8000")
    after = _owners([*pool, new])

    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == new.name for k in moved)
    fraction = len(moved) / len(KEYS)
    print(f"add 1 to {n}: moved {fraction:.4f} (1/(N+1) = {1 / (n + 1):.4f})")
    assert abs(fraction - 1 / (n + 1)) < 0.2 / (n + 1)


def test_the_pick_depends_on_the_backends_origins_not_their_positions() -> None:
    pool = _pool(8)
    shuffled = random.Random(7).sample(pool, len(pool))
    balancer = PrefixAffinity()
    for key in KEYS[:500]:
        affinity = AffinityKey(key)
        assert balancer.pick(pool, affinity).name == PrefixAffinity().pick(shuffled, affinity).name
