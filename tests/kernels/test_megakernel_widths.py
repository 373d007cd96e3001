"""Every number the megakernel reads at the Qwen3.8-27B shape fits the width it is serialised into: each instruction
of every program decodes back from its int32 words, the Globals sizes and every matrix's WeightRef survive their
int32 ctypes fields at the full 262,144-token context, and the 32-bit block numbers the device's weight loads form
stay below 2**32 (no GPU: the Q4_K_M-like spec engine.gguf.testmodel writes)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.megakernel.backend import capacity_for
from engine.cuda.megakernel.costs import spec_from_config
from engine.cuda.megakernel.errors import MegakernelError
from engine.cuda.megakernel.instructions import INST_WORDS, NUM_OPCODES, decode
from engine.cuda.megakernel.layout import ModelSpec, num_stages
from engine.cuda.megakernel.runner import globals_sizes
from engine.cuda.megakernel.schedule import PROGRAMS, ScheduleConfig, build_program
from engine.cuda.megakernel.structs import SIZE_FIELDS, Globals, WeightRef, assign
from engine.cuda.megakernel.upload import matrix_ref
from engine.gguf.quants import block_size
from engine.model.config import qwen38_27b_config

CONFIG = ScheduleConfig()  # 132 SMs: an H100 / H200
INT32 = (-(2**31), 2**31)


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    """The Qwen3.8-27B shape at its full context, with the 32K draft vocabulary the benchmark uses."""
    return spec_from_config(qwen38_27b_config(), draft_vocab=32768)


@pytest.fixture(scope="module")
def programs(spec):
    """Every program for 132 SMs."""
    return {name: build_program(spec, name, CONFIG) for name in PROGRAMS}


def test_every_instruction_decodes_back_from_its_words(programs) -> None:
    """All ~48K instructions of the cycle (and the other programs): the int32 words hold every field exactly."""
    for program in programs.values():
        words, lengths = program.words()
        assert words.dtype == np.int32 and words.shape[2] == INST_WORDS
        for sm, queue in enumerate(program.queues):
            assert lengths[sm] == len(queue)
            for slot, index in enumerate(queue):
                inst = program.instructions[index]
                assert decode([int(v) for v in words[sm, slot]]) == inst, f"{program.name} #{index}"
    assert len(programs["cycle"].instructions) > 45_000


def test_counters_and_waits_fit_their_words(spec, programs) -> None:
    """Counter (stage, opcode) indices lie in the table the runner zeroes; group sizes fit the u32 counters."""
    rows = num_stages(spec.cfg)
    for program in programs.values():
        for inst in program.instructions:
            assert 0 <= inst.stage < rows and 0 <= inst.wait_stage < rows and 0 <= inst.wait_op < NUM_OPCODES
            assert 0 <= inst.wait_count < 2**31
    assert rows * NUM_OPCODES < 2**31


def test_the_globals_sizes_fit_their_int32_fields_at_full_context(spec, programs) -> None:
    cycle = programs["cycle"]
    max_len = max(len(q) for p in programs.values() for q in p.queues)
    capacity = capacity_for(spec.cfg.context_length)
    sizes = globals_sizes(spec, capacity, CONFIG, cycle.num_lm_parts, cycle.num_draft_parts, max_len)
    assert set(sizes) == set(SIZE_FIELDS)
    g = assign(Globals(), **sizes)
    assert {name: getattr(g, name) for name in sizes} == sizes
    assert sizes["capacity"] == 262144 + 12 and sizes["vocab"] == 248320 and sizes["num_lm_parts"] == 132


def test_every_matrix_fits_its_weight_ref_and_the_devices_block_numbers(spec) -> None:
    """WeightRef's int32 sizes, and kernels/quants.cuh's u32 block number `row * nb + sb` (F16: row * K + k)."""
    for (layer, key), info in spec.matrices.items():
        ref = matrix_ref(1 << 40, info.qtype, info.rows, info.cols)
        assert (ref.rows_total, ref.cols, ref.rows, ref.qtype) == (info.rows, info.cols, info.rows, info.qtype)
        per_row = info.cols if block_size(info.qtype) == 1 else info.cols // block_size(info.qtype)
        assert info.rows * per_row < 2**32, f"{layer}.{key}: block numbers wrap at 32 bits"
    draft = matrix_ref(1 << 40, 14, 248320, 5120, spec.draft_vocab)
    assert (draft.rows_total, draft.rows) == (248320, 32768)


@pytest.mark.parametrize("field,value", [("rows", 2**31), ("cols", -(2**31) - 1), ("rows_total", 2**32 + 5)])
def test_a_size_past_its_field_is_refused_not_wrapped(field: str, value: int) -> None:
    """ctypes alone would store 2**31 as -2**31; the runner must refuse to launch with it."""
    plain = WeightRef()
    plain.rows = 2**31
    assert plain.rows == -(2**31)  # what the device would have read without the check
    with pytest.raises(MegakernelError, match=f"WeightRef.{field} = {value} does not fit"):
        assign(WeightRef(), **{field: value})
    assert assign(WeightRef(), rows=INT32[1] - 1).rows == INT32[1] - 1
