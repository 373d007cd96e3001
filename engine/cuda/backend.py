"""CudaBackend: the backend contract (engine.backend) on the GPU, one kernel per op, decode steps replayed from
CUDA graphs.

A verify pass of T tokens (and a prefill chunk) is the same launch sequence at every position, because ids and
positions live in device memory: the first pass of each (T, commit) shape is captured into a graph, and every
later one uploads its ids and positions and replays it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.backend import Backend, Checkpoint, Draft, RowChoices, TokenSequence, draft_vocab_size
from engine.cuda import env_flag, gemm, mixers, ops
from engine.cuda.device import Buffer, Device, Graph
from engine.cuda.model import VERIFY_MAX, CudaModel
from engine.cuda.penalties import PenaltyCounts, has_penalties, without_penalties
from engine.errors import ContextOverflowError
from engine.sampling import SamplingParams, sample
from engine.spec.verify import keep_or_draw

# "0": leave the file's MTP head out (no draft(); the server drafts n-grams). On by default: checked on the H200
# (tiny qwen35: drafts and speculative greedy decoding equal to the reference's) and timed at the 27B shape (its
# catch-up adds 0.18 ms to an 8.0 ms pass, a draft of 4 takes 2.8 ms; bench/NOTES.md v17).
MTP_ENV = "OPENJET_CUDA_MTP"


@dataclass(slots=True, weakref_slot=True)
class CudaCheckpoint(Checkpoint):
    """Device copies of the committed state: KV rows 0..num_tokens-1 and every DeltaNet window and state."""

    owner: int
    copies: dict[str, tuple[Buffer, Buffer, int]] = field(default_factory=dict)  # name -> (copy, source, bytes)


# Each verify row's token chosen on the device (CudaBackend.verify_choose); OPENJET_CUDA_CHOOSE=0 downloads the logits
# and runs the rule on the host, as before 2026-12-06 (bench/NOTES.md Z10).
CHOOSE_ENV = "OPENJET_CUDA_CHOOSE"
CHOOSE = env_flag(CHOOSE_ENV, True)
# The choice's passes over a row spread over ops.CHOOSE_CHUNKS blocks (choose_top, choose_weigh) before choose_rows
# reads their parts, instead of one block a row making every pass (~0.12 ms a sampled row on the H200, bench/
# NOTES.md Z28). On an H100 (81fcef2, bench/NOTES.md Z30) every check of both forms passed and a one-row choice
# took 5.0 / 53.8 / 16.3 us (greedy / t = 1 / Qwen's top_k 20, top_p 0.95) against the block's 16.7 / 113.7 / 94.4,
# never slower in any case timed; OPENJET_CUDA_CHOOSE_SPREAD=0 keeps the one block.
CHOOSE_SPREAD_ENV = "OPENJET_CUDA_CHOOSE_SPREAD"
CHOOSE_SPREAD = env_flag(CHOOSE_SPREAD_ENV, True)


def device_chooses(params: SamplingParams) -> bool:
    """Whether kernels/sample.cu choose_rows has the request's arithmetic: temperature (0: greedy), top_k (up to
    ops.CHOOSE_CAP), top_p and min_p, after the penalties kernels/penalties.cu applies (repetition, frequency,
    presence: the sequence's tokens kept on the device, engine/cuda/penalties.py)."""
    return CHOOSE and params.top_k <= ops.CHOOSE_CAP and (params.is_greedy or params.temperature >= 1e-30)


# The commit of an accepted prefix (every DeltaNet layer's state advanced over it: 0.2 ms a cycle on the H100,
# bench/NOTES.md Z8) left until the next call that needs the state, and when that is an MTP draft, run on a side
# stream beside it (the draft reads only the MTP head's starting hidden, which is copied first). OPENJET_CUDA_
# ACCEPT_BESIDE=0 commits at once, as before 2026-12-06 (bench/NOTES.md Z11).
ACCEPT_BESIDE_ENV = "OPENJET_CUDA_ACCEPT_BESIDE"
ACCEPT_BESIDE = env_flag(ACCEPT_BESIDE_ENV, True)


class CudaBackend(Backend):
    """The per-op CUDA engine for qwen35 / qwen3 / qwen2 / llama."""

    def __init__(self, model: CudaModel, context_size: int, use_graphs: bool = True, owns_device: bool = True):
        self.model, self.dev, self.owns_device = model, model.dev, owns_device
        self._context_size, self.use_graphs = context_size, use_graphs
        self._num_tokens = 0
        self._prefill_chunk = model.ws.max_tokens
        self._uncommitted: int | None = None  # tokens accept() took whose DeltaNet commit has not run yet
        self._pending: int | None = None  # tokens of an unaccepted verify pass
        self._graphs: dict[tuple, Graph] = {}  # passes by (tokens, commit, logits rows); ("accept", n); ("draft", d)
        self.num_host_rows = 0  # verify_choose's rows the kernel left to the host (the bench reports them)
        self.penalties = PenaltyCounts(self.dev, model.cfg.vocab_size)  # the penalised requests' sequence

    @classmethod
    def from_gguf(cls, path: str | Path, context_size: int | None = None, device: Device | None = None,
                  max_tokens: int | None = None, use_graphs: bool = True, precise: bool | None = None,
                  mtp: bool | None = None, draft_vocab: int | None = None) -> CudaBackend:
        """Open and validate a GGUF file, upload its weights and compile the kernels (NoGpuError,
        UnsupportedGpuError, DeviceOutOfMemoryError, UnsupportedModelError say why it cannot).

        precise (default: on, unless OPENJET_CUDA_PRECISE=0) multiplies with f32-level activations (each as two
        f16 terms) at some extra arithmetic in the matmuls: it keeps the logits within KL 1e-4 of the float32
        reference instead of about 1e-3. In either mode the Q4_K matmuls of 1-4 tokens take int8 activations in
        two levels (1.5e-5 of each 256-value block's largest; ops.I8_MATMUL, OPENJET_CUDA_I8=0 to keep f16).

        mtp (default: on, unless OPENJET_CUDA_MTP=0) uploads the file's MTP head, if it has one, and feeds it
        every pass, so that draft() works (can_draft). draft_vocab (default: OPENJET_DRAFT_VOCAB, else the whole
        vocabulary): the head drafts from the first draft_vocab ids only, their rows uploaded apart (a draft step
        streams those instead of the whole output head); the output is the same, the drafts kept may differ.

        max_tokens: the workspace's tokens, so the prefill's chunk (default: gemm.prefill_tokens for this GPU, no
        more than the context needs).
        """
        from engine.cuda.weights import upload_weights
        from engine.gguf.reader import GGUFFile
        from engine.model.config import ModelConfig
        from engine.model.weights import bind_weights

        f = GGUFFile.open(path)
        cfg = ModelConfig.from_gguf(f)
        tensors = bind_weights(f, cfg)
        context = cfg.context_length if context_size is None else int(context_size)
        if not 0 < context <= cfg.context_length:
            raise ValueError(f"context size {context_size} must be in 1..{cfg.context_length}")
        if mtp is None:
            mtp = env_flag(MTP_ENV, True)
        # a bad draft vocabulary is said before any upload (checked only where there is a head to draft with)
        draft = draft_vocab_size(cfg.vocab_size, draft_vocab) if mtp and tensors.nextn else None
        dev = device or Device()
        try:
            dev.load_all()
            weights = upload_weights(dev, cfg, tensors, mtp=mtp, draft_vocab=draft)
            if precise is None:
                precise = env_flag("OPENJET_CUDA_PRECISE", True)
            max_tokens = max_tokens or min(gemm.prefill_tokens(dev.info.arch), max(512, context))
            model = CudaModel(dev, cfg, weights, capacity=context + VERIFY_MAX, max_tokens=max_tokens,
                              precise=precise)
        except BaseException:
            if device is None:
                dev.close()
            raise
        return cls(model, context, use_graphs, owns_device=device is None)

    # ---- contract ----

    @property
    def vocab_size(self) -> int:
        """Rows of the logits."""
        return self.model.cfg.vocab_size

    @property
    def context_size(self) -> int:
        """The most positions a sequence may use."""
        return self._context_size

    @property
    def num_tokens(self) -> int:
        """Committed positions."""
        return self._num_tokens

    @property
    def can_draft(self) -> bool:
        """Whether the MTP head was uploaded (from_gguf's mtp, and a file that has one)."""
        return self.model.weights.mtp is not None

    def drop_draft_head(self) -> None:
        """Every pass leaves out the head's catch-up (its hidden norm and one decoder layer over the pass's tokens:
        ~0.12 ms of a 27B pass on the H200, the mtp27b part's one-token pass 6.740 ms against model27b's 6.618 at
        0ef4da5, bench/NOTES.md Z28) and checkpoints leave out its cache. Captured graphs are dropped: they hold the
        old launches."""
        if self.can_draft:
            self.model.drop_mtp()
            self.drop_graphs()

    def reset(self) -> None:
        """Forget the sequence."""
        self.model.reset_state()
        self._num_tokens, self._pending, self._uncommitted = 0, None, None

    def _check(self, tokens: list[int]) -> None:
        """Reject empty input, ids outside the vocabulary, and input past the context window."""
        if not tokens:
            raise ValueError("no tokens to feed")
        bad = [t for t in tokens if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {self.vocab_size}")
        if self._num_tokens + len(tokens) > self._context_size:
            raise ContextOverflowError(self._num_tokens + len(tokens), self._context_size)

    @property
    def prefill_chunk(self) -> int:
        """Tokens a prefill pass takes: the workspace's, or fewer (the bench compares chunk sizes in one process)."""
        return self._prefill_chunk

    @prefill_chunk.setter
    def prefill_chunk(self, tokens: int) -> None:
        if not VERIFY_MAX < tokens <= self.model.ws.max_tokens:
            raise ValueError(f"prefill chunk {tokens} must be in {VERIFY_MAX + 1}..{self.model.ws.max_tokens} "
                             "(the workspace's tokens)")
        self._prefill_chunk = tokens

    def prefill(self, tokens: list[int]) -> np.ndarray:
        """Feed and commit tokens in chunks of prefill_chunk; logits [V] after the last one."""
        self._check(tokens)
        self._pending = None
        step = self._prefill_chunk
        for lo in range(0, len(tokens), step):
            chunk = tokens[lo : lo + step]
            self._run(chunk, commit=True, logits_rows=1 if lo + step >= len(tokens) else 0)
            self._num_tokens += len(chunk)
        return self.dev.download(self.model.ws.logits, np.float32, (self.vocab_size,))

    def verify(self, tokens: list[int]) -> np.ndarray:
        """Feed up to VERIFY_MAX tokens without committing; logits [T, V]."""
        self._check_verify(tokens)
        self._run_verify(tokens)
        return self.dev.download(self.model.ws.logits, np.float32, (len(tokens), self.vocab_size))

    def _check_verify(self, tokens: list[int]) -> None:
        """Refuse what a verify pass cannot take (before anything of it is uploaded or drawn)."""
        self._check(tokens)
        if len(tokens) > VERIFY_MAX:
            raise ValueError(f"verify takes at most {VERIFY_MAX} tokens, got {len(tokens)}")

    def _run_verify(self, tokens: list[int]) -> None:
        """Run the non-committing pass over checked tokens (its logits left in ws.logits); it becomes the pending
        one."""
        self._run(tokens, commit=False, logits_rows=len(tokens))
        self._pending = len(tokens)

    def verify_choose(self, tokens: list[int], draft: Draft, params: SamplingParams, rng: np.random.Generator,
                      seq: TokenSequence | None = None) -> RowChoices | None:
        """verify() with each row's token chosen on the device (ops.choose_rows): the argmax, or speculative sampling
        of the deterministic draft from two of rng's uniform numbers a row, so T ids come back instead of T x V
        logits and no row is sampled on the host (~1 ms a row at 248K tokens). Penalties are applied to the rows'
        logits first, in place, from seq's tokens (self.penalties). None (the host's way) for a top_k past
        ops.CHOOSE_CAP, drafts drawn at random, or penalties without seq. A row the kernel leaves to the host (an
        infinite top, a top_k / top_p set it cannot sort) is chosen there, from its logits of the same pass; the
        choices stop at the first row that does not keep its draft (no later row can be emitted)."""
        if not device_chooses(params) or getattr(draft, "probs", None) is not None:
            return None
        penalised = has_penalties(params)
        if penalised and seq is None:
            return None
        self._check_verify(tokens)
        ws, num, vocab = self.model.ws, len(tokens), self.vocab_size
        # the choice's drafts and uniforms before the pass (an upload waits for the stream: after the pass it would
        # hold the choice's launch until the pass is done), once its tokens are accepted (a refused pass draws
        # nothing from rng)
        self.dev.upload(ws.choose_drafts, np.asarray([*draft.tokens, -1], np.int32))
        if not params.is_greedy:
            self.dev.upload(ws.choose_uniforms, rng.random((num, 2)))
        self._run_verify(tokens)
        if penalised:
            self.penalties.sync(seq)  # after the pass: the host's work overlaps it
            self.penalties.apply(ws.logits, ws.choose_drafts, num, params)
            params = without_penalties(params)  # the logits hold them now: a row left to the host must not add them
        ops.choose_rows(self.dev, ws.logits, ws.choose_drafts, ws.choose_uniforms, ws.choose_out, num, vocab, vocab,
                        params.temperature, params.min_p, params.top_k, params.top_p,
                        ws.choose_parts if CHOOSE_SPREAD else None)
        out = self.dev.download(ws.choose_out, np.int32, (num, 2))
        if (out[:, 0] == -1).any():
            row = self.dev.download(ws.logits, np.float32, (num, vocab))[int(np.argmax(out[:, 0] == -1))]
            sample(row, params, rng)  # raises UnsampleableLogits naming what is wrong
        tokens, kept = [], []
        for t, (token, is_kept) in enumerate(out.tolist()):
            if token == -2:  # the host's row
                row = self.dev.download(ws.logits, np.float32, (vocab,), offset=4 * vocab * t)
                token, is_kept = _choose_on_host(row, params, draft.tokens[t] if t < len(draft.tokens) else -1, rng)
                self.num_host_rows += 1
            tokens.append(token)
            kept.append(bool(is_kept))
            if not is_kept:
                break
        return RowChoices(tokens, kept)

    def accept(self, n: int) -> None:
        """Commit the first n tokens of the last verify()."""
        if self._pending is None:
            raise ValueError("accept() without a verify() to accept from")
        if not 1 <= n <= self._pending:
            raise ValueError(f"cannot accept {n} of {self._pending} tokens")
        self._num_tokens, self._pending, self._uncommitted = self._num_tokens + n, None, n
        if not (ACCEPT_BESIDE and mixers.GDN_ACCEPT_LAYERS and self.model.deltanet):
            self._commit()  # at once; else by the next call that needs the state: beside a draft, if that comes first

    def _commit(self) -> None:
        """Run the commit accept() left, on its own (a graph for each n: one launch and a copy)."""
        if self._uncommitted is not None:
            n, self._uncommitted = self._uncommitted, None
            self._replay(("accept", n), lambda: self.model.accept(n, n))

    def draft(self, token: int, num_draft: int, with_logits: bool = False) -> Draft:
        """num_draft greedy MTP drafts after `token`, the pending token at position num_tokens; the committed state
        is unchanged. Without with_logits the drafts come without their logits (proposals, accepted as n-gram ones
        are: no download of num_draft x V floats); with it, each step's logits too (the GPU check compares them)."""
        if not self.can_draft:
            raise ValueError("no MTP head on this backend (the file has none, or it was not loaded: "
                             f"{MTP_ENV}=0); use n-gram drafts")
        if not 0 <= int(token) < self.vocab_size:
            raise ValueError(f"token id {token} is outside the vocabulary of {self.vocab_size}")
        if not 0 <= num_draft <= VERIFY_MAX - 1:
            raise ValueError(f"drafts 0..{VERIFY_MAX - 1} tokens (a verify pass holds {VERIFY_MAX}), not {num_draft}")
        if num_draft == 0:
            return Draft([])
        if self._num_tokens + num_draft > self.model.capacity:
            raise ContextOverflowError(self._num_tokens + num_draft, self.model.capacity)
        self.model.draft_inputs(int(token), num_draft, self._num_tokens)
        n, self._uncommitted = self._uncommitted, None
        if n is None:
            self._replay(("draft", num_draft), lambda: self.model.draft_steps(num_draft))
        else:
            self._replay(("accept+draft", n, num_draft), lambda: self._commit_beside_draft(n, num_draft))
        return Draft(*self.model.draft_result(num_draft, with_logits))

    def _commit_beside_draft(self, n: int, num_draft: int) -> None:
        """The commit of n accepted tokens on a side stream while the MTP head drafts: the draft needs only the
        starting hidden, copied first; the DeltaNet layers' commit touches nothing the draft does."""
        model, dev = self.model, self.dev
        model.accept_hidden(n)
        with dev.beside(lane=1):
            model.accept_layers(n)
        model.draft_steps(num_draft)
        dev.join(lane=1)

    def set_precise(self, on: bool) -> None:
        """Switch the precise matmuls on or off (captured graphs are dropped: they hold the old launches)."""
        if on != self.model.precise:
            self.model.precise = on
            self.model.ws.set_precise(on)
            self.drop_graphs()

    def drop_graphs(self) -> None:
        """Forget the captured passes (after a change of kernels: the next pass of each shape is captured anew)."""
        for graph in self._graphs.values():
            graph.destroy()
        self._graphs.clear()

    def _run(self, tokens: list[int], commit: bool, logits_rows: int) -> None:
        """Upload ids/positions and run the pass, from a captured graph where the shape allows (decode and
        verify passes, and full prefill chunks)."""
        self._commit()
        self.model.set_tokens(tokens, self._num_tokens)
        key = (len(tokens), commit, logits_rows)
        if VERIFY_MAX < len(tokens) < self._prefill_chunk:  # a prefill chunk's tail: a shape seen once
            self.model.forward(*key)
            return
        self._replay(key, lambda: self.model.forward(*key))

    def _replay(self, key: tuple, launch: Callable[[], None]) -> None:
        """Run launch()'s kernels from the graph captured under key: the first time eagerly (kernels loaded,
        scratch sizes settled, this call's results made), then captured (recorded only); later, replayed. Its
        kernels must take everything that changes between calls from device memory."""
        if not self.use_graphs:
            launch()
            return
        graph = self._graphs.get(key)
        if graph is None:
            launch()
            with self.dev.capture() as holder:
                launch()
            self._graphs[key] = holder[0]
            return
        graph.launch()

    # ---- checkpoints ----

    def _state_buffers(self) -> dict[str, tuple[Buffer, int]]:
        """Every committed state buffer and the bytes of it that matter now."""
        cfg, out = self.model.cfg, {}
        for i, kv in self.model.kv.items():
            # the cache is [Hkv, capacity, D]: copy whole (rows past num_tokens are never read)
            out[f"{i}.k"], out[f"{i}.v"] = (kv.k, kv.k.nbytes), (kv.v, kv.v.nbytes)
        for i, dn in self.model.deltanet.items():
            out[f"{i}.window"] = (dn.window, 4 * (cfg.ssm_conv_kernel - 1) * cfg.ssm_conv_dim)
            out[f"{i}.ssm"] = (dn.ssm, dn.ssm.nbytes)
        if self.model.mtp_kv is not None:
            out["mtp.k"], out["mtp.v"] = (self.model.mtp_kv.k, self.model.mtp_kv.k.nbytes), \
                (self.model.mtp_kv.v, self.model.mtp_kv.v.nbytes)
            out["mtp.last_hidden"] = (self.model.last_hidden, self.model.last_hidden.nbytes)
        return out

    def checkpoint(self) -> CudaCheckpoint:
        """Device copies of the committed state (freed when the checkpoint is garbage-collected)."""
        self._commit()
        cp = CudaCheckpoint(self._num_tokens, id(self))
        for name, (src, nbytes) in self._state_buffers().items():
            copy = self.dev.alloc(nbytes, f"checkpoint.{name}")
            self.dev.copy(copy, src, nbytes)
            cp.copies[name] = (copy, src, nbytes)
        memory = self.dev.memory
        weakref.finalize(cp, _free_all, memory, [c for c, _, _ in cp.copies.values()])
        return cp

    def rollback(self, checkpoint: Checkpoint) -> None:
        """Restore a checkpoint of this backend (it stays usable)."""
        if not isinstance(checkpoint, CudaCheckpoint) or checkpoint.owner != id(self):
            raise ValueError("checkpoint was not taken by this backend")
        self._uncommitted = None  # the copies overwrite what it would have written
        for copy, src, nbytes in checkpoint.copies.values():
            self.dev.copy(src, copy, nbytes)
        self._num_tokens, self._pending = checkpoint.num_tokens, None

    @property
    def can_truncate(self) -> bool:
        """Attention-only models without an MTP head: the state is KV rows indexed by position."""
        return not self.model.deltanet and self.model.mtp_kv is None

    def truncate(self, num_tokens: int) -> None:
        """Forget positions >= num_tokens (attention-only models)."""
        if not self.can_truncate:
            raise NotImplementedError("this model has DeltaNet or MTP state: roll back to a checkpoint instead")
        if not 0 <= num_tokens <= self._num_tokens:
            raise ValueError(f"cannot truncate {self._num_tokens} tokens to {num_tokens}")
        self._num_tokens, self._pending = num_tokens, None

    def close(self) -> None:
        """Release the device (graphs, weights, state) if this backend opened it; on a device it was given, only
        the graphs go (the device's owner closes it, and the memory with it, as the megakernel's executor does)."""
        for graph in self._graphs.values():
            graph.destroy()
        self._graphs.clear()
        if self.owns_device:
            self.dev.close()


def _choose_on_host(row: np.ndarray, params: SamplingParams, draft_token: int,
                    rng: np.random.Generator) -> tuple[int, int]:
    """(token, kept) of a verify row by engine/spec/verify.py speculative_accept's rule on the host, from fresh draws
    of rng (as exact as the row's uniforms would have been: every draw is independent). draft_token < 0: the row
    after the drafts, drawn from p alone."""
    # row: [V]
    if draft_token < 0:
        return sample(row, params, rng), 0
    kept, token = keep_or_draw(row, params, draft_token, rng)
    return token, int(kept)


def _free_all(memory, buffers: list[Buffer]) -> None:
    """Finalizer of a checkpoint: free its copies unless the device is already closed."""
    if memory.device.closed:
        return
    for buf in buffers:
        if buf.ptr in memory.live:
            memory.free(buf)
