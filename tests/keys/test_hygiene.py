"""Key hygiene (router/keys/hygiene.py): which stored digests anyone could authenticate with."""

from __future__ import annotations

import pytest

from router.config.models import KeyConfig
from router.keys.auth import hash_key, new_key
from router.keys.hygiene import KEY_HASH_PLACEHOLDER, KEY_SOURCES, digest_flaw, is_loopback, key_issues

PUBLISHED = [
    "demo-key",
    "",
    "EMPTY",
    "token-abc123",
    "sk-1234",
    "sk-no-key-required",
    "changeme",
    "password",
    "secret",
    "test",
    "api-key",
    "your-api-key",
]


@pytest.mark.parametrize("text", PUBLISHED)
def test_a_published_or_common_key_is_flagged_by_its_plaintext(text: str) -> None:
    flaw = digest_flaw(hash_key(text))

    assert flaw is not None and flaw.startswith(f"the sha256 of {text!r}, a key anyone can guess")


@pytest.mark.parametrize("typed", ["empty", "DEMO-KEY", "Password", "CHANGEME", "demo-key\n", "EMPTY\n"])
def test_case_and_the_newline_of_echo_do_not_hide_a_known_key(typed: str) -> None:
    assert digest_flaw(hash_key(typed)) is not None


@pytest.mark.parametrize("text", [t for source in KEY_SOURCES for t in source.texts])
def test_every_listed_plaintext_is_flagged(text: str) -> None:
    assert digest_flaw(hash_key(text)) is not None


def test_the_hash_of_the_k8s_secret_placeholder_is_a_placeholder() -> None:
    flaw = digest_flaw(hash_key(KEY_HASH_PLACEHOLDER))

    assert flaw is not None and "a placeholder" in flaw


@pytest.mark.parametrize(
    ("digest", "why"),
    [
        ("0" * 64, "one digit repeated ('0')"),
        ("f" * 64, "one digit repeated ('f')"),
        ("deadbeef" * 8, "the pattern 'deadbeef' repeated"),
        ("0123456789abcdef" * 4, "the pattern '0123456789abcdef' repeated"),
        ("ab" * 32, "the pattern 'ab' repeated"),
        ("1234567890" * 6 + "1234", "the pattern '1234567890' repeated"),
        ("c0ffee" * 10 + "c0ff", "the pattern 'c0ffee' repeated"),
        ("0206154251146261042400606650632210042350054601424033430156441465", "only 7 distinct hex digits"),
        (hash_key("x")[:40] + "0" * 24, "a run of 24 equal digits"),
    ],
)
def test_a_digest_no_random_key_has_is_a_placeholder(digest: str, why: str) -> None:
    assert digest_flaw(digest) == f"a placeholder, not the sha256 of a random key: {why}"


def test_the_sha256_prefix_and_case_are_ignored() -> None:
    assert digest_flaw("sha256:" + hash_key("demo-key").upper()) is not None


def test_random_keys_are_not_flagged() -> None:
    flagged = [key for key in (new_key() for _ in range(5000)) if digest_flaw(hash_key(key)) is not None]

    assert flagged == []


def _key(name: str, **fields: object) -> KeyConfig:
    return KeyConfig.model_validate({"name": name, **fields})


def test_issues_carry_the_keys_dotted_path_and_the_fix() -> None:
    keys = [
        _key("app", sha256=hash_key(new_key())),
        _key("demo", sha256=hash_key("demo-key"), may_set_class=True),
        _key("filler", sha256="deadbeef" * 8),
    ]

    issues = key_issues(keys)

    assert [i.path for i in issues] == ["keys[1].sha256", "keys[2].sha256"]
    assert "key 'demo' is the sha256 of 'demo-key'" in issues[0].message
    assert all("lane-router hash-key --new" in i.message for i in issues)


def test_environment_keys_are_checked_on_the_value_they_resolve_to() -> None:
    keys = [
        _key("web", sha256_env="WEB_SHA256"),
        _key("ops", sha256_env="OPS_SHA256", admin=True),
        _key("unset", sha256_env="UNSET_SHA256"),
        _key("junk", sha256_env="JUNK_SHA256"),
    ]
    environ = {
        "WEB_SHA256": hash_key(new_key()),
        "OPS_SHA256": "sha256:" + hash_key("EMPTY"),
        "JUNK_SHA256": "not a digest",
    }

    [issue] = key_issues(keys, environ)

    assert issue.path == "keys[1].sha256_env"
    assert issue.message.startswith("key 'ops': $OPS_SHA256 holds the sha256 of 'EMPTY'")


def test_without_an_environment_only_literal_keys_are_checked() -> None:
    keys = [_key("ops", sha256_env="OPS_SHA256")]

    assert key_issues(keys) == []
    assert key_issues(keys, {"OPS_SHA256": hash_key("")}) != []


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LocalHost", "::ffff:127.0.0.1"]
)
def test_loopback_addresses(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "", "10.0.0.5", "192.168.1.2", "router.internal", "fe80::1"]
)
def test_addresses_beyond_loopback(host: str) -> None:
    assert not is_loopback(host)
