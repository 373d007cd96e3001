"""Programs for the Qwen3.8-27B shape (no model file: the Q4_K_M-like spec engine.gguf.testmodel writes): the
synchronisation invariants, the balance over 132 SMs, instruction words, the byte counts bench/MEGAKERNEL.md
quotes, and the host's view of the act layout."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.megakernel import formats
from engine.cuda.megakernel import instructions as I
from engine.cuda.megakernel.costs import cycle_bytes, spec_from_config
from engine.cuda.megakernel.instructions import INST_WORDS, Op, decode
from engine.cuda.megakernel.layout import LW, MAX_DRAFT, head_stage, mtp_stage
from engine.cuda.megakernel.schedule import PROGRAMS, ScheduleConfig, build_program, cost, group_runs, validate
from engine.gguf.quants import row_bytes
from engine.gguf.testmodel import plan_tensors
from engine.model.config import qwen38_27b_config

CONFIG = ScheduleConfig(split_tiles=True)  # 132 SMs (an H100 / H200), tiles split: the schedule with most to check
WHOLE = ScheduleConfig()  # the default: whole tiles


@pytest.fixture(scope="module")
def spec():
    """The Qwen3.8-27B shape with a 32K draft vocabulary."""
    return spec_from_config(qwen38_27b_config(), draft_vocab=32768)


@pytest.fixture(scope="module")
def programs(spec):
    """Every program for 132 SMs."""
    return {name: build_program(spec, name, CONFIG) for name in PROGRAMS}


@pytest.fixture(scope="module")
def whole_programs(spec):
    """Every program for 132 SMs with the default (whole tile) schedule."""
    return {name: build_program(spec, name, WHOLE) for name in PROGRAMS}


def test_every_program_keeps_the_synchronisation_invariants(programs, whole_programs) -> None:
    for program in [*programs.values(), *whole_programs.values()]:
        validate(program)
    cycle = programs["cycle"]
    assert cycle.instructions[0].OPCODE == Op.EMBED and cycle.instructions[-1].OPCODE == Op.FINISH
    assert sum(1 for i in cycle.instructions if i.OPCODE == Op.VERIFY) == 1
    cfg = qwen38_27b_config()
    assert {i.stage for i in cycle.instructions if i.OPCODE == Op.DRAFT_PICK} == {
        mtp_stage(cfg, s) for s in range(MAX_DRAFT)}


def test_validate_catches_a_wrong_wait(programs) -> None:
    program = programs["verify"].truncated(3, Op.MIX_OUT)
    program.instructions[-1].wait_count += 1
    with pytest.raises(AssertionError, match="waits for"):
        validate(program)


def test_the_cycle_is_balanced_over_the_sms(spec, programs) -> None:
    """The greedy assignment leaves every SM within 2 % of the mean cost."""
    cycle = programs["cycle"]
    loads = np.array([sum(cost(cycle.instructions[i], spec, CONFIG) for i in q) for q in cycle.queues])
    assert len(cycle.queues) == 132 and loads.max() / loads.mean() < 1.02


def test_instruction_words_round_trip(programs) -> None:
    for inst in programs["cycle"].instructions[:: 97]:
        assert decode(inst.words()) == inst
    words, lengths = programs["commit"].words()
    assert words.shape == (132, int(lengths.max()), INST_WORDS)
    with pytest.raises(ValueError, match="int32"):
        I.MixIn(0, row_begin=2**31).words()
    with pytest.raises(ValueError, match="does not wait on"):
        I.FfnDown(0).waits(0, Op.ATTN_NORM, 3)


def test_matmuls_after_a_norm_wait_at_one_row_on_what_the_norm_waits_on(whole_programs) -> None:
    """MIX_IN and FFN_UP carry the wait of the norm group before them as their one-row wait (norm_own.cuh: at one
    row the norms do nothing and the matmuls norm x themselves), so at one row they skip the norm's step; no other
    instruction has one."""
    for program in whole_programs.values():
        insts = program.instructions
        norm_wait = {}
        for inst in insts:
            if inst.OPCODE in (Op.ATTN_NORM, Op.FFN_NORM):
                norm_wait[(inst.stage, inst.OPCODE)] = (inst.wait_stage, inst.wait_op, inst.wait_count)
        for inst in insts:
            one_row = (inst.wait1_stage, inst.wait1_op, inst.wait1_count)
            if inst.OPCODE == Op.MIX_IN:
                assert one_row == norm_wait[(inst.stage, Op.ATTN_NORM)] and inst.wait1_count > 0
            elif inst.OPCODE == Op.FFN_UP:
                assert one_row == norm_wait[(inst.stage, Op.FFN_NORM)] and inst.wait1_op == Op.MIX_OUT
            else:
                assert one_row == (0, 0, 0), inst
    stage = 5  # a trunk layer after the first: its MIX_IN waits at one row on the layer before's FFN_DOWN
    mix = next(i for i in whole_programs["cycle"].instructions if i.OPCODE == Op.MIX_IN and i.stage == stage)
    assert (mix.wait1_stage, mix.wait1_op) == (stage - 1, Op.FFN_DOWN)
    with pytest.raises(ValueError, match="at one row"):
        I.FfnUp(0).waits_at_one_row(0, Op.FFN_DOWN, 3)


def test_truncation_stops_after_the_group(programs) -> None:
    cut = programs["cycle"].truncated(head_stage(qwen38_27b_config()), Op.LM_HEAD)
    validate(cut)
    assert cut.instructions[-1].OPCODE == Op.LM_HEAD
    assert not any(i.OPCODE == Op.VERIFY for i in cut.instructions)


def test_cycle_bytes_are_the_weights_once_plus_the_mtp_block_per_draft(spec) -> None:
    """d = 0 streams every trunk matrix and the lm_head once (not token_embd); each draft step adds the MTP block
    and the draft head; the trunk's bytes do not depend on d."""
    cfg = spec.cfg
    trunk = sum(row_bytes(p.qtype, p.shape[1]) * p.shape[0] for p in plan_tensors(cfg)
                if len(p.shape) == 2 and p.layer is not None and p.layer < cfg.num_layers and p.key != "ssm_conv1d")
    parts = [cycle_bytes(spec, 1 + d, d, 4096, CONFIG) for d in range(MAX_DRAFT + 1)]
    assert parts[0]["trunk_weights"] == trunk
    assert parts[0]["lm_head"] == cfg.vocab_size * row_bytes(spec.matrix(None, "output").qtype, cfg.hidden_size)
    assert all(p["trunk_weights"] == trunk for p in parts)
    step = parts[3]["draft_steps"] - parts[2]["draft_steps"]
    assert step > 0 and parts[4]["draft_steps"] == 3 * step and parts[1]["draft_steps"] == 0
    assert 15.4e9 < parts[0]["trunk_weights"] + parts[0]["lm_head"] < 15.6e9  # bench/NOTES.md: 15.52 GB


