"""The megakernel's instruction set: one dataclass per opcode, serialised to INST_WORDS int32 words.

Mirrors opcodes.cuh (the header is the law; tests check that the two agree). An instruction's words are the
header (opcode, stage, wait_stage, wait_op, wait_count, wait1_stage, wait1_op, wait1_count) followed by its own
fields in declaration order, which is the order its device parser (<op>.cuh, struct Parsed) reads them. Every
instruction increments the counter (stage, opcode) once its outputs are stored, and runs only once counter
(wait_stage, wait_op) has reached wait_count: that is the whole synchronisation model. (The wait1 words: a
matmul that norms x itself at one row, norm_own.cuh, waits there instead, on what the norm group it skips waits.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

INST_WORDS = 16
INST_ARGS = 8  # words before the op's own fields: opcode, stage, the wait (stage, op, count), the one-row wait


class Op(IntEnum):
    """Opcodes (opcodes.cuh OP_*); 0 is the no-op."""

    NOOP = 0
    EMBED = 1
    ATTN_NORM = 2
    MIX_IN = 3
    DN_RULE = 4
    ATTN_CORE = 5
    ATTN_COMBINE = 6
    MIX_OUT = 7
    FFN_NORM = 8
    FFN_UP = 9
    FFN_DOWN = 10
    HEAD_NORM = 11
    LM_HEAD = 12
    VERIFY = 13
    MTP_IN = 14
    MTP_EH = 15
    DRAFT_HEAD = 16
    DRAFT_PICK = 17
    FINISH = 18
    DN_COMMIT = 19


NUM_OPCODES = len(Op)


@dataclass(slots=True)
class Instruction:
    """The header every instruction carries; subclasses add their fields (all ints) after it."""

    stage: int
    wait_stage: int = 0
    wait_op: int = 0
    wait_count: int = 0  # 0: nothing to wait for
    # at one row, where MIX_IN / FFN_UP norm x themselves (solvers.norm_in_matmul), the wait instead (0: none)
    wait1_stage: int = 0
    wait1_op: int = 0
    wait1_count: int = 0

    OPCODE: ClassVar[Op] = Op.NOOP
    WAITS_ON: ClassVar[tuple[Op, ...]] = ()  # the opcodes this instruction may wait on (checked by the schedule)
    WAITS_AT_ONE_ROW: ClassVar[tuple[Op, ...]] = ()  # likewise for the one-row wait

    @classmethod
    def arg_names(cls) -> tuple[str, ...]:
        """The op's own fields, in word order."""
        return tuple(f.name for f in dataclasses.fields(cls)[7:])

    def words(self) -> list[int]:
        """The INST_WORDS int32 words of this instruction."""
        values = [int(self.OPCODE), self.stage, self.wait_stage, self.wait_op, self.wait_count, self.wait1_stage,
                  self.wait1_op, self.wait1_count]
        values += [int(getattr(self, name)) for name in self.arg_names()]
        if len(values) > INST_WORDS:
            raise ValueError(f"{type(self).__name__} needs {len(values)} words, more than {INST_WORDS}")
        if any(not -(2**31) <= v < 2**31 for v in values):
            raise ValueError(f"{self}: a field does not fit in int32")
        return values + [0] * (INST_WORDS - len(values))

    def waits(self, stage: int, op: Op, count: int) -> Instruction:
        """This instruction, set to wait until counter (stage, op) reaches count."""
        if count and op not in self.WAITS_ON:
            raise ValueError(f"{type(self).__name__} does not wait on {op.name} (it waits on "
                             f"{', '.join(o.name for o in self.WAITS_ON) or 'nothing'})")
        self.wait_stage, self.wait_op, self.wait_count = stage, int(op), count
        return self

    def waits_at_one_row(self, stage: int, op: int, count: int) -> Instruction:
        """This instruction, set to wait at one row until counter (stage, op) reaches count instead."""
        if count and op not in self.WAITS_AT_ONE_ROW:
            raise ValueError(f"{type(self).__name__} does not wait on {Op(op).name} at one row")
        self.wait1_stage, self.wait1_op, self.wait1_count = stage, int(op), count
        return self


@dataclass(slots=True)
class NoOp(Instruction):
    """Nothing: pads a queue; still counts, so it may be waited on."""


@dataclass(slots=True)
class Embed(Instruction):
    """x[t, col_begin:col_end] = token_embd[ids[t], col_begin:col_end] for the pass's rows."""

    col_begin: int = 0
    col_end: int = 0
    OPCODE: ClassVar[Op] = Op.EMBED


