"""The megakernel's Python VM behind the backend contract, against the numpy reference on a tiny qwen35 model:
greedy tokens and logits at every draft depth, the MTP drafts, exact commits after partial acceptance,
checkpoints, the host-accept path, and schedules that cannot deadlock whatever the interleaving."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from engine.backend import Draft, TokenSequence
from engine.cuda.megakernel.backend import MegakernelBackend
from engine.cuda.megakernel.errors import ScheduleDeadlockError
from engine.cuda.megakernel.layout import MAX_DRAFT, MAX_ROWS
from engine.cuda.megakernel.schedule import ScheduleConfig
from engine.reference.backend import ReferenceBackend
from engine.sampling import SamplingParams
from engine.spec.verify import greedy_accept, with_logit_bias

PROMPT = [11, 201, 35, 90, 400, 17]
NUM_TOKENS = 256
CONTEXT = 512
GREEDY = SamplingParams(temperature=0.0, seed=0)  # seeded: the control words of two runs compare equal
VM_CONFIG = ScheduleConfig(num_sms=2, tiles_per_sm=1, attn_splits=2)
# finer cuts: several instructions per op, key splits that go idle, more SMs to interleave
FINE_CONFIG = ScheduleConfig(num_sms=5, tiles_per_sm=3, attn_splits=3)
# On 15 SMs the hidden-512 model's units do not divide evenly: FFN_DOWN's 32 tiles are two an SM and two cut in
# two by superblocks, FFN_UP's 16 units of 32 indices one an SM and one cut in two
SPLIT_CONFIG = ScheduleConfig(num_sms=15, tiles_per_sm=1, attn_splits=2, split_tiles=True)


@pytest.fixture(scope="module", autouse=True)
def single_thread_blas():
    """Tiny matrices: OpenBLAS threads only contend on a shared machine (18x slower here), so use one."""
    lib = next((p for p in open("/proc/self/maps").read().split() if "openblas" in p and p.endswith(".so")), None)
    fn = None
    if lib is not None:
        blas = ctypes.CDLL(lib)
        fn = next((getattr(blas, n) for n in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads")
                   if hasattr(blas, n)), None)
    if fn is not None:
        fn(1)
    yield
    if fn is not None:
        import os

        fn(os.cpu_count() or 1)


@pytest.fixture(scope="module")
def model_path(tiny_model_path):
    """A tiny qwen35 model with an MTP block (4 layers: 3 DeltaNet + 1 attention, vocabulary 512)."""
    return tiny_model_path("qwen35", tokenizer=False, vocab_size=512)


@pytest.fixture(scope="module")
def greedy_reference(model_path) -> tuple[list[int], np.ndarray]:
    """Plain greedy decoding by the reference: NUM_TOKENS tokens and the logits that chose each."""
    ref = ReferenceBackend.from_gguf(model_path, context_size=CONTEXT)
    ref.prefill(PROMPT[:-1])
    seq, logits = TokenSequence.start(PROMPT, GREEDY), []
    while len(seq.generated) < NUM_TOKENS:
        row = ref.verify([seq.pending])[0]
        ref.accept(1)
        logits.append(row)
        seq.tokens.append(int(np.argmax(row)))
    return seq.generated, np.stack(logits)


def on_vm(model_path, config: ScheduleConfig = VM_CONFIG, seed: int = 0) -> MegakernelBackend:
    """A megakernel backend on the VM, prefilled with PROMPT, keeping its logits."""
    mk = MegakernelBackend.on_vm(model_path, context_size=CONTEXT, config=config, seed=seed)
    mk.keep_logits = True
    mk.prefill(PROMPT[:-1])
    mk.launches.clear()
    return mk


def assert_same_state(mk: MegakernelBackend, ref: ReferenceBackend) -> None:
    """Every committed array of the VM (after applying a pending commit) equals the reference's."""
    mk.materialize()
    assert mk.num_tokens == ref.num_tokens
    ours = committed_arrays(mk)
    for name, want in ref.state.arrays():
        np.testing.assert_allclose(ours[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def committed_arrays(mk: MegakernelBackend) -> dict[str, np.ndarray]:
    """The VM's state in the reference's names and shapes (engine.reference.state.ModelState.arrays)."""
    cfg, n, out = mk.spec.cfg, mk.num_tokens, {}
    for i, kind in enumerate(cfg.layer_kinds):
        if kind == "attention":
            out[f"blk.{i}.k"] = mk.ex.read(f"blk.{i}.k")[:, :n].transpose(1, 0, 2)
            out[f"blk.{i}.v"] = mk.ex.read(f"blk.{i}.v")[:, :n].transpose(1, 0, 2)
        else:
            out[f"blk.{i}.conv"] = mk.ex.read(f"blk.{i}.window")[: cfg.ssm_conv_kernel - 1]
            out[f"blk.{i}.ssm"] = mk.ex.read(f"blk.{i}.ssm")
    mtp = mk.spec.mtp_layer
    out["mtp.k"] = mk.ex.read(f"blk.{mtp}.k")[:, :n].transpose(1, 0, 2)
    out["mtp.v"] = mk.ex.read(f"blk.{mtp}.v")[:, :n].transpose(1, 0, 2)
    out["last_hidden"] = mk.ex.read("last_hidden")
    return out


@pytest.mark.parametrize("num_draft", range(MAX_DRAFT + 1))
def test_greedy_cycles_match_the_reference(model_path, greedy_reference, num_draft: int) -> None:
    """256 greedy tokens at a fixed draft depth: the same tokens as plain greedy decoding, and every row on the
    accepted path has the reference's logits for that position."""
    want_tokens, want_logits = greedy_reference
    mk = on_vm(model_path)
    seq, cycles = TokenSequence.start(PROMPT, GREEDY), 0
    while len(seq.generated) < NUM_TOKENS:
        pos, cycles = len(seq.generated), cycles + 1
        result = mk.cycle(seq, num_draft, GREEDY, rule=greedy_accept)
        assert result.num_drafted == num_draft
        assert result.tokens == want_tokens[pos : pos + len(result.tokens)], f"cycle at token {pos}"
        for i in range(len(result.tokens)):  # row i predicted generated[pos + i]
            if pos + i < NUM_TOKENS:
                np.testing.assert_allclose(mk.last_logits[i], want_logits[pos + i], rtol=1e-4, atol=2e-4)
    # one launch per cycle: after the first, every cycle's drafts were made by the previous launch
    assert mk.launches["cycle"] == cycles and mk.launches["mtp"] == (1 if num_draft else 0)


def test_device_drafts_are_the_reference_mtp_drafts(model_path) -> None:
    """The drafts each cycle verifies (made at the end of the previous launch) are the reference MTP head's."""
    ref = ReferenceBackend.from_gguf(model_path, context_size=CONTEXT)
    ref.prefill(PROMPT[:-1])
    mk = on_vm(model_path, FINE_CONFIG)
    ref_seq, mk_seq = TokenSequence.start(PROMPT, GREEDY), TokenSequence.start(PROMPT, GREEDY)
    for cycle in range(24):
        depth = 1 + cycle % MAX_DRAFT
        mk.next_draft = 1 + (cycle + 1) % MAX_DRAFT
        drafts = ref.draft(ref_seq.pending, depth)
        want = ref.cycle(ref_seq, depth, GREEDY, draft=drafts, rule=greedy_accept)
        got = mk.cycle(mk_seq, depth, GREEDY, rule=greedy_accept)
        assert mk.last_drafts == drafts.tokens, f"cycle {cycle}"
        assert got == want
    assert_same_state(mk, ref)


@pytest.mark.parametrize("num_draft", [2, MAX_DRAFT])
def test_partial_acceptance_commits_exactly_the_accepted_prefix(model_path, greedy_reference,
                                                                  num_draft: int) -> None:
    """Host drafts that are right for k tokens then wrong: k are accepted, and the committed state (KV caches,
    DeltaNet conv and recurrent state, MTP cache, last hidden) equals the reference fed the same cycles."""
    truth, _ = greedy_reference
    ref = ReferenceBackend.from_gguf(model_path, context_size=CONTEXT)
    ref.prefill(PROMPT[:-1])
    mk = on_vm(model_path, FINE_CONFIG, seed=num_draft)
    ref_seq, mk_seq = TokenSequence.start(PROMPT, GREEDY), TokenSequence.start(PROMPT, GREEDY)
    for cycle in range(18):
        pos, right = len(mk_seq.generated), cycle % (num_draft + 1)
        tokens = truth[pos : pos + num_draft]
        draft = Draft(tokens[:right] + [(t + 1) % 512 for t in tokens[right:]])
        want = ref.cycle(ref_seq, 0, GREEDY, draft=draft, rule=greedy_accept)
        got = mk.cycle(mk_seq, 0, GREEDY, draft=draft, rule=greedy_accept)
        assert got == want and got.num_accepted == right, f"cycle {cycle}"
        if cycle % 5 == 4:  # between these, each next pass applies the commit itself
            assert_same_state(mk, ref)
    assert_same_state(mk, ref)


def test_split_units_give_the_reference_tokens_and_state(tiny_model_path) -> None:
    """With FFN_DOWN tiles and FFN_UP units split over SMs by superblocks (the last piece to arrive adding them),
    the cycles give the reference's greedy tokens and leave its committed state, and mv_count back at zero."""
    path = tiny_model_path("qwen35", tokenizer=False, vocab_size=512, hidden_size=512)
    ref = ReferenceBackend.from_gguf(path, context_size=CONTEXT)
    ref.prefill(PROMPT[:-1])
    mk = on_vm(path, SPLIT_CONFIG, seed=3)
    pieces = [i for i in mk.ex.programs["cycle"].instructions if getattr(i, "pieces", 1) > 1]
    assert {"FfnDown", "FfnUp"} <= {type(i).__name__ for i in pieces}
    ref_seq, mk_seq = TokenSequence.start(PROMPT, GREEDY), TokenSequence.start(PROMPT, GREEDY)
    for cycle in range(12):
        got = mk.cycle(mk_seq, 2, GREEDY, rule=greedy_accept)
        want = ref.cycle(ref_seq, 2, GREEDY, draft=Draft(mk.last_drafts), rule=greedy_accept)
        assert got.tokens == want.tokens, f"cycle {cycle}"
    assert_same_state(mk, ref)
    assert not mk.ex.mem["mv_count"].any()


@pytest.mark.parametrize("norm_in_matmul", [False, True], ids=["norms", "norm_in_matmul"])
@pytest.mark.parametrize("config", [FINE_CONFIG, SPLIT_CONFIG], ids=["fine", "split"])
def test_random_interleavings_give_identical_buffers(model_path, config: ScheduleConfig, norm_in_matmul: bool,
                                                     monkeypatch) -> None:
    """Two VMs running the SM queues in different orders end with bit-identical buffers; also where one-row
    matmuls norm x themselves and wait past the norm groups (their one-row waits), at d = 0 and d = 3."""
    from engine.cuda.megakernel import solvers

    monkeypatch.delenv("OPENJET_MK_DEFINES", raising=False)
    monkeypatch.setattr(solvers, "NORM_IN_MATMUL", norm_in_matmul)
    a, b = on_vm(model_path, config, seed=1), on_vm(model_path, config, seed=2)
    b.ex.order = "program"
    seqs = TokenSequence.start(PROMPT, GREEDY), TokenSequence.start(PROMPT, GREEDY)
    for depth in (3, 0, 3, 0, 3, 3):
        for backend, seq in zip((a, b), seqs):
            backend.cycle(seq, depth, GREEDY, rule=greedy_accept)
    for name, array in a.ex.mem.items():
        assert np.array_equal(array, b.ex.mem[name], equal_nan=True), name


def test_checkpoint_rollback_refeeds_bit_identically(model_path) -> None:
    """Restoring a checkpoint taken with a commit pending, then repeating the cycles, repeats them exactly."""
    mk = on_vm(model_path)
    seq = TokenSequence.start(PROMPT, GREEDY)
    for _ in range(3):
        mk.cycle(seq, 2, GREEDY, rule=greedy_accept)
    saved, length = mk.checkpoint(), len(seq.tokens)
    first = [(mk.cycle(seq, 2, GREEDY, rule=greedy_accept).tokens, mk.last_logits.copy()) for _ in range(4)]
    mk.rollback(saved)
    del seq.tokens[length:]
    second = [(mk.cycle(seq, 2, GREEDY, rule=greedy_accept).tokens, mk.last_logits.copy()) for _ in range(4)]
    for (tokens_a, logits_a), (tokens_b, logits_b) in zip(first, second):
        assert tokens_a == tokens_b and np.array_equal(logits_a, logits_b)
    with pytest.raises(ValueError, match="not taken by this backend"):
        on_vm(model_path).rollback(saved)


def test_custom_rules_use_host_verify_and_accept(model_path) -> None:
    """A rule the device does not implement (logit bias) runs through verify() + accept() and the MTP catch-up
    launch, with the reference's result."""
    bias = np.zeros(512, np.float32)
    bias[[7, 99, 300]] = 4.0
    rule = with_logit_bias(greedy_accept, bias)
    ref = ReferenceBackend.from_gguf(model_path, context_size=CONTEXT)
    ref.prefill(PROMPT[:-1])
    mk = on_vm(model_path)
    ref_seq, mk_seq = TokenSequence.start(PROMPT, GREEDY), TokenSequence.start(PROMPT, GREEDY)
    for _ in range(8):
        want = ref.cycle(ref_seq, 2, GREEDY, rule=rule)
        assert mk.cycle(mk_seq, 2, GREEDY, rule=rule) == want
    assert_same_state(mk, ref)


def test_sampled_cycles_are_reproducible_with_a_seed(model_path) -> None:
    """Sampling on the device: the same seed gives the same tokens, another seed other tokens."""
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, repetition_penalty=1.1, seed=7)
    runs = []
    for seed in (7, 7, 8):
        params.seed = seed
        mk, seq = on_vm(model_path), TokenSequence.start(PROMPT, params)
        while len(seq.generated) < 24:
            result = mk.cycle(seq, 2, params)
            assert 1 <= len(result.tokens) <= 3 and all(0 <= t < 512 for t in result.tokens)
        runs.append(seq.generated[:24])
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_deadlocked_schedule_is_reported(model_path) -> None:
    """A wait no instruction can satisfy stops the VM with the instruction and the counter named."""
    mk = on_vm(model_path)
    program = mk.ex.programs["verify"]
    program.instructions[-1].wait_count += 1
    with pytest.raises(ScheduleDeadlockError, match="LM_HEAD|HEAD_NORM"):
        mk.ex.run(program)


def test_bad_requests_are_refused(model_path) -> None:
    """Clear errors for what the megakernel cannot do."""
    mk = on_vm(model_path)
    with pytest.raises(ValueError, match="at most 8"):
        mk.verify(list(range(MAX_ROWS + 1)))
    with pytest.raises(ValueError, match="drafts 0..4"):
        mk.draft(3, MAX_DRAFT + 1)
    with pytest.raises(ValueError, match="without a verify"):
        mk.accept(1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        mk.prefill([512])


def test_diff_harness_names_the_first_diverging_op(model_path) -> None:
    """The GPU diff harness, run between two VMs: identical executors agree everywhere; an executor whose layer-0
    FFN_UP is off is caught right after that op, with the buffer named."""
    from engine.cuda.megakernel.diff import prepare, sweep
    from engine.cuda.megakernel.instructions import Op
    from engine.cuda.megakernel.vm import VirtualMachine

    class Faulty(VirtualMachine):
        def run(self, program) -> None:
            """Run, then spoil act_ffn when the program ran layer 0's FFN_UP."""
            super().run(program)
            if any(i.stage == 0 and i.OPCODE == Op.FFN_UP for i in program.instructions):
                self.mem["act_ffn"] *= 1.1

    reference = on_vm(model_path, FINE_CONFIG).ex
    spec, weights, capacity = reference.spec, reference.weights, reference.capacity
    prepare(reference, PROMPT, [7, 8])
    clean = sweep(reference, VirtualMachine(spec, weights, capacity, FINE_CONFIG), detail_layers=1)
    assert len(clean) > 8 and all(d.ok for _, diffs in clean for d in diffs)
    found = sweep(reference, Faulty(spec, weights, capacity, FINE_CONFIG), detail_layers=1)
    (stage, op), diffs = found[-1]
    assert (stage, op) == (0, Op.FFN_UP)
    assert [d.name for d in diffs if not d.ok] == ["act_ffn"]


def test_at_one_row_the_matmuls_norm_x_themselves(model_path, monkeypatch) -> None:
    """With NORM_IN_MATMUL at d = 0 (one row) ATTN_NORM and FFN_NORM leave act_h as it was and MIX_IN / FFN_UP form
    RMSNorm(x) * their layer's norm themselves, as the device does (norm_own.cuh MK_NORM_IN_MATMUL): the outputs of layer 0's mixer
    input and FFN are exactly those of the norm groups' act_h; at two rows the norms write act_h as before."""
    from engine.cuda.megakernel import solvers
    from engine.cuda.megakernel.diff import prepare
    from engine.cuda.megakernel.instructions import Op

    monkeypatch.delenv("OPENJET_MK_DEFINES", raising=False)  # a variant's MK_NORM_IN_MATMUL would win
    monkeypatch.setattr(solvers, "NORM_IN_MATMUL", True)
    vm = on_vm(model_path, FINE_CONFIG).ex
    cycle = vm.programs["cycle"]

    def run_to(stage: int, op: Op, drafts: list[int]) -> dict[str, np.ndarray]:
        saved = {name: array.copy() for name, array in vm.mem.items()}
        prepare(vm, PROMPT, drafts)
        vm.run(cycle.truncated(stage, op))
        out = {name: vm.mem[name].copy() for name in ("act_h", "proj", "conv_out", "act_ffn")}
        for name, array in saved.items():
            vm.mem[name][...] = array
        return out

    before = run_to(0, Op.EMBED, [])["act_h"]
    assert np.array_equal(run_to(0, Op.ATTN_NORM, [])["act_h"], before)
    assert not np.array_equal(run_to(0, Op.ATTN_NORM, [7])["act_h"][:2], before[:2])
    fused = run_to(0, Op.FFN_UP, [])
    monkeypatch.setattr(solvers, "NORM_IN_MATMUL", False)
    apart = run_to(0, Op.FFN_UP, [])
    assert not np.array_equal(apart["act_h"], before)
    for name in ("proj", "conv_out", "act_ffn"):
        assert np.array_equal(fused[name][:1], apart[name][:1]), name


def test_smaller_key_splits_keep_the_reference_tokens(model_path, greedy_reference, monkeypatch) -> None:
    """MK_ATTN_MIN_KEYS_LOG2 (a benchmark knob: more active key splits at a short context) moves only how the keys
    are cut: 4 keys a split over 3 splits, the VM's split_range following OPENJET_MK_DEFINES as the device does,
    gives the reference's greedy tokens and logits."""
    from engine.cuda.megakernel.solvers import split_range

    monkeypatch.setenv("OPENJET_MK_DEFINES", "MK_ATTN_MIN_KEYS_LOG2=2")
    assert [split_range(9, s, 3) for s in range(3)] == [(0, 3), (3, 6), (6, 9)]  # 32-key splits: one active
    monkeypatch.delenv("OPENJET_MK_DEFINES")
    assert [split_range(9, s, 3) for s in range(3)] == [(0, 9), (9, 9), (9, 9)]
    monkeypatch.setenv("OPENJET_MK_DEFINES", "MK_ATTN_MIN_KEYS_LOG2=2")
    want_tokens, want_logits = greedy_reference
    mk = on_vm(model_path, FINE_CONFIG)
    seq = TokenSequence.start(PROMPT, GREEDY)
    while len(seq.generated) < 24:
        pos = len(seq.generated)
        result = mk.cycle(seq, 2, GREEDY, rule=greedy_accept)
        assert result.tokens == want_tokens[pos : pos + len(result.tokens)], f"cycle at token {pos}"
        for i in range(len(result.tokens)):
            np.testing.assert_allclose(mk.last_logits[i], want_logits[pos + i], rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("defines, rows, alone, written", [
    ("", 1, False, True), ("", 5, False, True), ("MK_MV_I8ROWS=0", 5, False, False), ("MK_MV_I8ROWS=0", 5, True, True),
    ("MK_MV_I8ROWS=0,MK_ACT8_ALL_ROWS=1", 5, False, True), ("MK_MV_I8ROWS=0,MK_MV_I8=2", 2, False, True),
    ("MK_MV_I8ROWS=0,MK_ACT8_ALL_ROWS=0", 2, False, False)])
def test_act_h_int8_copy_follows_the_kernels_rule(monkeypatch, defines: str, rows: int, alone: bool,
                                                  written: bool) -> None:
    """The VM's mirror of norm_act.cuh: the int8 copy at one row, at every row count under the knobs that read it
    there, and for the MTP pass's head norm, whose last row OP_DRAFT_HEAD reads alone."""
    from engine.cuda.megakernel.solvers import act_h_int8_written

    monkeypatch.setenv("OPENJET_MK_DEFINES", defines)
    assert act_h_int8_written(rows, alone) is written


@pytest.mark.parametrize("defines, rows, written", [
    ("", 1, True), ("", 2, False), ("MK_ACT8_FILL_ROWS=1", 5, True), ("MK_ACT8_FILL_ROWS=1", 6, False),
    ("MK_MV_I8ROWS=0", 3, False), ("MK_ACT8_FILL_ROWS=1,MK_MV_I8ROWS=0", 4, True), ("MK_ACT8_FILL=0", 1, False)])
def test_fill_acts_int8_copy_follows_the_kernels_rule(monkeypatch, defines: str, rows: int, written: bool) -> None:
    """The mirror of mk_common.cuh act8_fill_at (act_ffn's and act_mix's int8 copy, which the diff checks): one
    row by default, 2 to 5 rows where MK_ACT8_FILL_ROWS asks, none without MK_ACT8_FILL."""
    from engine.cuda.megakernel.solvers import act8_fill_written

    monkeypatch.setenv("OPENJET_MK_DEFINES", defines)
    assert act8_fill_written(rows) is written
