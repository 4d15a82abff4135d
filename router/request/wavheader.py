"""The bitrate a WAV upload decodes at, read from its header, where the file is one a decoder
that reads WAV files by their header (libsndfile) reads as that header says. Pure.

An audio upload's duration bounds what vLLM does with it (router.request.audiofacts). A WAV file of
whole samples (PCM, IEEE float, A-law, µ-law) says its sample rate, channels and sample width
in its `fmt ` chunk, and such a decoder reads no more samples than its bytes hold at that width:
so the header bounds the duration from the upload's size. Anything else is not trusted (None:
the caller charges the upload like any other):

* coded formats (ADPCM, GSM, MP3, AAC… in a WAV file): their frames carry their own rate and
  size, which decoders follow whatever the header states;
* a layout decoders may walk differently: an odd-sized chunk (padding rules differ), a second
  `fmt ` chunk, a `data` chunk not within the first HEAD_BYTES.

FFmpeg picks its reader by the content, not the header (router.config: `audio_wav_header`).
The header is read only from the start of the upload, within HEAD_BYTES, chunk by chunk."""

from __future__ import annotations

from typing import Final, Literal

from router.errors import BadRequest
from router.request.multipart import FilePart

HEAD_BYTES: Final = 65536
_WHOLE: Final = frozenset({1, 3})  # PCM, IEEE float: at the width the header states
_BYTE_CODED: Final = frozenset({6, 7})  # A-law, µ-law: one byte a sample whatever it states
_EXTENSIBLE: Final = 0xFFFE
# The rest of WAVE_FORMAT_EXTENSIBLE's sub-format GUID after its format tag, when the tag is
# one of the classic ones (little-endian).
_GUID_TAIL: Final = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
Order = Literal["little", "big"]


def _invalid(why: str) -> BadRequest:
    return BadRequest(f"the WAV upload's header {why}", code="invalid_file")


def upload_heads(body: bytes, files: tuple[FilePart, ...]) -> list[bytes]:
    """The first HEAD_BYTES of every file part of a form read by router.request.multipart: the upload is
    among them."""
    return [body[part.start : part.start + min(part.size, HEAD_BYTES)] for part in files]


def wav_bitrate(data: bytes) -> int | None:
    """The bits a second of this WAV file decodes at, or None if it is not a WAV file or not one
    read as its header says."""
    kind = data[:4]
    if kind not in (b"RIFF", b"RF64", b"RIFX") or data[8:12] != b"WAVE":
        return None
    order: Order = "big" if kind == b"RIFX" else "little"
    fmt: bytes | None = None
    at = 12
    while at + 8 <= len(data):
        name = data[at : at + 4]
        size = int.from_bytes(data[at + 4 : at + 8], order)
        if name == b"data":
            if fmt is None:
                return None
            return _fmt_bitrate(fmt, order)
        if size & 1 or (name == b"fmt " and fmt is not None):
            return None
        if name == b"fmt ":
            fmt = data[at + 8 : at + 8 + size]
            _fmt_bitrate(fmt, order)  # a malformed format chunk is refused wherever data is
        at += 8 + size
    if fmt is None:
        raise _invalid(f"has no format chunk within its first {HEAD_BYTES} bytes")
    return None


def _fmt_bitrate(fmt: bytes, order: Order) -> int | None:
    if len(fmt) < 16:
        raise _invalid("has a format chunk shorter than 16 bytes")
    tag = int.from_bytes(fmt[0:2], order)
    channels = int.from_bytes(fmt[2:4], order)
    rate = int.from_bytes(fmt[4:8], order)
    bits = int.from_bytes(fmt[14:16], order)
    if channels == 0 or rate == 0:
        raise _invalid("has no channels or no sample rate")
    if tag == _EXTENSIBLE:
        if order != "little" or len(fmt) < 40 or fmt[26:40] != _GUID_TAIL:
            return None
        tag = int.from_bytes(fmt[24:26], order)
    if tag in _BYTE_CODED:
        return rate * channels * 8
    if tag in _WHOLE:
        return rate * channels * max(8, (bits + 7) // 8 * 8)
    return None
