"""Anthropic Messages requests (`/v1/messages`, `/v1/messages/count_tokens`) read into
`RequestFacts`. Pure.

vLLM serves them by building the chat request they describe — the system text as a system
message, each content block as a chat part, tool calls and results as tool messages, tools as
functions, `output_config` as a response format — and rendering that with the chat template. So
the prompt bound is counted over that chat request, message by message, as chat's is
(router.request.facts): text blocks, images at the profile's image cost, a `tool_use` block's
name and its input as the JSON vLLM writes for it, a `tool_result` as the tool message (and the
image message) vLLM makes of it, the tools with the template's tool cost.

The body holds only the fields vLLM's request reads (its engine fields left to the key's policy,
router.request.fields), each of the type vLLM takes it as, without the coercions vLLM's
validation would make (`"5"` for a number, `"true"` for a flag): the router never judges a body
vLLM would read otherwise. `max_tokens` is required, a ceiling under which the router writes the
bound its lane and key allow (router.request.rewrite)."""

from __future__ import annotations

import json
from typing import Any, Final

from router.errors import BadRequest
from router.request.apifields import COUNT_TOKENS_FIELDS, MESSAGES_ENGINE_FIELDS, MESSAGES_FIELDS
from router.request.facts import RequestFacts, json_object, prefix_chain
from router.request.fields import Endpoint
from router.request.tokens import NO_MEDIA, Counters, Media, PromptCounter

_NAMES: Final[dict[str, frozenset[str]]] = {
    "messages": MESSAGES_FIELDS | MESSAGES_ENGINE_FIELDS,
    "count_tokens": COUNT_TOKENS_FIELDS,
}
_ROLES: Final = frozenset({"user", "assistant", "system"})
_BLOCKS: Final = frozenset(
    {
        "text",
        "image",
        "tool_use",
        "tool_result",
        "tool_reference",
        "thinking",
        "redacted_thinking",
        "tool_addition",
        "tool_removal",
    }
)
_TOOL_CHANGES: Final = frozenset({"tool_addition", "tool_removal"})
# A block's fields vLLM reads, and the JSON types it takes each as.
_BLOCK_STRINGS: Final = ("text", "id", "tool_use_id", "name", "tool_name", "thinking", "signature", "data")
_CHOICES: Final = {"auto": "auto", "any": "required", "none": "none"}
_EFFORTS: Final = frozenset({"low", "medium", "high", "xhigh", "max"})
_THINKING: Final = frozenset({"enabled", "disabled", "adaptive"})
# vLLM's least thinking budget.
MIN_THINKING_BUDGET: Final = 1024


class _Prompt:
    """The chat request vLLM builds, as it is counted: tokens, text (fingerprints), roles."""

    __slots__ = ("counter", "roles", "texts", "tokens", "tool_blocks", "tools")

    def __init__(self, counter: PromptCounter) -> None:
        self.counter = counter
        self.tokens = counter.request()
        self.texts: list[str] = []
        self.roles: list[str] = []
        self.tools: list[dict[str, Any]] = []  # tool definitions, as vLLM hands them the template
        self.tool_blocks = False

    def message(self, role: str, text: str, other: str = "", media: Media = NO_MEDIA) -> None:
        self.tokens += self.counter.message(role, text, other, media)
        self.roles.append(role)
        self.texts.append(role)
        self.texts.append(text)


