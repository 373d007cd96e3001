"""The diff harness: the VM and the megakernel run the same program (the same instruction list, cut after any op
or layer) from the same state, and every buffer is compared.

The VM sets the state (prefill of a prompt, then a cycle's control words); all its buffers are copied to the GPU,
scratch included, so the two start identical; then both run and each buffer is compared in the VM's form (act
layouts decoded, f16 caches widened). sweep() repeats this stopping after every group of the first layers and
after every layer, which finds the first instruction whose output diverges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from engine.cuda.megakernel import formats
from engine.cuda.megakernel.instructions import Op
from engine.cuda.megakernel.errors import MegakernelError
from engine.cuda.megakernel.layout import LW, MAX_DRAFT, MAX_ROWS, Ctl, Err, Mode
from engine.cuda.megakernel.schedule import Program
from engine.cuda.megakernel.solvers import act8_fill_written, act_h_int8_written, norm_in_matmul
from engine.cuda.megakernel.vm import VirtualMachine

# The types whose one-row MIX_IN takes the normed row's int8 levels in shared memory (norm_own.cuh
# levels_from_smem: the A8_SMEM matmuls), writing no own act to L2
LEVELS_IN_SMEM = (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K)
# relative error ||gpu - vm|| / ||vm|| allowed per buffer kind: f16 activations in the matmuls, f16 caches
TOLERANCE = {"f32": 2e-2, "act": 2e-2, "kv": 2e-2}
EXACT = ("i32", "u32", "u8")


@dataclass(slots=True)
class BufferDiff:
    """One buffer's comparison."""

    name: str
    kind: str
    rel_err: float
    mismatches: int  # elements that differ (integer buffers), or non-finite values that disagree (float buffers)
    ok: bool


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64 (1.0 when ref is zero and out is not)."""
    out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
    denom = np.linalg.norm(ref64)
    diff = np.linalg.norm(out64 - ref64)
    return float(diff / denom) if denom > 0 else (0.0 if diff == 0 else 1.0)


def compare(vm: VirtualMachine, gpu, skip: tuple[str, ...] = ("counters",)) -> list[BufferDiff]:
    """Every buffer of the two executors, in the VM's form."""
    out = []
    for spec in vm.specs:  # act buffers: every row (rows neither wrote are the same copy on both sides)
        if spec.name in skip:
            continue
        want, got = vm.mem[spec.name], gpu.read(spec.name)
        if spec.kind in EXACT:
            bad = int(np.count_nonzero(got != want))
            out.append(BufferDiff(spec.name, spec.kind, float(bad), bad, bad == 0))
            continue
        # infinities are values too (an idle attention split's max is -inf): they must agree exactly
        finite = np.isfinite(got) & np.isfinite(want)
        bad = int(np.count_nonzero(~finite & ~((got == want) | (np.isnan(got) & np.isnan(want)))))
        err = rel_err(got[finite], want[finite])
        out.append(BufferDiff(spec.name, spec.kind, err, bad, bad == 0 and err < TOLERANCE[spec.kind]))
    return out


def act8_mismatch(gpu, name: str, row: int = 0) -> float:
    """One row of an act's int8 copy on the GPU against formats.act8_encode of the act the GPU holds (its own
    decoded hi + lo: what the copy's writer, act8_store or act8_fill, quantises): the fraction of that row's level
    bytes that differ; 1.0 where a scale differs or a sub-block sum differs beyond f32 rounding; 0.0 where the act
    has no int8 copy. Meaningful only where the act's last writer formed the copy at its row count
    (solvers.act_h_int8_written, act8_fill_written)."""
    got = gpu.read_int8(name)
    return 0.0 if got is None else encoding_mismatch(gpu.read(name), got, row)


