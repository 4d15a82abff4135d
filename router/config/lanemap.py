"""Which lanes a profile makes: for every model its pools serve, each request class's lane and the
pool it sends to.

A pool's `model` names the model it serves; several pools may serve one model. The top-level
`lanes:` are the lanes of one model (the model of the pools they name) and are named by their
class, as in a profile of one model; every other model's lanes are under `models.M.lanes` and
are named `M:CLASS`. A model served by one pool gets a lane to it, with a lane's defaults, for
every class it names no lane for; a model of several pools names a lane per class
(router/config/modelchecks.py says so when it does not). A lane's name is its identity: across
reloads, in metrics, in the shared admission counts and in the admin API."""

from __future__ import annotations

from dataclasses import dataclass

from router.config.models import ALL_CLASSES, LaneConfig, ProfileConfig, RequestClass


@dataclass(frozen=True, slots=True)
class PlannedLane:
    name: str
    model: str
    cls: RequestClass
    config: LaneConfig
    # Where the profile sets it: `lanes.chat`, `models.bge.lanes.chat`, its pool's for a default lane.
    path: str


def lane_name(model: str, cls: RequestClass, top: str | None) -> str:
    return cls.value if model == top else f"{model}:{cls.value}"


def served_models(cfg: ProfileConfig) -> dict[str, tuple[str, ...]]:
    """Every served model (a pool's `model`) with the names of the pools serving it."""
    out: dict[str, tuple[str, ...]] = {}
    for name, pool in cfg.pools.items():
        out[pool.model] = (*out.get(pool.model, ()), name)
    return out


def top_model(cfg: ProfileConfig) -> str | None:
    """The model whose lanes the top-level `lanes:` are: that of the first pool they name (None
    when they name none)."""
    for lane in cfg.lanes.values():
        pool = cfg.pools.get(lane.pool)
        if pool is not None:
            return pool.model
    return None


def given_lanes(
    cfg: ProfileConfig, model: str, top: str | None
) -> tuple[dict[RequestClass, LaneConfig], str]:
    """The lanes the profile names for `model`, and the dotted path they are under."""
    if model == top:
        return cfg.lanes, "lanes"
    entry = cfg.models.get(model)
    return (entry.lanes if entry is not None else {}), f"models.{model}.lanes"


def lane_plan(cfg: ProfileConfig) -> tuple[PlannedLane, ...]:
    """Every lane of the profile, model by model, in class order. A class a model of several
    pools names no lane for has none here (a configuration error)."""
    top = top_model(cfg)
    out: list[PlannedLane] = []
    for model, pools in served_models(cfg).items():
        given, where = given_lanes(cfg, model, top)
        for cls in ALL_CLASSES:
            lc = given.get(cls)
            path = f"{where}.{cls.value}"
            if lc is None:
                if len(pools) != 1:
                    continue
                lc, path = LaneConfig(pool=pools[0]), f"pools.{pools[0]}"
            name = lane_name(model, cls, top)
            out.append(PlannedLane(name=name, model=model, cls=cls, config=lc, path=path))
    return tuple(out)
