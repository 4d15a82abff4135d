"""Giving the C heap's free memory back to the system.

A TLS connection takes large blocks from the C heap while it lives: the event loop's 256 KiB
read buffer of its TLS protocol, each decrypted read's buffer, OpenSSL's records and handshake
state. glibc's malloc keeps what they free in its arenas — its mmap threshold rises past the
first such block, so the next ones come from the heap, between small blocks that outlive them —
and a process that served a burst of TLS connections keeps their pages resident although none of
them is in use any more. `malloc_trim` returns the free pages of every arena. Where the C library
has none (musl, macOS) nothing is done."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Final


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        own = ctypes.CDLL(None)  # the symbols the process already has: its C library's
        trim = own.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM: Final = _malloc_trim()


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system; False where the C library cannot. Takes
    milliseconds per hundred MB released, without the GIL (ctypes releases it): call it from a
    thread, not the event loop."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
