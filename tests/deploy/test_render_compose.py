"""The compose file: valid against the compose specification, only the router published, every
backend a service, and the embedded profile pointing at those services."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from router.config.load import parse_profile
from router.config.models import ProfileConfig
from router.config.render import RenderError
from router.deploy.render_compose import ComposeOptions, render_compose
from tests.deploy.samples import cfg, example, found_by_dns, small
from tests.deploy.tools import REPO, compose_schema


def compose(profile: ProfileConfig, **options: Any) -> dict[str, Any]:
    manifest = render_compose(profile, ComposeOptions(**options))
    assert len(manifest.documents) == 1
    return manifest.documents[0]


def embedded_profile(doc: dict[str, Any]) -> ProfileConfig:
    content = doc["configs"]["lane-router-profile"]["content"].replace("$$", "$")
    return parse_profile(yaml.safe_load(content))


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = compose_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_valid_against_the_compose_specification(validator: Any, device: str) -> None:
    doc = compose(example(), device=device)

    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert errors == []


def test_the_schema_check_can_fail(validator: Any) -> None:
    doc = compose(example())
    doc["services"]["lane-router"]["restart_policy"] = "always"  # not a service key
    doc["services"]["vllm-slow-0"]["shm_size"] = ["8gb"]

    errors = list(validator.iter_errors(doc))
    assert any("restart_policy" in e.message for e in errors)
    assert any(list(e.absolute_path) == ["services", "vllm-slow-0", "shm_size"] for e in errors)


def test_only_the_router_is_published_and_pools_sit_on_their_own_network() -> None:
    doc = compose(example())
    services = doc["services"]

    published = [name for name, s in services.items() if "ports" in s or "expose" in s]
    assert published == ["lane-router"]
    assert services["lane-router"]["networks"] == ["edge", "pools", "state"]
    vllm = vllm_services(doc)
    assert len(vllm) == 7
    assert all(s["networks"] == ["pools"] for s in vllm.values())
    assert services["lane-router-redis"]["networks"] == ["state"]
    assert all("network_mode" not in s for s in services.values())
    assert doc["networks"] == {"edge": {}, "pools": {}, "state": {"internal": True}}


def vllm_services(doc: dict[str, Any]) -> dict[str, Any]:
    return {name: s for name, s in doc["services"].items() if name.startswith("vllm-")}


def test_shared_state_gets_a_redis_of_its_own_unless_the_url_comes_from_the_environment() -> None:
    doc = compose(example())
    assert embedded_profile(doc).state.redis_url == "redis://lane-router-redis:6379/0"
    redis = doc["services"]["lane-router-redis"]
    assert redis["image"].startswith("redis:") and redis["read_only"] is True

    external = small()
    external["state"] = {"redis_url_env": "LR_REDIS_URL", "on_error": "closed"}
    doc = compose(cfg(external))
    assert "lane-router-redis" not in doc["services"]
    assert doc["services"]["lane-router"]["environment"]["LR_REDIS_URL"].startswith("${LR_REDIS_URL:?")
    assert embedded_profile(doc).state.redis_url_env == "LR_REDIS_URL"

    alone = compose(cfg(small()))
    assert "lane-router-redis" not in alone["services"] and "state" not in alone["networks"]


def test_every_backend_is_a_service_and_the_profile_points_at_it() -> None:
    source = example()
    doc = compose(source)

    profile = embedded_profile(doc)
    for name, pool in profile.pools.items():
        assert len(pool.backends) == len(source.pools[name].backends)
        for url in pool.backends:
            assert url.port == 8000
            service = doc["services"][url.host]
            assert service["command"][service["command"].index("--port") + 1] == "8000"
            served = service["command"][service["command"].index("--served-model-name") + 1]
            assert served == pool.model
    assert profile.lanes == source.lanes
    assert profile.keys == source.keys


def test_gpu_services_use_the_official_image_and_distinct_gpus() -> None:
    data = small(bulk={"vllm": {"tensor_parallel_size": 2}})
    doc = compose(cfg(data))
    vllm = [s for name, s in doc["services"].items() if name != "lane-router"]

    assert {s["image"] for s in vllm} == {"vllm/vllm-openai:v0.32.0"}
    assert all(s["entrypoint"] == ["vllm", "serve"] for s in vllm)
    ids = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in vllm]
    assert ids == [["0"], ["1"], ["2", "3"]]


def test_cpu_services_build_the_cpu_image_from_the_repository(tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    out.mkdir()  # the kernel resolves "out/.." only through an existing directory
    doc = compose(example(), device="cpu", context=os.path.relpath(REPO, out))

    vllm = list(vllm_services(doc).values())
    assert all(s["image"] == "lane-router-vllm-cpu:0.32.0" for s in vllm)
    assert all(s["entrypoint"] == ["python", "-m", "vllm.entrypoints.openai.api_server"] for s in vllm)
    assert all(s["build"]["args"] == {"VLLM_CPU_VERSION": "0.32.0"} for s in vllm)
    assert all((out / s["build"]["context"] / "Dockerfile").is_file() for s in vllm)
    assert (out / doc["services"]["lane-router"]["build"]["context"] / "Dockerfile").is_file()


def test_secrets_come_from_the_environment_and_are_required() -> None:
    doc = compose(example())
    router_env = doc["services"]["lane-router"]["environment"]

    expected = {k.sha256_env for k in example().keys} | {
        p.upstream_api_key_env for p in example().pools.values()
    }
    required = {
        name for name, value in router_env.items() if re.fullmatch(rf"\$\{{{name}:\?[^}}]+\}}", value)
    }
    assert required == expected
    for name, service in vllm_services(doc).items():
        pool = name.removeprefix("vllm-").rsplit("-", 1)[0]
        assert service["environment"]["VLLM_API_KEY"].startswith(
            f"${{{example().pools[pool].upstream_api_key_env}:?"
        )


def test_dollars_in_the_profile_survive_interpolation() -> None:
    doc = compose(cfg(small(chat={"model": "org/pay$day"})))

    content = doc["configs"]["lane-router-profile"]["content"]
    assert "org/pay$$day" in content
    assert embedded_profile(doc).pools["chat"].model == "org/pay$day"
    command = doc["services"]["vllm-chat-0"]["command"]
    assert command[0] == "${LANE_ROUTER_MODEL_CHAT:-org/pay$$day}"


def test_a_pool_found_by_dns_is_refused_by_its_dotted_path() -> None:
    with pytest.raises(
        RenderError, match=r"^pools\.chat\.discovery: compose runs one vLLM service per listed"
    ):
        render_compose(cfg(found_by_dns()))
