"""`lane-router init`: a starter profile from what running servers say they serve, which `check`
accepts and the router serves with the key printed; clear refusals for what cannot make one."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from router.cli import main
from router.config.load import load_profile
from router.config.models import ALL_CLASSES
from router.keys.auth import hash_key
from router.server import build_state
from router.settings import Settings
from tests.proxy.rawserver import closed_port, ok, pages, raw_servers
from tests.support.fakebackend import FakeBackend
from tests.support.servers import server_group


async def run_cli(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The command line's exit code, stdout and stderr; run in a thread, so servers in this
    event loop answer it."""
    out, err = io.StringIO(), io.StringIO()

    def call() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(list(argv))

    with pytest.MonkeyPatch.context() as patch:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        code = await asyncio.to_thread(call)
    return code, out.getvalue(), err.getvalue()


def vllm_pages(models: Sequence[dict[str, Any]], version: str = "0.32.0") -> dict[bytes, bytes]:
    return {
        b"/health": ok(b""),
        b"/version": ok(orjson.dumps({"version": version})),
        b"/v1/models": ok(orjson.dumps({"object": "list", "data": list(models)})),
    }


def base(name: str, length: int = 4096) -> dict[str, Any]:
    return {"id": name, "object": "model", "root": f"/models/{name}", "parent": None, "max_model_len": length}


async def test_init_writes_a_profile_that_check_accepts_and_serve_serves_with_the_key(tmp_path: Path) -> None:
    out = tmp_path / "lane-router.yaml"
    backends = [FakeBackend(), FakeBackend()]
    async with server_group() as group:
        urls = [await group.start(b) for b in backends]
        code, stdout, stderr = await run_cli("init", *urls, "--output", str(out))
        assert code == 0, stderr
        key = stdout.strip()
        assert key and "\n" not in key
        text = out.read_text()
        assert key not in text and hash_key(key) in text

        cfg = load_profile(out)
        ((name, pool),) = cfg.pools.items()
        assert pool.model == "fake-model" and pool.vllm.max_model_len == 2048  # what the servers said
        assert list(pool.origins) == urls and pool.vllm.version == "0.32.0"
        assert {lane.pool for lane in cfg.lanes.values()} == {name} and set(cfg.lanes) == set(ALL_CLASSES)

        code, stdout, stderr = await run_cli("check", "--config", str(out))
        assert code == 0, stderr
        assert f"one pool, {name!r}: every request class goes to it" in stdout

        state = build_state(cfg, out)
        router = await group.serve_router(state, Settings(config=out))
        async with httpx.AsyncClient(base_url=router, timeout=10) as client:
            chat = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            answer = await client.post(
                "/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {key}"}
            )
            refused = await client.post(
                "/v1/chat/completions", json=chat, headers={"authorization": "Bearer no"}
            )
    assert answer.status_code == 200, answer.text
    assert refused.status_code == 401
    assert sum(len(b.seen) for b in backends) == 1


async def test_init_groups_the_served_names_and_lora_adapters(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    served = [base("org/base-7b", 4096), base("base"), {"id": "sql-lora", "parent": "org/base-7b"}]
    smaller = [base("org/base-7b", 2048), base("base"), {"id": "sql-lora", "parent": "org/base-7b"}]
    async with raw_servers() as start:
        one = await start(pages(vllm_pages(served)))
        two = await start(pages(vllm_pages(smaller)))
        code, _, stderr = await run_cli("init", one.origin + "/v1", two.origin, "--output", str(out))
    assert code == 0, stderr
    pool = load_profile(out).pools["base-7b"]
    assert pool.model == "org/base-7b" and pool.aliases == ("base",) and pool.adapters == ("sql-lora",)
    assert pool.models == ("org/base-7b", "base", "sql-lora")
    assert pool.vllm.max_model_len == 2048  # the smallest the servers run
    assert "differ in max_model_len" in stderr


async def test_init_names_the_backend_key_variable_and_asks_with_it(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    guarded = vllm_pages([base("m")])
    guarded[b"/v1/models"] = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\n\r\n{}"
    async with raw_servers() as start:
        server = await start(pages(guarded))
        code, stdout, stderr = await run_cli("init", server.origin, "--output", str(out))
    assert code == 2 and stdout == "" and not out.exists()
    assert "asks for an API key" in stderr and "--backend-api-key-env" in stderr

    open_models = vllm_pages([base("m")])
    async with raw_servers() as start:
        server = await start(pages(open_models))
        code, _, stderr = await run_cli(
            "init", server.origin, "--output", str(out), "--backend-api-key-env", "VLLM_KEY",
            env={"VLLM_KEY": "secret"},
        )  # fmt: skip
    assert code == 0, stderr
    text = out.read_text()
    assert load_profile(out).pools["m"].upstream_api_key_env == "VLLM_KEY" and "secret" not in text


async def test_init_refuses_an_unreachable_url() -> None:
    code, stdout, stderr = await run_cli(
        "init", f"http://127.0.0.1:{closed_port()}", "--output", "/nonexistent/x"
    )
    assert code == 2 and stdout == ""
    assert "cannot reach it" in stderr


@pytest.mark.parametrize(
    "answers",
    [
        {b"/health": ok(b"")},  # no /version, no /v1/models
        {b"/health": ok(b""), b"/version": ok(b"<html>hello</html>")},
        {**vllm_pages([]), b"/v1/models": ok(b'{"data": [{"id": "m"}]}')},  # no max_model_len
    ],
    ids=["no-version", "html-version", "models-without-context"],
)
async def test_init_refuses_a_server_that_is_not_vllm(tmp_path: Path, answers: dict[bytes, bytes]) -> None:
    out = tmp_path / "p.yaml"
    async with raw_servers() as start:
        server = await start(pages(answers))
        code, stdout, stderr = await run_cli("init", server.origin, "--output", str(out))
    assert code == 2 and stdout == "" and not out.exists()
    assert server.origin in stderr and "not a vLLM server" in stderr


async def test_init_refuses_servers_of_different_models(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    async with raw_servers() as start:
        one = await start(pages(vllm_pages([base("a")])))
        two = await start(pages(vllm_pages([base("b")])))
        code, _, stderr = await run_cli("init", one.origin, two.origin, "--output", str(out))
    assert code == 2 and not out.exists()
    assert "different models" in stderr and "'a'" in stderr and "'b'" in stderr


async def test_init_keeps_an_existing_file_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "lane-router.yaml"
    out.write_text("mine: true\n")
    async with raw_servers() as start:
        server = await start(pages(vllm_pages([base("m")])))
        code, stdout, stderr = await run_cli("init", server.origin, "--output", str(out))
        assert code == 2 and stdout == "" and "--force" in stderr
        assert yaml.safe_load(out.read_text()) == {"mine": True}
        code, stdout, stderr = await run_cli("init", server.origin, "--output", str(out), "--force")
    assert code == 0, stderr
    assert load_profile(out).pools["m"].model == "m"
