"""What a lane's queue knows of a key: its name (the flow its waiters belong to), its `weight`
(its share of a saturated lane, relative to the other keys waiting there) and its `tier` (a
higher tier's waiters go first). router/lanes/fairqueue.py orders the waiters by them."""

from __future__ import annotations

from typing import Final


class Tenant:
    """Built once per key (router/keys/auth.py `ApiKey`), read only by requests that wait."""

    __slots__ = ("name", "tier", "weight")

    def __init__(self, name: str, weight: float = 1.0, tier: int = 0) -> None:
        self.name: Final = name
        self.weight: Final = weight
        self.tier: Final = tier


# The requests of no key (a route without authentication) wait as one flow.
ANONYMOUS: Final = Tenant("")