def test_act_layout_round_trips_on_the_host() -> None:
    rng = np.random.default_rng(0)
    values = rng.standard_normal((5, 300)).astype(np.float32) * 30
    x16, sums, lo, sums_lo = formats.act_encode(values, 300)
    assert np.unique(formats.act_index(300)).size == formats.act_index(300).size  # a permutation
    back = formats.act_decode(x16, lo, 5, 300)
    np.testing.assert_allclose(back, values, rtol=2e-6, atol=1e-6)
    sub = formats.act_sums_decode(sums, sums_lo, 5, 300)
    padded = np.zeros((5, 512), np.float32)
    padded[:, :300] = back
    np.testing.assert_allclose(sub, padded.reshape(5, 16, 32).sum(axis=2), rtol=1e-5, atol=1e-4)


def test_int8_acts_default_and_knob(monkeypatch) -> None:
    """The acts the runner gives an int8 copy: act_h, act_ffn and act_mix by default (runner.py INT8_ACTS);
    OPENJET_MK_INT8_ACTS names another set, and a name that cannot have one is refused by name."""
    from engine.cuda.megakernel import runner

    monkeypatch.delenv(runner.INT8_ACTS_ENV, raising=False)
    assert runner.int8_acts() == ("act_h", "act_ffn", "act_mix")
    monkeypatch.setenv(runner.INT8_ACTS_ENV, "act_h, act_mix")
    assert runner.int8_acts() == ("act_h", "act_mix")
    monkeypatch.setenv(runner.INT8_ACTS_ENV, "")
    assert runner.int8_acts() == ()
    monkeypatch.setenv(runner.INT8_ACTS_ENV, "act_h,act_eh")
    with pytest.raises(ValueError, match="act_eh"):
        runner.int8_acts()


