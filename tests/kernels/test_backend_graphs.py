"""CudaBackend's captured graphs, on a recording device: which calls run eagerly, which are captured, which are
replayed. A verify pass, the commit of its accepted prefix and an MTP draft each run their kernels from a graph
after the first call of their shape, and a DeltaNet model's commit waits for the next call that needs the state,
running beside the MTP draft when that comes first (the kernels themselves are checked on the GPU:
tests/kernels/test_cuda_gpu.py, bench/gpu_models.py's speculative decoding against the reference)."""

from __future__ import annotations

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

    def drop_mtp(self) -> None:
        self.weights.mtp = None
        self.dev.run(("drop_mtp",))


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


def test_a_prefill_runs_in_chunks_of_prefill_chunk_each_full_one_from_its_graph() -> None:
    backend = _backend()  # a workspace of 32 tokens
    log = backend.dev.log
    for _ in range(2):
        backend.reset()
        backend.prefill(list(range(45)))  # 32, then a tail of 13: a shape seen once, never captured
    forwards = [entry for entry in log if entry[1][0] == "forward"]
    assert forwards == [("eager", ("forward", 32, True)), ("eager", ("forward", 13, True)),
                        ("replay", ("forward", 32, True)), ("eager", ("forward", 13, True))]
    assert backend.num_tokens == 45
    backend.reset()
    log.clear()
    backend.prefill_chunk = 16  # smaller chunks in the same workspace: a graph of their own
    backend.prefill(list(range(44)))
    forwards = [entry for entry in log if entry[1][0] == "forward"]
    assert forwards == [("eager", ("forward", 16, True)), ("replay", ("forward", 16, True)),
                        ("eager", ("forward", 12, True))]
    assert (16, True, 0) in backend._graphs and not any(key[0] == 12 for key in backend._graphs)


@pytest.mark.parametrize("chunk", [0, 5, 33])
def test_a_prefill_chunk_past_the_workspace_or_within_a_verify_is_refused(chunk) -> None:
    backend = _backend()
    with pytest.raises(ValueError, match=f"prefill chunk {chunk} must be in 9..32"):
        backend.prefill_chunk = chunk
    assert backend.prefill_chunk == 32


def test_dropping_the_draft_head_drops_the_captured_passes_and_drafting() -> None:
    """CudaBackend.drop_draft_head: the model stops feeding the head, the graphs captured with its catch-up go (the
    next pass of a length runs eager and is captured again), and draft() is refused; a second drop does nothing."""
    backend = _backend()
    log = backend.dev.log
    for _ in range(2):
        _cycle(backend, [1, 2, 3], 2)
    assert backend.can_draft and ("replay", ("forward", 3, False)) in log
    log.clear()
    backend.drop_draft_head()
    assert log == [("eager", ("drop_mtp",))] and not backend.can_draft and backend._graphs == {}
    log.clear()
    _cycle(backend, [4, 5, 6], 2)
    assert log == [("eager", ("forward", 3, False)), ("eager", ("accept", 2))]
    with pytest.raises(ValueError):
        backend.draft(6, 2)
    log.clear()
    backend.drop_draft_head()
    assert log == []
