"""The `check` and `hash-key` subcommands, run through the real command-line entry point."""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

import pytest

from router.cli import main
from router.config import load_profile, server_configuration_hash

VALID = """\
profile: class-aware
pools:
  interactive:
    backends: [http://127.0.0.1:8101, http://127.0.0.1:8102]
    model: org/chat-model
    vllm: {version: "0.33.0", max_model_len: 8192, max_num_batched_tokens: 2048, max_num_seqs: 64}
    admission: {max_prefilling: 8, max_long_prefilling: 2}
  batch:
    backends: [http://127.0.0.1:8201]
    model: org/chat-model
    vllm: {max_model_len: 32768, max_num_batched_tokens: 8192, max_num_seqs: 32}
lanes:
  chat: {pool: interactive, priority: 0}
  rag: {pool: interactive, balance: prefix_affinity}
  long_context: {pool: batch}
  agent: {pool: interactive, balance: prefix_affinity}
  batch: {pool: batch, priority: 9, max_in_flight: 4}
  slow_stream: {pool: interactive, decouple: true}
keys:
  - {name: web, sha256: "%s"}
""" % ("a" * 64)

INVALID = """\
pools:
  batch:
    backends: [http://127.0.0.1:8201]
    model: m
    vllm: {max_num_seqs: 0, max_num_batched_tokens: 0}
lanes:
  chat: {pool: batch, priority: 1000}
keys:
  - {name: web, sha256: "nothex"}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_check_valid_profile_prints_lanes_pools_and_hashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, VALID)

    assert main(["check", str(path)]) == 0

    out, err = capsys.readouterr()
    assert err == ""
    assert "class-aware" in out
    lines = out.splitlines()
    for cls, pool_name in [
        ("chat", "interactive"),
        ("rag", "interactive"),
        ("long_context", "batch"),
        ("agent", "interactive"),
        ("batch", "batch"),
        ("slow_stream", "interactive"),
    ]:
        row = ["org/chat-model", cls, cls, pool_name]
        assert any(line.split()[:4] == row for line in lines if line.strip()), cls
    cfg = load_profile(path)
    hash_lines = [line.strip() for line in lines if "server_configuration_hash=" in line]
    assert len(hash_lines) == len(cfg.pools) == 2
    for pool in cfg.pools.values():
        expected = f"server_configuration_hash={server_configuration_hash(pool.vllm, pool.model)}"
        assert expected in hash_lines
    assert all(re.fullmatch(r"server_configuration_hash=sha256:[0-9a-f]{64}", h) for h in hash_lines)
    assert "org/chat-model" in out


def test_check_invalid_profile_lists_every_error_path_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, INVALID)

    assert main(["check", str(path)]) == 2

    out, err = capsys.readouterr()
    assert out == ""
    assert "pools.batch.vllm.max_num_seqs: must be ≥ 1" in err
    assert "pools.batch.vllm.max_num_batched_tokens: must be ≥ 1" in err
    assert "lanes.chat.priority: must be ≤ 100" in err
    assert "keys[0].sha256:" in err
    assert str(path) in err


def test_check_reports_cross_check_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = VALID.replace("  rag: {pool: interactive, balance: prefix_affinity}\n", "").replace(
        "long_context: {pool: batch}", "long_context: {pool: nowhere}"
    )

    assert main(["check", str(write(tmp_path, text))]) == 2

    err = capsys.readouterr().err
    assert "lanes.rag: missing" in err
    assert "lanes.long_context.pool:" in err


def test_check_yaml_error_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(write(tmp_path, "pools: [unclosed\n"))]) == 2
    assert re.search(r"line \d+, column \d+: invalid YAML", capsys.readouterr().err)

    assert main(["check", str(tmp_path / "absent.yaml")]) == 2
    assert "(file)" in capsys.readouterr().err


def test_hash_key_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hash-key", "lr-secret"]) == 0

    assert capsys.readouterr().out.strip() == hashlib.sha256(b"lr-secret").hexdigest()


def test_hash_key_new_prints_a_key_and_its_matching_hash(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hash-key", "--new"]) == 0

    fields = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines() if line.strip())
    key, digest = fields["key"].strip(), fields["sha256"].strip()
    assert len(key) >= 32
    assert digest == hashlib.sha256(key.encode()).hexdigest()


def test_hash_key_new_differs_each_time(capsys: pytest.CaptureFixture[str]) -> None:
    main(["hash-key", "--new"])
    first = capsys.readouterr().out
    main(["hash-key", "--new"])

    assert capsys.readouterr().out != first


def test_hash_key_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("lr-from-stdin\n"))

    assert main(["hash-key"]) == 0

    assert capsys.readouterr().out.strip() == hashlib.sha256(b"lr-from-stdin").hexdigest()


def test_hash_key_refuses_an_empty_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))

    assert main(["hash-key"]) == 2

    out, err = capsys.readouterr()
    assert out == ""
    assert "empty" in err


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "check" in capsys.readouterr().out


def test_check_says_how_each_models_prompts_are_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.request.test_tokenizer_source import model_dir

    snapshot = model_dir(tmp_path / "hub" / "models--org--chat-model" / "snapshots" / "abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)

    embed = """\
  embed:
    backends: [http://127.0.0.1:8301]
    model: org/embed-model
    vllm: {max_model_len: 512, max_num_batched_tokens: 512, max_num_seqs: 32}
models:
  org/embed-model: {}
lanes:
"""
    assert main(["check", str(write(tmp_path, VALID.replace("lanes:\n", embed, 1)))]) == 0

    out = capsys.readouterr().out
    counts = out[out.index("prompt counts:") :].splitlines()
    assert counts[1] == (
        f"  org/chat-model: tokenizer {snapshot / 'tokenizer.json'} (the Hugging Face cache),"
        " with its chat template"
    )
    assert counts[2] == (
        "  org/embed-model: byte bound; backend /tokenize where it decides a threshold"
        " (chat, completions, embeddings)"
    )


MULTI = """\
pools:
  chat-fast: {model: llama, aliases: [llama-chat], adapters: [sql-lora], backends: [http://127.0.0.1:8101]}
  chat-large: {model: llama, backends: [http://127.0.0.1:8102]}
  embed: {model: bge, backends: [http://127.0.0.1:8103]}
  rerank: {model: ranker, backends: [http://127.0.0.1:8104]}
lanes:
  chat: {pool: chat-fast}
  rag: {pool: chat-fast}
  agent: {pool: chat-fast}
  slow_stream: {pool: chat-fast}
  long_context: {pool: chat-large}
  batch: {pool: chat-large}
models:
  ranker:
    lanes: {chat: {pool: rerank, max_in_flight: 8}}
"""


def test_check_prints_each_model_and_class_with_its_lane_and_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(write(tmp_path, MULTI))]) == 0

    out = capsys.readouterr().out
    rows = {tuple(line.split()[:4]) for line in out.splitlines()}
    classes = ("chat", "rag", "long_context", "agent", "batch", "slow_stream")
    chat_pools = {"long_context": "chat-large", "batch": "chat-large"}
    assert {("llama", c, c, chat_pools.get(c, "chat-fast")) for c in classes} <= rows
    assert {("bge", c, f"bge:{c}", "embed") for c in classes} <= rows
    assert {("ranker", c, f"ranker:{c}", "rerank") for c in classes} <= rows
    assert "llama: pools chat-fast, chat-large, also as llama-chat (alias), sql-lora (adapter)" in out


def test_check_refuses_a_pool_no_lane_reaches_and_a_class_without_a_lane(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spare = MULTI.replace(
        "lanes:\n", "  chat-spare: {model: llama, backends: [http://127.0.0.1:8105]}\nlanes:\n", 1
    )
    assert main(["check", str(write(tmp_path, spare))]) == 2
    assert "pools.chat-spare: no lane reaches it" in capsys.readouterr().err

    second = MULTI.replace(
        "lanes:\n", "  rerank-2: {model: ranker, backends: [http://127.0.0.1:8105]}\nlanes:\n", 1
    )
    assert main(["check", str(write(tmp_path, second))]) == 2
    err = capsys.readouterr().err
    assert "models.ranker.lanes.batch: missing: model 'ranker' is served by several pools" in err
    assert "models.ranker.lanes.chat:" not in err


def test_serve_says_how_each_models_prompts_are_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    from router.server import build_app
    from router.settings import Settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    path = write(tmp_path, VALID)
    with caplog.at_level(logging.INFO, logger="lane_router"):
        build_app(Settings(config=path))

    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prompts of")]
    assert said == [
        "prompts of org/chat-model: byte bound; backend /tokenize where it decides a threshold"
        " (chat, completions, embeddings)"
    ]
