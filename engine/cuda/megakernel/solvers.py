"""The VM's solvers: one per opcode, each the numpy meaning of its device instruction (<op>.cuh), written with
engine/reference/ops.py on the VM's float32 buffers. A solver reads only what its instruction's wait guarantees
is complete and writes only its own outputs, so any interleaving the counters allow gives the same buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from engine.cuda.megakernel import build
from engine.cuda.megakernel import instructions as I
from engine.cuda.megakernel.instructions import Op
from engine.cuda.megakernel.layout import ATTN_MIN_KEYS_LOG2, LW, SUPERBLOCK, Ctl, Mode, head_stage
from engine.cuda.megakernel.sampling import DeviceSampling, greedy_token, penalize, sample_row
from engine.reference import ops

if TYPE_CHECKING:
    from engine.cuda.megakernel.vm import VirtualMachine

F32 = np.float32
ACT8_ROWS_MAX = 5  # mk_common.cuh MK_ACT8_ROWS_MAX: the most rows an int8 copy of several rows serves
Solver = Callable[["VirtualMachine", I.Instruction], None]
SOLVERS: dict[Op, Solver] = {}


def solver(op: Op) -> Callable[[Solver], Solver]:
    """Register the solver of an opcode."""
    def register(fn: Solver) -> Solver:
        """Record fn as op's solver."""
        SOLVERS[op] = fn
        return fn
    return register


def _cols(sb_begin: int, sb_end: int, width: int) -> slice:
    """Columns of superblocks [sb_begin, sb_end) of a `width`-wide activation."""
    return slice(sb_begin * SUPERBLOCK, min(width, sb_end * SUPERBLOCK))


@solver(Op.NOOP)
def noop(vm: VirtualMachine, inst: I.Instruction) -> None:
    """Nothing."""


@solver(Op.EMBED)
def embed(vm: VirtualMachine, inst: I.Embed) -> None:
    """x rows = token embeddings of the pass's ids."""
    rows = vm.rows(inst.stage)
    ids = vm.ctl[Ctl.IDS : Ctl.IDS + rows]
    vm.mem["x"][:rows, inst.col_begin : inst.col_end] = vm.weights.token_embd[ids][:, inst.col_begin : inst.col_end]


# With MK_NORM_IN_MATMUL=1 (norm_own.cuh; off by default until it wins) the norm groups do nothing at one row and
# MIX_IN / FFN_UP norm x themselves: act_h keeps what it held, on both sides. Up to the width the device holds in
# registers (8 warps x 4 superblocks). OPENJET_MK_DEFINES's value, where it sets one, is the device's, so the diff
# harness mirrors a variant.
NORM_IN_MATMUL = False
NORM_OWN_MAX_WIDTH = 8 * 4 * SUPERBLOCK


def norm_in_matmul(vm: VirtualMachine, stage: int) -> bool:
    """Whether the stage's ATTN_NORM / FFN_NORM leave their work to the matmuls that read act_h."""
    # the cheap tests first: the VM asks this for most instructions, and the environment is parsed each time
    if vm.rows(stage) != 1 or vm.cfg.hidden_size > NORM_OWN_MAX_WIDTH:
        return False
    asked = build.tuning_define("MK_NORM_IN_MATMUL")
    return NORM_IN_MATMUL if asked is None else asked != "0"


def _matmul_input(vm: VirtualMachine, inst, norm: str) -> np.ndarray:
    """The stage's rows of act_h, or at one row RMSNorm(x) * the layer's `norm`, which the matmul forms itself."""
    rows = vm.rows(inst.stage)
    if norm_in_matmul(vm, inst.stage):
        return ops.rms_norm(vm.mem[vm.x_name(inst.stage)][:rows], vm.vector(inst.layer, norm), vm.cfg.rms_eps)
    return vm.mem["act_h"][:rows]


def _knob(name: str, default: int = 0) -> int:
    """The kernel's value of a tuning define (OPENJET_MK_DEFINES, else the kernel's own default)."""
    value = build.tuning_define(name)
    return default if value is None else int(value)


