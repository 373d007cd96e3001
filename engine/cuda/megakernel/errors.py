"""Megakernel failures a user (or the backend selector) can read."""

from __future__ import annotations

from engine.errors import EngineError


class MegakernelError(EngineError):
    """The megakernel cannot run (unsupported model or GPU) or a launch failed; the message says why, so the
    backend can fall back to the per-op path and report it."""


class ScheduleDeadlockError(MegakernelError):
    """No SM's next instruction can run: a wait that no schedule can satisfy (found by the VM)."""
