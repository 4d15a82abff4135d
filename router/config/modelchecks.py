"""The rules of a profile's models (router/config/lanemap.py): which names each model's pools
serve, and which lanes reach which pools."""

from __future__ import annotations

from router.config.issue import ConfigIssue
from router.config.lanemap import given_lanes, lane_plan, served_models, top_model
from router.config.models import ALL_CLASSES, ProfileConfig


def model_rules(cfg: ProfileConfig) -> list[ConfigIssue]:
    issues = _names_disjoint(cfg)
    issues += _models_are_served(cfg)
    issues += _top_lanes_one_model(cfg)
    issues += _model_lanes_name_its_pools(cfg)
    issues += _every_class_has_a_lane(cfg)
    if not issues:
        issues += _every_pool_is_reached(cfg)
    return issues


def _names_disjoint(cfg: ProfileConfig) -> list[ConfigIssue]:
    """A name leads to one model's lanes: pools of different models serve different names."""
    issues: list[ConfigIssue] = []
    owner: dict[str, tuple[str, str]] = {}  # served name → (model, pool)
    for pool_name, pool in cfg.pools.items():
        named = [("model", pool.model)] + [("aliases", a) for a in pool.aliases]
        named += [("adapters", a) for a in pool.adapters]
        for field, served in named:
            model, other = owner.setdefault(served, (pool.model, pool_name))
            if model != pool.model:
                issues.append(
                    ConfigIssue(
                        f"pools.{pool_name}.{field}",
                        f"{served!r} is also served by pool {other!r} of model {model!r}: "
                        "pools of different models serve different names",
                    )
                )
    return issues


def _models_are_served(cfg: ProfileConfig) -> list[ConfigIssue]:
    served = served_models(cfg)
    issues: list[ConfigIssue] = []
    for model in cfg.models:
        if model in served:
            continue
        parent = next((p.model for p in cfg.pools.values() if model in p.models), None)
        message = (
            f"{model!r} is a name of model {parent!r}: models: is keyed by a pool's model"
            if parent is not None
            else f"no pool serves model {model!r} (served: {', '.join(sorted(served))})"
        )
        issues.append(ConfigIssue(f"models.{model}", message))
    return issues


def _top_lanes_one_model(cfg: ProfileConfig) -> list[ConfigIssue]:
    """The top-level lanes are one model's; the others' lanes are under `models:`."""
    top = top_model(cfg)
    issues: list[ConfigIssue] = []
    for cls, lane in cfg.lanes.items():
        pool = cfg.pools.get(lane.pool)
        if pool is not None and pool.model != top:
            issues.append(
                ConfigIssue(
                    f"lanes.{cls.value}.pool",
                    f"pool {lane.pool!r} serves model {pool.model!r} and the top-level lanes are model "
                    f"{top!r}'s: write {pool.model!r}'s lanes under models.{pool.model}.lanes",
                )
            )
    entry = cfg.models.get(top) if top is not None else None
    if entry is not None and entry.lanes:
        issues.append(
            ConfigIssue(
                f"models.{top}.lanes", f"model {top!r}'s lanes are the top-level lanes: name them there"
            )
        )
    return issues


def _model_lanes_name_its_pools(cfg: ProfileConfig) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    for model, entry in cfg.models.items():
        for cls, lane in entry.lanes.items():
            pool = cfg.pools.get(lane.pool)
            where = f"models.{model}.lanes.{cls.value}.pool"
            if pool is None:
                known = ", ".join(sorted(cfg.pools))
                issues.append(ConfigIssue(where, f"names unknown pool {lane.pool!r} (pools: {known})"))
            elif pool.model != model:
                issues.append(
                    ConfigIssue(where, f"pool {lane.pool!r} serves model {pool.model!r}, not {model!r}")
                )
    return issues


def _every_class_has_a_lane(cfg: ProfileConfig) -> list[ConfigIssue]:
    """A model of several pools says which pool each class goes to."""
    top = top_model(cfg)
    served = served_models(cfg)
    issues: list[ConfigIssue] = []
    for model, pools in served.items():
        if len(pools) == 1:
            continue
        given, where = given_lanes(cfg, model, top)
        if top is None and len(served) == 1:
            where = "lanes"  # a profile of one model names its lanes at the top level
        issues += [
            ConfigIssue(
                f"{where}.{cls.value}",
                f"missing: model {model!r} is served by several pools ({', '.join(pools)}), "
                "so every request class needs a lane",
            )
            for cls in ALL_CLASSES
            if cls not in given
        ]
    return issues


def _every_pool_is_reached(cfg: ProfileConfig) -> list[ConfigIssue]:
    reached = {lane.config.pool for lane in lane_plan(cfg)}
    return [
        ConfigIssue(
            f"pools.{name}",
            f"no lane reaches it: name it in a lane of model {pool.model!r}, or remove it",
        )
        for name, pool in cfg.pools.items()
        if name not in reached
    ]
