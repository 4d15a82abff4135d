"""A served model's route: what a request naming the model (or an alias, or an adapter of it)
is sent down — its lanes by class, how its prompts are counted, its pools. Built with the runtime
(router/state/runtime.py) and looked up by every request by the name it asks for."""

from __future__ import annotations

from router.config.models import RequestClass
from router.fleet.pool import Pool
from router.lanes.lane import Lane
from router.request.tokens import PromptCounter


class ModelRoute:
    __slots__ = ("count_asks", "counter", "lanes", "model", "pools", "uncounted_said")

    def __init__(
        self, model: str, lanes: dict[RequestClass, Lane], counter: PromptCounter, pools: tuple[Pool, ...]
    ) -> None:
        self.model = model
        self.lanes = lanes  # one per request class
        self.counter = counter
        self.pools = pools
        # The backends' counts of this model's prompts (router/proxy/exactcount.py): how many
        # were asked for, which spreads them over the backends, and whether a failure was logged.
        self.count_asks = 0
        self.uncounted_said = False

    def __repr__(self) -> str:
        return f"ModelRoute({self.model!r}, lanes={[lane.name for lane in self.lanes.values()]})"
