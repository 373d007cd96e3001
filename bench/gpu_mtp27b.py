"""The per-op MTP head at the 27B shape (engine/cuda/model.py, OPENJET_CUDA_MTP=1): what it costs a pass (the
catch-up every pass runs: eh_proj, one attention layer and its FFN) and what a draft of d tokens costs, on the same
generated file as the model27b part, so that its default can be decided on numbers.

Drafts and passes run from their graphs (each also timed eagerly). Then whole decoding cycles as the server runs them
(Backend.cycle's steps: draft, verify with its logits' download, the server's rule on the host (engine/spec/verify.py
rule_for: greedy matching, or exact speculative sampling), accept), each step timed apart, greedy and sampled: what
a user's token costs beyond the graphs.
"""

from __future__ import annotations

import time
import traceback

import numpy as np

from bench.gpu_bench27b import CONTEXT, _model_file, _time_passes
from bench.gpu_common import Report, Timing, copy_bandwidth, device_events, median_time, record
from engine.backend import TokenSequence
from engine.sampling import SamplingParams, sample
from engine.spec.verify import rule_for

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
        ids = weights.mtp.drafts_from.rows  # the draft vocabulary (OPENJET_DRAFT_VOCAB: its first ids only)
        report.info["mtp27b_draft_vocab"] = ids
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
                ok = len(draft.tokens) == depth and all(0 <= t < ids for t in draft.tokens)
                record(report, "mtp27b.draft", f"d{depth}.{form}", "tokens in the draft vocab, = the first draft's",
                       0.0 if ok and draft.tokens == first.tokens else 1.0, 0.5)
                drafted[form] = draft.tokens
            backend.use_graphs = True
            record(report, "mtp27b.draft", f"d{depth}", "the graph's tokens equal the eager launches'",
                   0.0 if drafted["graph"] == drafted["eager"] else 1.0, 0.5)
            print(f"  MTP draft of {depth}: {meds['graph']:.3f} ms from its graph, {meds['eager']:.3f} eager (wall)",
                  flush=True)
        _time_cycles(backend, report, rng)
        _pass_anatomy(backend, report, token)
    finally:
        backend.close()


CYCLE_DEPTHS = (0, 1, 3, 4)
CYCLE_REPS = 12
CYCLE_SAMPLING = {"greedy": SamplingParams(temperature=0.0), "t1": SamplingParams(temperature=1.0, seed=1),
                  "t07p95": SamplingParams(temperature=0.7, top_p=0.95, seed=1),
                  "qwen": SamplingParams(temperature=0.6, top_k=20, top_p=0.95, seed=1),  # Qwen's recommended
                  # Qwen's non-thinking setting with the presence penalty its model cards suggest against repetition
                  # (on the device: kernels/penalties.cu before choose_rows)
                  "qwen_pp": SamplingParams(temperature=0.7, top_k=20, top_p=0.8, presence_penalty=1.5, seed=1)}


def _time_cycles(backend, report: Report, rng: np.random.Generator) -> None:
    """Backend.cycle's steps at each depth and sampling mode, timed apart (ms, medians), in the two forms the server
    can take: `host`, the verify's [1 + d, V] logits downloaded and the rule run on the host; `device`, each row's
    token chosen on the device (CudaBackend.verify_choose, where the request allows it). Steps: the draft (graph and
    its tokens' download), the verify, the rule, the accept (graph, synchronised; with the commit beside the next
    draft, CudaBackend.ACCEPT_BESIDE, the draft step holds it and the accept step ~nothing; greedy also times the
    commit apart, `device.apart`). The random head's drafts are mostly rejected, so a cycle's rule examines ~1 row:
    a row's host sampling is timed alone beside it."""
    from engine.cuda import backend as backend_module
    from engine.cuda.backend import device_chooses
    from engine.hostmem import keep_freed_heap

    keep_freed_heap()  # as `openjet-engine serve` does
    for mode, params in CYCLE_SAMPLING.items():
        forms = ("host", "device") if device_chooses(params) else ("host",)
        for form in forms + (("device.apart",) if mode == "greedy" and "device" in forms else ()):
            # device.apart: the commit at once after the rule, not beside the next draft (OPENJET_CUDA_ACCEPT_BESIDE=0)
            backend_module.ACCEPT_BESIDE = form != "device.apart"
            for depth in CYCLE_DEPTHS:
                host_rows = backend.num_host_rows
                seq = TokenSequence([0] * backend.num_tokens + [int(rng.integers(0, backend.vocab_size))],
                                    backend.num_tokens + 1, params.make_rng())
                steps = [_cycle_steps(backend, seq, depth, params, form.startswith("device"))
                         for _ in range(CYCLE_REPS + 2)]
                med = dict(zip(("draft", "verify", "rule", "accept", "row"), np.median(steps[2:], axis=0).tolist()))
                wall = med["draft"] + med["verify"] + med["rule"] + med["accept"]
                # rows the kernel left to the host (a top_p set past ops.CHOOSE_CAP: a flat row of the random head)
                host_rows = backend.num_host_rows - host_rows
                report.timings.append(Timing("cycle", f"27b.d{depth}.{mode}.{form}", "steps", wall, 0.0, 0,
                                             {k: round(v, 3) for k, v in med.items()} | {"host_rows": host_rows}))
                print(f"  cycle d={depth} {mode} {form}: {wall:.3f} ms = draft {med['draft']:.3f} + verify "
                      f"{med['verify']:.3f} + rule {med['rule']:.3f} + accept {med['accept']:.3f}; a row sampled on "
                      f"the host {med['row']:.3f}; rows left to the host {host_rows}", flush=True)
    backend_module.ACCEPT_BESIDE = True


