"""A served model's route: what a request naming the model (or an alias, or an adapter of it)
is sent down — its lanes by class, how its prompts are counted, its pools. Built with the runtime
(router/state/runtime.py) and looked up by every request by the name it asks for."""

from __future__ import annotations

from router.config.models import RequestClass
from router.fleet.pool import Pool
from router.lanes.lane import Lane
from router.request.tokens import PromptCounter


class ModelRoute:
    __slots__ = ("counter", "lanes", "model", "pools")

    def __init__(
        self, model: str, lanes: dict[RequestClass, Lane], counter: PromptCounter, pools: tuple[Pool, ...]
    ) -> None:
        self.model = model
        self.lanes = lanes  # one per request class
        self.counter = counter
        self.pools = pools

    def __repr__(self) -> str:
        return f"ModelRoute({self.model!r}, lanes={[lane.name for lane in self.lanes.values()]})"