def encoding_mismatch(values: np.ndarray, got: tuple[np.ndarray, ...], row: int = 0) -> float:
    """act8_mismatch's measure for an act's decoded rows `values` and its int8 copy `got` (read_int8's form)."""
    width = values.shape[1]
    nsb = -(-width // 256)
    want = formats.act8_encode(values[: row + 1], width)
    q_got, q_want = (a.view(np.int8).reshape(nsb, 2, MAX_ROWS, 256)[:, :, row] for a in (got[0], want[0]))
    s_got, s_want = (a.reshape(nsb, 2, MAX_ROWS)[:, :, row] for a in (got[1], want[1]))
    sub_got, sub_want = ((hi.view(np.float16).astype(np.float64) + lo.view(np.float16).astype(np.float64))
                         .reshape(nsb, MAX_ROWS, 8)[:, row] for hi, lo in ((got[2], got[3]), (want[2], want[3])))
    size = np.zeros(nsb * 256)
    size[:width] = np.abs(values[row])
    bound = 1e-5 * size.reshape(nsb, 8, 32).sum(axis=2) + 1e-7  # f32 sums in another order, as f16 pairs
    if not np.array_equal(s_got, s_want) or np.any(np.abs(sub_got - sub_want) > bound):
        return 1.0
    return float(np.count_nonzero(q_got != q_want)) / q_got.size


def copy_state(vm: VirtualMachine, gpu) -> None:
    """Make every GPU buffer (state and scratch, control words included) equal to the VM's."""
    for spec in vm.specs:
        if spec.name != "counters":
            gpu.write(spec.name, vm.mem[spec.name])


def prepare(vm: VirtualMachine, prompt: list[int], drafts: list[int]) -> None:
    """Prefill prompt[:-1] on the VM, then set up a cycle verifying [prompt[-1], *drafts] greedily."""
    from engine.cuda.megakernel.backend import MegakernelBackend

    backend = MegakernelBackend(vm, vm.spec, vm.capacity - MAX_ROWS - MAX_DRAFT)
    backend.prefill(prompt[:-1])
    vm.write_ctl({Ctl.MODE: Mode.CYCLE, Ctl.NUM_ROWS: 1 + len(drafts), Ctl.START: len(prompt) - 1,
                  Ctl.DRAFT_NEXT: min(2, len(drafts) + 1) if vm.spec.has_mtp else 0, Ctl.GREEDY: 1,
                  Ctl.PENALTIES: 0, Ctl.ERROR: 0})
    vm.write_ctl({Ctl.IDS + i: t for i, t in enumerate([prompt[-1], *drafts])})


def diff_program(vm: VirtualMachine, gpu, program: Program) -> list[BufferDiff]:
    """Run `program` on both from the VM's current state; the VM's state is restored afterwards."""
    saved = {name: array.copy() for name, array in vm.mem.items()}
    try:
        copy_state(vm, gpu)
        gpu.run(program)
        ctl = gpu.read_ctl()
        if ctl[Ctl.ERROR] != Err.NONE:
            info = [int(v) for v in ctl[Ctl.ERROR_INFO : Ctl.ERROR_INFO + 6]]
            raise MegakernelError(f"{program.name}: {Err(int(ctl[Ctl.ERROR])).name} (sm, instruction, wait stage, "
                                  f"wait op, counter, expected = {info})")
        vm.run(program)
        return compare(vm, gpu)
    finally:
        for name, array in saved.items():
            vm.mem[name][...] = array


def stop_points(vm: VirtualMachine, program: str = "cycle", detail_layers: int = 1) -> list[tuple[int, Op]]:
    """(stage, op) after which to stop: every group of the first `detail_layers` stages, then each stage's last."""
    groups: list[tuple[int, Op]] = []
    for inst in vm.programs[program].instructions:
        key = (inst.stage, inst.OPCODE)
        if not groups or groups[-1] != key:
            groups.append(key)
    last_of_stage = {stage: (stage, op) for stage, op in groups}
    return [g for g in groups if g[0] < detail_layers] + [p for s, p in last_of_stage.items() if s >= detail_layers]


def act8_checks(vm: VirtualMachine, gpu) -> list[tuple[str, tuple[int, Op], float]]:
    """(act, cut, act8_mismatch) after stage 0's writers of each act with an int8 copy: ATTN_NORM (act_h; where
    MIX_IN norms x itself at one row, the own act of the SM of its first instruction that writes one - a matrix
    whose levels do not go to shared memory, norm_own.cuh levels_from_smem: "act_own.sm<k>"), the mixer
    (act_mix), FFN_UP (act_ffn), at the rows the VM was prepared for: every row of each act whose writers form
    the copy at that count ("<act>.row<t>" past one row), none of the others."""
    rows, one_row = vm.rows(0), norm_in_matmul(vm, 0)
    writers = (("act_h", (Op.MIX_IN,) if one_row else (Op.ATTN_NORM,)), ("act_mix", (Op.DN_RULE, Op.ATTN_COMBINE)),
               ("act_ffn", (Op.FFN_UP,)))
    points = stop_points(vm, "cycle", detail_layers=1)
    out = []
    for name, ops in writers:
        written = act_h_int8_written(rows, False) if name == "act_h" else act8_fill_written(rows)
        cut = next(((stage, op) for stage, op in points if stage == 0 and op in ops), None)
        if not written or cut is None or name not in gpu.int8_acts:
            continue
        program = vm.programs["cycle"].truncated(*cut)
        diff_program(vm, gpu, program)
        if name == "act_h" and one_row:
            first = next((i for i, inst in enumerate(program.instructions) if (inst.stage, inst.OPCODE) == cut
                          and vm.spec.matrix(inst.layer, LW[inst.matrix]).qtype not in LEVELS_IN_SMEM), None)
            if first is None:
                continue
            sm = next(sm for sm, queue in enumerate(program.queues) if first in queue)
            values, got = gpu.read_own(sm)
            out.append((f"act_own.sm{sm}", cut, encoding_mismatch(values, got)))
        elif rows == 1:
            out.append((name, cut, act8_mismatch(gpu, name)))
        else:
            out += [(f"{name}.row{t}", cut, act8_mismatch(gpu, name, t)) for t in range(rows)]
    return out


def sweep(vm: VirtualMachine, gpu, program: str = "cycle", detail_layers: int = 1,
          stop_at_first_failure: bool = True) -> list[tuple[tuple[int, Op], list[BufferDiff]]]:
    """diff_program cut after each stop point; stops at the first failing point unless told otherwise."""
    results = []
    for stage, op in stop_points(vm, program, detail_layers):
        diffs = diff_program(vm, gpu, vm.programs[program].truncated(stage, op))
        results.append(((stage, op), diffs))
        if stop_at_first_failure and not all(d.ok for d in diffs):
            break
    return results
