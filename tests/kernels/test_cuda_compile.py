"""Every kernel compiles with NVRTC for every supported architecture, on a machine with no GPU or driver."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from engine.cuda import instances, nvrtc
from tests.kernels.compiled_cache import copy_full_sm90_cache

ARCHS = (80, 86, 89, 90, 120)  # A100/RTX 30, RTX 30 laptop/A10, RTX 40/L4, H100/H200, RTX 50


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, int, float, bool]]]:
    """All files x all architectures compiled once per session (two processes) into a fresh cache. sm_90 comes
    from the process's `openjet-engine compile --arch 90` run (compiled_cache: the CLI's and setup's tests share
    it), whose entries are the ones nvrtc.compile_cached looks for; the other architectures are compiled here."""
    directory = copy_full_sm90_cache(tmp_path_factory.mktemp("kernel_cache") / "cache")
    return directory, nvrtc.compile_all(list(ARCHS), workers=2, directory=directory)


def test_nvrtc_knows_every_supported_architecture() -> None:
    assert set(ARCHS) <= set(nvrtc.supported_archs())


def test_every_file_compiles_for_every_architecture(kernel_cache) -> None:
    _, results = kernel_cache
    done = {(file, arch) for file, arch, _, _ in results}
    assert done == {(file, arch) for file in instances.files() for arch in ARCHS}


def test_every_instance_is_exported_from_its_cubin(kernel_cache) -> None:
    """Each instance's mangled symbol (from NVRTC's name expressions) is a function of the cubin."""
    directory, _ = kernel_cache
    for file, insts in instances.files().items():
        for arch in ARCHS:
            compiled = nvrtc.compile_cached(nvrtc.KERNEL_DIR / f"{file}.cu", arch, tuple(i.expr for i in insts),
                                            nvrtc.file_options(file, arch), directory=directory)
            assert compiled.from_cache, f"{file} sm_{arch} was not cached by the first compilation"
            assert compiled.image[:4] == b"\x7fELF", f"{file} sm_{arch}: not an ELF cubin"
            for inst in insts:
                symbol = compiled.symbols[inst.expr]
                assert symbol.encode() + b"\0" in compiled.image, f"{inst.name} ({symbol}) missing from sm_{arch}"


def test_instance_names_are_unique_and_follow_the_convention() -> None:
    names = list(instances.INSTANCES)
    assert len(names) == len(set(names))
    for inst in instances.INSTANCES.values():
        assert (nvrtc.KERNEL_DIR / f"{inst.file}.cu").is_file(), inst
        # <op>_<qtype>_<variant>: lower case, except the K of the K-quants (q4_K)
        assert re.fullmatch(r"[a-z0-9]+(_([a-z0-9]+|q\d_K))*", inst.name), inst.name


def test_compile_errors_carry_the_compiler_log(tmp_path: Path) -> None:
    bad = tmp_path / "broken.cu"
    bad.write_text('#include "common.cuh"\n__global__ void broken(float* x) { x[0] = undefined_name; }\n')
    with pytest.raises(nvrtc.KernelCompileError) as err:
        nvrtc.compile_file(bad, 90, ("broken",))
    assert "undefined_name" in str(err.value) and "broken.cu" in str(err.value)


def test_cache_key_covers_headers_options_and_arch(tmp_path: Path) -> None:
    """Editing an included header, changing an option or the architecture gives a different cache entry."""
    kernels = tmp_path / "kernels"
    shutil.copytree(nvrtc.KERNEL_DIR, kernels)
    source, exprs = kernels / "norm.cu", ("rms_norm",)
    base = nvrtc.source_digest(source, (), 90, exprs, kernels)
    assert base == nvrtc.source_digest(source, (), 90, exprs, kernels)
    assert base != nvrtc.source_digest(source, (), 80, exprs, kernels)
    assert base != nvrtc.source_digest(source, ("-DX=1",), 90, exprs, kernels)
    header = kernels / "common.cuh"
    header.write_text(header.read_text() + "\n// edited\n")
    assert base != nvrtc.source_digest(source, (), 90, exprs, kernels)


def test_cached_compile_returns_the_same_image(tmp_path: Path) -> None:
    file, insts = "norm", instances.files()["norm"]
    exprs = tuple(i.expr for i in insts)
    first = nvrtc.compile_cached(nvrtc.KERNEL_DIR / f"{file}.cu", 86, exprs, directory=tmp_path)
    second = nvrtc.compile_cached(nvrtc.KERNEL_DIR / f"{file}.cu", 86, exprs, directory=tmp_path)
    assert not first.from_cache and second.from_cache
    assert first.image == second.image and first.symbols == second.symbols


def test_ptx_for_gpus_newer_than_nvrtc(tmp_path: Path) -> None:
    """The forward-compatible path: PTX text with every instance's entry point."""
    insts = instances.files()["rope"]
    compiled = nvrtc.compile_cached(nvrtc.KERNEL_DIR / "rope.cu", 90, tuple(i.expr for i in insts), ptx=True,
                                    directory=tmp_path)
    text = compiled.image.decode(errors="replace")
    assert compiled.is_ptx and ".target sm_90" in text
    assert all(f".entry {compiled.symbols[i.expr]}" in text for i in insts)


def test_the_defines_knob_reaches_every_per_op_compile_and_refuses_a_bad_item(monkeypatch, tmp_path: Path) -> None:
    """OPENJET_CUDA_DEFINES: -D options for the per-op kernels (so a different cache entry); a malformed item is
    refused with the variable and the item named."""
    monkeypatch.delenv(nvrtc.DEFINES_ENV, raising=False)
    assert nvrtc.kernel_options() == ()
    monkeypatch.setenv(nvrtc.DEFINES_ENV, "WEIGHT_EVICT_FIRST=1, FLAG")
    assert nvrtc.kernel_options() == ("-DWEIGHT_EVICT_FIRST=1", "-DFLAG")
    monkeypatch.setenv(nvrtc.DEFINES_ENV, "WEIGHT_EVICT_FIRST=1")
    file, arch, _, cached = nvrtc._compile_job(("norm", 86, tuple(i.expr for i in instances.files()["norm"]), False,
                                                str(tmp_path)))
    assert not cached and len(list(tmp_path.glob("norm-sm86-*.cubin"))) == 1
    monkeypatch.delenv(nvrtc.DEFINES_ENV)
    nvrtc._compile_job(("norm", 86, tuple(i.expr for i in instances.files()["norm"]), False, str(tmp_path)))
    assert len(list(tmp_path.glob("norm-sm86-*.cubin"))) == 2  # another key without the define
    monkeypatch.setenv(nvrtc.DEFINES_ENV, "evict=1")
    with pytest.raises(ValueError, match="OPENJET_CUDA_DEFINES: 'evict=1'"):
        nvrtc.kernel_options()
