"""Setup's kernel step: `openjet-engine compile` run as a child of this Python, its JSON Lines progress shown in the
setup progress display, and the cache check `openjet doctor` reports. The app never imports the engine; it runs
the engine's command line, whose environment (and so whose kernel cache) the engine worker shares later."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from openjet_tui.runtime.engines import LABELS, Selection
from openjet_tui.runtime.hardware import HardwareInfo
from openjet_tui.runtime.progress import ProgressCallback, ProgressEvent, no_progress

CUDA_ENGINES = ("megakernel", "cuda")  # the engines that run OpenJet's kernels


@dataclass(slots=True)
class KernelReport:
    """What the kernel step did or found, with the sentence a person reads."""

    state: str  # compiled | cached | missing (doctor: not all cached) | failed | skipped
    reason: str
    arch: int | None = None
    target: str = ""  # sm_90, or compute_120 (PTX for a GPU newer than NVRTC)
    cache: str = ""
    num_files: int = 0
    num_compiled: int = 0
    num_cached: int = 0
    missing: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # file -> error and NVRTC's log
    failed_groups: list[str] = field(default_factory=list)  # "cuda" (per-op kernels) and/or "megakernel"
    seconds: float = 0.0

    @property
    def is_ready(self) -> bool:
        """Whether every kernel file is in the cache now."""
        return self.state in ("compiled", "cached")

    def blocked_engines(self) -> dict[str, str]:
        """Engine -> why it cannot run after a failed step: the megakernel's programs block only the megakernel;
        per-op kernels, or a compiler that could not run at all, block both CUDA engines."""
        if self.state != "failed":
            return {}
        if self.failed_groups == ["megakernel"]:
            return {"megakernel": self.reason}
        return {engine: self.reason for engine in CUDA_ENGINES}


def gpu_arch(hardware: HardwareInfo) -> tuple[int | None, str]:
    """The compute capability the engine's kernels are built for here (the GPU the CUDA engines use), or why none."""
    if not hardware.gpus:
        return None, f"{hardware.gpu_summary()}; the CUDA engines and their kernels are not used"
    gpu = hardware.best_gpu()
    if gpu is None:
        names = ", ".join(f"{g.name} ({g.sm})" for g in hardware.gpus)
        return None, f"{names}: OpenJet's kernels need sm_80 or newer"
    major, minor = gpu.compute_capability
    return 10 * major + minor, f"{gpu.name} ({gpu.sm})"


def compile_target(selection: Selection) -> tuple[int | None, str]:
    """The architecture setup compiles for (a CUDA engine was chosen), or None and why compilation is skipped."""
    arch, why = gpu_arch(selection.facts.hardware)
    chosen = selection.chosen
    if arch is None:
        return None, f"kernel compilation skipped: {why}"
    if chosen is None or chosen.engine not in CUDA_ENGINES:
        engine = LABELS[chosen.engine] if chosen else "no engine"
        return None, f"kernel compilation skipped: the chosen engine is {engine}, which does not run OpenJet's kernels"
    return arch, why


def compile_command(arch: int, *args: str) -> list[str]:
    """`openjet-engine compile --arch N --json ARGS` through this Python, so the engine of this install runs."""
    return [sys.executable, "-m", "engine.cli", "compile", "--arch", str(arch), "--json", *args]


def _progress_event(event: dict, report: KernelReport) -> ProgressEvent | None:
    """A compile event (already folded into `report`) as the setup display's ProgressEvent, or None."""
    task = f"compile kernels ({report.target})"
    if event.get("event") == "start":
        return ProgressEvent(task, 0, report.num_files, " files", "starting")
    if event.get("event") != "file":
        return None
    status = event["status"]
    note = f"{event['file']} {event['seconds']:.1f} s" if status == "compiled" else f"{event['file']} {status}"
    return ProgressEvent(task, event["done"], event["total"], " files", note,
                         is_finished=event["done"] == event["total"])


def _apply(report: KernelReport, event: dict) -> None:
    """Fold one JSON Lines event into the report."""
    kind = event.get("event")
    if kind == "start":
        report.target, report.cache, report.num_files = event["target"], event["cache"], event["total"]
    elif kind == "file":
        status, name = event["status"], event["file"]
        report.num_compiled += status == "compiled"
        report.num_cached += status == "cached"
        if status == "missing":
            report.missing.append(name)
        if status == "failed":
            report.failed[name] = f"{event['error']}\n{event['log']}".strip()
            if event["group"] not in report.failed_groups:
                report.failed_groups.append(event["group"])
    elif kind == "done":
        report.seconds = float(event["seconds"])


def run_compile(arch: int, progress: ProgressCallback = no_progress, *, is_check: bool = False,
                is_forced: bool = False, extra_args: tuple[str, ...] = ()) -> KernelReport:
    """Run the engine's compile command for `arch` (is_check: only look the files up in the cache; extra_args:
    more of its options, e.g. --only), forwarding its progress as it arrives; a failed compile is a report with
    state 'failed', never an exception."""
    args = ["--check"] if is_check else ["--force"] if is_forced else []
    args += extra_args
    report = KernelReport("failed", "", arch=arch)
    with tempfile.TemporaryFile(mode="w+") as stderr:  # a file, not a pipe: a long NVRTC log never blocks the child
        with subprocess.Popen(compile_command(arch, *args), stdout=subprocess.PIPE, stderr=stderr, text=True,
                              stdin=subprocess.DEVNULL) as child:
            try:
                for line in child.stdout:  # type: ignore[union-attr]
                    event = _parse(line)
                    _apply(report, event)
                    if not is_check and (shown := _progress_event(event, report)) is not None:
                        progress(shown)
                code = child.wait()
            finally:
                if child.poll() is None:  # interrupted: do not leave the compiler running
                    child.kill()
                    child.wait()
        stderr.seek(0)
        _conclude(report, code, is_check, stderr.read())
    return report


def _parse(line: str) -> dict:
    """One JSON Lines event; anything else on stdout is ignored (it is not part of the protocol)."""
    try:
        event = json.loads(line)
    except ValueError:
        return {}
    return event if isinstance(event, dict) else {}


def _conclude(report: KernelReport, code: int, is_check: bool, stderr: str) -> None:
    """Set the report's state and sentence from the exit status (0 ok, 1 failed or missing files, 2 usage)."""
    where = f"kernels for {report.target or f'sm_{report.arch}'}"
    if code == 0 and is_check:
        report.state, report.reason = "cached", f"{where}: all {report.num_files} files compiled and cached in " \
                                                f"{report.cache}"
    elif code == 0:
        report.state = "compiled" if report.num_compiled else "cached"
        report.reason = (f"{where}: {report.num_files} files ready in {report.cache} ({report.num_compiled} "
                         f"compiled in {report.seconds:.1f} s, {report.num_cached} already cached)")
    elif code == 1 and is_check and report.missing:
        report.state = "missing"
        report.reason = (f"{where}: {len(report.missing)} of {report.num_files} files not compiled yet "
                         f"({', '.join(report.missing)}); `openjet setup` compiles them, else the engine does at its "
                         f"first start")
    elif code == 1 and report.failed:
        error, *log = next(iter(report.failed.values())).splitlines()
        detail = next((line for line in log if "error" in line), error)  # NVRTC's first error names file and line
        report.reason = f"{where} did not compile ({', '.join(report.failed)}): {detail}"
    else:
        tail = [line for line in stderr.strip().splitlines() if line.strip()][-1:] or [f"exit status {code}"]
        report.reason = f"{where}: `openjet-engine compile` failed: {tail[0]}"
