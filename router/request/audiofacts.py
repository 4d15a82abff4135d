"""Facts of the audio routes (`/v1/audio/transcriptions`, `/v1/audio/translations`), read from
their multipart/form-data body (router.request.multipart). Pure.

The model, the stream flag, `n` and the output bound are form fields; the body's text fields
are checked against the route's allowlist and the key's bounds like a JSON body's. The upload
is forwarded byte for byte: the router only appends the output bound it decided when the client
stated none (`max_completion_tokens`, the field vLLM's speech-to-text requests honour).

vLLM splits a recording longer than 30 s into clips (each but the last at least 29 s long, as
it cuts within the last second of a window) and runs every clip as its own request, with the
request's `prompt` and output bound. So the upload is charged per clip it can hold: its duration
is bounded by its size at `prompt_costs.audio_min_bitrate` (or, with
`prompt_costs.audio_wav_header`, at the bitrate a trusted WAV header states: router.request.wavheader),
and by `prompt_costs.audio_max_duration_s` (vLLM refuses a longer recording); each clip costs
the prompt and `hotwords` (which some models' prompts carry), one audio placeholder
(`prompt_costs.audio`) and — as one more sequence — the output bound."""

from __future__ import annotations

import math
from typing import Any

from router.errors import BadRequest
from router.request.facts import RequestFacts, prefix_chain
from router.request.fields import Endpoint
from router.request.multipart import Form, boundary_of, parse_form, with_field
from router.request.tokens import Media, PromptCounter
from router.request.wavheader import upload_heads, wav_bitrate

_TRUE = frozenset({"true", "1"})
_FALSE = frozenset({"false", "0", ""})
_INTEGERS = ("n", "max_completion_tokens")


def parse_audio_facts(
    endpoint: Endpoint, body: bytes, content_type: bytes | None, counter: PromptCounter
) -> tuple[RequestFacts, Form]:
    form = parse_form(body, boundary_of(content_type))
    if len(form.files) != 1 or form.files[0].name != "file":
        raise BadRequest("the form must carry exactly one upload, named 'file'", code="invalid_file")
    data: dict[str, Any] = dict(form.fields)
    data["file"] = form.files[0].filename
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", code="invalid_model")
    for name in _INTEGERS:
        if name in data:
            data[name] = _positive(name, data[name])
    stream = _flag("stream", data.get("stream"))
    prompt = data.get("prompt")
    text = prompt if isinstance(prompt, str) else ""
    # Some models' prompts (FunASR's) carry `hotwords` beside the `prompt`, in every clip.
    hotwords = data.get("hotwords")
    other = hotwords if isinstance(hotwords, str) else ""
    costs = counter.costs
    bitrate = upload_bitrate(body, form, costs.audio_min_bitrate, costs.audio_wav_header)
    clips = audio_clips(form.files[0].size, bitrate, costs.audio_max_duration_s)
    per_clip = counter.request() + counter.message("user", text, other, Media(audio=1))
    facts = RequestFacts(
        endpoint=endpoint,
        model=model,
        stream=stream,
        max_tokens=data.get("max_completion_tokens"),
        sequences=data.get("n", 1) * clips,
        has_tools=False,
        roles=(),
        prompt_tokens=per_clip * clips,
        prefix_chain=prefix_chain(""),
        user=None,
        include_usage=_flag("stream_include_usage", data.get("stream_include_usage")),
        body=data,
    )
    return facts, form


# The shortest stretch of audio a clip but the last covers (vLLM: 30 s windows, each cut
# within its last second).
CLIP_MIN_SECONDS = 29


def upload_bitrate(body: bytes, form: Form, floor: int, by_header: bool) -> int:
    """The bitrate the upload's duration is bounded at: `floor`, or with `by_header` a WAV
    file's own (read from its header). A WAV file below the floor is refused either way: a
    decoder that reads it by its header finds more seconds than the floor allows."""
    heads = upload_heads(body, form.files)
    rates = [rate for rate in map(wav_bitrate, heads) if rate is not None]
    if any(rate < floor for rate in rates):
        raise BadRequest(
            f"the upload is a WAV file of {min(rates)} bit/s; this router accepts audio of at "
            f"least {floor} bit/s",
            code="audio_bitrate_too_low",
        )
    # With one part naming a filename, it is the upload; with several, the floor holds for all.
    return rates[0] if by_header and len(heads) == 1 and rates else floor


def audio_clips(size: int, min_bitrate: int, max_duration_s: int) -> int:
    """How many clips an upload of `size` bytes can split into, at most: its duration is at
    most its bits over the lowest bitrate accepted, and at most the longest vLLM decodes."""
    longest_s = min(size * 8 / min_bitrate, max_duration_s)
    return max(1, math.ceil(longest_s / CLIP_MIN_SECONDS))


def audio_upstream_body(body: bytes, form: Form, facts: RequestFacts, bound: int | None) -> bytes:
    """The body as sent, with the router's output bound appended when the client stated none."""
    if bound is None or facts.max_tokens is not None:
        return body
    return with_field(body, form.boundary, "max_completion_tokens", str(bound))


def _positive(name: str, value: Any) -> int:
    # ASCII digits only: str.isdigit also takes superscripts and other scripts' digits.
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9 and int(value) >= 1:
        return int(value)
    raise BadRequest(f"'{name}' must be a positive integer", code=f"invalid_{name}")


def _flag(name: str, value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, str) and value.lower() in _TRUE:
        return True
    if isinstance(value, str) and value.lower() in _FALSE:
        return False
    raise BadRequest(f"'{name}' must be true or false", code=f"invalid_{name}")
