"""On a GPU (sm_80+): the megakernel against its VM, op by op from the same state (engine/cuda/megakernel/diff.py),
then whole cycles against the reference and the per-op CUDA path, the device sampler's distribution, and faults
reported as MegakernelError. Skipped without a GPU; bench/gpu_megakernel.py runs the same checks and the timings."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda import device

try:
    device.Device().close()
    HAS_GPU = True
except device.CudaError:
    HAS_GPU = False

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU of sm_80 or newer")]

PROMPT = [11, 201, 35, 90, 400, 17]
CONTEXT = 512


@pytest.fixture(scope="module")
def model_path(tiny_model_path):
    """The tiny qwen35 model of the VM tests."""
    return tiny_model_path("qwen35", tokenizer=False, vocab_size=512)


@pytest.fixture(scope="module")
def pair(model_path):
    """(VM, GPU executor) of the tiny model with the same schedule (the GPU's SM count)."""
    from engine.cuda.megakernel.backend import capacity_for
    from engine.cuda.megakernel.layout import ModelSpec
    from engine.cuda.megakernel.runner import GpuExecutor
    from engine.cuda.megakernel.vm import VirtualMachine
    from engine.model.weights import load_model
    from engine.reference.weights import load_weights

    _, _, tensors = load_model(str(model_path))
    spec = ModelSpec.from_tensors(tensors)
    with device.Device() as dev:
        gpu = GpuExecutor(dev, spec, tensors, capacity_for(CONTEXT))
        vm = VirtualMachine(spec, load_weights(tensors), capacity_for(CONTEXT), gpu.config, order="program")
        yield vm, gpu
        gpu.close()


@pytest.mark.parametrize("drafts", [[], [7, 8], [7, 8, 9, 10]])
def test_every_op_matches_the_vm_from_the_same_state(pair, drafts: list[int]) -> None:
    """Cut after every group of the first layers and after every later stage: every buffer agrees."""
    from engine.cuda.megakernel.diff import prepare, sweep

    vm, gpu = pair
    prepare(vm, PROMPT, drafts)
    for (stage, op), diffs in sweep(vm, gpu, detail_layers=4):
        bad = [f"{d.name} ({d.kind}): rel {d.rel_err:.2e}, {d.mismatches} bad" for d in diffs if not d.ok]
        assert not bad, f"after stage {stage} {op.name}: " + "; ".join(bad)


def test_int8_copies_are_the_encoding_of_each_act_at_one_row(pair) -> None:
    """After stage 0's norm (or, with MK_NORM_IN_MATMUL, mixer input) and FFN_UP at d = 0, each int8 copy the GPU
    keeps (act_h's, or the normed row's in an own act; act_ffn's from its superblocks' last writers; act_mix's where
    it has one) is formats.act8_encode of the act the GPU holds: the same levels, scales and sub-block sums."""
    from engine.cuda.megakernel.diff import act8_checks, prepare
    from engine.cuda.megakernel.solvers import norm_in_matmul

    vm, gpu = pair
    prepare(vm, PROMPT, [])
    checks = act8_checks(vm, gpu)
    normed = "act_own" if norm_in_matmul(vm, 0) else "act_h"
    assert {name.split(".")[0] for name, _, _ in checks} >= {normed, "act_ffn"}
    assert all(frac == 0.0 for _, _, frac in checks), checks


@pytest.mark.parametrize("num_draft", range(5))
def test_greedy_tokens_equal_the_reference_and_the_per_op_path(model_path, num_draft: int) -> None:
    """256 greedy tokens, one launch per cycle, as the reference's and the per-op CUDA backend's."""
    from engine.backend import TokenSequence
    from engine.cuda.backend import CudaBackend
    from engine.cuda.megakernel.runner import open_backend
    from engine.reference.backend import ReferenceBackend
    from engine.sampling import SamplingParams
    from engine.spec.verify import greedy_accept

    params = SamplingParams(temperature=0.0, seed=0)
    runs = []
    for make in (lambda: ReferenceBackend.from_gguf(model_path, context_size=CONTEXT),
                 lambda: CudaBackend.from_gguf(model_path, context_size=CONTEXT),
                 lambda: open_backend(model_path, context_size=CONTEXT)):
        backend = make()
        backend.prefill(PROMPT[:-1])
        seq = TokenSequence.start(PROMPT, params)
        drafts = num_draft if backend.can_draft else 0
        while len(seq.generated) < 256:
            backend.cycle(seq, drafts, params, rule=greedy_accept)
        runs.append(seq.generated[:256])
        getattr(backend, "close", lambda: None)()
    assert runs[2] == runs[0] and runs[2] == runs[1]


def test_device_sampling_keeps_the_distribution(pair) -> None:
    """VERIFY alone on fixed logits, 4000 seeds: emitted tokens distributed as engine.sampling (chi-square)."""
    from engine.cuda.megakernel.backend import sampling_words
    from engine.cuda.megakernel.instructions import Verify
    from engine.cuda.megakernel.layout import Ctl, Mode, head_stage
    from engine.cuda.megakernel.schedule import Program
    from engine.sampling import SamplingParams, sampling_probs

    vm, gpu = pair
    rng = np.random.default_rng(5)
    logits = np.full((8, vm.cfg.vocab_size), -40.0, np.float32)
    logits[0, :12] = rng.standard_normal(12) * 1.5
    gpu.write("logits", logits)
    params = SamplingParams(temperature=0.8, top_k=8, top_p=0.95, min_p=0.02)
    program = Program("verify", [Verify(head_stage(vm.cfg))], [[0]] + [[]] * (gpu.config.num_sms - 1))
    counts = np.zeros(vm.cfg.vocab_size)
    for seed in range(4000):
        gpu.write_ctl({Ctl.MODE: Mode.CYCLE, Ctl.NUM_ROWS: 1, Ctl.START: 50, Ctl.PENALTIES: 0,
                       **sampling_words(params, seed)})
        gpu.run(program)
        counts[int(gpu.read_ctl()[Ctl.EMITTED])] += 1
    p = sampling_probs(logits[0], params)
    mask = p * 4000 >= 5
    stat = float(np.sum((counts[mask] - p[mask] * 4000) ** 2 / (p[mask] * 4000)))
    dof = int(mask.sum()) - 1
    assert stat < dof * (1 - 2 / (9 * dof) + 3.09 * np.sqrt(2 / (9 * dof))) ** 3
    assert counts[~mask].sum() <= 5


def test_faults_are_reported_as_megakernel_errors(pair) -> None:
    """A wait that never completes and an unknown opcode end the launch with the reason, not a hang."""
    from dataclasses import dataclass

    from engine.cuda.megakernel.backend import MegakernelBackend
    from engine.cuda.megakernel.errors import MegakernelError
    from engine.cuda.megakernel.instructions import Embed, Instruction, Op
    from engine.cuda.megakernel.layout import Mode
    from engine.cuda.megakernel.schedule import Program

    @dataclass(slots=True)
    class Bogus(Instruction):
        OPCODE = 99  # no such opcode

    vm, gpu = pair
    stuck = Embed(0, col_begin=0, col_end=32)
    stuck.wait_stage, stuck.wait_op, stuck.wait_count = 0, int(Op.MIX_IN), 1  # nothing will increment it
    backend = MegakernelBackend(gpu, gpu.spec, CONTEXT)
    for inst, reason in ((stuck, "WAIT_TIMEOUT"), (Bogus(0), "BAD_OPCODE")):
        program = Program("fault", [inst], [[0]] + [[]] * (gpu.config.num_sms - 1))
        with pytest.raises(MegakernelError, match=reason):
            backend._launch(program, Mode.CYCLE, {})
