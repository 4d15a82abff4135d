"""Rerank, score, tokenize, detokenize and the audio routes through the router, against fake
backends that answer them as vLLM does: every alias goes to vLLM's canonical path, the body
policy and key scopes hold, and multipart bodies are judged before anything is forwarded."""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import wave
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from router.errors import BadRequest
from router.keys.auth import hash_key
from router.request.audiofacts import audio_clips
from router.request.wavheader import HEAD_BYTES, wav_bitrate
from tests.conftest import Stack
from tests.proxy.apistack import ALL_ROUTES, api_stack, client, sdk
from tests.support.fakebackend import Seen
from tests.support.profiles import profile

pytestmark = pytest.mark.timeout(60)
MODEL = "fake-model"
_FORM = "multipart/form-data; boundary=XyZ"
AUDIO = b"RIFF" + bytes(range(256)) * 64 + b"\r\n--not-a-boundary\r\n" + b"\x00" * 100


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with api_stack(max_body_bytes=64 * 1024) as s:
        yield s


def _last(stack: Stack) -> Seen:
    return max(stack.seen(), key=lambda s: s.started)


async def test_rerank_and_its_aliases_reach_vllms_rerank(stack: Stack) -> None:
    body = {"model": MODEL, "query": "red fox", "documents": ["a blue whale", "the red fox"]}
    async with client(stack.url) as http:
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            resp = await http.post(path, json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json()["results"][0]["document"]["text"] == "the red fox"
            assert _last(stack).path == "/rerank"


async def test_score_and_its_alias_reach_vllms_score(stack: Stack) -> None:
    body = {"model": MODEL, "queries": "red fox", "documents": ["red fox", "blue whale"]}
    async with client(stack.url) as http:
        for path in ("/score", "/v1/score"):
            resp = await http.post(path, json=body)
            assert resp.status_code == 200, resp.text
            assert [d["score"] for d in resp.json()["data"]] == [1.0, 0.0]
            assert _last(stack).path == "/score"
        resp = await http.post("/score", json={"model": MODEL, "queries": "only one side"})
        assert resp.status_code == 400


async def test_tokenize_and_detokenize_round_trip(stack: Stack) -> None:
    async with client(stack.url) as http:
        tokens = (await http.post("/tokenize", json={"model": MODEL, "prompt": "hello"})).json()["tokens"]
        text = (await http.post("/detokenize", json={"model": MODEL, "tokens": tokens})).json()["prompt"]
    assert text == "hello"


async def test_engine_fields_stay_the_routers(stack: Stack) -> None:
    async with client(stack.url) as http:
        for path, body in [
            ("/rerank", {"query": "q", "documents": ["d"], "priority": -9}),
            ("/score", {"queries": "q", "documents": ["d"], "cache_salt": "x"}),
            ("/tokenize", {"prompt": "p", "chat_template": "{{ secrets }}"}),
        ]:
            resp = await http.post(path, json={"model": MODEL, **body})
            assert (resp.status_code, resp.json()["error"]["code"]) == (403, "field_not_allowed")
    assert stack.forwarded() == 0


async def test_keys_reach_only_their_route_families(stack: Stack) -> None:
    async with client(stack.url, "reader") as reader:
        resp = await reader.post("/tokenize", json={"model": MODEL, "prompt": "p"})
        assert (resp.status_code, resp.json()["error"]["code"]) == (403, "route_scope_required")
        resp = await reader.post("/v1/chat/completions", json={"model": MODEL, "messages": []})
        assert resp.status_code == 403
    async with client(stack.url, "user") as user:  # no routes: the routes every key had before
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert (await user.post("/v1/chat/completions", json=chat)).status_code == 200
        assert (await user.post("/rerank", json={"model": MODEL})).status_code == 403
    assert stack.forwarded() == 1


async def test_a_transcription_is_forwarded_with_its_file_unchanged(stack: Stack) -> None:
    async with sdk(stack.url) as api:
        result = await api.audio.transcriptions.create(
            model=MODEL, file=("clip.wav", io.BytesIO(AUDIO), "audio/wav"), language="en"
        )
    assert result.text.startswith(f"heard {len(AUDIO)} bytes")
    (upload,) = [u for b in stack.backends for u in b.api.uploads]
    assert upload.file_sha256 == hashlib.sha256(AUDIO).hexdigest()
    assert upload.fields["model"] == MODEL and upload.fields["language"] == "en"
    # No bound stated: the router's (the pool's context) is appended as vLLM's field.
    assert upload.fields["max_completion_tokens"] == "2048"
    assert _last(stack).path == "/v1/audio/transcriptions"


async def test_a_translation_keeps_the_clients_bound(stack: Stack) -> None:
    async with client(stack.url) as http:
        files = {"file": ("clip.wav", AUDIO, "audio/wav")}
        data = {"model": MODEL, "max_completion_tokens": "9"}
        resp = await http.post("/v1/audio/translations", files=files, data=data)
    assert resp.status_code == 200, resp.text
    (upload,) = [u for b in stack.backends for u in b.api.uploads]
    assert upload.fields["max_completion_tokens"] == "9"
    assert upload.file_sha256 == hashlib.sha256(AUDIO).hexdigest()


async def test_multipart_bodies_are_judged_before_anything_is_forwarded(stack: Stack) -> None:
    path = "/v1/audio/transcriptions"
    form = b'--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nfake-model\r\n'
    upload = b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n' + AUDIO
    good = form + upload + b"\r\n--XyZ--\r\n"
    cases = [
        (b"multipart/form-data", good, 400, "invalid_multipart"),
        (b"multipart/form-data; boundary=Other", good, 400, "invalid_multipart"),
        (b"multipart/form-data; boundary=XyZ", good[:-9], 400, "invalid_multipart"),
        (b"multipart/form-data; boundary=XyZ", form + b"--XyZ--\r\n", 400, "invalid_file"),
        (
            b"multipart/form-data; boundary=XyZ",
            form + form + upload + b"\r\n--XyZ--\r\n",
            400,
            "invalid_multipart",
        ),
        (b"application/json", orjson.dumps({"model": MODEL}), 400, "invalid_content_type"),
    ]
    async with client(stack.url) as http:
        resp = await http.post(path, content=good + b"\x00" * 70_000, headers={"content-type": _FORM})
        assert (resp.status_code, resp.json()["error"]["code"]) == (413, "payload_too_large")
    async with client(stack.url) as http:
        for content_type, body, status, code in cases:
            resp = await http.post(path, content=body, headers={"content-type": content_type.decode()})
            assert (resp.status_code, resp.json()["error"]["code"]) == (status, code), (content_type, code)
        resp = await http.post(path, content=good, headers={"content-type": _FORM})
        assert resp.status_code == 200, resp.text
    assert stack.forwarded() == 1


async def test_audio_fields_follow_the_body_policy(stack: Stack) -> None:
    files = {"file": ("clip.wav", b"RIFF", "audio/wav")}
    async with client(stack.url) as http:
        for data, status, code in [
            ({"model": MODEL, "vllm_xargs": "{}"}, 403, "field_not_allowed"),
            ({"model": MODEL, "n": "99"}, 400, "field_limit_exceeded"),
            ({"model": MODEL, "stream": "maybe"}, 400, "invalid_stream"),
            ({"model": MODEL, "surprise": "1"}, 400, "unsupported_field"),
        ]:
            resp = await http.post("/v1/audio/transcriptions", files=files, data=data)
            assert (resp.status_code, resp.json()["error"]["code"]) == (status, code), data
    assert stack.forwarded() == 0


async def test_no_key_no_route(stack: Stack) -> None:
    async with client(stack.url) as http:
        for path in ("/tokenize", "/rerank", "/v1/audio/transcriptions"):
            resp = await http.post(path, json={"model": MODEL}, headers={"authorization": ""})
            assert (resp.status_code, resp.json()["error"]["code"]) == (401, "missing_api_key"), path
    assert stack.forwarded() == 0


METERED = "metered-key-0123456789"


@contextlib.asynccontextmanager
async def _metered_stack(tpm: int, max_body_bytes: int = 64 * 1024) -> AsyncIterator[Stack]:
    """The API stack with one more key, limited to `tpm` tokens a minute."""
    metered = {"name": "metered", "sha256": hash_key(METERED), "routes": ALL_ROUTES, "tpm": tpm}
    keys = [*profile([])["keys"], metered]
    async with api_stack(keys=keys, max_body_bytes=max_body_bytes) as s:
        yield s


def _metered(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {METERED}"}, timeout=10)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/rerank", {"query": "q" * 3000, "documents": [f"doc {i}" for i in range(200)]}),
        ("/score", {"text_1": "q" * 3000, "text_2": [f"doc {i}" for i in range(200)]}),
        ("/score", {"queries": ["q" * 3000] * 10, "documents": ["d" * 3000] * 10}),
    ],
    ids=["rerank", "score-1:N", "score-N:N"],
)
async def test_pooling_pairs_are_charged_whole_against_the_keys_tpm(path: str, body: dict[str, Any]) -> None:
    async with _metered_stack(tpm=20_000) as stack, _metered(stack.url) as http:
        small = await http.post(
            path,
            json={"model": MODEL, "query": "q", "documents": ["d"]}
            if path == "/rerank"
            else {"model": MODEL, "text_1": "q", "text_2": ["d"]},
        )
        assert small.status_code == 200, small.text
        resp = await http.post(path, json={"model": MODEL, **body})
    assert resp.status_code == 429, resp.text
    assert resp.json()["error"]["code"] == "request_too_large"
    assert stack.forwarded() == 1