def _cycle_steps(backend, seq: TokenSequence, depth: int, params: SamplingParams, on_device: bool) -> list[float]:
    """One cycle (the first two of a shape warm up: the eager run and the capture of each graph), ms a step."""
    from engine.backend import accept_choices

    rule = rule_for(params)  # the server's: greedy matching, or exact speculative sampling
    marks = [time.perf_counter()]
    draft = backend.draft(seq.pending, depth)
    marks.append(time.perf_counter())
    tokens = [seq.pending, *draft.tokens]
    if on_device:
        choices = backend.verify_choose(tokens, draft, params, seq.rng, seq)
        marks.append(time.perf_counter())
        new = accept_choices(draft, choices)
        logits = None
    else:
        logits = backend.verify(tokens)
        marks.append(time.perf_counter())
        new = rule(draft, logits, seq, params)
    marks.append(time.perf_counter())
    backend.accept(len(new))
    backend.dev.synchronize()
    marks.append(time.perf_counter())
    if logits is not None:
        sample(logits[-1], params, seq.rng, history=seq.generated, prompt=seq.prompt)
    marks.append(time.perf_counter())
    seq.tokens.extend(new)
    return [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]


ANATOMY_REPS = 12


def _pass_anatomy(backend, report: Report, token: int) -> None:
    """Where a greedy one-token cycle's wall goes beyond its pass's device time (the cycles above spend ~0.6 ms more
    in their verify step than the graph's back-to-back replays take, H100 a39dea5): the two id / position uploads
    (each synchronous), graph.launch()'s host call, the replay alone on the device (queued behind a 1 GiB copy, so
    all of it is submitted before it starts: no launch latency in it), the same replay launched onto an idle stream
    (submission included) and its wall to the host's synchronize, then choose_rows and its token's download; and
    one upload alone (what merging set_tokens' two would save); the committing one-token pass back to back (a
    one-token prefill's graph: slower than the verify pass, H100 1516039, so a cycle without drafts verifies and
    commits) and that cycle's host wall. Medians, ms."""
    from engine.cuda import ops

    dev, ws = backend.dev, backend.model.ws
    backend.verify([token])  # eager + capture
    backend.verify([token])
    backend._pending = None
    graph = backend._graphs[(1, False, 1)]
    b2b = median_time(dev, graph.launch, reps=20, warmup=3)[0]
    dev.upload(ws.choose_drafts, np.asarray([-1], np.int32))
    block = 1 << 30
    src, dst = dev.alloc(block, "anatomy.src"), dev.alloc(block, "anatomy.dst")
    rows = []
    try:
        with device_events(dev, 4) as (e0, e1, e2, e3):
            for _ in range(ANATOMY_REPS + 2):
                dev.synchronize()
                t0 = time.perf_counter()
                backend.model.set_tokens([token], backend.num_tokens)
                t1 = time.perf_counter()
                dev.upload(ws.ids, np.asarray([token, backend.num_tokens], np.int32))  # one upload: ids[0] stays
                t1b = time.perf_counter()
                e0.record()
                graph.launch()
                t2 = time.perf_counter()
                e1.record()
                dev.synchronize()
                t3 = time.perf_counter()
                ops.choose_rows(dev, ws.logits, ws.choose_drafts, ws.choose_uniforms, ws.choose_out, 1,
                                backend.vocab_size, backend.vocab_size, 0.0, 0.0, 0, 1.0)
                dev.download(ws.choose_out, np.int32, (1, 2))
                t4 = time.perf_counter()
                dev.copy(dst, src, block)  # the device busy while the host submits the replay
                e2.record()
                graph.launch()
                e3.record()
                dev.synchronize()
                rows.append([(t1 - t0) * 1e3, (t2 - t1b) * 1e3, e0.elapsed(e1), (t3 - t1b) * 1e3, (t4 - t3) * 1e3,
                             e2.elapsed(e3), (t1b - t1) * 1e3])
    finally:
        dev.memory.free(src)
        dev.memory.free(dst)
    names = ("uploads", "launch_call", "idle_replay", "launch_to_sync", "choose", "queued_replay", "one_upload")
    med = dict(zip(names, np.median(rows[2:], axis=0).tolist()))
    med["back_to_back"] = b2b
    med.update(_choice_kernels(backend))
    med["committing_back_to_back"] = _committing_b2b(backend, token)
    med["cycle"] = _one_token_cycle(backend, token)
    report.timings.append(Timing("anatomy", "27b.mtp.T1", "greedy d=0", med["uploads"] + med["launch_to_sync"]
                                 + med["choose"], 0.0, 0, {k: round(v, 4) for k, v in med.items()}))
    print(f"  one-token cycle's anatomy (ms): uploads {med['uploads']:.3f} (one alone {med['one_upload']:.3f}), "
          f"graph.launch() call {med['launch_call']:.3f}, replay from an idle stream {med['idle_replay']:.3f} "
          f"(launch to synchronize {med['launch_to_sync']:.3f}), queued behind a copy {med['queued_replay']:.3f}, "
          f"back to back {b2b:.3f}; choose + download {med['choose']:.3f}; the committing pass back to back "
          f"{med['committing_back_to_back']:.3f}; a greedy cycle without drafts (verify_choose + accept) "
          f"{med['cycle']:.3f}; on the device, one row: "
          f"choose_rows greedy {med['choose_greedy']:.4f}, sampled {med['choose_sampled']:.4f}, the two-stage "
          f"argmax {med['argmax']:.4f}", flush=True)


