"""What all deployments share: pool names as DNS labels, environment names, launcher flags, and the
profile as the deployed router reads it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from router.config.load import ConfigError, parse_profile
from router.config.render import RenderError, pool_serve_args
from router.deploy.plan import deployed_profile, env_name, plan_pools, pool_notes, slug
from tests.deploy.samples import cfg, small
from tests.support.tlscerts import TestCA


def test_slug_is_a_dns_label() -> None:
    assert slug("interactive") == "vllm-interactive"
    assert slug("Batch_Pool.v2") == "vllm-batch-pool-v2"
    assert slug("x" * 64) == "vllm-" + "x" * 40


def test_pools_that_would_deploy_under_one_name_are_refused() -> None:
    data = small()
    data["pools"]["bulk_a"] = data["pools"].pop("bulk")
    data["pools"]["bulk.a"] = {**data["pools"]["bulk_a"], "backends": ["http://other:1"]}
    classes = ("chat", "rag", "long_context", "agent", "batch", "slow_stream")
    lanes = {c: {"pool": "bulk_a" if c in ("long_context", "batch") else "bulk.a"} for c in classes}
    data["models"]["org/bulk"]["lanes"] = lanes

    with pytest.raises(RenderError, match=re.escape("'bulk_a' and 'bulk.a' both deploy as 'vllm-bulk-a'")):
        plan_pools(cfg(data), "gpu")


def test_environment_names() -> None:
    assert env_name("LANE_ROUTER_MODEL", "long-ctx.v2") == "LANE_ROUTER_MODEL_LONG_CTX_V2"


def test_serve_arguments_are_the_config_renderers() -> None:
    profile = cfg(small())
    plans = plan_pools(profile, "cpu")

    assert [p.serve for p in plans] == [
        pool_serve_args(pool, device="cpu") for pool in profile.pools.values()
    ]
    assert [p.replicas for p in plans] == [2, 1]


@pytest.mark.parametrize(
    "arg", ["--port", "--host=0.0.0.0", "--api-key", "--served-model-name", "--revision"]
)
def test_extra_args_may_not_set_what_the_deployment_sets(arg: str) -> None:
    with pytest.raises(ConfigError) as err:
        cfg(small(chat={"vllm": {"extra_args": ["--enforce-eager", arg, "1"]}}))

    assert err.value.issues[0].path == "pools.chat.vllm.extra_args"
    assert arg.split("=")[0] in err.value.issues[0].message


def test_other_extra_args_pass_through() -> None:
    profile = cfg(small(chat={"vllm": {"extra_args": ["--enforce-eager"]}}))

    assert plan_pools(profile, "gpu")[0].serve.args[-1] == "--enforce-eager"


def listed(**backend: str) -> dict[str, dict[str, list[str]]]:
    """One listed backend per pool, as a deployment's backend sources."""
    return {pool: {"backends": [url]} for pool, url in backend.items()}


def test_deployed_profile_points_pools_at_the_deployment_and_stays_valid() -> None:
    profile = cfg(small())
    plans = plan_pools(profile, "gpu")
    sources = {
        "chat": {"backends": ["http://c-0:8000", "http://c-1:8000"]},
        "bulk": {"backends": ["http://b-0:8000"]},
    }

    data = deployed_profile(profile, plans, sources)
    reparsed = parse_profile(data)

    assert reparsed.pools["chat"].origins == ("http://c-0:8000", "http://c-1:8000")
    assert reparsed.pools["bulk"].origins == ("http://b-0:8000",)
    # Everything but the backends is the source profile's.
    assert reparsed.model_copy(update={"pools": profile.pools}) == profile
    for name in profile.pools:
        assert reparsed.pools[name].vllm == profile.pools[name].vllm
        assert reparsed.pools[name].admission == profile.pools[name].admission


def test_a_literal_upstream_key_moves_to_the_environment() -> None:
    data = small()
    del data["pools"]["chat"]["upstream_api_key_env"]
    data["pools"]["chat"]["upstream_api_key"] = "literal-secret-value"
    profile = cfg(data)
    plans = plan_pools(profile, "gpu")

    deployed = deployed_profile(profile, plans, listed(chat="http://c:1", bulk="http://b:1"))

    assert plans[0].key_env == "LANE_ROUTER_POOL_CHAT_KEY"
    assert "literal-secret-value" not in repr(deployed)
    assert deployed["pools"]["chat"]["upstream_api_key_env"] == "LANE_ROUTER_POOL_CHAT_KEY"


def test_a_deployment_that_breaks_the_profile_is_refused() -> None:
    profile = cfg(small())
    plans = plan_pools(profile, "gpu")

    with pytest.raises(ConfigError, match="also a backend of pool"):
        deployed_profile(profile, plans, listed(chat="http://same:1", bulk="http://same:1"))


def test_notes_name_each_concern_once_for_all_its_pools() -> None:
    data = small()
    del data["pools"]["chat"]["admission"]
    del data["pools"]["bulk"]["admission"]
    del data["pools"]["bulk"]["upstream_api_key_env"]

    notes = pool_notes(plan_pools(cfg(data), "gpu"))

    assert notes[0].startswith("pools chat, bulk: vLLM 0.32.0 has no partial-prefill flags")
    assert "sets no admission.max_prefilling" in notes[0]
    assert notes[1].startswith("pool bulk: no upstream key")
    assert len(notes) == 2


def test_no_admission_note_where_vllm_still_has_the_flags() -> None:
    data = small(chat={"vllm": {"version": "0.26.1", "max_num_partial_prefills": 4}})
    del data["pools"]["chat"]["admission"]

    notes = pool_notes(plan_pools(cfg(data), "gpu"))

    assert not any(n.startswith("pool chat") for n in notes)


def test_a_pool_may_be_deployed_found_by_dns_in_place_of_its_list() -> None:
    profile = cfg(small())
    plans = plan_pools(profile, "gpu")
    sources = {**listed(bulk="http://b:1"), "chat": {"discovery": {"dns": "chat.svc", "port": 8000}}}

    data = deployed_profile(profile, plans, sources)

    assert next(iter(data["pools"]["chat"])) == "discovery"  # where the list stood, for the reader
    assert "backends" not in data["pools"]["chat"]
    chat = parse_profile(data).pools["chat"]
    assert chat.discovery is not None and chat.discovery.dns == "chat.svc" and chat.backends == []


def test_a_pool_with_https_backends_is_deployed_on_plain_http_and_says_so(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    data = small()
    data["pools"]["chat"]["backends"] = ["https://vllm-a.internal:8443"]
    data["pools"]["chat"]["tls"] = {"ca_file": str(ca.ca_file)}
    profile = cfg(data)
    plans = plan_pools(profile, "gpu")

    deployed = deployed_profile(profile, plans, listed(chat="http://c:1", bulk="http://b:1"))

    assert "tls" not in deployed["pools"]["chat"]
    assert str(ca.ca_file) not in repr(deployed)
    [note] = [n for n in pool_notes(plans) if "plain HTTP" in n]
    assert note.startswith("pool chat: the deployment's own vLLM servers are reached in plain HTTP")
