"""The CUDA driver API (cuda.bindings.driver, imported on first use) and the errors its calls end in.

check() unpacks a call's (CUresult, *values) and turns a failure into a CudaError naming the call: the errors a user
can act on have types of their own (NoGpuError, UnsupportedGpuError, DeviceOutOfMemoryError). Device
(engine/cuda/device.py) owns what the driver creates; its memory, the tensor maps and the persistent kernel's
occupancy query call the driver through here too.
"""

from __future__ import annotations

from typing import Any

from engine.errors import EngineError


class CudaError(EngineError):
    """A CUDA driver call failed."""


class NoGpuError(CudaError):
    """No usable NVIDIA driver or device on this machine."""


class UnsupportedGpuError(CudaError):
    """A GPU the engine's kernels do not support (compute capability below 8.0)."""


class DeviceOutOfMemoryError(CudaError):
    """A device allocation did not fit in the GPU's free memory."""


def driver():
    """cuda.bindings.driver, imported on first use."""
    from cuda.bindings import driver as bindings

    return bindings


def check(result: tuple, what: str) -> Any:
    """Unpack a driver call's (CUresult, *values); raise CudaError naming the call on failure."""
    drv = driver()
    err, values = result[0], result[1:]
    if err != drv.CUresult.CUDA_SUCCESS:
        _, name = drv.cuGetErrorName(err)
        _, text = drv.cuGetErrorString(err)
        message = f"{what} failed: {(name or b'?').decode()} ({(text or b'').decode()})"
        if err == drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise DeviceOutOfMemoryError(message)
        raise CudaError(message)
    if not values:
        return None
    return values[0] if len(values) == 1 else values
