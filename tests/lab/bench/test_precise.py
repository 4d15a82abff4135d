"""The precise_prefix CPU benchmark runs and says what it measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.lab.bench.precise import main
from tests.request.test_tokenizer_source import model_dir


def test_it_measures_keying_lookup_and_encoding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", str(model_dir(tmp_path)), "--tokens", "512", "--backends", "2"]) == 0
    out = capsys.readouterr().out
    assert "block  16: keying" in out and "block 128: keying" in out
    assert "lookup on 2 backends" in out
    assert "render + encode" in out


def test_without_a_model_it_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", str(tmp_path), "--tokens", "256"]) == 0
    assert f"no tokenizer.json at {tmp_path}" in capsys.readouterr().out