def act_h_int8_written(rows: int, last_row_alone: bool) -> bool:
    """Mirror of norm_act.cuh: whether a norm writes act_h's int8 copy at `rows` rows - where a matmul reads it
    (one row; every row count with MK_MV_I8=2, MK_MV_I8ROWS or MK_ACT8_ALL_ROWS) and where its caller says one
    row is read alone (the MTP pass's head norm: OP_DRAFT_HEAD)."""
    if rows == 1 or last_row_alone:
        return True
    return _knob("MK_MV_I8", 1) >= 2 or _knob("MK_MV_I8ROWS", 1) != 0 or _knob("MK_ACT8_ALL_ROWS") != 0


def act8_fill_written(rows: int) -> bool:
    """Mirror of mk_common.cuh act8_fill_at: whether act_ffn's and act_mix's writers form their int8 copy at
    `rows` rows (one row; 2 to 5 with MK_ACT8_FILL_ROWS=1, a benchmark knob)."""
    if _knob("MK_ACT8_FILL", 1) == 0:
        return False
    return rows == 1 or (_knob("MK_ACT8_FILL_ROWS") != 0 and rows <= ACT8_ROWS_MAX)


def _norm_into_act(vm: VirtualMachine, inst, weight: np.ndarray, hidden: str | None,
                   last_row_alone: bool = False) -> None:
    """act_h (and `hidden`) superblocks of RMSNorm(x) * weight for the stage's rows; vm.act_h_int8 says whether
    the kernel's int8 copy of them is written too (its one-row readers check it)."""
    rows, x = vm.rows(inst.stage), vm.mem[vm.x_name(inst.stage)]
    normed = ops.rms_norm(x[:rows], weight, vm.cfg.rms_eps)
    cols = _cols(inst.sb_begin, inst.sb_end, vm.cfg.hidden_size)
    vm.mem["act_h"][:rows, cols] = normed[:, cols]
    vm.act_h_int8 = act_h_int8_written(rows, last_row_alone)
    if hidden is not None:
        vm.mem[hidden][:rows, cols] = normed[:, cols]


@solver(Op.ATTN_NORM)
def attn_norm(vm: VirtualMachine, inst: I.AttnNorm) -> None:
    """act_h = RMSNorm(x) * attn_norm; nothing at one row (norm_in_matmul)."""
    if not norm_in_matmul(vm, inst.stage):
        _norm_into_act(vm, inst, vm.vector(inst.layer, "attn_norm"), None)


@solver(Op.FFN_NORM)
def ffn_norm(vm: VirtualMachine, inst: I.FfnNorm) -> None:
    """act_h = RMSNorm(x) * post_attention_norm; nothing at one row (norm_in_matmul)."""
    if not norm_in_matmul(vm, inst.stage):
        _norm_into_act(vm, inst, vm.vector(inst.layer, "post_attention_norm"), None)


@solver(Op.HEAD_NORM)
def head_norm(vm: VirtualMachine, inst: I.HeadNorm) -> None:
    """act_h = hidden = RMSNorm(x) * output_norm (shared_head_norm in the MTP stages)."""
    is_mtp = inst.stage != head_stage(vm.cfg)
    weight = vm.vector(vm.spec.mtp_layer, "nextn.shared_head_norm") if is_mtp else vm.weights.output_norm
    _norm_into_act(vm, inst, weight, "mtp_hidden" if is_mtp else "hidden", last_row_alone=is_mtp)


def conv_rows(vm: VirtualMachine, layer: int, c0: int, c1: int, qkv: np.ndarray) -> None:
    """The causal conv of channels [c0, c1) over the committed history and the pass's rows qkv ([T, c1 - c0]);
    the window keeps the committed history (the last pass's accepted prefix applied) then the new inputs."""
    window, k1 = vm.mem[f"blk.{layer}.window"], vm.cfg.ssm_conv_kernel - 1
    n_prev, rows = int(vm.ctl[Ctl.COMMIT_N]), qkv.shape[0]
    hist = window[n_prev : n_prev + k1, c0:c1].copy()
    win = np.concatenate([hist, qkv], axis=0)  # [K-1+T, n]
    weight = vm.vector(layer, "ssm_conv1d")[c0:c1]  # [n, K]
    y = np.zeros_like(qkv, dtype=F32)
    for j in range(k1 + 1):  # ops.causal_conv1d's order of accumulation
        y += win[j : j + rows] * weight[:, j]
    vm.mem["conv_out"][:rows, c0:c1] = ops.silu(y)
    window[:k1, c0:c1] = hist
    window[k1 : k1 + rows, c0:c1] = qkv


