"""How a runtime's pools and lanes count admissions: this process's share of every limit, and,
with `state:`, the store that shares the counts through Redis (router/state/slots/store.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.config.models import ProfileConfig
from router.lanes.admission import PrefillLimits
from router.lanes.poolgate import Members, PoolGate
from router.state.shared import SharedState
from router.state.slots.budget import ALONE, Share
from router.state.slots.gate import SharedPoolGate
from router.state.slots.store import SlotStore

if TYPE_CHECKING:
    pass


@dataclass(frozen=True, slots=True)
class Counting:
    share: Share = ALONE
    store: SlotStore | None = None

    def gate(self, limits: PrefillLimits, pool: Members) -> PoolGate:
        """A new pool's gate: counting in Redis with `state:`, else in this process alone."""
        if self.store is None:
            return PoolGate(limits, pool, self.share)
        return SharedPoolGate(limits, pool, self.share, self.store)

    def configure(self, gate: PoolGate, limits: PrefillLimits) -> None:
        """A kept pool's gate, given the reloaded profile's limits and share. Whether a gate
        counts in Redis is fixed when its pool is built: adding or removing `state:` changes it
        for pools built afterwards (a restart, for pools a reload keeps)."""
        gate.configure(limits, self.share)
        if isinstance(gate, SharedPoolGate) and self.store is not None and gate.store is not self.store:
            gate.rebind(self.store)


def counting_for(
    cfg: ProfileConfig, workers: Share, shared: SharedState | None, previous: Counting | None
) -> Counting:
    """The counting of a runtime for `cfg`: `workers` says which worker this process is, the
    profile how many replicas run it; the previous runtime's store is kept while the shared
    state is."""
    share = workers.with_replicas(cfg.replicas)
    if shared is None:
        return Counting(share)
    if previous is not None and previous.store is not None and previous.store.state is shared:
        return Counting(share, previous.store)
    return Counting(share, SlotStore(shared))
