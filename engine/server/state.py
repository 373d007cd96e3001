"""What one server process holds: its configuration, the loading model, metrics, and the engine worker."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.backend import Backend
from engine.errors import EngineError
from engine.server.generation import Generator
from engine.server.loader import LoadedModel, LoadState, load_model
from engine.server.metrics import ServerMetrics
from engine.server.schemas import RequestError
from engine.server.worker import EngineWorker
from engine.session import Session
from engine.spec.adaptive import DraftLengthController
from engine.spec.decode import SpeculativeDecoder
from engine.spec.drafter import Drafter
from engine.spec.mtp import FallbackDrafter, MtpDrafter
from engine.spec.ngram import NgramDrafter

log = logging.getLogger("engine.server")
DRAFTS = ("auto", "mtp", "ngram", "ngram+mtp", "none")
DEFAULT_N_DRAFT = {"mtp": 4, "ngram": 8, "ngram+mtp": 6}


@dataclass(slots=True)
class ServerConfig:
    """Everything `openjet-engine serve` is told on its command line."""

    model_path: str
    backend: str = "auto"
    host: str = "127.0.0.1"
    port: int = 18080
    context_size: int | None = None
    draft: str = "auto"  # auto: MTP when the model has a head, else n-gram; ngram+mtp: n-gram match first
    n_draft: int | None = None  # the most draft tokens per cycle; None: DEFAULT_N_DRAFT
    api_key: str | None = None
    max_waiting: int = 16
    max_checkpoints: int = 8
    alias: str | None = None

    def __post_init__(self) -> None:
        if self.draft not in DRAFTS:
            raise ValueError(f"draft must be one of {', '.join(DRAFTS)}, got {self.draft!r}")
        if self.n_draft is not None and self.n_draft < 0:
            raise ValueError(f"n_draft must be >= 0, got {self.n_draft}")
        if self.context_size is not None and self.context_size < 1:
            raise ValueError(f"context size must be >= 1, got {self.context_size}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")


def build_decoder(backend: Backend, draft: str, n_draft: int | None) -> tuple[SpeculativeDecoder, str]:
    """The speculative decoder for --draft and --n-draft, and the drafter actually used (mtp | ngram | none)."""
    kind = ("mtp" if backend.can_draft else "ngram") if draft == "auto" else draft
    if "mtp" in kind and not backend.can_draft:
        raise EngineError(f"--draft {kind} needs a model with an MTP head (qwen35 nextn layers); use --draft ngram")
    max_draft = DEFAULT_N_DRAFT.get(kind, 0) if n_draft is None else n_draft
    if kind == "none" or max_draft == 0:
        return SpeculativeDecoder(backend), "none"
    drafter: Drafter
    if kind == "ngram+mtp":  # a prompt-lookup match when there is one (long runs), else the MTP head
        drafter = FallbackDrafter(NgramDrafter(), MtpDrafter(backend))
    else:
        drafter = MtpDrafter(backend) if kind == "mtp" else NgramDrafter()
    return SpeculativeDecoder(backend, drafter, DraftLengthController(max_draft=max_draft)), kind


class ServerState:
    """The model (once loaded), the worker serving it, and the metrics; see load() and attach()."""

    def __init__(self, config: ServerConfig):
        self.config, self.load_state, self.metrics = config, LoadState(), ServerMetrics()
        self.worker: EngineWorker | None = None
        self.drafter_kind = "none"
        self.created = int(time.time())

    def load(self, loader: Callable[..., LoadedModel] = load_model) -> bool:
        """Load the configured model and start serving it; False (the error recorded) if that fails."""
        c = self.config
        try:
            model = loader(c.model_path, c.backend, c.context_size, progress=self.load_state.update, alias=c.alias)
            self.attach(model)
        except (EngineError, OSError, ValueError) as exc:
            log.error("loading %s failed: %s", c.model_path, exc)
            self.load_state.fail(str(exc))
            return False
        return True

    def attach(self, model: LoadedModel) -> None:
        """Serve an already loaded model: build the decoder, session and worker, and start the engine thread."""
        decoder, self.drafter_kind = build_decoder(model.backend, self.config.draft, self.config.n_draft)
        if "mtp" not in self.drafter_kind:
            model.backend.drop_draft_head()  # nothing drafts from the head: its catch-up leaves every pass
        session = Session(model.backend, max_checkpoints=self.config.max_checkpoints)
        generator = Generator(model.backend, model.tokenizer, session, decoder)
        self.worker = EngineWorker(generator, self.metrics, self.config.max_waiting)
        self.metrics.context_size.set(model.backend.context_size)
        self._report_backend(model)
        if hasattr(model.backend, "on_switch"):  # the megakernel falls back to the per-op path at run time

            def switched(name: str, reason: str) -> None:
                model.backend_name, model.backend_reason = name, reason
                self._report_backend(model)

            model.backend.on_switch = switched
        log.info("serving %s on the %s backend (%s), drafts: %s", model.model_id, model.backend_name,
                 model.backend_reason, self.drafter_kind)
        self.worker.start()
        self.load_state.ready(model)

    def _report_backend(self, model: LoadedModel) -> None:
        """The backend, its reason, the model and the drafts as /metrics' openjet_backend info."""
        self.metrics.backend.info({"backend": model.backend_name, "backend_reason": model.backend_reason,
                                   "model": model.model_id, "draft": self.drafter_kind})

    def ready_model(self) -> tuple[LoadedModel, EngineWorker]:
        """The model and worker, or a 503 RequestError while loading (500 if loading failed)."""
        stage, fraction, error, model = self.load_state.snapshot()
        if error is not None:
            raise RequestError(f"the model failed to load: {error}", status=500, error_type="server_error")
        if model is None or self.worker is None:
            raise RequestError(f"Loading model ({stage}, {fraction:.0%})", status=503, error_type="unavailable_error")
        return model, self.worker

    def start_loading(self, on_failure: Callable[[], None] | None = None) -> threading.Thread:
        """Load in a background thread (so /health answers meanwhile); on_failure runs if loading fails."""

        def run() -> None:
            """Load, and report a failure."""
            if not self.load() and on_failure is not None:
                on_failure()

        thread = threading.Thread(target=run, name="openjet-load", daemon=True)
        thread.start()
        return thread

    def shutdown(self) -> None:
        """Stop the engine thread, then release the backend's device (a CUDA backend has close())."""
        if self.worker is not None:
            self.worker.stop()
        model = self.load_state.model
        close = getattr(model.backend, "close", None) if model is not None else None
        if callable(close):
            close()
