"""A prompt's token ids as its engine will compute them, for a `precise_prefix` lane (which
matches them against the blocks each engine reports holding, router/fleet/kvindex.py).

Only what the router can know exactly gets ids; anything else gets none, and is placed by
approximation:

* chat, a model with a tokenizer and a chat template: the template count's own ids (the template
  rendered over the messages, encoded without added special tokens), for the bodies that count
  covers (router/request/chattemplate.py) — taken from the request's facts, never rendered twice;
* completions, a model with a tokenizer: a string prompt (or a list of one) encoded as vLLM's
  completions route encodes it — with the tokenizer's special tokens (a BOS) unless the body's
  `add_special_tokens` is false; a prompt of token ids is those ids. A body that truncates its
  prompt (`truncate_prompt_tokens`), sends embeddings, or holds several prompts gets none;
* a model counted by the simulator's rule: the simulator's own ids (router/request/simtokens.py);
* a model counted by the byte bound: none.
"""

from __future__ import annotations

from typing import Any, Final

from router.request.simtokens import chat_token_ids, completion_token_ids

# Completions fields that make vLLM's prompt something else than the prompt's own encoding.
_RESHAPED: Final = ("truncate_prompt_tokens", "prompt_embeds", "suffix")


class TokenizerIds:
    """`PromptIds` of a model with its own tokenizer (the `tokenizers` package's)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def of(self, endpoint: str, data: dict[str, Any]) -> list[int] | None:
        # A chat prompt's ids come with its template count (RequestFacts.token_ids) or not at all.
        if endpoint != "completions" or any(data.get(name) is not None for name in _RESHAPED):
            return None
        prompt = _single(data.get("prompt"))
        if isinstance(prompt, str):
            special = data.get("add_special_tokens", True)
            if not isinstance(special, bool):
                return None
            ids: list[int] = self._tokenizer.encode(prompt, add_special_tokens=special).ids
            return ids
        return _given_ids(prompt)


class SimulatorIds:
    """`PromptIds` of a model served by `lane-router sim`: its engines' ids of the body."""

    def of(self, endpoint: str, data: dict[str, Any]) -> list[int] | None:
        if endpoint == "chat":
            messages = data.get("messages")
            return chat_token_ids(messages) if isinstance(messages, list) else None
        if endpoint == "completions":
            return completion_token_ids(data.get("prompt"))
        return None


def _single(prompt: object) -> object:
    """A prompt given as a list of one prompt, as that prompt."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        return prompt[0]
    return prompt


def _given_ids(prompt: object) -> list[int] | None:
    if not isinstance(prompt, list) or not prompt:
        return None
    for token in prompt:
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            return None
    return prompt
