"""Test-model writer: every arch re-opens through GGUFFile + ModelConfig + bind_weights with the real tokenizer,
weights have the planned scales and a Q4_K_M-like type mix, logits have margins, output is deterministic, the
full-size (fast, parallel, chunked) path works on a scaled-down shape, and failures leave no file behind."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
from collections import Counter

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.gguf import testmodel
from engine.gguf.quants import dequantize_rows, row_bytes
from engine.gguf.reader import GGUFFile
from engine.gguf.testmodel import (
    pick_qtype, plan_tensors, tiny_config, tokenizer_metadata, write_model, write_preset, write_test_model,
)
from engine.model.config import ModelConfig, qwen38_27b_config
from engine.model.weights import bind_weights, load_model

ARCHS = ("qwen35", "qwen3", "qwen2", "llama")


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("arch", ARCHS)
def test_written_model_reopens_with_tokenizer_and_q4_K_M_mix(tiny_model_path, arch):
    f, cfg, tensors = load_model(tiny_model_path(arch))
    assert cfg == tiny_config(arch)
    assert len(f.metadata["tokenizer.ggml.tokens"]) == cfg.vocab_size == 151936
    assert f.get("tokenizer.ggml.model") == "gpt2" and "<|im_start|>" in f.get("tokenizer.chat_template")
    assert f.get("tokenizer.ggml.eos_token_id") == 151645 and f.get("general.file_type") == 15
    types = Counter(t.qtype for t in f.tensors.values())
    assert {Q.Q4_K, Q.Q6_K, Q.Q5_0, Q.F32} <= set(types) and types[Q.Q4_K] > types[Q.Q6_K]
    assert f.tensors["token_embd.weight"].qtype == Q.Q4_K
    if arch == "qwen35":
        assert types[Q.Q8_0] > 0 and f.arch_get("block_count") == 5 and f.arch_get("nextn_predict_layers") == 1
        assert f.tensors["blk.4.nextn.eh_proj.weight"].shape == (256, 512) and len(tensors.nextn) == 1
        assert f.tensors["blk.0.ssm_conv1d.weight"].qtype == Q.F32
    else:
        assert not cfg.tied_embeddings or f.tensors.get("output.weight") is None


def sample_values(f: GGUFFile, name: str, vocab_size: int) -> np.ndarray:
    """The tensor dequantized, or 2048 of its rows when it is vocabulary-sized (the rest is the same generator)."""
    info = f.tensors[name]
    if info.shape[0] != vocab_size:
        return f.dequantize(name)
    rows = np.random.default_rng(0).choice(vocab_size, 2048, replace=False)
    return dequantize_rows(info.data, info.qtype, info.shape, rows)


@pytest.mark.parametrize("arch", ["qwen35", "qwen2"])
def test_weights_have_their_planned_scale(tiny_model_path, arch):
    f = GGUFFile.open(tiny_model_path(arch))
    cfg = ModelConfig.from_gguf(f)
    for plan in plan_tensors(cfg):
        values = sample_values(f, plan.name, cfg.vocab_size)
        assert np.isfinite(values).all(), plan.name
        if plan.key in ("ssm_a", "ssm_dt.bias"):
            continue
        if plan.key == "output":  # lognormal row scales widen the spread a little
            assert values.std() == pytest.approx(plan.std * np.exp(0.3 ** 2), rel=0.1)
            continue
        n = values.size  # sampling error shrinks with size: 4 standard errors, plus quantization slack
        assert values.mean() == pytest.approx(plan.mean, abs=4 * plan.std / np.sqrt(n) + 0.01 * plan.std), plan.name
        assert values.std() == pytest.approx(plan.std, rel=0.08 + 4 / np.sqrt(2 * n)), plan.name
    if arch == "qwen35":
        ssm_a, dt_bias = f.dequantize("blk.0.ssm_a"), f.dequantize("blk.0.ssm_dt.bias")
        assert (-16 <= ssm_a).all() and (ssm_a <= -1).all()
        dt = np.log1p(np.exp(dt_bias))  # softplus(bias) = the initial time step
        assert (dt > 9e-4).all() and (dt < 0.11).all()


def test_logits_have_margins_and_a_diverse_argmax(tiny_model_path):
    f = GGUFFile.open(tiny_model_path("qwen3"))
    head = f.dequantize("output.weight")  # head: [V, H]
    hidden = np.random.default_rng(0).standard_normal((64, head.shape[1])).astype(np.float32)  # rms-normed states
    logits = hidden @ head.T
    top2 = np.sort(logits, axis=1)[:, -2:]
    gaps = top2[:, 1] - top2[:, 0]
    assert np.median(gaps) > 0.5 and (gaps < 0.05).mean() < 0.1
    assert len(set(logits.argmax(axis=1))) > 48  # not one token winning everywhere
    assert 3.0 < logits.std() < 6.0


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a = write_test_model(tmp_path / "a.gguf", "qwen35", tokenizer=False, seed=3)
    b = write_test_model(tmp_path / "b.gguf", "qwen35", tokenizer=False, seed=3)
    c = write_test_model(tmp_path / "c.gguf", "qwen35", tokenizer=False, seed=4)
    assert sha256(a) == sha256(b) != sha256(c)


def scaled_down_27b() -> ModelConfig:
    """The Qwen3.8-27B layout (qwen35, 3:1 DeltaNet/attention, MTP) at a width a test can afford."""
    full = qwen38_27b_config()
    return dataclasses.replace(
        full, num_layers=4, layer_kinds=full.layer_kinds[:4], hidden_size=512, ffn_size=768, vocab_size=1000,
        num_heads=4, num_kv_heads=2, head_dim=128, rope_dim=32, rope_sections=(6, 5, 5, 0), ssm_num_k_heads=2,
        ssm_num_v_heads=4, ssm_head_dim=64, ssm_inner_size=256, context_length=8192)


def test_full_size_path_on_a_scaled_down_shape(tmp_path, monkeypatch):
    monkeypatch.setattr(testmodel, "CHUNK_BYTES", 20_000)  # several chunks per tensor, like the real sizes
    cfg = scaled_down_27b()
    one = write_model(tmp_path / "w1.gguf", cfg, fast=True, workers=1, tokenizer=False)
    two = write_model(tmp_path / "w3.gguf", cfg, fast=True, workers=3, tokenizer=False)
    assert sha256(one) == sha256(two)  # chunk seeds, not thread timing, decide the bytes
    f = GGUFFile.open(two)
    read = ModelConfig.from_gguf(f)
    assert read == dataclasses.replace(cfg, tied_embeddings=False)
    bind_weights(f, read)
    for plan in plan_tensors(read):
        values = f.dequantize(plan.name)
        assert np.isfinite(values).all()
        if len(plan.shape) == 2 and plan.key != "output":
            assert values.std() == pytest.approx(plan.std, rel=0.15), plan.name
    assert write_model(tmp_path / "slow.gguf", cfg, tokenizer=False).stat().st_size == two.stat().st_size


def test_preset_is_the_16_8_GB_qwen38_27b_shape():
    plans = plan_tensors(qwen38_27b_config())
    total = sum(int(np.prod(p.shape[:-1], dtype=np.int64)) * row_bytes(p.qtype, p.shape[-1]) for p in plans)
    assert 16.3e9 < total < 17.3e9
    types = Counter(p.qtype for p in plans)
    assert types[Q.Q4_K] > types[Q.Q6_K] > 0 and {Q.Q5_0, Q.Q8_0, Q.F32} <= set(types)
    with pytest.raises(ValueError, match="unknown preset 'qwen9'"):
        write_preset("/nonexistent/x.gguf", "qwen9")


def test_type_fallbacks_for_rows_that_do_not_fill_blocks():
    cfg = tiny_config("qwen3")
    assert pick_qtype("ffn_gate", 0, cfg, (512, 256)) == Q.Q4_K
    assert pick_qtype("ffn_gate", 0, cfg, (512, 320)) == Q.Q8_0
    assert pick_qtype("ffn_gate", 0, cfg, (512, 100)) == Q.F16
    assert pick_qtype("output", None, cfg, (10, 256)) == Q.Q6_K
    assert pick_qtype("attn_norm", 0, cfg, (256,)) == Q.F32


def test_tokenizer_is_padded_to_a_larger_vocab_and_never_truncated():
    items = {key: (value, vtype, sub) for key, value, vtype, sub in tokenizer_metadata(151940)}
    tokens, token_types = items["tokenizer.ggml.tokens"][0], items["tokenizer.ggml.token_type"][0]
    assert len(tokens) == len(token_types) == 151940 and tokens[-1] == "[PAD151939]" and token_types[-1] == 5
    with pytest.raises(ValueError, match="smaller than the tokenizer's 151936 tokens"):
        tokenizer_metadata(1000)


def test_failure_mid_write_leaves_no_file(tmp_path, monkeypatch):
    calls = []

    def failing(plan, cfg, rng, synth):
        calls.append(plan.name)
        if len(calls) == 4:
            raise RuntimeError("disk on fire")
        return real(plan, cfg, rng, synth)

    real = testmodel._dense_tensor
    monkeypatch.setattr(testmodel, "_dense_tensor", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_test_model(tmp_path / "m.gguf", "qwen3", tokenizer=False)
    assert list(tmp_path.iterdir()) == []


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    testmodel.add_arguments(parser)
    return testmodel.run(parser.parse_args(argv))


def test_cli_writes_a_model_and_reports_bad_options(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert cli(["--arch", "qwen2", "--out", str(out), "--layers", "1", "--hidden", "512", "--seed", "9"]) == 0
    assert "wrote" in capsys.readouterr().out
    f, cfg, _ = load_model(out)
    assert (cfg.arch, cfg.num_layers, cfg.hidden_size) == ("qwen2", 1, 512)
    assert cli(["--arch", "qwen3", "--out", str(tmp_path / "bad.gguf"), "--heads", "3"]) == 2
    assert "num_heads 3 is not a multiple of num_kv_heads 2" in capsys.readouterr().err
    assert not (tmp_path / "bad.gguf").exists()