@dataclass(slots=True)
class AttnNorm(Instruction):
    """act_h superblocks [sb_begin, sb_end) = RMSNorm(x) * attn_norm of `layer`."""

    layer: int = 0
    sb_begin: int = 0
    sb_end: int = 0
    OPCODE: ClassVar[Op] = Op.ATTN_NORM
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.EMBED, Op.FFN_DOWN, Op.MTP_EH)


@dataclass(slots=True)
class MixIn(Instruction):
    """Rows [row_begin, row_end) of the mixer input matrix `matrix` (a layout.LW slot) times act_h."""

    layer: int = 0
    matrix: int = 0
    row_begin: int = 0
    row_end: int = 0
    OPCODE: ClassVar[Op] = Op.MIX_IN
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.ATTN_NORM,)
    WAITS_AT_ONE_ROW: ClassVar[tuple[Op, ...]] = AttnNorm.WAITS_ON


@dataclass(slots=True)
class DnRule(Instruction):
    """The gated delta rule of value heads [head_begin, head_end): commit the last pass's accepted rows, run this
    pass's rows, save them for the next commit, gated RMSNorm into act_mix."""

    layer: int = 0
    head_begin: int = 0
    head_end: int = 0
    OPCODE: ClassVar[Op] = Op.DN_RULE
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.MIX_IN,)


@dataclass(slots=True)
class AttnCore(Instruction):
    """Key split `split` of `num_splits` for the query heads of KV head `kv_head`: partial (o, max, sum)."""

    layer: int = 0
    kv_head: int = 0
    split: int = 0
    num_splits: int = 1
    OPCODE: ClassVar[Op] = Op.ATTN_CORE
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.MIX_IN,)


@dataclass(slots=True)
class AttnCombine(Instruction):
    """Merge the splits of query heads [head_begin, head_end) of KV head `kv_head`'s group (0 .. heads per KV head),
    apply the sigmoid gate, write act_mix."""

    layer: int = 0
    kv_head: int = 0
    num_splits: int = 1
    head_begin: int = 0
    head_end: int = 1
    OPCODE: ClassVar[Op] = Op.ATTN_COMBINE
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.ATTN_CORE,)


@dataclass(slots=True)
class MixOut(Instruction):
    """x[:, row_begin:row_end] += (attn_output or ssm_out) act_mix. A piece (pieces > 1, see FfnDown) is one tile's
    product over superblocks [sb_begin, sb_end) only."""

    layer: int = 0
    row_begin: int = 0
    row_end: int = 0
    sb_begin: int = 0
    sb_end: int = 0
    piece: int = 0
    pieces: int = 1
    slot: int = 0
    OPCODE: ClassVar[Op] = Op.MIX_OUT
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.DN_RULE, Op.ATTN_COMBINE)


@dataclass(slots=True)
class FfnNorm(Instruction):
    """act_h superblocks [sb_begin, sb_end) = RMSNorm(x) * post_attention_norm of `layer`."""

    layer: int = 0
    sb_begin: int = 0
    sb_end: int = 0
    OPCODE: ClassVar[Op] = Op.FFN_NORM
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.MIX_OUT,)


@dataclass(slots=True)
class FfnUp(Instruction):
    """act_ffn[:, row_begin:row_end] = silu(ffn_gate act_h) * ffn_up act_h (rows are FFN indices). A piece
    (pieces > 1, see FfnDown) is 32 FFN indices' gate and up products over superblocks [sb_begin, sb_end); the last
    piece applies SwiGLU to the sums."""

    layer: int = 0
    row_begin: int = 0
    row_end: int = 0
    sb_begin: int = 0
    sb_end: int = 0
    piece: int = 0
    pieces: int = 1
    slot: int = 0
    OPCODE: ClassVar[Op] = Op.FFN_UP
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.FFN_NORM,)
    WAITS_AT_ONE_ROW: ClassVar[tuple[Op, ...]] = FfnNorm.WAITS_ON


@dataclass(slots=True)
class FfnDown(Instruction):
    """x[:, row_begin:row_end] += ffn_down act_ffn, over the superblocks [sb_begin, sb_end) of its columns. With
    pieces > 1 the instruction is piece `piece` of one tile split by superblocks: it leaves its partial product in
    mv_part[slot * pieces + piece] and counts it in mv_count[slot]; the last piece to arrive adds the tile's pieces
    in piece order and the sum to x (schedule.py split_tiles)."""

    layer: int = 0
    row_begin: int = 0
    row_end: int = 0
    sb_begin: int = 0
    sb_end: int = 0
    piece: int = 0
    pieces: int = 1
    slot: int = 0
    OPCODE: ClassVar[Op] = Op.FFN_DOWN
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.FFN_UP,)


