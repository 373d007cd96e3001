"""The ctypes mirrors of the structs kernels take by value have the C structs' layout: NVRTC itself checks each
field's offset and each struct's size (static_asserts compiled against the kernel sources), so a field added on one
side only fails here instead of shifting every later field on the GPU."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from engine.cuda import instances, mixers, nvrtc, ops, tma
from tests.kernels import kernel_signatures as ks

# C struct -> (the file that defines it, its ctypes mirror)
MIRRORS: dict[str, tuple[str, type[ctypes.Structure]]] = {
    "ActSrc": ("act.cu", ops.ActSrc),
    "Act8": ("act.cu", ops.Act8),
    "AttnArgs": ("attention.cuh", mixers.AttnArgs),
    "QkPrep": ("attention.cu", mixers.QkPrep),
    "GdnArgs": ("deltanet.cu", mixers.GdnArgs),
    "GdnLayer": ("deltanet.cu", mixers.GdnLayer),
    "GdnChunkArgs": ("deltanet_chunked.cu", mixers.GdnChunkArgs),
    "TensorMap": ("tma.cuh", tma.TensorMap),
}


def _asserts(c_name: str, mirror: type[ctypes.Structure]) -> list[str]:
    lines = [f'static_assert(sizeof({c_name}) == {ctypes.sizeof(mirror)}, "{c_name}: size");']
    for field, *_ in mirror._fields_:
        offset = getattr(mirror, field).offset
        lines.append(f'static_assert(__builtin_offsetof({c_name}, {field}) == {offset}, "{c_name}.{field}: offset");')
    return lines


def test_every_struct_a_kernel_takes_has_a_mirror() -> None:
    taken = {p.kind[7:] for name in instances.INSTANCES for p in ks.signature(name).params
             if p.kind.startswith("struct:")}
    assert taken <= set(MIRRORS), f"no mirror listed for {sorted(taken - set(MIRRORS))}"


def test_mirrors_have_the_c_layout(tmp_path: Path) -> None:
    files = sorted({file for file, _ in MIRRORS.values()})
    lines = [*(f'#include "{file}"' for file in files)]
    for c_name, (_, mirror) in MIRRORS.items():
        lines += _asserts(c_name, mirror)
    source = tmp_path / "mirrors.cu"
    source.write_text("\n".join(lines) + "\n")
    nvrtc.compile_file(source, 90, (), nvrtc.file_options("mmvq_i8b", 90, True), ptx=True)


def test_a_mirror_that_drifts_fails_to_compile(tmp_path: Path) -> None:
    class Shifted(ctypes.Structure):  # Act8 with two fields swapped
        _fields_ = [(n, ctypes.c_uint64) for n in ("q", "sums", "scale", "sums_lo")]

    source = tmp_path / "drift.cu"
    source.write_text("\n".join(['#include "act.cu"', *_asserts("Act8", Shifted)]) + "\n")
    with pytest.raises(nvrtc.KernelCompileError, match=r"Act8.sums: offset"):
        nvrtc.compile_file(source, 90, (), nvrtc.file_options("act", 90, True), ptx=True)
