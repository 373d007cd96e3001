"""Every launch the CUDA engine makes, held against the kernel it names, without a GPU.

The engine runs whole on a ShadowDevice (tests/kernels/shadow_device.py): tiny models of every architecture and a
Qwen3.8-27B-shaped qwen35 cut to four layers and a small vocabulary (so the 27B's widths take their own kernels:
ffn_down's 68 superblocks, head dimension 256, the delta rule's 128-wide heads), through prefill (the GEMMs and the
chunked delta rule included), verify passes of 1-8 tokens with their accepts, MTP drafts, the device's token choice
(greedy, sampled, top_k / top_p, penalties), checkpoints, fast mode and the draft head dropped. For each launch:
its arguments against the kernel's declared parameters (count and kind: a pointer where the kernel reads a pointer,
an int32 where it reads an int, a struct of the mirror's type), its block within the kernel's launch bound, its
dynamic shared memory allowed (cuFuncSetAttribute before a launch past 48 KB, never past the GPU's opt-in limit),
and its Buffers inside live allocations; and nothing a graph capture refuses (an allocation, a synchronising copy)
inside one. On the GPU any of these would read garbage or fail to launch or capture; on the CPU nothing else sees
them (the kernels' arithmetic is checked on the GPU: bench/gpu_check.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine.backend import Draft, TokenSequence
from engine.cuda.backend import CudaBackend
from engine.cuda.device import DeviceInfo
from engine.sampling import SamplingParams
from tests.kernels.kernel_signatures import launch_problems, problems_of
from tests.kernels.shadow_device import A100, H100, H200, RTX_4090, CaptureError, ShadowDevice, patch_driver_calls

SAMPLING = [SamplingParams(temperature=0), SamplingParams(temperature=1.0),
            SamplingParams(temperature=0.6, top_k=20, top_p=0.95),
            SamplingParams(temperature=0.7, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.2,
                           repetition_penalty=1.1)]


@pytest.fixture(autouse=True)
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_driver_calls(monkeypatch)


def _exercise(backend: CudaBackend, prompt: int) -> None:
    """Everything a server asks of a backend, once each way."""
    vocab = backend.vocab_size
    tokens = [int(t) % vocab for t in np.arange(1, prompt + 1) * 7919]
    backend.prefill(tokens[:-1])
    cp = backend.checkpoint()
    seq = TokenSequence.start(tokens, SamplingParams(temperature=0))
    for num in range(1, 9):  # verify passes of 1-8 tokens, logits to the host, part accepted
        backend.verify([seq.pending, *range(1, num)])
        backend.accept(max(1, num // 2))
        seq.tokens.extend(range(1, max(1, num // 2) + 1))
    if backend.can_draft:
        for depth in (1, 4):
            backend.draft(seq.pending, depth)
    for params in SAMPLING:  # the device's choice of each verify row, drafts given
        for depth in (0, 4):
            backend.cycle(seq, depth, params, draft=Draft(list(range(2, 2 + depth))))
    backend.rollback(cp)
    backend.set_precise(False)
    backend.verify([1])
    backend.accept(1)
    backend.verify([1, 2, 3, 4, 5])
    backend.accept(5)
    backend.drop_draft_head()
    backend.verify([1, 2])
    backend.accept(2)


def _check_launches(dev: ShadowDevice) -> Counter:
    problems = problems_of(dev.launches)
    assert not problems, "\n".join(sorted(problems))
    assert any(launch.captured for launch in dev.launches), "no pass was captured into a graph"
    return Counter(launch.kernel for launch in dev.launches)


def _run(path: Path, prompt: int, info: DeviceInfo = H200, **options) -> Counter:
    dev = ShadowDevice(info)
    backend = CudaBackend.from_gguf(path, device=dev, **options)
    try:
        _exercise(backend, prompt)
    finally:
        backend.close()
    return _check_launches(dev)


@pytest.mark.parametrize("arch", ["qwen35", "qwen3", "qwen2", "llama"])
def test_every_launch_of_a_tiny_model_matches_its_kernel(arch: str, tiny_model_path) -> None:
    kernels = _run(tiny_model_path(arch, tokenizer=False, vocab_size=512), prompt=40, context_size=512)
    assert any(k.startswith("mmvq") for k in kernels) and any(k.startswith("choose") for k in kernels)


@pytest.mark.parametrize(("info", "families"), [
    (H200, ("mmvq_q4_K_i8b", "mmvq_q4_K_i8v", "gemm_wg_q4_K_ws", "gdn_chunk", "attn", "mmvq_q6_K_i8_t1")),
    (H100, ("mmvq_q6_K_i8b",)),  # the one-token Q6_K ffn_down on tensor copies (off on the H200)
    (A100, ("mmvq_q4_K_i8_t1", "gemm_q4_K_cp")),
    (RTX_4090, ("mmvq_q4_K_i8_t1",))], ids=lambda v: v.name if isinstance(v, DeviceInfo) else "")
def test_every_launch_of_the_27b_shape_matches_its_kernel(thin_27b: Path, info: DeviceInfo, families) -> None:
    """A prompt of 2,100 tokens takes the prefill GEMMs (gemm_ws from 2,048 on sm_90) and the chunked delta rule."""
    kernels = _run(thin_27b, prompt=2100, info=info, context_size=4096)
    for family in families:
        assert any(k.startswith(family) for k in kernels), (family, sorted(kernels))
    assert kernels.total() > 1000


def test_a_launcher_that_drops_an_argument_is_caught() -> None:
    """The check itself: a launch of mmvq_q6_K_i8_t1 without its last pointer, one with an int where a pointer
    goes, and one past its launch bound each say so."""
    dev = ShadowDevice()
    y = dev.alloc(64, "y")
    args = [y, y, y, y, None, None, 16, 256, 16, y]
    kernel = dev.kernel("mmvq_q6_K_i8_t1")
    dev.launch(kernel, 1, 128, args)
    dev.launch(kernel, 1, 128, args[:-1])
    dev.launch(kernel, 1, 128, args[:4] + [0] + args[5:])
    dev.launch(kernel, 1, 512, args)
    dev.memory.free(y)
    dev.launch(kernel, 1, 128, args)
    found = [launch_problems(launch) for launch in dev.launches]
    assert found[0] == []
    assert found[1] == ["9 arguments for 10 parameters (w, q8, scale8, y, bias, residual, rows, K, ldy, y2)"]
    assert found[2] == ["argument 4 (bias): i32 where the kernel reads ptr"]
    assert found[3] == ["512 threads a block, past the launch bound 256"]
    assert found[4] == ["a Buffer outside every live allocation"]


def test_what_a_capture_refuses_raises() -> None:
    """The engine's passes ran captured above without any of these (each would fail cuStreamEndCapture)."""
    dev = ShadowDevice()
    buf = dev.alloc(64, "b")
    for call in (lambda: dev.alloc(8, "x"), lambda: dev.upload(buf, np.zeros(2)), dev.synchronize,
                 lambda: dev.download(buf, np.float32, (2,)), lambda: dev.memory.free(buf)):
        with dev.capture(), pytest.raises(CaptureError, match="inside a graph capture"):
            call()
    assert sum(launch.captured for launch in dev.launches) == 0


