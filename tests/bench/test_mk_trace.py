"""bench/mk_trace.py: the greedy traces the 27B check compares (a megakernel backend on the VM against the reference on
a tiny qwen35), and the report of where two runs part, which must tell a near-tie from a fault."""

from __future__ import annotations

import numpy as np

from bench.mk_trace import Trace, compare_runs, describe, trace_host, trace_megakernel, wide_config
from engine.cuda.megakernel.backend import MegakernelBackend
from engine.cuda.megakernel.schedule import ScheduleConfig
from engine.reference.backend import ReferenceBackend

PROMPT = [11, 201, 35, 90, 400, 17]


def test_a_megakernel_trace_on_the_vm_equals_the_reference_trace(tiny_model_path) -> None:
    path = tiny_model_path("qwen35", tokenizer=False, vocab_size=512)
    ref = trace_host(ReferenceBackend.from_gguf(path, context_size=512), "reference", PROMPT, 12, chunk=2)
    vm = MegakernelBackend.on_vm(path, context_size=512, config=ScheduleConfig(num_sms=3, attn_splits=2))
    mk = trace_megakernel(vm, "vm", PROMPT, 12)
    assert vm.launches["cycle"] == 1 + 12  # one prefill launch, then one launch per token at d = 0
    assert len(mk.logits) == 12 and mk.logits[0].shape == (512,)
    report = compare_runs(mk, ref)
    assert report["equal"] and report["first_difference"] == 12
    assert 0 < report["max_abs_dlogit_before"] < 1e-3  # float32 rounding, not zero: two real computations


def _traces(rows: list[np.ndarray], other: list[np.ndarray]) -> tuple[Trace, Trace]:
    """Two traces choosing the argmax of their rows."""
    return (Trace("a", [int(np.argmax(r)) for r in rows], rows),
            Trace("b", [int(np.argmax(r)) for r in other], other))


def test_a_flip_within_the_noise_is_a_near_tie() -> None:
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(64).astype(np.float32) * 4 for _ in range(5)]
    other = [r + rng.standard_normal(64).astype(np.float32) * 1e-3 for r in rows]
    best, second = np.argsort(rows[3])[-2:][::-1]
    rows[3][second] = rows[3][best] - 1e-3  # a's top-2 gap at 3 is 0.001 ...
    other[3] = rows[3].copy()
    other[3][second] += 2e-3  # ... and b puts the second ahead by 0.001
    a, b = _traces(rows, other)
    report = compare_runs(a, b)
    assert report["first_difference"] == 3 and report["near_tie"]
    assert report["a"]["tokens"] == [best, second] and report["b"]["tokens"] == [second, best]
    assert "a near-tie" in describe(report)


def test_a_confident_disagreement_is_a_fault() -> None:
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal(64).astype(np.float32) * 4 for _ in range(4)]
    other = [r.copy() for r in rows]
    other[2] = rng.standard_normal(64).astype(np.float32) * 4  # a different computation from position 2 on
    a, b = _traces(rows, other)
    report = compare_runs(a, b)
    assert report["first_difference"] == 2 and not report["near_tie"]
    assert report["max_abs_dlogit_before"] == 0.0 and "NOT a near-tie" in describe(report)


def test_the_wide_config_keeps_every_width_of_the_27b_shape() -> None:
    from engine.model.config import qwen38_27b_config

    wide, full = wide_config(), qwen38_27b_config()
    assert wide.num_layers == 4 and wide.layer_kinds.count("attention") == 1
    for name in ("hidden_size", "ffn_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim", "rope_dim",
                 "ssm_num_k_heads", "ssm_num_v_heads", "ssm_head_dim", "ssm_inner_size", "num_nextn_layers"):
        assert getattr(wide, name) == getattr(full, name), name
