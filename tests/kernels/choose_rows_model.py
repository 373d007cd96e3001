"""kernels/sample.cu choose_rows in numpy, step for step: the threshold search (probes, narrowing, the CHOOSE_CAP
flag), the candidates' order and cut, the set's last member as the membership test, the segment sums and the walk.
Its weights are the host's (engine/sampling.py _weights); the kernel's expf may differ from numpy's exp in the last
bit, and its float64 sums run in another order, which the GPU check (bench/gpu_ops.py check_choose_rows) tolerates
at boundaries. The CPU tests hold this model to the host's rules, so the kernel's algorithm is checked here and its
arithmetic there."""

from __future__ import annotations

import re
from itertools import count

import numpy as np

from engine.cuda import nvrtc

PROBES, REFINES = 4, 6  # sample.cu CHOOSE_PROBES, CHOOSE_REFINES
_SOURCE = (nvrtc.KERNEL_DIR / "sample.cu").read_text()
CHOOSE_CAP = int(re.search(r"#define CHOOSE_CAP (\d+)", _SOURCE).group(1))
CHOOSE_CANDIDATES = int(re.search(r"#define CHOOSE_CANDIDATES (\d+)", _SOURCE).group(1))
LEAST_WEIGHT = np.float32(np.finfo(np.float32).smallest_subnormal)


def choose_rows(logits: np.ndarray, drafts: np.ndarray, uniforms: np.ndarray, temperature: float, min_p: float,
                top_k: int, top_p: float, greedy: bool, cap: int = CHOOSE_CAP, spread: bool = False) -> np.ndarray:
    """out [T, 2] int32 as the kernel writes it: (token, kept), token -1 or -2 for the rows it refuses."""
    # logits: [T, V] float32; drafts: [T] (-1: none); uniforms: [T, 2] float64
    return np.array([choose_row(logits[t], int(drafts[t]), uniforms[t], temperature, min_p, top_k, top_p, greedy, cap,
                                spread) for t in range(logits.shape[0])], np.int32).reshape(-1, 2)


def choose_row(row: np.ndarray, x: int, u: np.ndarray, temperature: float, min_p: float, top_k: int, top_p: float,
               greedy: bool, cap: int = CHOOSE_CAP, spread: bool = False) -> tuple[int, int]:
    """One block's work, or with spread, choose_rows' after choose_top and choose_weigh: (token, kept)."""
    top = row.max()
    if np.isnan(top) or top == -np.inf:
        return -1, 0
    if greedy:
        at = int(np.argmax(row))
        return at, int(at == x)
    if top == np.inf:
        return -2, 0
    w = np.exp(np.subtract(row, top, dtype=np.float32) / np.float32(temperature))
    last = (np.float32(0), 2**31 - 1)  # every token
    if spread and (top_k > 0 or top_p < 1.0) and (kept := kept_of_parts(w, top_k, top_p, cap)) is not None:
        return _keep_or_walk_kept(kept, w, min_p, x, u)
    if top_k > 0 or top_p < 1.0:
        last = last_kept(w, top_k, top_p, cap)
        if last is None:
            return -2, 0
    ids = np.arange(row.shape[0])
    kept = (w > last[0]) | ((w == last[0]) & (ids <= last[1]))
    return _keep_or_walk(np.where(kept & (w >= np.float32(min_p)), w, np.float32(0)), x, u)


def find_threshold(w: np.ndarray, top_k: int, top_p: float, cap: int) -> tuple[np.float32, int, float] | None:
    """sample.cu find_threshold: (threshold, its candidates' count, every token's mass), None past cap."""
    total = float(w.sum(dtype=np.float64)) if top_k == 0 else 0.0
    if top_k == 0 and top_p * total > cap:  # no weight passes the top's 1: the set has more than cap tokens
        return None
    lo, hi, lo_count, narrowed = np.float32(0), np.float32(-1), 0, 0
    for num_pass in count():
        if hi < 0:
            e = [np.float32(min(16 * num_pass + 4 * i, 149)) for i in range(PROBES)]
        else:
            e = [lo + (hi - lo) * np.float32(i + 1) / np.float32(PROBES + 1) for i in range(PROBES)]
        thr = [max(np.float32(2.0 ** -float(ei)), LEAST_WEIGHT) for ei in e]
        counts = [int((w >= t).sum()) for t in thr]
        masses = [float(w[w >= t].sum(dtype=np.float64)) for t in thr]
        holds = [c >= top_k if top_k > 0 else m >= top_p * total for c, m in zip(counts, masses)]
        first = holds.index(True) if any(holds) else -1
        if first >= 0 and counts[first] <= cap:
            return thr[first], counts[first], total
        if first < 0 and e[-1] >= 149:  # every token with a weight, and still short of the set
            return (thr[-1], counts[-1], total) if counts[-1] <= cap else None
        if first != 0:
            lo, lo_count = e[first - 1 if first > 0 else -1], counts[first - 1 if first > 0 else -1]
        if first >= 0:
            hi = e[first]
        narrowed += hi >= 0
        if lo_count > cap or narrowed > REFINES:  # lo's candidates, short of the set, are too many already
            return None
    raise AssertionError("unreachable")


