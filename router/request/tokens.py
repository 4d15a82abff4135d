"""Prompt-token counts the router can stand behind.

Each model is counted by its own tokenizer where one is found (router/request/tokenizer_source.py),
its chat prompts through its chat template (router/request/chattemplate.py); without one, by the
bound below, which the backends' `/tokenize` makes exact where it decides something
(router/proxy/exactcount.py).

A tenant must not be able to make a long prompt look short, so by default a text counts one
token per UTF-8 byte: a byte-level BPE tokenizer (Llama 3, GPT, Qwen, the test suite's own
model) never makes more tokens than bytes, whatever the script — CJK, emoji and combining marks
included. With the model's `tokenizer.json` the count is exact. Either way the chat template's
own tokens (role headers, turn markers, a default system prompt, tool boilerplate) and media
placeholders are added from `PromptCosts`, so the sum is an upper bound of what vLLM counts.

`simulator` is the rule of `lane-router sim`, whose engines have no tokenizer and count four
characters a token with no template: exact for those engines and for nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

# The simulator's rule (4 characters a token, at least one per text). It is also the unit of
# the prefix fingerprints' blocks (router.request.facts), which only need a stable size in characters.
CHARS_PER_TOKEN: Final = 4

UTF8_BYTES: Final = "utf8-bytes"
SIMULATOR: Final = "simulator"
# A lower estimate of a byte-bound count: a byte-level BPE tokenizer's tokens of ordinary text
# average well under 8 bytes (English about 4, CJK 2 to 3). It is an estimate, not a bound: a
# prompt of longer tokens (long runs of one character) is judged above a threshold its estimate
# passes without asking — the router counts more there, never less.
LOWER_BYTES_PER_TOKEN: Final = 8


def estimate_text_tokens(text: str) -> int:
    """The simulator's count of one text: one per 4 characters, at least 1."""
    return max(1, len(text) // CHARS_PER_TOKEN)


def message_text(message: Mapping[str, Any]) -> str:
    """The text of one chat message that counts toward the prompt: its content (a string or
    text parts), then any tool calls' names and arguments."""
    content = message.get("content")
    parts: list[str] = []
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            parts.append(str(function.get("name") or ""))
            parts.append(str(function.get("arguments") or ""))
    return "".join(parts)


def estimate_messages_tokens(messages: list[Mapping[str, Any]]) -> int:
    """The simulator's count of a chat prompt: its rule per message."""
    return sum(estimate_text_tokens(message_text(m)) for m in messages)


class TextCounter(Protocol):
    def count(self, text: str) -> int: ...


class ChatCount(Protocol):
    """A chat request's exact prompt length through the model's chat template, or None when
    the body asks for something the template count does not cover."""

    def count(self, data: dict[str, Any]) -> int | None: ...

    def encode(self, data: dict[str, Any]) -> list[int] | None:
        """The prompt's token ids (their number is `count`), or None where `count` is."""
        ...


class PromptIds(Protocol):
    """A model's prompt token ids as its engine computes them, for the bodies they can be known
    exactly from (router/request/promptids.py); None for the others."""

    def of(self, endpoint: str, data: dict[str, Any]) -> list[int] | None: ...


class Utf8ByteCounter:
    """One token per UTF-8 byte: an upper bound for byte-level BPE tokenizers."""

    def count(self, text: str) -> int:
        if text.isascii():
            return len(text)
        return len(text.encode("utf-8", "surrogatepass"))


class TokenizerCounter:
    """Exact counts with the model's own tokenizer (the `tokenizers` package, no model hub)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


@dataclass(frozen=True, slots=True)
class PromptCosts:
    """Tokens a prompt costs beyond its texts: the chat template's per-request and per-message
    tokens, tool-definition boilerplate, and each media item's placeholder tokens."""

    per_request: int = 32
    per_message: int = 8
    tools: int = 128
    image: int = 2048
    audio: int = 1500
    video: int = 16384
    # Bits a second of uploaded audio takes at the least (router.request.audiofacts): bounds the
    # recording's duration from its size.
    audio_min_bitrate: int = 6000
    # The longest recording vLLM decodes (its VLLM_MAX_AUDIO_DECODE_DURATION_S): it refuses
    # longer ones, so no upload makes more clips than this duration holds.
    audio_max_duration_s: int = 600
    # Whether a WAV header's bitrate bounds the duration (router.request.wavheader): only where vLLM
    # decodes audio with libsndfile alone, which reads a WAV file by its header.
    audio_wav_header: bool = False


@dataclass(frozen=True, slots=True)
class Media:
    """Media items of one message, by kind."""

    images: int = 0
    audio: int = 0
    video: int = 0


# A message without media (the common case) shares this one, rather than building its own.
NO_MEDIA: Final = Media()


class PromptCounter:
    """Counts what a request's prompt costs the engine, as an upper bound."""

    exact_for_simulator = False

    def __init__(
        self, text: TextCounter, costs: PromptCosts, chat: ChatCount | None = None, asks_backend: bool = False
    ) -> None:
        self._text = text
        self.costs = costs
        self.chat = chat  # the chat template's exact count, where the model has one
        # The prompt's token ids, where the model's tokenizer (or the simulator's rule) gives
        # them: asked only for `precise_prefix` lanes' requests (router/proxy/handler.py).
        self.ids: PromptIds | None = None
        # The byte bound of a model without a tokenizer: the backends count where it decides.
        self.asks_backend = asks_backend
        # The shortest prompt length the model's profile decides anything at (a key's tpm aside):
        # a shorter prompt's bound decides nothing, and is not looked at further.
        self.ask_above = 0
        # A message's cost beyond its text, by role: the same for every message of a role.
        self._roles: dict[str, int] = {}

    def text(self, text: str) -> int:
        return self._text.count(text)

    def request(self) -> int:
        return self.costs.per_request

    def message(self, role: str, text: str, other: str, media: Media) -> int:
        """`text`: the message's content and tool calls (`message_text`); `other`: its other
        fields the template renders (name, tool_call_id, reasoning)."""
        c = self.costs
        return (
            c.per_message
            + self._text.count(role)
            + self._text.count(text)
            + (self._text.count(other) if other else 0)
            + media.images * c.image
            + media.audio * c.audio
            + media.video * c.video
        )

    def plain_message(self, role: str, text: str) -> int:
        """`message` for a message of a role and a text alone: no other fields, no media."""
        roles = self._roles
        cost = roles.get(role)
        if cost is None:
            cost = roles[role] = self.costs.per_message + self._text.count(role)
        return cost + self._text.count(text)

    def tools(self, tools: object) -> int:
        """Tool definitions: the template's tool boilerplate and the definitions as rendered."""
        return self.costs.tools + self.rendered(tools)

    def rendered(self, value: object) -> int:
        """A value of the body a chat template renders, at an upper bound of its rendered text.
        A string renders as itself or, through `tojson`, escaped and quoted: its JSON bounds
        both. A structure renders through `tojson` (Python's separators, an indent of up to 4)
        or as Python's repr; twice its JSON at an indent of 2 bounds each — the indent at most
        doubles, and no escape is longer than JSON's."""
        if isinstance(value, str):
            return self._text.count(orjson.dumps(value).decode())
        return 2 * self._text.count(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


class SimulatorCounter(PromptCounter):
    """`lane-router sim`'s own count: 4 characters a token per text, no template, no media."""

    exact_for_simulator = True

    def __init__(self) -> None:
        super().__init__(
            _SimulatorText(),
            PromptCosts(
                per_request=0,
                per_message=0,
                tools=0,
                image=0,
                audio=0,
                video=0,
                audio_min_bitrate=6000,
                audio_max_duration_s=600,
            ),
        )

    def message(self, role: str, text: str, other: str, media: Media) -> int:
        return estimate_text_tokens(text)

    def plain_message(self, role: str, text: str) -> int:
        return estimate_text_tokens(text)

    def tools(self, tools: object) -> int:
        return 0

    def rendered(self, value: object) -> int:
        return 0


class _SimulatorText:
    def count(self, text: str) -> int:
        return estimate_text_tokens(text)


class Counters:
    """Each served model's counter (any name a pool serves), and the one for a name no pool
    serves (its request is refused once the model is looked up)."""

    __slots__ = ("by_model", "default")

    def __init__(self, by_model: dict[str, PromptCounter], default: PromptCounter) -> None:
        self.by_model: Final = by_model
        self.default: Final = default

    def get(self, model: str) -> PromptCounter:
        counter = self.by_model.get(model)
        return self.default if counter is None else counter


def lower_estimate(upper: int) -> int:
    """A lower estimate of a prompt whose byte-bound count is `upper`."""
    return upper // LOWER_BYTES_PER_TOKEN


def decides(lower: int, upper: int, thresholds: list[int]) -> bool:
    """Whether a prompt known only to lie between `lower` and `upper` tokens could fall on
    either side of one of `thresholds` (a decision at `n` tokens is `> n` or `>= n`)."""
    return any(lower <= threshold <= upper for threshold in thresholds)


def make_counter(tokenizer: str | None, costs: PromptCosts | None = None) -> PromptCounter:
    """`utf8-bytes` (or nothing): the upper bound; `simulator`: the simulator's rule; anything
    else: the path of a `tokenizer.json` or of a directory holding one."""
    costs = costs or PromptCosts()
    if not tokenizer or tokenizer == UTF8_BYTES:
        return PromptCounter(Utf8ByteCounter(), costs)
    if tokenizer == SIMULATOR:
        return SimulatorCounter()
    path = Path(tokenizer)
    return PromptCounter(TokenizerCounter(path / "tokenizer.json" if path.is_dir() else path), costs)
