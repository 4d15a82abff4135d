"""A prompt's exact length from the backends, for a model the router has no tokenizer for.

Its byte bound (router/request/tokens.py) is an upper bound and a lower estimate lies at an
eighth of it. When the two fall on either side of something the prompt's length decides — the
class threshold, the repeated-prefix length, a lane's `max_prompt_tokens`, a pool's long-prompt
admission threshold or context length, the key's tpm — the router asks a healthy backend of the
model's pools `POST /tokenize` (the body's messages, tools and template settings, which vLLM
renders through the model's chat template; or the completions prompt, the embeddings input; an
Anthropic body goes to vLLM's `POST /v1/messages/count_tokens`, which converts and renders it as
its Messages API does), bounded in time and in bytes, with the pool's upstream key. Its count
then decides, clamped to the lower estimate and the byte bound: a backend is believed only
between them. A backend that cannot count (an error, a timeout, no healthy backend) leaves the
byte bound deciding: counted in `lane_router_prompt_counts_total{model,how="byte_bound"}` and
logged once per model.

Prompts with media are not asked about (their placeholders are counted by the bound's costs),
nor chats with `documents`, which vLLM's tokenize request does not take.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import orjson

from router.keys.auth import ApiKey
from router.lanes.route import ModelRoute
from router.request.facts import RequestFacts
from router.request.tokens import decides, lower_estimate
from router.state.runtime import Runtime

log = logging.getLogger("lane_router.proxy")

TOKENIZE_TIMEOUT_S: Final = 2.0
# The answer lists the token ids too: room for them, a few bytes each, beyond the count.
_ANSWER_BASE: Final = 64 * 1024
_ANSWER_PER_TOKEN: Final = 12
# Chat fields vLLM's tokenize request takes beside the messages, as the chat request renders them.
_CHAT_FIELDS: Final = (
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
)
_ASKED: Final = frozenset({"chat", "completions", "embeddings", "messages", "count_tokens"})
_TOKENIZE: Final = ("/tokenize", "count")
# An Anthropic body is counted by vLLM's own count of it, through the same conversion and template.
_COUNT_TOKENS: Final = ("/v1/messages/count_tokens", "input_tokens")
_COUNTED_MESSAGE_FIELDS: Final = (
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
    "chat_template_kwargs",
)
_ANTHROPIC_TEXT_BLOCKS: Final = frozenset(
    {"text", "thinking", "redacted_thinking", "tool_use", "tool_result"}
)
_TEXT_PARTS: Final = frozenset({"text", "input_text", "refusal", "thinking"})


def thresholds(runtime: Runtime, route: ModelRoute, facts: RequestFacts, key: ApiKey) -> list[int]:
    """The prompt lengths at which something is decided for this request of the route's model."""
    rules = runtime.classify_rules
    out = [rules.long_context_tokens, rules.repeated_prefix_tokens]
    output = facts.output_tokens or 0
    for lane in route.lanes.values():
        if lane.config.max_prompt_tokens is not None:
            out.append(lane.config.max_prompt_tokens)
    for pool in route.pools:
        out.append(pool.gate.limits.long_prompt_tokens)
        out.append(pool.max_model_len)
    limits = key.limits
    if limits is not None and limits.tpm is not None:
        out.append(limits.tpm)
        if output:
            out.append(limits.tpm - output)
    return out


def undecided(runtime: Runtime, route: ModelRoute, facts: RequestFacts, key: ApiKey) -> bool:
    """Whether the byte bound and its lower estimate straddle a decision, for a prompt the
    backends can count."""
    if facts.endpoint not in _ASKED:
        return False
    upper = facts.prompt_tokens
    if not decides(lower_estimate(upper), upper, thresholds(runtime, route, facts, key)):
        return False
    return tokenize_body(facts) is not None


