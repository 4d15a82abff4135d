"""An adapter's requests keep to the first holder in its rank while its load allows, and spill
to the next in rank past the bound: never at random, the same on every replica."""

from __future__ import annotations

from dataclasses import dataclass

from router.balance.adapter_placement import ADAPTER_MIN_BOUND, ADAPTER_SLACK, AdapterPlacement
from router.balance.prefix_affinity import rendezvous_score


@dataclass(eq=False)
class Server:
    name: str
    in_flight: int = 0

    @property
    def load_score(self) -> float:
        return float(self.in_flight)


KEY = b"adapter\x00sql-lora"


def ranked(servers: list[Server], key: bytes = KEY) -> list[Server]:
    return sorted(servers, key=lambda s: rendezvous_score(key, s.name), reverse=True)


def test_an_adapter_keeps_to_its_first_holder_then_spills_in_rank() -> None:
    servers = [Server(f"http://10.0.0.{i}:8000") for i in range(3)]
    first, second, _ = ranked(servers)
    placement = AdapterPlacement()
    picks = []
    for _ in range(30):  # requests that stay in flight
        chosen, preferred = placement.rank(servers, KEY)
        chosen.in_flight += 1
        picks.append((chosen, preferred))
    # A few go to the first in rank however idle the others are...
    assert picks[:ADAPTER_MIN_BOUND] == [(first, True)] * ADAPTER_MIN_BOUND
    # ...then the next in rank takes the spill, and no server is loaded past the bound.
    spilled = [c for c, preferred in picks if not preferred]
    assert spilled and spilled[0] is second
    total = sum(s.in_flight for s in servers)
    assert max(s.in_flight for s in servers) <= (1 + ADAPTER_SLACK) * total / len(servers) + 1


def test_an_idle_pool_sends_each_adapter_to_its_own_first_in_rank_every_time() -> None:
    servers = [Server(f"http://10.0.0.{i}:8000") for i in range(4)]
    placement = AdapterPlacement()
    homes = set()
    for n in range(40):
        key = b"adapter\x00lora-%d" % n
        chosen = {placement.pick(servers, key).name for _ in range(5)}
        assert chosen == {ranked(servers, key)[0].name}
        homes |= chosen
    assert len(homes) > 1  # adapters spread over the pool, not all on one server


def test_two_replicas_rank_the_holders_alike_whatever_order_they_list_them() -> None:
    servers = [Server(f"http://10.0.0.{i}:8000") for i in range(5)]
    a, b = AdapterPlacement(), AdapterPlacement()
    assert a.pick(servers, KEY) is b.pick(list(reversed(servers)), KEY)
