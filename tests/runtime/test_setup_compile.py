"""Setup's kernel step: `openjet-engine compile` runs as a child process when a CUDA engine is chosen, its progress
reaches the setup display, a failure falls back with the reason, no GPU says why it was skipped, and doctor reports
whether the kernels for the GPU are cached."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.cuda import compile_cmd, nvrtc
from openjet_tui.runtime import doctor_cmd, setup_cmd
from openjet_tui.runtime.hardware import GpuInfo, HardwareInfo, probe_hardware
from openjet_tui.runtime.kernels import run_compile
from openjet_tui.runtime.launch import ensure_setup
from openjet_tui.runtime.progress import ProgressEvent
from openjet_tui.runtime.setup import SetupOptions, read_record, run_setup
from tests.kernels.compiled_cache import copy_full_sm90_cache
from tests.runtime.test_setup import tiny_catalog  # noqa: F401 - a fixture: a catalog whose default is tiny

H200 = HardwareInfo(gpus=[GpuInfo(0, "NVIDIA H200", (9, 0), 140 << 30, 139 << 30)], driver_version="580.65",
                    cuda_version="13.0", num_cpus=2)
NO_GPU = HardwareInfo(nvml_error="the NVIDIA driver library (libnvidia-ml) is not installed", num_cpus=2)
RECOMPILED = ("norm", "rope")  # small files the setup test compiles for real; the rest come from the shared cache


@pytest.fixture
def tiny_model(tiny_model_path, monkeypatch) -> Path:
    """A tiny qwen2 file (an engine architecture), with llama-server and local servers out of the picture."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("OPENJET_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")  # nothing listens on the discard port
    return tiny_model_path("qwen2", tokenizer=False)


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch) -> Path:
    """The engine's kernel cache for this test (empty); the compile child inherits it through the environment."""
    cache = tmp_path / "kernels"
    monkeypatch.setenv("OPENJET_KERNEL_CACHE", str(cache))
    return cache


def _drop(cache: Path, names: tuple[str, ...]) -> None:
    """Remove these files' sm_90 entries so that the next compile compiles them."""
    units = {u.name: u for u in compile_cmd.kernel_units()}
    for name in names:
        meta_path, image_path, _ = compile_cmd.cache_entry(units[name], compile_cmd.Target(90, 90, False), cache)
        meta_path.unlink()
        image_path.unlink()


def test_setup_with_an_sm90_gpu_compiles_the_kernels_with_progress(tiny_model, kernel_cache):
    copy_full_sm90_cache(kernel_cache)
    _drop(kernel_cache, RECOMPILED)
    files = [u.name for u in compile_cmd.kernel_units() + compile_cmd.megakernel_units()]
    events: list[ProgressEvent] = []
    report = run_setup(SetupOptions(model=str(tiny_model), context=512), progress=events.append, hardware=H200)
    assert report.selection.chosen.engine == "cuda"
    kernels = report.kernels
    assert (kernels.state, kernels.target, kernels.num_files) == ("compiled", "sm_90", len(files))
    assert (kernels.num_compiled, kernels.num_cached, kernels.cache) == (2, len(files) - 2, str(kernel_cache))
    assert kernels.reason.startswith(f"kernels for sm_90: {len(files)} files ready in {kernel_cache} (2 compiled")
    assert kernels.reason in report.notes and read_record().kernels["state"] == "compiled"
    # The display saw the start, then one event per file as each finished, the last one finishing the task.
    assert {e.task for e in events} == {"compile kernels (sm_90)"} and all(e.total == len(files) for e in events)
    assert (events[0].done, events[0].note) == (0, "starting")
    assert [e.done for e in events[1:]] == list(range(1, len(files) + 1)) and events[-1].is_finished
    notes = {e.note.split()[0]: e.note.split(" ", 1)[1] for e in events[1:]}
    assert set(notes) == set(files) and all(notes[n].endswith(" s") for n in RECOMPILED)
    assert all(notes[n] == "cached" for n in files if n not in RECOMPILED)
    again = run_setup(SetupOptions(model=str(tiny_model), context=512), hardware=H200).kernels
    assert (again.state, again.num_compiled, again.num_cached) == ("cached", 0, len(files))


