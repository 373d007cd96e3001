"""Checks of the sequence mixers against engine/reference/ops.py at the 27B shapes: attention over the f16 KV cache
(decode with key splits, verify, prefill), the causal conv with its state, the DeltaNet gates and the gated delta
rule (verify-sized and chunk-sized runs, committing and not)."""

from __future__ import annotations

import numpy as np

from bench.gpu_common import TOL_F32, Report, compare
from bench.gpu_ops import Scope, randn
from engine.cuda import mixers
from engine.cuda.device import Device
from engine.reference import ops as ref

F32 = np.float32
HQ, HKV, D, CAP = 24, 4, 256, 4096  # qwen35 gated attention


def check_attention(dev: Device, report: Report, rng: np.random.Generator, start: int, num_tokens: int,
                    splits: int | None, gated: bool) -> None:
    """T queries at positions start.. over keys 0..start+T-1 (K/V written by kv_store), against ops.attention on the
    same f16-rounded keys and values."""
    s = Scope(dev)
    total = start + num_tokens
    keys, values = randn(rng, total, HKV, D), randn(rng, total, HKV, D)
    kcache, vcache = s.out(2 * HKV * CAP * D, "k"), s.out(2 * HKV * CAP * D, "v")
    positions = np.arange(total, dtype=np.int32)
    # fill the cache in two writes: the history, then the pass's own tokens (as a forward pass does)
    for lo, hi in ((0, start), (start, total)):
        if hi > lo:
            mixers.kv_store(dev, s.put(keys[lo:hi]), s.put(values[lo:hi]), kcache, vcache, s.put(positions[lo:hi]),
                            hi - lo, HKV, D, CAP, HKV * D, HKV * D)
    stride = 2 * D if gated else D  # qwen35 packs [Q | gate] per head
    packed = randn(rng, num_tokens, HQ, stride)
    out = s.out(4 * num_tokens * HQ * D)
    qpos = positions[start:]
    scale = D ** -0.5
    n_splits = splits or 1
    scratch = s.out(mixers.attn_scratch_bytes(n_splits, num_tokens, HQ, D)) if n_splits > 1 else None
    pb = s.put(packed)
    mixers.attention(dev, pb, kcache, vcache, s.put(qpos), out, num_tokens, HQ, HKV, D, CAP, HQ * stride, stride,
                     HQ * D, scale, gate=pb.view(4 * D) if gated else None, ld_gate=HQ * stride,
                     gate_head_stride=stride, scratch=scratch, splits=n_splits)
    k16, v16 = keys.astype(np.float16).astype(F32), values.astype(np.float16).astype(F32)
    want = ref.attention(packed[..., :D], k16, v16, qpos, scale)
    if gated:
        want = want * ref.sigmoid(packed[..., D:])
    name = f"{'gated.' if gated else ''}T{num_tokens}.s{n_splits}"
    compare(report, "attention", name, s.get(out, (num_tokens, HQ, D)), want, TOL_F32)
    s.close()


def check_conv(dev: Device, report: Report, rng: np.random.Generator, num_tokens: int = 5, channels: int = 10240,
               kernel: int = 4) -> None:
    """conv1d_silu committing and not, then conv_commit of a prefix, against ops.causal_conv1d."""
    s = Scope(dev)
    state, x, w = randn(rng, kernel - 1, channels), randn(rng, num_tokens, channels), randn(rng, channels, kernel)
    want_y, want_state = ref.causal_conv1d(x, state, w)
    for commit in (True, False):
        window = s.put(np.concatenate([state, np.full((num_tokens, channels), np.nan, F32)]))
        out = s.out(4 * num_tokens * channels)
        mixers.conv1d_silu(dev, window, s.put(x), s.put(w), out, num_tokens, channels, kernel, channels, channels,
                           commit)
        compare(report, "conv1d_silu", f"commit={commit}", s.get(out, x.shape), ref.silu(want_y), TOL_F32)
        if commit:
            got_state = s.get(window, (kernel - 1, channels))
            compare(report, "conv_state", "commit", got_state, want_state, TOL_F32)
        else:
            accept = 2
            mixers.conv_commit(dev, window, accept, channels, kernel)
            _, state_n = ref.causal_conv1d(x[:accept], state, w)
            compare(report, "conv_state", f"accept{accept}", s.get(window, (kernel - 1, channels)), state_n, TOL_F32)
    s.close()


