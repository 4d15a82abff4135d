"""The profile file, as pydantic models. Field-level rules live here; rules that relate
several parts of the file (lanes → pools, classes → lanes) live in `router.config.checks`."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

from router.balance import DEFAULT as DEFAULT_BALANCE
from router.balance import BalanceSettings, plain_form
from router.config.tls import UpstreamTlsConfig
from router.config.vllm import VllmSettings
from router.request.fields import ENGINE_FIELDS, LIMITED_FIELDS

_ENGINE_LIST = ", ".join(sorted(ENGINE_FIELDS))


class RequestClass(StrEnum):
    CHAT = "chat"
    RAG = "rag"
    LONG_CONTEXT = "long_context"
    AGENT = "agent"
    BATCH = "batch"
    SLOW_STREAM = "slow_stream"


ALL_CLASSES: tuple[RequestClass, ...] = tuple(RequestClass)


class RouteScope(StrEnum):
    """The route families a key may use (`keys[].routes`); docs/http-api.md lists which
    paths each one opens."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"
    RESPONSES = "responses"
    RERANK = "rerank"
    SCORE = "score"
    TOKENIZE = "tokenize"
    AUDIO = "audio"
    MESSAGES = "messages"  # the Anthropic Messages API


# What a key without `routes:` may use: the routes every key could use before route scopes
# existed, so existing profiles keep their meaning and no key gains a route unasked.
DEFAULT_ROUTES: tuple[RouteScope, ...] = (RouteScope.CHAT, RouteScope.COMPLETIONS, RouteScope.EMBEDDINGS)

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolAdmission(Strict):
    """Router-side partial-prefill limits per backend: at most `max_prefilling` requests awaiting
    their first token, of which at most `max_long_prefilling` long ones, so a short prompt always
    finds room while long ones prefill — the rule of vLLM's partial-prefill flags, which vLLM
    0.27 removed, enforced on any version.

    A prompt is long above `long_prompt_tokens`; unset, the pool's
    `vllm.long_prefill_token_threshold` when that is > 0, else DEFAULT_LONG_PROMPT_TOKENS.
    A non-streamed response shows no first token: such a request holds its slot until its
    response starts, or for `prompt_tokens / prefill_tokens_per_s` seconds when that is set."""

    max_prefilling: int | None = Field(None, ge=1)
    max_long_prefilling: int | None = Field(None, ge=0)
    long_prompt_tokens: int | None = Field(None, ge=1)
    prefill_tokens_per_s: float | None = Field(None, gt=0)


