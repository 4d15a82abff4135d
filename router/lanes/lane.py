"""A lane: the requests of one class of one model, with the pool they go to, the balancer that
picks a backend and the counts admission reads (in flight, waiting). Its name (its class's for
the top-level lanes, else `MODEL:CLASS`: router/config/lanemap.py) is its identity: it outlives a
reload whenever the profile keeps its name (router/state/runtime.py); its settings, as every
request reads them, are router/lanes/settings.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from mypy_extensions import mypyc_attr

from router.balance import Balancer
from router.config.models import LaneConfig, RequestClass
from router.fleet.pool import Pool
from router.lanes.drain import Drain
from router.lanes.settings import LaneSettings
from router.observe.leanmetrics import HistogramValue
from router.observe.metrics import LaneQueueMetrics


# A Python class even where this module is compiled: the shared slot gate holds lanes in weak
# sets (router/state/slots/gate.py), and compiled instances take no weak reference.
@mypyc_attr(native_class=False)
@dataclass(eq=False)
class Lane:
    cls: RequestClass
    config: LaneConfig
    pool: Pool
    balancer: Balancer
    queue_time: HistogramValue
    queue_metrics: LaneQueueMetrics  # what waits in its queue, by key tier; who was displaced
    in_flight: int = 0
    waiting: int = 0
    model: str = ""  # the model it serves (its pools' `model`)
    name: str = ""  # the lane's name, read several times by every request; unset: its class's
    # How fast its queue drains, for the Retry-After of the requests it refuses.
    drain: Drain = field(default_factory=Drain)
    # Its slots held, by key name: what a key's first waiter is charged for (router/lanes/fairqueue.py).
    held: dict[str, int] = field(default_factory=dict)
    settings: LaneSettings = field(init=False)  # its config's and pool's, as every request reads them

    def __post_init__(self) -> None:
        if not self.name:
            self.name = self.cls.value
        if not self.model:
            self.model = self.pool.config.model
        self.settings = LaneSettings(self.config, self.pool.config, self.cls)
