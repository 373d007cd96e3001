"""The numpy reference against Hugging Face transformers' golden outputs on the generated tiny qwen35 and qwen3 models.

The golden outputs were written by bench/compare_transformers.py (transformers' Qwen3_5ForCausalLM / Qwen3ForCausalLM
in float32, the GGUF weights mapped back to a state dict by inverting llama.cpp's converter) into
tests/engine/fixtures/transformers; this test needs no torch. It regenerates each tiny model, proves the bytes are the
ones transformers' weights came from (sha256), runs the reference over the same tokens and asserts the issue's targets
and a float32-tight log-prob check. Where the llama.cpp fixtures check our math against an implementation that shares
our GGUF conventions, these check the conventions too (value-head order, norm offsets, A_log, q/gate packing) against
the original model definition.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `from bench... import ...` whatever the working directory
    sys.path.insert(0, str(ROOT))

from bench.hf_mapping import hf_weights, tiled_to_grouped  # noqa: E402
from bench.llamacpp_metrics import Agreement, TopK, compare  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "transformers"
REFRESH = "re-run `python bench/compare_transformers.py` (needs torch and transformers) to refresh the golden outputs"
ARCHS = ("qwen35", "qwen3")
GOLDEN = "transformers"
MIN_POSITIONS, MIN_TOP1, MAX_KL = 256, 0.98, 0.01  # the targets
MAX_LOGPROB_DIFF = 1e-3  # float32 against float32 in another summation order: measured < 1e-4


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


def _agreement(golden_cases, logits: dict[str, np.ndarray], arch: str) -> Agreement:
    if arch not in logits:
        pytest.fail(f"the regenerated tiny {arch} model is not the file transformers' weights came from; {REFRESH}")
    return compare(TopK.from_arrays(golden_cases[arch][1], GOLDEN), logits[arch])


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_regenerates_the_file_transformers_ran(golden_cases, arch):
    """The generator still writes, byte for byte, the file whose weights transformers ran."""
    spec, arrays, path = golden_cases[arch]
    assert path.stat().st_size == spec["size"], f"regenerated {arch} model has another size; {REFRESH}"
    assert _sha256(path) == spec["sha256"], f"regenerated {arch} model has other bytes; {REFRESH}"
    assert arrays["token_ids"].size >= MIN_POSITIONS and spec["num_positions"] == arrays["token_ids"].size
    assert arrays[f"{GOLDEN}_ids"].shape == (arrays["token_ids"].size, spec["topk"])


@pytest.mark.parametrize("arch", ARCHS)
def test_reference_meets_the_targets(golden_cases, ours, arch):
    """Against transformers in float32: top-1 >= 98 %, KL < 0.01 (upper bound), log-probs equal to rounding."""
    agreement = _agreement(golden_cases, ours, arch)
    assert agreement.num_positions >= MIN_POSITIONS
    assert agreement.top1 >= MIN_TOP1, f"{arch}: top-1 mismatches at {agreement.mismatches}"
    assert agreement.kl_high_mean < MAX_KL, agreement.as_dict()
    assert agreement.max_logprob_diff < MAX_LOGPROB_DIFF, agreement.as_dict()


def test_golden_outputs_catch_value_heads_in_the_wrong_order(golden_cases):
    """The check has teeth where llama.cpp's cannot: DeltaNet value heads read in transformers' grouped order by a
    reference that expects GGUF's tiled order (a converter convention both llama.cpp and we could share wrongly)."""
    from engine.reference.backend import ReferenceBackend

    spec, arrays, path = golden_cases["qwen35"]
    backend = ReferenceBackend.from_gguf(path)
    cfg = backend.model.cfg
    num_k, num_v, dv, key_channels = cfg.ssm_num_k_heads, cfg.ssm_num_v_heads, cfg.ssm_v_head_dim, 2 * cfg.ssm_key_dim
    for kind, w in zip(cfg.layer_kinds, backend.model.weights.layers, strict=True):
        if kind != "deltanet":
            continue
        for key, axis, head_dim, start in (("attn_qkv", 0, dv, key_channels), ("ssm_conv1d", 0, dv, key_channels),
                                           ("attn_gate", 0, dv, 0), ("ssm_beta", 0, 1, 0), ("ssm_alpha", 0, 1, 0),
                                           ("ssm_a", 0, 1, 0), ("ssm_dt.bias", 0, 1, 0), ("ssm_out", 1, dv, 0)):
            value = w[key].copy()
            part = (slice(None),) * axis + (slice(start, None),)
            value[part] = tiled_to_grouped(value[part], axis, num_k, num_v, head_dim)
            w[key] = value
    wrong = compare(TopK.from_arrays(arrays, GOLDEN), backend.verify(arrays["token_ids"].tolist()))
    assert wrong.kl_low_mean > MAX_KL  # a guaranteed lower bound: the true KL is at least this
    assert wrong.top1 < MIN_TOP1


@pytest.mark.parametrize("arch", ARCHS)
def test_mapping_still_gives_the_state_dict_transformers_loaded(golden_cases, arch):
    """bench/hf_mapping.py on the regenerated file: the config, parameter names and shapes transformers accepted
    with strict=True, and only the MTP block left out."""
    from engine.gguf.reader import GGUFFile

    spec, _, path = golden_cases[arch]
    weights = hf_weights(GGUFFile.open(path))
    assert (weights.config_class, weights.model_class) == (spec["hf_config_class"], spec["hf_model_class"])
    assert json.loads(json.dumps(weights.config)) == spec["hf_config"]
    assert {name: list(value.shape) for name, value in weights.state_dict.items()} == spec["hf_parameters"]
    assert weights.skipped == spec["not_compared"]
    assert all(name.startswith(f"blk.{weights.config['num_hidden_layers']}.") for name in weights.skipped)


def test_tiled_to_grouped_inverts_the_converter_value_head_order():
    """GGUF value head p reads key head p % Hk; after the mapping, transformers' head j must read key head j // r."""
    num_k, num_v, head_dim = 3, 6, 2
    r = num_v // num_k
    # label every GGUF value head's rows with the key head it reads, and its own position
    gguf_rows = np.array([[p % num_k, p] for p in range(num_v) for _ in range(head_dim)])  # [Hv * D, 2]
    hf_rows = tiled_to_grouped(gguf_rows, 0, num_k, num_v, head_dim)
    for j in range(num_v):
        rows = hf_rows[j * head_dim:(j + 1) * head_dim]
        assert (rows[:, 0] == j // r).all()  # transformers' repeat_interleave grouping
        assert (rows[:, 1] == (j % r) * num_k + j // r).all()  # the converter put HF head g * r + i at i * Hk + g
    # along another axis (out_proj columns) it is the same permutation
    cols = tiled_to_grouped(gguf_rows.T.copy(), 1, num_k, num_v, head_dim)
    assert np.array_equal(cols, hf_rows.T)
