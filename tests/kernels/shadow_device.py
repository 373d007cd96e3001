"""A Device without a GPU: engine.cuda.device.Device's interface over made-up addresses, recording every launch.

The CUDA engine runs on it unchanged (CudaBackend.from_gguf(path, device=ShadowDevice())): weights are laid out and
"uploaded", passes are built, captured and replayed, and each kernel launch is kept with its arguments, grid, block
and shared memory, so a test can hold every launch against what the kernel it names declares
(tests/kernels/kernel_signatures.py). Nothing is computed: downloads read zeros. What a graph capture refuses on the
GPU (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: an allocation, a free, a synchronising copy or a wait for the stream
inside the capture) raises CaptureError here.
"""

from __future__ import annotations

import bisect
import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.cuda import instances
from engine.cuda.device import CudaError, Device, DeviceInfo, Kernel, _pdl_policy, dims3
from engine.cuda.memory import Buffer, DeviceMemory

# GPUs' figures as the driver reports them (the kernels' launchers size grids and shared memory from these).
H200 = DeviceInfo(index=0, name="NVIDIA H200", compute_capability=(9, 0), total_memory=150_000_000_000,
                  multiprocessors=132, l2_bytes=62_914_560, max_smem_per_block=232_448)
H100 = dataclasses.replace(H200, name="NVIDIA H100 80GB HBM3", total_memory=85_000_000_000, l2_bytes=52_428_800)
A100 = DeviceInfo(index=0, name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0), total_memory=85_000_000_000,
                  multiprocessors=108, l2_bytes=41_943_040, max_smem_per_block=166_912)
RTX_4090 = DeviceInfo(index=0, name="NVIDIA GeForce RTX 4090", compute_capability=(8, 9), total_memory=25_000_000_000,
                      multiprocessors=128, l2_bytes=75_497_472, max_smem_per_block=101_376)
DEFAULT_SMEM = 48 * 1024  # dynamic shared memory a kernel may take without cuFuncSetAttribute
ALIGN = 256  # cuMemAlloc's alignment


class CaptureError(CudaError):
    """A call the driver refuses while the stream is being captured."""


@dataclass(slots=True)
class Launch:
    """One recorded launch: the kernel's instance name and everything it was given."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Any, ...]
    smem: int
    smem_allowed: int  # the kernel's dynamic shared memory limit when it was launched
    live: bool  # every Buffer argument inside an allocation that was live then
    captured: bool


class ShadowMemory(DeviceMemory):
    """Allocations at increasing made-up addresses; freed ones stay known, so a launch can be told it used one."""

    def __init__(self, device: ShadowDevice):
        super().__init__(device)
        self.next_ptr = 1 << 32
        self.starts: list[int] = []  # the live allocations' addresses, ascending (each new one above the last)

    def alloc(self, nbytes: int, what: str) -> Buffer:
        self.device.refuse_in_capture(f"alloc {what}")
        buf = Buffer(self.next_ptr, int(nbytes), what)
        self.next_ptr += -(-max(int(nbytes), 1) // ALIGN) * ALIGN
        self.live[buf.ptr] = buf
        self.starts.append(buf.ptr)
        return buf

    def free(self, buf: Buffer) -> None:
        self.device.refuse_in_capture(f"free {buf.what}")
        assert not buf.is_view and buf.ptr in self.live, f"free of {buf.what!r}: not a live allocation"
        del self.live[buf.ptr]
        self.starts.pop(bisect.bisect_left(self.starts, buf.ptr))

    def free_all(self) -> None:
        self.live.clear()
        self.starts.clear()

    def holds(self, buf: Buffer) -> bool:
        """Whether buf lies inside one live allocation (the last one starting at or below it)."""
        i = bisect.bisect_right(self.starts, buf.ptr) - 1
        if i < 0:
            return False
        a = self.live[self.starts[i]]
        return buf.ptr + buf.nbytes <= a.ptr + a.nbytes


def patch_driver_calls(monkeypatch) -> None:
    """The driver calls the engine makes outside Device, for a ShadowDevice: tensor maps (a struct of zeros), the
    persistent kernel's capture query and its occupancy (one block an SM)."""
    from engine.cuda import persist, tma

    monkeypatch.setattr(tma, "_encode", lambda *args: tma.TensorMap())
    monkeypatch.setattr(persist, "_is_capturing", lambda dev: dev.capturing())
    monkeypatch.setattr(persist, "blocks_per_sm", lambda dev, kernel, threads, smem: 1)


