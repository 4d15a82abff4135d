"""What every request reads of its lane's settings and its pool's, as plain values.

The profile's settings are validated models whose every attribute read costs about as much as a
function call; a request reads a dozen of them. `LaneSettings` holds those values, built with the
lane and again whenever a reload gives the lane new settings or a new pool (router/state/runtime.py).
It also keeps the lane's metric children once a request has looked them up: their series appear
on first use, as before, and the lookup is not repeated."""

from __future__ import annotations

from router.balance import places_on_token_ids, routes_on_affinity
from router.config.models import LaneConfig, PoolConfig, RequestClass
from router.config.slo import lane_slo
from router.fleet.adapters import AdapterNeed
from router.observe.leanmetrics import CounterValue
from router.observe.metrics import RouteMetrics
from router.observe.slo import Slo


class LaneSettings:
    __slots__ = (
        "adapters",
        "affinity",
        "by_priority",
        "classified",
        "decouple",
        "max_in_flight",
        "max_model_len",
        "max_output_tokens",
        "models",
        "priority",
        "route_metrics",
        "shaped",
        "slo",
        "token_ids",
    )

    def __init__(self, lane: LaneConfig, pool: PoolConfig, cls: RequestClass) -> None:
        self.affinity = routes_on_affinity(lane.balance)  # the balance strategy routes on one
        # It places on the prompt's token ids: only this lane's requests have them worked out.
        self.token_ids = places_on_token_ids(lane.balance)
        self.decouple = lane.decouple
        self.max_in_flight = lane.max_in_flight
        self.max_output_tokens = lane.max_output_tokens
        self.priority = lane.priority
        # The lane refuses requests beyond a prompt or output length (router.lanes.admission).
        self.shaped = lane.max_prompt_tokens is not None or lane.max_output_tokens is not None
        self.models = frozenset(pool.models)  # the model names the pool serves
        # The pool's adapters by name: their requests go only to backends holding them
        # (router/fleet/adapters.py); those with a path may be loaded first.
        self.adapters = {
            name: AdapterNeed(name, pool.adapter_paths.get(name), name not in pool.adapter_paths)
            for name in pool.adapters
        }
        self.max_model_len = pool.vllm.max_model_len
        # The pool's vLLM orders its queue by the request's `priority`.
        self.by_priority = pool.vllm.scheduling_policy == "priority"
        self.route_metrics: RouteMetrics | None = None  # the lane's class × lane × pool children
        self.classified: dict[str, CounterValue] = {}  # the lane's classification counters, by reason
        # What its finished requests are judged by (router/observe/slo.py); None: not judged.
        self.slo: Slo | None = lane_slo(cls, lane)
