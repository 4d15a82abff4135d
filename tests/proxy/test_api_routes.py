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
async def _metered_stack(tpm: int, max_body_bytes: int = 64 * 1024, **top: Any) -> AsyncIterator[Stack]:
    """The API stack with one more key, limited to `tpm` tokens a minute."""
    metered = {"name": "metered", "sha256": hash_key(METERED), "routes": ALL_ROUTES, "tpm": tpm}
    keys = [*profile([])["keys"], metered]
    async with api_stack(keys=keys, max_body_bytes=max_body_bytes, **top) as s:
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


def _riff(fmt: bytes, data: bytes, *, before: bytes = b"") -> bytes:
    """A WAV file of the given format chunk body and data, with other chunks before the first."""
    body = b"WAVE" + before + b"fmt " + len(fmt).to_bytes(4, "little") + fmt
    body += b"data" + len(data).to_bytes(4, "little") + data
    return b"RIFF" + len(body).to_bytes(4, "little") + body


def _fmt(tag: int, channels: int, rate: int, bits: int, extra: bytes = b"") -> bytes:
    align = max(1, channels * bits // 8)
    head = tag.to_bytes(2, "little") + channels.to_bytes(2, "little") + rate.to_bytes(4, "little")
    sizes = (rate * align).to_bytes(4, "little") + align.to_bytes(2, "little")
    return head + sizes + bits.to_bytes(2, "little") + extra


_PCM_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
# IEC 61937 preamble of an AC-3 burst: FFmpeg reads such "PCM" as the compressed audio it carries.
_SPDIF_BURST = b"\x72\xf8\x1f\x4e\x01\x00\x00\x10"


def _extensible(tag: int, tail: bytes = _PCM_GUID_TAIL) -> bytes:
    # cbSize 22: valid bits, channel mask, then the sub-format GUID (its tag first).
    return _fmt(0xFFFE, 2, 48_000, 16, b"\x16\x00\x10\x00\x03\x00\x00\x00" + tag.to_bytes(2, "little") + tail)


def test_a_wav_header_is_trusted_only_where_a_header_reader_reads_it_so() -> None:
    silence = b"\x00" * 4000
    assert wav_bitrate(_riff(_fmt(1, 2, 48_000, 16), silence)) == 1_536_000
    assert wav_bitrate(_riff(_extensible(1), silence)) == 1_536_000
    # A-law and µ-law are one byte a sample, whatever width the header states.
    assert wav_bitrate(_riff(_fmt(6, 1, 8_000, 16), silence)) == 64_000
    untrusted = [
        _riff(_fmt(0x55, 2, 48_000, 0), silence),  # MP3 frames: decoded at their own rate
        _riff(_fmt(0x11, 1, 8_000, 4), silence),  # IMA ADPCM: coded
        _riff(_extensible(0x55), silence),
        _riff(_extensible(1, b"\x00" * 14), silence),  # not the PCM sub-format
        _riff(_fmt(1, 2, 48_000, 16), silence, before=b"JUNK\x01\x00\x00\x00\x00\x00"),  # odd size
        _riff(_fmt(1, 2, 48_000, 16), silence, before=b"fmt \x10\x00\x00\x00" + _fmt(1, 1, 8_000, 8)),
    ]
    assert [wav_bitrate(data) for data in untrusted] == [None] * len(untrusted)


_PCM_16K = _wav(16_000, 2, 20)  # 20 s of 16 kHz, 16-bit audio (640 kB)


@pytest.mark.parametrize(
    ("upload", "by_header"),
    [
        (_PCM_16K, False),
        (_riff(_fmt(1, 2, 48_000, 16), _SPDIF_BURST + b"\x00" * 600_000), False),
        (_riff(_fmt(0x55, 8, 192_000, 0), b"\xff\xf3" * 300_000), True),
    ],
    ids=["pcm-read-by-ffmpeg", "iec61937-in-pcm", "mp3-in-wav-read-by-header"],
)
async def test_a_wav_header_lowers_the_charge_only_where_its_decoder_reads_it_so(
    upload: bytes, by_header: bool
) -> None:
    # At the floor bitrate 600 kB hold 600 s: 21 clips; by these headers' rates, one or two.
    # FFmpeg, vLLM's first decoder unless told otherwise, reads by the content (the same PCM can
    # be IEC 61937 bursts, MPEG-TS…), and no decoder reads MP3 frames at a WAV header's rate.
    async with (
        _metered_stack(
            tpm=2_000_000,
            max_body_bytes=4 * 1024 * 1024,
            prompt_costs={"audio_wav_header": by_header},
        ) as stack,
        client(stack.url) as http,
    ):
        files = {"file": ("clip.wav", upload, "audio/wav")}
        data = {"model": MODEL, "max_completion_tokens": "100"}
        resp = await http.post("/v1/audio/transcriptions", files=files, data=data)
    assert resp.status_code == 200, resp.text
    assert int(resp.headers["x-lane-router-prompt-tokens"]) >= 21 * 1500


async def test_hotwords_count_in_every_clip_as_the_prompt_does() -> None:
    # FunASR's prompt carries the hotwords beside the audio, in every clip vLLM makes.
    async with (
        _metered_stack(tpm=2_000_000, max_body_bytes=4 * 1024 * 1024) as stack,
        client(stack.url) as http,
    ):
        files = {"file": ("clip.wav", _upload(60_000), "audio/wav")}
        base = {"model": MODEL, "max_completion_tokens": "100"}
        plain = await http.post("/v1/audio/transcriptions", files=files, data=base)
        hot = await http.post(
            "/v1/audio/transcriptions", files=files, data={**base, "hotwords": "x" * 30_000}
        )
    assert plain.status_code == 200 and hot.status_code == 200, hot.text
    more = int(hot.headers["x-lane-router-prompt-tokens"]) - int(plain.headers["x-lane-router-prompt-tokens"])
    # 60 kB at the floor bitrate: 3 clips.
    assert more >= 3 * 30_000


async def test_a_wav_upload_is_charged_by_its_header_and_refused_below_the_floor() -> None:
    # Where vLLM decodes with libsndfile alone, which reads a WAV file by its header.
    async with (
        _metered_stack(
            tpm=200_000, max_body_bytes=4 * 1024 * 1024, prompt_costs={"audio_wav_header": True}
        ) as stack,
        client(stack.url) as http,
    ):
        data = {"model": MODEL, "max_completion_tokens": "100"}
        # 20 s of 16 kHz, 16-bit audio (640 kB): one clip, where the floor would allow 30.
        files = {"file": ("clip.wav", _PCM_16K, "audio/wav")}
        one = await http.post("/v1/audio/transcriptions", files=files, data=data)
        assert one.status_code == 200, one.text
        assert int(one.headers["x-lane-router-prompt-tokens"]) < 2 * 1500
        # 8-bit audio at 100 Hz takes 800 bit/s: 60 kB of it hold 600 s.
        files = {"file": ("clip.wav", _wav(100, 1, 600), "audio/wav")}
        low = await http.post("/v1/audio/transcriptions", files=files, data=data)
    assert low.status_code == 400, low.text
    assert low.json()["error"]["code"] == "audio_bitrate_too_low"
    assert stack.forwarded() == 1