class DiscoveryConfig(Strict):
    """A pool's backends found by DNS instead of listed: every A/AAAA address of `dns` (a
    Kubernetes headless Service names exactly its ready pods), at `port`, re-resolved every
    `interval_s`. `nameservers` (`host` or `host:port`) replace the system resolver. At most
    `max_backends` addresses are used (the lowest, so every replica picks the same ones), which
    also bounds the pool's metric labels."""

    dns: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9_.-]+$")
    port: int = Field(8000, ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(5.0, gt=0, le=3600)
    max_backends: int = Field(64, ge=1, le=1024)
    nameservers: tuple[str, ...] = ()


class KVEventsConfig(Strict):
    """Where a pool's engines publish their KV cache events (vLLM's `--kv-events-config`), for
    `precise_prefix` placement (docs/balance.md). `discover` (the default when no `port` is given)
    asks each backend's `GET /kv_event_sources`; `port` and `replay_port` name the publisher on the
    backend's own host instead, rank r of `data_parallel_size` ranks at port + r as vLLM binds
    them. `follow`: unset, the pool follows its engines when one of its lanes balances
    `precise_prefix`; true or false decides it."""

    follow: bool | None = None
    discover: bool | None = None
    port: int | None = Field(None, ge=1, le=65535)
    replay_port: int | None = Field(None, ge=1, le=65535)
    data_parallel_size: int = Field(1, ge=1, le=256)

    @model_validator(mode="after")
    def _one_way_to_find_publishers(self) -> KVEventsConfig:
        if self.port is None:
            if self.discover is False:
                raise ValueError("without discover, give the publisher's port")
            if self.replay_port is not None or self.data_parallel_size != 1:
                raise ValueError(
                    "replay_port and data_parallel_size go with port (discovery lists each rank)"
                )
        elif self.discover:
            raise ValueError("set either discover: true or port, not both")
        return self

    @property
    def discovers(self) -> bool:
        return self.port is None


class PoolConfig(Strict):
    """`backends` lists the pool's servers; `discovery` finds them by DNS instead (exactly one
    of the two). `https://` backends are verified as `tls:` says (router/config/tls.py); without
    a `tls:` block, against the system's CAs and the URL's host."""

    backends: list[HttpUrl] = Field(default_factory=list)
    discovery: DiscoveryConfig | None = None
    model: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    # LoRA adapters of the model (vLLM's --lora-modules names): requests naming one go to the
    # pool's backends whose /v1/models lists it. Written `{name, path}`, the router loads it on
    # demand (`adapter_paths`, filled from those entries; router/fleet/adapters.py).
    adapters: tuple[str, ...] = ()
    adapter_paths: dict[str, str] = Field(default_factory=dict)
    upstream_api_key_env: str | None = None
    upstream_api_key: str | None = None
    connect_timeout_s: float = Field(5.0, gt=0)
    response_head_timeout_s: float = Field(600.0, gt=0)
    """Longest wait from a request's write to the first byte of its response. A non-streamed
    request shows nothing until vLLM has generated the whole answer: allow for the pool's
    longest generation. Past it the client gets 504 `upstream_timeout`."""
    head_read_timeout_s: float = Field(10.0, gt=0)
    """Once a response's first byte arrived, the rest of its head must follow within this, so a
    backend dribbling its head out is cut (504 `upstream_timeout`)."""
    read_timeout_s: float = Field(120.0, gt=0)
    """Longest silence between reads of a response body (an idle timeout: a stream that keeps
    sending is never cut). For a stream it covers the prefill before the first token."""
    upstream_keepalive_s: float = Field(4.0, gt=0, le=3600)
    """How long an idle upstream connection is kept for reuse. Keep it below the backend's own
    keep-alive timeout (5 s for vLLM), so the router, not the backend, closes idle connections: a
    request written as the backend closes its connection is lost, and is never sent again."""
    max_connections: int = Field(1024, ge=1)
    vllm: VllmSettings = VllmSettings()
    admission: PoolAdmission = PoolAdmission()
    tls: UpstreamTlsConfig | None = None
    kv_events: KVEventsConfig | None = None  # unset: discovered, when a lane needs them

    @model_validator(mode="before")
    @classmethod
    def _adapter_entries(cls, data: Any) -> Any:
        """`adapters: [name, {name, path}]`: each name, and the paths to load from apart."""
        if not isinstance(data, dict) or not isinstance(data.get("adapters"), list | tuple):
            return data
        entries = data["adapters"]
        if not any(isinstance(e, dict) for e in entries):
            return data
        if data.get("adapter_paths"):
            raise ValueError("write adapters to load as adapters: [{name: NAME, path: PATH}]")
        names: list[Any] = []
        paths: dict[str, Any] = {}
        for entry in entries:
            if isinstance(entry, dict):
                name, path = entry.get("name"), entry.get("path")
                if set(entry) - {"name", "path"} or not isinstance(name, str) or not isinstance(path, str):
                    raise ValueError(f"an adapter to load is {{name: NAME, path: PATH}}, not {entry!r}")
                if not name or not path:
                    raise ValueError("an adapter's name and path may not be empty")
                names.append(name)
                paths[name] = path
            else:
                names.append(entry)
        return {**data, "adapters": names, "adapter_paths": paths}

    @field_validator("backends")
    @classmethod
    def _origins(cls, urls: list[HttpUrl]) -> list[HttpUrl]:
        for url in urls:
            if url.scheme not in ("http", "https"):
                raise ValueError(f"{url}: backends are http:// or https:// origins")
            if url.path not in (None, "", "/") or url.query or url.fragment or url.username or url.password:
                raise ValueError(
                    f"{url}: a backend is an origin (http://host:port or https://host:port), "
                    "without path, query, fragment or credentials"
                )
        return urls

    @model_validator(mode="after")
    def _one_source_of_backends(self) -> PoolConfig:
        if bool(self.backends) == (self.discovery is not None):
            raise ValueError("set exactly one of backends (a non-empty list) and discovery")
        return self

    @property
    def origins(self) -> tuple[str, ...]:
        """The listed backends' origins (none for a pool found by discovery)."""
        return tuple(f"{u.scheme}://{u.host}:{u.port}" for u in self.backends)

    @property
    def uses_tls(self) -> bool:
        """Whether any backend of the pool is reached over TLS."""
        if self.discovery is not None:
            return self.discovery.scheme == "https"
        return any(u.scheme == "https" for u in self.backends)

    @property
    def models(self) -> tuple[str, ...]:
        return (self.model, *self.aliases, *self.adapters)


class SloConfig(Strict):
    """A lane's per-request service-level objective (router/observe/slo.py): a request meets it
    when it was answered and every bound set holds. `ttft_ms`: arrival to the first response
    byte; `itl_ms`: the request's own 95th-percentile gap between streamed chunks; `e2e_ms`:
    arrival to the last byte. A lane without `slo:` has its class's (router/config/slo.py);
    `slo: null` or `slo: {}` counts nothing."""

    ttft_ms: float | None = Field(None, gt=0)
    itl_ms: float | None = Field(None, gt=0)
    e2e_ms: float | None = Field(None, gt=0)


DEFAULT_LONG_PROMPT_TOKENS = 1024
# Lane fields of earlier profiles, now settings of the prefix_affinity strategy.
_MOVED_TO_BALANCE = {"affinity": "affinity", "affinity_min_tokens": "min_tokens", "affinity_slack": "slack"}


class LaneConfig(Strict):
    """One lane: the pool it sends to and its own policy.

    `balance`: the strategy that picks a backend of the pool, with its own settings
    (router/balance/, docs/balance.md): `balance: NAME`, or `balance: {strategy: NAME, ...}`.
    `priority`: lower goes first when lanes sharing a pool wait for room (then keys by `tier`, and
    fairly by `weight`). `queue_limit` is shared by the keys waiting: a key holding fewer places
    for its weight takes the newest place of the key holding the most. `fair_by`: what a key's
    turn is counted in, `requests` (each request one turn) or `tokens` (its prompt and output
    bound); lanes sharing a pool at one `priority` share their order, so they count alike.
    `decouple`: always relay
    through a per-stream buffer, as for a detected slow client. `max_prompt_tokens` /
    `max_output_tokens`: the request shape the lane accepts (400 beyond it), which is also the
    shape its capacity evidence must cover."""

    pool: Name
    balance: BalanceSettings = DEFAULT_BALANCE
    priority: int = Field(0, ge=0, le=100)
    max_in_flight: int | None = Field(None, ge=1)
    queue_limit: int = Field(1024, ge=0)
    queue_timeout_s: float = Field(30.0, gt=0)
    fair_by: Literal["requests", "tokens"] = "requests"
    decouple: bool = False
    max_prompt_tokens: int | None = Field(None, ge=1)
    max_output_tokens: int | None = Field(None, ge=1)
    # Unset: its class's SLO (router/config/slo.py); `null` or `{}`: none counted.
    slo: SloConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _affinity_moved(cls, data: Any) -> Any:
        moved = [name for name in _MOVED_TO_BALANCE if isinstance(data, dict) and name in data]
        if not moved:
            return data
        block = {"strategy": "prefix_affinity", "affinity": data.get("affinity", "prefix")}
        block |= {_MOVED_TO_BALANCE[name]: data[name] for name in moved if name != "affinity"}
        spelled = ", ".join(f"{key}: {value}" for key, value in block.items())
        raise ValueError(f"{', '.join(moved)} moved into balance: write balance: {{{spelled}}}")

    @field_validator("balance", mode="before")
    @classmethod
    def _plain_name(cls, value: Any) -> Any:
        return plain_form(value)


class ModelConfig(Strict):
    """One served model's own settings (`models.M`, M a pool's `model`): its lanes, class →
    lane, for a model whose lanes are not the top-level `lanes:` (router/config/lanemap.py), and
    how its prompts are counted."""

    lanes: dict[RequestClass, LaneConfig] = Field(default_factory=dict)
    tokenizer: str | None = Field(None, min_length=1)


class RepeatedPrefix(Strict):
    min_tokens: int = Field(512, ge=1)
    seen: int = Field(2, ge=1)
    window_s: float = Field(600.0, gt=0)
    max_entries: int = Field(65536, ge=16)


class ClassifyConfig(Strict):
    long_context_tokens: int = Field(6000, ge=1)
    batch_min_output_tokens: int = Field(256, ge=1)
    repeated_prefix: RepeatedPrefix = RepeatedPrefix()
    default_class: RequestClass = RequestClass.CHAT


class FieldRules(Strict):
    """Body fields beyond the open set (router.request.fields): `allow` names engine fields a key
    may set (e.g. `vllm_xargs`); `limits` bounds numeric fields (`n`, `best_of`, `logprobs`,
    `top_logprobs`, `prompt_logprobs`, and `max_tokens`, the output per sequence) and
    `grammar_bytes`, the JSON size of an output grammar (router.request.fields). A key's rules
    add to the profile's: its `allow` joins the profile's, its `limits` override them."""

    allow: tuple[str, ...] = ()
    limits: dict[str, int] = Field(default_factory=dict)

    @field_validator("allow")
    @classmethod
    def _engine_fields(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [n for n in names if n not in ENGINE_FIELDS]
        if unknown:
            raise ValueError(f"not an engine field: {', '.join(unknown)} (engine fields: {_ENGINE_LIST})")
        return names

    @field_validator("limits")
    @classmethod
    def _limited_fields(cls, limits: dict[str, int]) -> dict[str, int]:
        unknown = [n for n in limits if n not in LIMITED_FIELDS]
        if unknown:
            bounded = ", ".join(sorted(LIMITED_FIELDS))
            raise ValueError(f"no bound for {', '.join(unknown)} (bounded: {bounded})")
        negative = [n for n, v in limits.items() if v < 0]
        if negative:
            raise ValueError(f"bounds must be ≥ 0: {', '.join(negative)}")
        return limits


class PromptCostsConfig(Strict):
    """Tokens a prompt costs beyond its texts, so the estimate stays an upper bound of what vLLM
    counts: the chat template's tokens per request and per message, tool-definition
    boilerplate, and each image / audio clip / video's placeholder tokens (raise them for
    models whose template or vision encoder uses more)."""

    per_request: int = Field(32, ge=0)
    per_message: int = Field(8, ge=0)
    tools: int = Field(128, ge=0)
    image: int = Field(2048, ge=0)
    audio: int = Field(1500, ge=0)
    video: int = Field(16384, ge=0)
    # Audio uploads are charged for the longest recording their size can hold at this bitrate
    # (bits/s): the lowest of the common speech codecs by default.
    audio_min_bitrate: int = Field(6000, ge=100)
    # vLLM refuses audio longer than its VLLM_MAX_AUDIO_DECODE_DURATION_S (600 s by default):
    # set this to the same value, which caps what an upload is charged for.
    audio_max_duration_s: int = Field(600, ge=1)
    # A WAV upload's header may lower its charge (its own bitrate, above audio_min_bitrate)
    # only where vLLM decodes with libsndfile alone (`--media-io-kwargs '{"audio":
    # {"audio_backend": "soundfile"}}'`), which reads a WAV file by its header. FFmpeg, vLLM's
    # first decoder by default, picks its reader by the content: the same bytes can read as
    # MPEG-TS, IEC 61937 bursts or an ACT recording, at their own, lower bitrate.
    audio_wav_header: bool = False


class KeyConfig(Strict):
    name: Name
    sha256: str | None = Field(None, pattern=r"^(sha256:)?[0-9a-f]{64}$")
    sha256_env: str | None = None
    classes: tuple[RequestClass, ...] | None = None
    models: tuple[str, ...] | None = None
    pin_class: RequestClass | None = None
    may_set_class: bool = False
    admin: bool = False
    metrics: bool = False
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    max_concurrency: int | None = Field(None, ge=1)
    # Waiting for room in a lane: the key's share of it against the other keys waiting there
    # (`weight`), and its band (a higher `tier` is served first).
    weight: float = Field(1.0, gt=0, le=1000)
    tier: int = Field(0, ge=0, le=100)
    request_fields: FieldRules | None = None
    cache_group: Name | None = None
    # Route families the key may use; unset: DEFAULT_ROUTES.
    routes: tuple[RouteScope, ...] | None = Field(None, min_length=1)


class SlowClientConfig(Strict):
    """A client lags when the bytes not yet delivered to it (received from upstream and not yet
    written, plus written and not yet acknowledged by its TCP stack) exceed `lag_bytes`; keep it
    above the bandwidth-delay product of a fast client's path. A lagging stream is decoupled
    (upstream drained into a buffer of at most `max_stream_buffer_bytes`; all such buffers
    together at most `max_buffer_bytes`, past which upstream reads wait) and the client is
    remembered for `remember_s` (at most `max_remembered` clients), so its next streams take
    the slow_stream lane. A client going away cancels its request (which frees vLLM's KV blocks
    at once): the router's own server tells at once; under another ASGI server a request is
    watched for it once it has run `watch_disconnect_after_s`, and a disconnect before then is
    noticed at that point: shorter notices sooner, longer costs fewer watcher tasks."""

    lag_bytes: int = Field(128 * 1024, ge=1024)
    watch_disconnect_after_s: float = Field(0.02, gt=0, le=60)
    remember_s: float = Field(600.0, gt=0)
    max_remembered: int = Field(65536, ge=16)
    max_stream_buffer_bytes: int = Field(16 * 1024 * 1024, ge=64 * 1024)
    max_buffer_bytes: int = Field(512 * 1024 * 1024, ge=64 * 1024)


class ScrapeConfig(Strict):
    """Polling of backends' /metrics for load (power-of-two lanes only)."""

    interval_s: float = Field(1.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)


class HealthConfig(Strict):
    """Probes of each backend's /health every `interval_s`, and of its /version and /v1/models
    against the pool's profile (drift, router/fleet/health.py). `on_drift`: `warn` logs each
    difference; `refuse` also refuses to start, and refuses a reload, while a server differs."""

    interval_s: float = Field(5.0, gt=0)
    timeout_s: float = Field(2.0, gt=0)
    unhealthy_after: int = Field(3, ge=1)
    healthy_after: int = Field(1, ge=1)
    on_drift: Literal["warn", "refuse"] = "warn"


class StateConfig(Strict):
    """State shared by several router replicas: per-key rate limits and the slow-client memory.
    Without `redis_url` (or `redis_url_env`, the variable holding it, for URLs with a password)
    each replica keeps its own in memory.

    Every Redis operation is bounded by `timeout_s`; after a failure the replica answers from
    its policy for `recheck_s` before trying Redis again. `on_error` says what a rate-limited
    request gets meanwhile: `open` lets it through uncounted, `closed` refuses it (503).
    Slow-client lookups fall back to the replica's own memory either way. A key's concurrency
    slot is a lease its replica renews while the request runs: one held by a replica that died,
    or charged by Redis after the replica gave up waiting, is freed within `lease_s`."""

    redis_url: str | None = None
    redis_url_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    on_error: Literal["open", "closed"] = "open"
    timeout_s: float = Field(0.25, gt=0, le=10)
    recheck_s: float = Field(1.0, gt=0, le=300)
    key_prefix: str = Field("lane-router:", max_length=64)
    max_connections: int = Field(64, ge=1, le=4096)
    lease_s: float = Field(60.0, ge=1, le=86400)
    heartbeat_s: float = Field(2.0, gt=0, le=60)
    """How often each process renews its hold on admission slots; a process's slots outlive its
    last heartbeat by five of these."""

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str | None) -> str | None:
        if url is None:
            return url
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        try:
            urlsplit(url).port  # noqa: B018 - parsing the port is the check
        except ValueError as err:
            raise ValueError(f"invalid URL: {err}") from None
        return url

    @model_validator(mode="after")
    def _one_source(self) -> StateConfig:
        if self.redis_url is not None and self.redis_url_env is not None:
            raise ValueError("set at most one of redis_url and redis_url_env")
        return self

    @property
    def shared(self) -> bool:
        return self.redis_url is not None or self.redis_url_env is not None


class ResponseIdsConfig(Strict):
    """The memory of which backend holds each Responses-API response the router relayed (vLLM
    keeps stored responses in the memory of the server that made them): at most `max_entries`
    ids in each router process, each for `ttl_s` after its response started. With `state:` the
    ids are also written to Redis (with the same TTL), so every replica finds them."""

    ttl_s: float = Field(86400.0, gt=0, le=30 * 86400)
    max_entries: int = Field(65536, ge=16, le=10_000_000)


class ProfileConfig(Strict):
    profile: str = "custom"
    description: str = ""
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    debug_headers: bool = False
    # Every model's tokenizer unless it names its own (router/request/tokenizer_source.py): a
    # tokenizer.json or a directory holding one (exact); `utf8-bytes`: one token per UTF-8 byte,
    # an upper bound for byte-level BPE tokenizers; `simulator`: lane-router sim's engines only.
    # Unset: each model's own, found locally, else the byte bound and the backends' /tokenize.
    tokenizer: str | None = Field(None, min_length=1)
    prompt_costs: PromptCostsConfig = PromptCostsConfig()
    request_fields: FieldRules = FieldRules()
    # `per_key`: every request carries vLLM's cache_salt for its key (or its key's cache_group),
    # replacing the client's, so no tenant's prompts hit another's prefix cache.
    prefix_cache_isolation: Literal["off", "per_key"] = "off"
    pools: dict[Name, PoolConfig] = Field(min_length=1)
    # The lanes of one model (the model of the pools they name). With one pool, a class without
    # a lane of its own gets a default lane to that pool.
    lanes: dict[RequestClass, LaneConfig] = Field(default_factory=dict)
    # The other models' lanes and settings, by model name (router/config/lanemap.py).
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    classify: ClassifyConfig = ClassifyConfig()
    keys: tuple[KeyConfig, ...] = ()
    health: HealthConfig = HealthConfig()
    slow_clients: SlowClientConfig = SlowClientConfig()
    scrape: ScrapeConfig = ScrapeConfig()
    state: StateConfig = StateConfig()
    response_ids: ResponseIdsConfig = ResponseIdsConfig()
    # How many identical router replicas run this profile behind one load balancer. Without
    # `state:` each enforces `limit // replicas` of every lane and prefill limit (and splits that
    # among its workers) instead of the whole limit; with it, that is its share while Redis is
    # unreachable (router/state/slots/budget.py).
    replicas: int = Field(1, ge=1, le=1024)

    @model_validator(mode="before")
    @classmethod
    def _one_pool_takes_every_class(cls, data: Any) -> Any:
        """With one pool there is nowhere else to send a request: every class the file gives no
        lane goes to it, with a lane's defaults. Several pools still need a lane per class."""
        if not isinstance(data, dict):
            return data
        pools, lanes = data.get("pools"), data.get("lanes", {})
        if not isinstance(pools, dict) or len(pools) != 1 or not isinstance(lanes, dict):
            return data
        (only,) = pools
        if not lanes and _has_own_lanes(data.get("models"), pools[only]):
            return data  # the model's lanes are under `models:`
        named = {str(c) for c in lanes}
        filled = {c.value: {"pool": only} for c in ALL_CLASSES if c.value not in named}
        return {**data, "lanes": {**lanes, **filled}} if filled else data


def _has_own_lanes(models: Any, pool: Any) -> bool:
    """Whether `models:` gives the pool's model lanes of its own."""
    if not isinstance(models, dict) or not isinstance(pool, dict):
        return False
    entry = models.get(pool.get("model"))
    return isinstance(entry, dict) and bool(entry.get("lanes"))