def test_act8_mismatch_finds_a_wrong_level_scale_or_sum() -> None:
    """diff.act8_mismatch (the GPU check of the int8 copies) on a stand-in executor: 0 for the act's own encoding,
    the fraction of row 0's level bytes that differ, 1.0 for a wrong scale or sub-block sum."""
    from engine.cuda.megakernel.diff import act8_mismatch

    rng = np.random.default_rng(3)
    values = np.zeros((8, 600), np.float32)
    values[0] = rng.standard_normal(600).astype(np.float32)

    class Executor:
        def __init__(self, parts):
            self.parts = parts

        def read(self, name):
            return values

        def read_int8(self, name):
            return self.parts

    good = formats.act8_encode(values[:1], 600)
    assert act8_mismatch(Executor(good), "act_ffn") == 0.0
    q8 = good[0].copy()
    q8.view(np.int8).reshape(3, 2, 8, 256)[1, 1, 0, 5] += 1  # one lo level of row 0
    assert act8_mismatch(Executor((q8, *good[1:])), "act_ffn") == 1 / (3 * 2 * 256)
    scale = good[1].copy()
    scale[16 * 2] *= 1.0001  # superblock 2's hi scale of row 0
    assert act8_mismatch(Executor((good[0], scale, *good[2:])), "act_ffn") == 1.0
    sums = good[2].copy()
    sums[8 * 8 + 3] ^= 0x0400  # superblock 1, row 0, sub-block 3: the f16 hi sum's exponent
    assert act8_mismatch(Executor((*good[:2], sums, good[3])), "act_ffn") == 1.0
    assert act8_mismatch(Executor(None), "act_mix") == 0.0


