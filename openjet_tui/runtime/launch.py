"""What the app calls between `openjet` and a working agent: set up if needed, start the best engine, and hand back
an endpoint plus every decision and event for the engine panel. Never blocks on a long llama-server build: when
llama-server is missing on a CPU-only machine it is built in the background for the next launch."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from openjet_tui.llm.network import NetworkGuard, host_of, is_loopback_host
from openjet_tui.runtime.airgap import settings_guard
from openjet_tui.runtime.applog import log_selection
from openjet_tui.runtime.engines import LABELS, Selection, engine_command, gather_facts, select_engine
from openjet_tui.runtime.errors import EngineStartError
from openjet_tui.runtime.llamacpp import BackgroundBuild, choose_backend
from openjet_tui.runtime.progress import ProgressCallback, no_progress
from openjet_tui.runtime.pypi_parts import index_url
from openjet_tui.runtime.setup import SetupOptions, SetupRecord, is_setup_current, read_record, run_setup
from openjet_tui.runtime.worker import EngineWorker, WorkerEvent, WorkerSpec

# Agent provider name (openjet_tui.llm.providers) for each engine.
PROVIDER_FOR = {"megakernel": "openjet", "cuda": "openjet", "reference": "openjet", "llama-server": "llama-server",
                "ollama": "ollama", "lmstudio": "lmstudio"}


@dataclass(slots=True)
class EngineSession:
    """A serving engine: where to send requests, why this engine, and the processes to stop on exit."""

    engine: str
    provider: str
    base_url: str  # OpenAI-compatible root ending in /v1
    model: str | None  # the model id to put in requests (None: the server's only model)
    reason: str
    selection: Selection
    worker: EngineWorker | None = None
    build: BackgroundBuild | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The engine's display name, e.g. 'OpenJet reference engine (CPU, slow)'."""
        return LABELS[self.engine]

    def close(self) -> None:
        """Stop the engine worker and any background build (the build resumes on the next launch)."""
        if self.worker is not None:
            self.worker.stop()
        if self.build is not None:
            self.build.stop()


def ensure_setup(progress: ProgressCallback = no_progress, airgapped: bool | None = None) -> SetupRecord:
    """The current setup record, running a non-interactive setup first when there is none (fresh machine)."""
    record = read_record()
    if is_setup_current(record):
        assert record is not None
        return record
    report = run_setup(SetupOptions(airgapped=airgapped), progress=progress)
    assert report.record is not None
    return report.record


def should_build_llama_server(selection: Selection) -> bool:
    """No GPU engine and no llama-server yet: building one makes the next launch much faster than the reference."""
    facts, chosen = selection.facts, selection.chosen
    if facts.llama_server is not None or (facts.llama_build is not None and facts.llama_build.is_alive()):
        return False
    is_slow = chosen is None or chosen.engine in ("reference",)
    return is_slow and shutil.which("cmake") is not None and facts.model is not None


def _external_session(selection: Selection) -> EngineSession:
    chosen = selection.chosen
    assert chosen is not None
    server = next(s for s in selection.facts.local_servers if s.engine == chosen.engine)
    return EngineSession(chosen.engine, PROVIDER_FOR[chosen.engine], server.base_url, server.preferred_model(),
                         chosen.reason, selection)


def _background_build(selection: Selection, guard: NetworkGuard, notes: list[str]) -> BackgroundBuild | None:
    """Start the llama-server build when it would help, unless `airgapped` forbids reaching the PyPI index."""
    if not should_build_llama_server(selection):
        return None
    index = index_url()
    if guard.airgapped and not is_loopback_host(host_of(index)):
        notes.append(f"llama-server is not built in the background: airgapped = true and the PyPI index {index} is "
                     f"not on loopback (set OPENJET_PYPI_INDEX to a local mirror)")
        return None
    return BackgroundBuild(choose_backend(selection.facts.hardware)[0], airgapped=guard.airgapped)


def start_engine(record: SetupRecord | None = None, *, progress: ProgressCallback = no_progress,
                 on_event: Callable[[WorkerEvent], None] | None = None, forced: str | None = None,
                 start_build: bool = True, airgapped: bool | None = None) -> EngineSession:
    """Choose the engine for the recorded model (decisions re-checked now, and written to the app's log) and start
    it; EngineStartError lists every decision when nothing can serve. `airgapped` None: the setting decides."""
    guard = settings_guard(airgapped)
    record = record or ensure_setup(progress, guard.airgapped)
    model = Path(record.model_path)
    selection = select_engine(gather_facts(model, context=record.context, guard=guard), forced or None)
    log_selection(selection, f"engine for {model.name}")
    notes: list[str] = []
    build = _background_build(selection, guard, notes) if start_build else None
    chosen = selection.chosen
    if chosen is None:
        if build is not None:
            build.stop()
        raise EngineStartError("no engine can serve " + model.name + ":\n" + "\n".join(selection.lines()))
    if chosen.engine in ("ollama", "lmstudio"):
        session = _external_session(selection)
        session.build, session.notes = build, notes
        return session
    command = engine_command(chosen.engine, model, record.context, selection.facts)
    worker = EngineWorker(WorkerSpec(name=chosen.engine, command=command), on_event=on_event)
    try:
        worker.start(progress)
    except EngineStartError:
        if build is not None:
            build.stop()
        raise
    session = EngineSession(chosen.engine, PROVIDER_FOR[chosen.engine], f"{worker.base_url}/v1", None, chosen.reason,
                            selection, worker=worker, build=build, notes=notes)
    if reported := worker.health_info.get("backend_reason"):
        # openjet-engine's own word on the backend it runs (e.g. per-op after a megakernel launch failure).
        session.notes.append(f"engine backend {worker.health_info.get('backend')}: {reported}")
    if build is not None:
        session.notes.append(f"llama-server is being built in the background (log {build.log_path}); "
                             f"the next launch uses it")
    return session
