"""Launchers of the sequence mixers: attention over the f16 KV cache, and the Gated DeltaNet (conv, gates, rule).

Both keep what changes from call to call (positions, lengths) in device memory, so a decode step launched through
these functions can be captured once in a CUDA graph and replayed.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from engine.cuda import env_switch, ops
from engine.cuda.device import Buffer, Device
from engine.cuda.instances import (ATTN_DECODE_QPW, ATTN_HEAD_DIMS, ATTN_MMA_DIMS, ATTN_PRE_KEYS, GDN_CHUNK_DIMS,
                                   GDN_CONV_TAPS, GDN_KEY_DIMS)

ATTN_WARPS = 4
ATTN_DECODE_MAX_TOKENS = 8  # runs up to this long take a narrow instance (attn_qpw)
MAX_SPLITS = 64
# Fewest keys per active attention split (a power of two). 32 = one pass of the kernel's key loop: a decode step at a 512-token
# context then spreads over 16 splits per KV head instead of 4 (128 keys, the v6 setting: 1.9 ms per 27B pass).
ATTN_MIN_KEYS = 32
# Decode and verify attention with the split's first keys of earlier passes copied before the PDL wait (the _pre
# instances, kernels/attention.cu PRE); OPENJET_CUDA_ATTN_PRE=0 the plain ones. The 27B passes T = 1..5 (H100,
# b8da14f, one process, variant attnpre): 7.772 / 7.901 / 8.081 / 7.886 / 9.260 ms against 7.887 / 7.984 / 8.152 /
# 7.975 / 9.334 (bench/NOTES.md Z19).
ATTN_PRE_ENV = "OPENJET_CUDA_ATTN_PRE"


def _attn_pre_default() -> bool:
    return env_switch(ATTN_PRE_ENV, True)


ATTN_PRE = _attn_pre_default()
# Decode and verify attention's key splits merged by the producer of the output projection's input (act_combine_t1:
# attn_combine and act_plain_t1 in one launch, a launch less an attention layer) where combine_runs says so;
# OPENJET_CUDA_COMBINE_ACT=0 (bench variant combapart) launches the two. Its act equals theirs bit for bit (the
# mixers part, 1-8 tokens, heads of 256 and of 64); the 27B passes on an H100 level (T = 1 7.306 ms against
# 7.315; bench/NOTES.md Z31); not yet timed on the H200.
COMBINE_ENV = "OPENJET_CUDA_COMBINE_ACT"


def _combine_default() -> bool:
    return env_switch(COMBINE_ENV, True)


COMBINE_ACT = _combine_default()
# Decode and verify attention forming its own queries and this pass's keys (attn_d{D}_q{n}[_pre]_prep: qk_prep's
# work after its PDL wait, a launch less an attention layer) where prep_runs says so; OPENJET_CUDA_ATTN_PREP=1
# (bench variant qkfused). Off until a GPU has checked and timed it.
ATTN_PREP_ENV = "OPENJET_CUDA_ATTN_PREP"


def _attn_prep_default() -> bool:
    return env_switch(ATTN_PREP_ENV, False)


ATTN_PREP = _attn_prep_default()
ATTN_NEW_KEYS = 8  # the most tokens of a pass attn_prep forms keys for (kernels/attention.cu ATTN_NEW_KEYS)
# Prefill on tensor cores (kernels/attention_prefill.cu attn_mma): runs of this many tokens or more, query rows per block,
# and the shared memory (queries, a key tile and a value tile of 64 rows, f16 at a pitch of D + 8).
ATTN_MMA_MIN_TOKENS = 16
ATTN_MMA_ROWS = 64


def _attn_mma_smem(head_dim: int) -> int:
    return 3 * 64 * (head_dim + 8) * 2


def attn_runs_mma(num_tokens: int, head_dim: int, max_smem: int) -> bool:
    """Whether attention over num_tokens queries takes the tensor-core prefill kernel (no key splits): a head size
    with an instance whose shared memory fits the GPU's opt-in maximum per block (max_smem)."""
    return (num_tokens >= ATTN_MMA_MIN_TOKENS and head_dim in ATTN_MMA_DIMS
            and _attn_mma_smem(head_dim) <= max_smem)
