"""Rules that relate several parts of a profile; each finding carries the dotted path it is about."""

from __future__ import annotations

from router.balance import places_on_token_ids
from router.config.issue import ConfigIssue
from router.config.lanemap import lane_plan
from router.config.modelchecks import model_rules
from router.config.models import ProfileConfig
from router.config.vllm import vllm_rule_violations
from router.fleet.membership import parse_nameserver
from router.request.tokenizer_source import BY_BACKEND, BY_BYTES, TokenizerNotFound, find_tokenizer
from router.state.counters import model_tokenizer
from router.state.slots.budget import budgets
from router.tls.contexts import TlsFileError, client_context

__all__ = ["ConfigIssue", "budget_warnings", "cross_check"]


def cross_check(cfg: ProfileConfig) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    issues += _lanes_name_pools(cfg)
    issues += model_rules(cfg)
    issues += _pool_rules(cfg)
    issues += _discovery_rules(cfg)
    issues += _tls_rules(cfg)
    issues += _key_rules(cfg)
    issues += _slow_client_rules(cfg)
    issues += _token_rules(cfg)
    issues += _token_id_rules(cfg)
    issues += _fair_by_rules(cfg)
    return issues


def _token_rules(cfg: ProfileConfig) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    for model in dict.fromkeys(pool.model for pool in cfg.pools.values()):
        own = model_tokenizer(cfg, model)
        try:
            find_tokenizer(model, own, cfg.tokenizer)
        except TokenizerNotFound as err:
            issues.append(ConfigIssue(f"models.{model}.tokenizer" if own else "tokenizer", str(err)))
    if cfg.prefix_cache_isolation == "off":
        issues += [
            ConfigIssue(f"keys[{i}].cache_group", "applies only with prefix_cache_isolation: per_key")
            for i, key in enumerate(cfg.keys)
            if key.cache_group is not None
        ]
    return issues


def _token_id_rules(cfg: ProfileConfig) -> list[ConfigIssue]:
    """A lane placing on the prompt's token ids needs a model whose tokenizer gives them: with
    the byte bound it would place every request by approximation, as prefix_affinity does."""
    issues: list[ConfigIssue] = []
    for planned in lane_plan(cfg):
        if not places_on_token_ids(planned.config.balance):
            continue
        model = planned.model
        try:
            source = find_tokenizer(model, model_tokenizer(cfg, model), cfg.tokenizer)
        except TokenizerNotFound:
            continue  # said by _token_rules
        if source.how in (BY_BYTES, BY_BACKEND):
            issues.append(
                ConfigIssue(
                    f"{planned.path}.balance",
                    f"{planned.config.balance.strategy} places requests on their prompt's token ids, which"
                    f" the router works out with the model's tokenizer, and model {model!r} has none"
                    f" ({source.describe()}): set models.{model}.tokenizer (a tokenizer.json, or"
                    " 'simulator' for lane-router sim), or choose prefix_affinity",
                )
            )
    return issues


def _tls_rules(cfg: ProfileConfig) -> list[ConfigIssue]:
    """A `tls:` block belongs to a pool with https backends, and its files must make a context."""
    issues: list[ConfigIssue] = []
    for name, pool in cfg.pools.items():
        tls = pool.tls
        if tls is None:
            continue
        if not pool.uses_tls:
            issues.append(
                ConfigIssue(f"pools.{name}.tls", "applies only to https:// backends (the pool has none)")
            )
            continue
        try:
            client_context(tls.ca_file, tls.client_cert_file, tls.client_key_file, prefix="tls")
        except TlsFileError as err:
            issues.append(ConfigIssue(f"pools.{name}.{err.role}", err.reason))
    return issues


def _slow_client_rules(cfg: ProfileConfig) -> list[ConfigIssue]:
    sc = cfg.slow_clients
    if sc.max_stream_buffer_bytes > sc.max_buffer_bytes:
        return [
            ConfigIssue(
                "slow_clients.max_stream_buffer_bytes",
                f"must be ≤ max_buffer_bytes ({sc.max_buffer_bytes})",
            )
        ]
    return []


def _lanes_name_pools(cfg: ProfileConfig) -> list[ConfigIssue]:
    known = ", ".join(sorted(cfg.pools))
    return [
        ConfigIssue(f"lanes.{cls.value}.pool", f"names unknown pool {lane.pool!r} (pools: {known})")
        for cls, lane in cfg.lanes.items()
        if lane.pool not in cfg.pools
    ]


def _fair_by_rules(cfg: ProfileConfig) -> list[ConfigIssue]:
    """Lanes of one pool at one priority wait in one order: a turn there is counted one way."""
    counted: dict[tuple[str, int], set[str]] = {}
    for planned in lane_plan(cfg):
        lc = planned.config
        counted.setdefault((lc.pool, lc.priority), set()).add(lc.fair_by)
    return [
        ConfigIssue(
            f"{planned.path}.fair_by",
            f"lanes of pool {planned.config.pool!r} at priority {planned.config.priority} count turns "
            "both in requests and in tokens: give them one fair_by, or different priorities",
        )
        for planned in lane_plan(cfg)
        # A lane the profile does not write (a model's default lane) counts requests: the
        # finding is on the lanes it does write.
        if len(counted[(planned.config.pool, planned.config.priority)]) > 1
        and not planned.path.startswith("pools.")
    ]


