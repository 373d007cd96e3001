"""Value ranges and precision of the Qwen3.8-27B shape on the CPU, one layer at a time (issue 5).

  python bench/mk_ranges.py --model /tmp/mk27/m.gguf      (the file `make-test-model --preset qwen3.8-27b` writes)

The megakernel keeps its matmul inputs (act_h, act_mix, act_ffn, act_eh) as f16 hi + lo pairs with f16 hi + lo
sums of every 32-position sub-block, and the KV cache in f16 (bench/MEGAKERNEL.md). Does anything leave f16's range
(65504), or lose precision, at 64 layers of random weights? The numpy reference cannot load the 27B file (every
weight dequantized at load: ~108 GB), so this driver dequantizes one layer at a time and pushes the prompt's tokens
through it in three variants that share the dequantized weights:

  f32   the reference itself (engine/reference: deltanet_layer, attention_layer, ops), the specification;
  hilo  what both GPU paths decode with: every matmul input rounded to f16 hi + lo, KV stored in f16;
  f16   the per-op path's prefill GEMM (kernels/gemm.cu, 16 tokens or more): matmul inputs rounded to f16 (the lo
        half is not read) and weights rounded to f16, KV in f16.

Per layer and variant it records max |x| of the residual stream, of each matmul's input and output, of the
sub-block sums, the attention scores, the keys and values, the DeltaNet state, and the relative error the act
layout's rounding puts on each matmul input; at the end the logits of every prompt position in each variant:
their top-2 gaps and how far the variants move them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from engine.reference import ops, qwen35, transformer  # noqa: E402
from engine.reference.state import KVCache  # noqa: E402

F16_MAX = 65504.0
F16_MIN_NORMAL = 2.0**-14
VARIANTS = ("f32", "hilo", "f16")
LM_CHUNK = 16384  # lm_head rows dequantized at a time (16384 x 5120 f32: 335 MB)


def prompt_tokens(num: int) -> list[int]:
    """The prompt bench/gpu_megakernel.py's 27B check decodes from (the same generator)."""
    return [int(t) for t in np.random.default_rng(3).integers(0, 150000, num)]


def round_hilo(x: np.ndarray) -> np.ndarray:
    """x as the act layout holds it: f16 hi plus the f16 rounding of the residue."""
    with np.errstate(over="ignore"):
        hi = x.astype(np.float16)
        lo = (x - hi.astype(np.float32)).astype(np.float16)
    return hi.astype(np.float32) + lo.astype(np.float32)


def round_f16(x: np.ndarray) -> np.ndarray:
    """x rounded once to f16 (and back)."""
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


class F16Cache(KVCache):
    """A reference KV cache whose rows are stored in f16, as both GPU paths store them."""

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store f16-rounded keys and values."""
        KVCache.write(self, start, round_f16(k), round_f16(v))


class Stats:
    """Per (layer, variant): name -> the largest value seen."""

    def __init__(self):
        self.rows: dict[str, dict[str, float]] = {}
        self.key = ""

    def put(self, name: str, value: float) -> None:
        """Keep the maximum of `name` in the current row."""
        row = self.rows.setdefault(self.key, {})
        row[name] = max(row.get(name, 0.0), float(value))


def input_stats(stats: Stats, name: str, x: np.ndarray) -> None:
    """Range of a matmul input, its 32-wide sub-block sums, and what the act layout's rounding costs it."""
    stats.put(f"{name}.in_max", np.abs(x).max())
    width = x.shape[-1] - x.shape[-1] % 32
    stats.put(f"{name}.sum32_max", np.abs(x[..., :width].reshape(-1, 32).sum(axis=1)).max())
    nonzero = x[x != 0]
    stats.put(f"{name}.subnormal_frac", np.mean(np.abs(nonzero) < F16_MIN_NORMAL) if nonzero.size else 0.0)
    norm = np.linalg.norm(x)
    stats.put(f"{name}.hilo_rel_err", np.linalg.norm(round_hilo(x) - x) / norm if norm else 0.0)


