"""What a running vLLM server says it serves, asked over HTTP for `lane-router init`.

A server is asked three things: `/health` (it is up), `/version` (it is vLLM, and which) and
`/v1/models` (the names it serves, each with its `max_model_len`; a LoRA adapter names its base
model as `parent`). Anything else — no answer, an answer that is not vLLM's — is a `SurveyError`
that says which URL and what it answered. Every GET is bounded in time and in body bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

BODY_CAP = 1024 * 1024


class SurveyError(Exception):
    """A server that cannot be used as a backend: the message names it and says why."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    max_model_len: int | None  # a base model's; vLLM states none for an adapter
    parent: str | None  # the base model of a LoRA adapter; None for a base model's name


@dataclass(frozen=True, slots=True)
class ServerFacts:
    origin: str
    version: str
    models: tuple[ServedModel, ...]

    @property
    def bases(self) -> tuple[ServedModel, ...]:
        """The names the server's model is served under (its --served-model-name)."""
        return tuple(m for m in self.models if m.parent is None)

    @property
    def adapters(self) -> tuple[ServedModel, ...]:
        return tuple(m for m in self.models if m.parent is not None)


def origin_of(url: str) -> str:
    """`scheme://host:port` of a server's URL; an OpenAI base URL (`…/v1`) is taken as its server."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/")
    if path == "/v1":
        path = ""
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SurveyError(f"{url}: not an http:// or https:// URL (e.g. http://127.0.0.1:8000)")
    if path or parts.query or parts.fragment or parts.username or parts.password:
        raise SurveyError(f"{url}: give the server's origin, without path or credentials (http://host:port)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as err:
        raise SurveyError(f"{url}: {err}") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


def survey(url: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> ServerFacts:
    """Ask the vLLM server at `url` what it serves; `api_key`: the one it was started with."""
    origin = origin_of(url)
    with httpx.Client(timeout=timeout_s) as client:
        health = _get(client, origin, "/health", {})
        if health.status_code != 200:
            raise SurveyError(
                f"{origin}: /health answered {health.status_code}: the server is not ready (still loading?)"
            )
        version = _version(origin, _get(client, origin, "/version", {}))
        auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        models = _models(origin, _get(client, origin, "/v1/models", auth), keyed=bool(api_key))
    return ServerFacts(origin, version, models)


def _get(client: httpx.Client, origin: str, path: str, headers: Mapping[str, str]) -> httpx.Response:
    try:
        with client.stream("GET", origin + path, headers=headers) as resp:
            body = bytearray()
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > BODY_CAP:
                    raise SurveyError(f"{origin}: {path} answered more than {BODY_CAP} bytes: not vLLM")
            return httpx.Response(resp.status_code, headers=resp.headers, content=bytes(body))
    except httpx.HTTPError as err:
        raise SurveyError(f"{origin}: cannot reach it ({_reason(err)})") from None


def _reason(err: httpx.HTTPError) -> str:
    if isinstance(err, httpx.TimeoutException):
        return "no answer in time"
    return str(err) or type(err).__name__


def _json(resp: httpx.Response) -> Any:
    try:
        return orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        return None


def _not_vllm(origin: str, path: str, resp: httpx.Response, expected: str) -> SurveyError:
    return SurveyError(
        f"{origin}: {path} answered {resp.status_code} without {expected}: this is not a vLLM "
        "server's API (is the URL the server's, not a proxy's or another service's?)"
    )


def _version(origin: str, resp: httpx.Response) -> str:
    data = _json(resp)
    version = data.get("version") if isinstance(data, dict) else None
    if resp.status_code != 200 or not isinstance(version, str) or not version:
        raise _not_vllm(origin, "/version", resp, "a version")
    return version


def _models(origin: str, resp: httpx.Response, *, keyed: bool) -> tuple[ServedModel, ...]:
    if resp.status_code == 401:
        if keyed:
            raise SurveyError(f"{origin}: /v1/models refused the API key given (401)")
        raise SurveyError(
            f"{origin}: /v1/models asks for an API key (401): pass --backend-api-key-env VAR, "
            "VAR holding the key the server was started with (vLLM's --api-key)"
        )
    data = _json(resp)
    entries = data.get("data") if isinstance(data, dict) else None
    if resp.status_code != 200 or not isinstance(entries, list):
        raise _not_vllm(origin, "/v1/models", resp, "a model list")
    models = [_model(entry) for entry in entries]
    found = tuple(m for m in models if m is not None)
    if len(found) != len(models) or not any(m.parent is None for m in found):
        raise _not_vllm(origin, "/v1/models", resp, "a base model with its max_model_len")
    return found


def _model(entry: Any) -> ServedModel | None:
    if not isinstance(entry, dict):
        return None
    name, length, parent = entry.get("id"), entry.get("max_model_len"), entry.get("parent")
    parent = parent if isinstance(parent, str) and parent else None
    if not isinstance(name, str) or not name:
        return None
    if isinstance(length, bool) or not isinstance(length, int):
        if parent is None:
            return None  # vLLM states a base model's context length
        length = None
    return ServedModel(name, length, parent)
