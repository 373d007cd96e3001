"""choose_rows' GPU checks (bench/gpu_ops.py check_choose_rows, bench/gpu_penalties.py check_choose_penalised)
without a GPU: the whole checks run on a device that keeps its buffers in host memory and answers choose_rows and
the penalties' kernels with their numpy models (tests/kernels/choose_rows_model.py, penalties_model.py), so what the
GPU call spends its time on cannot stop on a Python error, passes kernels that choose as the models do, and fails
one that drops top_k, top_p or the penalties."""

from __future__ import annotations

import numpy as np

from bench import gpu_ops, gpu_penalties
from bench.gpu_common import Report
from engine.cuda import ops
from tests.bench.host_device import HostDevice
from tests.kernels import choose_rows_model, penalties_model


class _ChoosingDevice(HostDevice):
    """HostDevice whose choose_rows, penalty_count and penalize_rows launches run the kernels' numpy models on the
    buffers they name; `uploads` records (buffer, bytes) of the host's uploads (not the models' writes)."""

    def __init__(self, drop: str = "") -> None:
        super().__init__()
        self.drop = drop  # "top_k", "top_p" or "penalties": a kernel that ignores it
        self.uploads: list[tuple[str, int]] = []
        self._in_kernel = False

    def upload(self, buf, array: np.ndarray, offset: int = 0) -> None:
        if not self._in_kernel:
            self.uploads.append((buf.what, np.asarray(array).nbytes))
        super().upload(buf, array, offset)

    def launch(self, kernel, grid, block, args, smem: int = 0) -> None:
        super().launch(kernel, grid, block, args, smem)
        self._in_kernel = True
        try:
            if kernel.name == "choose_rows":
                self._choose_rows(grid, args)
            elif kernel.name in ("choose_top", "choose_weigh"):  # their parts: choose_rows' model takes spread=True
                assert grid[1] == ops.CHOOSE_CHUNKS and args[-1].nbytes >= grid[0] * ops.CHOOSE_PARTS_BYTES
            elif not (kernel.name == "penalize_rows" and self.drop == "penalties"):
                penalties_model.launch(self, kernel.name, grid, args)
        finally:
            self._in_kernel = False

    def _choose_rows(self, grid: int, args: list) -> None:
        logits, vocab, ld, drafts, uniforms, temperature, min_p, top_k, top_p, greedy, parts, out = args
        if parts is not None:  # the spread form: its passes launched first, a sampled row's weighing among them
            wanted = ["choose_top"] + (["choose_weigh"] if not greedy else []) + ["choose_rows"]
            assert self.launched[-len(wanted):] == wanted, self.launched[-3:]
        rows = self.download(logits, np.float32, (grid, ld))[:, :vocab]
        got = choose_rows_model.choose_rows(
            rows, self.download(drafts, np.int32, (grid,)), self.download(uniforms, np.float64, (grid, 2)),
            temperature, min_p, 0 if self.drop == "top_k" else top_k, 1.0 if self.drop == "top_p" else top_p.value,
            bool(greedy), spread=parts is not None)
        self.upload(out, got)


TRIALS = 6  # sets of uniforms a case: enough that a kernel without top_p draws outside its set in either form


def _run(dev: _ChoosingDevice) -> dict[str, bool]:
    report = Report()
    gpu_ops.check_choose_rows(dev, report, np.random.default_rng(2), vocab=8192, trials=TRIALS)
    assert all(c.op == "choose_rows" for c in report.checks)
    return {c.variant: c.ok for c in report.checks}


def test_the_check_passes_a_kernel_that_chooses_as_the_model_does() -> None:
    dev = _ChoosingDevice()
    results = _run(dev)
    assert dev.launched.count("choose_rows") == 2 * (1 + TRIALS * (len(gpu_ops.CHOOSE_CASES) + 1) + 2)  # both forms
    names = {"greedy", "t0.6.k20.p0.95.minp0.0", "t0.7.k0.p0.8.minp0.0", "t1.0.k1.p1.0.minp0.0",
             "t1.0.k50.p1.0.minp0.05", "flat.t0.6.k20.p0.95.minp0.0", "flat.p0.95", "nan,-inf,+inf"}
    assert set(results) >= names | {f"spread.{name}" for name in names}
    assert all(results.values()), results


def test_the_check_fails_a_kernel_without_top_k_or_top_p() -> None:
    for form in ("", "spread."):
        results = _run(_ChoosingDevice(drop="top_k"))
        assert not results[f"{form}t1.0.k1.p1.0.minp0.0"] and not results[f"{form}flat.t0.6.k20.p0.95.minp0.0"]
        assert results[f"{form}t1.0.k0.p1.0.minp0.0"]
        results = _run(_ChoosingDevice(drop="top_p"))
        assert not results[f"{form}t0.7.k0.p0.8.minp0.0"] and not results[f"{form}flat.p0.95"]


def _run_penalised(dev: _ChoosingDevice) -> dict[str, bool]:
    report = Report()
    gpu_penalties.check_choose_penalised(dev, report, np.random.default_rng(3), vocab=8192, trials=3,
                                         prompt_len=3000)
    return {f"{c.op}:{c.variant}": c.ok for c in report.checks}


def test_the_penalised_check_passes_kernels_that_penalise_as_the_models_do() -> None:
    """Every case of the penalties' GPU check, on the kernels' numpy models: the incremental marks, each case's
    penalised logits bit for bit, greedy exactly and the sampled rows as the host chooses them."""
    dev = _ChoosingDevice()
    results = _run_penalised(dev)
    cases = 1 + len(gpu_penalties.PENALTY_CASES)
    assert dev.launched.count("penalty_count") == 1 and dev.launched.count("penalize_rows") == cases
    assert dev.launched.count("choose_rows") == 2 * (1 + 3 * len(gpu_penalties.PENALTY_CASES))  # both forms
    assert len(results) == 1 + 3 * cases and all(results.values()), results
    assert "choose_rows:greedy.t0.r1.3.f0.5.pp1.5" not in results  # the name carries every parameter
    assert {"choose_rows:greedy.t0.k0.p1.0.minp0.0.r1.3.f0.5.pp1.5",
            "choose_rows:spread.greedy.t0.k0.p1.0.minp0.0.r1.3.f0.5.pp1.5"} <= set(results)


def test_the_penalised_check_fails_a_kernel_that_leaves_the_logits_alone() -> None:
    results = _run_penalised(_ChoosingDevice(drop="penalties"))
    assert results["penalty_count:incremental"]
    failed = {name for name, ok in results.items() if not ok}
    assert {name for name in results if name.startswith("penalize_rows:")} <= failed
    assert "choose_rows:greedy.t0.k0.p1.0.minp0.0.r1.3.f0.5.pp1.5" in failed  # the penalties move the argmax
    assert "choose_rows:spread.greedy.t0.k0.p1.0.minp0.0.r1.3.f0.5.pp1.5" in failed
    assert sum(name.startswith("choose_rows:t") for name in failed) >= 3
    assert sum(name.startswith("choose_rows:spread.t") for name in failed) >= 3
