"""The CUDA engine: NVRTC-compiled kernels, the per-op backend and the megakernel."""

from __future__ import annotations

import os


def env_flag(name: str, default: bool) -> bool:
    """An on/off switch from the environment: unset gives default, "" or "0" off, anything else on."""
    value = os.environ.get(name)
    return default if value is None else value not in ("", "0")


def env_switch(name: str, default: bool) -> bool:
    """A strict on/off switch from the environment: unset gives default, "0" off, "1" on; anything else is an
    error naming the variable (a typo must not silently pick a kernel)."""
    value = os.environ.get(name)
    if value is None:
        return default
    if value not in ("0", "1"):
        raise ValueError(f"{name}={value!r}: expected 0 or 1")
    return value == "1"