def tokenize_body(facts: RequestFacts) -> dict[str, Any] | None:
    """What vLLM's `/tokenize` (an Anthropic body: its count_tokens) takes for this request's
    prompt; None when it cannot say."""
    body = facts.body
    if facts.endpoint in ("messages", "count_tokens"):
        return _count_tokens_body(facts)
    if facts.endpoint in ("completions", "embeddings"):
        prompt = body.get("prompt" if facts.endpoint == "completions" else "input")
        if not isinstance(prompt, str) or "suffix" in body:
            return None
        return {"model": facts.model, "prompt": prompt}
    # vLLM's tokenize request has no `documents`: it would count them out.
    if facts.endpoint != "chat" or "documents" in body or _has_media(body["messages"]):
        return None
    return _prompt_of(facts, _CHAT_FIELDS)


def _count_tokens_body(facts: RequestFacts) -> dict[str, Any] | None:
    """The body's prompt as vLLM's `/v1/messages/count_tokens` takes it; None with images or
    documents, whose placeholders the router's bound counts by the profile's costs."""
    body = facts.body
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, list) and any(_anthropic_media(block) for block in content):
            return None
    return _prompt_of(facts, _COUNTED_MESSAGE_FIELDS)


def _prompt_of(facts: RequestFacts, fields: tuple[str, ...]) -> dict[str, Any]:
    """The model, the messages and those of `fields` the body sets: what renders its prompt."""
    body = facts.body
    asked: dict[str, Any] = {"model": facts.model, "messages": body["messages"]}
    asked.update((name, body[name]) for name in fields if body.get(name) is not None)
    return asked


def _anthropic_media(block: Any) -> bool:
    if not isinstance(block, dict) or block.get("type") not in _ANTHROPIC_TEXT_BLOCKS:
        return True
    inner = block.get("content") if block.get("type") == "tool_result" else None
    return isinstance(inner, list) and any(_anthropic_media(part) for part in inner)


def _has_media(messages: list[Any]) -> bool:
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(part.get("type") not in _TEXT_PARTS for part in content):
            return True
    return False


async def exact_facts(runtime: Runtime, route: ModelRoute, facts: RequestFacts) -> RequestFacts:
    """The facts with the backends' count of the prompt, or as they are when none could count."""
    model = route.model
    asked = tokenize_body(facts)
    how = _COUNT_TOKENS if facts.endpoint in ("messages", "count_tokens") else _TOKENIZE
    count = await _ask(runtime, asked, how, route, facts.prompt_tokens) if asked is not None else None
    counted = runtime.metrics.prompt_counts
    if count is None:
        counted.labels(model, "byte_bound").inc()
        if not route.uncounted_said:
            route.uncounted_said = True
            log.warning(
                "no backend of model %r could count a prompt (POST /tokenize): its byte bound decides",
                model,
            )
        return facts
    counted.labels(model, "backend").inc()
    # A backend is believed only between the router's own bounds: one that miscounts (or lies)
    # can neither lift a prompt past its byte bound nor shrink it below its lower estimate.
    upper = facts.prompt_tokens
    return facts.with_prompt_tokens(min(max(count, lower_estimate(upper)), upper))


async def _ask(
    runtime: Runtime, asked: dict[str, Any], how: tuple[str, str], route: ModelRoute, upper: int
) -> int | None:
    """`how`: the path asked and the answer's field holding the count."""
    path, field = how
    candidates = [(pool, b) for pool in route.pools for b in pool.routable()]
    if not candidates:
        return None
    route.count_asks += 1
    pool, backend = candidates[route.count_asks % len(candidates)]
    headers = {"content-type": "application/json"}
    if pool.upstream_key:
        headers["authorization"] = "Bearer " + pool.upstream_key.decode("latin-1")
    answer = await runtime.fleet.probes.post(
        pool.tls,
        backend.name + path,
        orjson.dumps(asked),
        cap=_ANSWER_BASE + _ANSWER_PER_TOKEN * upper,
        timeout=TOKENIZE_TIMEOUT_S,
        headers=headers,
    )
    if answer is None or answer.status != 200:
        return None
    try:
        count = orjson.loads(answer.body).get(field)
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return None
    return count
