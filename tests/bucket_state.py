"""How the scripts write their state, for tests that read or write state by hand.

Free of Django imports: spawned test processes import the test modules that use it.
"""

from __future__ import annotations

import struct

#: Token bucket states of limits whose bucket fills in at most this many µs keep only the
#: low 32 bits of their millisecond (see lua/token_bucket.lua).
COMPACT_WINDOW_US = 2e12


def pack_bucket(used: float, stamp_ms: int, compact: bool = True) -> bytes:
    """A token bucket state: ``used`` tokens as of millisecond ``stamp_ms``."""
    if compact:
        return struct.pack(">dI", used, stamp_ms % 2**32)
    return struct.pack(">dIH", used, stamp_ms % 2**32, stamp_ms >> 32)


def unpack_bucket(raw: bytes) -> tuple[float, int]:
    """``(used, millisecond)`` of a stored token bucket state; only the low 32 bits of the
    millisecond for a compact (12-byte) one."""
    if len(raw) == 12:
        used, low = struct.unpack(">dI", raw)
        return used, low
    used, low, high = struct.unpack(">dIH", raw)
    return used, high << 32 | low


def stored_used(raw: bytes | None) -> float | None:
    """Tokens used as a stored token bucket state says (as of its own timestamp), in either
    form (compact or full); ``None`` for anything else (a missing key, another algorithm's
    state)."""
    if raw is not None and len(raw) in (12, 14):
        return unpack_bucket(raw)[0]
    return None