@pytest.mark.parametrize("arch", ["qwen35", "qwen3"])
def test_attention_merged_by_the_output_projections_producer(arch: str, tiny_model_path, thin_27b: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """mixers.COMBINE_ACT: every decode and verify attention's splits merged by act_combine_t1 (several heads a
    superblock at the tiny models' 64-wide heads, one at the 27B's 256), none by attn_combine, and one launch less
    a layer than with attn_combine and act_plain_t1."""
    from engine.cuda import mixers

    path = tiny_model_path(arch, tokenizer=False, vocab_size=512)
    monkeypatch.setattr(mixers, "COMBINE_ACT", False)
    before = _run(path, prompt=40, context_size=512)
    monkeypatch.setattr(mixers, "COMBINE_ACT", True)
    after = _run(path, prompt=40, context_size=512)
    assert after["act_combine_t1"] == before["attn_combine"] > 0 and after["attn_combine"] == 0
    assert after["act_plain_t1"] == before["act_plain_t1"] - before["attn_combine"]
    assert after.total() == before.total() - before["attn_combine"]
    if arch == "qwen35":
        kernels = _run(thin_27b, prompt=600, context_size=4096)
        assert kernels["act_combine_t1"] > 0 and kernels["attn_combine"] == 0


@pytest.mark.parametrize("arch", ["qwen35", "qwen3"])
def test_attention_forming_its_own_queries_and_keys(arch: str, tiny_model_path, thin_27b: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """mixers.ATTN_PREP: every decode and verify attention launches its _prep instance (qk_prep's work inside it)
    and no qk_prep before it; prefill keeps qk_prep before the tensor-core attention."""
    from engine.cuda import mixers

    path = tiny_model_path(arch, tokenizer=False, vocab_size=512)
    monkeypatch.setattr(mixers, "ATTN_PREP", False)
    before = _run(path, prompt=40, context_size=512)
    monkeypatch.setattr(mixers, "ATTN_PREP", True)
    after = _run(path, prompt=40, context_size=512)
    prep = sum(n for k, n in after.items() if k.startswith("attn_d") and k.endswith("_prep"))
    decode = sum(n for k, n in before.items() if k.startswith("attn_d"))
    assert prep == decode > 0 and after["qk_prep"] == before["qk_prep"] - decode
    assert after.total() == before.total() - decode
    if arch == "qwen35":
        kernels = _run(thin_27b, prompt=600, context_size=4096)
        assert kernels["attn_d256_q2_pre_prep"] > 0
