"""A request naming a LoRA adapter, on the request path: which adapter it is (one the profile
names, or one the backends listed: router/fleet/adapters.py), and whether its lane's pool can
serve it at all — else 404 `model_not_found` before anything reaches vLLM. Its admission then
takes only the adapter's holders (router/lanes/poolgate.py `Ticket.for_adapter`)."""

from __future__ import annotations

from router.errors import NotFound
from router.fleet.adapters import AdapterNeed, holds
from router.lanes.lane import Lane
from router.lanes.route import ModelRoute
from router.state.runtime import Runtime


def learned_route(runtime: Runtime, model: str) -> ModelRoute | None:
    """The route of a model no pool names that a backend lists as an adapter: its parent's."""
    parent = runtime.fleet.learned_adapters.get(model)
    return None if parent is None else runtime.routes.get(parent)


def adapter_of(lane: Lane, model: str, learned: bool) -> AdapterNeed | None:
    """The adapter the request names, if it names one: the lane's pool's (from the profile), or
    one only the backends listed (`learned`)."""
    if learned:
        return AdapterNeed(model, None, False)
    adapters = lane.settings.adapters
    return adapters.get(model) if adapters else None


def check_served(lane: Lane, need: AdapterNeed) -> None:
    """Refuse an adapter no backend of the lane's pool holds, unless the router may load it."""
    if need.path is not None:
        return
    pool = lane.pool
    if not any(holds(b, need) for b in pool.members):
        raise NotFound(
            f"model {need.name!r} is not served here: no server of pool {pool.name!r} (lane "
            f"{lane.name!r}) lists the adapter",
            code="model_not_found",
        )