def last_kept(w: np.ndarray, top_k: int, top_p: float, cap: int = CHOOSE_CAP) -> tuple[np.float32, int] | None:
    """sample.cu find_last_kept: the top_k / top_p set's last (weight, id), None where its candidates do not fit."""
    found = find_threshold(w, top_k, top_p, cap)
    if found is None:
        return None
    thr, num, total = found
    ids = np.flatnonzero(w >= thr)
    assert len(ids) == num
    last = _kept_set(w, ids, top_k, top_p, total)[-1]
    return w[last], int(last)


def _kept_set(w: np.ndarray, ids: np.ndarray, top_k: int, top_p: float, total: float) -> np.ndarray:
    """The candidates ids by falling weight (ties by ascending id), cut at top_k, then where the running mass first
    reaches top_p of the top_k set's (or without top_k, of total), as find_last_kept cuts them."""
    order = ids[np.lexsort((ids, -w[ids]))]
    n = min(top_k, len(order)) if top_k > 0 else len(order)
    cut = n
    if top_p < 1.0:
        mass = np.cumsum(w[order[:n]], dtype=np.float64)
        mass /= mass[-1] if top_k > 0 else total
        reached = np.flatnonzero(mass >= top_p)
        cut = int(reached[0]) + 1 if len(reached) else n
    return order[:cut]


def kept_of_parts(w: np.ndarray, top_k: int, top_p: float, cap: int = CHOOSE_CAP) -> np.ndarray | None:
    """sample.cu choose_kept_of_parts' set: the ids top_k / top_p keep, by falling weight, from pass 0 of
    find_threshold (its four probes, summed over choose_weigh's chunks) and the listed candidates (weight >= 2^-12);
    None where they do not settle the row (choose_rows' own passes do)."""
    total = float(w.sum(dtype=np.float64)) if top_k == 0 else 0.0
    if top_k == 0 and top_p * total > cap:
        return None
    thr = [np.float32(2.0 ** (-4 * i)) for i in range(PROBES)]
    counts = [int((w >= t).sum()) for t in thr]
    masses = [float(w[w >= t].sum(dtype=np.float64)) for t in thr]
    holds = [c >= top_k if top_k > 0 else m >= top_p * total for c, m in zip(counts, masses)]
    first = holds.index(True) if any(holds) else -1
    if first < 0 or counts[first] > cap or counts[-1] > CHOOSE_CANDIDATES:
        return None
    return _kept_set(w, np.flatnonzero(w >= thr[first]), top_k, top_p, total)


def _keep_or_walk_kept(kept: np.ndarray, w: np.ndarray, min_p: float, x: int, u: np.ndarray) -> tuple[int, int]:
    """choose_kept_of_parts' draw: the keep test and the inverse CDF's walk over the kept ids by ascending id."""
    ids = np.sort(kept)
    weights = np.where(w[ids] >= np.float32(min_p), w[ids], np.float32(0)).astype(np.float64)
    total, wx = 0.0, 0.0
    for i, wk in zip(ids, weights):
        total += wk
        wx = wk if i == x else wx
    if x >= 0 and (u[0] * total < wx or total - wx <= 0.0):
        return x, 1
    target, last = (u[1] if x >= 0 else u[0]) * (total - wx), -1
    for i, wk in zip(ids, weights):
        if wk <= 0.0 or i == x:
            continue
        last = int(i)
        if target < wk:
            break
        target -= wk
    return last, 0


def _keep_or_walk(kept: np.ndarray, x: int, u: np.ndarray) -> tuple[int, int]:
    """The keep test, then the segment the draw lands in and the walk inside it (kept: p's weights [V])."""
    size = kept.shape[0]
    seg = 32 * ((size + 32 * 1024 - 1) // (32 * 1024))
    seg_w = np.add.reduceat(kept, np.arange(0, size, seg), dtype=np.float64)
    total = float(sum(seg_w))
    wx = float(kept[x]) if x >= 0 else 0.0
    if x >= 0 and (u[0] * total < wx or total - wx <= 0.0):
        return x, 1
    target, last = (u[1] if x >= 0 else u[0]) * (total - wx), -1
    for s, mass in enumerate(seg_w):
        mass -= wx if s * seg <= x < (s + 1) * seg else 0.0
        if mass <= 0.0:
            continue
        last = s
        if target < mass:
            break
        target -= mass
    chosen = -1
    for k in range(last * seg, min(size, (last + 1) * seg)):
        weight = 0.0 if k == x else float(kept[k])
        if weight <= 0.0:
            continue
        chosen = k
        if target < weight:
            break
        target -= weight
    return chosen, 0