def _choice_kernels(backend) -> dict[str, float]:
    """Device time (ms, medians of back-to-back launches) of one row's choice over the pass's logits: choose_rows
    greedy (one 1,024-thread block a row) and sampled at t = 1 (the draft -1), and ops.argmax's two stages (a block
    a chunk, then one): what a greedy choice over many blocks would save."""
    from engine.cuda import ops

    dev, ws, vocab = backend.dev, backend.model.ws, backend.vocab_size
    dev.upload(ws.choose_drafts, np.asarray([-1], np.int32))
    dev.upload(ws.choose_uniforms, np.asarray([[0.5, 0.5]]))

    def choose(temperature: float) -> None:
        ops.choose_rows(dev, ws.logits, ws.choose_drafts, ws.choose_uniforms, ws.choose_out, 1, vocab, vocab,
                        temperature, 0.0, 0, 1.0)

    return {"choose_greedy": median_time(dev, lambda: choose(0.0), reps=20, warmup=3)[0],
            "choose_sampled": median_time(dev, lambda: choose(1.0), reps=20, warmup=3)[0],
            "argmax": median_time(dev, lambda: ops.argmax(dev, ws.logits, ws.choose_out, ws.argmax_scratch, 1, vocab,
                                                          vocab), reps=20, warmup=3)[0]}


def _committing_b2b(backend, token: int) -> float:
    """The committing one-token pass (a one-token prefill's graph) replayed back to back, ms (median): each replay
    advances the state a position, so the sequence is rolled back after."""
    dev = backend.dev
    saved = backend.checkpoint()
    backend.prefill([token])
    backend.prefill([token])  # the first is eager: the second captures
    graph = backend._graphs[(1, True, 1)]
    try:
        return median_time(dev, graph.launch, reps=20, warmup=3)[0]
    finally:
        backend.rollback(saved)


def _one_token_cycle(backend, token: int) -> float:
    """A greedy cycle without drafts, host wall (ms, median) to the chosen token and the state committed:
    verify_choose, then accept and its commit (the DeltaNet layers re-run over the token)."""
    from engine.backend import Draft

    params, rng, times = SamplingParams(temperature=0.0), np.random.default_rng(0), []
    saved = backend.checkpoint()
    try:
        for _ in range(ANATOMY_REPS + 2):
            backend.dev.synchronize()
            t0 = time.perf_counter()
            backend.verify_choose([token], Draft([]), params, rng)
            backend.accept(1)
            backend._commit()
            backend.dev.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            backend.rollback(saved)
    finally:
        backend.rollback(saved)
    return float(np.median(times[2:]))