@contextmanager
def variant_ops(variant: str, names: dict[int, str], stats: Stats):
    """ops.matmul and ops.attention of one variant (rounded inputs / weights), recording ranges as they run."""
    matmul, attention = ops.matmul, ops.attention
    rounded: dict[int, np.ndarray] = {}

    def hooked_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        name = names.get(id(w), "other")
        input_stats(stats, name, x)
        if variant == "hilo":
            x = round_hilo(x)
        elif variant == "f16":
            x = round_f16(x)
            if id(w) not in rounded:
                rounded[id(w)] = round_f16(w)
            w = rounded[id(w)]
        y = matmul(x, w)
        stats.put(f"{name}.out_max", np.abs(y).max())
        return y

    def hooked_attention(q, k, v, q_positions, scale, block=256):
        group = q.shape[1] // k.shape[1]
        kk = np.repeat(k, group, axis=1)  # [S, Hq, D]
        scores = np.einsum("thd,shd->ths", q, kk) * scale
        visible = np.arange(k.shape[0])[None, None, :] <= np.asarray(q_positions)[:, None, None]
        stats.put("attn.score_max", np.abs(np.where(visible, scores, 0.0)).max())
        stats.put("attn.k_max", np.abs(k).max())
        stats.put("attn.v_max", np.abs(v).max())
        return attention(q, k, v, q_positions, scale, block)

    ops.matmul, ops.attention = hooked_matmul, hooked_attention
    try:
        yield
    finally:
        ops.matmul, ops.attention = matmul, attention


def dense_layer(infos: dict) -> dict[str, np.ndarray]:
    """One layer's tensors dequantized to float32 (the reference's weights for that layer)."""
    from engine.gguf.quants import dequantize

    return {key: np.ascontiguousarray(dequantize(info.data, info.qtype, info.shape), dtype=np.float32)
            for key, info in infos.items()}


def run_layer(cfg, i: int, w: dict, x: np.ndarray, state: dict, variant: str, stats: Stats) -> np.ndarray:
    """Layer i of the reference over the prompt's rows in one variant; its state (KV / DeltaNet) in `state`."""
    names = {id(v): k for k, v in w.items()}
    stats.key = f"{i}.{variant}"
    stats.put("x.in_max", np.abs(x).max())
    stats.put("x.in_rms", np.sqrt(np.mean(np.square(x, dtype=np.float64))))
    with variant_ops(variant, names, stats):
        if cfg.layer_kinds[i] == "attention":
            cache = state.setdefault(i, (KVCache if variant == "f32" else F16Cache).empty(
                cfg.num_kv_heads, cfg.head_dim, x.shape[0]))
            out = transformer.attention_layer(x, w, cfg, cache, 0)
        else:
            dn = state.setdefault(i, qwen35.empty_deltanet_state(cfg))
            out, steps = qwen35.deltanet_layer(x, w, cfg, dn, keep_steps=False)
            stats.put("dn.state_max", np.abs(steps.ssm_states).max())
    stats.put("x.out_max", np.abs(out).max())
    return out


