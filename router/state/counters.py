"""Each served model's prompt counter, from where its tokenizer is found
(router/request/tokenizer_source.py): built with the runtime, and kept across a reload for a
model whose tokenizer did not change (loading one takes a while)."""

from __future__ import annotations

from collections.abc import Mapping

from router.config.lanemap import lane_plan
from router.config.models import ProfileConfig
from router.lanes.admission import PrefillLimits
from router.request.chattemplate import counter_for
from router.request.tokenizer_source import TokenizerSource, find_tokenizer
from router.request.tokens import Counters, PromptCosts, PromptCounter, Utf8ByteCounter


def model_tokenizer(cfg: ProfileConfig, model: str) -> str | None:
    """`models.<model>.tokenizer`, when the profile names one."""
    entry = cfg.models.get(model)
    return entry.tokenizer if entry is not None else None


def tokenizer_sources(cfg: ProfileConfig, env: Mapping[str, str]) -> dict[str, TokenizerSource]:
    """How each served model (a pool's `model`) is counted. Raises TokenizerNotFound."""
    models = dict.fromkeys(pool.model for pool in cfg.pools.values())
    return {m: find_tokenizer(m, model_tokenizer(cfg, m), cfg.tokenizer, env) for m in models}


def build_counters(
    cfg: ProfileConfig,
    env: Mapping[str, str],
    previous: tuple[Counters, Mapping[str, TokenizerSource]] | None = None,
) -> tuple[Counters, dict[str, TokenizerSource]]:
    """Every name a pool serves (model, aliases, adapters: an adapter shares its model's
    tokenizer) → its model's counter; and how each model is counted."""
    costs = PromptCosts(**cfg.prompt_costs.model_dump())
    sources = tokenizer_sources(cfg, env)
    made: dict[str, PromptCounter] = {}
    for model, source in sources.items():
        if previous is not None and previous[1].get(model) == source:
            kept = previous[0].by_model.get(model)
            if kept is not None and kept.costs == costs:
                made[model] = kept
                continue
        made[model] = counter_for(source, costs)
    for model, counter in made.items():
        counter.ask_above = lowest_threshold(cfg, model)
    by_name: dict[str, PromptCounter] = {}
    for pool in cfg.pools.values():
        for name in pool.models:
            by_name.setdefault(name, made[pool.model])
    return Counters(by_name, PromptCounter(Utf8ByteCounter(), costs)), sources


def lowest_threshold(cfg: ProfileConfig, model: str) -> int:
    """The shortest prompt length at which the profile decides something for `model`'s requests:
    its class, a lane's shape, a pool's long-prompt admission or context (a key's tpm aside)."""
    pools = {name: pool for name, pool in cfg.pools.items() if pool.model == model}
    rules = cfg.classify
    found = [rules.long_context_tokens, rules.repeated_prefix.min_tokens]
    for planned in lane_plan(cfg):
        if planned.model == model and planned.config.max_prompt_tokens is not None:
            found.append(planned.config.max_prompt_tokens)
    for pool in pools.values():
        found += [PrefillLimits.for_pool(pool).long_prompt_tokens, pool.vllm.max_model_len]
    return min(found)


def counting_lines(sources: Mapping[str, TokenizerSource]) -> list[str]:
    """`check` and `serve`: how each model's prompts are counted."""
    return [f"  {model}: {source.describe()}" for model, source in sources.items()]
