"""`openjet setup` as a function: find the hardware, pick and fetch the model (verified), choose the engine with a
reason for every alternative, optionally build llama-server, and record the result for the next launch."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from openjet_tui.llm.network import NetworkGuard
from openjet_tui.runtime.applog import log_selection
from openjet_tui.runtime.catalog import Catalog, ModelEntry, load_catalog
from openjet_tui.runtime.download import describe_plan, fetch_model, find_ready_model
from openjet_tui.runtime.engines import Selection, gather_facts, select_engine
from openjet_tui.runtime.errors import RuntimeSetupError
from openjet_tui.runtime.hardware import HardwareInfo, probe_hardware
from openjet_tui.runtime.kernels import KernelReport, compile_target, gpu_arch, run_compile
from openjet_tui.runtime.llamacpp import choose_backend, ensure_llama_server
from openjet_tui.runtime.paths import ensure_dir, setup_record_path
from openjet_tui.runtime.progress import ProgressCallback, no_progress

RECORD_VERSION = 1


@dataclass(slots=True)
class SetupOptions:
    """What the person asked `openjet setup` for."""

    model: str | None = None  # a catalog name or a path to a .gguf file; None: the best for this machine
    is_dry_run: bool = False
    allow_unverified: bool = False
    build_llama_server: bool = False  # build it now (in the foreground) if missing
    engine: str | None = None  # force one engine instead of the preference order
    context: int | None = None
    airgapped: bool | None = None  # only loopback URLs; None: the `airgapped` setting decides

    def guard(self) -> NetworkGuard | None:
        """The network guard asked for, or None to let each download read the setting when it needs it."""
        return None if self.airgapped is None else NetworkGuard(self.airgapped)


@dataclass(slots=True)
class SetupRecord:
    """What setup decided, kept in the cache so that the next `openjet` starts without asking again."""

    model_name: str  # catalog name, or "" for a file the user named
    model_path: str
    model_sha256: str
    is_model_pinned: bool  # False: a user file or one fetched with --allow-unverified
    context: int
    engine: str | None
    engine_reason: str
    decisions: list[dict[str, object]] = field(default_factory=list)
    created_at: float = 0.0
    kernels: dict[str, object] = field(default_factory=dict)  # the kernel step's state, target and reason
    version: int = RECORD_VERSION


@dataclass(slots=True)
class SetupReport:
    """Everything setup found and did, for the CLI (text or --json) and the log."""

    hardware: HardwareInfo
    model_title: str
    model_reason: str
    model_path: Path | None
    selection: Selection | None
    plan: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    record: SetupRecord | None = None
    kernels: KernelReport | None = None  # the kernel step (None in a dry run)


def resolve_model(spec: str | None, catalog: Catalog, hardware: HardwareInfo) -> tuple[ModelEntry | None, Path | None,
                                                                                        str]:
    """The catalog model or user file to use, and why: a path names a file, a name a catalog model."""
    if spec is None:
        entry, why = catalog.choose_for(hardware)
        return entry, None, why
    candidate = Path(spec).expanduser()
    if candidate.suffix == ".gguf" or candidate.exists():
        if not candidate.is_file():
            raise RuntimeSetupError(f"model file {candidate} does not exist")
        known = catalog.find_by_filename(candidate.name)
        why = f"the file you named ({'a catalog model' if known else 'not in the catalog: used unverified'})"
        return None, candidate.resolve(), why
    return catalog.get(spec), None, "the model you named"


def read_record() -> SetupRecord | None:
    """The last setup's record, if there is one this version can read."""
    try:
        data = json.loads(setup_record_path().read_text())
        record = SetupRecord(**data)
    except (OSError, ValueError, TypeError):
        return None
    return record if record.version == RECORD_VERSION else None


def write_record(record: SetupRecord) -> None:
    """Save the setup record atomically."""
    path = setup_record_path()
    ensure_dir(path.parent)
    path.with_suffix(".tmp").write_text(json.dumps(asdict(record), indent=1))
    path.with_suffix(".tmp").replace(path)


def _dry_run(report: SetupReport, entry: ModelEntry | None, options: SetupOptions, context: int) -> SetupReport:
    if entry is not None:
        report.plan += describe_plan(entry, allow_unverified=options.allow_unverified)
        ready = find_ready_model(entry, allow_unverified=options.allow_unverified)
        report.model_path = ready
    facts = gather_facts(report.model_path, context=context, hardware=report.hardware, guard=options.guard())
    report.selection = select_engine(facts, options.engine)
    if report.model_path is None:
        report.plan.append("engine: chosen once the model file is verified (its header decides)")
    report.plan.append(_kernel_plan(report.selection))
    return report


