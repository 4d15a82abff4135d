"""Prompt-token estimates: a fast character heuristic by default, exact counts from a
`tokenizer.json` when the profile names one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

# English-like text averages about four characters a token in BPE vocabularies. This is the one
# definition of the heuristic: the simulator maps text to exactly this many token ids, so the
# router's estimate and the simulated server's prompt length agree.
CHARS_PER_TOKEN = 4


def estimate_text_tokens(text: str) -> int:
    """Prompt tokens of one text: one per 4 characters, at least 1."""
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


def estimate_messages_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Prompt tokens of a chat request: the text estimate per message."""
    return sum(estimate_text_tokens(message_text(m)) for m in messages)


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


class HeuristicCounter:
    def count(self, text: str) -> int:
        return estimate_text_tokens(text)


class TokenizerCounter:
    """Exact counts with the model's own tokenizer (the `tokenizers` package, no model hub)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


def make_counter(tokenizer_path: str | None) -> TokenCounter:
    return TokenizerCounter(tokenizer_path) if tokenizer_path else HeuristicCounter()
