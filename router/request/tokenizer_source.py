"""Where a model's tokenizer is found, and so how its prompts are counted.

In order: the model's own `models.M.tokenizer`, the profile's top-level `tokenizer:`, the model
name as a local directory holding `tokenizer.json`, then the Hugging Face cache
(`HF_HUB_CACHE`, else `HF_HOME`/hub, else ~/.cache/huggingface/hub:
`models--ORG--NAME/snapshots/*/tokenizer.json`). A configured path is a `tokenizer.json` or a
directory holding one; `utf8-bytes` and `simulator` name the two rules without a tokenizer. A
`chat_template` beside it (chat_template.jinja, else tokenizer_config.json's) counts chat prompts as
vLLM renders them. Nothing found: the byte bound, made exact by the backends' `/tokenize` where
it decides something (router/proxy/exactcount.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from router.request.tokens import SIMULATOR, UTF8_BYTES

# How a model's prompts are counted (`lane-router check` and `serve` say it per model).
BY_TOKENIZER: Final = "tokenizer"
BY_BYTES: Final = "utf8-bytes"
BY_SIMULATOR: Final = "simulator"
BY_BACKEND: Final = "backend"  # the byte bound, and the backends' /tokenize where it decides


class TokenizerNotFound(ValueError):
    """A configured tokenizer path holds no tokenizer.json."""


@dataclass(frozen=True, slots=True)
class TokenizerSource:
    """How one model's prompts are counted: `how` (one of the BY_ names), the tokenizer.json
    and chat template when there is one, and where they were found."""

    how: str
    path: Path | None = None
    template: str | None = None
    special: Mapping[str, str] | None = None  # the template's bos_token, eos_token …
    found: str = ""

    def describe(self) -> str:
        if self.how == BY_TOKENIZER:
            chat = "with its chat template" if self.template else "no chat template: per-message bound"
            return f"tokenizer {self.path} ({self.found}), {chat}"
        if self.how == BY_BACKEND:
            return (
                "byte bound; backend /tokenize where it decides a threshold (chat, completions, embeddings)"
            )
        if self.how == BY_SIMULATOR:
            return "the simulator's rule (4 characters a token)"
        return "byte bound (utf8-bytes, as configured)"


def find_tokenizer(
    model: str, own: str | None, shared: str | None, env: Mapping[str, str] | None = None
) -> TokenizerSource:
    """The tokenizer of `model`: `own` (models.M.tokenizer), else `shared` (top-level
    `tokenizer:`), else found locally. Raises TokenizerNotFound for a configured path without one."""
    for spec, where in ((own, f"models.{model}.tokenizer"), (shared, "tokenizer")):
        if spec:
            return _configured(spec, where)
    local = Path(model) / "tokenizer.json"
    if _is_file(local):
        return _source(local, "the model's local directory")
    cached = _hub_cache(model, os.environ if env is None else env)
    if cached is not None:
        return _source(cached, "the Hugging Face cache")
    return TokenizerSource(BY_BACKEND)


def _configured(spec: str, where: str) -> TokenizerSource:
    if spec == UTF8_BYTES:
        return TokenizerSource(BY_BYTES, found=where)
    if spec == SIMULATOR:
        return TokenizerSource(BY_SIMULATOR, found=where)
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not _is_file(path):
        raise TokenizerNotFound(
            f"no tokenizer.json at {spec!r} (a tokenizer.json, a directory holding one,"
            f" {UTF8_BYTES!r} or {SIMULATOR!r})"
        )
    return _source(path, where)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _hub_cache(model: str, env: Mapping[str, str]) -> Path | None:
    """The model's tokenizer.json in the Hugging Face cache: the snapshot `refs/main` names,
    else the most recently written one."""
    if model.startswith(("/", ".")) or ".." in model:
        return None  # a path, not a repository name
    home = env.get("HF_HOME")
    if env.get("HF_HUB_CACHE"):
        root = Path(env["HF_HUB_CACHE"])
    elif home:
        root = Path(home) / "hub"
    else:
        root = Path(env.get("HOME", str(Path.home()))) / ".cache" / "huggingface" / "hub"
    repo = root.expanduser() / ("models--" + model.replace("/", "--"))
    try:
        main = (repo / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    if main and _is_file(repo / "snapshots" / main / "tokenizer.json"):
        return repo / "snapshots" / main / "tokenizer.json"
    found = [p for p in (repo / "snapshots").glob("*/tokenizer.json") if _is_file(p)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _source(path: Path, found: str) -> TokenizerSource:
    template, special = _chat_template(path.parent)
    return TokenizerSource(BY_TOKENIZER, path=path, template=template, special=special, found=found)


def _chat_template(directory: Path) -> tuple[str | None, dict[str, str]]:
    """The default chat template beside a tokenizer.json and the special tokens it may print."""
    config: dict[str, Any] = {}
    try:
        loaded = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        config = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass
    # A chat_template.jinja file comes first, as transformers loads it.
    try:
        template: Any = (directory / "chat_template.jinja").read_text(encoding="utf-8")
    except OSError:
        template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str):
        template = None
    special: dict[str, str] = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            special[name] = value
    return template, special
