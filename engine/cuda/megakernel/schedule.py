"""The instruction lists ("programs") of a model: per layer the ops, their tiles, counters and waits; then the
assignment of instructions to SMs.

A program is a chain of groups in program order. A group is every instruction of one (stage, opcode): they are
independent of each other, and each waits for the whole previous group (its counter reaching the group's size).
Each SM's queue keeps program order, so the earliest unfinished instruction of the program is always at the head
of its SM's queue with its inputs complete: no schedule can deadlock (the VM checks this by running the queues in
random interleavings).

Programs: "cycle" (verify 1 + d rows through every layer, the head, acceptance, the MTP pass and draft steps,
finish), "verify" (the trunk and the head only: the host accepts), "mtp" (the MTP pass and draft steps, finish: a
catch-up after a host accept, or a draft-only launch) and "commit" (the DeltaNet commit of the last pass).
"""

from __future__ import annotations

import heapq
from itertools import groupby
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.cuda.megakernel import instructions as I
from engine.cuda.megakernel.instructions import INST_WORDS, Instruction, Op
from engine.cuda.megakernel.layout import (LW, MAX_DRAFT, SUPERBLOCK, TILE_ROWS, ModelSpec, finish_stage,
                                           head_stage, lw, mtp_stage)
from engine.gguf.quants import K_QUANT_TYPES, row_bytes

PROGRAMS = ("cycle", "verify", "mtp", "commit")
SPLIT_MIX_OUT, SPLIT_FFN_UP, SPLIT_FFN_DOWN = 1, 2, 4  # ScheduleConfig.split_ops's bits
FFN_UNIT = 32  # FFN indices an FFN_UP instruction takes whole: one sub-block of act_ffn's sums