def parse_messages(endpoint: Endpoint, body: bytes, counters: PromptCounter | Counters) -> RequestFacts:
    """`counters`: one counter, or each model's (the body's model picks its own)."""
    data = json_object(body)
    names = _NAMES[endpoint]
    for name in data:
        if name not in names:
            raise BadRequest(f"unsupported field '{name}' for this route", code="unsupported_field")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", code="invalid_model")
    counter = counters.get(model) if isinstance(counters, Counters) else counters
    ceiling = _max_tokens(data) if endpoint == "messages" else None
    stream = _flag(data, "stream")
    _check_sampling(data)
    prompt = _Prompt(counter)
    _system(data.get("system"), prompt)
    _messages(data.get("messages"), prompt)
    _tools(data.get("tools"), prompt)
    _rendered(data, prompt)
    return RequestFacts(
        endpoint=endpoint,
        model=model,
        stream=stream,
        max_tokens=None,
        sequences=1,
        has_tools=bool(prompt.tools) or prompt.tool_blocks,
        roles=tuple(prompt.roles),
        prompt_tokens=prompt.tokens,
        prefix_chain=prefix_chain("\n".join(prompt.texts)),
        user=_user(data.get("metadata")),
        include_usage=False,
        body=data,
        output_ceiling=ceiling,
    )


def thinking_within(body: dict[str, Any], bound: int) -> None:
    """Write an extended-thinking budget under the output bound written into `body`: vLLM
    refuses a budget that is not below `max_tokens`."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < bound:
        return
    if bound <= MIN_THINKING_BUDGET:
        raise BadRequest(
            f"extended thinking needs a budget of at least {MIN_THINKING_BUDGET} tokens below "
            f"max_tokens; this request's lane and key allow {bound} output tokens",
            code="max_tokens_exceeded",
        )
    body["thinking"] = {**thinking, "budget_tokens": bound - 1}


def _bad(where: str, what: str) -> BadRequest:
    return BadRequest(f"'{where}' {what}", code="invalid_request")


def _max_tokens(data: dict[str, Any]) -> int:
    value = data.get("max_tokens")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest("'max_tokens' is required and must be a positive integer", code="invalid_max_tokens")
    return value


def _flag(data: dict[str, Any], name: str) -> bool:
    value = data.get(name)
    if value is not None and not isinstance(value, bool):
        raise _bad(name, "must be a boolean")
    return bool(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_sampling(data: dict[str, Any]) -> None:
    for name in ("temperature", "top_p"):
        if data.get(name) is not None and not _number(data[name]):
            raise _bad(name, "must be a number")
    top_k = data.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        raise _bad("top_k", "must be an integer")
    stops = data.get("stop_sequences")
    if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
        raise _bad("stop_sequences", "must be an array of strings")
    _flag(data, "watermarking")
    for name in ("metadata", "chat_template_kwargs"):
        if data.get(name) is not None and not isinstance(data[name], dict):
            raise _bad(name, "must be an object")


def _user(metadata: Any) -> str | None:
    """`metadata.user_id`, the end user Anthropic's clients name: what `user` is to OpenAI's."""
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    return user if isinstance(user, str) else None


def _system(system: Any, prompt: _Prompt) -> None:
    if system is None:
        return
    if isinstance(system, str):
        text = system
    elif isinstance(system, list):
        text = "".join(_block_texts(system, "system", prompt))
    else:
        raise _bad("system", "must be a string or an array of content blocks")
    if text:
        prompt.message("system", text)


def _block_texts(blocks: list[Any], where: str, prompt: _Prompt) -> list[str]:
    """The texts of a system prompt's blocks (the only blocks vLLM reads there)."""
    texts: list[str] = []
    for j, block in enumerate(blocks):
        kind = _block(block, f"{where}[{j}]")
        if kind in _TOOL_CHANGES:
            raise _bad(f"{where}[{j}]", f"{kind} blocks are only allowed in messages of role 'system'")
        if kind == "text" and block.get("text"):
            texts.append(block["text"])
    return texts


