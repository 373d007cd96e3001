"""CudaBackend.verify_choose on a recording device (tests/kernels/test_backend_graphs.py's, with choose_rows and the
penalties' kernels answered by their numpy models): the launches after the verify pass and their arguments, what
travels each way, the rows the kernel leaves to the host, and the penalties applied between the pass and the choice
(the kernels themselves are checked on the GPU: bench/gpu_ops.py check_choose_rows, bench/gpu_penalties.py)."""

from __future__ import annotations

import ctypes
import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from engine.cuda import ops
from tests.kernels.test_backend_graphs import _backend


def _choosing_backend(out: np.ndarray | None = None, logits: np.ndarray | None = None):
    """_backend() whose device also takes choose_rows and the penalties' kernels: launches, uploads (`uploaded` by
    buffer, `upload_log` in order) and the (token, kept) rows it returns: `out`, or without it, what the kernel's
    numpy model (choose_rows_model.py) chooses from `logits` [T, 100] and the launch's arguments and uploads. The
    penalties' kernels run their numpy models (penalties_model.py) on `logits` and the uploaded marks in place.
    Downloads of the logits return `logits` (NaN without; `dev.rows`) from the byte offset asked for."""
    from engine.cuda.memory import Buffer
    from tests.kernels import choose_rows_model, penalties_model

    backend = _backend()
    dev, ws = backend.dev, backend.model.ws
    ws.logits = Buffer(1, 4 * 8 * 100, "logits")
    ws.choose_drafts, ws.choose_uniforms, ws.choose_out = (Buffer(2, 32, "d"), Buffer(3, 128, "u"),
                                                           Buffer(4, 64, "out"))
    ws.choose_parts = Buffer(5, 8 * ops.CHOOSE_PARTS_BYTES, "choose.parts")
    dev.launched, dev.uploaded, dev.upload_log, dev.downloaded = [], {}, [], []
    rows = dev.rows = np.full((8, 100), np.nan, np.float32) if logits is None else logits

    def launch(kernel, grid, block, args, smem=0) -> None:
        dev.launched.append((kernel.name, grid, block, args))
        if kernel.name == "penalty_count":
            penalties_model.penalty_count(dev.uploaded[args[0].what], dev.uploaded[args[1].what][: args[2]])
        elif kernel.name == "penalize_rows":
            _, vocab, ld, num_rows, marks, drafts, repetition, frequency, presence = args
            penalties_model.penalize_rows(rows[:num_rows, :vocab], dev.uploaded[marks.what],
                                          dev.uploaded[drafts.what], repetition, frequency.value, presence.value)
        elif kernel.name in ("choose_top", "choose_weigh"):  # the spread form's passes: choose_rows' model spread
            assert args[-1] is ws.choose_parts
        elif out is None:
            temperature, min_p, top_k, top_p, greedy, parts = args[5:11]
            dev.out = choose_rows_model.choose_rows(rows[:grid], dev.uploaded["d"], dev.uploaded["u"], temperature,
                                                    min_p, top_k, top_p.value, bool(greedy), spread=parts is not None)

    def upload(buf, array, offset=0) -> None:
        assert offset == 0
        dev.uploaded[buf.what] = np.array(array)
        dev.upload_log.append((buf.what, np.asarray(array).nbytes))

    def download(buf, dtype, shape, offset=0):
        dev.downloaded.append((buf.what, offset))
        if buf.what == "out":
            return dev.out.copy()
        return rows.reshape(-1)[offset // 4 : offset // 4 + int(np.prod(shape))].reshape(shape).copy()

    dev.out = out
    dev.kernel = lambda name: SimpleNamespace(name=name)
    dev.launch = launch
    dev.upload = upload
    addresses = itertools.count(16)
    dev.alloc = lambda nbytes, what: Buffer(next(addresses), nbytes, what)
    dev.download = download
    return backend


@pytest.mark.parametrize("spread", [False, True], ids=["block", "spread"])
def test_the_rows_choices_come_from_one_launch_after_the_pass(monkeypatch, spread) -> None:
    """One choose_rows launch after the pass; spread (backend.CHOOSE_SPREAD), choose_top and choose_weigh over
    ops.CHOOSE_CHUNKS blocks a row first, on the workspace's parts, which choose_rows then reads."""
    from engine.backend import Draft
    from engine.cuda import backend as backend_module
    from engine.sampling import SamplingParams

    monkeypatch.setattr(backend_module, "CHOOSE_SPREAD", spread)
    backend = _choosing_backend(np.array([[7, 1], [9, 0], [4, 0]], np.int32))
    params = SamplingParams(temperature=0.5, min_p=0.1, top_k=20, top_p=0.9)
    choices = backend.verify_choose([1, 7, 8], Draft([7, 8]), params, np.random.default_rng(3))
    assert (choices.tokens, choices.kept) == ([7, 9], [True, False])  # no row after the first not kept
    assert backend.dev.log == [("eager", ("forward", 3, False))] and backend._pending == 3
    *passes, (name, grid, block, args) = backend.dev.launched
    assert (name, grid, block) == ("choose_rows", 3, 1024)
    parts = backend.model.ws.choose_parts if spread else None
    assert [(n, g, b) for n, g, b, _ in passes] == [(n, (3, ops.CHOOSE_CHUNKS), 256)
                                                    for n in ("choose_top", "choose_weigh")][: 2 * spread]
    assert all(a[0] is backend.model.ws.logits and a[-1] is parts for *_, a in passes) and args[10] is parts
    # T, min_p, top_k, top_p (a float64: the host's running mass meets it unrounded), not greedy; the vocabulary
    assert args[5:8] == [0.5, 0.1, 20] and isinstance(args[8], ctypes.c_double) and args[8].value == 0.9
    assert args[9] == 0 and args[1] == args[2] == 100
    assert backend.dev.uploaded["d"].tolist() == [7, 8, -1]  # the last row has no draft
    assert backend.dev.uploaded["u"].shape == (3, 2) and backend.dev.uploaded["u"].dtype == np.float64
    assert [what for what, _ in backend.dev.downloaded] == ["out"]  # no logits travel


def test_top_k_and_top_p_rows_are_chosen_on_the_device_as_the_host_chooses_them() -> None:
    """Through the whole of verify_choose (uploads, the launch's arguments, the download) on a device that runs the
    kernel's numpy model: each row's choice, up to the first not kept, is the host rule's for the row's uniforms,
    which the backend drew from the sequence's rng as (T, 2)."""
    from engine.backend import Draft
    from engine.sampling import SamplingParams, keep_or_resample, sample
    from tests.engine.test_sampling import _Uniforms

    rng = np.random.default_rng(8)
    logits = np.round(rng.standard_normal((3, 100)) * 2, 1).astype(np.float32)  # ties
    top = [int(i) for i in np.argmax(logits, axis=1)]
    for params in (SamplingParams(temperature=0.6, top_k=20, top_p=0.95), SamplingParams(temperature=0.7, top_p=0.8),
                   SamplingParams(top_k=1), SamplingParams(top_k=50, min_p=0.05), SamplingParams(top_p=1e-9)):
        for seed in range(12):
            backend = _choosing_backend(logits=logits)
            draft = Draft([top[0], seed * 7 % 100])  # the top token, then mostly one outside the set
            choices = backend.verify_choose([1, *draft.tokens], draft, params, np.random.default_rng(seed))
            u = np.random.default_rng(seed).random((3, 2))
            want = [keep_or_resample(logits[i], params, x, _Uniforms(*u[i]))[::-1] for i, x in enumerate(draft.tokens)]
            want.append((sample(logits[2], params, _Uniforms(u[2, 0])), False))
            num = [kept for _, kept in want].index(False) + 1  # up to the first row not kept
            assert list(zip(choices.tokens, choices.kept)) == want[:num], (params, seed)


def test_the_host_keeps_what_the_kernel_cannot_do(monkeypatch) -> None:
    from engine.backend import Draft
    from engine.cuda import backend as cuda_backend
    from engine.cuda import ops
    from engine.sampling import SamplingParams, UnsampleableLogits
    from engine.spec.verify import SampledDraft

    backend = _choosing_backend(np.array([[-1, 0]], np.int32))
    rng = np.random.default_rng(0)
    for params in (SamplingParams(top_k=ops.CHOOSE_CAP + 1), SamplingParams(repetition_penalty=1.1),
                   SamplingParams(presence_penalty=0.5)):  # penalties without the sequence: no history to apply
        assert backend.verify_choose([1], Draft([]), params, rng) is None
    assert backend.verify_choose([1, 2], SampledDraft([2], None, np.ones((1, 100)) / 100), SamplingParams(),
                                 rng) is None
    monkeypatch.setattr(cuda_backend, "CHOOSE", False)  # OPENJET_CUDA_CHOOSE=0: every request the host's way
    assert backend.verify_choose([1], Draft([]), SamplingParams(temperature=0), rng) is None
    assert backend.dev.launched == []
    monkeypatch.setattr(cuda_backend, "CHOOSE", True)
    with pytest.raises(UnsampleableLogits, match="NaN"):  # the kernel's -1: the host names what is wrong
        backend.verify_choose([1], Draft([]), SamplingParams(temperature=0), rng)


def test_the_rows_the_kernel_leaves_to_the_host_are_chosen_there_from_the_same_pass() -> None:
    """A top_p set past the kernel's capacity (a flat row) and an infinite top come back as -2: the host's rule
    chooses those rows from their logits of the same pass, with fresh draws of the rng after the rows' uniforms;
    the other rows keep the device's choice and no second pass runs."""
    from engine.backend import Draft
    from engine.cuda.backend import _choose_on_host
    from engine.sampling import SamplingParams

    logits = np.zeros((3, 100), np.float32)
    logits[0, 5] = 3.0
    logits[1, 9] = np.inf
    backend = _choosing_backend(np.array([[5, 1], [-2, 0], [-2, 0]], np.int32), logits)
    params = SamplingParams(top_p=0.9)
    choices = backend.verify_choose([1, 5, 9], Draft([5, 9]), params, np.random.default_rng(4))
    rng = np.random.default_rng(4)
    rng.random((3, 2))  # the rows' uniforms, uploaded for the kernel
    want = [(5, 1), _choose_on_host(logits[1], params, 9, rng), _choose_on_host(logits[2], params, -1, rng)]
    assert list(zip(choices.tokens, map(int, choices.kept))) == want
    assert want[1] == (9, 1)  # the infinite top takes all the mass: the draft is kept (float64 path)
    assert backend.dev.downloaded == [("out", 0), ("logits", 400), ("logits", 800)]
    assert backend.dev.log == [("eager", ("forward", 3, False))] and backend._pending == 3
    assert backend.num_host_rows == 2
    # after a row that does not keep its draft nothing can be emitted: its flagged successors stay unchosen
    backend = _choosing_backend(np.array([[3, 0], [-2, 0], [-2, 0]], np.int32), logits)
    choices = backend.verify_choose([1, 5, 9], Draft([5, 9]), params, np.random.default_rng(4))
    assert (choices.tokens, choices.kept, backend.num_host_rows) == ([3], [False], 0)
    assert backend.dev.downloaded == [("out", 0)]
    # the kernel's model flags the flat row for real: top_p 0.95 of 5,000 equal logits holds more than CHOOSE_CAP
    from tests.kernels import choose_rows_model

    flat = np.zeros(5000, np.float32)
    assert choose_rows_model.choose_row(flat, 3, np.array([0.5, 0.5]), 1.0, 0.0, 0, 0.95, False) == (-2, 0)


@pytest.mark.parametrize("spread", [False, True], ids=["block", "spread"])
def test_penalties_are_applied_on_the_device_between_the_pass_and_the_choice(monkeypatch, spread) -> None:
    """A penalised request: the choice's inputs uploaded before the pass, the sequence's marks uploaded whole at its
    first pass and its new tokens alone after (penalty_count), the rows penalised in place (penalize_rows) before
    choose_rows reads them, and each row's choice the host rule's on the raw logits with its history (the generated
    tokens, then the drafts before it)."""
    from engine.backend import Draft, TokenSequence
    from engine.cuda import backend as backend_module
    from engine.sampling import SamplingParams
    from tests.engine.test_backend_choices import _host_choice

    monkeypatch.setattr(backend_module, "CHOOSE_SPREAD", spread)
    rng = np.random.default_rng(5)
    raw = (rng.standard_normal((3, 100)) * 2).astype(np.float32)
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.2, frequency_penalty=0.5,
                            presence_penalty=1.5)
    seq = TokenSequence([4, 8, 15, 16, 23, 42], 4)
    backend = _choosing_backend(logits=raw.copy())
    dev = backend.dev
    run = backend._run

    def logged_run(tokens, commit, logits_rows) -> None:  # the pass, in the uploads' order
        dev.upload_log.append(("pass", len(tokens)))
        run(tokens, commit, logits_rows)

    backend._run = logged_run
    for new, draft in (([], Draft([42, 42])), ([7, 42], Draft([int(np.argmax(raw[1])), 3]))):
        seq.tokens.extend(new)
        dev.rows[:] = raw  # the pass writes fresh logits
        dev.launched.clear()
        dev.upload_log.clear()
        choices = backend.verify_choose([seq.pending, *draft.tokens], draft, params, np.random.default_rng(9), seq)
        passes = ["choose_top", "choose_weigh"] if spread else []
        assert [name for name, *_ in dev.launched] == (["penalty_count"] * bool(new) + ["penalize_rows", *passes,
                                                                                       "choose_rows"])
        marks = ("penalties.staging", 4 * len(new)) if new else ("penalties.marks", 4 * 100)
        # the choice's drafts and uniforms before the pass (an upload waits for the stream), the sequence's marks
        # after it (the host's work beside the pass); no logits travel either way
        assert dev.upload_log == [("d", 12), ("u", 48), ("pass", 3), marks]
        _, grid, block, args = dev.launched[-2 - len(passes)]
        assert (grid, block) == (1, 256) and args[0] is backend.model.ws.logits and args[1:4] == [100, 100, 3]
        assert args[4].what == "penalties.marks" and args[5] is backend.model.ws.choose_drafts
        assert args[6] == 1.2 and isinstance(args[7], ctypes.c_double) and (args[7].value, args[8].value) == (0.5, 1.5)
        u, drafts = np.random.default_rng(9).random((3, 2)), [*draft.tokens, -1]
        want = [_host_choice(raw[t], params, drafts[t], u[t], seq.generated + drafts[:t], seq.prompt) for t in range(3)]
        num = next((t + 1 for t, (_, kept) in enumerate(want) if not kept), 3)
        assert list(zip(choices.tokens, choices.kept)) == want[:num]
        assert not np.array_equal(dev.rows[:3], raw)  # penalised in place
    assert backend.penalties.num_rebuilds == 1


