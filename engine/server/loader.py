"""Loading a model for serving: the GGUF file, its tokenizer and chat template, and a backend chosen with a reason.

--backend reference: the numpy reference engine (exact, slow; any CPU).
--backend cuda: the CUDA engine (engine.cuda.backend.CudaBackend); failing to start it is an error with its reason.
--backend auto: CUDA when it starts, else the reference, saying why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.backend import Backend
from engine.errors import EngineError
from engine.gguf.reader import GGUFFile
from engine.text.chat import ChatTemplate
from engine.text.tokenizer import Tokenizer

BACKENDS = ("reference", "cuda", "auto")
Progress = Callable[[str, float], None]


class BackendUnavailable(EngineError):
    """The requested backend cannot serve this model here; the message says why."""


@dataclass(slots=True)
class LoadedModel:
    """Everything the server needs of a model, and which backend serves it and why."""

    backend: Backend
    tokenizer: Tokenizer
    template: ChatTemplate
    model_id: str
    path: str
    backend_name: str
    backend_reason: str


class LoadState:
    """Load progress shared between the loading thread and /health: a stage, a fraction, or the error."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stage, self.fraction, self.error = "starting", 0.0, None
        self.model: LoadedModel | None = None

    def update(self, stage: str, fraction: float) -> None:
        """Record progress (called by the loader)."""
        with self._lock:
            self.stage, self.fraction = stage, fraction

    def fail(self, message: str) -> None:
        """Record that loading failed."""
        with self._lock:
            self.stage, self.error = "failed", message

    def ready(self, model: LoadedModel) -> None:
        """Record the loaded model."""
        with self._lock:
            self.stage, self.fraction, self.model = "ready", 1.0, model

    def snapshot(self) -> tuple[str, float, str | None, LoadedModel | None]:
        """(stage, fraction, error, model) read together."""
        with self._lock:
            return self.stage, self.fraction, self.error, self.model


def _reference_backend(f: GGUFFile, context_size: int | None, reason: str) -> tuple[Backend, str, str]:
    from engine.reference.backend import ReferenceBackend

    return ReferenceBackend.from_file(f, context_size=context_size), "reference", reason


def open_backend(f: GGUFFile, requested: str, context_size: int | None = None) -> tuple[Backend, str, str]:
    """(backend, name, reason) for --backend requested; BackendUnavailable when cuda was asked for and cannot run."""
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {requested!r}")
    if requested == "reference":
        return _reference_backend(f, context_size, "requested with --backend reference")
    try:
        from engine.cuda.select import select_backend
    except ImportError as exc:
        if requested == "cuda":
            raise BackendUnavailable(f"the CUDA backend is not available in this build ({exc})") from None
        return _reference_backend(f, context_size, f"the CUDA backend is not available in this build ({exc}); "
                                                   "serving on the numpy reference engine (slow)")
    try:
        # the CUDA side decides: the megakernel, the per-op path, or (auto) the reference, with its reason
        backend, reason = select_backend(f.path, requested, context_size)
    except EngineError as exc:
        raise BackendUnavailable(f"the CUDA backend cannot serve {f.path}: {exc}") from None
    from engine.reference.backend import ReferenceBackend

    default_name = "reference" if isinstance(backend, ReferenceBackend) else "cuda"
    return backend, str(getattr(backend, "name", default_name)), reason


def load_model(path: str | Path, requested: str = "auto", context_size: int | None = None,
               progress: Progress | None = None, alias: str | None = None) -> LoadedModel:
    """Open path and start a backend for it, reporting (stage, fraction) along the way."""
    report = progress or (lambda stage, fraction: None)
    report("reading the GGUF header", 0.05)
    f = GGUFFile.open(path)
    report("building the tokenizer", 0.1)
    tokenizer = Tokenizer.from_gguf(f)
    template = ChatTemplate.from_gguf(f)
    report("loading weights", 0.2)
    backend, name, reason = open_backend(f, requested, context_size)
    if tokenizer.vocab_size > backend.vocab_size:
        raise EngineError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model's logits only "
                          f"{backend.vocab_size}")
    report("ready", 1.0)
    return LoadedModel(backend, tokenizer, template, alias or Path(path).name, str(path), name, reason)