class ShadowGraph:
    """A captured sequence (its launches were recorded as they were captured, marked so); a replay records nothing
    new."""

    def __init__(self, launches: list[Launch]):
        self.launches = launches

    def launch(self) -> None:
        pass

    def destroy(self) -> None:
        self.launches = []


class ShadowDevice(Device):
    """engine.cuda.device.Device on no GPU (see the module's docstring)."""

    def __init__(self, info: DeviceInfo = H200):  # no driver: none of Device.__init__ runs
        self.info = info
        self.memory = ShadowMemory(self)
        self.stream = "main"
        self._kernels: dict[str, Kernel] = {}
        self._smem_limits: dict[str, int] = {}
        self._graphs: list = []
        self._capturing: list[Launch] | None = None
        self._lane: int | None = None
        self.profile = None
        self.skip = None
        self.pdl_policy = _pdl_policy(info.arch)
        self.pdl = self.pdl_policy == "on"
        self.closed = False
        self.launches: list[Launch] = []

    def mem_info(self) -> tuple[int, int]:
        return self.info.total_memory - self.memory.allocated, self.info.total_memory

    def kernel(self, name: str) -> Kernel:
        if name not in instances.INSTANCES:
            raise CudaError(f"unknown kernel instance {name!r}")
        return self._kernels.setdefault(name, Kernel(name, None))

    def load_all(self, workers: int | None = None) -> None:
        pass

    def set_max_dynamic_smem(self, kernel: Kernel, nbytes: int) -> None:
        if nbytes > self.info.max_smem_per_block:
            raise CudaError(f"cuFuncSetAttribute({kernel.name}) failed: {nbytes} bytes of dynamic shared memory, "
                            f"the GPU allows {self.info.max_smem_per_block}")
        self._smem_limits[kernel.name] = max(self._smem_limits.get(kernel.name, 0), int(nbytes))

    def launch(self, kernel: Kernel, grid, block, args, smem: int = 0) -> None:
        grid3, block3 = dims3(grid), dims3(block)
        assert min(grid3) > 0, f"{kernel.name}: empty grid {grid3}"
        live = all(self.memory.holds(a) for a in args if isinstance(a, Buffer))
        record = Launch(kernel.name, grid3, block3, tuple(args), int(smem),
                        max(DEFAULT_SMEM, self._smem_limits.get(kernel.name, 0)), live,
                        self._capturing is not None)
        self.launches.append(record)
        if self._capturing is not None:
            self._capturing.append(record)

    @contextmanager
    def beside(self, lane: int = 0):
        assert self._lane is None, "beside() does not nest"
        self._lane = lane
        try:
            yield
        finally:
            self._lane = None

    @property
    def side_active(self) -> bool:
        return self._lane is not None

    def join(self, lane: int = 0) -> None:
        pass

    def refuse_in_capture(self, what: str) -> None:
        if self._capturing is not None:
            raise CaptureError(f"{what} inside a graph capture")

    def upload(self, buf: Buffer, array: np.ndarray, offset: int = 0) -> None:
        self.refuse_in_capture(f"upload {buf.what}")  # (Device.upload synchronises)
        nbytes = np.asarray(array).nbytes
        assert offset + nbytes <= buf.nbytes, f"{buf.what}: {nbytes} bytes do not fit at {offset}"

    def download(self, buf: Buffer, dtype: Any, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
        self.refuse_in_capture(f"download {buf.what}")
        out = np.zeros(shape, dtype)
        assert offset + out.nbytes <= buf.nbytes, f"{buf.what}: read past the end"
        return out

    def fill_u32(self, buf: Buffer, value: int, count: int | None = None) -> None:
        assert (buf.nbytes // 4 if count is None else count) * 4 <= buf.nbytes, f"fill past {buf.what}"

    def copy(self, dst: Buffer, src: Buffer, nbytes: int) -> None:
        assert nbytes <= dst.nbytes and nbytes <= src.nbytes, f"copy of {nbytes} bytes {src.what} -> {dst.what}"

    def synchronize(self) -> None:
        self.refuse_in_capture("synchronize")

    @contextmanager
    def capture(self):
        assert self._capturing is None, "captures do not nest"
        self._capturing, holder = [], []
        try:
            yield holder
        finally:
            graph = ShadowGraph(self._capturing)
            self._capturing = None
            holder.append(graph)
            self._graphs.append(graph)

    def capturing(self) -> bool:
        """Whether launches go into a graph now (persist.py asks the driver's stream for this)."""
        return self._capturing is not None

    def close(self) -> None:
        self.memory.free_all()
        self._graphs, self.closed = [], True
