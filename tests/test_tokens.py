"""Prompt-token counting: the character heuristic and exact counts from a tokenizer.json."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from router.tokens import (
    CHARS_PER_TOKEN,
    HeuristicCounter,
    TokenizerCounter,
    estimate_text_tokens,
    make_counter,
)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 1), ("a", 1), ("abcd", 1), ("abcde", 1), ("abcdefgh", 2), ("x" * 400, 100), ("x" * 403, 100)],
)
def test_estimate_is_a_quarter_of_the_characters_and_at_least_one(text: str, tokens: int) -> None:
    assert CHARS_PER_TOKEN == 4
    assert estimate_text_tokens(text) == tokens


def test_estimate_is_monotonic_in_length() -> None:
    counts = [estimate_text_tokens("y" * n) for n in range(200)]

    assert counts == sorted(counts)


def test_heuristic_counter_uses_the_estimate() -> None:
    assert HeuristicCounter().count("hello world!") == estimate_text_tokens("hello world!")


def test_without_a_tokenizer_the_heuristic_is_used() -> None:
    assert isinstance(make_counter(None), HeuristicCounter)
    assert isinstance(make_counter(""), HeuristicCounter)


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

    assert isinstance(counter, TokenizerCounter)
    assert counter.count("hello, world!") == 4
    assert counter.count("hello hello hello hello hello") == 5
    assert counter.count("") == 0


def test_tokenizer_counter_differs_from_the_heuristic(tokenizer_file: Path) -> None:
    text = "hello " * 100

    assert TokenizerCounter(tokenizer_file).count(text) == 100
    assert HeuristicCounter().count(text) == 150