def check_gates(dev: Device, report: Report, rng: np.random.Generator, num_tokens: int = 5, heads: int = 48) -> None:
    """g = a * softplus(alpha + dt_bias), beta = sigmoid(b)."""
    s = Scope(dev)
    alpha, b = randn(rng, num_tokens, heads, scale=2.0), randn(rng, num_tokens, heads, scale=2.0)
    a, dt = -np.exp(randn(rng, heads, scale=0.5)), randn(rng, heads)
    g, beta = s.out(4 * num_tokens * heads), s.out(4 * num_tokens * heads)
    mixers.gdn_gates(dev, s.put(alpha), s.put(b), s.put(a), s.put(dt), g, beta, num_tokens, heads, heads, heads)
    compare(report, "gdn_gates", "g", s.get(g, alpha.shape), a * ref.softplus(alpha + dt), TOL_F32)
    compare(report, "gdn_gates", "beta", s.get(beta, b.shape), ref.sigmoid(b), TOL_F32)
    s.close()


def check_delta_rule(dev: Device, report: Report, rng: np.random.Generator, num_tokens: int, commit: bool,
                     hk: int = 16, hv: int = 48, dk: int = 128, dv: int = 128) -> None:
    """gdn_recurrent against ops.gated_delta_rule (q, k normalised, q scaled, g <= 0, beta in (0, 1))."""
    s = Scope(dev)
    q = ref.l2_norm(randn(rng, num_tokens, hk, dk), 1e-6) * F32(dk ** -0.5)
    k = ref.l2_norm(randn(rng, num_tokens, hk, dk), 1e-6)
    v = randn(rng, num_tokens, hv, dv)
    g = -np.abs(randn(rng, num_tokens, hv, scale=0.3))
    beta = ref.sigmoid(randn(rng, num_tokens, hv))
    state = randn(rng, hv, dk, dv, scale=0.1)
    sb = s.put(state)
    o = s.out(4 * num_tokens * hv * dv)
    mixers.gdn_recurrent(dev, s.put(q), s.put(k), s.put(v), s.put(g), s.put(beta), sb, o, num_tokens, hk, hv, dk, dv,
                         hk * dk, hv * dv, hv * dv, commit)
    want_o, want_state = ref.gated_delta_rule(q, k, v, g, beta, state)
    compare(report, "gdn_rule", f"T{num_tokens}.o", s.get(o, v.shape), want_o, TOL_F32)
    compare(report, "gdn_rule", f"T{num_tokens}.state" + ("" if commit else ".kept"), s.get(sb, state.shape),
            want_state if commit else state, TOL_F32)
    s.close()


def run_mixer_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """All mixer checks."""
    sms = dev.info.multiprocessors
    check_attention(dev, report, rng, 999, 1, mixers.attn_splits(1, HKV, 8, sms), gated=True)
    check_attention(dev, report, rng, 1500, 5, mixers.attn_splits(5, HKV, 8, sms), gated=True)
    check_attention(dev, report, rng, 40, 5, 1, gated=False)
    check_attention(dev, report, rng, 0, 300, None, gated=True)  # prefill from an empty cache: query tiles
    check_attention(dev, report, rng, 700, 77, 3, gated=False)  # prefill on top of a history, with splits
    check_conv(dev, report, rng)
    check_gates(dev, report, rng)
    check_delta_rule(dev, report, rng, 1, commit=True)
    check_delta_rule(dev, report, rng, 5, commit=False)
    check_delta_rule(dev, report, rng, 200, commit=True)
