"""Checks of the sequence mixers against engine/reference/ops.py at the 27B shapes: attention over the f16 KV cache
(decode with key splits, verify, prefill), the causal conv with its state, the DeltaNet gates and the gated delta
rule (verify-sized and chunk-sized runs, committing and not; the chunked prefill form at 1, 3.1 and 8 chunks), and
the delta rule's two forms timed side by side."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from bench.gpu_common import TOL_F16, TOL_F32, Report, Timing, compare, median_time, poison
from bench.gpu_ops import Scope, randn
from engine.cuda import mixers
from engine.cuda.device import Buffer, Device
from engine.reference import ops as ref

F32 = np.float32
HQ, HKV, D, CAP = 24, 4, 256, 4096  # qwen35 gated attention


def _filled_cache(s: Scope, rng: np.random.Generator, start: int, num_tokens: int, hkv: int = HKV, d: int = D):
    """Random keys and values of positions 0..start+T-1 written into f16 caches by kv_store in two writes (the
    history, then the pass's own tokens, as a forward pass does): (keys, values, kcache, vcache, positions)."""
    total = start + num_tokens
    keys, values = randn(rng, total, hkv, d), randn(rng, total, hkv, d)
    kcache, vcache = s.out(2 * hkv * CAP * d, "k"), s.out(2 * hkv * CAP * d, "v")
    positions = np.arange(total, dtype=np.int32)
    for lo, hi in ((0, start), (start, total)):
        if hi > lo:
            mixers.kv_store(s.dev, s.put(keys[lo:hi]), s.put(values[lo:hi]), kcache, vcache,
                            s.put(positions[lo:hi]), hi - lo, hkv, d, CAP, hkv * d, hkv * d)
    return keys, values, kcache, vcache, positions


def check_attention(dev: Device, report: Report, rng: np.random.Generator, start: int, num_tokens: int,
                    splits: int | None, gated: bool) -> None:
    """T queries at positions start.. over keys 0..start+T-1 (K/V written by kv_store), against ops.attention on the
    same f16-rounded keys and values."""
    s = Scope(dev)
    keys, values, kcache, vcache, positions = _filled_cache(s, rng, start, num_tokens)
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
    mma = mixers.attn_runs_mma(num_tokens, D, dev.info.max_smem_per_block)  # f16 queries and probabilities
    name = f"{'gated.' if gated else ''}T{num_tokens}." + ("mma" if mma else f"s{n_splits}")
    compare(report, "attention", name, s.get(out, (num_tokens, HQ, D)), want, TOL_F16 if mma else TOL_F32)
    s.close()


def check_combine_act(dev: Device, report: Report, rng: np.random.Generator, start: int, num_tokens: int,
                      hq: int = HQ, hkv: int = HKV, d: int = D) -> None:
    """Decode attention's key splits merged by the output projection's producer (mixers.combine_of:
    act_combine_t1) against attn_combine then act_plain_t1 on the same partials: every part of the act the matmuls
    read (f16 values and residues, sub-block sums, the int8 levels, scales and sums) equal. Heads of d < 256 put
    several heads in one producer block."""
    from engine.cuda import ops

    s = Scope(dev)
    _, _, kcache, vcache, positions = _filled_cache(s, rng, start, num_tokens, hkv, d)
    stride = 2 * d  # [Q | gate] per head
    packed = s.put(randn(rng, num_tokens, hq, stride))
    splits = mixers.attn_splits(num_tokens, hkv, mixers.attn_tile_tokens(hq, hkv, d, num_tokens),
                                dev.info.multiprocessors)
    width = hq * d
    scratch = s.out(mixers.attn_scratch_bytes(splits, num_tokens, hq, d))
    out, qpos = s.out(4 * num_tokens * width), s.put(positions[start:])
    acts = {name: ops.alloc_act(dev, num_tokens, width, name, precise=True) for name in ("plain", "combine")}
    for act in acts.values():  # the same finite poison in both: what one writes and the other does not differs
        bufs = [buf for buf in (getattr(act, f.name) for f in fields(act)) if isinstance(buf, Buffer)]
        s.bufs += bufs  # (freed with the scope's)
        for buf in bufs:
            dev.fill_u32(buf, 0x7BFF7BFF)
    for merge in (True, False):
        mixers.attention(dev, packed, kcache, vcache, qpos, out, num_tokens, hq, hkv, d, CAP, hq * stride, stride,
                         width, d ** -0.5, gate=packed.view(4 * d), ld_gate=hq * stride, gate_head_stride=stride,
                         scratch=scratch, splits=splits, merge=merge)
        producer = (ops.plain_of(out, width) if merge else
                    mixers.combine_of(scratch, splits, num_tokens, hq, d, packed.view(4 * d), hq * stride, stride))
        ops.produce(dev, producer, acts["plain" if merge else "combine"], num_tokens)
    dev.synchronize()
    name = f"T{num_tokens}.d{d}.s{splits}"
    want, got = acts["plain"], acts["combine"]
    nsb = want.num_superblocks
    parts = [("act", "x16", np.float16, nsb * 2048), ("act_lo", "x16_lo", np.float16, nsb * 2048),
             ("sums", "sums", np.float16, nsb * 64), ("sums_lo", "sums_lo", np.float16, nsb * 64)]
    if want.i8_tokens:
        parts += [("q8", "q8", np.int8, nsb * 4096), ("scale8", "scale8", F32, nsb * 16),
                  ("sums8", "sums8", np.float16, nsb * 64)]
    for label, field, dtype, count in parts:
        a = dev.download(getattr(got, field), dtype, (count,)).astype(np.float64)
        b = dev.download(getattr(want, field), dtype, (count,)).astype(np.float64)
        compare(report, "combine_act", f"{name}.{label}", a, b, 1e-6)
    s.close()


def check_attn_prep(dev: Device, report: Report, rng: np.random.Generator, start: int, num_tokens: int,
                    hq: int = HQ, hkv: int = HKV, d: int = D) -> None:
    """Decode attention forming its own queries and this pass's keys (attention(prep=): attn_*_prep) against
    qk_prep then attention on the same projection rows and caches: the outputs (split partials merged by
    attn_combine) and the cache rows of the pass's positions equal bit for bit."""
    s = Scope(dev)
    stride = 2 * d  # [Q | gate] per head, then k, then v, as qwen35's projection
    width = hq * stride + 2 * hkv * d
    k_off = hq * stride
    qn, kn = s.put(randn(rng, d)), s.put(randn(rng, d))
    proj = randn(rng, num_tokens, width)
    positions = np.arange(start, start + num_tokens, dtype=np.int32)
    history = randn(rng, start, hkv, d), randn(rng, start, hkv, d)
    tile = mixers.attn_tile_tokens(hq, hkv, d, num_tokens)
    splits = mixers.attn_splits(num_tokens, hkv, tile, dev.info.multiprocessors)
    results = {}
    for inside in (False, True):
        kc, vc = s.out(2 * hkv * CAP * d, "k"), s.out(2 * hkv * CAP * d, "v")
        mixers.kv_store(dev, s.put(history[0]), s.put(history[1]), kc, vc, s.put(np.arange(start, dtype=np.int32)),
                        start, hkv, d, CAP, hkv * d, hkv * d)
        pb, pos = s.put(proj), s.put(positions)
        prep = mixers.qk_prep_args(pb, pb.view(4 * k_off), pb.view(4 * (k_off + hkv * d)), qn, kn, kc, vc, pos,
                                   num_tokens, hq, hkv, d, width, stride, CAP, min(64, d), 1e7, True, 1e-6)
        if not inside:
            mixers.qk_prep(dev, prep)
        out = s.out(4 * num_tokens * hq * d)
        scratch = s.out(mixers.attn_scratch_bytes(splits, num_tokens, hq, d))
        mixers.attention(dev, pb, kc, vc, pos, out, num_tokens, hq, hkv, d, CAP, width, stride, hq * d, d ** -0.5,
                         gate=pb.view(4 * d), ld_gate=width, gate_head_stride=stride, scratch=scratch, splits=splits,
                         prep=prep if inside else None)
        caches = [s.get(c, (hkv, CAP, d), np.float16)[:, start : start + num_tokens].astype(F32) for c in (kc, vc)]
        results[inside] = s.get(out, (num_tokens, hq, d)), *caches
    name = f"T{num_tokens}.d{d}.s{splits}"
    for label, got, want in zip(("out", "k.cache", "v.cache"), results[True], results[False]):
        compare(report, "attn_prep", f"{name}.{label}", got, want, 1e-7)
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
    """gdn_recurrent from raw inputs (L2 norms and gates inside, normalised q/k and gates saved when not
    committing), then from those saved, prepared inputs: both against ops.gated_delta_rule."""
    s = Scope(dev)
    q_raw, k_raw, v = randn(rng, num_tokens, hk, dk), randn(rng, num_tokens, hk, dk), randn(rng, num_tokens, hv, dv)
    alpha, b = randn(rng, num_tokens, hv, scale=2.0), randn(rng, num_tokens, hv, scale=2.0)
    a, dt = -np.exp(randn(rng, hv, scale=0.5)), randn(rng, hv)
    q = ref.l2_norm(q_raw, 1e-6) * F32(dk ** -0.5)
    k = ref.l2_norm(k_raw, 1e-6)
    g, beta = a * ref.softplus(alpha + dt), ref.sigmoid(b)
    state = randn(rng, hv, dk, dv, scale=0.1)
    want_o, want_state = ref.gated_delta_rule(q, k, v, g, beta, state)
    sb = s.put(state)
    o, gb, betab = s.out(4 * num_tokens * hv * dv), s.out(4 * num_tokens * hv), s.out(4 * num_tokens * hv)
    qk_out = s.out(8 * num_tokens * hk * dk)
    qkb = s.put(np.concatenate([q_raw.reshape(num_tokens, -1), k_raw.reshape(num_tokens, -1)], axis=1))
    mixers.gdn_recurrent(dev, qkb, qkb.view(4 * hk * dk), s.put(v), sb, o, num_tokens, hk, hv, dk, dv, 2 * hk * dk,
                         hv * dv, hv * dv, commit, g=gb, beta=betab, alpha=s.put(alpha), b=s.put(b), a=s.put(a),
                         dt_bias=s.put(dt), ld_gate=hv, qk_out=None if commit else qk_out)
    compare(report, "gdn_rule", f"raw.T{num_tokens}.o", s.get(o, v.shape), want_o, TOL_F32)
    compare(report, "gdn_rule", f"raw.T{num_tokens}.state" + ("" if commit else ".kept"), s.get(sb, state.shape),
            want_state if commit else state, TOL_F32)
    if commit:
        s.close()
        return
    saved = s.get(qk_out, (num_tokens, 2, hk, dk))
    compare(report, "gdn_rule", "saved.q", saved[:, 0], q, TOL_F32)
    compare(report, "gdn_rule", "saved.k", saved[:, 1], k, TOL_F32)
    compare(report, "gdn_rule", "saved.g", s.get(gb, g.shape), g, TOL_F32)
    # commit the first n tokens from the saved, prepared inputs (the accept path)
    n = max(1, num_tokens - 2)
    poison(dev, o)
    mixers.gdn_recurrent(dev, qk_out, qk_out.view(4 * hk * dk), s.put(v), sb, o, n, hk, hv, dk, dv, 2 * hk * dk,
                         hv * dv, hv * dv, True, g=gb, beta=betab)
    _, want_n = ref.gated_delta_rule(q[:n], k[:n], v[:n], g[:n], beta[:n], state)
    compare(report, "gdn_rule", f"prepared.commit{n}", s.get(sb, state.shape), want_n, TOL_F32)
    s.close()


def check_delta_rule_conv(dev: Device, report: Report, rng: np.random.Generator, num_tokens: int, hk: int = 16,
                          hv: int = 48, dk: int = 128, dv: int = 128, kernel: int = 4) -> None:
    """gdn_recurrent with the causal conv inside (a non-committing pass on the raw projections, laid out as the
    model's: q | k | v, then alpha | b, in rows of a wider width) against ops.causal_conv1d + SiLU +
    ops.gated_delta_rule: o, the window (state rows kept, the raw inputs appended), v's conv output, the saved
    q / k / gates, the state kept; then the accept path (conv_commit, the prepared rule from what was saved)."""
    s = Scope(dev)
    key, channels = hk * dk, 2 * hk * dk + hv * dv
    width = channels + 2 * hv + 8  # the gates after the conv's channels, and room as in the projection buffer
    x = randn(rng, num_tokens, width)
    alpha, b = x[:, channels:channels + hv] * F32(2), x[:, channels + hv:channels + 2 * hv] * F32(2)
    x[:, channels:channels + 2 * hv] = np.concatenate([alpha, b], axis=1)
    a, dt = -np.exp(randn(rng, hv, scale=0.5)), randn(rng, hv)
    conv_state, w = randn(rng, kernel - 1, channels), randn(rng, channels, kernel, scale=0.5)
    y, want_window = ref.causal_conv1d(x[:, :channels], conv_state, w)
    y = ref.silu(y)
    q = ref.l2_norm(y[:, :key].reshape(-1, hk, dk), 1e-6) * F32(dk ** -0.5)
    k = ref.l2_norm(y[:, key:2 * key].reshape(-1, hk, dk), 1e-6)
    v = y[:, 2 * key:].reshape(-1, hv, dv)
    g, beta = a * ref.softplus(alpha + dt), ref.sigmoid(b)
    state = randn(rng, hv, dk, dv, scale=0.1)
    want_o, _ = ref.gated_delta_rule(q, k, v, g, beta, state)
    xb, sb = s.put(x), s.put(state)
    window = s.put(np.concatenate([conv_state, np.full((num_tokens, channels), np.nan, F32)]))
    conv_out = s.out(4 * num_tokens * channels)
    o, gb, betab = s.out(4 * num_tokens * hv * dv), s.out(4 * num_tokens * hv), s.out(4 * num_tokens * hv)
    qk_out = s.out(8 * num_tokens * key)
    mixers.gdn_recurrent(dev, xb, xb.view(4 * key), xb.view(8 * key), sb, o, num_tokens, hk, hv, dk, dv, width, width,
                         hv * dv, False, g=gb, beta=betab, alpha=xb.view(4 * channels), b=xb.view(4 * (channels + hv)),
                         a=s.put(a), dt_bias=s.put(dt), ld_gate=width, qk_out=qk_out,
                         conv=mixers.GdnConv(window, s.put(w), conv_out, channels))
    name = f"conv.T{num_tokens}.k{dk}v{dv}"
    compare(report, "gdn_rule", f"{name}.o", s.get(o, (num_tokens, hv, dv)), want_o, TOL_F32)
    got_window = s.get(window, (kernel - 1 + num_tokens, channels))
    compare(report, "gdn_rule", f"{name}.window", got_window, np.concatenate([conv_state, x[:, :channels]]), TOL_F32)
    compare(report, "gdn_rule", f"{name}.conv_v", s.get(conv_out, (num_tokens, channels))[:, 2 * key:],
            y[:, 2 * key:], TOL_F32)
    saved = s.get(qk_out, (num_tokens, 2, hk, dk))
    compare(report, "gdn_rule", f"{name}.saved_qk", saved, np.stack([q, k], axis=1), TOL_F32)
    compare(report, "gdn_rule", f"{name}.saved_g", s.get(gb, g.shape), g, TOL_F32)
    compare(report, "gdn_rule", f"{name}.state_kept", s.get(sb, state.shape), state, TOL_F32)
    # the accept path on what the pass left: the window rolled to n tokens, the rule committed from the saved inputs
    n = max(1, num_tokens - 1)
    mixers.conv_commit(dev, window, n, channels, kernel)
    mixers.gdn_recurrent(dev, qk_out, qk_out.view(4 * key), conv_out.view(8 * key), sb, o, n, hk, hv, dk, dv,
                         2 * key, channels, hv * dv, True, g=gb, beta=betab)
    _, want_state_n = ref.gated_delta_rule(q[:n], k[:n], v[:n], g[:n], beta[:n], state)
    _, want_window_n = ref.causal_conv1d(x[:n, :channels], conv_state, w)
    compare(report, "gdn_rule", f"{name}.accept{n}.state", s.get(sb, state.shape), want_state_n, TOL_F32)
    compare(report, "gdn_rule", f"{name}.accept{n}.window", s.get(window, (kernel - 1, channels)), want_window_n,
            TOL_F32)
    s.close()


def check_accept_layers(dev: Device, report: Report, rng: np.random.Generator, num_layers: int, num_tokens: int,
                        hk: int = 16, hv: int = 48, dk: int = 128, dv: int = 128, kernel: int = 4) -> None:
    """gdn_accept_layers over num_layers layers' buffers as a verify pass leaves them (the window's state rows and
    the pass's raw inputs, the saved q | k, v's conv output, the gates), each its own: every layer's window rolled
    to n tokens and its state advanced over them, against ops.causal_conv1d and ops.gated_delta_rule."""
    s = Scope(dev)
    key, channels = hk * dk, 2 * hk * dk + hv * dv
    n = max(1, num_tokens - 1)
    rows, wants = [], []
    for _ in range(num_layers):
        conv_state, x = randn(rng, kernel - 1, channels), randn(rng, num_tokens, channels)
        q = ref.l2_norm(randn(rng, num_tokens, hk, dk), 1e-6) * F32(dk ** -0.5)
        k = ref.l2_norm(randn(rng, num_tokens, hk, dk), 1e-6)
        v = randn(rng, num_tokens, hv, dv)
        g, beta = -np.exp(randn(rng, num_tokens, hv, scale=0.5)), ref.sigmoid(randn(rng, num_tokens, hv))
        state = randn(rng, hv, dk, dv, scale=0.1)
        conv_out = np.concatenate([randn(rng, num_tokens, 2 * key), v.reshape(num_tokens, -1)], axis=1)
        bufs = dict(qk=s.put(np.concatenate([q.reshape(num_tokens, -1), k.reshape(num_tokens, -1)], axis=1)),
                    v=s.put(conv_out), g=s.put(g), beta=s.put(beta), state=s.put(state),
                    window=s.put(np.concatenate([conv_state, x])))
        rows.append(mixers.GdnLayer(bufs["qk"].ptr, bufs["v"].ptr + 8 * key, bufs["g"].ptr, bufs["beta"].ptr,
                                    bufs["state"].ptr, bufs["window"].ptr))
        _, want_state = ref.gated_delta_rule(q[:n], k[:n], v[:n], g[:n], beta[:n], state)
        wants.append((bufs, want_state, np.concatenate([conv_state, x])[n:n + kernel - 1]))
    table = s.put(np.frombuffer(bytes((mixers.GdnLayer * num_layers)(*rows)), np.uint8))
    mixers.gdn_accept_layers(dev, table, num_layers, n, hk, hv, dk, dv, channels, kernel)
    name = f"accept_layers.L{num_layers}.T{num_tokens}.n{n}.k{dk}v{dv}"
    for i, (bufs, want_state, want_window) in enumerate(wants):
        compare(report, "gdn_rule", f"{name}.l{i}.state", s.get(bufs["state"], want_state.shape), want_state, TOL_F32)
        compare(report, "gdn_rule", f"{name}.l{i}.window", s.get(bufs["window"], want_window.shape), want_window,
                TOL_F32)
    s.close()


def time_conv_rule(dev: Device, report: Report, rng: np.random.Generator, token_counts=(1, 5),
                   hk: int = 16, hv: int = 48, dk: int = 128, kernel: int = 4) -> None:
    """One 27B DeltaNet layer's non-committing pass: conv1d_silu then the rule, against the rule with the conv
    inside (launched back to back, no PDL: the pass's own figure is gpu_bench27b's)."""
    print("conv + delta rule timings (one 27B layer, a verify pass)", flush=True)
    key, channels = hk * dk, 2 * hk * dk + hv * dk
    for num_tokens in token_counts:
        s = Scope(dev)
        x = s.put(randn(rng, num_tokens, channels + 2 * hv))
        width = channels + 2 * hv
        window = s.put(randn(rng, kernel - 1 + num_tokens, channels))
        w, conv_out = s.put(randn(rng, channels, kernel, scale=0.5)), s.out(4 * num_tokens * channels)
        state, o = s.put(randn(rng, hv, dk, dk, scale=0.1)), s.out(4 * num_tokens * hv * dk)
        gb, betab, qk_out = s.out(4 * num_tokens * hv), s.out(4 * num_tokens * hv), s.out(8 * num_tokens * key)
        gates = dict(g=gb, beta=betab, alpha=x.view(4 * channels), b=x.view(4 * (channels + hv)),
                     a=s.put(-np.exp(randn(rng, hv, scale=0.5))), dt_bias=s.put(randn(rng, hv)), ld_gate=width,
                     qk_out=qk_out)

        def apart() -> None:
            mixers.conv1d_silu(dev, window, x, w, conv_out, num_tokens, channels, kernel, width, channels, False)
            mixers.gdn_recurrent(dev, conv_out, conv_out.view(4 * key), conv_out.view(8 * key), state, o, num_tokens,
                                 hk, hv, dk, dk, channels, channels, hv * dk, False, **gates)

        def inside() -> None:
            mixers.gdn_recurrent(dev, x, x.view(4 * key), x.view(8 * key), state, o, num_tokens, hk, hv, dk, dk,
                                 width, width, hv * dk, False, conv=mixers.GdnConv(window, w, conv_out, channels),
                                 **gates)

        _time_forms(dev, report, {"conv apart": apart, "inside": inside}, num_tokens, f"{hv}x{dk}x{dk}", "conv_")
        s.close()


def _time_forms(dev: Device, report: Report, forms: dict, num_tokens: int, shape: str, prefix: str = "") -> None:
    """Time each form's launches (median of 20 after warm-up), record them and print one line."""
    line = f"  T={num_tokens:<4}"
    for form, fn in forms.items():
        med, spread = median_time(dev, fn, reps=20, warmup=3, inner=4)
        report.timings.append(Timing("deltanet", f"{prefix}{form.split()[-1]}.T{num_tokens}", shape, med, spread))
        line += f" {form} {med * 1e3:8.1f} us "
    print(line.rstrip(), flush=True)


def _delta_inputs(rng: np.random.Generator, num_tokens: int, hk: int, hv: int, dk: int, mild: bool):
    """Raw inputs of one DeltaNet layer's rule as the model lays them out (conv output q | k | v per token, gate
    inputs alpha | b), and the prepared q, k, g, beta the reference takes. mild: gates near 1 (g ~ -0.05), so the
    state carried between chunks still counts at the chunk's end; otherwise g ~ -1 (a state mostly forgotten)."""
    qkv = randn(rng, num_tokens, 2 * hk * dk + hv * dk)
    gate_in = randn(rng, num_tokens, 2 * hv, scale=2.0)
    a = -np.exp(randn(rng, hv, scale=0.5)) * F32(0.03 if mild else 1.0)
    dt = randn(rng, hv)
    q_raw, k_raw = qkv[:, : hk * dk].reshape(-1, hk, dk), qkv[:, hk * dk : 2 * hk * dk].reshape(-1, hk, dk)
    q, k = ref.l2_norm(q_raw, 1e-6) * F32(dk ** -0.5), ref.l2_norm(k_raw, 1e-6)
    v = qkv[:, 2 * hk * dk :].reshape(-1, hv, dk)
    g, beta = a * ref.softplus(gate_in[:, :hv] + dt), ref.sigmoid(gate_in[:, hv:])
    return qkv, gate_in, a, dt, (q, k, v, g.astype(F32), beta.astype(F32))


def _launch_chunked(dev: Device, bufs: dict, num_tokens: int, hk: int, hv: int, dk: int) -> None:
    width, gates = 2 * hk * dk + hv * dk, bufs["gates"]
    mixers.gdn_chunked(dev, bufs["qkv"], bufs["qkv"].view(4 * hk * dk), bufs["qkv"].view(8 * hk * dk), bufs["state"],
                       bufs["o"], bufs["work"], num_tokens, hk, hv, dk, width, width, hv * dk, alpha=gates,
                       b=gates.view(4 * hv), a=bufs["a"], dt_bias=bufs["dt"], ld_gate=2 * hv)


def check_delta_rule_chunked(dev: Device, report: Report, rng: np.random.Generator, num_tokens: int, mild: bool,
                             hk: int = 16, hv: int = 48, dk: int = 128) -> None:
    """gdn_chunked (prep + scan) from raw inputs against ops.gated_delta_rule_chunked: o and the new state."""
    s = Scope(dev)
    qkv, gate_in, a, dt, prepared = _delta_inputs(rng, num_tokens, hk, hv, dk, mild)
    state = randn(rng, hv, dk, dk, scale=0.1)
    want_o, want_state = ref.gated_delta_rule_chunked(*prepared, state)
    bufs = dict(qkv=s.put(qkv), gates=s.put(gate_in), a=s.put(a), dt=s.put(dt), state=s.put(state),
                o=s.out(4 * num_tokens * hv * dk), work=s.out(mixers.gdn_chunk_work_bytes(num_tokens, hv, dk)))
    _launch_chunked(dev, bufs, num_tokens, hk, hv, dk)
    name = f"T{num_tokens}.{'mild' if mild else 'strong'}"
    compare(report, "gdn_chunked", f"{name}.o", s.get(bufs["o"], (num_tokens, hv, dk)), want_o, TOL_F32)
    compare(report, "gdn_chunked", f"{name}.state", s.get(bufs["state"], state.shape), want_state, TOL_F32)
    s.close()


def time_delta_rule(dev: Device, report: Report, rng: np.random.Generator, token_counts=(64, 128, 512),
                    hk: int = 16, hv: int = 48, dk: int = 128) -> None:
    """One 27B DeltaNet layer's committed rule over T tokens, recurrent kernel against the chunked pair."""
    print("delta rule timings (one 27B layer)", flush=True)
    for num_tokens in token_counts:
        s = Scope(dev)
        qkv, gate_in, a, dt, _ = _delta_inputs(rng, num_tokens, hk, hv, dk, mild=True)
        bufs = dict(qkv=s.put(qkv), gates=s.put(gate_in), a=s.put(a), dt=s.put(dt),
                    state=s.put(randn(rng, hv, dk, dk, scale=0.1)), o=s.out(4 * num_tokens * hv * dk),
                    work=s.out(mixers.gdn_chunk_work_bytes(num_tokens, hv, dk)))
        g, beta = s.out(4 * num_tokens * hv), s.out(4 * num_tokens * hv)
        width = 2 * hk * dk + hv * dk

        def recurrent() -> None:
            mixers.gdn_recurrent(dev, bufs["qkv"], bufs["qkv"].view(4 * hk * dk), bufs["qkv"].view(8 * hk * dk),
                                 bufs["state"], bufs["o"], num_tokens, hk, hv, dk, dk, width, width, hv * dk, True,
                                 g=g, beta=beta, alpha=bufs["gates"], b=bufs["gates"].view(4 * hv), a=bufs["a"],
                                 dt_bias=bufs["dt"], ld_gate=2 * hv)

        _time_forms(dev, report, {"recurrent": recurrent,
                                  "chunked": lambda: _launch_chunked(dev, bufs, num_tokens, hk, hv, dk)},
                    num_tokens, f"{hv}x{dk}x{dk}")
        s.close()


def check_qk_prep(dev: Device, report: Report, rng: np.random.Generator, start: int = 1234, num_tokens: int = 5,
                  gated: bool = True) -> None:
    """q/k RMSNorm per head, partial rope on q and k, q written back, k and v into the f16 caches."""
    s = Scope(dev)
    stride = 2 * D if gated else D
    width = HQ * stride + 2 * HKV * D
    proj = randn(rng, num_tokens, width)
    pb = s.put(proj)
    qn, kn = randn(rng, D), randn(rng, D)
    kc, vc = s.out(2 * HKV * CAP * D, "k"), s.out(2 * HKV * CAP * D, "v")
    positions = np.arange(start, start + num_tokens, dtype=np.int32)
    q_off, k_off = 0, HQ * stride
    mixers.qk_prep(dev, mixers.qk_prep_args(pb, pb.view(4 * k_off), pb.view(4 * (k_off + HKV * D)), s.put(qn),
                                            s.put(kn), kc, vc, s.put(positions), num_tokens, HQ, HKV, D, width, stride,
                                            CAP, 64, 1e7, True, 1e-6))
    q = proj[:, : HQ * stride].reshape(num_tokens, HQ, stride)[..., :D]
    k = proj[:, k_off : k_off + HKV * D].reshape(num_tokens, HKV, D)
    v = proj[:, k_off + HKV * D :].reshape(num_tokens, HKV, D)
    want_q = ref.rope(ref.rms_norm(q, qn, 1e-6), positions, 64, 1e7, True)
    want_k = ref.rope(ref.rms_norm(k, kn, 1e-6), positions, 64, 1e7, True)
    got = s.get(pb, proj.shape)
    compare(report, "qk_prep", "q", got[:, : HQ * stride].reshape(num_tokens, HQ, stride)[..., :D], want_q, TOL_F32)
    kcache = s.get(kc, (HKV, CAP, D), np.float16)[:, start : start + num_tokens].transpose(1, 0, 2)
    vcache = s.get(vc, (HKV, CAP, D), np.float16)[:, start : start + num_tokens].transpose(1, 0, 2)
    compare(report, "qk_prep", "k.cache", kcache.astype(F32), want_k, 1e-3)
    compare(report, "qk_prep", "v.cache", vcache.astype(F32), v, 1e-3)
    s.close()


def run_mixer_checks(dev: Device, report: Report, rng: np.random.Generator) -> None:
    """All mixer checks."""
    sms = dev.info.multiprocessors
    # decode and verify runs take the narrow instances (mixers.attn_qpw), longer ones the wide
    for start, tokens in ((999, 1), (1500, 5), (600, 8)):
        tile = mixers.attn_tile_tokens(HQ, HKV, D, tokens)
        check_attention(dev, report, rng, start, tokens, mixers.attn_splits(tokens, HKV, tile, sms), gated=True)
    check_attention(dev, report, rng, 40, 5, 1, gated=False)
    check_attention(dev, report, rng, 0, 300, None, gated=True)  # prefill from an empty cache: query tiles
    check_attention(dev, report, rng, 700, 77, 3, gated=False)  # prefill on top of a history, with splits
    check_attention(dev, report, rng, 1000, 16, None, gated=True)  # the shortest run on tensor cores
    saved = mixers.ATTN_MMA_MIN_TOKENS
    mixers.ATTN_MMA_MIN_TOKENS = 1 << 30  # the float32 kernel on a prefill run too
    try:
        check_attention(dev, report, rng, 0, 300, None, gated=True)
    finally:
        mixers.ATTN_MMA_MIN_TOKENS = saved
    for start, tokens in ((999, 1), (1500, 5), (600, 8)):
        check_combine_act(dev, report, rng, start, tokens)
    check_combine_act(dev, report, rng, 300, 3, hq=8, hkv=2, d=64)  # four heads a superblock
    for start, tokens in ((999, 1), (1500, 5), (600, 8), (40, 3)):
        check_attn_prep(dev, report, rng, start, tokens)
    check_attn_prep(dev, report, rng, 300, 3, hq=8, hkv=2, d=64)
    check_conv(dev, report, rng)
    check_gates(dev, report, rng)
    check_delta_rule(dev, report, rng, 1, commit=True)
    check_delta_rule(dev, report, rng, 5, commit=False)
    check_delta_rule(dev, report, rng, 200, commit=True)
    for num_tokens in (1, 5, 8):
        check_delta_rule_conv(dev, report, rng, num_tokens)
    check_delta_rule_conv(dev, report, rng, 3, hk=2, hv=6, dk=64, dv=32)  # value heads narrower than key heads
    check_delta_rule_conv(dev, report, rng, 2, hk=1, hv=2, dk=32, dv=64)
    check_accept_layers(dev, report, rng, 3, 5)  # the 27B's heads
    check_accept_layers(dev, report, rng, 2, 1)
    check_accept_layers(dev, report, rng, 4, 8, hk=2, hv=6, dk=64, dv=36)  # a partial column block
    for num_tokens, mild in ((64, True), (200, True), (200, False), (512, True)):
        check_delta_rule_chunked(dev, report, rng, num_tokens, mild)
    check_qk_prep(dev, report, rng)
