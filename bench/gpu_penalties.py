"""Checks of the penalties on the device (kernels/penalties.cu, engine/cuda/penalties.py) against the host's rules,
on fresh random 248,320-wide rows and a long prompt: the penalised logits bit for bit (engine/sampling.py
apply_penalties, row t's history the generated tokens and drafts 0..t-1), the marks an incremental update leaves,
greedy choices exactly, and sampled choices (choose_rows after the penalties) within the 1 % of rows check_choose_
rows allows at rounding boundaries. Part `sample` of bench/gpu_check.py, which also times the two kernels."""

from __future__ import annotations

import numpy as np

from bench.gpu_common import Report, Timing, median_time, record
from bench.gpu_ops import Scope, _choose, _Uniforms, choose_forms, randn
from engine.backend import TokenSequence
from engine.cuda import penalties
from engine.cuda.device import Device
from engine.sampling import SamplingParams, apply_penalties, keep_or_resample, sample

F32 = np.float32

# Repetition alone; frequency with presence; Qwen's non-thinking setting with its presence penalty against
# repetition; all three under top_k, top_p and min_p; penalties below neutral (repeats favoured)
PENALTY_CASES = (SamplingParams(temperature=0.7, repetition_penalty=1.3),
                 SamplingParams(temperature=0.8, frequency_penalty=0.5, presence_penalty=1.5),
                 SamplingParams(temperature=0.7, top_k=20, top_p=0.8, presence_penalty=1.5),
                 SamplingParams(temperature=0.6, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                                frequency_penalty=0.3, presence_penalty=1.0),
                 SamplingParams(temperature=1.0, repetition_penalty=0.8, presence_penalty=-2.0))
GREEDY_PENALISED = SamplingParams(temperature=0, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=1.5)


def penalty_inputs(rng: np.random.Generator, vocab: int,
                   prompt_len: int) -> tuple[np.ndarray, TokenSequence, np.ndarray]:
    """(logits [6, V], a sequence, drafts [6]): a few likely tokens a row, which the prompt and the history hold
    (the penalties move the choice); drafts 0 and 3 are rows 1's and 4's top token (penalised there as drafts
    before them), drafts 1 and 2 the same token (counted twice from row 3), no draft after the last row."""
    logits = randn(rng, 6, vocab, scale=2.0)
    likely = rng.choice(vocab, 40, replace=False)
    logits[:, likely] += rng.uniform(4, 12, 40).astype(F32)
    top = np.argmax(logits, axis=1)
    prompt = rng.integers(0, vocab, prompt_len)
    prompt[rng.integers(0, prompt_len, 20)] = likely[rng.integers(0, 40, 20)]
    generated = np.concatenate([rng.choice(likely[:20], 200), rng.integers(0, vocab, 100), top[:3]])
    seq = TokenSequence([int(t) for t in (*prompt, *generated)], prompt_len)
    drafts = np.array([top[1], likely[5], likely[5], top[4], int(rng.integers(vocab)), -1], np.int32)
    return logits, seq, drafts


