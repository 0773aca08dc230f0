"""Memory a burst of traces leaves behind, given back to the operating system.

The C allocator under CPython (glibc's malloc) keeps what a burst freed -- decoded requests, numpy
buffers, the traces' own objects, spread over one heap per thread that allocated them -- for reuse, so a
processor's resident memory stays at its highest point long after the traces expired. glibc's
``malloc_trim(0)`` returns the free pages of every heap. The processor calls it when the bytes its
trace store holds have fallen to half of their high mark since the last call (and that mark was worth it):
after a burst, not on every tick of a steady load (a trim walks the heaps: milliseconds). Where the C library has no ``malloc_trim`` (musl, macOS) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util

TRIM_ABOVE_BYTES = 8 << 20  # a high mark below this is not worth a trim


def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim") if name else None
    except (OSError, AttributeError):
        return None


class Trimmer:
    """Calls ``malloc_trim(0)`` once the watched byte count has fallen to half its high mark (at least
    ``above_bytes``)."""

    def __init__(self, above_bytes: int = TRIM_ABOVE_BYTES) -> None:
        self.above_bytes = above_bytes
        self._trim = _malloc_trim()
        self._high = 0
        self.trims = 0

    def watch(self, held_bytes: int) -> bool:
        """Note what is held now; True when that was a fall worth a trim (and it was made)."""
        self._high = max(self._high, held_bytes)
        if self._high < self.above_bytes or held_bytes > self._high // 2:
            return False
        self._high = held_bytes
        if self._trim is None:
            return False
        self._trim(0)
        self.trims += 1
        return True
