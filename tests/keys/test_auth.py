"""API keys: hashing, authentication among several keys, and per-key scopes."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from router.config import KeyConfig, RequestClass
from router.errors import Forbidden, Unauthorized
from router.keys.auth import ApiKey, KeyRing, build_keys, hash_key, new_key


def key_config(name: str, secret: str | None = None, **fields: Any) -> KeyConfig:
    if secret is not None:
        fields["sha256"] = hash_key(secret)
    return KeyConfig(name=name, **fields)


def ring(*configs: KeyConfig, environ: dict[str, str] | None = None) -> KeyRing:
    return KeyRing(build_keys(configs, environ or {}))


def unauthorized_code(keys: KeyRing, header: bytes | None) -> str:
    with pytest.raises(Unauthorized) as info:
        keys.authenticate(header)
    assert info.value.status == 401
    return info.value.code


@pytest.mark.parametrize("secret", ["lr-abc", "", "ключ-🔑", "x" * 1000])
def test_hash_key_is_hex_sha256_of_utf8(secret: str) -> None:
    assert hash_key(secret) == hashlib.sha256(secret.encode("utf-8")).hexdigest()


def test_new_keys_are_fresh_and_long() -> None:
    keys = {new_key() for _ in range(50)}

    assert len(keys) == 50
    assert all(k.startswith("lr-") and len(k) >= 40 for k in keys)


# --- authentication -----------------------------------------------------------------------------


def test_the_matching_key_is_found_among_several() -> None:
    keys = ring(key_config("a", "secret-a"), key_config("b", "secret-b"), key_config("c", "secret-c"))

    assert len(keys) == 3
    for name in "abc":
        assert keys.authenticate(f"Bearer secret-{name}".encode()).name == name


@pytest.mark.parametrize("header", [b"bearer secret-a", b"BEARER secret-a", b"  Bearer   secret-a  "])
def test_scheme_is_case_insensitive_and_whitespace_is_tolerated(header: bytes) -> None:
    assert ring(key_config("a", "secret-a")).authenticate(header).name == "a"


def test_a_key_differing_in_one_character_is_refused() -> None:
    keys = ring(key_config("a", "secret-a"))

    with pytest.raises(Unauthorized):
        keys.authenticate(b"Bearer secret-b")
    with pytest.raises(Unauthorized):
        keys.authenticate(b"Bearer secret-aa")


def test_a_matched_header_is_remembered_and_nothing_near_it_passes() -> None:
    keys = ring(key_config("a", "secret-a"), key_config("b", "secret-b"))

    assert keys.authenticate(b"Bearer secret-a").name == "a"
    assert keys.authenticate(b"Bearer secret-a").name == "a"  # now from what the ring remembers
    for near in (b"Bearer secret-", b"Bearer secret-aa", b"Bearer secret-A", b"Bearer secret-b2"):
        with pytest.raises(Unauthorized):
            keys.authenticate(near)
    assert keys.authenticate(b"Bearer secret-b").name == "b"
    assert keys.remembered == 2


def test_spellings_of_a_valid_header_are_not_remembered_one_by_one() -> None:
    keys = ring(key_config("a", "secret-a"))

    for spaces in range(1, 200):  # every one valid, none canonical: a holder cannot grow the ring
        assert keys.authenticate(b"Bearer" + b" " * (spaces + 1) + b"secret-a").name == "a"
    assert keys.remembered == 0
    keys.authenticate(b"Bearer secret-a")
    assert keys.remembered == 1


def test_a_new_ring_forgets_what_the_old_one_remembered() -> None:
    old = ring(key_config("a", "secret-a"))
    old.authenticate(b"Bearer secret-a")

    with pytest.raises(Unauthorized):
        ring(key_config("b", "secret-b")).authenticate(b"Bearer secret-a")


def test_no_keys_configured_refuses_everyone() -> None:
    with pytest.raises(Unauthorized):
        KeyRing(()).authenticate(b"Bearer anything")


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "missing_api_key"),
        (b"", "missing_api_key"),
        (b"Bearer nope", "invalid_api_key"),
    ],
)
def test_refusals_carry_their_code(header: bytes | None, code: str) -> None:
    assert unauthorized_code(ring(key_config("a", "secret-a")), header) == code


def test_missing_malformed_and_unknown_keys_are_told_apart() -> None:
    # `auth_failures_total{reason}` is labelled with the code, so each cause needs its own.
    keys = ring(key_config("a", "secret-a"))
    missing = unauthorized_code(keys, None)
    wrong_scheme = unauthorized_code(keys, b"Basic c2VjcmV0LWE=")
    empty_token = unauthorized_code(keys, b"Bearer ")
    unknown = unauthorized_code(keys, b"Bearer secret-z")

    assert len({missing, wrong_scheme, unknown}) == 3
    assert empty_token not in (missing, unknown)


def test_trailing_whitespace_of_the_token_is_not_part_of_the_key() -> None:
    keys = ring(key_config("a", "secret-a"))

    assert keys.authenticate(b"Bearer secret-a \t").name == "a"


# --- building keys from configuration -----------------------------------------------------------


def test_sha256_prefix_is_accepted_in_config() -> None:
    cfg = KeyConfig(name="a", sha256="sha256:" + hash_key("secret-a"))

    assert ring(cfg).authenticate(b"Bearer secret-a").name == "a"


def test_sha256_env_is_read_from_the_given_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEY_A_SHA256", hash_key("from-process-env"))
    cfg = KeyConfig(name="a", sha256_env="KEY_A_SHA256")
    keys = ring(cfg, environ={"KEY_A_SHA256": "sha256:" + hash_key("from-mapping").upper()})

    assert keys.authenticate(b"Bearer from-mapping").name == "a"
    with pytest.raises(Unauthorized):
        keys.authenticate(b"Bearer from-process-env")


def test_sha256_env_falls_back_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEY_A_SHA256", hash_key("from-process-env"))
    keys = KeyRing(build_keys((KeyConfig(name="a", sha256_env="KEY_A_SHA256"),)))

    assert keys.authenticate(b"Bearer from-process-env").name == "a"


@pytest.mark.parametrize("value", [None, "", "abc", "sha256:" + "0" * 63])
def test_sha256_env_without_a_valid_digest_is_an_error(value: str | None) -> None:
    environ = {} if value is None else {"KEY_A_SHA256": value}
    with pytest.raises(ValueError, match="'a'"):
        build_keys((KeyConfig(name="a", sha256_env="KEY_A_SHA256"),), environ)


def test_key_fields_are_carried_over() -> None:
    (key,) = build_keys(
        (
            key_config(
                "a",
                "s",
                classes=["chat", "rag"],
                models=["m1"],
                pin_class="rag",
                may_set_class=True,
                rpm=10,
                tpm=1000,
                max_concurrency=2,
            ),
        ),
        {},
    )

    assert key.classes == frozenset({RequestClass.CHAT, RequestClass.RAG})
    assert key.models == frozenset({"m1"})
    assert key.pin_class is RequestClass.RAG
    assert key.may_set_class
    assert (key.rpm, key.tpm, key.max_concurrency) == (10, 1000, 2)
    assert key.digest == hashlib.sha256(b"s").digest()


# --- scopes -------------------------------------------------------------------------------------


def one_key(**fields: Any) -> ApiKey:
    (key,) = build_keys((key_config("k", "s", **fields),), {})
    return key


def forbidden_code(action: Any, *args: Any) -> str:
    with pytest.raises(Forbidden) as info:
        action(*args)
    assert info.value.status == 403
    return info.value.code


def test_admin_scope() -> None:
    one_key(admin=True).allow_admin()

    assert forbidden_code(one_key().allow_admin) == "admin_scope_required"
    assert forbidden_code(one_key(metrics=True).allow_admin) == "admin_scope_required"


def test_metrics_scope_is_granted_by_metrics_or_admin() -> None:
    one_key(metrics=True).allow_metrics()
    one_key(admin=True).allow_metrics()

    assert forbidden_code(one_key().allow_metrics) == "metrics_scope_required"


def test_classes_omitted_allow_every_class() -> None:
    key = one_key()
    for cls in RequestClass:
        key.allow_class(cls)


def test_listed_classes_only() -> None:
    key = one_key(classes=["chat", "agent"])
    key.allow_class(RequestClass.CHAT)
    key.allow_class(RequestClass.AGENT)

    for cls in set(RequestClass) - {RequestClass.CHAT, RequestClass.AGENT}:
        assert forbidden_code(key.allow_class, cls) == "class_not_allowed"


def test_empty_class_list_allows_nothing() -> None:
    key = one_key(classes=[])

    assert forbidden_code(key.allow_class, RequestClass.CHAT) == "class_not_allowed"


def test_models_omitted_allow_every_model_and_listed_models_only_otherwise() -> None:
    one_key().allow_model("anything")
    key = one_key(models=["org/chat-model"])
    key.allow_model("org/chat-model")

    assert forbidden_code(key.allow_model, "org/batch-model") == "model_not_allowed"
