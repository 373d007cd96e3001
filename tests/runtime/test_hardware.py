"""Hardware probing: a machine without a driver or GPU is a normal answer with its reason."""

from __future__ import annotations

import pynvml
import pytest

from openjet_tui.runtime.hardware import (
    GpuInfo, HardwareInfo, describe_nvml_error, format_cuda_version, probe_hardware, sample_gpus,
)


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


HAS_NVML = _nvml_works()


def test_probe_never_raises_and_reports_cpu_and_memory():
    info = probe_hardware()
    assert info.num_cpus >= 1
    assert 0 < info.ram_available <= info.ram_total
    if not HAS_NVML:
        assert info.gpus == [] and not info.has_gpu
        assert info.nvml_error and "NVIDIA driver" in info.nvml_error
        assert info.gpu_summary().startswith("no NVIDIA GPU: ")
        assert info.best_gpu() is None


@pytest.mark.skipif(HAS_NVML, reason="needs a machine without the NVIDIA driver")
def test_no_driver_is_library_not_found_and_sampling_is_empty():
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    assert sample_gpus() == []


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_NVML, reason="needs an NVIDIA driver")
def test_gpu_machine_reports_every_field():
    info = probe_hardware()
    assert info.gpus and info.driver_version and info.cuda_version
    for gpu in info.gpus:
        assert gpu.name and gpu.compute_capability >= (3, 0) and 0 < gpu.vram_free <= gpu.vram_total
    samples = sample_gpus()
    assert len(samples) == len(info.gpus) and all(0 <= s.utilization_pct <= 100 for s in samples)


def test_cuda_version_decoding():
    assert format_cuda_version(13000) == "13.0"
    assert format_cuda_version(12040) == "12.4"
    with pytest.raises(ValueError):
        format_cuda_version(0)


def test_nvml_errors_become_sentences():
    assert "not installed" in describe_nvml_error(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert "not loaded" in describe_nvml_error(pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))


def test_best_gpu_skips_unsupported_architectures():
    old = GpuInfo(0, "Tesla T4", (7, 5), 16 << 30, 15 << 30)
    new = GpuInfo(1, "RTX 3090", (8, 6), 24 << 30, 23 << 30)
    small = GpuInfo(2, "RTX 3060", (8, 6), 12 << 30, 11 << 30)
    info = HardwareInfo(gpus=[old, small, new])
    assert info.best_gpu() is new and new.sm == "sm_86" and not old.is_supported
    assert HardwareInfo(gpus=[old]).best_gpu() is None
