"""The lowest bitrate a WAV upload can decode at, read from its header. Pure.

An audio upload's duration bounds what vLLM does with it (router.request.audiofacts). A WAV file says
its sample rate and sample width in its `fmt ` chunk, and a decoder reads no more samples than
its bytes hold at that width: so the header bounds the duration from the upload's size. The
header is read only from the start of the upload, within HEAD_BYTES, chunk by chunk."""

from __future__ import annotations

from typing import Final, Literal

from router.errors import BadRequest
from router.request.multipart import FilePart

HEAD_BYTES: Final = 65536
# Sample formats stored whole: PCM, IEEE float, A-law, µ-law.
_WHOLE: Final = frozenset({1, 3, 6, 7})
_EXTENSIBLE: Final = 0xFFFE
Order = Literal["little", "big"]


def _invalid(why: str) -> BadRequest:
    return BadRequest(f"the WAV upload's header {why}", code="invalid_file")


def upload_heads(body: bytes, files: tuple[FilePart, ...]) -> list[bytes]:
    """The first HEAD_BYTES of every file part of a form read by router.request.multipart: the upload is
    among them."""
    return [body[part.start : part.start + min(part.size, HEAD_BYTES)] for part in files]


def wav_bitrate(data: bytes) -> int | None:
    """The fewest bits a second of this WAV file takes, or None if it is not a WAV file: a
    whole-sample format at its sample width, any other (ADPCM, GSM, …) at one bit a sample,
    which none goes below."""
    kind = data[:4]
    if kind not in (b"RIFF", b"RF64", b"RIFX") or data[8:12] != b"WAVE":
        return None
    order: Order = "big" if kind == b"RIFX" else "little"
    at = 12
    while at + 8 <= len(data):
        size = int.from_bytes(data[at + 4 : at + 8], order)
        if data[at : at + 4] == b"fmt ":
            return _fmt_bitrate(data[at + 8 : at + 8 + size], order)
        at += 8 + size + (size & 1)
    raise _invalid(f"has no format chunk within its first {HEAD_BYTES} bytes")


def _fmt_bitrate(fmt: bytes, order: Order) -> int:
    if len(fmt) < 16:
        raise _invalid("has a format chunk shorter than 16 bytes")
    tag = int.from_bytes(fmt[0:2], order)
    channels = int.from_bytes(fmt[2:4], order)
    rate = int.from_bytes(fmt[4:8], order)
    bits = int.from_bytes(fmt[14:16], order)
    if tag == _EXTENSIBLE and len(fmt) >= 26:
        tag = int.from_bytes(fmt[24:26], order)
    if channels == 0 or rate == 0:
        raise _invalid("has no channels or no sample rate")
    width = max(8, (bits + 7) // 8 * 8) if tag in _WHOLE else 1
    return rate * channels * width
