"""Every variant of the 27B bench (bench/gpu_bench27b.py VARIANTS) launches what its kernels declare, checked
without a GPU: a device call spends its time on the variants it names, so one whose launcher and kernel disagree
must fail here, not there. Each variant switches the engine's kernels (_use_variant) on a Qwen3.8-27B-shaped
model on a ShadowDevice (tests/kernels/shadow_device.py) as an H200 and as an H100, runs verify passes of 1-8
tokens and a prefill, and every launch is held against its kernel (tests/kernels/kernel_signatures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import gpu_bench27b
from engine.cuda import device, i8b, mixers, ops, q6b
from engine.cuda.backend import CudaBackend
from tests.kernels.kernel_signatures import problems_of
from tests.kernels.shadow_device import H100, H200, ShadowDevice, patch_driver_calls

SWITCHED = (device, i8b, mixers, ops, q6b)  # the modules whose switches _use_variant sets


@pytest.fixture
def switches(monkeypatch: pytest.MonkeyPatch):
    """The switches as they were before the test ((module, its namespace) pairs), restored after it."""
    patch_driver_calls(monkeypatch)
    saved = [(module, dict(vars(module))) for module in SWITCHED]
    yield saved
    for module, before in saved:
        for name, value in before.items():
            if vars(module).get(name) is not value:
                setattr(module, name, value)


@pytest.mark.parametrize("info", [H200, H100], ids=["H200", "H100"])
def test_every_variant_launches_what_its_kernels_declare(thin_27b: Path, switches, info) -> None:
    dev = ShadowDevice(info)
    backend = CudaBackend.from_gguf(thin_27b, device=dev, context_size=4096)
    problems: set[str] = set()
    kernels: dict[str, set[str]] = {}
    for name in gpu_bench27b.VARIANTS:
        dev.launches.clear()
        gpu_bench27b._use_variant(backend, name)
        for num in range(1, 9):
            backend.verify(list(range(1, num + 1)))
            backend.accept(1)
        backend.prefill(list(range(1, 600)))
        backend.reset()
        kernels[name] = {launch.kernel for launch in dev.launches}
        problems |= {f"{name} {problem}" for problem in problems_of(dev.launches)}
    assert not problems, "\n".join(sorted(problems))
    # every switch a variant sets is one the engine has (a name it no longer has would be set and never read)
    for module, before in switches:
        assert set(vars(module)) == set(before), f"{module.__name__}: {sorted(set(vars(module)) - set(before))}"
    # the variants do switch kernels: a few that must launch what v7 does not (the H100's v7 runs the one-token
    # Q6_K ffn_down on q6b's tensor copies, the H200's on mmvq_q6_i8)
    if info is H200:
        assert "mmvq_q6_K_i8_t1_halves" in kernels["halves"] - kernels["v7"]
    else:
        assert "mmvq_q6_K_i8b_s2n2_halves" in kernels["v7"] - kernels["noq6b"]
    assert "mmvq_q6_K_i8v_t5_halves" in kernels["q6v5"] - kernels["v7"]
    assert "mmvq_q4_K_i8b_s2n2" in kernels["s2n2"] - kernels["v7"]
    # the deeper rings: ffn_down's Q4_K 8-warp blocks in their own shape, the Q6_K tensor-copy form in (3, 2)
    assert {"mmvq_q4_K_i8b_s5n2"} <= kernels["i8bdown8s5"] - kernels["v7"]
    assert {"mmvq_q4_K_i8b_s2n3"} <= kernels["i8bdown8s2n3"] - kernels["v7"]
    assert "mmvq_q6_K_i8b_s3n2_halves" in kernels["q6bs3"] - kernels["v7"]
    # attention's splits merged by the output projection's producer
    assert "attn_combine" in kernels["combapart"] - kernels["v7"]
    assert "act_combine_t1" in kernels["v7"] - kernels["combapart"]
    # decode attention forming its own queries and keys: no qk_prep in a verify pass (prefill's attn_mma keeps it)
    assert {k for k in kernels["qkfused"] - kernels["v7"] if k.endswith("_prep")}
    assert "qk_prep" in kernels["qkfused"]  # (the prefill of the test)
