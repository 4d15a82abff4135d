"""A prompt's token ids as its engine computes them: the chat template's ids come with its count,
completions are encoded as vLLM's completions route encodes them, the simulator's models get the
simulator's own ids, and whatever the router cannot reproduce exactly gets none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from tokenizers import Tokenizer, processors

from router.lab.sim.protocol import parse_generation
from router.request.chattemplate import counter_for
from router.request.facts import parse_facts
from router.request.tokenizer_source import (
    BY_BACKEND,
    BY_BYTES,
    BY_SIMULATOR,
    TokenizerSource,
    find_tokenizer,
)
from router.request.tokens import PromptCosts, PromptCounter
from tests.request.test_tokenizer_source import TOKENIZER, model_dir

MESSAGES = [
    {"role": "system", "content": "the harbour master"},
    {"role": "user", "content": "records each vessel that enters the port"},
]
RENDERED = (
    "<|im_start|>system\nthe harbour master<|im_end|>\n<|im_start|>user\n"
    "records each vessel that enters the port<|im_end|>\n<|im_start|>assistant\n"
)
PROMPT = "the harbour master records each vessel"


def _counter(where: Path) -> PromptCounter:
    return counter_for(find_tokenizer("m", str(model_dir(where)), None, {}), PromptCosts())


def _with_bos(where: Path) -> PromptCounter:
    """A model whose tokenizer adds a BOS to what it encodes with special tokens, as Llama's does."""
    model_dir(where)
    tok = Tokenizer.from_file(str(where / "tokenizer.json"))
    bos = tok.token_to_id("<|im_start|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)]
    )
    tok.save(str(where / "tokenizer.json"))
    return counter_for(find_tokenizer("m", str(where), None, {}), PromptCosts())


def _ids(counter: PromptCounter, endpoint: str, body: dict[str, Any]) -> list[int] | None:
    assert counter.ids is not None
    return counter.ids.of(endpoint, {"model": "m", **body})


def test_a_chat_prompts_ids_are_its_rendered_templates(tmp_path: Path) -> None:
    counter = _counter(tmp_path)
    facts = parse_facts("chat", orjson.dumps({"model": "m", "messages": MESSAGES}), counter)

    exact = TOKENIZER.encode(RENDERED, add_special_tokens=False).ids
    assert facts.token_ids == exact
    assert facts.prompt_tokens == len(exact)


def test_a_chat_body_the_template_does_not_reproduce_has_no_ids(tmp_path: Path) -> None:
    counter = _counter(tmp_path)
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    for body in (
        {"messages": MESSAGES, "tools": [tool]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        {"messages": MESSAGES, "chat_template_kwargs": {"x": 1}},
        {"messages": MESSAGES, "add_special_tokens": True},
    ):
        data = orjson.dumps({"model": "m", **body})
        assert parse_facts("chat", data, counter).token_ids is None
        assert _ids(counter, "chat", body) is None  # nor rendered again on the request path


def test_a_completions_prompt_is_encoded_with_the_tokenizers_special_tokens(tmp_path: Path) -> None:
    counter = _with_bos(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    with_bos = tok.encode(PROMPT, add_special_tokens=True).ids
    assert with_bos[0] == tok.token_to_id("<|im_start|>")
    assert with_bos[1:] == TOKENIZER.encode(PROMPT, add_special_tokens=False).ids

    assert _ids(counter, "completions", {"prompt": PROMPT}) == with_bos
    assert _ids(counter, "completions", {"prompt": [PROMPT]}) == with_bos
    assert _ids(counter, "completions", {"prompt": PROMPT, "add_special_tokens": False}) == with_bos[1:]


def test_a_prompt_of_token_ids_is_its_ids(tmp_path: Path) -> None:
    counter = _with_bos(tmp_path)
    assert _ids(counter, "completions", {"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert _ids(counter, "completions", {"prompt": [[5, 6, 7]]}) == [5, 6, 7]


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": PROMPT, "truncate_prompt_tokens": 4},
        {"prompt": [PROMPT, PROMPT]},
        {"prompt": [[1, 2], [3]]},
        {"prompt": [1, True]},
        {"prompt": [1, -2]},
        {"prompt": PROMPT, "add_special_tokens": "yes"},
        {"prompt": PROMPT, "suffix": "end"},
        {"prompt_embeds": "AAAA"},
    ],
)
def test_a_completions_body_vllm_reshapes_has_no_ids(tmp_path: Path, body: dict[str, Any]) -> None:
    assert _ids(_with_bos(tmp_path), "completions", body) is None


def test_other_routes_have_no_ids(tmp_path: Path) -> None:
    counter = _counter(tmp_path)
    assert _ids(counter, "embeddings", {"input": PROMPT}) is None
    assert _ids(counter, "chat", {"messages": MESSAGES}) is None  # they come with the count


@pytest.mark.parametrize(
    "kind, body",
    [
        ("chat", {"messages": MESSAGES}),
        ("chat", {"messages": [{"role": "user", "content": "naïve café " * 40}]}),
        ("completion", {"prompt": PROMPT * 30}),
        ("completion", {"prompt": [PROMPT]}),
        ("completion", {"prompt": [3, 1, 4, 1, 5]}),
    ],
)
def test_a_simulator_models_ids_are_its_engines(kind: str, body: dict[str, Any]) -> None:
    counter = counter_for(TokenizerSource(BY_SIMULATOR), PromptCosts())
    request = parse_generation(
        {"model": "m", **body}, kind, served_models=["m"], max_model_len=1 << 20, priority_enabled=False
    )

    endpoint = "chat" if kind == "chat" else "completions"
    assert _ids(counter, endpoint, body) == request.prompt_token_ids


@pytest.mark.parametrize("how", [BY_BYTES, BY_BACKEND])
def test_a_byte_counted_model_has_no_ids(how: str) -> None:
    assert counter_for(TokenizerSource(how), PromptCosts()).ids is None