def test_a_penalised_row_left_to_the_host_is_not_penalised_twice(monkeypatch) -> None:
    """The host's rule gets the row the device penalised and the request's parameters without the penalties, so
    its choice is the host rule's on the raw row with the row's history, penalised once."""
    from engine.backend import Draft, TokenSequence
    from engine.cuda import backend as cuda_backend
    from engine.sampling import SamplingParams, keep_or_resample

    seen = []

    def spy(row, params, draft_token, rng):
        seen.append(params)
        return choose_on_host(row, params, draft_token, rng)

    choose_on_host = cuda_backend._choose_on_host
    monkeypatch.setattr(cuda_backend, "_choose_on_host", spy)
    raw = np.zeros((2, 100), np.float32)
    raw[:, [5, 6, 9]] = [3.0, 2.9, 2.0]
    params = SamplingParams(temperature=0.5, repetition_penalty=1.5, presence_penalty=1.0)
    seq = TokenSequence([1, 5, 6, 5], 2)  # 5 in the prompt and generated, 6 generated
    backend = _choosing_backend(np.array([[-2, 0], [9, 0]], np.int32), raw.copy())
    for seed in range(20):
        backend.dev.rows[:] = raw
        choices = backend.verify_choose([5, 9], Draft([9]), params, np.random.default_rng(seed), seq)
        rng = np.random.default_rng(seed)
        rng.random((2, 2))  # the rows' uniforms, uploaded for the kernel
        kept, token = keep_or_resample(raw[0], params, 9, rng, seq.generated, seq.prompt)
        assert (choices.tokens[0], choices.kept[0]) == (token, kept)
    assert len(seen) == 20 and all(p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 for p in seen)
    assert all(p.temperature == 0.5 for p in seen) and backend.num_host_rows == 20


def test_a_refused_pass_uploads_and_draws_nothing() -> None:
    """A verify the backend refuses (an id outside the vocabulary, a pass past the context) is refused
    before the choice's inputs go up: nothing uploaded, no uniform drawn from the request's generator."""
    from engine.backend import Draft
    from engine.errors import ContextOverflowError
    from engine.sampling import SamplingParams

    backend = _choosing_backend(np.array([[7, 0]], np.int32))
    params, rng = SamplingParams(temperature=0.8, seed=1), np.random.default_rng(3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        backend.verify_choose([1, 100], Draft([100]), params, rng)
    backend._num_tokens = 64  # the context is full
    with pytest.raises(ContextOverflowError):
        backend.verify_choose([1], Draft([]), params, rng)
    assert backend.dev.upload_log == [] and backend.dev.log == [] and backend.num_tokens == 64
    assert rng.random() == np.random.default_rng(3).random()