def lm_head(tensors, xs: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
    """logits [T, V] of each variant: output_norm, then the output matrix LM_CHUNK rows at a time."""
    from engine.gguf.quants import dequantize

    top = tensors.global_tensors
    norm = np.asarray(dequantize(top["output_norm"].data, top["output_norm"].qtype, top["output_norm"].shape),
                      np.float32)
    info = top["output"]
    data = info.data.reshape(info.shape[0], -1)  # rows of raw blocks
    normed = {v: ops.rms_norm(x, norm, cfg.rms_eps) for v, x in xs.items()}
    out = {v: np.empty((x.shape[0], cfg.vocab_size), np.float32) for v, x in xs.items()}
    for r0 in range(0, cfg.vocab_size, LM_CHUNK):
        rows = min(LM_CHUNK, cfg.vocab_size - r0)
        w = np.asarray(dequantize(data[r0 : r0 + rows], info.qtype, (rows, info.shape[1])), np.float32)
        for v, h in normed.items():
            ww = round_f16(w) if v == "f16" else w
            hh = round_hilo(h) if v == "hilo" else round_f16(h) if v == "f16" else h
            out[v][:, r0 : r0 + rows] = np.matmul(hh, ww.T, dtype=np.float32)
    return out


def logit_report(logits: dict[str, np.ndarray]) -> dict:
    """Top-2 gaps of the reference per position, and how far each variant moves the logits and the argmax."""
    ref = logits["f32"]
    top2 = np.sort(ref, axis=1)[:, -2:]
    gaps = top2[:, 1] - top2[:, 0]
    out = {"f32_top2_gap": [round(float(g), 5) for g in gaps],
           "f32_top1": [int(t) for t in ref.argmax(axis=1)]}
    for v in VARIANTS[1:]:
        diff = np.abs(logits[v] - ref)
        out[v] = {"max_abs_dlogit": [round(float(d), 5) for d in diff.max(axis=1)],
                  "median_abs_dlogit": round(float(np.median(diff)), 6),
                  "argmax_equal": [bool(a) for a in logits[v].argmax(axis=1) == ref.argmax(axis=1)]}
    d = np.abs(logits["f16"] - logits["hilo"])
    out["f16_vs_hilo_max_abs_dlogit"] = [round(float(x), 5) for x in d.max(axis=1)]
    return out


def summarise(stats: Stats, num_layers: int) -> dict:
    """The largest value of every statistic over all layers, per variant, and where it was."""
    out: dict[str, dict] = {}
    for variant in VARIANTS:
        best: dict[str, tuple[float, int]] = {}
        for i in range(num_layers):
            for name, value in stats.rows.get(f"{i}.{variant}", {}).items():
                if name not in best or value > best[name][0]:
                    best[name] = (value, i)
        out[variant] = {name: {"max": float(f"{v:.4g}"), "layer": i} for name, (v, i) in sorted(best.items())}
    return out


def run(path: Path, num_tokens: int, num_layers: int | None) -> dict:
    """The whole measurement: embedding, layers one at a time, lm_head; the results as a dict."""
    from engine.gguf.quants import dequantize_rows
    from engine.model.weights import load_model

    _, cfg, tensors = load_model(str(path))
    layers = cfg.num_layers if num_layers is None else min(num_layers, cfg.num_layers)
    tokens = prompt_tokens(num_tokens)
    embd = tensors.global_tensors["token_embd"]
    x0 = dequantize_rows(embd.data, embd.qtype, embd.shape, np.asarray(tokens, np.int64))
    xs = {v: x0.copy() for v in VARIANTS}
    states: dict[str, dict] = {v: {} for v in VARIANTS}
    stats, t0 = Stats(), time.perf_counter()
    for i in range(layers):
        w = dense_layer(tensors.layers[i])
        for v in VARIANTS:
            xs[v] = run_layer(cfg, i, w, xs[v], states[v], v, stats)
        del w
        print(f"layer {i} ({cfg.layer_kinds[i]}): |x| max {stats.rows[f'{i}.f32']['x.out_max']:.1f}, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    logits = lm_head(tensors, xs, cfg)
    summary = summarise(stats, layers)
    over = sorted({f"{v}:{name}" for v, row in summary.items() for name, s in row.items()
                   if name.endswith(("in_max", "sum32_max", "k_max", "v_max")) and s["max"] > F16_MAX})
    return {"model": str(path), "tokens": tokens, "num_layers": layers, "seconds": round(time.perf_counter() - t0),
            "past_f16_range": over, "summary": summary, "per_layer": stats.rows, "logits": logit_report(logits)}


def main(argv: list[str] | None = None) -> int:
    """Measure, print the summary, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("/tmp/mk27/m.gguf"))
    parser.add_argument("--tokens", type=int, default=32, help="prompt tokens (gpu_megakernel.py's prompt)")
    parser.add_argument("--layers", type=int, default=None, help="only the first N layers (a quick look)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" /
                        f"mk-ranges-{time.strftime('%Y-%m-%d')}.json")
    args = parser.parse_args(argv)
    result = run(args.model, args.tokens, args.layers)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"]["f32"], indent=1))
    print(json.dumps({k: v for k, v in result["logits"].items() if k != "f32_top1"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
