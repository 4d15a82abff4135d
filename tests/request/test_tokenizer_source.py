"""Where each model's tokenizer is found, and its chat template's count."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from router.config.load import ConfigError, parse_profile
from router.request.chattemplate import counter_for
from router.request.facts import parse_facts
from router.request.tokenizer_source import (
    BY_BACKEND,
    BY_BYTES,
    BY_SIMULATOR,
    BY_TOKENIZER,
    TokenizerNotFound,
    find_tokenizer,
)
from router.request.tokens import PromptCosts, SimulatorCounter
from router.state.counters import build_counters, counting_lines
from tests.support.profiles import profile

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(["the harbour master records each vessel that enters the port " * 30], trainer)
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    return tok


TOKENIZER = _tokenizer()


def model_dir(where: Path, template: str | None = CHATML) -> Path:
    """A model's files as a model directory holds them: tokenizer.json and tokenizer_config.json."""
    where.mkdir(parents=True, exist_ok=True)
    TOKENIZER.save(str(where / "tokenizer.json"))
    config: dict[str, object] = {"eos_token": "<|im_end|>"}
    if template is not None:
        config["chat_template"] = template
    (where / "tokenizer_config.json").write_text(json.dumps(config))
    return where


def test_the_model_name_as_a_local_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir(tmp_path / "acme" / "tiny")
    monkeypatch.chdir(tmp_path)

    found = find_tokenizer("acme/tiny", None, None, {"HOME": str(tmp_path / "nohome")})

    assert (found.how, found.path, found.template) == (BY_TOKENIZER, Path("acme/tiny/tokenizer.json"), CHATML)
    assert found.special == {"eos_token": "<|im_end|>"}


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME", "HOME"])
def test_the_hugging_face_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    root = {
        "HF_HUB_CACHE": tmp_path,
        "HF_HOME": tmp_path / "hub",
        "HOME": tmp_path / ".cache/huggingface/hub",
    }
    hub = {"HF_HUB_CACHE": tmp_path, "HF_HOME": tmp_path, "HOME": tmp_path}[variable]
    repo = root[variable] if variable != "HF_HUB_CACHE" else tmp_path
    repo = repo / "models--acme--tiny"
    model_dir(repo / "snapshots" / "0123abcd")
    model_dir(repo / "snapshots" / "old", template=None)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd\n")
    monkeypatch.chdir(tmp_path)  # no local directory of that name here

    found = find_tokenizer("acme/tiny", None, None, {variable: str(hub)})

    assert found.how == BY_TOKENIZER
    assert found.path == repo / "snapshots" / "0123abcd" / "tokenizer.json"
    assert found.template == CHATML
    assert "Hugging Face cache" in found.describe()


def test_the_profile_comes_first_then_the_shared_tokenizer(tmp_path: Path) -> None:
    own, shared = model_dir(tmp_path / "own"), model_dir(tmp_path / "shared", template=None)

    assert find_tokenizer("m", str(own), str(shared), {}).path == own / "tokenizer.json"
    assert find_tokenizer("m", None, str(shared / "tokenizer.json"), {}).path == shared / "tokenizer.json"
    assert find_tokenizer("m", "utf8-bytes", str(shared), {}).how == BY_BYTES
    assert find_tokenizer("m", None, "simulator", {}).how == BY_SIMULATOR
    assert find_tokenizer("nowhere/model", None, None, {"HOME": str(tmp_path)}).how == BY_BACKEND


def test_a_configured_path_without_a_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerNotFound):
        find_tokenizer("m", str(tmp_path), None, {})
    with pytest.raises(ConfigError) as err:
        parse_profile({**profile(["http://127.0.0.1:9"]), "tokenizer": str(tmp_path / "missing")})

    assert [issue.path for issue in err.value.issues] == ["tokenizer"]


def test_a_chat_prompt_counts_what_its_template_renders(tmp_path: Path) -> None:
    counter = counter_for(find_tokenizer("m", str(model_dir(tmp_path)), None, {}), PromptCosts())
    messages = [
        {"role": "system", "content": "the harbour master"},
        {"role": "user", "content": "each vessel"},
    ]
    rendered = (
        "<|im_start|>system\nthe harbour master<|im_end|>\n<|im_start|>user\neach vessel<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    exact = len(TOKENIZER.encode(rendered, add_special_tokens=False).ids)

    facts = parse_facts("chat", orjson.dumps({"model": "m", "messages": messages}), counter)

    assert facts.prompt_tokens == exact
    assert facts.roles == ("system", "user")


def test_what_the_template_count_does_not_cover_keeps_the_bound(tmp_path: Path) -> None:
    source = find_tokenizer("m", str(model_dir(tmp_path)), None, {})
    counter = counter_for(source, PromptCosts())
    bare = counter_for(
        find_tokenizer("m", str(model_dir(tmp_path / "bare", template=None)), None, {}), PromptCosts()
    )
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    for body in (
        {"messages": [{"role": "user", "content": "hi"}], "tools": [tool]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": 1}},
    ):
        data = orjson.dumps({"model": "m", **body})
        assert (
            parse_facts("chat", data, counter).prompt_tokens == parse_facts("chat", data, bare).prompt_tokens
        )


def test_each_model_and_its_aliases_get_their_counter(tmp_path: Path) -> None:
    data = profile(["http://127.0.0.1:9"])
    data["pools"]["interactive"]["aliases"] = ["fake-alias"]
    data["tokenizer"] = str(model_dir(tmp_path))
    counters, sources = build_counters(parse_profile(data), {})

    assert counters.get("fake-alias") is counters.get("fake-model")
    assert counters.get("fake-model").chat is not None
    assert counters.get("unknown") is counters.default
    assert counters.get("fake-model").ask_above == 64  # the repeated-prefix length, the lowest
    assert counting_lines(sources) == [
        f"  fake-model: tokenizer {tmp_path / 'tokenizer.json'} (tokenizer), with its chat template"
    ]
    again, _ = build_counters(parse_profile(data), {}, (counters, sources))
    assert again.get("fake-model") is counters.get("fake-model")  # a reload keeps a loaded tokenizer
    data["tokenizer"] = "simulator"
    assert isinstance(build_counters(parse_profile(data), {})[0].get("fake-model"), SimulatorCounter)


def test_each_model_names_its_own_tokenizer(tmp_path: Path) -> None:
    from tests.support.profiles import EMBED_MODEL, multi_model_profile

    urls = (
        "http://127.0.0.1:9101",
        "http://127.0.0.1:9102",
        "http://127.0.0.1:9103",
        "http://127.0.0.1:9104",
    )
    data = multi_model_profile(*urls)
    data.setdefault("models", {}).setdefault(EMBED_MODEL, {})["tokenizer"] = str(model_dir(tmp_path / "bge"))
    data["tokenizer"] = "utf8-bytes"
    counters, sources = build_counters(parse_profile(data), {})

    assert sources[EMBED_MODEL].path == tmp_path / "bge" / "tokenizer.json"
    assert counters.get(EMBED_MODEL).chat is not None
    assert all(s.how == BY_BYTES for m, s in sources.items() if m != EMBED_MODEL)
    data["models"][EMBED_MODEL]["tokenizer"] = str(tmp_path / "missing")
    with pytest.raises(ConfigError) as err:
        parse_profile(data)
    assert [issue.path for issue in err.value.issues] == [f"models.{EMBED_MODEL}.tokenizer"]


def test_a_chat_template_file_comes_before_the_configs(tmp_path: Path) -> None:
    where = model_dir(tmp_path)
    (where / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")

    assert find_tokenizer("m", str(where), None, {}).template == "{{ messages[0]['content'] }}"
