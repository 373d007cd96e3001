"""Choosing the engine backend: `--backend cuda|reference|auto`, with the reason for the choice.

`auto` takes the CUDA backend when it can run the model on this machine and falls back to the numpy reference
otherwise, logging why (no driver, no GPU, a GPU older than sm_80, out of memory, a weight type without
kernels, a kernel that failed to compile).
"""

from __future__ import annotations

import logging
from pathlib import Path

from engine.backend import Backend
from engine.errors import EngineError

BACKENDS = ("auto", "cuda", "reference")
log = logging.getLogger("openjet.engine")


def select_backend(model_path: str | Path, requested: str = "auto", context_size: int | None = None,
                   max_tokens: int = 512) -> tuple[Backend, str]:
    """(backend, reason) for the requested backend; `cuda` raises the CUDA error, `auto` falls back."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r} (choose from {', '.join(BACKENDS)})")
    if requested in ("auto", "cuda"):
        try:
            backend = _cuda(model_path, context_size, max_tokens)
        except EngineError as exc:
            if requested == "cuda":
                raise
            reason = f"reference: CUDA backend unavailable: {exc}"
            log.warning("backend %s", reason)
        else:
            info = backend.dev.info
            reason = f"cuda: {info.name} (sm_{info.arch}), per-op kernels"
            log.info("backend %s", reason)
            return backend, reason
    else:
        reason = "reference: requested"
    from engine.reference.backend import ReferenceBackend

    return ReferenceBackend.from_gguf(model_path, context_size=context_size), reason


def _cuda(model_path: str | Path, context_size: int | None, max_tokens: int) -> Backend:
    """The CUDA backend, every failure an EngineError with a readable reason."""
    from engine.cuda.backend import CudaBackend
    from engine.cuda.device import CudaError

    try:
        return CudaBackend.from_gguf(model_path, context_size=context_size, max_tokens=max_tokens)
    except EngineError:
        raise
    except (OSError, ImportError) as exc:  # a missing CUDA library behaves like no GPU
        raise CudaError(f"CUDA libraries unavailable: {exc}") from exc
