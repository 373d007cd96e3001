"""Host memory: keep freed heap for the next large numpy temporary instead of handing it back to the system.

Sampling a token builds ~2 MB arrays over a 248K-token vocabulary (the float64 distribution, its running sums, the
ids with mass), several a row. glibc returns freed memory at the top of its heap to the system once more than
M_TRIM_THRESHOLD is free (dynamically about twice the largest freed block), so every row's arrays were fresh pages
again: page faults cost ~4 of a sampled row's ~6 ms on the host (bench/NOTES.md Z9). Raising the two thresholds
keeps those pages mapped; arrays past M_MMAP_THRESHOLD (a model's weights, prefill activations) still map and
unmap on their own.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # allocations below this come from the heap (glibc's dynamic maximum)
TRIM_THRESHOLD = 256 << 20  # freed heap kept before any is returned


def keep_freed_heap() -> bool:
    """Set glibc's thresholds for this process; False where there is no glibc mallopt (other C libraries, other
    systems), which changes only speed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