def _upload(size: int) -> bytes:
    # A WAV header then silence: the size, not the content, bounds what the router charges.
    return b"RIFF" + b"\x00" * (size - 4)


async def test_an_audio_upload_is_charged_for_every_clip_its_size_can_hold() -> None:
    async with _metered_stack(tpm=20_000, max_body_bytes=4 * 1024 * 1024) as stack:
        tokens = []
        async with client(stack.url) as http:
            for size in (60_000, 600_000):
                files = {"file": ("clip.wav", _upload(size), "audio/wav")}
                data = {"model": MODEL, "max_completion_tokens": "100"}
                resp = await http.post("/v1/audio/transcriptions", files=files, data=data)
                assert resp.status_code == 200, resp.text
                tokens.append(int(resp.headers["x-lane-router-prompt-tokens"]))
        # 60 kB at 6 kbit/s hold 80 s: 3 clips of at least 29 s, each with its audio placeholder;
        # 600 kB hold 800 s, of which vLLM decodes 600: 21 clips.
        assert tokens[0] >= 3 * 1500 and tokens[1] >= 21 * 1500
        async with _metered(stack.url) as http:
            files = {"file": ("clip.wav", _upload(3_900_000), "audio/wav")}
            refused = await http.post("/v1/audio/transcriptions", files=files, data={"model": MODEL})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "request_too_large"
    assert stack.forwarded() == 2


