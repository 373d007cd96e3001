"""The forward pass of qwen35 / qwen3 / qwen2 / llama on the GPU, one kernel launch per op (engine/reference's math).

A pass feeds T tokens at positions start..start+T-1 (ids and positions already in device memory, so a pass of a
given T is the same sequence of launches at every position and can be captured in a CUDA graph). A committing
pass (prefill, plain decode) updates every state in place. A non-committing pass (verify, T <= VERIFY_MAX) writes
K/V past the committed length and keeps each DeltaNet layer's conv inputs, q/k/v and gates; accept(n) then shifts
the conv windows and re-runs the delta rule over the first n tokens, leaving the state exactly as if only those
n tokens had been fed.

With an MTP head (qwen35's nextn layer, uploaded when asked for), every pass also feeds it, as the reference does
(engine/reference/model.py): the pairs (token p, the trunk's output-normed hidden of p - 1) through eh_proj and its
decoder layer, whose only lasting effect is the head's own KV rows; draft() then runs it on its own outputs.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from engine.backend import restrict_draft_logits
from engine.cuda import gemm, mixers, ops
from engine.cuda.device import Buffer, Device, pdl_for
from engine.cuda.weights import CudaWeights, LayerWeights
from engine.model.config import ModelConfig

VERIFY_MAX = 8  # tokens of a non-committing pass (1 pending + up to 7 drafts)


@dataclass(slots=True)
class DeltaNetBuffers:
    """One DeltaNet layer: conv window (state rows, then the last verify pass's inputs), recurrent state, and the
    last verify pass's normalised q/k/v and gates."""

    window: Buffer  # [K-1 + VERIFY_MAX, C]
    ssm: Buffer  # [Hv, Dk, Dv]
    conv_out: Buffer  # [VERIFY_MAX, C]: conv outputs (q | k | v after SiLU)
    qk_norm: Buffer  # [VERIFY_MAX, 2 * Hk * Dk]: normalised q | k
    g: Buffer  # [VERIFY_MAX, Hv]
    beta: Buffer  # [VERIFY_MAX, Hv]


@dataclass(slots=True)
class KVBuffers:
    """One attention layer's f16 cache, [Hkv, capacity, D] each."""

    k: Buffer
    v: Buffer


class Workspace:
    """Activations of one pass of up to max_tokens tokens (shared by all layers)."""

    def __init__(self, dev: Device, cfg: ModelConfig, weights: CudaWeights, max_tokens: int, precise: bool):
        p, h = max_tokens, cfg.hidden_size
        mix_width = max(cfg.q_size, cfg.ssm_inner_size)  # attention output / DeltaNet inner width
        layers = weights.layers + ([weights.mtp.layer] if weights.mtp is not None else [])
        proj_width = max(max(lw.mix_in.width, lw.ffn_in.width) for lw in layers)
        self.max_tokens, self.proj_width, self.mix_width = p, proj_width, mix_width
        self.ids, self.pos = dev.alloc(4 * p, "ids"), dev.alloc(4 * p, "positions")
        self.x, self.xn = dev.alloc(4 * p * h, "x"), dev.alloc(4 * p * h, "xn")
        # ffn_down's two halves (ops.splits_in_halves: up to VERIFY_MAX tokens), summed into x by the next input norm
        halves = 4 * min(p, VERIFY_MAX) * h
        self.x_halves = (dev.alloc(halves, "x.half0"), dev.alloc(halves, "x.half1"))
        self.act_h = ops.alloc_act(dev, p, h, "act_h", f32=self.xn, precise=True)
        self.proj = dev.alloc(4 * p * proj_width, "proj")
        self.mix, self.mix2 = dev.alloc(4 * p * mix_width, "mix"), dev.alloc(4 * p * mix_width, "mix2")
        # the output projections' inputs: attention output (q_size wide) and DeltaNet output (inner wide)
        self.act_q = ops.alloc_act(dev, p, cfg.q_size, "act_q", f32=self.mix2, precise=True)
        self.act_inner = ops.alloc_act(dev, p, cfg.ssm_inner_size, "act_inner", f32=self.mix2, precise=True) \
            if cfg.ssm_inner_size else None
        self.ffn = dev.alloc(4 * p * cfg.ffn_size, "ffn_h")
        self.act_ffn = ops.alloc_act(dev, p, cfg.ffn_size, "act_ffn", f32=self.ffn, precise=True)
        acts = [self.act_h, self.act_q, self.act_ffn] + ([self.act_inner] if self.act_inner else [])
        # the matrices these feed (the trunk's and the heads'): all on prefill GEMMs, a prefill's producers write
        # no f16 residue (ops.Act.gemm_only)
        readers = [weights.output] + ([weights.mtp.output] if weights.mtp is not None else []) + [
            m for lw in layers for m in [p.weight for p in lw.mix_in.parts + lw.ffn_in.parts] + [lw.mix_out,
                                                                                               lw.ffn_down]]
        gemm_only = all(m.qtype in gemm.INSTANCES for m in readers)
        for act in acts:
            act.gemm_only = gemm_only
        self.conv_dim, self.ssm_heads = max(cfg.ssm_conv_dim, 1), max(cfg.ssm_num_v_heads, 1)
        self.conv_out = dev.alloc(4 * p * self.conv_dim, "conv_out")
        self.g, self.beta = dev.alloc(4 * p * self.ssm_heads, "g"), dev.alloc(4 * p * self.ssm_heads, "beta")
        # the chunked delta rule's per-chunk matrices (prefill runs of GDN_CHUNKED_MIN_TOKENS or more)
        self.gdn_chunked = bool(cfg.ssm_num_v_heads) and mixers.gdn_chunked_fits(
            cfg.ssm_head_dim, cfg.ssm_v_head_dim, dev.info.max_smem_per_block)
        self.gdn_work = dev.alloc(mixers.gdn_chunk_work_bytes(p, cfg.ssm_num_v_heads, cfg.ssm_head_dim),
                                  "gdn_chunk_work") if self.gdn_chunked else None
        self.logits = dev.alloc(4 * VERIFY_MAX * cfg.vocab_size, "logits")
        self.argmax_scratch = dev.alloc(8 * VERIFY_MAX * (cfg.vocab_size // ops.ARGMAX_CHUNK + 1), "argmax")
        # the verify rows' choices made on the device (CudaBackend.verify_choose): each row's draft token, its two
        # float64 uniform numbers, and (token, kept)
        self.choose_drafts = dev.alloc(4 * VERIFY_MAX, "choose.drafts")
        self.choose_uniforms = dev.alloc(16 * VERIFY_MAX, "choose.uniforms")
        self.choose_out = dev.alloc(8 * VERIFY_MAX, "choose.out")
        self.choose_parts = dev.alloc(VERIFY_MAX * ops.CHOOSE_PARTS_BYTES, "choose.parts")  # the spread passes'
        self.attn_splits_max = mixers.MAX_SPLITS
        self.attn_scratch = dev.alloc(
            mixers.attn_scratch_bytes(mixers.MAX_SPLITS, VERIFY_MAX, cfg.num_heads, cfg.head_dim), "attn_scratch")
        if weights.mtp is not None:
            self._mtp_buffers(dev, p, h)
            acts.append(self.act_cat)
        self._lo = [(act, act.x16_lo) for act in acts]  # kept allocated: precision is a switch
        self.set_precise(precise)

    def _mtp_buffers(self, dev: Device, p: int, h: int) -> None:
        """The MTP head's: each pass token's output-normed trunk hidden and the one before it, the [enorm(e) |
        hnorm(h)] rows eh_proj reads (written by two producers' f32 copies, then one act of width 2H), the draft
        chain's hidden, and the drafted ids (id 0: the pending token) and positions."""
        self.hidden, self.prev = dev.alloc(4 * p * h, "mtp.hidden"), dev.alloc(4 * p * h, "mtp.prev")
        self.cat = dev.alloc(8 * p * h, "mtp.cat")
        self.act_e = ops.alloc_act(dev, p, h, "mtp.e", f32=self.cat, ld=2 * h)
        self.act_hh = ops.alloc_act(dev, p, h, "mtp.h", f32=self.cat.view(4 * h), ld=2 * h)
        self.act_cat = ops.alloc_act(dev, p, 2 * h, "mtp.cat", f32=self.cat, precise=True)
        self.mtp_hidden = dev.alloc(4 * h, "mtp.draft_hidden")
        self.draft_ids = dev.alloc(4 * (VERIFY_MAX + 1), "mtp.draft_ids")
        self.draft_pos = dev.alloc(4 * VERIFY_MAX, "mtp.draft_pos")

    def set_precise(self, on: bool) -> None:
        """Precise matmuls (activations as f16 hi + lo) on or off; the buffers stay allocated either way."""
        for act, lo in self._lo:
            act.x16_lo = lo if on else None


class CudaModel:
    """Weights, per-layer state and workspace of one model on one device, and the forward pass over them."""

    def __init__(self, dev: Device, cfg: ModelConfig, weights: CudaWeights, capacity: int, max_tokens: int = 512,
                 precise: bool = False):
        self.dev, self.cfg, self.weights, self.capacity = dev, cfg, weights, capacity
        self.ws = Workspace(dev, cfg, weights, max_tokens, precise)
        self.precise = precise  # activations as f16 hi + lo pairs in the f16 matmuls (f32-level precision)
        self.kv: dict[int, KVBuffers] = {}
        self.deltanet: dict[int, DeltaNetBuffers] = {}
        for i, kind in enumerate(cfg.layer_kinds):
            if kind == "attention":
                self.kv[i] = self._kv_buffers(f"blk.{i}")
            else:
                self.deltanet[i] = self._deltanet_buffers(i)
        # the MTP head's cache and the committed trunk hidden it starts drafting from (the reference's last_hidden)
        self.mtp_kv = self._kv_buffers("mtp") if weights.mtp is not None else None
        self.last_hidden = dev.alloc(4 * cfg.hidden_size, "mtp.last_hidden") if weights.mtp is not None else None
        self.accept_table = self._accept_table() if self.deltanet else None
        self.reset_state()

    def _kv_buffers(self, name: str) -> KVBuffers:
        size = 2 * self.cfg.num_kv_heads * self.capacity * self.cfg.head_dim
        return KVBuffers(self.dev.alloc(size, f"{name}.k"), self.dev.alloc(size, f"{name}.v"))

    def _deltanet_buffers(self, i: int) -> DeltaNetBuffers:
        cfg, dev = self.cfg, self.dev
        c, hv = cfg.ssm_conv_dim, cfg.ssm_num_v_heads
        return DeltaNetBuffers(
            window=dev.alloc(4 * (cfg.ssm_conv_kernel - 1 + VERIFY_MAX) * c, f"blk.{i}.conv_window"),
            ssm=dev.alloc(4 * hv * cfg.ssm_head_dim * cfg.ssm_v_head_dim, f"blk.{i}.ssm_state"),
            conv_out=dev.alloc(4 * VERIFY_MAX * c, f"blk.{i}.pass_qkv"),
            qk_norm=dev.alloc(8 * VERIFY_MAX * cfg.ssm_num_k_heads * cfg.ssm_head_dim, f"blk.{i}.pass_qk"),
            g=dev.alloc(4 * VERIFY_MAX * hv, f"blk.{i}.pass_g"), beta=dev.alloc(4 * VERIFY_MAX * hv, f"blk.{i}.pass_b"))

    def _accept_table(self) -> Buffer:
        """The DeltaNet layers' buffers as kernels/deltanet.cu GdnLayer rows, for the accept's one launch."""
        key = self.cfg.ssm_num_k_heads * self.cfg.ssm_head_dim
        assert all(b.ssm.ptr % 16 == 0 for b in self.deltanet.values()), "the rule moves its state as float4s"
        rows = (mixers.GdnLayer * len(self.deltanet))(*(
            mixers.GdnLayer(b.qk_norm.ptr, b.conv_out.ptr + 8 * key, b.g.ptr, b.beta.ptr, b.ssm.ptr, b.window.ptr)
            for b in self.deltanet.values()))
        table = self.dev.alloc(ctypes.sizeof(rows), "deltanet.accept_table")
        self.dev.upload(table, np.frombuffer(bytes(rows), np.uint8))
        return table

    def reset_state(self) -> None:
        """Zero the recurrent states (the KV caches need no clearing: rows past the length are never read)."""
        for buf in self.deltanet.values():
            self.dev.fill_u32(buf.window, 0)
            self.dev.fill_u32(buf.ssm, 0)
        if self.last_hidden is not None:
            self.dev.fill_u32(self.last_hidden, 0)

    def set_tokens(self, tokens: list[int], start: int) -> None:
        """Upload the ids and positions of the next pass."""
        assert len(tokens) <= self.ws.max_tokens
        self.dev.upload(self.ws.ids, np.asarray(tokens, np.int32))
        self.dev.upload(self.ws.pos, np.arange(start, start + len(tokens), dtype=np.int32))

    # ---- the pass ----

    def forward(self, num_tokens: int, commit: bool, logits_rows: int, trace: list | None = None) -> None:
        """Run the pass over the uploaded tokens; logits of the last logits_rows tokens go to ws.logits.

        trace (diagnostics, not under graph capture): receives a host copy of the residual stream after each layer.
        """
        assert commit or num_tokens <= VERIFY_MAX, "a non-committing pass holds at most VERIFY_MAX tokens"
        cfg, ws, dev = self.cfg, self.ws, self.dev
        h = cfg.hidden_size
        dev.pdl = pdl_for(dev.pdl_policy, num_tokens, VERIFY_MAX)
        ops.get_rows(dev, self.weights.token_embd, ws.ids, ws.x, num_tokens, h)
        layers = self.weights.layers
        halves = None  # the last ffn_down's halves (ws.x_halves), which the input norm sums into x
        for i, lw in enumerate(layers):
            normed = ops.rmsnorm_of(ws.x, lw.vectors["attn_norm"], h, cfg.rms_eps, out32=ws.xn, add=halves)
            # the mixer's output in halves (ops.OUT_HALVES), which the FFN norm sums into x; never traced
            if lw.kind == "attention":
                mixed = self._attention(lw, self.kv[i], num_tokens, ws.pos, normed, may_halve=trace is None)
            else:
                mixed = self._deltanet(i, lw, num_tokens, commit, normed, may_halve=trace is None)
            # (the last layer's output and a traced one are read whole: not in halves)
            halves = self._ffn(lw, num_tokens, may_halve=i + 1 < len(layers) and trace is None, add=mixed)
            if trace is not None:
                trace.append(dev.download(ws.x, np.float32, (num_tokens, h)))
        if self.weights.mtp is not None:  # every token's output-normed hidden, for the MTP head
            ops.act_rmsnorm(dev, ws.x, self.weights.output_norm, ws.act_h, num_tokens, h, cfg.rms_eps, out32=ws.hidden)
        if logits_rows:
            self.head(num_tokens - logits_rows, logits_rows)
        if self.weights.mtp is not None:
            self._mtp_catch_up(num_tokens, commit)

    def drop_mtp(self) -> None:
        """forward() feeds the MTP head no more and checkpoints leave out its cache (nothing will draft from it). Its
        memory stays with the device until that closes: the head's output and embedding may be the trunk's own."""
        self.weights.mtp = None
        self.mtp_kv = self.last_hidden = None

    def head(self, first_row: int, rows: int) -> None:
        """logits[0:rows] = output(RMSNorm(x[first_row:first_row + rows]))."""
        cfg, ws, dev = self.cfg, self.ws, self.dev
        h = cfg.hidden_size
        ops.act_rmsnorm(dev, ws.x.view(4 * first_row * h), self.weights.output_norm, ws.act_h, rows, h, cfg.rms_eps,
                        out32=ws.xn)
        ops.matmul(dev, self.weights.output, ws.act_h, ws.logits, rows, cfg.vocab_size)

    # ---- the MTP head ----

    def _mtp_block(self, ids: Buffer, prev: Buffer, pos: Buffer, num_tokens: int) -> None:
        """ws.x = the MTP decoder layer's output (before shared_head_norm) for the tokens `ids` at positions `pos`,
        each beside the hidden state that predicted it (prev, [T, H]); writes the head's KV rows at pos."""
        cfg, ws, dev, mtp = self.cfg, self.ws, self.dev, self.weights.mtp
        h, eps, vec = cfg.hidden_size, cfg.rms_eps, mtp.layer.vectors
        ops.get_rows(dev, mtp.embed, ids, ws.x, num_tokens, h)
        ops.act_rmsnorm(dev, ws.x, vec["nextn.enorm"], ws.act_e, num_tokens, h, eps, out32=ws.cat)  # cat[:, :H]
        ops.act_rmsnorm(dev, prev, vec["nextn.hnorm"], ws.act_hh, num_tokens, h, eps, out32=ws.cat.view(4 * h))
        ops.act_f16(dev, ws.cat, ws.act_cat, num_tokens, 2 * h)
        ops.matmul(dev, mtp.eh_proj, ws.act_cat, ws.x, num_tokens, h)
        self._attention(mtp.layer, self.mtp_kv, num_tokens, pos, ops.rmsnorm_of(ws.x, vec["attn_norm"], h, eps,
                                                                                out32=ws.xn))
        self._ffn(mtp.layer, num_tokens)

    def _mtp_catch_up(self, num_tokens: int, commit: bool) -> None:
        """Feed the head this pass's pairs (token p, trunk hidden of p - 1), as the reference's _mtp_catch_up; a
        committing pass then makes its last hidden the one drafting starts from."""
        ws, dev, row = self.ws, self.dev, 4 * self.cfg.hidden_size
        dev.copy(ws.prev, self.last_hidden, row)
        if num_tokens > 1:
            dev.copy(ws.prev.view(row), ws.hidden, row * (num_tokens - 1))
        self._mtp_block(ws.ids, ws.prev, ws.pos, num_tokens)
        if commit:
            dev.copy(self.last_hidden, ws.hidden.view(row * (num_tokens - 1)), row)

    def draft_inputs(self, token: int, num_draft: int, start: int) -> None:
        """Upload a draft's inputs: `token`, the pending token, at position start, and the positions of its
        num_draft steps (start .. start + num_draft - 1)."""
        assert self.weights.mtp is not None and 1 <= num_draft <= VERIFY_MAX
        self.dev.upload(self.ws.draft_ids, np.asarray([token], np.int32))
        self.dev.upload(self.ws.draft_pos, np.arange(start, start + num_draft, dtype=np.int32))

    def draft_steps(self, num_draft: int) -> None:
        """num_draft greedy steps of the MTP head from draft_inputs: step i runs the head on (token_i, hidden_i)
        at its position (hidden_0 the committed trunk hidden, then the head's own shared_head_norm output), its
        argmax staying on the device as the next step's id; step i's logits are row i of ws.logits. The head's KV
        rows past the pending position are overwritten by the next pass's catch-up, so the committed state is
        unchanged. Everything that changes between drafts is in device memory: the launches can be captured."""
        cfg, ws, dev, mtp = self.cfg, self.ws, self.dev, self.weights.mtp
        h, vocab = cfg.hidden_size, cfg.vocab_size
        dev.pdl = pdl_for(dev.pdl_policy, 1, VERIFY_MAX)
        hidden = self.last_hidden
        for i in range(num_draft):
            self._mtp_block(ws.draft_ids.view(4 * i), hidden, ws.draft_pos.view(4 * i), 1)
            ops.act_rmsnorm(dev, ws.x, mtp.layer.vectors["nextn.shared_head_norm"], ws.act_h, 1, h, cfg.rms_eps,
                            out32=ws.mtp_hidden)
            logits, head = ws.logits.view(4 * i * vocab), mtp.drafts_from
            ops.matmul(dev, head, ws.act_h, logits, 1, vocab)
            ops.argmax(dev, logits, ws.draft_ids.view(4 * (i + 1)), ws.argmax_scratch, 1, head.rows, vocab)
            hidden = ws.mtp_hidden

    def draft_result(self, num_draft: int, with_logits: bool = False) -> tuple[list[int], np.ndarray | None]:
        """The drafted tokens, and with_logits each step's logits [num_draft, V] (-inf past a restricted head's)."""
        tokens = [int(t) for t in self.dev.download(self.ws.draft_ids, np.int32, (num_draft + 1,))[1:]]
        if not with_logits:
            return tokens, None
        logits = self.dev.download(self.ws.logits, np.float32, (num_draft, self.cfg.vocab_size))
        return tokens, restrict_draft_logits(logits, self.weights.mtp.drafts_from.rows)

    def _ffn_norm(self, lw: LayerWeights) -> Buffer:
        return lw.vectors["post_attention_norm" if self.cfg.arch == "qwen35" else "ffn_norm"]

    def _gate_up(self, lw: LayerWeights) -> ops.DeviceWeight | None:
        """gate | up as one matrix (the gate's rows, then up's) without a bias, or None (separate launches)."""
        ffn_in, f = lw.ffn_in, self.cfg.ffn_size
        if len(ffn_in.parts) != 1 or ffn_in.parts[0].bias is not None:
            return None
        first = ffn_in.parts[0].offset
        if (ffn_in.offsets["ffn_gate"], ffn_in.offsets["ffn_up"]) != (first, first + f):
            return None
        return ffn_in.parts[0].weight

    def _swiglu_gemm(self, lw: LayerWeights, num_tokens: int) -> ops.DeviceWeight | None:
        """gate | up where its prefill GEMM stores SwiGLU into act_ffn itself (gemm.swiglu_instance): ffn_down
        reads the f16 values alone there (a prefill GEMM, no f16 residue, no int8 copy); None: _ffn launches
        act_swiglu."""
        gate_up = self._gate_up(lw)
        if (gate_up is None or gate_up.rows != 2 * self.cfg.ffn_size or not self.ws.act_ffn.gemm_only
                or lw.ffn_down.qtype not in gemm.INSTANCES
                or gemm.swiglu_instance(self.dev.info.arch, gate_up, num_tokens) is None):
            return None
        return gate_up

    def _ffn(self, lw: LayerWeights, num_tokens: int, may_halve: bool = False,
             add: tuple[Buffer, Buffer] | None = None) -> tuple[Buffer, Buffer] | None:
        """x += ffn_down(silu(gate) * up) of RMSNorm(x). may_halve: the caller's next input norm takes ffn_down's
        halves (ops.splits_in_halves), returned where it split: x is then stale until that norm (rmsnorm_of add=)
        stores their sum. add: the mixer's output in halves, which the FFN norm sums into x first."""
        cfg, ws, dev = self.cfg, self.ws, self.dev
        h = cfg.hidden_size
        normed = ops.rmsnorm_of(ws.x, self._ffn_norm(lw), h, cfg.rms_eps, out32=ws.xn, add=add)
        gate_up = self._swiglu_gemm(lw, num_tokens)
        if gate_up is not None:  # SwiGLU by the GEMM's own epilogue
            ops.produce(dev, normed, ws.act_h, num_tokens)
            gemm.launch_swiglu(dev, gate_up, ws.act_h.x16, ws.act_ffn.x16, num_tokens)
            ws.act_ffn.i8_tokens = 0
        else:
            lw.ffn_in.run(dev, ws.act_h, ws.proj, num_tokens, ws.proj_width, beside=ops.BESIDE, producer=normed)
            dev.join()
            gate = ws.proj.view(4 * lw.ffn_in.offsets["ffn_gate"])
            up = ws.proj.view(4 * lw.ffn_in.offsets["ffn_up"])
            f32_rows = ws.ffn if lw.ffn_down.qtype == Q.F32 else None  # the f32 matmul's input alone
            ops.act_swiglu(dev, gate, up, ws.act_ffn, num_tokens, ws.proj_width, out32=f32_rows)
        if may_halve and ops.splits_in_halves(dev, lw.ffn_down, ws.act_ffn, num_tokens):
            ops.matmul(dev, lw.ffn_down, ws.act_ffn, ws.x_halves[0], num_tokens, h, residual=ws.x, y2=ws.x_halves[1])
            return ws.x_halves
        ops.matmul(dev, lw.ffn_down, ws.act_ffn, ws.x, num_tokens, h, residual=ws.x)
        return None

    def _attention(self, lw: LayerWeights, cache: KVBuffers, num_tokens: int, pos: Buffer,
                   normed: ops.Producer, may_halve: bool = False) -> tuple[Buffer, Buffer] | None:
        """x += attn_output(attention(q, k, v)) of normed (the input norm of x) with q/k norm, rope, the KV write
        at positions pos and qwen35's output gate. may_halve: as _out's."""
        cfg, ws, dev = self.cfg, self.ws, self.dev
        d, hq, hkv, width = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, ws.proj_width
        lw.mix_in.run(dev, ws.act_h, ws.proj, num_tokens, width, beside=ops.BESIDE, producer=normed)
        dev.join()
        q_stride = 2 * d if cfg.has_attn_gate else d  # qwen35 packs [Q | gate] per head
        q = ws.proj.view(4 * lw.mix_in.offsets["attn_q"])
        k = ws.proj.view(4 * lw.mix_in.offsets["attn_k"])
        v = ws.proj.view(4 * lw.mix_in.offsets["attn_v"])
        prep = mixers.qk_prep_args(q, k, v, lw.vectors.get("attn_q_norm"), lw.vectors.get("attn_k_norm"), cache.k,
                                   cache.v, pos, num_tokens, hq, hkv, d, width, q_stride, self.capacity, cfg.rope_dim,
                                   cfg.rope_theta, cfg.rope_neox, cfg.rms_eps)
        prep_inside = mixers.prep_runs(num_tokens, hq, hkv, d, dev.info.max_smem_per_block)
        if not prep_inside:
            mixers.qk_prep(dev, prep)
        tile = mixers.attn_tile_tokens(hq, hkv, d, num_tokens)
        splits = mixers.attn_splits(num_tokens, hkv, tile, dev.info.multiprocessors)
        splits = max(1, min(splits, (mixers.MAX_SPLITS * VERIFY_MAX) // num_tokens))  # what the scratch holds
        gate = q.view(4 * d) if cfg.has_attn_gate else None
        # the splits merged by the output projection's producer (a launch less) unless its weights are f32, which
        # read the f32 rows of ws.mix2
        merged_late = mixers.combine_runs(num_tokens, d, splits) and lw.mix_out.qtype != Q.F32
        mixers.attention(dev, q, cache.k, cache.v, pos, ws.mix2, num_tokens, hq, hkv, d, self.capacity, width,
                         q_stride, cfg.q_size, d ** -0.5, gate=gate, ld_gate=width, gate_head_stride=q_stride,
                         scratch=ws.attn_scratch, splits=splits, merge=not merged_late,
                         prep=prep if prep_inside else None)
        producer = (mixers.combine_of(ws.attn_scratch, splits, num_tokens, hq, d, gate, width, q_stride) if merged_late
                    else ops.plain_of(ws.mix2, cfg.q_size))
        return self._out(lw, ws.act_q, num_tokens, producer, may_halve)

    def _deltanet(self, i: int, lw: LayerWeights, num_tokens: int, commit: bool, normed: ops.Producer,
                  may_halve: bool = False) -> tuple[Buffer, Buffer] | None:
        """x += ssm_out(gated_norm(delta_rule(conv(qkv)), z)) of normed (the input norm of x); a verify pass keeps
        its inputs in the layer. may_halve: as _out's."""
        cfg, ws, dev = self.cfg, self.ws, self.dev
        width, c, hk, hv = ws.proj_width, cfg.ssm_conv_dim, cfg.ssm_num_k_heads, cfg.ssm_num_v_heads
        dk, dv, inner, key = cfg.ssm_head_dim, cfg.ssm_v_head_dim, cfg.ssm_inner_size, hk * cfg.ssm_head_dim
        lw.mix_in.run(dev, ws.act_h, ws.proj, num_tokens, width, beside=ops.BESIDE,  # alpha | beta beside qkv
                      producer=normed)
        layer, off = self.deltanet[i], lw.mix_in.offsets
        conv_out, qkv = ws.conv_out if commit else layer.conv_out, ws.proj.view(4 * off["attn_qkv"])
        gates = dict(alpha=ws.proj.view(4 * off["ssm_alpha"]), b=ws.proj.view(4 * off["ssm_beta"]),
                     a=lw.vectors["ssm_a"], dt_bias=lw.vectors["ssm_dt.bias"], ld_gate=width, eps=cfg.rms_eps)
        z = ws.proj.view(4 * off["attn_gate"])
        chunked = commit and ws.gdn_chunked and num_tokens >= mixers.GDN_CHUNKED_MIN_TOKENS  # a long prefill run
        if mixers.gdn_conv_runs(num_tokens, cfg.ssm_conv_kernel, commit):  # the conv inside, on the raw qkv
            dev.join()  # the gates (alpha | beta) are the delta rule's input
            mixers.gdn_recurrent(
                dev, qkv, qkv.view(4 * key), qkv.view(8 * key), layer.ssm, ws.mix, num_tokens, hk, hv, dk, dv, width,
                width, inner, commit, g=layer.g, beta=layer.beta, qk_out=layer.qk_norm,
                conv=mixers.GdnConv(layer.window, lw.vectors["ssm_conv1d"], conv_out, c), **gates)
        else:
            mixers.conv1d_silu(dev, layer.window, qkv, lw.vectors["ssm_conv1d"], conv_out, num_tokens, c,
                               cfg.ssm_conv_kernel, width, c, commit)
            dev.join()
            if chunked:
                mixers.gdn_chunked(dev, conv_out, conv_out.view(4 * key), conv_out.view(8 * key), layer.ssm, ws.mix,
                                   ws.gdn_work, num_tokens, hk, hv, dk, c, c, inner, **gates)
            else:
                mixers.gdn_recurrent(
                    dev, conv_out, conv_out.view(4 * key), conv_out.view(8 * key), layer.ssm, ws.mix, num_tokens, hk,
                    hv, dk, dv, c, c, inner, commit, g=ws.g if commit else layer.g,
                    beta=ws.beta if commit else layer.beta, qk_out=None if commit else layer.qk_norm, **gates)
        normed = ops.gatednorm_of(ws.mix, z, lw.vectors["ssm_norm"], dv, inner, width, cfg.rms_eps, out32=ws.mix2)
        return self._out(lw, ws.act_inner, num_tokens, normed, may_halve)

    def _out(self, lw: LayerWeights, act: ops.Act, num_tokens: int, producer: ops.Producer | None,
             may_halve: bool) -> tuple[Buffer, Buffer] | None:
        """x += mix_out(act) (of producer), the mixer's output projection. may_halve: the caller's FFN norm takes
        its halves (ops.splits_in_halves), returned where it split: x is then stale until that norm (rmsnorm_of add=)
        stores their sum."""
        ws, h = self.ws, self.cfg.hidden_size
        if may_halve and ops.splits_in_halves(self.dev, lw.mix_out, act, num_tokens, producer):
            ops.matmul(self.dev, lw.mix_out, act, ws.x_halves[0], num_tokens, h, residual=ws.x, producer=producer,
                       y2=ws.x_halves[1])
            return ws.x_halves
        ops.matmul(self.dev, lw.mix_out, act, ws.x, num_tokens, h, residual=ws.x, producer=producer)
        return None

    def accept(self, num_pass_tokens: int, n: int) -> None:
        """Commit the first n tokens of the last non-committing pass (DeltaNet layers and the MTP head's starting
        hidden; KV needs nothing)."""
        assert 1 <= n <= num_pass_tokens <= VERIFY_MAX
        self.accept_hidden(n)
        self.accept_layers(n)

    def accept_hidden(self, n: int) -> None:
        """The MTP head's starting hidden after n accepted tokens: all a draft needs of a commit."""
        if self.last_hidden is not None:
            row = 4 * self.cfg.hidden_size
            self.dev.copy(self.last_hidden, self.ws.hidden.view(row * (n - 1)), row)

    def accept_layers(self, n: int) -> None:
        """Every DeltaNet layer's window and state advanced over the n accepted tokens of the last non-committing
        pass, from its saved inputs. In one launch (mixers.GDN_ACCEPT_LAYERS) it writes nothing else and nothing
        else reads or writes those until the next pass, so it may run beside an MTP draft (CudaBackend.draft); the
        two launches a layer write the workspace's mixer output too."""
        cfg, dev = self.cfg, self.dev
        c, key = cfg.ssm_conv_dim, cfg.ssm_num_k_heads * cfg.ssm_head_dim
        if mixers.GDN_ACCEPT_LAYERS and self.deltanet:
            mixers.gdn_accept_layers(dev, self.accept_table, len(self.deltanet), n, cfg.ssm_num_k_heads,
                                     cfg.ssm_num_v_heads, cfg.ssm_head_dim, cfg.ssm_v_head_dim, c,
                                     cfg.ssm_conv_kernel)
            return
        for layer in self.deltanet.values():  # two launches a layer (OPENJET_CUDA_ACCEPT_LAYERS=0)
            mixers.conv_commit(dev, layer.window, n, c, cfg.ssm_conv_kernel)
            mixers.gdn_recurrent(dev, layer.qk_norm, layer.qk_norm.view(4 * key), layer.conv_out.view(8 * key),
                                 layer.ssm, self.ws.mix, n, cfg.ssm_num_k_heads, cfg.ssm_num_v_heads,
                                 cfg.ssm_head_dim, cfg.ssm_v_head_dim, 2 * key, c, cfg.ssm_inner_size, True,
                                 g=layer.g, beta=layer.beta)
