"""`vllm serve` command lines: one per backend, where the backend URL says, with the pool's flags."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest

from router.config.render import RenderError, pool_serve_args
from router.deploy.render_vllm import serve_plan, serve_script
from tests.deploy.samples import cfg, example, found_by_dns, small


def test_one_command_per_backend_on_the_backend_address() -> None:
    plan = serve_plan(cfg(small()))

    assert [(c.pool, c.index, c.url) for c in plan.commands] == [
        ("chat", 0, "http://10.0.0.1:8101"),
        ("chat", 1, "http://10.0.0.2:8102"),
        ("bulk", 0, "http://bulk.internal:9000"),
    ]
    first = plan.commands[0].argv
    assert first[:3] == ("vllm", "serve", "org/chat")
    assert first[3:7] == ("--host", "10.0.0.1", "--port", "8101")
    assert first[7:] == pool_serve_args(cfg(small()).pools["chat"]).args


def test_a_host_name_binds_every_interface_with_a_warning() -> None:
    plan = serve_plan(cfg(small()))
    bulk = plan.commands[2].argv

    assert bulk[bulk.index("--host") + 1] == "0.0.0.0"
    assert any("bulk.internal:9000 listens on every interface" in n for n in plan.notes)


def test_a_pool_found_by_dns_gets_one_command_for_every_host_its_name_resolves_to() -> None:
    plan = serve_plan(cfg(found_by_dns(port=8200)))
    [chat] = [c for c in plan.commands if c.pool == "chat"]

    assert chat.url == "http://<each address of chat.internal>:8200"
    assert chat.argv[3:7] == ("--host", "0.0.0.0", "--port", "8200")
    assert chat.argv[7:] == pool_serve_args(cfg(found_by_dns()).pools["chat"]).args
    [note] = [n for n in plan.notes if n.startswith("pool chat: found by DNS (chat.internal)")]
    assert "let only the router reach port 8200" in note
    assert "# pool chat, backend 0: http://<each address of chat.internal>:8200" in serve_script(plan)


def test_cpu_starts_the_api_server_module() -> None:
    command = serve_plan(cfg(small()), "cpu").commands[0]

    assert command.argv[:5] == ("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "org/chat")
    assert "--gpu-memory-utilization" not in command.argv


def test_model_revision_is_passed_with_the_model() -> None:
    command = serve_plan(cfg(small(chat={"vllm": {"model_revision": "0123abc"}}))).commands[0]

    assert command.argv[2:5] == ("org/chat", "--revision", "0123abc")


def test_partial_prefill_flags_only_where_vllm_has_them() -> None:
    old = cfg(small(chat={"vllm": {"version": "0.26.0", "max_num_partial_prefills": 4,
                                   "max_long_partial_prefills": 1}}))  # fmt: skip
    old_args = serve_plan(old).commands[0].argv
    new_plan = serve_plan(cfg(small()))

    assert old_args[old_args.index("--max-num-partial-prefills") + 1] == "4"
    assert old_args[old_args.index("--max-long-partial-prefills") + 1] == "1"
    assert not any("partial-prefills" in a for c in new_plan.commands for a in c.argv)
    assert any("0.32.0 has no partial-prefill flags" in n and "admission" in n for n in new_plan.notes)


def test_a_flag_the_version_lacks_is_an_error() -> None:
    with pytest.raises(RenderError, match=re.escape("--max-num-queued-reqs does not exist in vLLM 0.26.0")):
        serve_plan(cfg(small(chat={"vllm": {"version": "0.26.0", "max_num_queued_reqs": 8}})))


def _run_shell(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run each command line with `vllm`/`python` replaced by a printer of its arguments."""
    printer = 'printf "%s\\n" "KEY=$VLLM_API_KEY" "$@"'
    prelude = f"vllm() {{ {printer}; }}\npython() {{ {printer}; }}\n"
    return subprocess.run(
        ["sh", "-c", prelude + script], env={"PATH": os.environ["PATH"], **env},
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip


def test_the_script_runs_in_a_shell_with_keys_and_models_from_the_environment() -> None:
    plan = serve_plan(cfg(small()))
    script = serve_script(plan)

    done = _run_shell(
        script, {"CHAT_KEY": "k-chat", "BULK_KEY": "k-bulk", "LANE_ROUTER_MODEL_CHAT": "/m/chat"}
    )

    assert done.returncode == 0, done.stderr
    expected: list[str] = []
    for command, key, model in zip(
        plan.commands, ["k-chat", "k-chat", "k-bulk"], ["/m/chat", "/m/chat", "org/bulk"], strict=True
    ):
        argv = list(command.argv)
        argv[command.model_at] = model  # the variable's value, or the pool's model when unset
        expected += [f"KEY={key}", *argv[1:]]
    assert done.stdout.splitlines() == expected


def test_the_script_stops_before_a_server_starts_without_its_key() -> None:
    done = _run_shell(serve_script(serve_plan(cfg(small()))), {"BULK_KEY": "k"})

    assert done.returncode != 0
    assert "CHAT_KEY" in done.stderr
    assert done.stdout == ""


def test_example_profile_renders_every_backend() -> None:
    profile = example()
    plan = serve_plan(profile)
    lines = [line for line in serve_script(plan).splitlines() if line and not line.startswith("#")]

    assert len(lines) == sum(len(p.backends) for p in profile.pools.values()) == 7
    assert all(shlex.split(line)[1:3] == ["vllm", "serve"] for line in lines)