def test_the_clips_of_an_upload_bound_its_duration_from_above() -> None:
    assert audio_clips(1, 6000, 600) == 1
    # 29 s at 6 kbit/s: one clip; a byte more can be a second.
    assert audio_clips(29 * 750, 6000, 600) == 1
    assert audio_clips(29 * 750 + 1, 6000, 600) == 2
    assert audio_clips(300_000, 6000, 3600) == math.ceil(300_000 * 8 / 6000 / 29)
    # vLLM decodes no more than 600 s: 21 clips of at least 29 s, whatever the size.
    assert audio_clips(3_900_000, 6000, 600) == 21


def _wav(rate: int, width: int, seconds: float, *, junk: int = 0) -> bytes:
    """A PCM WAV file as the standard library writes it, optionally after a JUNK chunk."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(b"\x00" * int(rate * width * seconds))
    data = out.getvalue()
    if junk:
        data = data[:12] + b"JUNK" + junk.to_bytes(4, "little") + b"\x00" * junk + data[12:]
    return data


def test_a_wav_header_bounds_the_duration_by_its_own_bitrate() -> None:
    assert wav_bitrate(_wav(16_000, 2, 0.1)) == 256_000
    assert wav_bitrate(_wav(8_000, 1, 0.1, junk=1000)) == 64_000
    assert wav_bitrate(b"RIFF" + bytes(range(256))) is None
    with pytest.raises(BadRequest):
        wav_bitrate(_wav(16_000, 2, 0.1, junk=HEAD_BYTES)[:HEAD_BYTES])


async def test_a_wav_upload_is_charged_by_its_header_and_refused_below_the_floor() -> None:
    async with (
        _metered_stack(tpm=200_000, max_body_bytes=4 * 1024 * 1024) as stack,
        client(stack.url) as http,
    ):
        data = {"model": MODEL, "max_completion_tokens": "100"}
        # 20 s of 16 kHz, 16-bit audio (640 kB): one clip, where the floor would allow 30.
        files = {"file": ("clip.wav", _wav(16_000, 2, 20), "audio/wav")}
        one = await http.post("/v1/audio/transcriptions", files=files, data=data)
        assert one.status_code == 200, one.text
        assert int(one.headers["x-lane-router-prompt-tokens"]) < 2 * 1500
        # 8-bit audio at 100 Hz takes 800 bit/s: 60 kB of it hold 600 s.
        files = {"file": ("clip.wav", _wav(100, 1, 600), "audio/wav")}
        low = await http.post("/v1/audio/transcriptions", files=files, data=data)
    assert low.status_code == 400, low.text
    assert low.json()["error"]["code"] == "audio_bitrate_too_low"
    assert stack.forwarded() == 1
