"""On a machine with an NVIDIA GPU (sm_80+): kernels and whole models against the numpy reference, small sizes.
Skipped cleanly elsewhere; bench/gpu_check.py runs the full-size checks on the GPU machine."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import device

try:
    device.Device().close()
    HAS_GPU = True
except device.CudaError:
    HAS_GPU = False

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU of sm_80 or newer")]


@pytest.fixture(scope="module")
def dev():
    with device.Device() as d:
        d.load_all()
        yield d


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.F16], ids=lambda q: q.name)
@pytest.mark.parametrize("num_tokens", [1, 5, 40])
def test_matmul_matches_numpy(dev, qtype: Q, num_tokens: int) -> None:
    from engine.cuda import ops
    from engine.cuda.repack import random_blocks
    from engine.gguf.quants import dequantize

    rng = np.random.default_rng(int(qtype) * 100 + num_tokens)
    rows, cols = 80, 768
    data = random_blocks(qtype, (rows, cols), rng)
    w = ops.upload_weight(dev, data, qtype, (rows, cols), "w")
    act = ops.alloc_act(dev, num_tokens, cols, "x")
    x = rng.standard_normal((num_tokens, cols), dtype=np.float32)
    dev.upload(act.f32, x)
    ops.act_f16(dev, act.f32, act, num_tokens, cols)
    y = dev.alloc(4 * num_tokens * rows, "y")
    dev.fill_u32(y, 0x7FC00000)  # NaN: unwritten outputs fail
    ops.matmul(dev, w, act, y, num_tokens, rows)
    out = dev.download(y, np.float32, (num_tokens, rows))
    ref = x.astype(np.float64) @ dequantize(data, qtype, (rows, cols)).astype(np.float64).T
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-2


@pytest.mark.parametrize("arch", ["qwen35", "qwen3", "qwen2", "llama"])
def test_backend_follows_the_reference(tiny_model_path, arch: str) -> None:
    from engine.cuda.backend import CudaBackend
    from engine.reference.backend import ReferenceBackend

    path = tiny_model_path(arch)
    ref = ReferenceBackend.from_gguf(path, context_size=256)
    cuda = CudaBackend.from_gguf(path, context_size=256, max_tokens=32)
    try:
        prompt = [11, 2021, 357, 90, 4000, 17]
        for backend in (ref, cuda):
            backend.prefill(prompt[:-1])
        pending = prompt[-1]
        for _ in range(16):
            want, got = ref.verify([pending])[0], cuda.verify([pending])[0]
            ref.accept(1)
            cuda.accept(1)
            p = np.exp(want - want.max())
            p /= p.sum()
            q = np.exp(got - got.max())
            q /= q.sum()
            assert float(np.sum(p * (np.log(p) - np.log(q)))) < 1e-3
            pending = int(np.argmax(want))
    finally:
        cuda.close()


def test_deltanet_verify_passes_follow_the_reference(tiny_model_path) -> None:
    """qwen35's verify passes of 1-5 tokens (the delta rule over several uncommitted tokens, then one accepted):
    every row's logits within KL 1e-3 of the reference's."""
    from bench.gpu_models import kl_rows
    from engine.cuda.backend import CudaBackend
    from engine.reference.backend import ReferenceBackend

    path = tiny_model_path("qwen35")
    ref = ReferenceBackend.from_gguf(path, context_size=256)
    cuda = CudaBackend.from_gguf(path, context_size=256, max_tokens=32, use_graphs=False)
    try:
        prompt = [11, 2021, 357, 90, 4000, 17]
        for backend in (ref, cuda):
            backend.prefill(prompt[:-1])
        pending = [prompt[-1]]
        for count in (1, 3, 5, 2):
            tokens = pending + [(97 * i + 5) % 1000 for i in range(count - 1)]
            want, got = ref.verify(tokens), cuda.verify(tokens)
            assert (kl_rows(want, got) < 1e-3).all(), (count, kl_rows(want, got))
            ref.accept(1)
            cuda.accept(1)
            pending = [int(np.argmax(want[0]))]
    finally:
        cuda.close()


def test_a_backend_on_a_given_device_leaves_it_open(dev, tiny_model_path) -> None:
    """CudaBackend.close releases a device it opened, not one it was given (the megakernel's benchmarks open the
    per-op path and then the megakernel on one device)."""
    from engine.cuda.backend import CudaBackend

    backend = CudaBackend.from_gguf(tiny_model_path("qwen35"), context_size=64, max_tokens=8, device=dev)
    backend.prefill([11, 2021, 357])
    backend.close()
    assert not dev.closed
    buf = dev.to_device(np.arange(4, dtype=np.float32), "after")
    assert dev.download(buf, np.float32, (4,)).tolist() == [0.0, 1.0, 2.0, 3.0]