def _kernel_plan(selection: Selection) -> str:
    """The dry run's line on the kernel step."""
    arch, why = compile_target(selection)
    if arch is not None:
        return f"kernels: compile for {why} with `openjet-engine compile`, cached for later starts"
    if selection.chosen is None and gpu_arch(selection.facts.hardware)[0] is not None:
        return "kernels: compiled for this GPU if a CUDA engine is chosen"
    return f"kernels: {why.removeprefix('kernel compilation ')}"  # "kernels: skipped: no NVIDIA GPU: ..."


def _compile_kernels(report: SetupReport, options: SetupOptions, progress: ProgressCallback) -> None:
    """Setup's kernel step: compile for the GPU when a CUDA engine was chosen (or say why not); when kernels fail
    to compile, choose again without the engines that need them, with the compiler's words as the reason."""
    assert report.selection is not None
    arch, why = compile_target(report.selection)
    report.kernels = KernelReport("skipped", why) if arch is None else run_compile(arch, progress)
    report.notes.append(report.kernels.reason)
    if blocked := report.kernels.blocked_engines():
        report.selection.facts.kernel_errors.update(blocked)
        report.selection = select_engine(report.selection.facts, options.engine)


def _maybe_build(options: SetupOptions, report: SetupReport, progress: ProgressCallback) -> None:
    facts = report.selection.facts if report.selection else None
    if not options.build_llama_server or facts is None or facts.llama_server is not None:
        return
    backend, why = choose_backend(report.hardware)
    report.notes.append(f"building llama-server ({why})")
    binary = ensure_llama_server(report.hardware, backend=backend, progress=progress, guard=options.guard())
    report.notes.append(f"llama-server built at {binary}")


def _select(report: SetupReport, context: int, options: SetupOptions) -> Selection:
    assert report.model_path is not None
    facts = gather_facts(report.model_path, context=context, hardware=report.hardware, guard=options.guard())
    return select_engine(facts, options.engine)


def run_setup(options: SetupOptions, progress: ProgressCallback = no_progress,
              catalog: Catalog | None = None, hardware: HardwareInfo | None = None) -> SetupReport:
    """Set OpenJet up on this machine (or, with is_dry_run, say what that would do) and record the result;
    `hardware` describes the machine instead of probing it (tests, a GPU chosen elsewhere)."""
    hardware, catalog = hardware or probe_hardware(), catalog or load_catalog()
    entry, user_path, why = resolve_model(options.model, catalog, hardware)
    title = entry.title if entry else user_path.name  # type: ignore[union-attr]
    context = options.context or (entry.default_context if entry else 8192)
    report = SetupReport(hardware=hardware, model_title=title, model_reason=why, model_path=user_path, selection=None)
    if options.is_dry_run:
        return _dry_run(report, entry, options, context)
    sha, is_pinned = "", False
    if entry is not None:
        fetched = fetch_model(entry, progress=progress, allow_unverified=options.allow_unverified,
                              guard=options.guard())
        report.model_path, sha, is_pinned = fetched.path, fetched.sha256, fetched.is_pinned
        report.notes += fetched.notes
    assert report.model_path is not None
    report.selection = _select(report, context, options)
    _maybe_build(options, report, progress)
    if options.build_llama_server:  # the build changes the llama-server decision
        report.selection = _select(report, context, options)
    _compile_kernels(report, options, progress)
    log_selection(report.selection, f"setup for {report.model_path.name}")
    chosen = report.selection.chosen
    report.record = SetupRecord(
        model_name=entry.name if entry else "", model_path=str(report.model_path), model_sha256=sha,
        is_model_pinned=is_pinned, context=context, engine=chosen.engine if chosen else None,
        engine_reason=chosen.reason if chosen else "no engine can serve this model here",
        decisions=[asdict(d) for d in report.selection.decisions], created_at=time.time(),
        kernels={"state": report.kernels.state, "target": report.kernels.target, "reason": report.kernels.reason})
    write_record(report.record)
    return report


def is_setup_current(record: SetupRecord | None, catalog: Catalog | None = None) -> bool:
    """Whether a record still describes a usable model file (a verified catalog file, or the user's file)."""
    if record is None or not Path(record.model_path).is_file():
        return False
    if not record.model_name:
        return True
    try:
        entry = (catalog or load_catalog()).get(record.model_name)
    except RuntimeSetupError:
        return False
    folder = Path(record.model_path).parent
    return find_ready_model(entry, folder, allow_unverified=not record.is_model_pinned) is not None


def describe_report(report: SetupReport, emit: Callable[[str], None]) -> None:
    """Write a setup report as text, one decision per line."""
    emit(f"hardware: {report.hardware.gpu_summary()}; {report.hardware.num_cpus} CPU cores, "
         f"{report.hardware.ram_total / 2**30:.1f} GiB RAM")
    emit(f"model: {report.model_title} ({report.model_reason})")
    if report.model_path is not None:
        emit(f"model file: {report.model_path}")
    for line in report.plan:
        emit(f"plan: {line}")
    if report.selection is not None:
        for line in report.selection.lines():
            emit(f"engine {line}")
    for note in report.notes:
        emit(f"note: {note}")
