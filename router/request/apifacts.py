"""Prompts of the JSON routes beyond chat, completions and embeddings, read for `RequestFacts`
(router.request.facts): the text prefix fingerprints hash, the prompt tokens as an upper bound, the
number of outputs, and whether the conversation carries tool calls. Pure.

A Responses-API request is read like a chat: `instructions` as a system message, `input` as a
string or a list of items, each message item as a message (text parts counted, media at their
placeholder cost), any other item (function calls and their outputs, reasoning) at the byte count
of its JSON, which bounds the text the template renders from it. What a `previous_response_id`
adds is not in the body: the caller adds the stored conversation's bound (router.state.responseids).
Rerank and score count every query–document pair vLLM makes, each a prompt of both texts and
the template's tokens; tokenize counts its prompt or messages; detokenize its ids. Whatever a
template renders beside the messages (`chat_template_kwargs`, a client's `chat_template`, a
pooling `instruction`) counts at its rendered bound (router.request.tokens)."""

from __future__ import annotations

from typing import Any, Final

import orjson

from router.errors import BadRequest
from router.request.tokens import NO_MEDIA, Media, PromptCounter

Prompt = tuple[str, int, int, bool]  # text, prompt tokens, outputs, tool items

_TEXT = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
_IMAGE = frozenset({"input_image", "image_url"})
_AUDIO = frozenset({"input_audio", "audio_url"})
_VIDEO = frozenset({"video_url"})
_TOOL_ITEMS = frozenset(
    {"function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output"}
)


# Tool types whose calls vLLM hands back to the client. vLLM runs the others itself (a browser,
# a Python sandbox, a container, MCP servers), a generation turn per call, each with the whole
# output bound and for as many turns as the model keeps calling: no bound the router can charge.
CLIENT_TOOLS: Final = frozenset({"function", "custom", "namespace"})


# vLLM 0.32 hands the chat template `chat_template_kwargs` (with `documents` merged in), and
# some model renderers pass `response_format` and `tool_choice` into it too.
TEMPLATE_FIELDS = ("chat_template_kwargs", "chat_template", "response_format", "tool_choice")


def responses_prompt(data: dict[str, Any], counter: PromptCounter) -> Prompt:
    if data.get("background") not in (None, False):
        raise BadRequest(
            "'background' responses are not served through this router: they run on after the "
            "request ends, outside the lane and key limits",
            code="background_not_supported",
        )
    _check_tools(data.get("tools"))
    tokens = counter.request()
    texts: list[str] = []
    instructions = data.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("'instructions' must be a string", code="invalid_instructions")
        tokens += counter.message("system", instructions, "", NO_MEDIA)
        texts.append(instructions)
    value = data.get("input")
    tools = False
    if isinstance(value, str):
        tokens += counter.message("user", value, "", NO_MEDIA)
        texts.append(value)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            item_tokens, text, tool = _item(item, i, counter)
            tokens += item_tokens
            texts.append(text)
            tools = tools or tool
    else:
        raise BadRequest("'input' must be a string or an array of items", code="invalid_input")
    history = data.get("previous_input_messages")
    if history is not None:
        tokens += counter.text(orjson.dumps(history).decode())
    return "\n".join(texts), tokens, 1, tools


def _check_tools(tools: Any) -> None:
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in CLIENT_TOOLS:
            raise BadRequest(
                f"tools[{i}] is of type {kind!r}: the backend would run it itself, a generation "
                f"per call with no bound on the calls; only {sorted(CLIENT_TOOLS)} tools are "
                "served through this router",
                code="builtin_tools_not_supported",
            )


def _item(item: Any, i: int, counter: PromptCounter) -> tuple[int, str, bool]:
    if not isinstance(item, dict):
        raise BadRequest(f"input[{i}] must be an object", code="invalid_input")
    kind = item.get("type", "message")
    if kind == "message" and "role" in item:
        role = item["role"]
        if not isinstance(role, str):
            raise BadRequest(f"input[{i}].role must be a string", code="invalid_input")
        text, other, media = _content(item.get("content"), i)
        return counter.message(role, text, other, media), text, False
    serialized = orjson.dumps(item).decode()
    return counter.message("tool", "", serialized, NO_MEDIA), serialized, kind in _TOOL_ITEMS