def _block(block: Any, where: str) -> str:
    """A content block's type, its fields checked as vLLM's block reads them."""
    if not isinstance(block, dict):
        raise _bad(where, "must be a content block object")
    kind = block.get("type")
    if kind not in _BLOCKS:
        raise _bad(f"{where}.type", f"must be one of {sorted(_BLOCKS)}")
    for name in _BLOCK_STRINGS:
        if block.get(name) is not None and not isinstance(block[name], str):
            raise _bad(f"{where}.{name}", "must be a string")
    for name in ("source", "input"):
        if block.get(name) is not None and not isinstance(block[name], dict):
            raise _bad(f"{where}.{name}", "must be an object")
    content = block.get("content")
    if not (content is None or isinstance(content, str) or _objects(content)):
        raise _bad(f"{where}.content", "must be a string or an array of objects")
    if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
        raise _bad(f"{where}.is_error", "must be a boolean")
    return str(kind)


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _messages(messages: Any, prompt: _Prompt) -> None:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", code="invalid_messages")
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise _bad(where, "must be an object")
        role = msg.get("role")
        if role not in _ROLES:
            raise _bad(f"{where}.role", f"must be one of {sorted(_ROLES)}")
        content = msg.get("content")
        if isinstance(content, str):
            prompt.message(str(role), content)
        elif isinstance(content, list):
            _blocks(str(role), content, where, prompt)
        else:
            raise _bad(f"{where}.content", "must be a string or an array of content blocks")


def _blocks(role: str, blocks: list[Any], where: str, prompt: _Prompt) -> None:
    """One message of blocks: counted as the chat message vLLM makes of it, and the tool and
    image messages its tool results become."""
    texts: list[str] = []
    other: list[str] = []
    images = 0
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = _block(block, at)
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "image":
            images += 1 if block.get("source") else 0
        elif kind == "thinking":
            other.append(block.get("thinking") or "")
        elif kind == "tool_use":
            prompt.tool_blocks = True
            # vLLM writes the call's arguments with Python's json.dumps (ASCII escapes).
            texts.append((block.get("name") or "") + json.dumps(block.get("input") or {}))
            other.append(block.get("id") or "call_0000000000")
        elif kind == "tool_result":
            prompt.tool_blocks = True
            if role == "user":
                _tool_result(block, at, prompt)
            else:
                content = block.get("content")
                texts.append("Tool result: " + (str(content) if content else ""))
        elif kind in _TOOL_CHANGES:
            _tool_change(role, block, at, prompt)
    prompt.message(role, "\n".join(texts), "".join(other), Media(images=images) if images else NO_MEDIA)


def _tool_result(block: dict[str, Any], where: str, prompt: _Prompt) -> None:
    """A user's tool result: a tool message of its text, a user message of its images, and a
    tool message of the tools it references."""
    content = block.get("content")
    call = block.get("tool_use_id") or ""
    if not isinstance(content, list):
        prompt.message("tool", content or "", call)
        return
    texts: list[str] = []
    images = 0
    references: list[Any] = []
    for k, item in enumerate(content):
        kind = item.get("type")
        if kind == "text":
            text = item.get("text", "")
            if not isinstance(text, str):
                raise _bad(f"{where}.content[{k}].text", "must be a string")
            texts.append(text)
        elif kind == "image":
            if not isinstance(item.get("source", {}), dict):
                raise _bad(f"{where}.content[{k}].source", "must be an object")
            images += 1
        elif kind == "tool_reference":
            references.append(item.get("tool_name") or item.get("name"))
    prompt.message("tool", "\n".join(texts), call)
    if images:
        prompt.message("user", "", "", Media(images=images))
    if references:
        prompt.message("tool", "", call)
        prompt.tokens += prompt.counter.rendered(references)


def _tool_change(role: str, block: dict[str, Any], where: str, prompt: _Prompt) -> None:
    """A system message's tool_addition or tool_removal: a tool defined by value joins the
    tools the template renders."""
    if role != "system":
        raise _bad(where, f"{block['type']} blocks are only allowed in messages of role 'system'")
    change = block.get("tool")
    if not isinstance(change, dict) or change.get("type") not in ("tool_reference", "tool_definition"):
        raise _bad(f"{where}.tool", "must be a tool_reference or a tool_definition")
    if change["type"] == "tool_definition":
        if block["type"] == "tool_removal":
            raise _bad(f"{where}.tool", "tool_removal only accepts a tool_reference")
        prompt.tools.append(_tool(change.get("definition"), f"{where}.tool.definition"))


