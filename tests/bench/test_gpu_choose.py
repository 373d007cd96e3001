"""choose_rows' GPU check (bench/gpu_ops.py check_choose_rows) without a GPU: the whole check run on a device that
keeps its buffers in host memory and answers choose_rows with the kernel's numpy model (tests/kernels/
choose_rows_model.py), so what the GPU call spends its time on cannot stop on a Python error, passes a kernel that
chooses as the model does, and fails one that drops top_k or top_p."""

from __future__ import annotations

import numpy as np

from bench import gpu_ops
from bench.gpu_common import Report
from tests.bench.test_gpu_close import _HostDevice
from tests.kernels import choose_rows_model


class _ChoosingDevice(_HostDevice):
    """_HostDevice whose choose_rows launches run the kernel's numpy model on the buffers they name."""

    def __init__(self, drop: str = "") -> None:
        super().__init__()
        self.drop = drop  # "top_k" or "top_p": a kernel that ignores it

    def launch(self, kernel, grid, block, args, smem: int = 0) -> None:
        super().launch(kernel, grid, block, args, smem)
        if kernel.name != "choose_rows":
            return
        logits, vocab, ld, drafts, uniforms, temperature, min_p, top_k, top_p, greedy, out = args
        rows = self.download(logits, np.float32, (grid, ld))[:, :vocab]
        got = choose_rows_model.choose_rows(
            rows, self.download(drafts, np.int32, (grid,)), self.download(uniforms, np.float64, (grid, 2)),
            temperature, min_p, 0 if self.drop == "top_k" else top_k, 1.0 if self.drop == "top_p" else top_p.value,
            bool(greedy))
        self.upload(out, got)


def _run(dev: _ChoosingDevice) -> dict[str, bool]:
    report = Report()
    gpu_ops.check_choose_rows(dev, report, np.random.default_rng(2), vocab=8192, trials=3)
    assert all(c.op == "choose_rows" for c in report.checks)
    return {c.variant: c.ok for c in report.checks}


def test_the_check_passes_a_kernel_that_chooses_as_the_model_does() -> None:
    dev = _ChoosingDevice()
    results = _run(dev)
    assert dev.launched.count("choose_rows") == 1 + 3 * (len(gpu_ops.CHOOSE_CASES) + 1) + 2
    assert set(results) >= {"greedy", "t0.6.k20.p0.95.minp0.0", "t0.7.k0.p0.8.minp0.0", "t1.0.k1.p1.0.minp0.0",
                            "t1.0.k50.p1.0.minp0.05", "flat.t0.6.k20.p0.95.minp0.0", "flat.p0.95", "nan,-inf,+inf"}
    assert all(results.values()), results


def test_the_check_fails_a_kernel_without_top_k_or_top_p() -> None:
    results = _run(_ChoosingDevice(drop="top_k"))
    assert not results["t1.0.k1.p1.0.minp0.0"] and not results["flat.t0.6.k20.p0.95.minp0.0"]
    assert results["t1.0.k0.p1.0.minp0.0"]
    results = _run(_ChoosingDevice(drop="top_p"))
    assert not results["t0.7.k0.p0.8.minp0.0"] and not results["flat.p0.95"]