# The chunked delta rule (kernels/deltanet_chunked.cu): tokens per chunk, state columns per scan block, shared
# memory of each kernel in floats (prep_smem_floats / scan_smem_floats there), and the shortest committed run
# that takes it (shorter runs, and every uncommitted pass, go through the recurrent kernel).
GDN_CHUNK = 64
GDN_SCAN_COLS = 32
GDN_CHUNKED_MIN_TOKENS = 64
# The recurrent rule's state columns a warp (kernels/deltanet.cu COLS; 4 warps a block): 4, twice the warps a head of
# 8 columns, each with a shorter chain of reductions a token. The rule alone at the 27B pass (H100, 979b95a): 300
# against 344 us at one token, 452 against 550 at five; the pass 7.985 against 8.068 ms (bench/NOTES.md Z4).
# OPENJET_CUDA_GDN_COLS=8 (bench variant gdn8) takes the old form back. Its close instances keep 8.
GDN_WARPS = 4
GDN_COLS_ENV = "OPENJET_CUDA_GDN_COLS"


def _gdn_cols_default() -> int:
    value = os.environ.get(GDN_COLS_ENV, "4")
    if value not in ("4", "8"):
        raise ValueError(f"{GDN_COLS_ENV}={value!r}: expected 4 or 8")
    return int(value)


GDN_COLS = _gdn_cols_default()
# The causal conv inside the delta rule on non-committing passes (kernels/deltanet.cu TAPS): the raw projections in,
# one launch a DeltaNet layer fewer (conv1d_silu's). OPENJET_CUDA_GDN_CONV=0 (bench variant convapart) launches the
# conv apart as before. Only at GDN_COLS = 4 and the instances' kernel size.
GDN_CONV_ENV = "OPENJET_CUDA_GDN_CONV"
GDN_CONV = env_switch(GDN_CONV_ENV, True)
GDN_CONV_MAX_TOKENS = 8  # kernels/deltanet.cu GDN_CONV_TOKENS: the tokens its launch stages at once
DEFAULT_GDN_CONV_TOKENS = frozenset(range(1, GDN_CONV_MAX_TOKENS + 1))  # the pass lengths that take it (of those)
GDN_CONV_TOKENS = DEFAULT_GDN_CONV_TOKENS
# The accept of a verify pass's prefix in every DeltaNet layer at once (gdn_accept_layers, one launch), where it was
# conv_commit and the rule apart in each layer (OPENJET_CUDA_ACCEPT_LAYERS=0, bench variant acceptapart): 96
# launches at the 27B, ~1.0 ms a cycle from a graph on the H100 (bench/NOTES.md Z7).
GDN_ACCEPT_ENV = "OPENJET_CUDA_ACCEPT_LAYERS"
GDN_ACCEPT_LAYERS = env_switch(GDN_ACCEPT_ENV, True)
# Its state columns a warp: 8, so that each lane's part of a row of S is one whole 32-byte sector (two float4s);
# with 48 layers' blocks in one launch, the shorter reductions of 4 (the pass's) buy nothing. Bench variant accept4.
DEFAULT_GDN_ACCEPT_COLS = 8
GDN_ACCEPT_COLS = DEFAULT_GDN_ACCEPT_COLS


@dataclass(frozen=True, slots=True)
class GdnConv:
    """The causal conv the delta rule runs on its raw inputs: conv1d_silu's window and weights, and its output
    buffer (v's channels are written there, for the commit's re-run), over channels channels."""

    window: Buffer
    weight: Buffer
    out: Buffer
    channels: int


def gdn_conv_runs(num_tokens: int, kernel_size: int, commit: bool) -> bool:
    """Whether a pass's conv goes inside the delta rule: on at its length, a non-committing pass, the instances'
    kernel size and 4 columns a warp."""
    return (GDN_CONV and num_tokens in GDN_CONV_TOKENS and not commit and kernel_size == GDN_CONV_TAPS
            and GDN_COLS == 4)


def _gdn_prep_smem(dim: int) -> int:
    return 4 * (2 * GDN_CHUNK * (dim + 4) + 2 * GDN_CHUNK * (GDN_CHUNK + 1) + 2 * GDN_CHUNK)


