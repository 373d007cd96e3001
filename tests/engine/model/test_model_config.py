"""ModelConfig: read from GGUF metadata per architecture, written back by to_gguf_metadata, and clear errors for
unsupported or inconsistent hyperparameters."""

from __future__ import annotations

import dataclasses

import pytest
from gguf import GGUFValueType as V

from engine.errors import ModelFileError, UnsupportedModelError
from engine.gguf.reader import GGUFFile
from engine.gguf.testmodel import tiny_config
from engine.gguf.writer import GGUFStreamWriter, rewrite
from engine.model.config import ATTENTION, DELTANET, ModelConfig, qwen38_27b_config

ARCHS = ("qwen35", "qwen3", "qwen2", "llama")


@pytest.fixture(scope="module")
def small_models(tiny_model_path):
    """Tokenizer-free tiny models (vocab 512: fast to rewrite), one per arch."""
    return {arch: tiny_model_path(arch, tokenizer=False) for arch in ARCHS}


def metadata_only(tmp_path, cfg: ModelConfig) -> GGUFFile:
    """A header-only GGUF carrying cfg's metadata (no tensors: embeddings read as tied)."""
    writer = GGUFStreamWriter(tmp_path / f"{cfg.arch}-meta.gguf", cfg.arch)
    for key, value, vtype in cfg.to_gguf_metadata():
        writer.add_metadata(key, value, vtype)
    writer.begin()
    return GGUFFile.open(writer.finish())


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_models_read_back_their_config(small_models, arch):
    cfg = ModelConfig.from_gguf(GGUFFile.open(small_models[arch]))
    assert cfg == tiny_config(arch, vocab_size=512)


def test_arch_specific_fields():
    q35, q3, q2, llama = (tiny_config(a) for a in ARCHS)
    assert q35.layer_kinds == (DELTANET, DELTANET, DELTANET, ATTENTION) and q35.num_nextn_layers == 1
    assert q35.rope_dim == 16 and q35.rope_sections == (3, 3, 2, 0) and q35.has_attn_gate and q35.has_qk_norm
    assert q3.has_qk_norm and not q3.has_qkv_bias and q2.has_qkv_bias and not q2.has_qk_norm
    assert [c.rope_neox for c in (q35, q3, q2, llama)] == [True, True, True, False]
    assert llama.tied_embeddings and not q2.tied_embeddings


def test_qwen38_27b_shape_round_trips_through_metadata(tmp_path):
    cfg = qwen38_27b_config()
    assert cfg.layer_kinds.count(ATTENTION) == 16 and cfg.layer_kinds[3] == ATTENTION
    assert cfg.ssm_conv_dim == 10240 and cfg.ssm_v_head_dim == 128 and cfg.num_total_layers == 65
    keys = {key: value for key, value, _ in cfg.to_gguf_metadata()}
    assert keys["qwen35.block_count"] == 65 and keys["qwen35.nextn_predict_layers"] == 1
    assert keys["qwen35.rope.dimension_sections"] == [11, 11, 10, 0] and keys["qwen35.ssm.inner_size"] == 6144
    read = ModelConfig.from_gguf(metadata_only(tmp_path, cfg))
    assert read == dataclasses.replace(cfg, tied_embeddings=True)


def test_recurrent_layers_array_overrides_the_interval(small_models, tmp_path):
    f = GGUFFile.open(small_models["qwen35"])
    pattern = [True, False, True, False, False]  # 4 trunk layers + MTP
    edited = rewrite(f, tmp_path / "recurrent.gguf",
                     set_metadata={"qwen35.attention.recurrent_layers": (pattern, V.ARRAY)})
    cfg = ModelConfig.from_gguf(GGUFFile.open(edited))
    assert cfg.layer_kinds == (DELTANET, ATTENTION, DELTANET, ATTENTION)


