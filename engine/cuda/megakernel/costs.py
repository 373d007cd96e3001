"""Bytes and FLOPs of every group of a megakernel program, and the bandwidth floor they imply.

`python -m engine.cuda.megakernel.costs` prints the per-phase table of the Qwen3.8-27B shape that
bench/MEGAKERNEL.md quotes (no model file needed: the spec is the Q4_K_M-like mix engine.gguf.testmodel writes).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from engine.cuda.megakernel import instructions as I
from engine.cuda.megakernel.layout import LW, MAX_DRAFT, SUPERBLOCK, MatrixInfo, ModelSpec, mtp_stage
from engine.cuda.megakernel.schedule import Program, ScheduleConfig, build_program
from engine.gguf.quants import row_bytes
from engine.model.config import ModelConfig, qwen38_27b_config


def spec_from_config(cfg: ModelConfig, draft_vocab: int | None = None) -> ModelSpec:
    """The spec of a model of this config as engine.gguf.testmodel writes it (Q4_K_M-like types)."""
    from engine.gguf.testmodel import plan_tensors

    matrices: dict[tuple[int | None, str], MatrixInfo] = {}
    for plan in plan_tensors(cfg):
        if len(plan.shape) == 2 and (plan.key in LW or plan.key in ("token_embd", "output")):
            matrices[(plan.layer, plan.key)] = MatrixInfo(int(plan.qtype), *plan.shape)
    if (None, "output") not in matrices:  # tied embeddings
        matrices[(None, "output")] = matrices[(None, "token_embd")]
    has_mtp = cfg.num_nextn_layers > 0
    return ModelSpec(cfg, matrices, has_mtp, cfg.vocab_size if draft_vocab is None else draft_vocab)


@dataclass(slots=True)
class GroupCost:
    """One group of a program: what it must move and compute for `rows` rows at a `context`-token context."""

    stage: int
    op: I.Op
    num_instructions: int
    weight_bytes: int = 0
    state_bytes: int = 0  # KV cache reads, DeltaNet state read + write
    flops: int = 0


def _matmul(spec: ModelSpec, layer: int | None, key: str, rows: int, first: int = 0,
            last: int | None = None, cols: int | None = None) -> tuple[int, int]:
    """(bytes, flops) of rows [first, last) of a matrix (its first `cols` columns: all by default) times `rows`
    activation rows."""
    info = spec.matrix(layer, key)
    n, k = (info.rows if last is None else last) - first, info.cols if cols is None else cols
    return n * row_bytes(info.qtype, k), 2 * rows * n * k


def _instruction_cost(spec: ModelSpec, inst: I.Instruction, rows: int, context: int) -> tuple[int, int, int]:
    """(weight bytes, state bytes, flops) of one instruction."""
    cfg = spec.cfg
    if isinstance(inst, (I.MixIn, I.MixOut, I.FfnUp, I.FfnDown, I.MtpEh, I.LmHead, I.DraftHead)):
        from engine.cuda.megakernel.schedule import _matrix_of

        layer, key = _matrix_of(inst, spec)
        r = 1 if isinstance(inst, I.DraftHead) else rows
        cols = None  # a piece of a split tile (MixOut, FfnDown) streams its superblocks only
        if isinstance(inst, (I.MixOut, I.FfnDown, I.FfnUp)):
            cols = min(spec.matrix(layer, key).cols, inst.sb_end * SUPERBLOCK) - inst.sb_begin * SUPERBLOCK
        b, f = _matmul(spec, layer, key, r, inst.row_begin, inst.row_end, cols)
        if isinstance(inst, I.FfnUp):
            b2, f2 = _matmul(spec, inst.layer, "ffn_up", r, inst.row_begin, inst.row_end, cols)
            b, f = b + b2, f + f2
        return b, 0, f
    if isinstance(inst, I.DnRule):
        heads = inst.head_end - inst.head_begin
        state = heads * cfg.ssm_head_dim * cfg.ssm_v_head_dim
        return 0, 2 * 4 * state, 8 * state * (2 * rows)  # replay (<= rows) + rows, ~8 flops per state entry
    if isinstance(inst, I.AttnCore):
        keys = -(-context // inst.num_splits)
        group = cfg.num_heads // cfg.num_kv_heads
        return 0, 2 * 2 * keys * cfg.head_dim, 4 * rows * group * keys * cfg.head_dim
    return 0, 0, 0


def program_costs(spec: ModelSpec, program: Program, rows: int, context: int) -> list[GroupCost]:
    """Per group of the program, in program order."""
    out: list[GroupCost] = []
    for inst in program.instructions:
        key = (inst.stage, inst.OPCODE)
        if not out or (out[-1].stage, out[-1].op) != key:
            out.append(GroupCost(inst.stage, inst.OPCODE, 0))
        weight, state, flops = _instruction_cost(spec, inst, rows, context)
        group = out[-1]
        group.num_instructions += 1
        group.weight_bytes += weight
        group.state_bytes += state
        group.flops += flops
    return out


def cycle_bytes(spec: ModelSpec, rows: int, drafts: int, context: int, config: ScheduleConfig | None = None) -> dict:
    """Bytes of one cycle by part: trunk and head weights, state, and the MTP pass plus draft steps that run."""
    costs = program_costs(spec, build_program(spec, "cycle", config), rows, context)
    first_mtp = mtp_stage(spec.cfg, 0)
    parts = {"trunk_weights": 0, "lm_head": 0, "state": 0, "mtp_pass": 0, "draft_steps": 0, "flops": 0}
    for g in costs:
        step = g.stage - first_mtp if first_mtp <= g.stage < first_mtp + MAX_DRAFT else -1
        if 1 <= step and step >= drafts:
            continue  # an inactive draft step only counts its instructions
        if step == 0 and g.op in (I.Op.DRAFT_HEAD, I.Op.DRAFT_PICK) and drafts == 0:
            continue
        part = "mtp_pass" if step == 0 else "draft_steps" if step > 0 else (
            "lm_head" if g.op == I.Op.LM_HEAD else "trunk_weights")
        parts[part] += g.weight_bytes
        parts["state"] += g.state_bytes
        parts["flops"] += g.flops
    return parts


def main(argv: list[str] | None = None) -> int:
    """Print the per-phase bytes of one 27B-shaped layer of each kind, and the cycle totals by draft depth."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--gbps", type=float, default=4270.0, help="copy bandwidth (read + write) in GB/s")
    parser.add_argument("--draft-vocab", type=int, default=32768)
    args = parser.parse_args(argv)
    spec = spec_from_config(qwen38_27b_config(), args.draft_vocab)
    program = build_program(spec, "cycle")
    print(f"{'stage':>5} {'op':<13} {'insts':>5} {'weights MB':>10} {'state MB':>9} {'GFLOP T=1':>9}")
    for g in program_costs(spec, program, 1, args.context):
        if g.stage in (0, 3, spec.cfg.num_layers) or g.stage == mtp_stage(spec.cfg, 0):
            print(f"{g.stage:>5} {g.op.name:<13} {g.num_instructions:>5} {g.weight_bytes / 1e6:>10.2f} "
                  f"{g.state_bytes / 1e6:>9.2f} {g.flops / 1e9:>9.3f}")
    for d in range(MAX_DRAFT + 1):
        parts = cycle_bytes(spec, 1 + d, d, args.context)
        total = sum(v for k, v in parts.items() if k != "flops")
        print(f"d={d}: " + ", ".join(f"{k} {v / 1e9:.3f} G" for k, v in parts.items())
              + f"; floor {total / (args.gbps * 1e9) * 1e3:.2f} ms at {args.gbps:.0f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