def _gdn_scan_smem(dim: int) -> int:
    return 4 * (dim * (GDN_SCAN_COLS + 4) + 2 * GDN_CHUNK * (dim + 4) + GDN_CHUNK * (GDN_CHUNK + 4)
                + GDN_CHUNK * (GDN_SCAN_COLS + 4))


class AttnArgs(ctypes.Structure):
    """Mirror of struct AttnArgs in kernels/attention.cuh (same field order and types)."""

    _fields_ = [(name, ctypes.c_uint64) for name in
                ("q", "kcache", "vcache", "positions", "out", "part_o", "part_ml", "gate")] + [
        (name, ctypes.c_int32) for name in
        ("T", "num_heads", "num_kv_heads", "capacity", "ld_q", "q_head_stride", "ld_out", "ld_gate",
         "gate_head_stride", "tile_tokens", "min_keys_log2")] + [("scale", ctypes.c_float)]


class QkPrep(ctypes.Structure):
    """Mirror of struct QkPrep in kernels/attention.cu."""

    _fields_ = [(n, ctypes.c_uint64) for n in
                ("q", "k", "v", "q_norm", "k_norm", "kcache", "vcache", "positions")] + [
        (n, ctypes.c_int32) for n in
        ("T", "num_heads", "num_kv_heads", "D", "ld", "q_head_stride", "capacity", "rope_dim", "neox")] + [
        ("theta", ctypes.c_float), ("eps", ctypes.c_float)]


class GdnArgs(ctypes.Structure):
    """Mirror of struct GdnArgs in kernels/deltanet.cu."""

    _fields_ = [(n, ctypes.c_uint64) for n in
                ("q", "k", "v", "alpha", "b", "a", "dt_bias", "g", "beta", "qk_out", "state", "o")] + [
        (n, ctypes.c_int32) for n in
        ("T", "num_k_heads", "num_v_heads", "Dk", "Dv", "ld_qk", "ld_v", "ld_o", "ld_gate", "commit", "prepared",
         "save")] + [("eps", ctypes.c_float), ("q_scale", ctypes.c_float)] + [
        (n, ctypes.c_uint64) for n in ("conv_w", "window", "conv_out")] + [("C", ctypes.c_int32)] + [
        ("layers", ctypes.c_uint64), ("conv_k", ctypes.c_int32)]


class GdnLayer(ctypes.Structure):
    """Mirror of struct GdnLayer in kernels/deltanet.cu: one DeltaNet layer's buffers for the accept."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("qk", "v", "g", "beta", "state", "window")]


class GdnChunkArgs(ctypes.Structure):
    """Mirror of struct GdnChunkArgs in kernels/deltanet_chunked.cu."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("q", "k", "v", "alpha", "b", "a", "dt_bias", "work", "state", "o")] + [
        (n, ctypes.c_int32) for n in ("T", "num_k_heads", "num_v_heads", "ld_qk", "ld_v", "ld_o", "ld_gate")] + [
        ("eps", ctypes.c_float), ("q_scale", ctypes.c_float)]


def _ptr(buf: Buffer | None) -> int:
    return 0 if buf is None else buf.ptr


def qk_prep_args(q: Buffer, k: Buffer, v: Buffer, q_norm: Buffer | None, k_norm: Buffer | None, kcache: Buffer,
                 vcache: Buffer, positions: Buffer, num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 ld: int, q_head_stride: int, capacity: int, rope_dim: int, theta: float, neox: bool,
                 eps: float) -> QkPrep:
    """qk_prep's work (see qk_prep), for its launch or attention(prep=)'s."""
    if head_dim > 256:
        raise ValueError(f"qk_prep handles heads of at most 256 values, not {head_dim}")
    return QkPrep(q.ptr, k.ptr, v.ptr, _ptr(q_norm), _ptr(k_norm), kcache.ptr, vcache.ptr, positions.ptr,
                  num_tokens, num_heads, num_kv_heads, head_dim, ld, q_head_stride, capacity, rope_dim, int(neox),
                  float(theta), float(eps))


