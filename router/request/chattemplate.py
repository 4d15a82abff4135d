"""A chat prompt counted as vLLM counts it: the model's chat template rendered over the
messages, then tokenized by the model's tokenizer without added special tokens (the template
writes them).

The template comes from the model's files (the profile's path or the model's cache), never from
a client, and renders in a sandboxed Jinja environment with the helpers chat templates expect
(`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text). The messages are the
client's, as data only. Bodies the template count does not reproduce exactly — media, tools,
documents, template arguments, a client's own template, a continued final message, structured
content — are counted by the per-message bound instead (router/request/tokens.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from router.request.apifacts import TEMPLATE_FIELDS
from router.request.promptids import SimulatorIds, TokenizerIds
from router.request.tokenizer_source import BY_BACKEND, BY_BYTES, BY_SIMULATOR, TokenizerSource
from router.request.tokens import (
    PromptCosts,
    PromptCounter,
    SimulatorCounter,
    TokenizerCounter,
    Utf8ByteCounter,
)

# Body fields the template count leaves to the per-message bound.
_OUTSIDE: Final = frozenset(
    {
        "tools",
        "documents",
        "chat_template",
        "chat_template_kwargs",
        "continue_final_message",
        "add_special_tokens",
        "mm_processor_kwargs",
        *TEMPLATE_FIELDS,
    }
)
_MESSAGE_KEYS: Final = frozenset({"role", "content", "name"})


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class TemplateCount:
    """`ChatCount` by a chat template and its tokenizer."""

    def __init__(self, template: str, special: Mapping[str, str], tokenizer: Any) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        self._template = env.from_string(template)
        self._special = dict(special)
        self._tokenizer = tokenizer

    def render(self, messages: list[Any], add_generation_prompt: bool) -> str:
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self._special
        )

    def count(self, data: dict[str, Any]) -> int | None:
        ids = self.encode(data)
        return None if ids is None else len(ids)

    def encode(self, data: dict[str, Any]) -> list[int] | None:
        """The prompt's token ids as vLLM's chat route makes them: the template rendered, then
        encoded without added special tokens (the template writes them)."""
        if not _plain(data):
            return None
        add = data.get("add_generation_prompt", True)
        try:
            text = self.render(data["messages"], add if isinstance(add, bool) else True)
        except (TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError):
            return None  # vLLM refuses it too, or renders it otherwise: the bound counts it
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids


def _plain(data: dict[str, Any]) -> bool:
    """Messages of a role, a string content and at most a name, and nothing else the template
    renders."""
    if not _OUTSIDE.isdisjoint(data):
        return False
    messages = data.get("messages")
    if not isinstance(messages, list):
        return False
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return False
        if not _MESSAGE_KEYS.issuperset(message):
            return False
    return True


def counter_for(source: TokenizerSource, costs: PromptCosts) -> PromptCounter:
    """The counter a model's tokenizer source calls for."""
    if source.how == BY_SIMULATOR:
        sim = SimulatorCounter()
        sim.ids = SimulatorIds()
        return sim
    if source.how in (BY_BYTES, BY_BACKEND):
        return PromptCounter(Utf8ByteCounter(), costs, asks_backend=source.how == BY_BACKEND)
    assert source.path is not None
    text = TokenizerCounter(source.path)
    chat = None
    if source.template is not None:
        chat = TemplateCount(source.template, source.special or {}, text.tokenizer)
    counter = PromptCounter(text, costs, chat=chat)
    counter.ids = TokenizerIds(text.tokenizer)
    return counter