def _content(content: Any, i: int) -> tuple[str, str, Media]:
    if content is None or isinstance(content, str):
        return content or "", "", NO_MEDIA
    if not isinstance(content, list):
        raise BadRequest(f"input[{i}].content must be a string or an array", code="invalid_input")
    texts: list[str] = []
    other: list[str] = []
    images = audio = video = 0
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise BadRequest(f"input[{i}].content[{j}] must be an object", code="invalid_input")
        kind = part.get("type")
        if kind in _TEXT and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in _IMAGE:
            images += 1
        elif kind in _AUDIO:
            audio += 1
        elif kind in _VIDEO:
            video += 1
        else:
            other.append(orjson.dumps(part).decode())
    return "\n".join(texts), "".join(other), Media(images, audio, video)


def pairs_prompt(data: dict[str, Any], counter: PromptCounter, sides: tuple[tuple[str, str], ...]) -> Prompt:
    """Rerank and score. vLLM pairs the first side with the second as it reads `text_1` and
    `text_2`: one first text with every second one (1:N), or the two lists item by item (N:N),
    and each pair is one prompt — both texts, the template's tokens and whatever the pooling
    template renders (`instruction`, `chat_template_kwargs`) — so each pair is counted whole."""
    named = {name for pair in sides for name in pair if name in data}
    present = [pair for pair in sides if set(pair) == named]
    if not present:
        names = " or ".join(f"{a} and {b}" for a, b in sides)
        raise BadRequest(f"the request needs exactly one of: {names}", code="invalid_input")
    first_name, second_name = present[0]
    firsts, first_tokens = _items(data[first_name], first_name, counter)
    seconds, second_tokens = _items(data[second_name], second_name, counter)
    if not firsts or not seconds:
        raise BadRequest(f"'{first_name}' and '{second_name}' must not be empty", code="invalid_input")
    if len(firsts) != 1 and len(firsts) != len(seconds):
        raise BadRequest(
            f"'{first_name}' must hold one item or as many as '{second_name}' ({len(seconds)})",
            code="invalid_input",
        )
    pairs = len(seconds)
    # 1:N repeats the one first text in every pair; N:N uses each once.
    firsts_total = first_tokens[0] * pairs if len(firsts) == 1 else sum(first_tokens)
    per_pair = counter.request() + pooling_template_tokens(data, counter)
    tokens = pairs * per_pair + firsts_total + sum(second_tokens)
    return "\n".join(firsts + seconds), tokens, 1, False


def pooling_template_tokens(data: dict[str, Any], counter: PromptCounter) -> int:
    """What a pooling request's template renders beside its texts, at every pair."""
    tokens = template_tokens(data, counter)
    instruction = data.get("instruction")
    if instruction is not None:
        tokens += counter.rendered(instruction)
    return tokens


def template_tokens(data: dict[str, Any], counter: PromptCounter) -> int:
    """What a chat template renders from the body beyond the messages: every value of
    `chat_template_kwargs` (documents, tool lists, flags a template may print),
    `response_format` and `tool_choice`, at the rendered bound; a client's own `chat_template`
    (an engine field, sent only by keys allowed it) at its length, which bounds its literal
    text but not what its loops render."""
    tokens = 0
    for name in TEMPLATE_FIELDS:
        value = data.get(name)
        if value is not None:
            tokens += counter.rendered(value)
    return tokens


def _items(value: Any, name: str, counter: PromptCounter) -> tuple[list[str], list[int]]:
    """The texts of a score input and their prompt tokens: a string, a list of them, or
    multimodal objects (their JSON bytes bound their text; each media part at its
    placeholder cost)."""
    items = value if isinstance(value, list) else [value]
    texts: list[str] = []
    tokens: list[int] = []
    costs = counter.costs
    for item in items:
        if isinstance(item, str):
            texts.append(item)
            tokens.append(counter.text(item))
        elif isinstance(item, dict):
            text = orjson.dumps(item).decode()
            media = _media(item.get("content"))
            texts.append(text)
            tokens.append(
                counter.text(text)
                + media.images * costs.image
                + media.audio * costs.audio
                + media.video * costs.video
            )
        else:
            raise BadRequest(
                f"'{name}' must be text, an array of texts or content objects", code="invalid_input"
            )
    return texts, tokens


def _media(content: Any) -> Media:
    parts = content if isinstance(content, list) else []
    kinds = [part.get("type") for part in parts if isinstance(part, dict)]
    return Media(
        sum(kind in _IMAGE or kind == "image_embeds" for kind in kinds),
        sum(kind in _AUDIO for kind in kinds),
        sum(kind in _VIDEO for kind in kinds),
    )


RERANK_SIDES = (("query", "documents"),)
SCORE_SIDES = (
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
    ("text_1", "text_2"),
)


def detokenize_prompt(data: dict[str, Any]) -> Prompt:
    tokens = data.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise BadRequest("'tokens' must be an array of token ids", code="invalid_tokens")
    return "", len(tokens), 1, False
