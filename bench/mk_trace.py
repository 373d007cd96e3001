"""Greedy runs that keep their logits, and the report of where two runs part (issue 5's 27B check): used by
bench/gpu_megakernel.py on the GPU and by bench/mk_wide_vm.py on the CPU.

A first difference between two greedy runs is a fault only if it is not a near-tie: the report gives, at the first
differing position, each run's top-2 tokens and logits, the logit each run gives the other's choice, and how far the
two runs' logits were apart at the positions before (the noise that can flip a tie). `wide_config` is the
Qwen3.8-27B shape with 4 layers (3 DeltaNet + 1 attention) and the MTP block: every width of the 27B file, small
enough for the VM and the numpy reference (~3 GB of Q4_K_M, ~12 GB as float32).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PREFILL_PRECISE = 8  # prefill chunk below gemm.MIN_TOKENS (16): the per-op path then runs its precise mmvq


@dataclass(slots=True)
class Trace:
    """A greedy run: its tokens and the logits row that chose each."""

    name: str
    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)


def prefill_in_chunks(backend, tokens: list[int], chunk: int | None) -> None:
    """Feed and commit tokens, `chunk` at a time (None: one prefill call, the backend's own chunking)."""
    step = chunk or len(tokens)
    for lo in range(0, len(tokens), step):
        backend.prefill(tokens[lo : lo + step])


def trace_host(backend, name: str, prompt: list[int], num_tokens: int, chunk: int | None = None) -> Trace:
    """Greedy decoding through verify + accept (per-op CUDA, reference): one token and its logits per pass."""
    prefill_in_chunks(backend, prompt[:-1], chunk)
    out, pending = Trace(name), prompt[-1]
    while len(out.tokens) < num_tokens:
        row = np.asarray(backend.verify([pending])[0], np.float32)
        backend.accept(1)
        pending = int(np.argmax(row))
        out.tokens.append(pending)
        out.logits.append(row)
    return out


def trace_megakernel(backend, name: str, prompt: list[int], num_tokens: int) -> Trace:
    """Greedy d = 0 cycles of a MegakernelBackend (the device accepts), keeping each launch's logits."""
    from engine.backend import TokenSequence
    from engine.sampling import SamplingParams
    from engine.spec.verify import greedy_accept

    params = SamplingParams(temperature=0.0, seed=0)
    backend.keep_logits, backend.next_draft = True, 0
    prefill_in_chunks(backend, prompt[:-1], None)
    seq, out = TokenSequence.start(prompt, params), Trace(name)
    while len(out.tokens) < num_tokens:
        result = backend.cycle(seq, 0, params, rule=greedy_accept)
        out.tokens += [int(t) for t in result.tokens]
        out.logits += [np.asarray(r, np.float32) for r in backend.last_logits[: len(result.tokens)]]
    del out.tokens[num_tokens:], out.logits[num_tokens:]
    return out


def _top2(row: np.ndarray) -> dict:
    """The two best tokens of a logits row and the gap between them."""
    best = np.argsort(row)[-2:][::-1]
    return {"tokens": [int(t) for t in best], "logits": [round(float(row[t]), 5) for t in best],
            "gap": round(float(row[best[0]] - row[best[1]]), 5)}


def compare_runs(a: Trace, b: Trace) -> dict:
    """Where two greedy runs part, and whether that is a near-tie: the runs' margins for their two choices no larger
    than the logit noise between them at the positions where they still agreed."""
    n = min(len(a.tokens), len(b.tokens))
    pos = next((i for i in range(n) if a.tokens[i] != b.tokens[i]), n)
    noise = [float(np.max(np.abs(a.logits[i] - b.logits[i]))) for i in range(pos)]
    out = {"runs": [a.name, b.name], "num_tokens": n, "first_difference": pos, "equal": pos == n,
           "max_abs_dlogit_before": round(max(noise, default=0.0), 5),
           "median_max_abs_dlogit_before": round(float(np.median(noise)) if noise else 0.0, 5)}
    if pos < n:
        ra, rb, ta, tb = a.logits[pos], b.logits[pos], a.tokens[pos], b.tokens[pos]
        out[a.name], out[b.name] = _top2(ra), _top2(rb)
        out["dlogit_here"] = round(float(np.max(np.abs(ra - rb))), 5)
        # each run's margin for its own choice over the other's; together they are how far the runs moved the
        # difference of those two logits, which the noise before (per logit, so twice for a difference) can explain
        out["margins"] = [round(float(ra[ta] - ra[tb]), 5), round(float(rb[tb] - rb[ta]), 5)]
        out["near_tie"] = bool(sum(out["margins"]) <= 2 * max(out["max_abs_dlogit_before"], 1e-6))
    return out


def describe(report: dict) -> str:
    """One line for the log."""
    a, b = report["runs"]
    if report["equal"]:
        return f"{a} = {b} for {report['num_tokens']} tokens (max |dlogit| {report['max_abs_dlogit_before']})"
    return (f"{a} vs {b}: first difference at token {report['first_difference']}: {a} top-2 {report[a]}, {b} top-2 "
            f"{report[b]}, |dlogit| there {report['dlogit_here']}, before it <= {report['max_abs_dlogit_before']} "
            f"-> {'a near-tie' if report['near_tie'] else 'NOT a near-tie: a fault to find'}")


def wide_config(context_length: int = 4096):
    """The Qwen3.8-27B widths with 4 layers (3 DeltaNet, 1 attention) and its MTP block."""
    from engine.model.config import ATTENTION, DELTANET, qwen38_27b_config

    return dataclasses.replace(qwen38_27b_config(context_length), num_layers=4,
                               layer_kinds=(DELTANET, DELTANET, DELTANET, ATTENTION))


def wide_path(path: Path, workers: int | None = None) -> Path:
    """The 4-layer 27B-width file (random Q4_K_M-like blocks, as the 27B preset), written once."""
    from engine.gguf.testmodel import write_model

    if not path.exists():
        write_model(path, wide_config(), fast=True, workers=workers)
    return path
