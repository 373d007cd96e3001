"""The CUDA engine: NVRTC-compiled kernels, the per-op backend and the megakernel."""

from __future__ import annotations

import os


def env_flag(name: str, default: bool) -> bool:
    """An on/off switch from the environment: unset gives default, "" or "0" off, anything else on."""
    value = os.environ.get(name)
    return default if value is None else value not in ("", "0")