@solver(Op.MIX_IN)
def mix_in(vm: VirtualMachine, inst: I.MixIn) -> None:
    """Rows of one mixer input matrix: into proj, or (attn_qkv) through the causal conv into conv_out."""
    rows, key = vm.rows(inst.stage), LW[inst.matrix]
    y = ops.matmul(_matmul_input(vm, inst, "attn_norm"), vm.matrix(inst.layer, key)[inst.row_begin : inst.row_end])
    if key == "attn_qkv":
        conv_rows(vm, inst.layer, inst.row_begin, inst.row_end, y)
    else:
        off = vm.proj_offsets[inst.matrix]
        vm.mem["proj"][:rows, off + inst.row_begin : off + inst.row_end] = y


def replay(vm: VirtualMachine, layer: int, h0: int, h1: int) -> None:
    """Commit the last pass's first CTL_COMMIT_N rows into value heads [h0, h1) of the recurrent state."""
    n_prev = int(vm.ctl[Ctl.COMMIT_N])
    if n_prev == 0:
        return
    m, name = vm.mem, f"blk.{layer}."
    state = m[name + "ssm"][h0:h1].copy()
    q = np.zeros((1, h1 - h0, vm.cfg.ssm_head_dim), F32)  # outputs of committed rows are not needed
    for t in range(n_prev):
        step = slice(t, t + 1)
        _, state = ops.gated_delta_rule(q, m[name + "rk"][step, h0:h1], m[name + "rv"][step, h0:h1],
                                        m[name + "rg"][step, h0:h1], m[name + "rb"][step, h0:h1], state)
    m[name + "ssm"][h0:h1] = state


@solver(Op.DN_RULE)
def dn_rule(vm: VirtualMachine, inst: I.DnRule) -> None:
    """Commit, then the gated delta rule over the pass's rows for value heads [head_begin, head_end)."""
    cfg, m, h0, h1 = vm.cfg, vm.mem, inst.head_begin, inst.head_end
    replay(vm, inst.layer, h0, h1)
    rows, name = vm.rows(inst.stage), f"blk.{inst.layer}."
    dk, dv, hk, key = cfg.ssm_head_dim, cfg.ssm_v_head_dim, cfg.ssm_num_k_heads, cfg.ssm_key_dim
    conv = m["conv_out"][:rows]
    key_heads = np.arange(h0, h1) % hk  # value head h reads key head h % Hk
    q = ops.l2_norm(conv[:, :key].reshape(rows, hk, dk)[:, key_heads], cfg.rms_eps) / F32(np.sqrt(dk))
    k = ops.l2_norm(conv[:, key : 2 * key].reshape(rows, hk, dk)[:, key_heads], cfg.rms_eps)
    v = conv[:, 2 * key :].reshape(rows, cfg.ssm_num_v_heads, dv)[:, h0:h1]
    proj, off = m["proj"][:rows], vm.proj_offsets
    alpha = proj[:, off[LW.index("ssm_alpha")] + h0 : off[LW.index("ssm_alpha")] + h1]
    beta = ops.sigmoid(proj[:, off[LW.index("ssm_beta")] + h0 : off[LW.index("ssm_beta")] + h1])
    g = vm.vector(inst.layer, "ssm_a")[h0:h1] * ops.softplus(alpha + vm.vector(inst.layer, "ssm_dt.bias")[h0:h1])
    state = m[name + "ssm"][h0:h1].copy()  # not written back: the next pass commits the accepted rows
    o = np.empty((rows, h1 - h0, dv), F32)
    for t in range(rows):
        step = slice(t, t + 1)
        o[step], state = ops.gated_delta_rule(q[step], k[step], v[step], g[step], beta[step], state)
    m[name + "rk"][:rows, h0:h1], m[name + "rv"][:rows, h0:h1] = k, v
    m[name + "rg"][:rows, h0:h1], m[name + "rb"][:rows, h0:h1] = g, beta
    gate_off = off[LW.index("attn_gate")]
    z = proj[:, gate_off + h0 * dv : gate_off + h1 * dv].reshape(rows, h1 - h0, dv)
    y = ops.gated_rms_norm(o, z, vm.vector(inst.layer, "ssm_norm"), cfg.rms_eps)
    m["act_mix"][:rows, h0 * dv : h1 * dv] = y.reshape(rows, -1)


