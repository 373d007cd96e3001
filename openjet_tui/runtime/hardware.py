"""What the machine has: NVIDIA GPUs through NVML (nvidia-ml-py), CPU cores, memory, nvcc. No GPU is a normal answer."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pynvml

# The engine's CUDA paths (per-op and megakernel) target sm_80 and newer.
MIN_COMPUTE_CAPABILITY = (8, 0)


@dataclass(slots=True)
class GpuInfo:
    """One NVIDIA GPU as NVML reports it."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    vram_total: int
    vram_free: int

    @property
    def sm(self) -> str:
        """The architecture name NVRTC compiles for, e.g. sm_90."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    @property
    def is_supported(self) -> bool:
        """Whether the engine's CUDA backends can run on this GPU (sm_80 or newer)."""
        return self.compute_capability >= MIN_COMPUTE_CAPABILITY


@dataclass(slots=True)
class HardwareInfo:
    """Everything engine selection needs to know about the machine."""

    gpus: list[GpuInfo] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None
    nvml_error: str | None = None
    num_cpus: int = 1
    ram_total: int = 0
    ram_available: int = 0
    nvcc_path: str | None = None

    @property
    def has_gpu(self) -> bool:
        """Whether at least one NVIDIA GPU was found."""
        return bool(self.gpus)

    def best_gpu(self) -> GpuInfo | None:
        """The supported GPU with the most free VRAM, else None."""
        supported = [gpu for gpu in self.gpus if gpu.is_supported]
        return max(supported, key=lambda gpu: gpu.vram_free, default=None)

    def gpu_summary(self) -> str:
        """One line on the GPUs, or why there are none."""
        if not self.gpus:
            return f"no NVIDIA GPU: {self.nvml_error or 'NVML reports no devices'}"
        names = ", ".join(f"{g.name} ({g.sm}, {g.vram_free / 2**30:.1f}/{g.vram_total / 2**30:.1f} GiB free)"
                          for g in self.gpus)
        return f"{names}; driver {self.driver_version}, CUDA {self.cuda_version}"


@dataclass(slots=True)
class GpuSample:
    """Live figures for the engine panel."""

    index: int
    name: str
    utilization_pct: int
    vram_used: int
    vram_total: int
    temperature_c: int | None
    power_w: float | None


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes for names and versions.
    return value.decode() if isinstance(value, bytes) else value


def format_cuda_version(encoded: int) -> str:
    """NVML encodes the driver's CUDA version as 1000 * major + 10 * minor (13000 -> '13.0')."""
    if encoded <= 0:
        raise ValueError(f"invalid CUDA driver version {encoded}")
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def describe_nvml_error(error: pynvml.NVMLError) -> str:
    """A sentence for a person about why NVML could not answer."""
    if isinstance(error, pynvml.NVMLError_LibraryNotFound):
        return "the NVIDIA driver library (libnvidia-ml) is not installed"
    if isinstance(error, pynvml.NVMLError_DriverNotLoaded):
        return "the NVIDIA driver is installed but not loaded"
    if isinstance(error, pynvml.NVMLError_NoPermission):
        return "no permission to query the NVIDIA driver"
    return f"NVML failed: {error}"


@contextmanager
def nvml_session() -> Iterator[None]:
    """nvmlInit/nvmlShutdown around a block; raises pynvml.NVMLError when there is no usable driver."""
    pynvml.nvmlInit()
    try:
        yield
    finally:
        pynvml.nvmlShutdown()


def _read_gpu(index: int) -> GpuInfo:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    return GpuInfo(index=index, name=_text(pynvml.nvmlDeviceGetName(handle)),
                   compute_capability=(int(major), int(minor)),
                   vram_total=int(memory.total), vram_free=int(memory.free))


def _read_memory() -> tuple[int, int]:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    available = total
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass  # not Linux: total is the best estimate there is
    return total, available


def probe_hardware() -> HardwareInfo:
    """Probe GPUs (NVML), CPU, memory and nvcc; never raises for a machine without a GPU or driver."""
    ram_total, ram_available = _read_memory()
    info = HardwareInfo(num_cpus=os.cpu_count() or 1, ram_total=ram_total, ram_available=ram_available,
                        nvcc_path=shutil.which("nvcc"))
    try:
        with nvml_session():
            info.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
            info.cuda_version = format_cuda_version(pynvml.nvmlSystemGetCudaDriverVersion())
            info.gpus = [_read_gpu(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as error:
        info.nvml_error = describe_nvml_error(error)
    return info


def _sample_one(index: int) -> GpuSample:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        temperature: int | None = int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
    except pynvml.NVMLError:
        temperature = None  # some boards do not expose a sensor
    try:
        power: float | None = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts -> watts
    except pynvml.NVMLError:
        power = None
    return GpuSample(index=index, name=_text(pynvml.nvmlDeviceGetName(handle)),
                     utilization_pct=int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                     vram_used=int(memory.used), vram_total=int(memory.total),
                     temperature_c=temperature, power_w=power)


def sample_gpus() -> list[GpuSample]:
    """Live utilisation, VRAM, temperature and power of every GPU; [] when NVML is unavailable."""
    try:
        with nvml_session():
            return [_sample_one(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError:
        return []