@pytest.mark.parametrize("arch, change, error, message", [
    ("qwen3", {"general.architecture": ("gemma3", V.STRING)}, UnsupportedModelError,
     "architecture 'gemma3' is not supported"),
    ("qwen3", {"qwen3.attention.head_count": ([4, 8], V.ARRAY)}, UnsupportedModelError, "varies per layer"),
    ("qwen3", {"qwen3.attention.value_length": (32, V.UINT32)}, UnsupportedModelError, "value_length 32 differs"),
    ("qwen3", {"qwen3.attention.head_count_kv": (3, V.UINT32)}, ModelFileError,
     "invalid hyperparameters: num_heads 4 is not a multiple of num_kv_heads 3"),
    ("qwen3", {"qwen3.embedding_length": ("wide", V.STRING)}, ModelFileError,
     "'qwen3.embedding_length' has value 'wide', expected int"),
    ("qwen35", {"qwen35.nextn_predict_layers": (5, V.UINT32)}, ModelFileError,
     "nextn_predict_layers 5 does not fit block_count 5"),
    ("qwen35", {"qwen35.full_attention_interval": (0, V.UINT32)}, ModelFileError, "full_attention_interval' is 0"),
    ("qwen35", {"qwen35.ssm.time_step_rank": (3, V.UINT32)}, ModelFileError, "not a multiple of k heads"),
    ("llama", {"llama.rope.dimension_count": (32, V.UINT32)}, UnsupportedModelError, "rope.dimension_count 32"),
])
def test_bad_metadata_gives_clear_errors(small_models, tmp_path, arch, change, error, message):
    edited = rewrite(GGUFFile.open(small_models[arch]), tmp_path / "edited.gguf", set_metadata=change)
    with pytest.raises(error, match=message) as caught:
        ModelConfig.from_gguf(GGUFFile.open(edited))
    assert str(edited) in str(caught.value)


@pytest.mark.parametrize("key", ["qwen3.block_count", "qwen3.embedding_length", "qwen3.feed_forward_length",
                                 "qwen3.attention.head_count", "qwen3.attention.layer_norm_rms_epsilon",
                                 "qwen3.context_length"])
def test_missing_required_key_is_named(small_models, tmp_path, key):
    edited = rewrite(GGUFFile.open(small_models["qwen3"]), tmp_path / "missing.gguf", drop_metadata=(key,))
    with pytest.raises(ModelFileError, match=f"metadata key '{key}' is missing"):
        ModelConfig.from_gguf(GGUFFile.open(edited))


def test_optional_keys_take_llama_cpp_defaults(small_models, tmp_path):
    dropped = ("qwen3.attention.head_count_kv", "qwen3.attention.key_length", "qwen3.attention.value_length",
               "qwen3.rope.dimension_count", "qwen3.rope.freq_base", "qwen3.vocab_size")
    edited = rewrite(GGUFFile.open(small_models["qwen3"]), tmp_path / "defaults.gguf", drop_metadata=dropped)
    cfg = ModelConfig.from_gguf(GGUFFile.open(edited))
    # head_dim = hidden / heads, kv heads = heads, rope over the whole head, theta 1e4, vocab from token_embd
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.rope_dim, cfg.rope_theta, cfg.vocab_size) == (64, 4, 64, 1e4, 512)


@pytest.mark.parametrize("change, message", [
    (dict(arch="mamba"), "not supported"),
    (dict(num_layers=0, layer_kinds=()), "num_layers must be positive"),
    (dict(rope_dim=17), "rope_dim 17 must be even"),
    (dict(layer_kinds=(ATTENTION,) * 3), "layer_kinds must name 2 layers"),
    (dict(rms_eps=0.0), "must be positive"),
])
def test_post_init_rejects_inconsistent_configs(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(tiny_config("qwen3"), **change)


def test_deltanet_layers_need_ssm_sizes():
    with pytest.raises(ValueError, match="ssm_num_k_heads must be positive"):
        dataclasses.replace(tiny_config("qwen35"), ssm_num_k_heads=0)