def check_choose_penalised(dev: Device, report: Report, rng: np.random.Generator, vocab: int = 248320,
                           trials: int = 40, prompt_len: int = 20_000) -> None:
    """The penalties on 6 verify rows, then choose_rows, against the host's rules fed the same uniform numbers."""
    s = Scope(dev)
    logits, seq, drafts = penalty_inputs(rng, vocab, prompt_len)
    counts = penalties.PenaltyCounts(dev, vocab)
    grown = seq.tokens[-5:]
    del seq.tokens[-5:]
    counts.sync(seq)
    s.bufs += [counts.marks, counts.staging]
    seq.tokens.extend(grown)
    counts.sync(seq)  # the last five tokens through penalty_count
    marks = dev.download(counts.marks, np.uint32, (vocab,))
    record(report, "penalty_count", "incremental", f"{len(seq.tokens)} tokens, 5 new",
           float(counts.num_rebuilds != 1 or np.any(marks != penalties.host_marks(seq, vocab))), 0.5)
    lb, db, ub, out = s.put(logits), s.put(drafts), s.out(16 * 6), s.out(8 * 6)
    bufs = (lb, db, ub, out)
    forms = choose_forms(s, 6)
    histories = [seq.generated + [int(x) for x in drafts[:t]] for t in range(6)]
    for params in (GREEDY_PENALISED, *PENALTY_CASES):
        dev.upload(lb, logits)
        counts.apply(lb, db, 6, params)
        got = s.get(lb, (6, vocab))
        want = np.stack([apply_penalties(logits[t], params, histories[t], seq.prompt) for t in range(6)])
        record(report, "penalize_rows", _name(params), f"6x{vocab}, prompt {prompt_len}",
               float(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32))), 0.5)
        for form, parts in forms:
            if params.is_greedy:
                chosen = _choose(dev, s, bufs, 6, vocab, penalties.without_penalties(params), parts)
                top = np.argmax(want, axis=1)
                moved = int(np.count_nonzero(top != np.argmax(logits, axis=1)))
                record(report, "choose_rows", f"{form}greedy.{_name(params)}", f"argmax, kept; {moved} rows moved",
                       float(np.any(chosen[:, 0] != top) or np.any(chosen[:5, 1] != (top[:5] == drafts[:5]))), 0.5)
                continue
            differ = 0
            for _ in range(trials):
                u = rng.random((6, 2))
                dev.upload(ub, u)
                chosen = _choose(dev, s, bufs, 6, vocab, penalties.without_penalties(params), parts)
                differ += _differences(chosen, logits, drafts, u, params, histories, seq.prompt)
            record(report, "choose_rows", f"{form}{_name(params)}", f"{trials}x6 rows", differ / (trials * 6), 0.01)
    s.close()


def _differences(got: np.ndarray, logits: np.ndarray, drafts: np.ndarray, u: np.ndarray, params: SamplingParams,
                 histories: list[list[int]], prompt: list[int]) -> int:
    """Rows whose (token, kept) differ from the host's rules on the raw logits with the row's history."""
    # got: [T, 2] int32 (choose_rows' out); logits: [T, V]; u: [T, 2]
    differ = 0
    for t in range(len(drafts)):
        history = histories[t]
        want = (keep_or_resample(logits[t], params, int(drafts[t]), _Uniforms(*u[t]), history, prompt)
                if drafts[t] >= 0 else (False, sample(logits[t], params, _Uniforms(u[t, 0]), history, prompt)))
        differ += (int(got[t, 0]), bool(got[t, 1])) != (want[1], want[0])
    return differ


def _name(params: SamplingParams) -> str:
    """t0.7.k20.p0.8.minp0.0.r1.0.f0.0.pp1.5"""
    return (f"t{params.temperature}.k{params.top_k}.p{params.top_p}.minp{params.min_p}.r{params.repetition_penalty}"
            f".f{params.frequency_penalty}.pp{params.presence_penalty}")


def time_penalties(dev: Device, report: Report, rng: np.random.Generator, vocab: int = 248320,
                   prompt_len: int = 20_000) -> None:
    """penalize_rows on 1 and 5 verify rows (all three penalties, a prompt of prompt_len tokens), and the
    incremental penalty_count of 5 tokens, by CUDA events (ms, medians)."""
    s = Scope(dev)
    logits, seq, drafts = penalty_inputs(rng, vocab, prompt_len)
    counts = penalties.PenaltyCounts(dev, vocab)
    counts.sync(seq)
    s.bufs += [counts.marks, counts.staging]
    lb, db = s.put(logits), s.put(drafts)
    params = PENALTY_CASES[3]
    for rows in (1, 5):  # the rows' logits drift as the timing repeats the penalties: the time does not
        med, spread = median_time(dev, lambda: counts.apply(lb, db, rows, params))
        report.timings.append(Timing("penalize_rows", f"rows{rows}", f"{rows}x{vocab}", med, spread, 4 * vocab))
        print(f"  penalize_rows {rows} rows: {1e3 * med:.1f} us", flush=True)
    staging = s.put(np.asarray(seq.tokens[-5:], np.int32))
    med, spread = median_time(dev, lambda: penalties.penalty_count(dev, counts.marks, staging, 5))
    report.timings.append(Timing("penalty_count", "5", "5 tokens", med, spread))
    print(f"  penalty_count 5 tokens: {1e3 * med:.1f} us", flush=True)
    s.close()
