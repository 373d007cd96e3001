"""Choosing the engine backend: `--backend cuda|reference|auto`, with the reason for the choice.

`auto` takes the CUDA backend when it can run the model on this machine and falls back to the numpy reference
otherwise, logging why (no driver, no GPU, a GPU older than sm_80, out of memory, a weight type without
kernels, a kernel that failed to compile).

Within CUDA: the megakernel (one launch per speculative cycle, engine/cuda/megakernel) when it is switched on
(OPENJET_CUDA_MEGAKERNEL=1) and the model and GPU allow it, with the per-op path behind it for a launch failure at
run time (engine/cuda/fallback.py); otherwise the per-op kernels. The reason names which and why.
"""

from __future__ import annotations

import logging
from pathlib import Path

from engine.backend import Backend
from engine.cuda import env_flag
from engine.errors import EngineError

BACKENDS = ("auto", "cuda", "reference")
MEGAKERNEL_ENV = "OPENJET_CUDA_MEGAKERNEL"
# Off by default while it is slower than the per-op path (bench/MEGAKERNEL.md round 14 and Status).
MEGAKERNEL_OFF = ("megakernel off by default: 10.9 ms a d = 0 cycle against the per-op path's 6.8 ms a token at "
                  f"the 27B shape (H200, 2026-12-05); {MEGAKERNEL_ENV}=1 turns it on")
log = logging.getLogger("openjet.engine")


def megakernel_requested() -> bool:
    """Whether OPENJET_CUDA_MEGAKERNEL asks for the megakernel."""
    return env_flag(MEGAKERNEL_ENV, False)


def select_backend(model_path: str | Path, requested: str = "auto", context_size: int | None = None,
                   max_tokens: int | None = None) -> tuple[Backend, str]:
    """(backend, reason) for the requested backend; `cuda` raises the CUDA error, `auto` falls back."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r} (choose from {', '.join(BACKENDS)})")
    if requested in ("auto", "cuda"):
        note = MEGAKERNEL_OFF
        if megakernel_requested():
            try:
                chosen = _megakernel(model_path, context_size, max_tokens)
            except EngineError as exc:  # not qwen35, no GPU, did not compile, out of memory
                note = f"megakernel not used: {exc}"
            else:
                log.info("backend %s", chosen[1])
                return chosen
        try:
            backend = _cuda(model_path, context_size, max_tokens)
        except EngineError as exc:
            if requested == "cuda":
                raise
            reason = f"reference: CUDA backend unavailable: {exc}"
            log.warning("backend %s", reason)
        else:
            info = backend.dev.info
            reason = f"cuda: {info.name} (sm_{info.arch}), per-op kernels; {note}"
            log.info("backend %s", reason)
            return backend, reason
    else:
        reason = "reference: requested"
    from engine.reference.backend import ReferenceBackend

    return ReferenceBackend.from_gguf(model_path, context_size=context_size), reason


def _cuda(model_path: str | Path, context_size: int | None, max_tokens: int | None) -> Backend:
    """The CUDA backend, every failure an EngineError with a readable reason."""
    from engine.cuda.backend import CudaBackend
    from engine.cuda.device import CudaError

    try:
        return CudaBackend.from_gguf(model_path, context_size=context_size, max_tokens=max_tokens)
    except EngineError:
        raise
    except (OSError, ImportError) as exc:  # a missing CUDA library behaves like no GPU
        raise CudaError(f"CUDA libraries unavailable: {exc}") from exc


def _megakernel(model_path: str | Path, context_size: int | None, max_tokens: int | None) -> tuple[Backend, str]:
    """The megakernel with the per-op path behind it, and the reason; EngineError when it cannot run here."""
    from engine.cuda.fallback import FallbackBackend
    from engine.cuda.megakernel.runner import open_backend

    try:
        mk = open_backend(model_path, context_size)
    except (OSError, ImportError) as exc:
        raise EngineError(f"CUDA libraries unavailable: {exc}") from exc
    info = mk.ex.dev.info
    reason = f"cuda: {info.name} (sm_{info.arch}), megakernel (one launch per speculative cycle), {MEGAKERNEL_ENV}=1"
    return FallbackBackend(mk, reason, lambda: _cuda(model_path, context_size, max_tokens), "cuda"), reason