@dataclass(slots=True)
class HeadNorm(Instruction):
    """act_h (and the f32 hidden) superblocks [sb_begin, sb_end) = RMSNorm(x) * output_norm (shared_head_norm
    in the MTP stages)."""

    sb_begin: int = 0
    sb_end: int = 0
    OPCODE: ClassVar[Op] = Op.HEAD_NORM
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.FFN_DOWN,)


@dataclass(slots=True)
class LmHead(Instruction):
    """logits[:, row_begin:row_end] = output act_h; the penalised (max, argmax) of each row into partial `part`."""

    row_begin: int = 0
    row_end: int = 0
    part: int = 0
    OPCODE: ClassVar[Op] = Op.LM_HEAD
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.HEAD_NORM,)


@dataclass(slots=True)
class Verify(Instruction):
    """Accept the drafts (greedy or exact speculative sampling), emit tokens, set the commit count."""

    OPCODE: ClassVar[Op] = Op.VERIFY
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.LM_HEAD,)


@dataclass(slots=True)
class MtpIn(Instruction):
    """act_eh superblocks [sb_begin, sb_end) of [RMSNorm(embed(token)) * enorm | RMSNorm(hidden) * hnorm]."""

    sb_begin: int = 0
    sb_end: int = 0
    OPCODE: ClassVar[Op] = Op.MTP_IN
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.VERIFY, Op.DRAFT_PICK)


@dataclass(slots=True)
class MtpEh(Instruction):
    """mtp_x[:, row_begin:row_end] = eh_proj act_eh."""

    row_begin: int = 0
    row_end: int = 0
    OPCODE: ClassVar[Op] = Op.MTP_EH
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.MTP_IN,)


@dataclass(slots=True)
class DraftHead(Instruction):
    """Draft logits [row_begin, row_end) of the MTP pass's last row; (max, argmax) into partial `part`."""

    row_begin: int = 0
    row_end: int = 0
    part: int = 0
    OPCODE: ClassVar[Op] = Op.DRAFT_HEAD
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.HEAD_NORM,)


@dataclass(slots=True)
class DraftPick(Instruction):
    """The draft token of this MTP step: argmax over the partials."""

    OPCODE: ClassVar[Op] = Op.DRAFT_PICK
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.DRAFT_HEAD,)


@dataclass(slots=True)
class Finish(Instruction):
    """Per mode: last hidden, penalty counts, the next cycle's ids and drafts."""

    OPCODE: ClassVar[Op] = Op.FINISH
    WAITS_ON: ClassVar[tuple[Op, ...]] = (Op.VERIFY, Op.DRAFT_PICK, Op.HEAD_NORM)


@dataclass(slots=True)
class DnCommit(Instruction):
    """Commit the last pass's accepted rows: value heads [head_begin, head_end) of the recurrent state and conv
    channels [chan_begin, chan_end) of the window."""

    layer: int = 0
    head_begin: int = 0
    head_end: int = 0
    chan_begin: int = 0
    chan_end: int = 0
    OPCODE: ClassVar[Op] = Op.DN_COMMIT


CLASSES: dict[Op, type[Instruction]] = {
    cls.OPCODE: cls for cls in (NoOp, Embed, AttnNorm, MixIn, DnRule, AttnCore, AttnCombine, MixOut, FfnNorm, FfnUp,
                                FfnDown, HeadNorm, LmHead, Verify, MtpIn, MtpEh, DraftHead, DraftPick, Finish,
                                DnCommit)
}
assert set(CLASSES) == set(Op), "every opcode has exactly one instruction class"


def decode(words: list[int]) -> Instruction:
    """The instruction whose words these are (the inverse of Instruction.words)."""
    if len(words) != INST_WORDS:
        raise ValueError(f"an instruction is {INST_WORDS} words, got {len(words)}")
    try:
        cls = CLASSES[Op(words[0])]
    except ValueError:
        raise ValueError(f"unknown opcode {words[0]}") from None
    names = cls.arg_names()
    inst = cls(*words[1:INST_ARGS], *words[INST_ARGS : INST_ARGS + len(names)])
    if any(words[INST_ARGS + len(names) :]):
        raise ValueError(f"{cls.__name__}: nonzero words past its {len(names)} fields")
    return inst
