"""The megakernel's Python VM: the same programs, counters and buffers as the device, executed in numpy float32.

Each SM's queue is run in order and the SMs are interleaved at random (seeded), an instruction running only once
its counter wait is met, exactly as on the device; a state in which no SM can proceed raises
ScheduleDeadlockError. Every opcode has one solver (solvers.py). The VM is also an executor for
MegakernelBackend (backend.py), so a whole speculative cycle runs behind engine/backend.py's contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.cuda.megakernel.errors import ScheduleDeadlockError
from engine.cuda.megakernel.instructions import Instruction, Op
from engine.cuda.megakernel.layout import (MAX_DRAFT, BufferSpec, Ctl, ModelSpec, buffer_specs, head_stage,
                                           mtp_stage, proj_offsets)
from engine.cuda.megakernel.schedule import PROGRAMS, Program, ScheduleConfig, build_program
from engine.cuda.megakernel.solvers import SOLVERS, norm_in_matmul

if TYPE_CHECKING:
    from engine.reference.weights import ReferenceWeights

NUMPY_DTYPES = {"f32": np.float32, "act": np.float32, "kv": np.float32, "i32": np.int32, "u32": np.uint32,
                "u8": np.uint8}


class VirtualMachine:
    """Buffers, programs and the interpreter for one model (its float32 reference weights)."""

    def __init__(self, spec: ModelSpec, weights: ReferenceWeights, capacity: int,
                 config: ScheduleConfig | None = None, order: str = "random", seed: int = 0):
        if order not in ("random", "program"):
            raise ValueError(f"order must be 'random' or 'program', not {order!r}")
        self.spec, self.cfg, self.weights, self.capacity = spec, spec.cfg, weights, capacity
        self.config = config or ScheduleConfig(num_sms=4, tiles_per_sm=1, attn_splits=2)
        names = [n for n in PROGRAMS if n != "mtp" or spec.has_mtp]
        self.programs = {n: build_program(spec, n, self.config) for n in names}
        self.num_lm_parts = max(p.num_lm_parts for p in self.programs.values())
        self.num_draft_parts = max(p.num_draft_parts for p in self.programs.values())
        self.specs = buffer_specs(spec, capacity, self.num_lm_parts, self.num_draft_parts, self.config.attn_splits,
                                  self.config.num_sms)
        self.mem = {s.name: np.zeros(s.shape, NUMPY_DTYPES[s.kind]) for s in self.specs}
        self.ctl = self.mem["ctl"]
        self.act_h_int8 = False  # whether act_h's int8 copy holds its current rows (solvers._norm_into_act)
        self.proj_offsets = proj_offsets(self.cfg)
        self.order, self._rng = order, np.random.default_rng(seed)

    # ---- what the device derives from a stage ----

    def mtp_step(self, stage: int) -> int:
        """The MTP step of a stage (-1 for trunk and head stages)."""
        first = mtp_stage(self.cfg, 0)
        return stage - first if first <= stage < first + MAX_DRAFT else -1

    def rows(self, stage: int) -> int:
        """Rows of the pass a stage belongs to."""
        step = self.mtp_step(stage)
        if step < 0:
            return int(self.ctl[Ctl.NUM_ROWS])
        return int(self.ctl[Ctl.MTP_ROWS]) if step == 0 else 1

    def pos0(self, stage: int) -> int:
        """Position of the stage's row 0."""
        step = self.mtp_step(stage)
        if step < 0:
            return int(self.ctl[Ctl.START])
        return int(self.ctl[Ctl.MTP_POS]) + (0 if step == 0 else int(self.ctl[Ctl.MTP_ROWS]) - 1 + step)

    def x_name(self, stage: int) -> str:
        """The residual stream a stage updates."""
        return "x" if stage <= head_stage(self.cfg) else "mtp_x"

    def is_active(self, stage: int) -> bool:
        """False for the draft steps past CTL_DRAFT_NEXT (their instructions only count)."""
        return self.mtp_step(stage) < 1 or self.mtp_step(stage) < int(self.ctl[Ctl.DRAFT_NEXT])

    def drafts(self, stage: int) -> bool:
        """Whether an MTP stage makes a draft token."""
        return 0 <= self.mtp_step(stage) < int(self.ctl[Ctl.DRAFT_NEXT])

    def vector(self, layer: int, key: str) -> np.ndarray:
        """A per-layer vector (layer num_layers: the MTP block)."""
        w = self.weights
        return w.layers[layer][key] if layer < self.cfg.num_layers else w.nextn[0][key]

    def matrix(self, layer: int | None, key: str) -> np.ndarray:
        """A weight matrix [rows, cols] in float32."""
        if layer is None:
            return getattr(self.weights, key)
        return self.vector(layer, key)

    # ---- the interpreter ----

    def run(self, program: Program | str) -> None:
        """Execute a program: counters from zero, SM queues interleaved as the counters allow."""
        program = self.programs[program] if isinstance(program, str) else program
        counters = self.mem["counters"]
        counters[:] = 0
        heads = [0] * len(program.queues)
        left = len(program.instructions)
        while left:
            ready = [sm for sm, q in enumerate(program.queues)
                     if heads[sm] < len(q) and self._can_run(program.instructions[q[heads[sm]]])]
            if not ready:
                raise ScheduleDeadlockError(self._deadlock_message(program, heads))
            if self.order == "program":
                sm = min(ready, key=lambda s: program.queues[s][heads[s]])
            else:
                sm = ready[int(self._rng.integers(len(ready)))]
            inst = program.instructions[program.queues[sm][heads[sm]]]
            if self.is_active(inst.stage):
                SOLVERS[inst.OPCODE](self, inst)
            counters[inst.stage, int(inst.OPCODE)] += 1
            heads[sm] += 1
            left -= 1

    def _can_run(self, inst: Instruction) -> bool:
        stage, op, count = inst.wait_stage, inst.wait_op, inst.wait_count
        if inst.wait1_count and norm_in_matmul(self, inst.stage):  # the norm group it skips at one row
            stage, op, count = inst.wait1_stage, inst.wait1_op, inst.wait1_count
        return not count or self.mem["counters"][stage, op] >= count

    def _deadlock_message(self, program: Program, heads: list[int]) -> str:
        waiting = [program.instructions[q[heads[sm]]] for sm, q in enumerate(program.queues) if heads[sm] < len(q)]
        first = waiting[0]
        have = int(self.mem["counters"][first.wait_stage, first.wait_op])
        return (f"program {program.name}: no SM can proceed; e.g. {first} waits for counter "
                f"({first.wait_stage}, {Op(first.wait_op).name}) = {first.wait_count}, which is {have}")

    # ---- the executor interface of MegakernelBackend ----

    @property
    def state_specs(self) -> list[BufferSpec]:
        """Buffers that make up the sequence state."""
        return [s for s in self.specs if s.is_state]

    def write_ctl(self, values: dict[int, int]) -> None:
        """Set control words."""
        for index, value in values.items():
            self.ctl[index] = value

    def read_ctl(self) -> np.ndarray:
        """A copy of the control words."""
        return self.ctl.copy()

    def read(self, name: str, rows: int | None = None) -> np.ndarray:
        """A copy of a buffer (its first `rows` rows)."""
        array = self.mem[name]
        return (array if rows is None else array[:rows]).copy()

    def write(self, name: str, array: np.ndarray) -> None:
        """Overwrite a buffer (or its leading rows)."""
        self.mem[name][: array.shape[0]] = array

    def snapshot(self) -> dict[str, np.ndarray]:
        """Copies of every state buffer."""
        return {s.name: self.mem[s.name].copy() for s in self.state_specs}

    def restore(self, snapshot: dict[str, np.ndarray]) -> None:
        """Put a snapshot back."""
        for name, array in snapshot.items():
            self.mem[name][...] = array

    def reset_state(self) -> None:
        """Zero every state buffer (an empty sequence)."""
        for s in self.state_specs:
            self.mem[s.name][...] = 0

    def close(self) -> None:
        """Nothing to release."""