def qk_prep(dev: Device, prep: QkPrep) -> None:
    """Per-head q/k RMSNorm (where weights are given), rope, q in place, k and v into the f16 caches at positions."""
    rows = prep.T * (prep.num_heads + 2 * prep.num_kv_heads)
    dev.launch(dev.kernel("qk_prep"), (rows + 7) // 8, 256, [prep])


def prep_runs(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, max_smem: int) -> bool:
    """Whether attention over num_tokens queries forms its own queries and keys: ATTN_PREP, where prep_fits."""
    return ATTN_PREP and prep_fits(num_tokens, num_heads, num_kv_heads, head_dim, max_smem)


def prep_fits(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, max_smem: int) -> bool:
    """Whether attention over num_tokens queries can form its own queries and keys (attention(prep=)): a decode
    or verify run on a narrow instance (attn_qpw) of up to ATTN_NEW_KEYS tokens, its shared memory within the
    GPU's opt-in maximum."""
    if num_tokens > ATTN_NEW_KEYS or attn_runs_mma(num_tokens, head_dim, max_smem):
        return False
    qpw = attn_qpw(num_heads, num_kv_heads, head_dim, num_tokens)
    return (qpw != ATTN_HEAD_DIMS[head_dim] and
            attn_smem(head_dim, qpw, ATTN_PRE_KEYS if ATTN_PRE else 0, prep=True) <= max_smem)


def attn_qpw(num_heads: int, num_kv_heads: int, head_dim: int, num_tokens: int | None = None) -> int:
    """Queries per warp of the attention launch over num_tokens (None: a long run). Runs of up to
    ATTN_DECODE_MAX_TOKENS take the narrowest instance whose 4 warps hold one token's G = Hq / Hkv query heads,
    so that those spread over the warps: with the wide one (12 a warp at D = 256) one warp held all 6 of a 27B
    decode step's queries, looped over its keys for 12, and the other three idled. Longer runs keep the wide
    instance, which loads each key once for more queries."""
    if head_dim not in ATTN_HEAD_DIMS:
        raise ValueError(f"no attention kernel for head size {head_dim} (have {sorted(ATTN_HEAD_DIMS)})")
    if num_tokens is not None and num_tokens <= ATTN_DECODE_MAX_TOKENS:
        group = num_heads // num_kv_heads
        narrow = [n for n in ATTN_DECODE_QPW if ATTN_WARPS * n >= group and n < ATTN_HEAD_DIMS[head_dim]]
        if narrow:
            return narrow[0]
    return ATTN_HEAD_DIMS[head_dim]


def attn_tile_tokens(num_heads: int, num_kv_heads: int, head_dim: int, num_tokens: int | None = None) -> int:
    """Query tokens per block: the block's 4 warps hold QPW queries each (attn_qpw), G = Hq / Hkv per token."""
    qpw = attn_qpw(num_heads, num_kv_heads, head_dim, num_tokens)
    group = num_heads // num_kv_heads
    tile = ATTN_WARPS * qpw // group
    if tile < 1:
        raise ValueError(f"{group} query heads per KV head exceed the attention kernel's {ATTN_WARPS * qpw}")
    return tile


def attn_splits(num_tokens: int, num_kv_heads: int, tile: int, multiprocessors: int) -> int:
    """Key splits so that the grid has about two blocks per multiprocessor."""
    blocks = num_kv_heads * ((num_tokens + tile - 1) // tile)
    return max(1, min(MAX_SPLITS, (2 * multiprocessors + blocks - 1) // blocks))


def attn_smem(head_dim: int, qpw: int, pre_keys: int, prep: bool = False) -> int:
    """The attention kernel's dynamic shared memory: its warps' queries (f32), then the keys and values it copies
    before the PDL wait (f16 rows at a pitch of head_dim + 8, kernels/attention.cu ATTN_PRE_PITCH); prep: then
    this pass's keys and values (as many rows) and a row a warp (f32) to form them in."""
    new = 2 * ATTN_NEW_KEYS * (head_dim + 8) * 2 + ATTN_WARPS * head_dim * 4 if prep else 0
    return ATTN_WARPS * qpw * head_dim * 4 + 2 * pre_keys * (head_dim + 8) * 2 + new


def attn_scratch_bytes(splits: int, num_tokens: int, num_heads: int, head_dim: int) -> int:
    """Bytes of the split partials (o, then max and sum)."""
    return 4 * splits * num_tokens * num_heads * (head_dim + 2)


def attention(dev: Device, q: Buffer, kcache: Buffer, vcache: Buffer, positions: Buffer, out: Buffer,
              num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, capacity: int, ld_q: int,
              q_head_stride: int, ld_out: int, scale: float, gate: Buffer | None = None, ld_gate: int = 0,
              gate_head_stride: int = 0, scratch: Buffer | None = None, splits: int = 1,
              min_keys: int | None = None, merge: bool = True, prep: QkPrep | None = None) -> None:
    """out[t, h] = causal attention of query (t, h) over cache keys 0..positions[t] (times sigmoid(gate) if given).

    q, gate: f32 rows with per-head strides (qwen35 packs Q and its gate per head); caches: f16 [Hkv, capacity, D].
    With splits > 1 the keys are split over blocks and merged by attn_combine through scratch; a split takes at
    least min_keys keys (default ATTN_MIN_KEYS), the splits past those stay idle. merge=False leaves them
    unmerged in scratch (out unwritten) for combine_of's producer, where combine_fits says it can. prep: qk_prep's
    work (qk_prep_args over the same queries, caches and positions), done by the attention blocks themselves where
    prep_fits says it can, in place of a qk_prep launch before.
    """
    min_keys = ATTN_MIN_KEYS if min_keys is None else min_keys
    if min_keys < 1 or min_keys & (min_keys - 1):
        raise ValueError(f"min_keys (the fewest keys per attention split) must be a power of two, not {min_keys}")
    tile = attn_tile_tokens(num_heads, num_kv_heads, head_dim, num_tokens)
    qpw = attn_qpw(num_heads, num_kv_heads, head_dim, num_tokens)
    if splits > 1:
        assert scratch is not None and scratch.nbytes >= attn_scratch_bytes(splits, num_tokens, num_heads, head_dim)
    part_o = scratch
    part_ml = scratch.view(4 * splits * num_tokens * num_heads * head_dim) if splits > 1 else None
    args = AttnArgs(_ptr(q), _ptr(kcache), _ptr(vcache), _ptr(positions), _ptr(out), _ptr(part_o), _ptr(part_ml),
                    _ptr(gate), num_tokens, num_heads, num_kv_heads, capacity, ld_q, q_head_stride, ld_out, ld_gate,
                    gate_head_stride, tile, min_keys.bit_length() - 1, float(scale))
    if attn_runs_mma(num_tokens, head_dim, dev.info.max_smem_per_block):  # a prefill run: no splits needed
        kernel, smem = dev.kernel(f"attn_mma_d{head_dim}"), _attn_mma_smem(head_dim)
        dev.set_max_dynamic_smem(kernel, smem)
        rows = num_tokens * (num_heads // num_kv_heads)
        dev.launch(kernel, (num_kv_heads, -(-rows // ATTN_MMA_ROWS)), 128, [args], smem=smem)
        return
    pre = ATTN_PRE and qpw != ATTN_HEAD_DIMS[head_dim]  # the narrow instances have the _pre form
    if prep is not None:
        assert prep_fits(num_tokens, num_heads, num_kv_heads, head_dim, dev.info.max_smem_per_block), \
            "attention cannot form these queries and keys itself"
    smem = attn_smem(head_dim, qpw, ATTN_PRE_KEYS if pre else 0, prep=prep is not None)
    kernel = dev.kernel(f"attn_d{head_dim}" if qpw == ATTN_HEAD_DIMS[head_dim] else
                        f"attn_d{head_dim}_q{qpw}" + ("_pre" if pre else "") + ("_prep" if prep is not None else ""))
    if smem > 48 * 1024:
        dev.set_max_dynamic_smem(kernel, smem)
    grid = (num_kv_heads, (num_tokens + tile - 1) // tile, splits)
    dev.launch(kernel, grid, ATTN_WARPS * 32, [args] if prep is None else [args, prep], smem=smem)
    if splits > 1 and merge:
        dev.launch(dev.kernel("attn_combine"), (num_tokens, num_heads), 256, [args, splits, head_dim])
    elif splits > 1:
        assert combine_fits(num_tokens, head_dim, splits), "the producer cannot merge these splits"


def combine_fits(num_tokens: int, head_dim: int, splits: int) -> bool:
    """Whether combine_of's producer can merge the splits of an attention launch: a run of key splits whose
    tokens each take a producer block of their own (ops.ACT_SPLIT_TOKENS), heads that tile a superblock (the
    producer's 256 positions hold whole heads)."""
    return (1 < splits <= MAX_SPLITS and num_tokens in ops.ACT_SPLIT_TOKENS and head_dim in ATTN_HEAD_DIMS
            and ops.SUPERBLOCK % head_dim == 0)


def combine_runs(num_tokens: int, head_dim: int, splits: int) -> bool:
    """Whether the splits are merged by the output projection's producer instead of attn_combine: COMBINE_ACT,
    where it fits."""
    return COMBINE_ACT and combine_fits(num_tokens, head_dim, splits)


def combine_of(scratch: Buffer, splits: int, num_tokens: int, num_heads: int, head_dim: int,
               gate: Buffer | None = None, ld_gate: int = 0, gate_head_stride: int = 0) -> ops.Producer:
    """The producer that merges attention(..., merge=False)'s split partials in scratch (times sigmoid(gate), as
    attention's gate) straight into a matmul's input: kernels/act.cu ACT_COMBINE."""
    part_ml = scratch.view(4 * splits * num_tokens * num_heads * head_dim)
    src = ops.ActSrc(scratch.ptr, _ptr(gate), 0, 0, 0, ld_gate, 0, head_dim, 0.0, 0, part_ml.ptr, splits, num_heads,
                     gate_head_stride)
    return ops.Producer("combine", src)


def kv_store(dev: Device, k: Buffer, v: Buffer, kcache: Buffer, vcache: Buffer, positions: Buffer, num_tokens: int,
             num_kv_heads: int, head_dim: int, capacity: int, ld_k: int, ld_v: int) -> None:
    """Write T tokens' keys and values (f32 rows) into the f16 caches at their positions."""
    dev.launch(dev.kernel("kv_store"), (num_tokens, num_kv_heads), min(256, max(32, head_dim)),
               [k, v, kcache, vcache, positions, num_tokens, num_kv_heads, head_dim, capacity, ld_k, ld_v])


CONV_CHUNK = 16  # tokens per thread of conv1d_silu (kernels/deltanet.cu)


def conv1d_silu(dev: Device, window: Buffer, x: Buffer, w: Buffer, out: Buffer, num_tokens: int, channels: int,
                kernel_size: int, ld_x: int, ld_out: int, commit: bool) -> None:
    """out = silu(causal depthwise conv of x after the window's state rows); commit: roll the state forward,
    else append x to the window for conv_commit."""
    assert 1 <= kernel_size <= 9, "conv kernels up to 9 taps"
    grid = ((channels + 255) // 256, (num_tokens + CONV_CHUNK - 1) // CONV_CHUNK)
    dev.launch(dev.kernel("conv1d_silu"), grid, 256,
               [window, x, w, out, num_tokens, channels, kernel_size, ld_x, ld_out, int(commit)])
    if commit:  # the new state was written to the scratch rows K-1 ..: move it into place
        conv_commit(dev, window, kernel_size - 1, channels, kernel_size)


def conv_commit(dev: Device, window: Buffer, n: int, channels: int, kernel_size: int) -> None:
    """Make the state after the first n tokens of the last (uncommitted) pass the window's state."""
    dev.launch(dev.kernel("conv_commit"), (channels + 255) // 256, 256, [window, n, channels, kernel_size])


def gdn_gates(dev: Device, alpha: Buffer, b: Buffer, a: Buffer, dt_bias: Buffer, g: Buffer, beta: Buffer,
              num_tokens: int, num_heads: int, ld_alpha: int, ld_b: int) -> None:
    """g = a * softplus(alpha + dt_bias), beta = sigmoid(b), both [T, Hv]."""
    total = num_tokens * num_heads
    dev.launch(dev.kernel("gdn_gates"), (total + 255) // 256, 256,
               [alpha, b, a, dt_bias, g, beta, num_tokens, num_heads, ld_alpha, ld_b])


def _check_state(v_dim: int, state: Buffer | None = None) -> None:
    """The delta rule moves its state [Hv, Dk, Dv] as float4s (kernels/deltanet.cu GDN_VEC_STATE)."""
    if v_dim % 4 or (state is not None and state.ptr % 16):
        raise ValueError(f"the delta rule moves its state as float4s: a 16-byte aligned state and value heads a "
                         f"multiple of 4 wide, not {v_dim}")


def _gdn_instance(k_dim: int, cols: int) -> str:
    """The stem of gdn_recurrent's instance names for key heads of k_dim at cols state columns a warp."""
    fitting = [d for d in GDN_KEY_DIMS if d >= k_dim]
    if not fitting:
        raise ValueError(f"no DeltaNet kernel for key heads of {k_dim}")
    return f"gdn_k{fitting[0]}" + ("" if cols == 8 else f"_c{cols}")


def gdn_recurrent(dev: Device, q: Buffer, k: Buffer, v: Buffer, state: Buffer, o: Buffer, num_tokens: int,
                  num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int, ld_qk: int, ld_v: int, ld_o: int,
                  commit: bool, *, g: Buffer, beta: Buffer, alpha: Buffer | None = None, b: Buffer | None = None,
                  a: Buffer | None = None, dt_bias: Buffer | None = None, ld_gate: int = 0,
                  qk_out: Buffer | None = None, eps: float = 1e-6, conv: GdnConv | None = None) -> None:
    """The gated delta rule over T tokens from state [Hv, Dk, Dv]; writes o, and the state only if commit.

    With alpha/b/a/dt_bias given, q and k are raw (L2-normalised here, q scaled by Dk^-0.5) and the gates are
    computed here; qk_out then also receives the normalised q|k rows and g/beta the gates (for a later commit).
    Without them the inputs are prepared: q, k normalised and g, beta read from their buffers.
    conv: q, k and v are the raw projections (channels of conv.window's conv, q at 0, k at Hk Dk, v at 2 Hk Dk),
    convolved here as conv1d_silu would, their inputs appended to the window (a non-committing pass only).
    """
    cols = GDN_COLS
    name = _gdn_instance(k_dim, cols) + ("_conv" if conv else "")
    prepared = alpha is None
    _check_state(v_dim, state)
    if conv is not None:
        if commit or prepared or GDN_COLS != 4:
            raise ValueError("the conv inside the delta rule takes a non-committing pass of raw inputs and 4 columns "
                             "a warp")
        if num_tokens > GDN_CONV_MAX_TOKENS:
            raise ValueError(f"the conv inside the delta rule stages at most {GDN_CONV_MAX_TOKENS} tokens, "
                             f"not {num_tokens}")
        if conv.weight.ptr % 16:
            raise ValueError("the conv inside the delta rule reads its weights as one float4 a channel: 16-byte "
                             "aligned")
    args = GdnArgs(q.ptr, k.ptr, v.ptr, _ptr(alpha), _ptr(b), _ptr(a), _ptr(dt_bias), g.ptr, beta.ptr,
                   _ptr(qk_out), state.ptr, o.ptr, num_tokens, num_k_heads, num_v_heads, k_dim, v_dim, ld_qk, ld_v,
                   ld_o, ld_gate, int(commit), int(prepared), int(qk_out is not None and not prepared), float(eps),
                   float(k_dim ** -0.5), *((conv.weight.ptr, conv.window.ptr, conv.out.ptr, conv.channels)
                                           if conv else (0, 0, 0, 0)))
    grid = (-(-v_dim // (GDN_WARPS * cols)), num_v_heads)
    dev.launch(dev.kernel(name), grid, 32 * GDN_WARPS, [args])


def gdn_accept_layers(dev: Device, layers: Buffer, num_layers: int, n: int, num_k_heads: int, num_v_heads: int,
                      k_dim: int, v_dim: int, channels: int, kernel_size: int, eps: float = 1e-6) -> None:
    """Accept the first n tokens of the last non-committing pass in num_layers DeltaNet layers, one launch: each
    layer's conv window rolled to them (conv_commit's work) and its state advanced over them from the pass's
    saved, prepared inputs (gdn_recurrent with commit on; no output). layers: num_layers GdnLayer rows."""
    assert 1 <= kernel_size <= 9 and layers.nbytes >= num_layers * ctypes.sizeof(GdnLayer)
    cols = GDN_ACCEPT_COLS
    name = _gdn_instance(k_dim, cols) + "_layers"
    _check_state(v_dim)  # the states' alignment: CudaModel._accept_table
    key = num_k_heads * k_dim
    args = GdnArgs(T=n, num_k_heads=num_k_heads, num_v_heads=num_v_heads, Dk=k_dim, Dv=v_dim, ld_qk=2 * key,
                   ld_v=channels, commit=1, prepared=1, eps=float(eps), q_scale=float(k_dim ** -0.5), C=channels,
                   layers=layers.ptr, conv_k=kernel_size)
    grid = (-(-v_dim // (GDN_WARPS * cols)), num_v_heads, num_layers)
    dev.launch(dev.kernel(name), grid, 32 * GDN_WARPS, [args])


def gdn_chunked_fits(k_dim: int, v_dim: int, max_smem: int) -> bool:
    """Whether heads of these sizes have the chunked rule: equal key and value sizes with an instance, whose two
    kernels' shared memory fits the GPU's opt-in maximum per block (max_smem; 99 KB on sm_86/89 leaves 128-wide
    heads to the recurrent kernel)."""
    return (k_dim == v_dim and k_dim in GDN_CHUNK_DIMS
            and max(_gdn_prep_smem(k_dim), _gdn_scan_smem(k_dim)) <= max_smem)


def gdn_chunk_work_bytes(num_tokens: int, num_v_heads: int, dim: int) -> int:
    """Scratch of the chunked rule over num_tokens (ChunkWork<D>::FLOATS floats per value head and chunk)."""
    chunks = -(-num_tokens // GDN_CHUNK)
    return 4 * num_v_heads * chunks * (4 * GDN_CHUNK * dim + GDN_CHUNK * GDN_CHUNK + 4)


def gdn_chunked(dev: Device, q: Buffer, k: Buffer, v: Buffer, state: Buffer, o: Buffer, work: Buffer,
                num_tokens: int, num_k_heads: int, num_v_heads: int, dim: int, ld_qk: int, ld_v: int, ld_o: int, *,
                alpha: Buffer, b: Buffer, a: Buffer, dt_bias: Buffer, ld_gate: int, eps: float = 1e-6) -> None:
    """The gated delta rule over a committed run of tokens, chunked: same inputs and result as gdn_recurrent with
    raw q/k and commit (o written, state [Hv, D, D] advanced); work holds gdn_chunk_work_bytes."""
    if not gdn_chunked_fits(dim, dim, dev.info.max_smem_per_block):
        raise ValueError(f"no chunked DeltaNet kernel for heads of {dim} on this GPU")
    need = gdn_chunk_work_bytes(num_tokens, num_v_heads, dim)
    if work.nbytes < need:
        raise ValueError(f"chunked DeltaNet scratch of {work.nbytes} bytes, {need} needed for {num_tokens} tokens")
    if ld_o % 4 or o.ptr % 16:
        raise ValueError("the chunked DeltaNet output needs 16-byte aligned rows")
    args = GdnChunkArgs(q.ptr, k.ptr, v.ptr, alpha.ptr, b.ptr, a.ptr, dt_bias.ptr, work.ptr, state.ptr, o.ptr,
                        num_tokens, num_k_heads, num_v_heads, ld_qk, ld_v, ld_o, ld_gate, float(eps),
                        float(dim ** -0.5))
    chunks = -(-num_tokens // GDN_CHUNK)
    for step, grid, smem in (("prep", (chunks, num_v_heads), _gdn_prep_smem(dim)),
                             ("scan", (dim // GDN_SCAN_COLS, num_v_heads), _gdn_scan_smem(dim))):
        kernel = dev.kernel(f"gdn_chunk_{step}_k{dim}")
        dev.set_max_dynamic_smem(kernel, smem)
        dev.launch(kernel, grid, 256, [args], smem=smem)
