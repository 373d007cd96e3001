"""engine.hostmem: glibc keeps a sampled row's freed arrays mapped for the next row."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys

import pytest

from engine import hostmem

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
HAS_MALLINFO2 = GLIBC and hasattr(ctypes.CDLL(None), "mallinfo2")  # glibc 2.33+


@pytest.mark.skipif(not HAS_MALLINFO2, reason="mallopt and mallinfo2 are glibc's (2.33+)")
def test_the_thresholds_are_set_and_freed_heap_stays():
    """In a fresh process: with the thresholds set, a 2 MB array freed leaves its pages in the heap (mallinfo2's
    free bytes hold it) rather than going back to the system."""
    code = """
import ctypes, sys
import numpy as np
from engine.hostmem import keep_freed_heap
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
on = sys.argv[1] == "on"
if on:
    assert keep_freed_heap()
for _ in range(3):
    a = [np.ones(250_000) for _ in range(4)]  # four 2 MB rows, as a sampled token makes
    del a
print(libc.mallinfo2().fordblks)
"""
    free = {mode: int(subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                                     check=True).stdout) for mode in ("on", "off")}
    assert free["on"] >= 8 * 10**6 > free["off"]


def test_it_says_false_where_it_cannot_set_them(monkeypatch):
    monkeypatch.setattr(hostmem.sys, "platform", "darwin")
    assert hostmem.keep_freed_heap() is False
