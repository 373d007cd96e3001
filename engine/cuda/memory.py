"""Device memory of one Device: Buffers (allocations and views into them) and the DeviceMemory that owns them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.cuda.device import Device


@dataclass(slots=True)
class Buffer:
    """A range of device memory. Views share their parent's allocation and are never freed on their own."""

    ptr: int
    nbytes: int
    what: str = ""
    is_view: bool = False

    def view(self, offset: int, nbytes: int | None = None, what: str = "") -> Buffer:
        """A sub-range [offset, offset + nbytes) of this buffer."""
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        assert 0 <= offset and offset + nbytes <= self.nbytes, f"view {offset}+{nbytes} outside {self.nbytes} bytes"
        return Buffer(self.ptr + offset, nbytes, what or self.what, is_view=True)


@dataclass(slots=True)
class DeviceMemory:
    """Every allocation of one Device, freed together by free_all()."""

    device: Device
    live: dict[int, Buffer] = field(default_factory=dict)

    @property
    def allocated(self) -> int:
        """Bytes currently held."""
        return sum(b.nbytes for b in self.live.values())

    def alloc(self, nbytes: int, what: str) -> Buffer:
        """Allocate nbytes (at least 1) of device memory; DeviceOutOfMemoryError says what did not fit."""
        from engine.cuda.driver import DeviceOutOfMemoryError, check, driver

        drv = driver()
        nbytes = max(int(nbytes), 1)
        err, ptr = drv.cuMemAlloc(nbytes)
        if err == drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            free, total = self.device.mem_info()
            raise DeviceOutOfMemoryError(
                f"out of GPU memory allocating {what}: {nbytes / 2**20:.1f} MiB requested, "
                f"{free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB ({self.allocated / 2**20:.0f} MiB held "
                f"by this engine)")
        check((err,), f"cuMemAlloc({what}, {nbytes})")
        buf = Buffer(int(ptr), nbytes, what)
        self.live[buf.ptr] = buf
        return buf

    def free(self, buf: Buffer) -> None:
        """Free one allocation (views cannot be freed)."""
        from engine.cuda.driver import check, driver

        assert not buf.is_view and buf.ptr in self.live, f"{buf.what}: not an allocation of this device"
        del self.live[buf.ptr]
        check(driver().cuMemFree(buf.ptr), f"cuMemFree({buf.what})")

    def free_all(self) -> None:
        """Free everything still held."""
        for buf in list(self.live.values()):
            self.free(buf)
