"""Weight binding: the tensor table per architecture (checked against the real Qwen3.8-27B layout), the contract's
keys, and load errors that name the file, the tensor, what was expected and what was found."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.errors import ModelFileError, UnsupportedModelError
from engine.gguf.reader import GGUFFile
from engine.gguf.writer import rewrite
from engine.model.config import ModelConfig, qwen38_27b_config
from engine.model.weights import bind_weights, expected_tensors, full_name, load_model

ARCHS = ("qwen35", "qwen3", "qwen2", "llama")


@pytest.fixture(scope="module")
def small_models(tiny_model_path):
    return {arch: tiny_model_path(arch, tokenizer=False) for arch in ARCHS}


def test_qwen38_27b_table_matches_the_released_layout():
    table = expected_tensors(qwen38_27b_config())
    assert len(table) == 3 + 48 * 14 + 16 * 11 + 15  # globals, DeltaNet, attention and MTP layers
    expected = {
        "token_embd.weight": (248320, 5120), "output.weight": (248320, 5120), "output_norm.weight": (5120,),
        "blk.0.attn_qkv.weight": (10240, 5120), "blk.0.attn_gate.weight": (6144, 5120),
        "blk.0.ssm_conv1d.weight": (10240, 4), "blk.0.ssm_dt.bias": (48,), "blk.0.ssm_a": (48,),
        "blk.0.ssm_beta.weight": (48, 5120), "blk.0.ssm_alpha.weight": (48, 5120), "blk.0.ssm_norm.weight": (128,),
        "blk.0.ssm_out.weight": (5120, 6144), "blk.0.post_attention_norm.weight": (5120,),
        "blk.3.attn_q.weight": (12288, 5120), "blk.3.attn_k.weight": (1024, 5120),
        "blk.3.attn_v.weight": (1024, 5120), "blk.3.attn_output.weight": (5120, 6144),
        "blk.3.attn_q_norm.weight": (256,), "blk.63.ffn_down.weight": (5120, 17408),
        "blk.64.attn_q.weight": (12288, 5120), "blk.64.nextn.eh_proj.weight": (5120, 10240),
        "blk.64.nextn.enorm.weight": (5120,), "blk.64.nextn.hnorm.weight": (5120,),
        "blk.64.nextn.shared_head_norm.weight": (5120,), "blk.64.ffn_gate.weight": (17408, 5120),
    }
    for name, shape in expected.items():
        assert table[name] == shape, name
    assert "blk.0.attn_q.weight" not in table and "blk.3.attn_qkv.weight" not in table
    assert "blk.64.ssm_a" not in table and "blk.65.attn_norm.weight" not in table
    assert sum(int(np.prod(s)) for s in table.values()) == pytest.approx(27.32e9, rel=1e-3)


def test_full_names_follow_llama_cpp():
    assert full_name("attn_q", 3) == "blk.3.attn_q.weight" and full_name("attn_q.bias", 0) == "blk.0.attn_q.bias"
    assert full_name("ssm_a", 1) == "blk.1.ssm_a" and full_name("ssm_dt.bias", 1) == "blk.1.ssm_dt.bias"
    assert full_name("token_embd") == "token_embd.weight"


@pytest.mark.parametrize("arch", ARCHS)
def test_bind_exposes_the_contract_keys(small_models, arch):
    f, cfg, tensors = load_model(small_models[arch])
    assert set(tensors.global_tensors) == {"token_embd", "output_norm", "output"}
    assert len(tensors.layers) == cfg.num_layers and len(tensors.nextn) == cfg.num_nextn_layers
    for i, layer in enumerate(tensors.layers):
        for key, info in layer.items():
            assert info is f.tensors[full_name(key, i)]
    if arch == "llama":  # tied: the LM head is the embedding
        assert tensors.global_tensors["output"] is tensors.global_tensors["token_embd"]
    if arch == "qwen2":
        assert {"attn_q.bias", "attn_k.bias", "attn_v.bias", "ffn_norm"} <= set(tensors.layers[0])
    if arch == "qwen35":
        assert {"attn_qkv", "ssm_a", "ssm_dt.bias", "ssm_conv1d", "post_attention_norm"} <= set(tensors.layers[0])
        assert {"attn_q", "attn_q_norm", "attn_k_norm"} <= set(tensors.layers[3])
        assert {"nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm", "attn_q"} <= \
            set(tensors.nextn[0])
        assert (tensors.layers[0]["ssm_a"].data < 0).all()  # stored as -exp(A_log)


def break_model(small_models, tmp_path, arch="qwen3", **changes):
    f = GGUFFile.open(small_models[arch])
    broken = GGUFFile.open(rewrite(f, tmp_path / "broken.gguf", **changes))
    return broken, ModelConfig.from_gguf(broken)


def test_missing_tensor_is_named_with_its_expected_shape(small_models, tmp_path):
    f, cfg = break_model(small_models, tmp_path, drop_tensors=("blk.1.ffn_up.weight",))
    with pytest.raises(ModelFileError, match=r"tensor 'blk.1.ffn_up.weight': is missing \(expected shape "
                                             r"\(512, 256\)\)") as caught:
        bind_weights(f, cfg)
    assert str(f.path) in str(caught.value)


def test_wrong_shape_names_expected_and_found(small_models, tmp_path):
    half = np.zeros((64, 256 // 32 * 34), np.uint8)  # Q8_0 rows of 256 weights, half the rows attn_v needs
    f, cfg = break_model(small_models, tmp_path, set_tensors={"blk.0.attn_v.weight": (Q.Q8_0, (64, 256), half)})
    with pytest.raises(ModelFileError, match=r"tensor 'blk.0.attn_v.weight': has shape \(64, 256\), "
                                             r"expected \(128, 256\)"):
        bind_weights(f, cfg)


def test_several_problems_are_counted(small_models, tmp_path):
    f, cfg = break_model(small_models, tmp_path, drop_tensors=("blk.0.ffn_up.weight", "blk.1.attn_k.weight"))
    with pytest.raises(ModelFileError, match=r"blk.0.ffn_up.weight': is missing .* \(and 1 more problems, "
                                             r"e.g. 'blk.1.attn_k.weight' is missing"):
        bind_weights(f, cfg)


def test_unsupported_quant_type_is_named(small_models, tmp_path):
    q2k = np.zeros((512, 256 // 256 * 84), np.uint8)  # Q2_K: 84 bytes per 256 weights
    f, cfg = break_model(small_models, tmp_path, set_tensors={"blk.0.ffn_gate.weight": (Q.Q2_K, (512, 256), q2k)})
    with pytest.raises(UnsupportedModelError, match="tensor 'blk.0.ffn_gate.weight': has type Q2_K, not supported"):
        bind_weights(f, cfg)


def test_quantized_vector_is_refused(small_models, tmp_path):
    vec = np.zeros((1, 256 // 32 * 34), np.uint8)
    f, cfg = break_model(small_models, tmp_path, set_tensors={"blk.0.attn_norm.weight": (Q.Q8_0, (256,), vec)})
    with pytest.raises(UnsupportedModelError, match="attn_norm.weight': is a vector stored as Q8_0"):
        bind_weights(f, cfg)


def test_tensors_the_engine_would_ignore_are_refused(small_models, tmp_path):
    freqs = np.ones(32, np.float32)
    f, cfg = break_model(small_models, tmp_path, arch="llama",
                         set_tensors={"rope_freqs.weight": (Q.F32, (32,), freqs)})
    with pytest.raises(UnsupportedModelError, match="tensor 'rope_freqs.weight': 1 tensors this engine would not"):
        bind_weights(f, cfg)


def test_optional_mtp_tensors_are_bound_when_present(small_models, tmp_path):
    f = GGUFFile.open(small_models["qwen35"])
    head = f.tensors["output.weight"]
    f2, cfg = break_model(small_models, tmp_path, arch="qwen35", set_tensors={
        "blk.4.nextn.shared_head_head.weight": (head.qtype, head.shape, head.data)})
    assert bind_weights(f2, cfg).nextn[0]["nextn.shared_head_head"].shape == (512, 256)
    bad = GGUFFile.open(rewrite(f, tmp_path / "bad.gguf", set_tensors={
        "blk.4.nextn.embed_tokens.weight": (Q.F32, (4, 256), np.zeros((4, 256), np.float32))}))
    with pytest.raises(ModelFileError, match=r"nextn.embed_tokens.weight': has shape \(4, 256\), expected"):
        bind_weights(bad, cfg)


def test_config_of_another_arch_is_refused(small_models):
    f = GGUFFile.open(small_models["qwen3"])
    cfg = ModelConfig.from_gguf(GGUFFile.open(small_models["qwen2"]))
    with pytest.raises(ModelFileError, match="file architecture 'qwen3' does not match the config's 'qwen2'"):
        bind_weights(f, cfg)
