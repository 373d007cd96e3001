"""A device for the GPU checks' own tests: buffers in host memory at made-up addresses, so a check's uploads,
downloads and fills work on the CPU; kernels are looked up and launched as nothing (a subclass may run a kernel's
numpy model in launch: tests/bench/test_gpu_choose.py)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np

from engine.cuda.memory import Buffer


class HostDevice:
    """Buffers in host memory at made-up addresses; kernels are looked up and launched as nothing."""

    def __init__(self) -> None:
        self.info = SimpleNamespace(name="NVIDIA H100 80GB HBM3",
                                    arch=90, max_smem_per_block=232448, multiprocessors=132)
        self.memory = SimpleNamespace(free=lambda buf: None)
        self.pdl, self.skip, self._next, self._mem = False, None, 1 << 32, {}
        self.launched: list[str] = []

    def alloc(self, nbytes: int, what: str) -> Buffer:
        ptr, self._next = self._next, self._next + (nbytes + 4095) // 4096 * 4096 + 4096
        self._mem[ptr] = np.zeros(nbytes, np.uint8)
        return Buffer(ptr, nbytes, what)

    def _bytes(self, buf: Buffer) -> np.ndarray:
        base = max(p for p in self._mem if p <= buf.ptr)
        return self._mem[base][buf.ptr - base:buf.ptr - base + buf.nbytes]

    def upload(self, buf: Buffer, array: np.ndarray, offset: int = 0) -> None:
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        self._bytes(buf)[offset:offset + raw.size] = raw

    def to_device(self, array: np.ndarray, what: str) -> Buffer:
        buf = self.alloc(array.nbytes, what)
        self.upload(buf, array)
        return buf

    def download(self, buf: Buffer, dtype, shape, offset: int = 0) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        assert offset + n <= buf.nbytes, f"{buf.what}: read past the end"
        return self._bytes(buf)[offset:offset + n].view(dtype).reshape(shape).copy()

    def fill_u32(self, buf: Buffer, value: int, count: int | None = None) -> None:
        words = self._bytes(buf)[: (buf.nbytes // 4) * 4].view(np.uint32)
        words[: count if count is not None else words.size] = value & 0xFFFFFFFF

    def kernel(self, name: str) -> SimpleNamespace:
        from engine.cuda import instances

        assert name in instances.INSTANCES, f"no instance {name}"
        return SimpleNamespace(name=name)

    def set_max_dynamic_smem(self, kernel, nbytes: int) -> None:
        assert nbytes <= self.info.max_smem_per_block, (kernel.name, nbytes)

    def launch(self, kernel, grid, block, args, smem: int = 0) -> None:
        self.launched.append(kernel.name)

    def join(self) -> None:
        pass

    @contextmanager
    def beside(self):
        yield
