"""A megakernel launch failure at run time moves the sequence to the per-op path, which goes on exactly where the
megakernel stopped. On the CPU the megakernel runs on its Python VM, a launch fails the way the GPU runner reports
one (MegakernelError), and the numpy reference stands where the per-op CUDA backend would (the GPU check runs the
real pair)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backend import TokenSequence
from engine.cuda import select
from engine.cuda.fallback import FallbackBackend
from engine.cuda.megakernel.backend import MegakernelBackend
from engine.cuda.megakernel.errors import MegakernelError
from engine.cuda.megakernel.schedule import ScheduleConfig
from engine.errors import ContextOverflowError
from engine.reference.backend import ReferenceBackend
from engine.sampling import SamplingParams

PROMPT = [11, 201, 35, 90, 400, 17]
CONTEXT = 128
GREEDY = SamplingParams(temperature=0.0, seed=0)
VM_CONFIG = ScheduleConfig(num_sms=2, tiles_per_sm=1, attn_splits=2)


class FaultyExecutor:
    """The VM, whose launch number `fail_at` (counted from the switch-on) fails as a GPU launch does."""

    def __init__(self, vm):
        self.vm, self.fail_at, self.runs = vm, None, 0

    def run(self, program) -> None:
        self.runs += 1
        if self.fail_at is not None and self.runs == self.fail_at:
            raise MegakernelError("megakernel launch failed: CUDA_ERROR_LAUNCH_FAILED (injected)")
        self.vm.run(program)

    def __getattr__(self, name):
        return getattr(self.vm, name)


@pytest.fixture(scope="module")
def model_path(tiny_model_path):
    return tiny_model_path("qwen35", tokenizer=False, vocab_size=512)


@pytest.fixture(scope="module")
def reference_tokens(model_path) -> list[int]:
    """24 greedy tokens of the reference after PROMPT."""
    ref = ReferenceBackend.from_gguf(model_path, context_size=CONTEXT)
    seq = TokenSequence.start(PROMPT, GREEDY)
    ref.prefill(PROMPT[:-1])
    while len(seq.generated) < 24:
        ref.cycle(seq, 0, GREEDY)
    return seq.generated


def wrapped(model_path, switches: list) -> tuple[FallbackBackend, FaultyExecutor]:
    mk = MegakernelBackend.on_vm(model_path, context_size=CONTEXT, config=VM_CONFIG)
    faulty = FaultyExecutor(mk.ex)
    mk.ex = faulty
    backend = FallbackBackend(mk, "cuda: megakernel", lambda: ReferenceBackend.from_gguf(model_path,
                                                                                       context_size=CONTEXT),
                              "reference", on_switch=lambda name, reason: switches.append((name, reason)))
    return backend, faulty


@pytest.mark.parametrize("n_draft", [0, 2])
def test_a_failed_cycle_continues_on_the_fallback_with_the_same_tokens(model_path, reference_tokens,
                                                                       n_draft) -> None:
    switches: list = []
    backend, faulty = wrapped(model_path, switches)
    seq = TokenSequence.start(PROMPT, GREEDY)
    backend.prefill(PROMPT[:-1])
    faulty.fail_at = faulty.runs + 3  # the third cycle's launch fails
    while len(seq.generated) < 24:
        backend.cycle(seq, n_draft, GREEDY)
        assert backend.num_tokens == len(seq.tokens) - 1
    assert seq.generated[:24] == reference_tokens
    assert backend.name == "reference" and isinstance(backend.inner, ReferenceBackend)
    assert len(switches) == 1 and switches[0][0] == "reference"
    assert "megakernel failed at run time" in switches[0][1] and "CUDA_ERROR_LAUNCH_FAILED" in switches[0][1]
    assert backend.reason == switches[0][1]


def test_a_failed_accept_is_verified_again_on_the_fallback(model_path, reference_tokens) -> None:
    backend, faulty = wrapped(model_path, [])
    backend.prefill(PROMPT[:-1])
    backend.verify([PROMPT[-1], reference_tokens[0], 7])
    faulty.fail_at = faulty.runs + 1  # the accept's launch
    backend.accept(2)
    assert backend.name == "reference" and backend.num_tokens == len(PROMPT) + 1
    row = backend.verify([reference_tokens[1]])[0]
    assert int(np.argmax(row)) == reference_tokens[2]


def test_a_checkpoint_of_the_megakernel_is_rebuilt_on_the_fallback(model_path, reference_tokens) -> None:
    backend, faulty = wrapped(model_path, [])
    seq = TokenSequence.start(PROMPT, GREEDY)
    backend.prefill(PROMPT[:-1])
    for _ in range(3):
        backend.cycle(seq, 0, GREEDY)
    saved, saved_len = backend.checkpoint(), len(seq.tokens)
    faulty.fail_at = faulty.runs + 1
    for _ in range(3):
        backend.cycle(seq, 0, GREEDY)
    assert backend.name == "reference"
    backend.rollback(saved)
    assert backend.num_tokens == saved_len - 1
    del seq.tokens[saved_len:]
    while len(seq.generated) < 12:
        backend.cycle(seq, 0, GREEDY)
    assert seq.generated[:12] == reference_tokens[:12]


def test_other_errors_pass_through_without_switching(model_path) -> None:
    switches: list = []
    backend, _ = wrapped(model_path, switches)
    with pytest.raises(ContextOverflowError):
        backend.prefill(list(range(CONTEXT + 5)))
    assert backend.name == "cuda-megakernel" and switches == []


def test_the_megakernel_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(select.MEGAKERNEL_ENV, raising=False)
    assert not select.megakernel_requested()
    assert "ms a d = 0 cycle" in select.MEGAKERNEL_OFF and select.MEGAKERNEL_ENV in select.MEGAKERNEL_OFF
    monkeypatch.setenv(select.MEGAKERNEL_ENV, "1")
    assert select.megakernel_requested()