def test_act8_copy_keeps_each_value_to_its_superblocks_two_levels() -> None:
    """The int8 copy the Q4_K matmul of one row takes (formats.act8_encode = mk_common.cuh act8_store): position p
    of row n in level l's 256 bytes at 64 (p / 64) + 16 (p % 32 / 8) + 8 (p / 32 % 2) + p % 8 (kernels/mmvq_i8.cu),
    each value within max|v| / 64516 of its superblock's largest, the sums those of what the mma sees."""
    rng = np.random.default_rng(1)
    values = rng.standard_normal((3, 600)).astype(np.float32) * np.array([[1.0], [300.0], [1e-3]], np.float32)
    values[1, 256:512] = 0.0  # a zero superblock: both levels and its scales zero
    q8, scale8, sums8, sums8_lo = formats.act8_encode(values, 600)
    nsb = 3
    q = q8.view(np.int8).reshape(nsb, 2, 8, 256)
    sc = scale8.reshape(nsb, 2, 8)
    back = np.zeros((8, nsb * 256), np.float64)
    for sb in range(nsb):
        for p in range(256):
            byte = 64 * (p // 64) + 16 * (p % 32 // 8) + 8 * (p // 32 % 2) + p % 8
            back[:, 256 * sb + p] = q[sb, 0, :, byte] * sc[sb, 0].astype(np.float64) + \
                q[sb, 1, :, byte] * sc[sb, 1].astype(np.float64)
    padded = np.zeros((8, nsb * 256), np.float32)
    padded[:3, :600] = values
    peak = np.abs(padded).reshape(8, nsb, 256).max(axis=2).repeat(256, axis=1)
    assert np.all(np.abs(back - padded) <= peak / 64516 * 1.01 + 1e-30)
    assert np.all(np.abs(q) <= 127) and np.all(sc[:, 1] == (sc[:, 0] / np.float32(254)))
    assert not q[1, :, 1].any() and not sc[1, :, 1].any() and not q[:, :, 3:].any()
    sums = (sums8.view(np.float16).astype(np.float64) + sums8_lo.view(np.float16).astype(np.float64)).reshape(nsb, 8, 8)
    want = back.reshape(8, nsb, 8, 32).sum(axis=3).transpose(1, 0, 2)
    size = np.abs(back).reshape(8, nsb, 8, 32).sum(axis=3).transpose(1, 0, 2)  # f32 sums: error to their terms
    assert np.all(np.abs(sums - want) <= 1e-5 * size + 1e-7)  # an f16 pair: ~22 bits, f16 subnormals below


@pytest.mark.parametrize("split", [True, False], ids=["split", "whole"])
def test_every_group_is_balanced_on_its_own(spec, programs, whole_programs, split) -> None:
    """Groups run one after another, so each must spread evenly: a matmul group's busiest SM carries at most one
    instruction more than the mean (split, FFN_UP: four 32-index units an SM, the 16 left in 8 superblock pieces
    each)."""
    config = CONFIG if split else WHOLE
    cycle = (programs if split else whole_programs)["cycle"]
    sm_of = {i: sm for sm, q in enumerate(cycle.queues) for i in q}
    groups = {(cycle.instructions[r.start].stage, cycle.instructions[r.start].OPCODE.name): r
              for r in group_runs(cycle.instructions)}
    for (stage, op), members in groups.items():
        if op not in ("FFN_UP", "FFN_DOWN", "MIX_OUT", "LM_HEAD"):
            continue
        loads = np.zeros(len(cycle.queues))
        for i in members:
            loads[sm_of[i]] += cost(cycle.instructions[i], spec, config)
        biggest = max(cost(cycle.instructions[i], spec, config) for i in members)
        assert loads.max() - loads.mean() <= biggest, f"group ({stage}, {op})"
        assert (loads > 0).sum() == min(len(members), len(cycle.queues)), f"group ({stage}, {op}) leaves SMs idle"
    if not split:
        return
    ffn_up = [cycle.instructions[i] for i in groups[(0, "FFN_UP")]]
    whole = [i for i in ffn_up if i.pieces == 1]
    assert len(whole) == 132 and all(i.row_end - i.row_begin == 128 for i in whole)
    assert sorted((i.row_begin, i.piece) for i in ffn_up if i.pieces > 1) == [
        (132 * 128 + 32 * u, p) for u in range(16) for p in range(8)]
    loads = np.zeros(len(cycle.queues))  # whole units alone: 5 units against 4.12 on the busiest SM
    for i in groups[(0, "FFN_UP")]:
        loads[sm_of[i]] += cost(cycle.instructions[i], spec, CONFIG)
    assert loads.max() / loads.mean() < 1.05


def test_attn_combine_takes_one_query_head_an_instruction(spec, whole_programs) -> None:
    """Every query head of an attention layer is merged by exactly one instruction of its KV head's group."""
    cfg = qwen38_27b_config()
    group = cfg.num_heads // cfg.num_kv_heads
    heads = [inst.kv_head * group + h for inst in whole_programs["cycle"].instructions
             if inst.OPCODE == Op.ATTN_COMBINE and inst.stage == 3 for h in range(inst.head_begin, inst.head_end)]
    assert sorted(heads) == list(range(cfg.num_heads))
    assert len(heads) == sum(1 for inst in whole_programs["cycle"].instructions
                             if inst.OPCODE == Op.ATTN_COMBINE and inst.stage == 3)


def test_mix_in_gives_every_sm_one_instruction(spec, whole_programs) -> None:
    """A layer's K-quant matrices share the SMs a run an SM (DeltaNet's attn_qkv and attn_gate; attention's q and
    Q6_K v), and the tiles the rings do not stream (DeltaNet's Q8_0 alpha and beta, attention's Q5_0 k) go to SMs
    of their own, one an SM: every row once, no SM with two MIX_IN instructions (a second instruction on an SM
    set the group's time, bench/MEGAKERNEL.md round 7), and each matrix's runs within one tile of each other.
    Cut per matrix (joint_rows=False), each SM takes a run of each K-quant matrix."""
    def mix_in(program: object, layer: int) -> list:
        return [(i, inst) for i, inst in enumerate(program.instructions)
                if inst.OPCODE == Op.MIX_IN and inst.stage == layer]

    cycle = whole_programs["cycle"]
    sm_of = {i: sm for sm, q in enumerate(cycle.queues) for i in q}
    for layer, keys in ((0, ("attn_qkv", "attn_gate", "ssm_alpha", "ssm_beta")), (3, ("attn_q", "attn_k", "attn_v"))):
        insts = mix_in(cycle, layer)
        for key in keys:
            rows = np.zeros(spec.matrix(layer, key).rows, int)
            lengths = set()
            for _, inst in insts:
                if LW[inst.matrix] == key:
                    assert inst.row_begin % 16 == 0
                    rows[inst.row_begin : inst.row_end] += 1
                    lengths.add(-(-(inst.row_end - inst.row_begin) // 16))
            assert (rows == 1).all(), key
            assert max(lengths) - min(lengths) <= 1, (key, lengths)
        per_sm = np.bincount([sm_of[i] for i, _ in insts], minlength=132)
        assert per_sm.max() == 1, layer
    apart = ScheduleConfig(joint_rows=False)
    assert sum(LW[inst.matrix] in ("attn_qkv", "attn_gate")
               for _, inst in mix_in(build_program(spec, "cycle", apart), 0)) == 2 * 132


@pytest.mark.parametrize("op", [Op.FFN_DOWN, Op.MIX_OUT])
def test_split_tiles_cover_every_superblock_once_and_even_out_the_group(spec, programs, op) -> None:
    """FFN_DOWN and MIX_OUT (320 tiles on 132 SMs): two whole tiles an SM, the 56 left each cut into two
    superblock ranges that share a slot. Every (tile, superblock) is streamed exactly once, and the group's busiest
    SM carries within 5 % of the mean bytes, where whole tiles alone leave it 3 tiles against 2.42."""
    def group_loads(program: object, config: ScheduleConfig) -> tuple[np.ndarray, list]:
        sm_of = {i: sm for sm, q in enumerate(program.queues) for i in q}
        members = [i for i, inst in enumerate(program.instructions) if inst.stage == 3 and inst.OPCODE == op]
        loads = np.zeros(len(program.queues))
        for i in members:  # bytes: the cost less its per-instruction overhead
            loads[sm_of[i]] += cost(program.instructions[i], spec, config) - config.overhead_bytes
        return loads, [program.instructions[i] for i in members]

    loads, insts = group_loads(programs["cycle"], CONFIG)
    key = "ffn_down" if op == Op.FFN_DOWN else "attn_output"  # layer 3 is an attention layer
    info = spec.matrix(3, key)
    nsb = info.cols // 256
    covered = np.zeros((info.rows // 16, nsb), int)
    slots: dict[int, set[int]] = {}
    for inst in insts:
        covered[inst.row_begin // 16 : -(-inst.row_end // 16), inst.sb_begin : inst.sb_end] += 1
        if inst.pieces > 1:
            assert inst.row_end - inst.row_begin == 16 and inst.pieces == 2
            slots.setdefault(inst.slot, set()).add(inst.row_begin)
            assert 0 <= inst.slot * inst.pieces + inst.piece < CONFIG.num_sms  # inside mv_part
    assert (covered == 1).all()
    assert len(slots) == 320 - 2 * 132 and all(len(rows) == 1 for rows in slots.values())
    assert loads.max() / loads.mean() < 1.05
    whole = ScheduleConfig(split_tiles=False)
    loads, insts = group_loads(build_program(spec, "verify", whole), whole)
    assert all(i.pieces == 1 for i in insts) and loads.max() / loads.mean() > 1.2


def test_split_ops_cuts_only_the_matmuls_it_names(spec) -> None:
    """ScheduleConfig.split_ops: FFN_UP's remaining 32-index units cut into superblock pieces (544 units on 132 SMs:
    four whole an SM, 16 cut), FFN_DOWN and MIX_OUT left in whole tiles; and the bits add up."""
    from engine.cuda.megakernel.schedule import SPLIT_FFN_DOWN, SPLIT_FFN_UP, SPLIT_MIX_OUT

    def pieces(config: ScheduleConfig) -> dict[Op, int]:
        program = build_program(spec, "cycle", config)
        return {op: sum(1 for inst in program.instructions if inst.stage == 3 and inst.OPCODE == op
                        and inst.pieces > 1) for op in (Op.FFN_UP, Op.FFN_DOWN, Op.MIX_OUT)}

    up = pieces(ScheduleConfig(split_ops=SPLIT_FFN_UP))
    assert up[Op.FFN_UP] == 16 * (132 // 16) and up[Op.FFN_DOWN] == up[Op.MIX_OUT] == 0
    down = pieces(ScheduleConfig(split_ops=SPLIT_FFN_DOWN | SPLIT_MIX_OUT))
    assert down[Op.FFN_UP] == 0 and down[Op.FFN_DOWN] == down[Op.MIX_OUT] == 2 * (320 - 2 * 132)
    assert pieces(ScheduleConfig(split_ops=SPLIT_FFN_UP | SPLIT_FFN_DOWN | SPLIT_MIX_OUT)) == pieces(CONFIG)
    assert sum(pieces(WHOLE).values()) == 0


class _Memory:
    def __init__(self):
        self.live, self.freed = {}, []

    def free(self, buf):
        del self.live[buf.ptr]
        self.freed.append(buf.what)


class _Device:
    """What GpuExecutor.reschedule touches of a Device: uploads, allocations and frees, counted (no GPU)."""

    def __init__(self):
        self.closed, self.memory, self.next = False, _Memory(), 0x1000

    def _buffer(self, nbytes, what):
        from engine.cuda.device import Buffer

        self.next += 1 << 20
        buf = Buffer(self.next, nbytes, what)
        self.memory.live[buf.ptr] = buf
        return buf

    def to_device(self, array, what):
        return self._buffer(array.nbytes, what)

    def alloc(self, nbytes, what):
        return self._buffer(nbytes, what)


def test_a_benchmark_reschedules_one_executor_and_the_timings_grow_with_the_queues(spec, monkeypatch) -> None:
    """GpuExecutor.reschedule (bench/gpu_megakernel.py's SCHED. variants): the programs rebuilt and uploaded anew
    (the old ones freed), the timing slots re-allocated when a queue grows, and a schedule the buffers were not
    sized for refused."""
    from engine.cuda.megakernel.errors import MegakernelError
    from engine.cuda.megakernel.runner import TIME_SLOTS, TRACE_EVENTS, TRACE_WARPS, GpuExecutor

    ex = object.__new__(GpuExecutor)
    ex.dev, ex.spec, ex.config = _Device(), spec, ScheduleConfig(num_sms=132)
    ex.programs = {n: build_program(spec, n, ex.config) for n in ("cycle", "commit")}
    ex.num_lm_parts = max(p.num_lm_parts for p in ex.programs.values())
    ex.num_draft_parts = max(p.num_draft_parts for p in ex.programs.values())
    ex._uploaded = {n: ex._upload_program(p) for n, p in ex.programs.items()}
    ex.timings = ex.dev.alloc(8 * 132 * ex._max_len() * (TIME_SLOTS + TRACE_WARPS * TRACE_EVENTS), "mk.timings")
    monkeypatch.setattr(GpuExecutor, "_zero", lambda self, buf: None)
    before = ex._max_len()
    old_words = ex._uploaded["cycle"][0].ptr

    ex.reschedule(ScheduleConfig(num_sms=132, split_tiles=True))
    assert ex.config.split_tiles and ex._uploaded["cycle"][0].ptr != old_words
    assert ex._uploaded["cycle"][2] == max(len(q) for q in ex.programs["cycle"].queues) > before
    assert ex.timings.nbytes == 8 * 132 * ex._max_len() * (TIME_SLOTS + TRACE_WARPS * TRACE_EVENTS)
    assert ex.dev.memory.freed.count("mk.timings") == 1 and "mk.cycle.instructions" in ex.dev.memory.freed
    assert set(ex.dev.memory.live) == {b.ptr for w, q, _ in ex._uploaded.values() for b in (w, q)} | {ex.timings.ptr}

    ex.reschedule(ScheduleConfig(num_sms=132))  # back: shorter queues keep the larger timings
    assert ex._uploaded["cycle"][2] == before and ex.dev.memory.freed.count("mk.timings") == 1
    for other in (ScheduleConfig(num_sms=100), ScheduleConfig(num_sms=132, attn_splits=16)):
        with pytest.raises(MegakernelError, match="SMs and the key splits"):
            ex.reschedule(other)
    with pytest.raises(MegakernelError, match="more head parts"):  # two runs an SM: twice the LM_HEAD parts
        ex.reschedule(ScheduleConfig(num_sms=132, tiles_per_sm=2))
    assert not ex.config.split_tiles and ex.config.tiles_per_sm == 1  # a refused schedule changes nothing
