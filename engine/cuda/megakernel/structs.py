"""ctypes mirrors of the structures the megakernel receives (globals.cuh: WeightRef, ActRef, LayerRefs, Globals),
field for field in declaration order (tests/kernels/test_megakernel_compile.py compares the two)."""

from __future__ import annotations

import ctypes

from engine.cuda.megakernel.errors import MegakernelError
from engine.cuda.megakernel.layout import LS, LV, LW

u64, i32, f32 = ctypes.c_uint64, ctypes.c_int32, ctypes.c_float


class WeightRef(ctypes.Structure):
    """Rows [row_offset, row_offset + rows) of a weight in the device layout."""

    _fields_ = [("ptr", u64), ("qtype", i32), ("rows_total", i32), ("cols", i32), ("row_offset", i32),
                ("rows", i32), ("pad", i32)]


class ActRef(ctypes.Structure):
    """A matmul input in the act layout: hi, sums, lo, sums of lo; the int8 copy (null where the act has none);
    width and superblocks."""

    _fields_ = [("x16", u64), ("sums", u64), ("x16_lo", u64), ("sums_lo", u64), ("q8", u64), ("scale8", u64),
                ("sums8", u64), ("sums8_lo", u64), ("fill", u64), ("width", i32), ("nsb", i32),
                ("in_smem", i32)]


class LayerRefs(ctypes.Structure):
    """One layer's matrices (LW), vectors (LV) and state buffers (LS); absent ones are null."""

    _fields_ = [("w", WeightRef * len(LW)), ("v", u64 * len(LV)), ("s", u64 * len(LS))]


_POINTERS = ("instructions", "queue_len", "ctl", "counters", "timings", "layers")
_WEIGHTS = ("token_embd", "output", "mtp_output", "mtp_embd")
_BUFFERS = ("output_norm", "rope_inv_freq", "x", "mtp_x", "proj", "conv_out", "attn_part", "hidden", "mtp_hidden",
            "last_hidden", "logits", "lm_part_v", "lm_part_i", "draft_logits", "draft_part_v", "draft_part_i",
            "counts", "seen", "mv_part", "mv_count")
_ACTS = ("act_h", "act_mix", "act_ffn", "act_eh", "act_own")
_SIZES = ("max_len", "num_layers", "hidden_size", "ffn_size", "vocab", "draft_vocab", "num_heads", "num_kv_heads",
          "head_dim", "rope_dim", "q_size", "kv_size", "ssm_k_heads", "ssm_v_heads", "ssm_dk", "ssm_dv",
          "conv_kernel", "conv_dim", "inner", "capacity", "proj_width", "attn_splits", "num_lm_parts",
          "num_draft_parts", "has_mtp", "off_q", "off_k", "off_v", "off_gate", "off_alpha", "off_beta")


class Globals(ctypes.Structure):
    """The kernel's one argument."""

    _fields_ = ([(n, u64) for n in _POINTERS] + [(n, WeightRef) for n in _WEIGHTS] + [(n, u64) for n in _BUFFERS]
                + [(n, ActRef) for n in _ACTS] + [(n, i32) for n in _SIZES] + [("eps", f32), ("rope_theta", f32)])


BUFFER_FIELDS = _BUFFERS
ACT_FIELDS = _ACTS
SIZE_FIELDS = _SIZES


def assign(struct: ctypes.Structure, **values: int) -> ctypes.Structure:
    """Set integer fields of a ctypes structure; MegakernelError when a value does not survive its field's width.

    ctypes wraps integers silently (2**31 rows would reach the device as -2**31), so every size, offset and count
    the device reads goes through here.
    """
    for name, value in values.items():
        setattr(struct, name, value)
        if getattr(struct, name) != value:
            kind = dict(struct._fields_)[name].__name__
            raise MegakernelError(f"{type(struct).__name__}.{name} = {value} does not fit its field ({kind})")
    return struct
