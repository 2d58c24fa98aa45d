"""Process-level tuning the `headrace` command applies at start-up (an adapter).

Batches and frames are hundreds of KiB. glibc serves allocations above its
mmap threshold (128 KiB at start) with a fresh ``mmap`` and returns them with
``munmap``, and trims the heap top eagerly; either way every frame lands in
pages the kernel must fault in again. On virtual machines that hand freed
memory back to the host this costs more than the copy itself (measured on
the reference VM: single-broker produce ~3.3M -> ~6.4M records/s). Keeping
large blocks on the heap and a generous top pad avoids it. The library
(``headrace.client``) never calls this: it is the application's choice.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# mallopt parameters from <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

#: blocks below this come from the heap (frames are at most 16 MiB by default)
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
#: keep this much free memory at the heap top instead of giving it back
TOP_PAD_BYTES = 64 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024


def tune_allocator() -> bool:
    """Apply the settings if the C library is glibc; False (and nothing changed) otherwise."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt): leave the defaults
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            (_M_TOP_PAD, TOP_PAD_BYTES),
            (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        )
    )
    if not ok:
        log.debug("mallopt refused a setting; allocator left partly at its defaults")
    return ok