def _tool(tool: Any, where: str) -> dict[str, Any]:
    """A tool definition as vLLM hands it to the template: an OpenAI function."""
    if not isinstance(tool, dict):
        raise _bad(where, "must be an object")
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str):
        raise _bad(f"{where}.name", "must be a string")
    if not isinstance(schema, dict):
        raise _bad(f"{where}.input_schema", "must be an object")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise _bad(f"{where}.description", "must be a string")
    for flag in ("strict", "defer_loading"):
        if tool.get(flag) is not None and not isinstance(tool[flag], bool):
            raise _bad(f"{where}.{flag}", "must be a boolean")
    parameters = schema if "type" in schema else {**schema, "type": "object"}
    function = {
        "name": name,
        "description": description,
        "parameters": parameters,
        "strict": tool.get("strict"),
        "defer_loading": tool.get("defer_loading"),
    }
    return {"type": "function", "function": function}


def _tools(tools: Any, prompt: _Prompt) -> None:
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("'tools' must be an array", code="invalid_tools")
        prompt.tools[:0] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    if prompt.tools:
        prompt.tokens += prompt.counter.tools(prompt.tools)


def _rendered(data: dict[str, Any], prompt: _Prompt) -> None:
    """What vLLM hands the chat template beside the messages: the tool choice, the response
    format and reasoning effort it builds, and `chat_template_kwargs`, each at its rendered
    bound."""
    rendered: list[Any] = []
    choice = _tool_choice(data.get("tool_choice"))
    if choice is not None or prompt.tools:
        rendered.append(choice or "auto")
    rendered.extend(_output_config(data.get("output_config")))
    thinking = data.get("thinking")
    if thinking is not None:
        _check_thinking(thinking)
        rendered.append(thinking)  # bounds the reasoning effort vLLM derives from it
    if data.get("chat_template_kwargs") is not None:
        rendered.append(data["chat_template_kwargs"])
    counter = prompt.counter
    for value in rendered:
        prompt.tokens += counter.rendered(value)


def _tool_choice(choice: Any) -> Any:
    """The chat tool choice vLLM builds from Anthropic's, or None."""
    if choice is None:
        return None
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise _bad("tool_choice", "must be an object of type auto, any, tool or none")
    name = choice.get("name")
    if name is not None and not isinstance(name, str):
        raise _bad("tool_choice.name", "must be a string")
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise _bad("tool_choice.disable_parallel_tool_use", "must be a boolean")
    if choice["type"] == "tool":
        if not name:
            raise _bad("tool_choice.name", "is required when its type is 'tool'")
        return {"type": "function", "function": {"name": name}}
    return _CHOICES[choice["type"]]


def _output_config(config: Any) -> list[Any]:
    """The response format and reasoning effort vLLM builds from `output_config`."""
    if config is None:
        return []
    if not isinstance(config, dict):
        raise _bad("output_config", "must be an object")
    out: list[Any] = []
    effort = config.get("effort")
    if effort is not None:
        if effort not in _EFFORTS:
            raise _bad("output_config.effort", f"must be one of {sorted(_EFFORTS)}")
        out.append(effort)
    fmt = config.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type", "json_schema") != "json_schema":
            raise _bad("output_config.format", "must be an object of type json_schema")
        schema = fmt.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise _bad("output_config.format.schema", "must be an object")
        out.append({"type": "json_schema", "json_schema": {"name": "json_schema", "schema": schema}})
    return out


def _check_thinking(thinking: Any) -> None:
    if not isinstance(thinking, dict) or thinking.get("type") not in _THINKING:
        raise _bad("thinking", f"must be an object of type {', '.join(sorted(_THINKING))}")
    if thinking["type"] == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
            raise _bad("thinking.budget_tokens", f"must be an integer of at least {MIN_THINKING_BUDGET}")
