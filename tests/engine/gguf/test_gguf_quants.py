"""Quant formats: round-trip error bounds per type, bit layouts pinned by hand-built blocks, our K-quant packers
checked against gguf.quants (an independent decoder) and against scalar decoders written from the format spec."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants as gguf_quants

from engine.gguf.quants import (
    SUPPORTED_TYPES, QuantTypeError, dequantize, dequantize_rows, quantize, quantize_q4_K, quantize_q5_K,
    quantize_q6_K, row_bytes,
)

# Relative RMS error bound of dequantize(quantize(x)) on standard normal data, per type (measured values are
# about 20 % below these: Q4_0 0.086, Q4_1 0.078, Q5_0 0.043, Q5_1 0.038, Q8_0 0.0054, Q4_K 0.072, Q5_K 0.036,
# Q6_K 0.018, BF16 0.0017, F16 0.0002).
ERROR_BOUNDS = {
    Q.F32: 0.0, Q.F16: 3e-4, Q.BF16: 2.5e-3, Q.Q4_0: 0.10, Q.Q4_1: 0.09, Q.Q5_0: 0.05, Q.Q5_1: 0.045,
    Q.Q8_0: 0.007, Q.Q4_K: 0.08, Q.Q5_K: 0.042, Q.Q6_K: 0.021,
}


def rel_rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


@pytest.fixture(scope="module")
def gaussian() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((48, 1024)).astype(np.float32)


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_round_trip_error_is_small(qtype, gaussian):
    packed = quantize(gaussian, qtype)
    assert packed.dtype == np.uint8 and packed.shape == (48, row_bytes(qtype, 1024))
    restored = dequantize(packed, qtype, gaussian.shape)
    assert restored.dtype == np.float32 and restored.shape == gaussian.shape
    assert rel_rmse(restored, gaussian) <= ERROR_BOUNDS[qtype]


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda t: t.name)
def test_k_quants_beat_the_legacy_types_of_the_same_width(qtype, gaussian):
    """A real search, not just min/max scaling: each K-quant is more accurate than its 32-block cousin."""
    legacy = {Q.Q4_K: Q.Q4_1, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q5_1}[qtype]
    ours = rel_rmse(dequantize(quantize(gaussian, qtype), qtype, gaussian.shape), gaussian)
    theirs = rel_rmse(gguf_quants.dequantize(gguf_quants.quantize(gaussian, legacy), legacy), gaussian)
    assert ours < theirs


# Scalar decoders written from the block layouts (REFERENCE.md), independent of both gguf.quants and our packers.
def f16(raw: np.ndarray) -> float:
    return float(raw[:2].copy().view(np.float16)[0])


def scale_min_k4(j: int, s: np.ndarray) -> tuple[int, int]:
    if j < 4:
        return int(s[j] & 63), int(s[j + 4] & 63)
    return int((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4)), int((s[j + 4] >> 4) | ((s[j] >> 6) << 4))


def decode_q4_K(block: np.ndarray) -> np.ndarray:
    d, dmin, scales, qs = f16(block[0:2]), f16(block[2:4]), block[4:16], block[16:144]
    out = np.zeros(256)
    for j in range(8):  # sub-block j: nibble (j % 2) of qs bytes 32*(j // 2) .. +32
        sc, m = scale_min_k4(j, scales)
        for i in range(32):
            q = int(qs[32 * (j // 2) + i] >> (4 * (j % 2))) & 0xF
            out[32 * j + i] = d * sc * q - dmin * m
    return out


def decode_q5_K(block: np.ndarray) -> np.ndarray:
    d, dmin, scales, qh, qs = f16(block[0:2]), f16(block[2:4]), block[4:16], block[16:48], block[48:176]
    out = np.zeros(256)
    for j in range(8):
        sc, m = scale_min_k4(j, scales)
        for i in range(32):
            q = (int(qs[32 * (j // 2) + i] >> (4 * (j % 2))) & 0xF) | ((int(qh[i] >> j) & 1) << 4)
            out[32 * j + i] = d * sc * q - dmin * m
    return out


def decode_q6_K(block: np.ndarray) -> np.ndarray:
    ql, qh, scales, d = block[0:128], block[128:192], block[192:208].view(np.int8), f16(block[208:210])
    out = np.zeros(256)
    for n in range(256):
        half, k = divmod(n, 128)
        quarter, i = divmod(k, 32)
        low = int(ql[64 * half + 32 * (quarter % 2) + i] >> (4 * (quarter // 2))) & 0xF
        high = int(qh[32 * half + i] >> (2 * quarter)) & 3
        out[n] = d * int(scales[n // 16]) * (int(low | (high << 4)) - 32)
    return out


SCALAR_DECODERS = {Q.Q4_K: decode_q4_K, Q.Q5_K: decode_q5_K, Q.Q6_K: decode_q6_K}


def test_hand_built_q4_K_block_decodes_to_hand_computed_values():
    block = np.zeros(144, dtype=np.uint8)
    block[0:2] = np.array([0.5], np.float16).view(np.uint8)  # d
    block[2:4] = np.array([0.25], np.float16).view(np.uint8)  # dmin
    block[4] = 3 | (1 << 6)  # scale 0 = 3; top bits of scale 4 = 1
    block[8] = 2 | (2 << 6)  # min 0 = 2; top bits of min 4 = 2
    block[12] = 5 | (7 << 4)  # scale 4 low = 5, min 4 low = 7  -> scale 4 = 21, min 4 = 39
    block[16] = 0x9 | (0xC << 4)  # weight 0 (sub-block 0) = 9, weight 32 (sub-block 1) = 12
    block[16 + 64 + 5] = 0xF  # weight 128 + 5 (sub-block 4) = 15
    y = dequantize(block, Q.Q4_K, (1, 256))[0]
    assert y[0] == 0.5 * 3 * 9 - 0.25 * 2  # 13.0
    assert y[32] == 0.0  # sub-block 1 has scale 0 and min 0
    assert y[128 + 5] == 0.5 * 21 * 15 - 0.25 * 39  # 147.75
    assert y[128] == -0.25 * 39
    np.testing.assert_array_equal(y, decode_q4_K(block))


def test_hand_built_q6_K_block_decodes_to_hand_computed_values():
    block = np.zeros(210, dtype=np.uint8)
    block[192:208] = np.arange(-8, 8, dtype=np.int8).view(np.uint8)  # sub-block scales -8..7
    block[208:210] = np.array([0.125], np.float16).view(np.uint8)
    block[0] = 0x3 | (0x5 << 4)  # weight 0 low = 3, weight 64 low = 5
    block[128] = 0b10_00_00_01  # weight 0 high = 1, weight 96 high = 2
    y = dequantize(block, Q.Q6_K, (1, 256))[0]
    assert y[0] == 0.125 * -8 * ((3 | 1 << 4) - 32)  # 13.0 (q = 19)
    assert y[64] == 0.125 * -4 * (5 - 32)  # 13.5
    assert y[96] == 0.125 * -2 * ((2 << 4) - 32)  # 0
    np.testing.assert_array_equal(y, decode_q6_K(block))


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda t: t.name)
def test_random_blocks_decode_identically_with_the_scalar_spec_decoder(qtype):
    """gguf.quants (what dequantize uses) agrees with a loop written from the layout, on random bytes."""
    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, size=(3, row_bytes(qtype, 256)), dtype=np.uint8)
    for block in blocks:  # keep the f16 scale fields finite and small
        spans = {Q.Q4_K: [(0, 2), (2, 4)], Q.Q5_K: [(0, 2), (2, 4)], Q.Q6_K: [(208, 210)]}[qtype]
        for start, end in spans:
            block[start:end] = np.array([rng.uniform(0.01, 0.1)], np.float16).view(np.uint8)
    decoded = dequantize(blocks, qtype, (3, 256))
    for row, block in enumerate(blocks):
        np.testing.assert_allclose(decoded[row], SCALAR_DECODERS[qtype](block), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda t: t.name)
def test_our_packers_match_the_scalar_decoder_and_gguf(qtype):
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32) * 0.02
    packer = {Q.Q4_K: quantize_q4_K, Q.Q5_K: quantize_q5_K, Q.Q6_K: quantize_q6_K}[qtype]
    packed = packer(x)
    blocks = packed.reshape(-1, row_bytes(qtype, 256))
    scalar = np.concatenate([SCALAR_DECODERS[qtype](b) for b in blocks]).reshape(x.shape)
    independent = gguf_quants.dequantize(packed, qtype)
    np.testing.assert_allclose(independent, scalar, rtol=1e-6, atol=1e-9)
    assert rel_rmse(scalar, x) <= ERROR_BOUNDS[qtype]


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q4_0], ids=lambda t: t.name)
@pytest.mark.parametrize("case", ["zeros", "constant", "negative", "outlier", "tiny"])
def test_awkward_rows_stay_finite_and_accurate(qtype, case):
    rng = np.random.default_rng(5)
    x = {
        "zeros": np.zeros((2, 256)), "constant": np.full((2, 256), 0.7),
        "negative": -np.abs(rng.standard_normal((2, 256))), "tiny": rng.standard_normal((2, 256)) * 1e-3,
        "outlier": np.where(np.arange(256) == 17, 50.0, rng.standard_normal((2, 256)) * 0.1),
    }[case].astype(np.float32)
    y = dequantize(quantize(x, qtype), qtype, x.shape)
    assert np.isfinite(y).all()
    scale = max(float(np.abs(x).max()), 1e-30)
    assert float(np.abs(y - x).max()) <= 0.15 * scale  # within a fraction of the largest value
    if case == "zeros":
        assert not y.any()


def test_dequantize_rows_matches_full_dequantize(gaussian):
    packed = quantize(gaussian, Q.Q4_K)
    rows = [5, 0, 47, 5]
    np.testing.assert_array_equal(dequantize_rows(packed, Q.Q4_K, gaussian.shape, rows),
                                  dequantize(packed, Q.Q4_K, gaussian.shape)[rows])
    with pytest.raises(IndexError):
        dequantize_rows(packed, Q.Q4_K, gaussian.shape, [48])


def test_bf16_words_and_f16_arrays_decode_as_stored():
    x = np.array([[1.0, -2.5, 3.140625, 0.0]], dtype=np.float32)
    words = (x.view(np.uint32) >> 16).astype(np.uint16)  # exact in bf16
    np.testing.assert_array_equal(dequantize(words, Q.BF16, x.shape), x)
    np.testing.assert_array_equal(dequantize(x.astype(np.float16), Q.F16, x.shape), x)


def test_bad_input_gives_clear_errors(gaussian):
    with pytest.raises(QuantTypeError, match="Q2_K is not supported"):
        quantize(gaussian, Q.Q2_K)
    with pytest.raises(QuantTypeError, match="not a multiple of the Q4_K block size 256"):
        quantize(gaussian[:, :100], Q.Q4_K)
    with pytest.raises(QuantTypeError, match="NaN"):
        quantize(np.full((1, 256), np.nan, np.float32), Q.Q8_0)
    with pytest.raises(QuantTypeError, match="needs 144 bytes, got 143"):
        dequantize(np.zeros(143, np.uint8), Q.Q4_K, (1, 256))
