"""kernels/penalties.cu in numpy, op for op: penalty_count's scatter into the marks and penalize_rows' in-place
penalties (float32 division or product for repetition with the penalty as float32, frequency and presence rounded
in float64 step by step, row t's count grown by the drafts before it). The CPU tests hold it to engine/sampling.py
apply_penalties bit for bit; the GPU check (bench/gpu_ops.py check_choose_penalised) holds the kernel to the
same."""

from __future__ import annotations

import re

import numpy as np

from engine.cuda import nvrtc

PROMPT_BIT = int(re.search(r"#define PENALTY_PROMPT_BIT (0x[0-9a-f]+)u",
                           (nvrtc.KERNEL_DIR / "penalties.cu").read_text()).group(1), 16)


def penalty_count(marks: np.ndarray, tokens: np.ndarray) -> None:
    """marks[tokens[i]] += 1 for each i, in place (a token may come twice)."""
    # marks: [V] uint32; tokens: [n] int32
    np.add.at(marks, tokens.astype(np.int64), np.uint32(1))


def penalize_rows(logits: np.ndarray, marks: np.ndarray, drafts: np.ndarray, repetition: float, frequency: float,
                  presence: float) -> None:
    """The rows penalised in place, as each thread of the kernel rewrites its token's column."""
    # logits: [T, V] float32; marks: [V] uint32; drafts: [T] (drafts[t] for t < T - 1)
    rep = np.float32(repetition)  # the launch passes it as a float32
    in_prompt = (marks & np.uint32(PROMPT_BIT)) != 0
    count = (marks & np.uint32(~PROMPT_BIT & 0xFFFFFFFF)).astype(np.int64)
    for t in range(logits.shape[0]):
        hit = np.flatnonzero((count > 0) | (in_prompt & (rep != 1)))
        z, c = logits[t, hit], count[hit]
        if rep != 1:
            z = np.where(z > 0, z / rep, z * rep).astype(np.float32)  # float32 / float32: the kernel's div.rn.f32
        if frequency != 0.0 or presence != 0.0:
            sub = frequency * c.astype(np.float64) + presence  # mul.rn.f64 then add.rn.f64
            z = np.where(c > 0, (z.astype(np.float64) - sub).astype(np.float32), z)
        logits[t, hit] = z
        if t + 1 < logits.shape[0] and drafts[t] >= 0:
            count[int(drafts[t])] += 1


def launch(dev, name: str, grid, args) -> bool:
    """Run penalty_count or penalize_rows on a host-memory device's buffers (dev.download / dev.upload) as the
    kernel would with these launch arguments; False for another kernel."""
    if name == "penalty_count":
        marks, tokens, num = args
        values = dev.download(marks, np.uint32, (marks.nbytes // 4,))
        penalty_count(values, dev.download(tokens, np.int32, (num,)))
        dev.upload(marks, values)
        return True
    if name == "penalize_rows":
        logits, vocab, ld, num_rows, marks, drafts, repetition, frequency, presence = args
        rows = dev.download(logits, np.float32, (num_rows, ld))
        view = rows[:, :vocab]
        penalize_rows(view, dev.download(marks, np.uint32, (vocab,)), dev.download(drafts, np.int32, (num_rows,)),
                      repetition, frequency.value, presence.value)
        dev.upload(logits, rows)
        return True
    return False