def test_a_failed_compile_falls_back_and_says_why(tiny_model, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("OPENJET_KERNEL_CACHE", str(blocker / "kernels"))  # a cache that cannot be created
    report = run_setup(SetupOptions(model=str(tiny_model), context=512), hardware=H200)
    assert report.kernels.state == "failed" and "cannot be created" in report.kernels.reason
    decisions = {d.engine: d for d in report.selection.decisions}
    assert not decisions["cuda"].is_available and decisions["cuda"].reason == report.kernels.reason
    assert report.selection.chosen.engine == "reference" and read_record().engine == "reference"


def test_compiler_errors_reach_the_report_with_file_and_log(tmp_path, kernel_cache):
    kernels = tmp_path / "kernel-src"
    shutil.copytree(nvrtc.KERNEL_DIR, kernels)
    rope = kernels / "rope.cu"
    rope.write_text(rope.read_text() + "\n__global__ void broken(float* x) { x[0] = not_declared_anywhere; }\n")
    events: list[ProgressEvent] = []
    report = run_compile(90, events.append, extra_args=("--only", "rope,norm", "--kernel-dir", str(kernels)))
    assert report.state == "failed" and list(report.failed) == ["rope"] and report.failed_groups == ["cuda"]
    assert report.failed["rope"].startswith(f"{rope} did not compile for sm_90\n")
    assert "not_declared_anywhere" in report.failed["rope"]
    assert report.reason.startswith("kernels for sm_90 did not compile (rope): rope.cu(") and \
        "not_declared_anywhere" in report.reason
    assert report.blocked_engines() == {"megakernel": report.reason, "cuda": report.reason}
    norm, rope_note = sorted(e.note for e in events[1:])  # the display shows the failure like any other file
    assert rope_note == "rope failed" and norm.startswith("norm ") and norm.endswith(" s") and events[-1].is_finished


def test_without_a_gpu_compilation_is_skipped_with_the_reason(tiny_model, kernel_cache, capsys):
    report = run_setup(SetupOptions(model=str(tiny_model), context=512), hardware=NO_GPU)
    reason = ("kernel compilation skipped: no NVIDIA GPU: the NVIDIA driver library (libnvidia-ml) is not installed; "
              "the CUDA engines and their kernels are not used")
    assert (report.kernels.state, report.kernels.reason) == ("skipped", reason) and reason in report.notes
    assert not kernel_cache.exists()  # nothing was run
    turing = HardwareInfo(gpus=[GpuInfo(0, "Tesla T4", (7, 5), 16 << 30, 15 << 30)])
    old = run_setup(SetupOptions(model=str(tiny_model), context=512), hardware=turing).kernels
    assert old.state == "skipped" and "Tesla T4 (sm_75): OpenJet's kernels need sm_80 or newer" in old.reason
    forced = run_setup(SetupOptions(model=str(tiny_model), context=512, engine="reference"), hardware=H200).kernels
    assert forced.reason == ("kernel compilation skipped: the chosen engine is OpenJet reference engine (CPU, slow), "
                             "which does not run OpenJet's kernels") and not kernel_cache.exists()
    plan = run_setup(SetupOptions(model=str(tiny_model), context=512, is_dry_run=True), hardware=H200).plan
    assert "kernels: compile for NVIDIA H200 (sm_90) with `openjet-engine compile`, cached for later starts" in plan
    if not probe_hardware().gpus:  # `openjet setup` on this machine says the same
        assert setup_cmd.main(["--model", str(tiny_model), "--json"]) in (0, 1)
        printed = json.loads(capsys.readouterr().out)
        assert printed["kernels"]["state"] == "skipped" and "no NVIDIA GPU" in printed["kernels"]["reason"]


@pytest.mark.skipif(bool(probe_hardware().gpus), reason="checks the first-run setup of a machine without a GPU")
def test_first_run_setup_of_the_app_records_the_kernel_step(tiny_catalog, kernel_cache):  # noqa: F811
    record = ensure_setup()
    assert record.kernels["state"] == "skipped" and "no NVIDIA GPU" in record.kernels["reason"]


def test_doctor_reports_whether_the_kernels_for_the_gpu_are_cached(tiny_model, kernel_cache):
    missing = doctor_cmd.collect(probe_local=False, hardware=H200)["kernels"]
    assert missing["state"] == "missing" and set(missing["missing"]) >= {"mmvq", "norm"}
    assert "files not compiled yet" in missing["reason"] and not kernel_cache.exists()
    copy_full_sm90_cache(kernel_cache)
    data = doctor_cmd.collect(probe_local=False, hardware=H200)
    cached = data["kernels"]
    assert cached["state"] == "cached" and cached["missing"] == [] and cached["target"] == "sm_90"
    lines = doctor_cmd.format_text(data)
    assert lines[lines.index("kernels") + 1] == f"  kernels for sm_90: all {cached['num_files']} files compiled " \
                                                f"and cached in {kernel_cache}"
    _drop(kernel_cache, ("rope",))
    assert doctor_cmd.collect(probe_local=False, hardware=H200)["kernels"]["missing"] == ["rope"]
    skipped = doctor_cmd.collect(probe_local=False, hardware=NO_GPU)["kernels"]
    assert skipped["state"] == "skipped" and skipped["reason"].startswith("not needed: no NVIDIA GPU")
