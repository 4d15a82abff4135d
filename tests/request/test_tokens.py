"""Prompt-token counting: the UTF-8 upper bound, the simulator's rule, exact tokenizer counts."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from router.request.tokens import (
    CHARS_PER_TOKEN,
    Media,
    PromptCosts,
    PromptCounter,
    SimulatorCounter,
    TokenizerCounter,
    Utf8ByteCounter,
    estimate_text_tokens,
    make_counter,
)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 1), ("a", 1), ("abcd", 1), ("abcde", 1), ("abcdefgh", 2), ("x" * 400, 100), ("x" * 403, 100)],
)
def test_simulator_rule_is_a_quarter_of_the_characters_and_at_least_one(text: str, tokens: int) -> None:
    assert CHARS_PER_TOKEN == 4
    assert estimate_text_tokens(text) == tokens


def test_without_a_tokenizer_the_upper_bound_is_used() -> None:
    for spec in (None, "", "utf8-bytes"):
        counter = make_counter(spec)
        assert type(counter) is PromptCounter
        assert counter.text("héllo") == 6  # é is two bytes


def test_simulator_counter_has_no_template_and_no_media() -> None:
    counter = make_counter("simulator")

    assert isinstance(counter, SimulatorCounter)
    assert counter.request() == 0
    assert counter.message("user", "abcd" * 10, "name", Media(images=3)) == 10
    assert counter.tools('{"type": "function"}') == 0


@pytest.mark.parametrize(
    ("text", "size"),
    [("abc", 3), ("漢字", 6), ("😀", 4), ("e\u0301", 3), ("", 0)],
    ids=["ascii", "cjk", "emoji", "combining", "empty"],
)
def test_utf8_counter_counts_bytes(text: str, size: int) -> None:
    assert Utf8ByteCounter().count(text) == size


def test_message_cost_adds_template_role_other_fields_and_media() -> None:
    costs = PromptCosts(per_request=5, per_message=7, tools=11, image=100, audio=200, video=300)
    counter = PromptCounter(Utf8ByteCounter(), costs)

    assert counter.request() == 5
    assert counter.message("user", "hello", "", Media()) == 7 + 4 + 5
    assert counter.message("tool", "42", "call-1", Media()) == 7 + 4 + 2 + 6
    assert counter.message("user", "", "", Media(images=2, audio=1, video=1)) == 7 + 4 + 200 + 200 + 300
    assert counter.tools([]) == 11 + 2 * 2


@pytest.fixture
def tokenizer_file(tmp_path: Path) -> Path:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, ",": 3, "!": 4}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_tokenizer_counter_counts_real_tokens(tokenizer_file: Path) -> None:
    counter = make_counter(str(tokenizer_file))

    assert counter.text("hello, world!") == 4
    assert counter.text("hello hello hello hello hello") == 5
    assert counter.text("") == 0
    assert TokenizerCounter(tokenizer_file).count("hello " * 100) == 100


def _byte_level_bpe() -> Tokenizer:
    """A byte-level BPE like the models the router fronts, trained on a little mixed text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    corpus = ["the quick brown fox jumps over the lazy dog " * 20, "漢字かな交じり文 😀🎉 " * 20]
    tok.train_from_iterator(corpus, trainer)
    return tok


BPE = _byte_level_bpe()


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_utf8_bytes_are_never_fewer_than_a_byte_level_bpe_count(text: str) -> None:
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        return  # lone surrogates: no JSON body can carry them to the router
    assert Utf8ByteCounter().count(text) == len(raw)
    assert len(BPE.encode(text, add_special_tokens=False).ids) <= len(raw)


def test_a_decision_is_open_when_the_bound_and_its_estimate_straddle_it() -> None:
    from router.request.tokens import decides, lower_estimate

    assert lower_estimate(8000) == 1000
    assert decides(lower_estimate(8000), 8000, [6000])  # 1,000 … 8,000 tokens: either side of 6,000
    assert decides(1000, 8000, [8000]) and decides(1000, 8000, [1000])  # `>=` and `>` decisions alike
    assert not decides(lower_estimate(5999), 5999, [6000])  # below it whatever the count
    assert not decides(lower_estimate(80_000), 80_000, [6000])  # above it even at the estimate
    assert not decides(0, 8000, [])
