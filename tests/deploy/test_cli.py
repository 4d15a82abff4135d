"""`lane-router render`, through the real command-line entry point."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from router.cli import main
from router.deploy.render_vllm import serve_plan, serve_script
from router.keys.auth import hash_key
from tests.deploy.samples import example, found_by_dns, small
from tests.deploy.tools import EXAMPLE_PROFILE, REPO


def write(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_vllm_prints_the_serve_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "vllm", str(EXAMPLE_PROFILE), "--device", "cpu"]) == 0

    assert capsys.readouterr().out == serve_script(serve_plan(example(), "cpu"))


@pytest.mark.parametrize(
    ("target", "filename", "first_kind"),
    [("compose", "compose.yaml", None), ("k8s", "lane-router.yaml", "Secret")],
)
def test_out_writes_the_target_file(
    tmp_path: Path, target: str, filename: str, first_kind: str | None
) -> None:
    out = tmp_path / "out"

    assert main(["render", target, str(EXAMPLE_PROFILE), "--out", str(out), "--context", str(REPO)]) == 0

    docs = list(yaml.safe_load_all((out / filename).read_text(encoding="utf-8")))
    if first_kind is None:
        assert len(docs) == 1 and "services" in docs[0]
        # Compose resolves the build context against the file's directory.
        assert (out / docs[0]["services"]["lane-router"]["build"]["context"]).resolve() == REPO
    else:
        assert docs[0]["kind"] == first_kind and len(docs) == 16 + 3  # + the shared state's Redis


def test_images_can_be_chosen(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["render", "k8s", str(EXAMPLE_PROFILE), "--router-image", "registry.example/lr:1", "--vllm-image",
            "registry.example/vllm:{version}-cu12"]  # fmt: skip
    assert main(argv) == 0

    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    images = {
        c["image"]
        for d in docs
        if "template" in d.get("spec", {})
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.example/lr:1", "registry.example/vllm:0.32.0-cu12", "redis:7.4-alpine"}


def test_a_flag_the_version_lacks_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, small(chat={"vllm": {"version": "0.20.0", "max_num_active_seqs": 8}}))
    out = tmp_path / "out"

    assert main(["render", "k8s", str(path), "--out", str(out)]) == 2

    err = capsys.readouterr().err
    assert "max_num_active_seqs: --max-num-active-seqs does not exist in vLLM 0.20.0" in err
    assert not out.exists()


def test_an_invalid_profile_exits_2_with_its_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = small(chat={"vllm": {"max_num_seqs": 4096}})

    assert main(["render", "vllm", str(write(tmp_path, data))]) == 2

    assert "pools.chat.vllm.max_num_batched_tokens: must be ≥ max_num_seqs (4096)" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["vllm", "compose", "k8s"])
def test_a_literal_key_anyone_can_use_is_refused_and_nothing_is_written(
    tmp_path: Path, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = small()
    data["keys"] += [
        {"name": "demo", "sha256": hash_key("demo-key"), "may_set_class": True},
        {"name": "filler", "sha256": "deadbeef" * 8},
    ]
    out = tmp_path / "out"

    assert main(["render", target, str(write(tmp_path, data)), "--out", str(out)]) == 2

    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith(f"lane-router render {target}: refusing to render ")
    assert lines[1].startswith("  keys[2].sha256: key 'demo' is the sha256 of 'demo-key'")
    assert lines[2].startswith("  keys[3].sha256: key 'filler' is a placeholder")
    assert len(lines) == 3 and all("lane-router hash-key --new" in line for line in lines[1:])
    assert not out.exists()


def test_environment_keys_are_left_to_where_the_deployment_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPS_SHA256", hash_key("EMPTY"))  # this machine's, not the deployment's
    out = tmp_path / "out"

    assert main(["render", "k8s", str(write(tmp_path, small())), "--out", str(out)]) == 0

    assert (out / "lane-router.yaml").exists()


def test_autoscalers_and_their_metrics_source_are_chosen_on_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["render", "k8s", str(EXAMPLE_PROFILE), "--namespace", "llm",
            "--autoscale", "interactive=hpa:2-6", "--autoscale", "batch=keda:1-4:8",
            "--prometheus", "http://prom.obs.svc:9090", "--prometheus-pods", "obs:app=prom"]  # fmt: skip
    assert main(argv) == 0

    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(capsys.readouterr().out)}
    assert {d["metadata"]["namespace"] for d in docs.values()} == {"llm"}
    assert docs["HorizontalPodAutoscaler", "vllm-interactive"]["spec"]["maxReplicas"] == 6
    [trigger] = docs["ScaledObject", "vllm-batch"]["spec"]["triggers"]
    assert trigger["metadata"]["serverAddress"] == "http://prom.obs.svc:9090"
    assert trigger["metadata"]["threshold"] == "8"
    [rule] = docs["NetworkPolicy", "vllm-metrics-from-prometheus"]["spec"]["ingress"]
    assert rule["from"][0]["podSelector"] == {"matchLabels": {"app": "prom"}}


def test_autoscale_on_slo_is_chosen_on_the_command_line_and_needs_keda(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "render",
        "k8s",
        str(EXAMPLE_PROFILE),
        "--autoscale",
        "interactive=keda:2-6",
        "--autoscale-on",
        "both",
    ]
    assert main(argv) == 0
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(capsys.readouterr().out)}
    waiting, slo = docs["ScaledObject", "vllm-interactive"]["spec"]["triggers"]
    assert "vllm:num_requests_waiting" in waiting["metadata"]["query"]
    assert "lane:lane_router_slo_attainment:ratio_rate5m" in slo["metadata"]["query"]

    hpa = [
        "render",
        "k8s",
        str(EXAMPLE_PROFILE),
        "--autoscale",
        "interactive=hpa:2-6",
        "--autoscale-on",
        "slo",
    ]
    assert main(hpa) == 2
    assert "scaling on SLO attainment (--autoscale-on slo) takes keda" in capsys.readouterr().err
    assert main(["render", "compose", str(EXAMPLE_PROFILE), "--autoscale-on", "slo"]) == 2
    assert capsys.readouterr().err == "lane-router render compose: --autoscale-on: for k8s only\n"


def test_a_malformed_autoscaler_exits_2_with_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["render", "k8s", str(EXAMPLE_PROFILE), "--autoscale", "interactive=hpa:6-2"])

    assert exit_.value.code == 2
    assert "--autoscale: 'interactive=hpa:6-2': need 1 ≤ MIN ≤ MAX" in capsys.readouterr().err


def test_an_autoscaler_for_no_pool_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"

    assert (
        main(["render", "k8s", str(EXAMPLE_PROFILE), "--autoscale", "chat=hpa:1-2", "--out", str(out)]) == 2
    )

    assert "autoscaler for 'chat': the profile has no such pool" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("target", ["vllm", "compose"])
def test_kubernetes_options_are_refused_for_other_targets(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["render", target, str(EXAMPLE_PROFILE), "--autoscale", "interactive=hpa:1-2", "--namespace", "x"]

    assert main(argv) == 2

    assert capsys.readouterr().err == f"lane-router render {target}: --namespace, --autoscale: for k8s only\n"


def test_compose_refuses_a_pool_found_by_dns_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"

    assert main(["render", "compose", str(write(tmp_path, found_by_dns())), "--out", str(out)]) == 2

    err = capsys.readouterr().err
    assert "profile.yaml: pools.chat.discovery: compose runs one vLLM service per listed backend" in err
    assert not out.exists()


@pytest.mark.parametrize("target", ["vllm", "k8s"])
def test_other_targets_render_a_pool_found_by_dns(tmp_path: Path, target: str) -> None:
    assert main(["render", target, str(write(tmp_path, found_by_dns())), "--out", str(tmp_path / "out")]) == 0


def test_the_help_explains_the_kubernetes_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["render", "--help"])

    text = " ".join(capsys.readouterr().out.split())
    expected = [
        "--autoscale POOL=hpa|keda:MIN-MAX[:WAITING]",
        "vllm:num_requests_waiting",
        "deploy/prometheus/prometheus-adapter.yml",
        "--prometheus-pods",
        "(default lane-router)",
    ]
    assert [words for words in expected if words not in text] == []