@dataclass(slots=True)
class ScheduleConfig:
    """How finely work is cut and over how many SMs it is spread."""

    num_sms: int = 132
    tiles_per_sm: int = 1  # matmul instructions per SM and matrix (row runs of nearly equal length)
    attn_splits: int = 32  # key splits per KV head (flash decoding; the idle ones cost one check)
    # Cost of an instruction beyond its bytes, for the balance: ~8 us on the H200 (the first stage's latency, the
    # drain, the fold, the epilogue, the count) at the ~24 GB/s an SM streams inside one (bench/MEGAKERNEL.md round 4).
    overhead_bytes: int = 196608
    # What a 16-row tile of a 32-weight-block type (Q8_0, Q5_0) costs beyond its bytes: ~16 us a tile on the H200
    # through registers (DeltaNet's alpha / beta, attention's Q5_0 k), ~8 through their small ring stages
    # (MK_STAGED_LEGACY), against ~2 for a K-quant tile. Without it the balance stacked them two to an SM
    # (bench/MEGAKERNEL.md round 7: MIX_IN's step 37 us against 22-28 us an instruction); sharing the K-quants'
    # joint runs with them lost too (round 8: 13.05 against 12.69 ms at d = 0).
    register_tile_bytes: int = 393216
    # MIX_IN: a layer's K-quant matrices (DeltaNet's attn_qkv and attn_gate; attention's q and v) share the SMs,
    # a run an SM, so each SM takes one instruction, not one per matrix; False cuts each matrix on its own.
    joint_rows: bool = True
    # FFN_DOWN / MIX_OUT (and FFN_UP's units): the tiles past a whole number per SM cut by superblocks. Off: on the
    # H200 the pieces' own costs (a ring fill, a partial store, the last piece's sum) outweighed the balance they
    # buy (d = 0 cycle 18.97 split against 18.13 ms whole at 3c76e7a; bench/MEGAKERNEL.md round 4).
    split_tiles: bool = False
    # The same cut for some of those matmuls alone (a bit each: SPLIT_MIX_OUT, SPLIT_FFN_UP, SPLIT_FFN_DOWN). Each
    # loses on its own too (H100 d = 0 +0.4 to +0.9 ms: the last piece's sum lengthens the group's tail more than
    # the balance shortens its busiest SM; bench/MEGAKERNEL.md round 14).
    split_ops: int = 0

    def __post_init__(self) -> None:
        for name in ("num_sms", "tiles_per_sm", "attn_splits"):
            if getattr(self, name) < 1:
                raise ValueError(f"ScheduleConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(slots=True)
class Program:
    """Instructions in program order and their assignment to SMs."""

    name: str
    instructions: list[Instruction]
    queues: list[list[int]] = field(default_factory=list)  # per SM: indices into instructions, ascending
    num_lm_parts: int = 0
    num_draft_parts: int = 0

    def words(self) -> tuple[np.ndarray, np.ndarray]:
        """(int32 [num_sms, max_len, INST_WORDS] instruction words, int32 [num_sms] queue lengths)."""
        lengths = np.array([len(q) for q in self.queues], np.int32)
        out = np.zeros((len(self.queues), max(1, int(lengths.max(initial=0))), INST_WORDS), np.int32)
        for sm, queue in enumerate(self.queues):
            for slot, index in enumerate(queue):
                out[sm, slot] = self.instructions[index].words()
        return out, lengths

    def count(self, stage: int, op: Op) -> int:
        """Instructions of the group (stage, op)."""
        return sum(1 for inst in self.instructions if inst.stage == stage and inst.OPCODE == op)

    def truncated(self, stage: int, op: Op) -> Program:
        """The program up to and including group (stage, op): what the diff test runs to stop after one op."""
        last = max((i for i, inst in enumerate(self.instructions) if inst.stage == stage and inst.OPCODE == op),
                   default=None)
        if last is None:
            raise ValueError(f"program {self.name} has no group ({stage}, {op.name})")
        queues = [[i for i in q if i <= last] for q in self.queues]
        return Program(f"{self.name}[..{stage}.{op.name}]", self.instructions[: last + 1], queues,
                       self.num_lm_parts, self.num_draft_parts)


class _Builder:
    """Appends groups; each new group waits for the whole previous one."""

    def __init__(self, spec: ModelSpec, config: ScheduleConfig):
        self.spec, self.config = spec, config
        self.instructions: list[Instruction] = []
        self.last: tuple[int, Op, int] | None = None

    def group(self, insts: list[Instruction]) -> None:
        """Add one group (instructions of a single (stage, opcode))."""
        assert insts and len({(i.stage, i.OPCODE) for i in insts}) == 1, "a group is one (stage, opcode)"
        if self.last is not None:
            for inst in insts:
                inst.waits(*self.last)
        self.instructions += insts
        self.last = (insts[0].stage, insts[0].OPCODE, len(insts))

    def row_tiles(self, rows: int, align: int = TILE_ROWS) -> list[tuple[int, int]]:
        """Row ranges of a matrix's instructions: whole `align`-row tiles cut into tiles_per_sm x num_sms nearly
        equal runs (fewer where the matrix has fewer tiles). One run per SM by default: the group then takes
        ceil(tiles / SMs) tiles on its busiest SM, the least whole tiles allow, in one ring-fed stream."""
        num_tiles = -(-rows // align)
        runs = self.split(num_tiles, self.config.num_sms * self.config.tiles_per_sm)
        return [(b * align, min(rows, e * align)) for b, e in runs]

    def split_tiles(self, rows: int, cols: int, qtype: int, unit: int = TILE_ROWS,
                    op_bit: int = 0) -> list[tuple[int, ...]]:
        """(row_begin, row_end, sb_begin, sb_end, piece, pieces, slot) of the instructions of a matmul whose
        `unit`-row units may be split by superblocks (FFN_DOWN, MIX_OUT: tiles; FFN_UP: 32 FFN indices). Whole
        units leave the group's busiest SM up to one unit more than the mean (320 tiles on 132 SMs: 3 against
        2.42); instead every SM takes the same whole number of units in one run, and each remaining unit is cut
        into `pieces` superblock ranges (as many as there are SMs for them), each an instruction of its own that
        the balance spreads over the SMs with the least work: the busiest SM then carries 2.5 tiles' bytes, not 3.
        K-quant weights only (the staged matmul takes a superblock range), and only with one run per SM and
        matrix."""
        nsb, units, sms = -(-cols // SUPERBLOCK), -(-rows // unit), self.config.num_sms
        whole, rest = divmod(units, sms)
        pieces = min(sms // rest, nsb) if rest else 1
        split = self.config.split_tiles or bool(self.config.split_ops & op_bit)
        if not split or self.config.tiles_per_sm != 1 or pieces < 2 or qtype not in K_QUANT_TYPES:
            return [(b, e, 0, nsb, 0, 1, 0) for b, e in self.row_tiles(rows, unit)]
        out = [(b * unit, e * unit, 0, nsb, 0, 1, 0) for b, e in self.split(whole * sms, sms)] if whole else []
        for slot, tile in enumerate(range(whole * sms, units)):
            r0, r1 = tile * unit, min(rows, (tile + 1) * unit)
            out += [(r0, r1, s0, s1, piece, pieces, slot)
                    for piece, (s0, s1) in enumerate(self.split(nsb, pieces))]
        return out

    def joint_row_tiles(self, matrices: list[tuple[str, int, int]], sms: int) -> list[tuple[str, int, int]]:
        """(key, row_begin, row_end) of the instructions of several matrices (key, rows, bytes a row) on `sms` SMs,
        one run an SM: each matrix gets a share of the SMs, handed out one at a time to the matrix whose busiest SM
        (ceil(tiles / share) tiles, plus an instruction's overhead) costs most, and cuts its tiles into that many
        (x tiles_per_sm) nearly equal runs. One row list cut by bytes put a run across two matrices on a few SMs:
        two instructions there, each with its ring fill, fold and count, and those SMs set the group's time
        (bench/MEGAKERNEL.md round 7: attention's q | k | v, 36.5 us a group against ~17 us an instruction)."""
        tiles = {key: -(-rows // TILE_ROWS) for key, rows, _ in matrices}
        tile_bytes = {key: TILE_ROWS * nbytes for key, _, nbytes in matrices}
        share = dict.fromkeys(tiles, 1)

        def busiest(key: str) -> int:
            return -(-tiles[key] // share[key]) * tile_bytes[key] + self.config.overhead_bytes

        for _ in range(sms - len(tiles)):
            open_keys = [k for k in tiles if share[k] < tiles[k]]
            if not open_keys:
                break
            share[max(open_keys, key=busiest)] += 1
        return [(key, b * TILE_ROWS, min(rows, e * TILE_ROWS)) for key, rows, _ in matrices
                for b, e in self.split(tiles[key], share[key] * self.config.tiles_per_sm)]

    def split(self, total: int, pieces: int) -> list[tuple[int, int]]:
        """[begin, end) ranges cutting `total` items into at most `pieces` nearly equal parts."""
        pieces = max(1, min(pieces, total))
        return [(total * p // pieces, total * (p + 1) // pieces) for p in range(pieces)]

    def superblocks(self, width: int) -> list[tuple[int, int]]:
        """One range per superblock of a `width`-wide activation."""
        return [(sb, sb + 1) for sb in range(-(-width // SUPERBLOCK))]


def _layer_groups(b: _Builder, stage: int, layer: int) -> None:
    """The groups of one decoder layer (trunk layer `layer`, or the MTP block's at an MTP stage)."""
    spec, cfg = b.spec, b.spec.cfg
    h = cfg.hidden_size
    fields = ("row_begin", "row_end", "sb_begin", "sb_end", "piece", "pieces", "slot")
    norms = [I.AttnNorm(stage, layer=layer, sb_begin=s, sb_end=e) for s, e in b.superblocks(h)]
    b.group(norms)
    kind = spec.layer_kind(layer)
    keys = ("attn_q", "attn_k", "attn_v") if kind == "attention" else ("attn_qkv", "attn_gate", "ssm_alpha",
                                                                        "ssm_beta")
    mats = {k: spec.matrix(layer, k) for k in keys}
    # the K-quant matrices share the SMs (attention's Q4_K q and Q6_K v too); the others get tiles of their own
    sets = [[k for k, m in mats.items() if m.qtype in K_QUANT_TYPES]] if b.config.joint_rows else []
    sets = [same for same in sets if len(same) > 1]
    joint = {k for same in sets for k in same}
    others = [(k, s, e) for k in keys if k not in joint for s, e in b.row_tiles(mats[k].rows)]

    def cut(sms: int) -> list[I.MixIn]:  # the joint runs cut for `sms` SMs, then the other instructions
        runs = [run for same in sets for run in b.joint_row_tiles(
            [(k, mats[k].rows, row_bytes(mats[k].qtype, mats[k].cols)) for k in same], sms)]
        return [I.MixIn(stage, layer=layer, matrix=lw(k), row_begin=s, row_end=e) for k, s, e in runs + others]

    # A joint cut over every SM puts the other instructions (DeltaNet's Q8_0 alpha and beta tiles, ~16 us each on
    # the H200) on top of whole runs (~36 us). Leaving them a few SMs of their own costs the runs a little each:
    # the number of spare SMs whose busiest SM is the least loaded, by the balance's own costs.
    spares = range(min(len(others), b.config.num_sms // 2) + 1) if len(sets) == 1 else [0]
    b.group(_skipping(norms, min((cut(b.config.num_sms - n) for n in spares), key=lambda insts: _busiest(insts, b))))
    if kind == "attention":
        splits = b.config.attn_splits
        b.group([I.AttnCore(stage, layer=layer, kv_head=kvh, split=s, num_splits=splits)
                 for kvh in range(cfg.num_kv_heads) for s in range(splits)])
        # a query head an instruction: a KV head's whole group on one SM was a chain of dependent L2 reads per
        # output value (22 us an instruction at d = 0, 80 at d = 4, on 4 SMs; bench/MEGAKERNEL.md round 4)
        group = cfg.num_heads // cfg.num_kv_heads
        b.group([I.AttnCombine(stage, layer=layer, kv_head=kvh, num_splits=splits, head_begin=j, head_end=j + 1)
                 for kvh in range(cfg.num_kv_heads) for j in range(group)])
    else:
        heads = b.split(cfg.ssm_num_v_heads, cfg.ssm_num_v_heads)
        b.group([I.DnRule(stage, layer=layer, head_begin=s, head_end=e) for s, e in heads])
    out_key = "attn_output" if kind == "attention" else "ssm_out"
    m = spec.matrix(layer, out_key)
    b.group([I.MixOut(stage, layer=layer, **dict(zip(fields, f, strict=True)))
             for f in b.split_tiles(m.rows, m.cols, m.qtype, op_bit=SPLIT_MIX_OUT)])
    norms = [I.FfnNorm(stage, layer=layer, sb_begin=s, sb_end=e) for s, e in b.superblocks(h)]
    b.group(norms)
    # 32 FFN indices a unit: a sub-block of the act layout's sums must be one instruction's (or one piece's sum)
    m = spec.matrix(layer, "ffn_gate")
    b.group(_skipping(norms, [I.FfnUp(stage, layer=layer, **dict(zip(fields, f, strict=True)))
                              for f in b.split_tiles(cfg.ffn_size, m.cols, m.qtype, FFN_UNIT, SPLIT_FFN_UP)]))
    m = spec.matrix(layer, "ffn_down")
    b.group([I.FfnDown(stage, layer=layer, **dict(zip(fields, f, strict=True)))
             for f in b.split_tiles(m.rows, m.cols, m.qtype, op_bit=SPLIT_FFN_DOWN)])


def _skipping(norms: list[Instruction], matmuls: list[Instruction]) -> list[Instruction]:
    """The matmuls after a norm group, set to wait at one row on what the norms wait on (the norms then do nothing:
    norm_own.cuh), not on the norms."""
    first = norms[0]
    for inst in matmuls:
        inst.waits_at_one_row(first.wait_stage, first.wait_op, first.wait_count)
    return matmuls


def _busiest(insts: list[Instruction], b: _Builder) -> float:
    """The cost on the busiest SM of one group of instructions, as assign balances it."""
    queues = assign(insts, b.config.num_sms, lambda inst: cost(inst, b.spec, b.config))
    return max(sum(cost(insts[i], b.spec, b.config) for i in q) for q in queues)


def _head_groups(b: _Builder, with_verify: bool) -> int:
    """Output norm, lm_head (and verify); returns the number of lm_head partials."""
    cfg, stage = b.spec.cfg, head_stage(b.spec.cfg)
    b.group([I.HeadNorm(stage, sb_begin=s, sb_end=e) for s, e in b.superblocks(cfg.hidden_size)])
    tiles = b.row_tiles(cfg.vocab_size)
    b.group([I.LmHead(stage, row_begin=s, row_end=e, part=p) for p, (s, e) in enumerate(tiles)])
    if with_verify:
        b.group([I.Verify(stage)])
    return len(tiles)


def _mtp_groups(b: _Builder) -> int:
    """The MTP pass and the draft steps (a step past CTL_DRAFT_NEXT does nothing); returns the draft partials."""
    spec = b.spec
    h, layer, num_parts = spec.cfg.hidden_size, spec.mtp_layer, 0
    for step in range(MAX_DRAFT):
        stage = mtp_stage(spec.cfg, step)
        b.group([I.MtpIn(stage, sb_begin=s, sb_end=e) for s, e in b.superblocks(2 * h)])
        b.group([I.MtpEh(stage, row_begin=s, row_end=e)
                 for s, e in b.row_tiles(spec.matrix(layer, "nextn.eh_proj").rows)])
        _layer_groups(b, stage, layer)
        b.group([I.HeadNorm(stage, sb_begin=s, sb_end=e) for s, e in b.superblocks(h)])
        tiles = b.row_tiles(spec.draft_vocab)
        b.group([I.DraftHead(stage, row_begin=s, row_end=e, part=p) for p, (s, e) in enumerate(tiles)])
        b.group([I.DraftPick(stage)])
        num_parts = len(tiles)
    return num_parts


def _commit_groups(b: _Builder) -> None:
    """DN_COMMIT for every DeltaNet layer: heads and conv channels cut over the SMs."""
    cfg = b.spec.cfg
    pieces = min(cfg.ssm_num_v_heads, b.config.num_sms)
    for layer, kind in enumerate(cfg.layer_kinds):
        if kind != "deltanet":
            continue
        heads, chans = b.split(cfg.ssm_num_v_heads, pieces), b.split(cfg.ssm_conv_dim, pieces)
        b.group([I.DnCommit(layer, layer=layer, head_begin=hs, head_end=he, chan_begin=cs, chan_end=ce)
                 for (hs, he), (cs, ce) in zip(heads, chans, strict=True)])
        b.last = None  # the layers' commits are independent


def build_program(spec: ModelSpec, name: str, config: ScheduleConfig | None = None) -> Program:
    """The program `name` (one of PROGRAMS) for a model, assigned to config.num_sms SMs."""
    if name not in PROGRAMS:
        raise ValueError(f"unknown program {name!r} (one of {', '.join(PROGRAMS)})")
    if name == "mtp" and not spec.has_mtp:
        raise ValueError("the model has no MTP block: there is no mtp program")
    config = config or ScheduleConfig()
    b = _Builder(spec, config)
    num_lm = num_draft = 0
    if name in ("cycle", "verify"):
        b.group([I.Embed(0, col_begin=s * SUPERBLOCK, col_end=min(spec.cfg.hidden_size, e * SUPERBLOCK))
                 for s, e in b.superblocks(spec.cfg.hidden_size)])
        for layer in range(spec.cfg.num_layers):
            _layer_groups(b, layer, layer)
        num_lm = _head_groups(b, with_verify=name == "cycle")
    if name in ("cycle", "mtp") and spec.has_mtp:
        num_draft = _mtp_groups(b)
    if name in ("cycle", "mtp"):
        b.group([I.Finish(finish_stage(spec.cfg))])
    if name == "commit":
        _commit_groups(b)
    program = Program(name, b.instructions, num_lm_parts=num_lm, num_draft_parts=num_draft)
    program.queues = assign(program.instructions, config.num_sms, lambda i: cost(i, spec, config))
    return program


def cost(inst: Instruction, spec: ModelSpec, config: ScheduleConfig) -> float:
    """Estimated bytes an instruction moves (weights dominate), plus a fixed overhead."""
    cfg = spec.cfg
    extra = 0
    if isinstance(inst, (I.MixIn, I.MixOut, I.FfnDown, I.MtpEh, I.LmHead, I.DraftHead, I.FfnUp)):
        key = _matrix_of(inst, spec)
        info = spec.matrix(*key)
        extra = (inst.row_end - inst.row_begin) * row_bytes(info.qtype, info.cols)
        if info.qtype not in K_QUANT_TYPES:  # a tile at a time through registers (matvec.cuh mv_tile)
            extra += -(-(inst.row_end - inst.row_begin) // TILE_ROWS) * config.register_tile_bytes
        if isinstance(inst, (I.MixOut, I.FfnDown, I.FfnUp)):  # a piece streams its superblocks' share
            extra = extra * (inst.sb_end - inst.sb_begin) // -(-info.cols // SUPERBLOCK)
        if isinstance(inst, I.FfnUp):
            extra *= 2  # gate and up rows
    elif isinstance(inst, I.DnRule):
        extra = 2 * (inst.head_end - inst.head_begin) * cfg.ssm_head_dim * cfg.ssm_v_head_dim * 4
    return float(config.overhead_bytes + extra)


def _matrix_of(inst: Instruction, spec: ModelSpec) -> tuple[int | None, str]:
    """The (layer, key) of the matrix a matmul instruction streams."""
    if isinstance(inst, I.MixIn):
        return inst.layer, LW[inst.matrix]
    if isinstance(inst, I.MixOut):
        return inst.layer, "attn_output" if spec.layer_kind(inst.layer) == "attention" else "ssm_out"
    if isinstance(inst, I.FfnUp):
        return inst.layer, "ffn_gate"
    if isinstance(inst, I.FfnDown):
        return inst.layer, "ffn_down"
    if isinstance(inst, I.MtpEh):
        return spec.mtp_layer, "nextn.eh_proj"
    if isinstance(inst, I.DraftHead):
        return spec.mtp_output_key()
    return None, "output"


def group_runs(instructions: list[Instruction]) -> list[range]:
    """The index range of each group: the consecutive instructions of one (stage, opcode), in program order."""
    runs, start = [], 0
    for end in range(1, len(instructions) + 1):
        if end == len(instructions) or (instructions[end].stage, instructions[end].OPCODE) != \
                (instructions[start].stage, instructions[start].OPCODE):
            runs.append(range(start, end))
            start = end
    return runs


def assign(instructions: list[Instruction], num_sms: int, cost_of: Callable[[Instruction], float]) -> list[list[int]]:
    """Each group (the consecutive instructions of one (stage, opcode)) balanced on its own, since every group waits
    for the whole previous one and so lasts as long as its busiest SM: largest first onto the SM with the least
    work in the group, ties to the least work in the program so far (the groups' remainders rotate over the
    SMs). Queues stay in program order."""
    queues: list[list[int]] = [[] for _ in range(num_sms)]
    total = [0.0] * num_sms
    for run in group_runs(instructions):
        heap = [(0.0, total[sm], sm) for sm in range(num_sms)]
        heapq.heapify(heap)
        for c, index in sorted(((cost_of(instructions[i]), i) for i in run), key=lambda ci: -ci[0]):
            load, _, sm = heapq.heappop(heap)
            queues[sm].append(index)
            total[sm] += c
            heapq.heappush(heap, (load + c, total[sm], sm))
    return [sorted(q) for q in queues]


def validate(program: Program) -> None:
    """Check the synchronisation invariants the VM and the megakernel rely on; AssertionError names the first
    instruction that breaks one."""
    groups: dict[tuple[int, int], list[int]] = {}
    for index, inst in enumerate(program.instructions):
        groups.setdefault((inst.stage, int(inst.OPCODE)), []).append(index)
    for index, inst in enumerate(program.instructions):
        for stage, op, count in ((inst.wait_stage, inst.wait_op, inst.wait_count),
                                 (inst.wait1_stage, inst.wait1_op, inst.wait1_count)):
            if not count:
                continue
            producers = groups.get((stage, op), [])
            assert len(producers) == count, \
                f"#{index} {inst} waits for {count}, the program has {len(producers)} producers"
            assert max(producers) < index, f"#{index} {inst} waits on instructions after it"
    for sm, queue in enumerate(program.queues):
        assert queue == sorted(queue), f"SM {sm}'s queue is not in program order"
    assigned = sorted(i for q in program.queues for i in q)
    assert assigned == list(range(len(program.instructions))), "every instruction runs exactly once"