@solver(Op.DN_COMMIT)
def dn_commit(vm: VirtualMachine, inst: I.DnCommit) -> None:
    """The commit alone: recurrent state of heads [head_begin, head_end), conv window of [chan_begin, chan_end)."""
    replay(vm, inst.layer, inst.head_begin, inst.head_end)
    window, k1 = vm.mem[f"blk.{inst.layer}.window"], vm.cfg.ssm_conv_kernel - 1
    n_prev, chans = int(vm.ctl[Ctl.COMMIT_N]), slice(inst.chan_begin, inst.chan_end)
    window[:k1, chans] = window[n_prev : n_prev + k1, chans].copy()


def split_range(kv_len: int, split: int, num_splits: int) -> tuple[int, int]:
    """Keys [begin, end) of one split: at least 2^ATTN_MIN_KEYS_LOG2 keys per active split (OPENJET_MK_DEFINES's
    MK_ATTN_MIN_KEYS_LOG2 where it sets one, as the device's), the rest idle."""
    asked = build.tuning_define("MK_ATTN_MIN_KEYS_LOG2")
    min_keys = 1 << (ATTN_MIN_KEYS_LOG2 if asked is None else int(asked))
    active = max(1, min(num_splits, (kv_len + min_keys - 1) // min_keys))
    if split >= active:
        return kv_len, kv_len
    return kv_len * split // active, kv_len * (split + 1) // active


def _qk(vm: VirtualMachine, raw: np.ndarray, norm_key: str, layer: int, positions: np.ndarray) -> np.ndarray:
    """Per-head RMSNorm then rope, as engine.reference.transformer.attention_qkv."""
    # raw: [n, heads, D]
    cfg = vm.cfg
    normed = ops.rms_norm(raw, vm.vector(layer, norm_key), cfg.rms_eps)
    return ops.rope(normed, positions, cfg.rope_dim, cfg.rope_theta, cfg.rope_neox)


@solver(Op.ATTN_CORE)
def attn_core(vm: VirtualMachine, inst: I.AttnCore) -> None:
    """Store this split's new keys and values, then the partial attention of the KV head's queries."""
    cfg, m, d = vm.cfg, vm.mem, vm.cfg.head_dim
    rows, pos0, kvh = vm.rows(inst.stage), vm.pos0(inst.stage), inst.kv_head
    begin, end = split_range(pos0 + rows, inst.split, inst.num_splits)
    kc, vc, proj = m[f"blk.{inst.layer}.k"], m[f"blk.{inst.layer}.v"], m["proj"]
    off = vm.proj_offsets
    new = np.arange(max(begin, pos0), end)
    if new.size:
        t = new - pos0
        k_raw = proj[t, off[LW.index("attn_k")] + kvh * d : off[LW.index("attn_k")] + (kvh + 1) * d]
        kc[kvh, new] = _qk(vm, k_raw[:, None], "attn_k_norm", inst.layer, new)[:, 0]
        vc[kvh, new] = proj[t, off[LW.index("attn_v")] + kvh * d : off[LW.index("attn_v")] + (kvh + 1) * d]
    group = cfg.num_heads // cfg.num_kv_heads
    heads = np.arange(kvh * group, (kvh + 1) * group)
    part = m["attn_part"][inst.split]
    part[:rows, heads] = 0.0
    part[:rows, heads, d] = -np.inf
    if begin >= end:
        return
    q_off = off[LW.index("attn_q")]
    q_raw = proj[:rows, q_off : q_off + 2 * cfg.q_size].reshape(rows, cfg.num_heads, 2 * d)[:, heads, :d]
    positions = np.arange(pos0, pos0 + rows)
    q = _qk(vm, q_raw, "attn_q_norm", inst.layer, positions)  # [T, G, D]
    scores = np.einsum("tgd,kd->tgk", q, kc[kvh, begin:end]) * F32(1.0 / np.sqrt(d))
    visible = np.arange(begin, end)[None, :] <= positions[:, None]  # [T, keys]
    scores = np.where(visible[:, None, :], scores, -np.inf).astype(F32)
    mx = scores.max(axis=2)  # [T, G]
    has = visible.any(axis=1)
    p = np.exp(scores - np.where(np.isfinite(mx), mx, 0.0)[:, :, None]).astype(F32)
    part[:rows, heads, :d] = np.where(has[:, None, None], np.matmul(p, vc[kvh, begin:end]), 0.0)
    part[:rows, heads, d] = np.where(has[:, None], mx, -np.inf)
    part[:rows, heads, d + 1] = np.where(has[:, None], p.sum(axis=2), 0.0)


@solver(Op.ATTN_COMBINE)
def attn_combine(vm: VirtualMachine, inst: I.AttnCombine) -> None:
    """Merge the splits' partials of the instruction's query heads and apply qwen35's sigmoid output gate."""
    cfg, m, d = vm.cfg, vm.mem, vm.cfg.head_dim
    rows, group = vm.rows(inst.stage), cfg.num_heads // cfg.num_kv_heads
    heads = slice(inst.kv_head * group + inst.head_begin, inst.kv_head * group + inst.head_end)
    part = m["attn_part"][: inst.num_splits, :rows, heads]  # [S, T, G, D + 2]
    mx = part[..., d].max(axis=0)  # [T, G]
    w = np.where(np.isfinite(part[..., d]), np.exp(part[..., d] - mx[None]), 0.0).astype(F32)
    out = (w[..., None] * part[..., :d]).sum(axis=0) / (w * part[..., d + 1]).sum(axis=0)[..., None]
    gate = m["proj"][:rows, : 2 * cfg.q_size].reshape(rows, cfg.num_heads, 2 * d)[:, heads, d:]
    out = (out * ops.sigmoid(gate)).astype(F32)
    m["act_mix"][:rows, heads.start * d : heads.stop * d] = out.reshape(rows, -1)


def _piece_sum(vm: VirtualMachine, inst: I.MixOut | I.FfnDown | I.FfnUp, out: np.ndarray) -> np.ndarray | None:
    """A piece of a split unit: its product out [rows, n] into mv_part, counted in mv_count; for the last of the
    unit's pieces, the sum of all of them in piece order (and the count back to zero), otherwise None."""
    rows, n = out.shape
    part, count, base = vm.mem["mv_part"], vm.mem["mv_count"], inst.slot * inst.pieces
    part[base + inst.piece, :rows, :n] = out
    count[inst.slot] += 1
    if count[inst.slot] < inst.pieces:
        return None
    total = part[base, :rows, :n].copy()
    for piece in range(1, inst.pieces):
        total += part[base + piece, :rows, :n]
    count[inst.slot] = 0
    return total


def residual_matmul(vm: VirtualMachine, inst: I.MixOut | I.FfnDown, w: np.ndarray, act: np.ndarray) -> None:
    """x[:, rows] += w[rows, superblocks] act[:, superblocks]; for a piece of a split tile (inst.pieces > 1) the
    product goes to mv_part instead, and the last of the tile's pieces adds them, in piece order, to x."""
    rows, x = vm.rows(inst.stage), vm.mem[vm.x_name(inst.stage)]
    r, k = slice(inst.row_begin, inst.row_end), slice(inst.sb_begin * SUPERBLOCK, inst.sb_end * SUPERBLOCK)
    out = ops.matmul(act[:rows, k], w[r, k])  # [rows, tile rows]
    if inst.pieces > 1:
        out = _piece_sum(vm, inst, out)
        if out is None:
            return
    x[:rows, r] += out


@solver(Op.MIX_OUT)
def mix_out(vm: VirtualMachine, inst: I.MixOut) -> None:
    """x rows += the mixer's output projection of act_mix."""
    key = "attn_output" if vm.spec.layer_kind(inst.layer) == "attention" else "ssm_out"
    w = vm.matrix(inst.layer, key)
    residual_matmul(vm, inst, w, vm.mem["act_mix"][:, : w.shape[1]])


@solver(Op.FFN_UP)
def ffn_up(vm: VirtualMachine, inst: I.FfnUp) -> None:
    """act_ffn columns = silu(gate) * up; a piece (inst.pieces > 1) leaves its superblocks' gate and up products
    in mv_part[..., :32] and [..., 32:64], and the last of the unit's pieces applies SwiGLU to their sums."""
    rows, act = vm.rows(inst.stage), _matmul_input(vm, inst, "post_attention_norm")
    r, k = slice(inst.row_begin, inst.row_end), slice(inst.sb_begin * SUPERBLOCK, inst.sb_end * SUPERBLOCK)
    gate = ops.matmul(act[:, k], vm.matrix(inst.layer, "ffn_gate")[r, k])
    up = ops.matmul(act[:, k], vm.matrix(inst.layer, "ffn_up")[r, k])
    if inst.pieces > 1:
        n = gate.shape[1]
        total = _piece_sum(vm, inst, np.concatenate([gate, np.zeros((rows, 32 - n), F32), up], axis=1))
        if total is None:
            return
        gate, up = total[:, :n], total[:, 32 : 32 + n]
    vm.mem["act_ffn"][:rows, r] = ops.swiglu(gate, up)


@solver(Op.FFN_DOWN)
def ffn_down(vm: VirtualMachine, inst: I.FfnDown) -> None:
    """x rows += ffn_down act_ffn."""
    residual_matmul(vm, inst, vm.matrix(inst.layer, "ffn_down"), vm.mem["act_ffn"])


@solver(Op.LM_HEAD)
def lm_head(vm: VirtualMachine, inst: I.LmHead) -> None:
    """logits columns, and each row's penalised maximum over them (row t's history has drafts 1..t)."""
    rows, m = vm.rows(inst.stage), vm.mem
    r = slice(inst.row_begin, inst.row_end)
    logits = ops.matmul(m["act_h"][:rows], vm.weights.output[r])
    m["logits"][:rows, r] = logits
    params, ids = DeviceSampling.from_ctl(vm.ctl), [int(t) for t in vm.ctl[Ctl.IDS : Ctl.IDS + rows]]
    for t in range(rows):
        z = penalize(logits[t], inst.row_begin, m["counts"], m["seen"], ids[1 : t + 1], params)
        best = int(np.argmax(z))
        m["lm_part_v"][t, inst.part], m["lm_part_i"][t, inst.part] = z[best], inst.row_begin + best


@solver(Op.VERIFY)
def verify(vm: VirtualMachine, inst: I.Verify) -> None:
    """Accept drafts and emit tokens (MODE_CYCLE), or commit every row (MODE_PREFILL); set up the MTP pass."""
    ctl, rows, start = vm.ctl, vm.rows(inst.stage), int(vm.ctl[Ctl.START])
    ids = [int(t) for t in ctl[Ctl.IDS : Ctl.IDS + rows]]
    if ctl[Ctl.MODE] == Mode.PREFILL:
        ctl[Ctl.COMMIT_N], ctl[Ctl.MTP_ROWS], ctl[Ctl.NUM_EMITTED] = rows, rows, 0
        ctl[Ctl.MTP_IDS : Ctl.MTP_IDS + rows], ctl[Ctl.MTP_POS] = ids, start
        return
    emitted = _accept(vm, ids, start)
    n = len(emitted)
    ctl[Ctl.COMMIT_N], ctl[Ctl.NUM_EMITTED], ctl[Ctl.MTP_ROWS], ctl[Ctl.MTP_POS] = n, n, n + 1, start
    ctl[Ctl.EMITTED : Ctl.EMITTED + n] = emitted
    ctl[Ctl.MTP_IDS : Ctl.MTP_IDS + n + 1] = ids[:n] + [emitted[-1]]


def _accept(vm: VirtualMachine, ids: list[int], start: int) -> list[int]:
    """The emitted tokens: drafts the model agrees with, then the model's own token."""
    m, params, rows = vm.mem, DeviceSampling.from_ctl(vm.ctl), len(ids)
    out: list[int] = []
    for i in range(rows):
        draft = ids[i + 1] if i + 1 < rows else None
        if params.greedy:
            token = greedy_token(m["lm_part_v"][i, : vm.num_lm_parts], m["lm_part_i"][i, : vm.num_lm_parts])
            kept = token == draft
        else:
            z = penalize(m["logits"][i], 0, m["counts"], m["seen"], ids[1 : i + 1], params)
            kept, token, clipped = sample_row(z, draft, start + i + 1, params)
            vm.ctl[Ctl.SAMPLE_CLIPPED] += int(clipped)
        out.append(token)
        if not kept:
            break
    return out


@solver(Op.MTP_IN)
def mtp_in(vm: VirtualMachine, inst: I.MtpIn) -> None:
    """act_eh = [RMSNorm(embedding) * enorm | RMSNorm(hidden) * hnorm] for the MTP pass's rows."""
    cfg, m, ctl, step = vm.cfg, vm.mem, vm.ctl, vm.mtp_step(inst.stage)
    rows, layer = vm.rows(inst.stage), vm.spec.mtp_layer
    if step == 0:
        tokens = ctl[Ctl.MTP_IDS : Ctl.MTP_IDS + rows]
        hidden = np.concatenate([m["last_hidden"][None], m["hidden"][: rows - 1]], axis=0)
    else:
        tokens = ctl[Ctl.DRAFTS + step - 1 : Ctl.DRAFTS + step]
        last = int(ctl[Ctl.MTP_ROWS]) - 1 if step == 1 else 0
        hidden = m["mtp_hidden"][last : last + 1]
    e = ops.rms_norm(vm.weights.mtp_embeddings()[tokens], vm.vector(layer, "nextn.enorm"), cfg.rms_eps)
    h = ops.rms_norm(hidden, vm.vector(layer, "nextn.hnorm"), cfg.rms_eps)
    cols = _cols(inst.sb_begin, inst.sb_end, 2 * cfg.hidden_size)
    m["act_eh"][:rows, cols] = np.concatenate([e, h], axis=1)[:, cols]


@solver(Op.MTP_EH)
def mtp_eh(vm: VirtualMachine, inst: I.MtpEh) -> None:
    """mtp_x rows = eh_proj act_eh."""
    rows, r = vm.rows(inst.stage), slice(inst.row_begin, inst.row_end)
    vm.mem["mtp_x"][:rows, r] = ops.matmul(vm.mem["act_eh"][:rows], vm.matrix(vm.spec.mtp_layer, "nextn.eh_proj")[r])


@solver(Op.DRAFT_HEAD)
def draft_head(vm: VirtualMachine, inst: I.DraftHead) -> None:
    """Draft logits of the MTP pass's last row over the draft vocabulary, and their (max, argmax)."""
    if not vm.drafts(inst.stage):
        return
    last, r = vm.rows(inst.stage) - 1, slice(inst.row_begin, inst.row_end)
    if not vm.act_h_int8:  # the kernel's one-row matmul would read a stale int8 copy of that row
        raise RuntimeError(f"DRAFT_HEAD reads row {last} of act_h alone, whose int8 copy the head norm did not write "
                           f"at {last + 1} rows (norm_act.cuh)")
    layer, key = vm.spec.mtp_output_key()
    logits = ops.matmul(vm.mem["act_h"][last : last + 1], vm.matrix(layer, key)[r])[0]
    vm.mem["draft_logits"][0, r] = logits
    best = int(np.argmax(logits))
    vm.mem["draft_part_v"][0, inst.part], vm.mem["draft_part_i"][0, inst.part] = logits[best], inst.row_begin + best


@solver(Op.DRAFT_PICK)
def draft_pick(vm: VirtualMachine, inst: I.DraftPick) -> None:
    """This step's draft token."""
    if not vm.drafts(inst.stage):
        return
    n = vm.num_draft_parts
    token = greedy_token(vm.mem["draft_part_v"][0, :n], vm.mem["draft_part_i"][0, :n])
    vm.ctl[Ctl.DRAFTS + vm.mtp_step(inst.stage)] = token


@solver(Op.FINISH)
def finish(vm: VirtualMachine, inst: I.Finish) -> None:
    """Per mode: the last committed hidden, penalty counts, the next cycle's ids and drafts."""
    ctl, m, mode = vm.ctl, vm.mem, int(vm.ctl[Ctl.MODE])
    if mode in (Mode.CYCLE, Mode.PREFILL, Mode.CATCHUP):
        m["last_hidden"][:] = m["hidden"][int(ctl[Ctl.COMMIT_N]) - 1]
    drafts = int(ctl[Ctl.DRAFT_NEXT]) if mode in (Mode.CYCLE, Mode.DRAFT) and vm.spec.has_mtp else 0
    if mode == Mode.CYCLE:
        emitted = ctl[Ctl.EMITTED : Ctl.EMITTED + int(ctl[Ctl.NUM_EMITTED])]
        np.add.at(m["counts"], emitted, 1)
        m["seen"][emitted] = 1
        ctl[Ctl.IDS] = emitted[-1]
    elif mode == Mode.DRAFT:
        ctl[Ctl.IDS] = ctl[Ctl.MTP_IDS]
    ctl[Ctl.IDS + 1 : Ctl.IDS + 1 + drafts] = ctl[Ctl.DRAFTS : Ctl.DRAFTS + drafts]
    ctl[Ctl.DRAFTS_READY] = drafts


assert set(SOLVERS) == set(Op), f"solvers missing for {sorted(set(Op) - set(SOLVERS))}"
