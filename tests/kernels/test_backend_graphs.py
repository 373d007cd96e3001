"""CudaBackend's captured graphs, on a recording device: which calls run eagerly, which are captured, which are
replayed. A verify pass, the commit of its accepted prefix and an MTP draft each run their kernels from a graph
after the first call of their shape, and a DeltaNet model's commit waits for the next call that needs the state,
running beside the MTP draft when that comes first (the kernels themselves are checked on the GPU:
tests/kernels/test_cuda_gpu.py, bench/gpu_models.py's speculative decoding against the reference)."""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend


class _Graph:
    def __init__(self, dev, recorded: list) -> None:
        self.dev, self.recorded, self.destroyed = dev, recorded, False

    def launch(self) -> None:
        self.dev.log.append(("replay", *self.recorded))

    def destroy(self) -> None:
        self.destroyed = True


class _Dev:
    """Launches are logged as ("eager", what) or, inside a capture, recorded into the graph it makes."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.recording: list | None = None
        self.lane: int | None = None  # the side stream launches go to, inside beside()

    def run(self, what: tuple) -> None:
        if self.lane is not None:
            what = ("beside", self.lane, *what)
        if self.recording is not None:
            self.recording.append(what)
        else:
            self.log.append(("eager", what))

    @contextmanager
    def beside(self, lane: int = 0):
        self.lane = lane
        try:
            yield
        finally:
            self.lane = None

    def join(self, lane: int = 0) -> None:
        self.run(("join", lane))

    @contextmanager
    def capture(self):
        self.recording, holder = [], []
        try:
            yield holder
        finally:
            holder.append(_Graph(self, self.recording))
            self.recording = None


class _Model:
    def __init__(self, dev: _Dev, deltanet: bool = False) -> None:
        self.dev, self.capacity = dev, 64
        self.deltanet = {0: object()} if deltanet else {}
        self.cfg = SimpleNamespace(vocab_size=100)
        self.ws = SimpleNamespace(max_tokens=32)
        self.weights = SimpleNamespace(mtp=object())
        self.uploads: list[tuple] = []

    def reset_state(self) -> None:
        self.dev.run(("reset",))

    def set_tokens(self, tokens, start) -> None:
        self.uploads.append(("tokens", tuple(tokens), start))

    def forward(self, num_tokens, commit, logits_rows) -> None:
        self.dev.run(("forward", num_tokens, commit))

    def accept(self, pending, n) -> None:
        self.dev.run(("accept", n))

    def accept_hidden(self, n) -> None:
        self.dev.run(("hidden", n))

    def accept_layers(self, n) -> None:
        self.dev.run(("layers", n))

    def draft_inputs(self, token, num_draft, start) -> None:
        self.uploads.append(("draft", token, num_draft, start))

    def draft_steps(self, num_draft) -> None:
        self.dev.run(("draft", num_draft))

    def draft_result(self, num_draft, with_logits=False):
        return [7] * num_draft, None


def _backend(use_graphs: bool = True, deltanet: bool = False) -> CudaBackend:
    dev = _Dev()
    backend = CudaBackend.__new__(CudaBackend)
    backend.__init__(_Model(dev, deltanet), 64, use_graphs=use_graphs, owns_device=False)
    backend.dev.download = lambda buf, dtype, shape: np.zeros(shape, dtype)
    backend.model.ws.logits = None
    return backend


def _cycle(backend: CudaBackend, tokens: list[int], n: int) -> None:
    backend.verify(tokens)
    backend.accept(n)


def test_a_commit_runs_from_its_graph_after_the_first_of_its_length() -> None:
    backend = _backend()
    log = backend.dev.log
    _cycle(backend, [1, 2, 3], 2)
    # first of each shape: an eager run (this call's results), then a capture that launches nothing
    assert log == [("eager", ("forward", 3, False)), ("eager", ("accept", 2))]
    log.clear()
    _cycle(backend, [4, 5, 6], 2)
    assert log == [("replay", ("forward", 3, False)), ("replay", ("accept", 2))]
    log.clear()
    _cycle(backend, [4, 5, 6], 1)  # another accepted length: a graph of its own
    assert log == [("replay", ("forward", 3, False)), ("eager", ("accept", 1))]
    assert backend.num_tokens == 5 and set(backend._graphs) == {(3, False, 3), ("accept", 2), ("accept", 1)}


def test_a_draft_uploads_its_inputs_every_time_and_replays_its_steps() -> None:
    backend = _backend()
    backend.prefill([1, 2])
    backend.dev.log.clear()
    assert backend.draft(9, 3).tokens == [7, 7, 7]
    assert backend.draft(11, 3).tokens == [7, 7, 7]
    assert backend.dev.log == [("eager", ("draft", 3)), ("replay", ("draft", 3))]
    assert [u for u in backend.model.uploads if u[0] == "draft"] == [("draft", 9, 3, 2), ("draft", 11, 3, 2)]


def test_without_graphs_every_call_is_eager_and_dropping_them_releases_them() -> None:
    backend = _backend(use_graphs=False)
    for _ in range(2):
        _cycle(backend, [1], 1)
    assert all(kind == "eager" for kind, _ in backend.dev.log) and backend._graphs == {}
    backend = _backend()
    _cycle(backend, [1], 1)
    graphs = list(backend._graphs.values())
    backend.drop_graphs()
    assert backend._graphs == {} and all(g.destroyed for g in graphs)


def test_accept_without_a_verify_is_refused_before_anything_runs() -> None:
    backend = _backend()
    with pytest.raises(ValueError, match="without a verify"):
        backend.accept(1)
    assert backend.dev.log == []


def test_a_deltanet_commit_waits_for_the_next_pass_and_runs_first_there() -> None:
    backend = _backend(deltanet=True)
    log = backend.dev.log
    _cycle(backend, [1, 2, 3], 2)
    assert log == [("eager", ("forward", 3, False))] and backend.num_tokens == 2  # counted, not yet run
    log.clear()
    _cycle(backend, [4, 5], 1)
    assert log == [("eager", ("accept", 2)), ("eager", ("forward", 2, False))]
    log.clear()
    backend.prefill([6])  # every pass commits what is left first
    assert log == [("eager", ("accept", 1)), ("eager", ("forward", 1, True))] and backend.num_tokens == 4


def test_a_draft_after_an_accept_runs_the_commit_beside_it_from_one_graph() -> None:
    backend = _backend(deltanet=True)
    log = backend.dev.log
    for token in (9, 11):
        _cycle(backend, [1, 2, 3], 3)
        log.clear()
        assert backend.draft(token, 2).tokens == [7, 7]
    # the starting hidden first, the layers on side stream 1, the draft on the main stream, then the join
    fused = (("hidden", 3), ("beside", 1, "layers", 3), ("draft", 2), ("join", 1))
    assert log == [("replay", *fused)]
    assert ("accept+draft", 3, 2) in backend._graphs and backend._uncommitted is None
    log.clear()
    _cycle(backend, [1, 7, 7], 1)
    assert log == [("replay", ("forward", 3, False))]  # the commit already ran beside the draft


def test_checkpoints_see_the_commit_and_rollbacks_and_resets_drop_it() -> None:
    from engine.cuda.backend import CudaCheckpoint

    backend = _backend(deltanet=True)
    backend._state_buffers = dict  # no buffers to copy on the recording device
    backend.dev.memory = SimpleNamespace(device=SimpleNamespace(closed=True))  # the finalizer frees nothing
    _cycle(backend, [1, 2], 2)
    checkpoint = backend.checkpoint()
    assert backend.dev.log[-1] == ("eager", ("accept", 2)) and checkpoint.num_tokens == 2
    _cycle(backend, [3], 1)
    backend.rollback(CudaCheckpoint(2, id(backend)))  # its copies overwrite what the commit would have written
    assert backend._uncommitted is None and backend.num_tokens == 2
    backend.dev.log.clear()
    _cycle(backend, [3], 1)
    backend.reset()
    assert backend._uncommitted is None and backend.num_tokens == 0
    assert ("eager", ("accept", 1)) not in backend.dev.log


def test_the_commit_runs_at_once_when_switched_off_or_in_two_launches_a_layer(monkeypatch) -> None:
    from engine.cuda import backend as backend_module
    from engine.cuda import mixers

    for module, name in ((backend_module, "ACCEPT_BESIDE"), (mixers, "GDN_ACCEPT_LAYERS")):
        with monkeypatch.context() as m:
            m.setattr(module, name, False)
            backend = _backend(deltanet=True)
            _cycle(backend, [1, 2], 2)
            assert backend.dev.log == [("eager", ("forward", 2, False)), ("eager", ("accept", 2))]


def _choosing_backend(out: np.ndarray | None = None, logits: np.ndarray | None = None):
    """_backend() whose device also takes choose_rows: launches, uploads and the (token, kept) rows it returns: `out`,
    or without it, what the kernel's numpy model (choose_rows_model.py) chooses from `logits` [T, 100] and the
    launch's arguments and uploads. Downloads of the logits return `logits` (NaN without) from the byte offset
    asked for."""
    from engine.cuda.memory import Buffer
    from tests.kernels import choose_rows_model

    backend = _backend()
    dev, ws = backend.dev, backend.model.ws
    ws.logits = Buffer(1, 4 * 8 * 100, "logits")
    ws.choose_drafts, ws.choose_uniforms, ws.choose_out = (Buffer(2, 32, "d"), Buffer(3, 128, "u"),
                                                           Buffer(4, 64, "out"))
    dev.launched, dev.uploaded, dev.downloaded = [], {}, []
    rows = np.full((8, 100), np.nan, np.float32) if logits is None else logits

    def launch(kernel, grid, block, args, smem=0) -> None:
        dev.launched.append((kernel.name, grid, block, args))
        if out is None:
            temperature, min_p, top_k, top_p, greedy = args[5:10]
            dev.out = choose_rows_model.choose_rows(rows[:grid], dev.uploaded["d"], dev.uploaded["u"], temperature,
                                                    min_p, top_k, top_p.value, bool(greedy))

    def download(buf, dtype, shape, offset=0):
        dev.downloaded.append((buf.what, offset))
        if buf.what == "out":
            return dev.out.copy()
        return rows.reshape(-1)[offset // 4 : offset // 4 + int(np.prod(shape))].reshape(shape).copy()

    dev.out = out
    dev.kernel = lambda name: SimpleNamespace(name=name)
    dev.launch = launch
    dev.upload = lambda buf, array, offset=0: dev.uploaded.__setitem__(buf.what, np.array(array))
    dev.download = download
    return backend


def test_the_rows_choices_come_from_one_launch_after_the_pass() -> None:
    from engine.backend import Draft
    from engine.sampling import SamplingParams

    backend = _choosing_backend(np.array([[7, 1], [9, 0], [4, 0]], np.int32))
    params = SamplingParams(temperature=0.5, min_p=0.1, top_k=20, top_p=0.9)
    choices = backend.verify_choose([1, 7, 8], Draft([7, 8]), params, np.random.default_rng(3))
    assert (choices.tokens, choices.kept) == ([7, 9], [True, False])  # no row after the first not kept
    assert backend.dev.log == [("eager", ("forward", 3, False))] and backend._pending == 3
    (name, grid, block, args), = backend.dev.launched
    assert (name, grid, block) == ("choose_rows", 3, 1024)
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
                   SamplingParams(presence_penalty=0.5)):
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
