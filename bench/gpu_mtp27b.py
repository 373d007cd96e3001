"""The per-op MTP head at the 27B shape (engine/cuda/model.py, OPENJET_CUDA_MTP=1): what it costs a pass (the
catch-up every pass runs: eh_proj, one attention layer and its FFN) and what a draft of d tokens costs, on the same
generated file as the model27b part, so that its default can be decided on numbers.

Drafting is eager (no graph); the passes are graph-replayed as in bench/gpu_bench27b.py.
"""

from __future__ import annotations

import time
import traceback

import numpy as np

from bench.gpu_bench27b import CONTEXT, _model_file, _time_passes
from bench.gpu_common import Report, Timing, copy_bandwidth, record

DRAFT_DEPTHS = (1, 2, 3, 4)
DRAFT_REPS = 10


def run_mtp27b(report: Report, args) -> None:
    """Load the 27B file with its MTP head, time the passes with the catch-up, then drafts of DRAFT_DEPTHS."""
    from engine.cuda.backend import CudaBackend

    path = _model_file(report)
    backend = CudaBackend.from_gguf(path, context_size=CONTEXT, max_tokens=512, mtp=True)
    try:
        if not backend.can_draft:
            record(report, "mtp27b.load", "head", "nextn tensors", 1.0, 0.5)
            report.notes.append("mtp27b: the 27B file loaded without an MTP head")
            return
        weights = backend.model.weights
        embd = weights.token_embd.buf.nbytes if weights.token_embd is not weights.output else 0
        pass_bytes = weights.nbytes - embd
        bw = copy_bandwidth(backend.dev)
        report.timings.append(bw)
        rng = np.random.default_rng(7)
        backend.prefill([int(x) for x in rng.integers(0, backend.vocab_size, size=512)])
        try:
            _time_passes(backend, report, bw.gbps, pass_bytes, ".mtp")
        except Exception:  # a capture refusing the catch-up's copies under PDL, say: the drafts still get timed
            record(report, "mtp27b.passes", "captured", "T = 1..5", 1.0, 0.5)
            report.notes.append(f"mtp27b passes raised: {traceback.format_exc(limit=6)}")
        token = int(rng.integers(0, backend.vocab_size))
        for depth in DRAFT_DEPTHS:
            meds, drafted = {}, {}
            for form, graphs in (("graph", True), ("eager", False)):  # as the backend drafts, and launched eagerly
                backend.use_graphs = graphs
                first = backend.draft(token, depth)  # warm-up (with graphs: the eager run and the capture)
                times = []
                for _ in range(DRAFT_REPS):
                    t0 = time.perf_counter()
                    draft = backend.draft(token, depth)  # downloads its tokens: the device is done when it returns
                    times.append((time.perf_counter() - t0) * 1e3)
                meds[form] = float(np.median(times))
                report.timings.append(Timing("draft", f"27b.mtp.d{depth}", form, meds[form],
                                             float(np.max(times) - np.min(times)), 0))
                ok = len(draft.tokens) == depth and all(0 <= t < backend.vocab_size for t in draft.tokens)
                record(report, "mtp27b.draft", f"d{depth}.{form}", "tokens in range, equal to the first draft's",
                       0.0 if ok and draft.tokens == first.tokens else 1.0, 0.5)
                drafted[form] = draft.tokens
            backend.use_graphs = True
            record(report, "mtp27b.draft", f"d{depth}", "the graph's tokens equal the eager launches'",
                   0.0 if drafted["graph"] == drafted["eager"] else 1.0, 0.5)
            print(f"  MTP draft of {depth}: {meds['graph']:.3f} ms from its graph, {meds['eager']:.3f} eager (wall)",
                  flush=True)
    finally:
        backend.close()
