"""Checks of the non-matmul kernels against engine/reference/ops.py at the 27B shapes (fresh random inputs,
NaN-poisoned outputs)."""

from __future__ import annotations

import numpy as np

from bench.gpu_common import TOL_F16, Report, compare, poison
from engine.cuda import ops
from engine.cuda.device import Device

H = 5120


def check_act_f16(dev: Device, report: Report, rng: np.random.Generator, num_tokens: int = 5, k: int = H) -> None:
    """f32 -> f16 activations and their 32-wide sub-block sums."""
    act = ops.alloc_act(dev, num_tokens, k, "x")
    x = rng.standard_normal((num_tokens, k), dtype=np.float32)
    dev.upload(act.f32, x)
    poison(dev, act.x16)
    poison(dev, act.sums)
    ops.act_f16(dev, act.f32, act, num_tokens, k, act.ld)
    x16 = dev.download(act.x16, np.float16, (num_tokens, act.ld))[:, :k]
    sums = dev.download(act.sums, np.float16, (num_tokens, act.ld // 32))[:, : k // 32]
    compare(report, "act_f16", "x", x16.astype(np.float32), x, 1e-3)
    compare(report, "act_f16", "sums", sums.astype(np.float32), x.reshape(num_tokens, -1, 32).sum(-1), TOL_F16)
    for buf in (act.x16, act.sums, act.f32):
        dev.memory.free(buf)


def run_op_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """Every non-matmul kernel."""
    print("op checks (27B shapes)", flush=True)
    check_act_f16(dev, report, rng)
