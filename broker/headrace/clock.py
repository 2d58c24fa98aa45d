"""The data plane's clocks, in integer milliseconds (adapters, not pure).

Pure cores never call these: they take the time as an argument (``now_ms``),
and the adapters around them read it here, so a test can drive a core with a
fake clock. ``monotonic_ms`` is for deadlines, lags and intervals (it never
jumps back); ``wall_ms`` is for timestamps that leave the process (record
timestamps, seal reports, creation times).
"""

from __future__ import annotations

import time


def monotonic_ms() -> int:
    """Milliseconds on the monotonic clock (arbitrary origin; only differences mean anything)."""
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    """Milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000
