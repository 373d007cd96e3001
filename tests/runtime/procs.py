"""Checks on real processes for the lifecycle tests."""

from __future__ import annotations

import time
from pathlib import Path


def is_gone(pid: int) -> bool:
    """True when the process no longer exists (or is a zombie nobody reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state


def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    """Wait up to timeout_s for the process to be gone; True if it is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_gone(pid):
            return True
        time.sleep(0.05)
    return False