def _pool_rules(cfg: ProfileConfig) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    owner: dict[str, str] = {}
    for name, pool in cfg.pools.items():
        issues += [
            ConfigIssue(f"pools.{name}.vllm.{field}", message)
            for field, message in vllm_rule_violations(pool.vllm)
        ]
        adm = pool.admission
        if adm.max_long_prefilling is not None:
            if adm.max_prefilling is None:
                issues.append(
                    ConfigIssue(f"pools.{name}.admission.max_long_prefilling", "needs max_prefilling")
                )
            elif adm.max_long_prefilling >= adm.max_prefilling:
                issues.append(
                    ConfigIssue(
                        f"pools.{name}.admission.max_long_prefilling",
                        f"must be < max_prefilling ({adm.max_prefilling}) so short prompts always find room",
                    )
                )
        if adm.long_prompt_tokens is not None and adm.long_prompt_tokens >= pool.vllm.max_model_len:
            issues.append(
                ConfigIssue(
                    f"pools.{name}.admission.long_prompt_tokens",
                    f"must be < vllm.max_model_len ({pool.vllm.max_model_len}), else no prompt is long",
                )
            )
        if len(set(pool.origins)) != len(pool.origins):
            issues.append(ConfigIssue(f"pools.{name}.backends", "lists a backend twice"))
        for origin in set(pool.origins):
            other = owner.setdefault(origin, name)
            if other != name:
                # One server runs one configuration: it cannot be tuned for two pools at once.
                issues.append(
                    ConfigIssue(f"pools.{name}.backends", f"{origin} is also a backend of pool {other!r}")
                )
    return issues


def _discovery_rules(cfg: ProfileConfig) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    owner: dict[tuple[str, int], str] = {}
    for name, pool in cfg.pools.items():
        found = pool.discovery
        if found is None:
            continue
        for i, entry in enumerate(found.nameservers):
            try:
                parse_nameserver(entry)
            except ValueError as err:
                issues.append(ConfigIssue(f"pools.{name}.discovery.nameservers[{i}]", str(err)))
        other = owner.setdefault((found.dns.lower().rstrip("."), found.port), name)
        if other != name:
            # As for listed backends: one server runs one configuration, so it is in one pool.
            issues.append(
                ConfigIssue(
                    f"pools.{name}.discovery.dns",
                    f"{found.dns}:{found.port} also names the backends of pool {other!r}",
                )
            )
    return issues


def _key_rules(cfg: ProfileConfig) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    names: set[str] = set()
    digests: dict[str, str] = {}
    for i, key in enumerate(cfg.keys):
        where = f"keys[{i}]"
        if key.name in names:
            issues.append(ConfigIssue(f"{where}.name", f"duplicate key name {key.name!r}"))
        names.add(key.name)
        if key.sha256 is not None:
            digest = key.sha256.removeprefix("sha256:")
            other = digests.setdefault(digest, key.name)
            if other != key.name:
                issues.append(
                    ConfigIssue(f"{where}.sha256", f"same key as {other!r}: scopes would be ambiguous")
                )
        if (key.sha256 is None) == (key.sha256_env is None):
            issues.append(ConfigIssue(f"{where}.sha256", "set exactly one of sha256 and sha256_env"))
        if key.pin_class and key.classes is not None and key.pin_class not in key.classes:
            issues.append(
                ConfigIssue(f"{where}.pin_class", f"{key.pin_class.value!r} is not among the key's classes")
            )
    return issues


def budget_warnings(cfg: ProfileConfig, workers: int) -> list[ConfigIssue]:
    """Limits smaller than the number of processes that split them (router/state/slots/budget.py):
    some process's part is 0, and it admits nothing that needs the slot. Without `state:`
    always; with it, while Redis is unreachable."""
    issues: list[ConfigIssue] = []
    processes = workers * cfg.replicas
    for budget in budgets(cfg, workers):
        zero = [i for i, part in enumerate(budget.parts) if part == 0]
        if not zero:
            continue
        who = _who(zero, workers, cfg.replicas)
        means = _ZERO_MEANS[budget.path.rsplit(".", 1)[1]][int(workers > 1 and len(zero) > 1)]
        issues.append(
            ConfigIssue(budget.path, f"{budget.limit} split over {processes} processes: {who} 0, {means}")
        )
    return issues + _rate_limit_warnings(cfg, processes)


# What a part of 0 means, said of one process and of several.
_ZERO_MEANS = {
    "max_in_flight": (
        "so it refuses the lane's requests (503 no_share)",
        "so they refuse the lane's requests (503 no_share)",
    ),
    "max_prefilling": (
        "so it sends nothing to the pool (503 no_share)",
        "so they send nothing to the pool (503 no_share)",
    ),
    "max_long_prefilling": (
        "so it sends no long prompts to the pool (503 long_prompt_refused)",
        "so they send no long prompts to the pool (503 long_prompt_refused)",
    ),
}


def _rate_limit_warnings(cfg: ProfileConfig, processes: int) -> list[ConfigIssue]:
    """Per-key rate limits are not split: without `state:` each process counts them alone."""
    if processes == 1 or cfg.state.shared:
        return []
    return [
        ConfigIssue(
            f"keys.{key.name}",
            f"without state: each of the {processes} processes counts its rpm/tpm/max_concurrency "
            f"alone, so the key may get up to {processes} times them; `state:` keeps them exact",
        )
        for key in cfg.keys
        if key.rpm is not None or key.tpm is not None or key.max_concurrency is not None
    ]


def _who(zero: list[int], workers: int, replicas: int) -> str:
    if workers == 1:
        return f"each of the {replicas} replicas gets"
    names = ", ".join(str(i) for i in zero)
    each = " of each replica" if replicas > 1 else ""
    return f"worker{'s' if len(zero) > 1 else ''} {names}{each} get{'' if len(zero) > 1 else 's'}"
