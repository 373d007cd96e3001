"""The numpy reference against llama.cpp's golden outputs on the generated tiny qwen35 and qwen3 models.

The golden outputs were written by bench/compare_llamacpp.py (llama.cpp b11434, CPU) into tests/engine/fixtures/
llamacpp; this test needs no llama.cpp. It regenerates each tiny model, proves the bytes are the ones llama.cpp read
(sha256), runs the reference over the same tokens and compares, in two modes:
  exact  llama.cpp on the same weight values stored as F32, with an F32 KV cache: it then computes in float32, as the
         reference does, so agreement must be to rounding (the issue's targets, and a far tighter log-prob check);
  quant  llama.cpp on the Q4_K_M-like file itself: its 8-bit activation rounding moves logits by a few percent on
         random weights and flips near-tied argmaxes, so the reference must do as well as it did when measured.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `from bench.llamacpp_metrics import ...` whatever the working directory
    sys.path.insert(0, str(ROOT))

from bench.llamacpp_metrics import Agreement, TopK, compare, full_kl  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "llamacpp"
REFRESH = "re-run `python bench/compare_llamacpp.py --parts tiny` to refresh the golden outputs"
ARCHS = ("qwen35", "qwen3")
MIN_TOP1, MAX_KL = 0.98, 0.01  # the targets
EXACT_MAX_LOGPROB_DIFF = 1e-3  # float32 vs float32 in another summation order: measured < 1e-4
# Quant mode, against the figures measured when the fixtures were written. Our float32 logits move by ~1e-5 between
# BLAS builds, which can flip at most a razor-thin tie: allow 1 % of positions (3 of 315) and a little KL.
QUANT_TOP1_SLACK, QUANT_KL_SLACK = 0.01, 0.002


def _manifest() -> dict:
    return json.loads((FIXTURES / "manifest.json").read_text())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def golden_cases(tiny_model_path) -> dict:
    """arch -> (manifest entry, fixture arrays, regenerated model path)."""
    cases = {}
    for arch in ARCHS:
        spec = _manifest()["tiny"][arch]
        path = tiny_model_path(arch, **spec["options"])
        with np.load(FIXTURES / spec["file"]) as npz:
            cases[arch] = (spec, dict(npz), path)
    return cases


@pytest.fixture(scope="module")
def ours(golden_cases) -> dict[str, np.ndarray]:
    """arch -> the reference's logits [T, V] at every golden position (one verify pass)."""
    from engine.reference.backend import ReferenceBackend

    out = {}
    for arch, (spec, arrays, path) in golden_cases.items():
        if _sha256(path) == spec["sha256"]:
            out[arch] = ReferenceBackend.from_gguf(path).verify(arrays["token_ids"].tolist())
    return out


def _agreement(golden_cases, ours, arch: str, mode: str) -> Agreement:
    spec, arrays, _ = golden_cases[arch]
    if arch not in ours:
        pytest.fail(f"the regenerated tiny {arch} model is not the file llama.cpp read; {REFRESH}")
    return compare(TopK.from_arrays(arrays, mode), ours[arch])


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_regenerates_the_file_llamacpp_read(golden_cases, arch):
    """The generator still writes, byte for byte, the file llama.cpp was run on."""
    spec, arrays, path = golden_cases[arch]
    assert path.stat().st_size == spec["size"], f"regenerated {arch} model has another size; {REFRESH}"
    assert _sha256(path) == spec["sha256"], f"regenerated {arch} model has other bytes; {REFRESH}"
    assert arrays["token_ids"].size >= 256 and spec["num_positions"] == arrays["token_ids"].size


@pytest.mark.parametrize("arch", ARCHS)
def test_exact_mode_meets_the_targets(golden_cases, ours, arch):
    """Against llama.cpp in float32: top-1 >= 98 %, KL < 0.01 (upper bound), log-probs equal to rounding."""
    agreement = _agreement(golden_cases, ours, arch, "exact")
    assert agreement.num_positions >= 256
    assert agreement.top1 >= MIN_TOP1, f"{arch}: top-1 mismatches at {agreement.mismatches}"
    assert agreement.kl_high_mean < MAX_KL, agreement.as_dict()
    assert agreement.max_logprob_diff < EXACT_MAX_LOGPROB_DIFF, agreement.as_dict()


@pytest.mark.parametrize("arch", ARCHS)
def test_quant_mode_does_as_well_as_measured(golden_cases, ours, arch):
    """Against llama.cpp's quantized-activation path on the file as it is: no worse than measured."""
    measured = golden_cases[arch][0]["measured"]["quant"]
    agreement = _agreement(golden_cases, ours, arch, "quant")
    assert agreement.top1 >= measured["top1"] - QUANT_TOP1_SLACK, (agreement.mismatches, measured["mismatches"])
    assert agreement.kl_high_mean <= measured["kl_high_mean"] + QUANT_KL_SLACK, agreement.as_dict()


def test_exact_mode_catches_a_wrong_rope_layout(golden_cases):
    """The comparison has teeth: the same qwen3 model with adjacent-pair RoPE (llama's) instead of NEOX halves."""
    from engine.reference.backend import ReferenceBackend

    spec, arrays, path = golden_cases["qwen3"]
    backend = ReferenceBackend.from_gguf(path)
    backend.model.cfg.rope_neox = not backend.model.cfg.rope_neox
    wrong = compare(TopK.from_arrays(arrays, "exact"), backend.verify(arrays["token_ids"].tolist()))
    assert wrong.max_logprob_diff > 100 * EXACT_MAX_LOGPROB_DIFF
    assert wrong.kl_low_mean > MAX_KL  # a guaranteed lower bound: the true KL is at least this


def test_kl_bounds_enclose_the_true_kl():
    """low <= exact KL <= high on distributions with a real tail, and top-1 counts the right positions."""
    rng = np.random.default_rng(7)
    golden = rng.normal(0.0, 3.0, size=(40, 5000)).astype(np.float32)  # [T, V]
    ours = (golden + rng.normal(0.0, 0.3, size=golden.shape)).astype(np.float32)
    ours[5] = golden[5]
    ours[5, golden[5].argmax()] -= 50.0  # position 5 must disagree on top-1
    compact = TopK.from_logits(golden, 16)
    agreement = compare(compact, ours)
    kl = full_kl(golden, ours)
    assert compact.tail_mass.min() > 0.01  # the tail matters here
    assert agreement.kl_low_mean <= kl.mean() <= agreement.kl_high_mean
    assert 5 in agreement.mismatches
    assert np.array_equal(compact.ids[:, 0], golden.argmax(axis=-1))
    np.testing.assert_allclose(np.exp(compact.logprobs.astype(np.float64)).sum(-1) + compact.tail_mass, 1.0,
                               rtol=1e-6)
