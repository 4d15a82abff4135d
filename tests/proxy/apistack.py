"""A router in front of fake backends that serve vLLM's other client routes, with keys whose
`routes:` open them: `api` (every route family), `reader` (responses only, for cross-key checks),
`namer` (responses, and allowed vLLM's `request_id`, which names a response).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from router.config.load import parse_profile
from router.keys.auth import hash_key
from router.server import build_state
from router.settings import Settings
from router.state.live import RouterState
from tests.conftest import Stack
from tests.support.fakebackend import FakeBackend
from tests.support.profiles import KEYS, profile
from tests.support.servers import ServerGroup, server_group

API_KEYS = {"api": "api-key-0123456789", "reader": "reader-key-0123456789", "namer": "namer-key-0123456789"}
ALL_ROUTES = ["chat", "completions", "embeddings", "responses", "rerank", "score", "tokenize", "audio"]


def api_profile(urls: list[str], **top: Any) -> dict[str, Any]:
    data = profile(urls, **top)
    data["keys"] = [
        *data["keys"],
        {"name": "api", "sha256": hash_key(API_KEYS["api"]), "routes": ALL_ROUTES},
        {"name": "reader", "sha256": hash_key(API_KEYS["reader"]), "routes": ["responses"]},
        {
            "name": "namer",
            "sha256": hash_key(API_KEYS["namer"]),
            "routes": ["responses"],
            "request_fields": {"allow": ["request_id"]},
        },
    ]
    return data


def bearer(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {API_KEYS.get(name) or KEYS[name]}"}


def sdk(url: str, key: str = "api") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEYS[key], max_retries=0, timeout=10)


def client(url: str, key: str = "api") -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers=bearer(key), timeout=10)


def write_profile(path: Path, data: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(data))


async def start_router(
    group: ServerGroup, data: dict[str, Any], path: Path | None = None
) -> tuple[str, RouterState]:
    """A router on `data` (written to `path` first, for reload tests); its URL and state."""
    if path is not None:
        write_profile(path, data)
    state = build_state(parse_profile(data), path)
    return await group.serve_router(state, Settings(config=path, watch_config=False)), state


@contextlib.asynccontextmanager
async def api_stack(n_backends: int = 2, config_dir: Path | None = None, **top: Any) -> AsyncIterator[Stack]:
    backends = [FakeBackend() for _ in range(n_backends)]
    for i, backend in enumerate(backends):
        backend.api.tag = f"b{i}"
    async with server_group() as group:
        urls = [await group.start(b) for b in backends]
        path = None if config_dir is None else config_dir / "profile.yaml"
        url, state = await start_router(group, api_profile(urls, **top), path)
        yield Stack(url, backends, urls, state, path)
