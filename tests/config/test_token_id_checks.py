"""A lane that places on the prompt's token ids (`precise_prefix`) on a model whose prompts the
router counts by the byte bound is a configuration error at the lane's `balance`: every request
would be placed by approximation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config.load import parse_profile
from tests.config.test_load import issues_of
from tests.request.test_tokenizer_source import model_dir
from tests.support.profiles import MODEL, profile


def _precise(**top: Any) -> dict[str, Any]:
    data = profile(["http://127.0.0.1:9"], **top)
    data["lanes"]["rag"]["balance"] = {"strategy": "precise_prefix", "slack": 0.5}
    return data


@pytest.mark.parametrize("tokenizer", ["utf8-bytes", None])
def test_precise_prefix_on_a_byte_counted_model_is_refused(tokenizer: str | None) -> None:
    data = _precise(tokenizer=tokenizer)
    if tokenizer is None:
        del data["tokenizer"]  # nothing found: the byte bound and the backends' /tokenize

    issues = issues_of(data)

    assert [path for path, _ in issues] == ["lanes.rag.balance"]
    assert f"model {MODEL!r} has none" in issues[0][1]
    assert f"models.{MODEL}.tokenizer" in issues[0][1]


def test_precise_prefix_on_a_model_with_token_ids_is_accepted(tmp_path: Path) -> None:
    parse_profile(_precise(tokenizer=str(model_dir(tmp_path))))
    parse_profile(_precise(tokenizer="simulator"))
    parse_profile(_precise(tokenizer="utf8-bytes", models={MODEL: {"tokenizer": "simulator"}}))
