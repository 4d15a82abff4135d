"""The security boundary note of a profile.

vLLM's `--api-key` authenticates only paths under `/v1`; its other routes answer anyone who can
reach the port. The note states what the router exposes, which key scopes guard it, and that the
router is the boundary for everything else, so a record says under which protection its numbers
were taken.
"""

from __future__ import annotations

from router.config.models import KeyConfig, ProfileConfig

PROXIED_ROUTES: tuple[str, ...] = (
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/embeddings",
    "GET /v1/models",
)
# vLLM routes outside /v1 that its --api-key leaves open; the router never forwards them.
VLLM_UNKEYED_ROUTES: tuple[str, ...] = (
    "/health",
    "/ping",
    "/metrics",
    "/version",
    "/tokenize",
    "/detokenize",
    "/invocations",
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
)
SCOPES: tuple[str, ...] = ("inference", "metrics", "admin")


def key_scopes(keys: tuple[KeyConfig, ...]) -> dict[str, tuple[str, ...]]:
    """Scope → the names of the keys holding it, in profile order."""
    holders: dict[str, tuple[str, ...]] = {
        "inference": tuple(k.name for k in keys),
        "metrics": tuple(k.name for k in keys if k.metrics or k.admin),
        "admin": tuple(k.name for k in keys if k.admin),
    }
    return holders


def upstream_keyed_pools(cfg: ProfileConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(pools whose backends get an upstream --api-key, pools whose backends get none)."""
    names = sorted(cfg.pools)
    keyed = tuple(n for n in names if cfg.pools[n].upstream_api_key_env or cfg.pools[n].upstream_api_key)
    return keyed, tuple(n for n in names if n not in keyed)


def security_boundary_note(cfg: ProfileConfig) -> str:
    """A deterministic statement of the boundary `cfg` sets up; the same profile, the same text."""
    return "\n".join(
        (
            "router proxies only: "
            + ", ".join(PROXIED_ROUTES)
            + " (key required); any other path answers 404 and is never forwarded",
            "router own routes: GET /health, GET /ready (no key, status only); "
            "GET /metrics (admin or metrics scope); /admin/* (admin scope)",
            _scopes_line(cfg.keys),
            "vLLM --api-key covers only /v1/* on the backends; its other routes ("
            + ", ".join(VLLM_UNKEYED_ROUTES)
            + ", …) have no key and are unreachable through the router",
            _network_line(cfg),
        )
    )


def _scopes_line(keys: tuple[KeyConfig, ...]) -> str:
    if not keys:
        return "key scopes: no keys configured, so every keyed route refuses"
    holders = key_scopes(keys)
    parts = [f"{scope}: {', '.join(holders[scope]) or '(none)'}" for scope in SCOPES]
    return "key scopes: " + "; ".join(parts)


def _network_line(cfg: ProfileConfig) -> str:
    keyed, unkeyed = upstream_keyed_pools(cfg)
    line = "backends must accept connections only from the router (network boundary)"
    if keyed:
        line += f"; upstream key set for pools: {', '.join(keyed)}"
    if unkeyed:
        line += f"; no upstream key for pools: {', '.join(unkeyed)}"
    return line
