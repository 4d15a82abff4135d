"""API keys: stored as sha256, compared in constant time, with per-key scopes and limits."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from router.config.models import DEFAULT_ROUTES, FieldRules, KeyConfig, RequestClass, RouteScope
from router.errors import BadRequest, Forbidden, Unauthorized
from router.keys.rateheaders import KeyRates
from router.keys.ratelimit import Limits
from router.keys.tenant import Tenant
from router.request.fields import FieldPolicy


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    return "lr-" + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    digest: bytes
    classes: frozenset[RequestClass] | None
    models: frozenset[str] | None
    pin_class: RequestClass | None
    may_set_class: bool
    admin: bool
    metrics: bool
    rpm: int | None
    tpm: int | None
    max_concurrency: int | None
    fields: FieldPolicy = field(default_factory=FieldPolicy)
    cache_salt: str | None = None  # set on every request when the profile isolates prefix caches
    routes: frozenset[RouteScope] = frozenset(DEFAULT_ROUTES)
    weight: float = 1.0
    tier: int = 0
    # The rate limits as the limiter takes them, None for a key without any: built once here,
    # read by every request.
    limits: Limits | None = field(init=False, default=None, compare=False)
    # The limits with their headers and the pace of the key's requests, None as `limits` is.
    rates: KeyRates | None = field(init=False, default=None, compare=False)
    # What the ids of the key's requests to vLLM begin with (router/proxy/intake.py).
    id_prefix: bytes = field(init=False, default=b"", compare=False)
    # The key as a lane's queue orders its waiting requests (router/lanes/fairqueue.py).
    tenant: Tenant = field(init=False, default=Tenant(""), compare=False)

    def __post_init__(self) -> None:
        limits = Limits(self.rpm, self.tpm, self.max_concurrency)
        object.__setattr__(self, "limits", limits if limits.any else None)
        object.__setattr__(self, "rates", KeyRates(limits) if limits.any else None)
        object.__setattr__(self, "id_prefix", self.name.encode() + b":")
        object.__setattr__(self, "tenant", Tenant(self.name, self.weight, self.tier))

    def allow_route(self, scope: RouteScope) -> None:
        if scope not in self.routes:
            raise Forbidden(
                f"this key may not use the {scope.value} routes (its routes: "
                f"{', '.join(sorted(r.value for r in self.routes))})",
                code="route_scope_required",
            )

    def allow_class(self, cls: RequestClass) -> None:
        if self.classes is not None and cls not in self.classes:
            raise Forbidden(f"this key may not send {cls.value} requests", code="class_not_allowed")

    def allow_model(self, model: str) -> None:
        if self.models is not None and model not in self.models:
            raise Forbidden(f"this key may not use model {model!r}", code="model_not_allowed")

    def allow_admin(self) -> None:
        if not self.admin:
            raise Forbidden("this route needs a key with the admin scope", code="admin_scope_required")

    def allow_metrics(self) -> None:
        if not (self.admin or self.metrics):
            raise Forbidden(
                "this route needs a key with the metrics or admin scope", code="metrics_scope_required"
            )


def cache_salt(cfg: KeyConfig) -> str:
    """vLLM's `cache_salt` for a key: one per key, or one per `cache_group` so that a group of
    keys shares its prefix cache. Clients never choose it (the router replaces theirs), so it
    need not be secret; it must only differ between isolated scopes."""
    scope = f"group\0{cfg.cache_group}" if cfg.cache_group else f"key\0{cfg.name}"
    return hashlib.sha256(b"lane-router cache salt\0" + scope.encode()).hexdigest()


def build_keys(
    configs: tuple[KeyConfig, ...],
    environ: Mapping[str, str] | None = None,
    *,
    rules: FieldRules | None = None,
    isolate_caches: bool = False,
) -> tuple[ApiKey, ...]:
    env = os.environ if environ is None else environ
    rules = rules or FieldRules()
    keys = []
    for cfg in configs:
        raw = cfg.sha256 if cfg.sha256 is not None else env.get(cfg.sha256_env or "", "")
        digest_hex = raw.removeprefix("sha256:").strip().lower()
        if len(digest_hex) != 64:
            raise ValueError(f"key {cfg.name!r}: no valid sha256 in ${cfg.sha256_env}")
        keys.append(
            ApiKey(
                name=cfg.name,
                digest=bytes.fromhex(digest_hex),
                classes=frozenset(cfg.classes) if cfg.classes is not None else None,
                models=frozenset(cfg.models) if cfg.models is not None else None,
                pin_class=cfg.pin_class,
                may_set_class=cfg.may_set_class,
                admin=cfg.admin,
                metrics=cfg.metrics,
                rpm=cfg.rpm,
                tpm=cfg.tpm,
                max_concurrency=cfg.max_concurrency,
                fields=_field_policy(rules, cfg.request_fields),
                cache_salt=cache_salt(cfg) if isolate_caches else None,
                routes=frozenset(cfg.routes if cfg.routes is not None else DEFAULT_ROUTES),
                weight=cfg.weight,
                tier=cfg.tier,
            )
        )
    return tuple(keys)


def _field_policy(profile: FieldRules, key: FieldRules | None) -> FieldPolicy:
    if key is None:
        return FieldPolicy.merged(profile.allow, profile.limits)
    return FieldPolicy.merged(profile.allow, profile.limits, key.allow, key.limits)


class KeyRing:
    """Finds the key a bearer token belongs to without leaking, through timing, which key
    (or how much of one) matched: every stored digest is compared, always.

    A header that has matched, in its canonical form (`Bearer <token>`), is remembered with its
    key, so the next request with it skips the hash and the comparisons. Only a valid token can
    be remembered, so the lookup of any other token finds nothing and takes the full path: its
    timing tells an attacker nothing about the valid ones (a dict compares a stored header's
    bytes only after their keyed 64-bit hashes are equal). At most one header per key is kept,
    and a reload builds a new ring: a key removed from the profile stops working with it."""

    def __init__(self, keys: tuple[ApiKey, ...]) -> None:
        self._keys = keys
        self._matched: dict[bytes, ApiKey] = {}

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def remembered(self) -> int:
        """Headers remembered with their key: never more than there are keys."""
        return len(self._matched)

    def authenticate(self, authorization: bytes | None) -> ApiKey:
        if authorization is not None:
            matched = self._matched.get(authorization)
            if matched is not None:
                return matched
        token = _bearer(authorization)
        digest = hashlib.sha256(token).digest()
        found: ApiKey | None = None
        for key in self._keys:
            if hmac.compare_digest(digest, key.digest):
                found = key
        if found is None:
            raise Unauthorized("invalid API key", code="invalid_api_key")
        if authorization == _CANONICAL + token:
            self._matched[authorization] = found
        return found


_CANONICAL: Final = b"Bearer "


def credentials(authorization: bytes | None, api_key: bytes | None) -> bytes | None:
    """The Authorization a request on an Anthropic route authenticates with: its own, or its
    `x-api-key` (where Anthropic's clients send the key) as a bearer token. Both naming
    different keys are refused: which one a tenant meant is not the router's to guess."""
    if api_key is None:
        return authorization
    token = api_key.strip()
    if not token:
        raise Unauthorized("empty x-api-key header", code="missing_api_key")
    if authorization is not None and _bearer(authorization) != token:
        raise BadRequest(
            "the Authorization and x-api-key headers name different keys: send one",
            code="conflicting_api_keys",
        )
    return _CANONICAL + token


def _bearer(authorization: bytes | None) -> bytes:
    if not authorization:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
    scheme, _, token = authorization.strip().partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        raise Unauthorized(
            "malformed Authorization header: expected 'Bearer <key>'", code="malformed_authorization"
        )
    return token
