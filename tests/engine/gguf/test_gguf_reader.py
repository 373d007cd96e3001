"""GGUFFile: agrees with gguf.GGUFReader on a file gguf.GGUFWriter wrote, and turns every kind of broken file into
ModelFileError / UnsupportedModelError naming the file (and the tensor) rather than a numpy traceback."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from engine.errors import ModelFileError, UnsupportedModelError
from engine.gguf.quants import quantize
from engine.gguf.reader import GGUFFile

RNG = np.random.default_rng(0)
F32_VALUES = RNG.standard_normal((3, 64)).astype(np.float32)
Q8_VALUES = RNG.standard_normal((4, 64)).astype(np.float32)
Q4K_VALUES = RNG.standard_normal((2, 512)).astype(np.float32)


def write_sample(path: Path) -> Path:
    """A small file from gguf's own writer: every metadata type and tensors of several types."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_int32("test.negative", -7)
    w.add_float32("test.eps", 1e-5)
    w.add_float64("test.double", 2.5)
    w.add_bool("test.flag", True)
    w.add_string("test.text", "héllo ✓")
    w.add_uint64("test.big", 2 ** 40)
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.strings", ["a", "", "ü"])
    w.add_key_value("test.nested", [[1, 2], [3]], V.ARRAY)
    w.add_tensor("a.weight", F32_VALUES)
    w.add_tensor("b.weight", F32_VALUES.astype(np.float16))
    w.add_tensor("c.weight", quantize(Q8_VALUES, Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("d.weight", quantize(Q4K_VALUES, Q.Q4_K), raw_dtype=Q.Q4_K)
    w.add_tensor("e.weight", np.arange(5, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    return write_sample(tmp_path_factory.mktemp("reader") / "sample.gguf")


def test_metadata_and_tensors_match_gguf_reader(sample):
    f, reference = GGUFFile.open(sample), gguf.GGUFReader(sample)
    assert f.arch == "llama" and f.version == 3
    for name, field in reference.fields.items():
        if name.startswith("GGUF."):
            continue
        expected, ours = field.contents(), f.metadata[name]
        if name == "test.nested":  # gguf-py flattens nested arrays; we keep their structure
            ours = [x for inner in ours for x in inner]
        assert ours == (pytest.approx(expected) if isinstance(expected, float) else expected), name
    assert list(f.tensors) == [t.name for t in reference.tensors]
    for t in reference.tensors:
        info = f.tensors[t.name]
        assert info.qtype == t.tensor_type and info.offset == t.data_offset
        assert info.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
        np.testing.assert_array_equal(np.asarray(info.data).view(np.uint8).reshape(-1),
                                      np.asarray(t.data).view(np.uint8).reshape(-1))


def test_plain_python_values_and_types(sample):
    f = GGUFFile.open(sample)
    assert f.get("test.text") == "héllo ✓" and f.get("test.flag") is True and f.get("test.negative") == -7
    assert f.get("test.big") == 2 ** 40 and f.get("test.strings") == ["a", "", "ü"]
    assert f.get("test.nested") == [[1, 2], [3]] and f.get("missing", 42) == 42
    assert f.arch_get("block_count") == 2 and f.arch_get("nope") is None
    assert type(f.get("test.ints")[0]) is int and type(f.get("test.eps")) is float
    assert f.value_types["test.strings"] == (V.ARRAY, V.STRING) and f.value_types["test.eps"] == (V.FLOAT32, None)
    with pytest.raises(ModelFileError, match="'llama.context_length' is missing"):
        f.require("llama.context_length")


def test_tensor_views_shapes_and_dequantize(sample):
    f = GGUFFile.open(sample)
    a, c, d = f.tensors["a.weight"], f.tensors["c.weight"], f.tensors["d.weight"]
    assert a.shape == (3, 64) and a.data.dtype == np.float32 and not a.is_quantized
    assert c.shape == (4, 64) and c.data.shape == (4, 68) and c.data.dtype == np.uint8 and c.is_quantized
    assert d.data.shape == (2, 288) and d.num_elements == 1024 and d.nbytes == 576
    assert not a.data.flags.writeable  # the file is mapped read-only
    np.testing.assert_array_equal(f.dequantize("a.weight"), F32_VALUES)
    np.testing.assert_array_equal(f.dequantize("b.weight"), F32_VALUES.astype(np.float16).astype(np.float32))
    assert np.abs(f.dequantize("c.weight") - Q8_VALUES).max() < 0.02
    assert np.sqrt(np.mean((f.dequantize("d.weight") - Q4K_VALUES) ** 2)) < 0.08
    with pytest.raises(ModelFileError, match="tensor 'zz.weight': is missing"):
        f.dequantize("zz.weight")


def tensor_info_offset(raw: bytes, name: str) -> int:
    """Byte offset just past a tensor's name in the tensor index (where n_dims starts)."""
    encoded = name.encode()
    return raw.index(struct.pack("<Q", len(encoded)) + encoded) + 8 + len(encoded)


def corrupt(sample: Path, tmp_path: Path, edit) -> Path:
    raw = bytearray(sample.read_bytes())
    edit(raw)
    out = tmp_path / "broken.gguf"
    out.write_bytes(bytes(raw))
    return out


def set_u32(raw: bytearray, offset: int, value: int) -> None:
    raw[offset:offset + 4] = struct.pack("<I", value)


@pytest.mark.parametrize("edit, error, message", [
    (lambda r: r.__setitem__(slice(0, 4), b"GGML"), ModelFileError, "not a GGUF file"),
    (lambda r: set_u32(r, 4, 7), UnsupportedModelError, "GGUF version 7 is not supported"),
    (lambda r: set_u32(r, 4, 3 << 24), UnsupportedModelError, "big-endian"),
    (lambda r: r.__delitem__(slice(200, None)), ModelFileError, "truncated header"),
    (lambda r: r.__delitem__(slice(len(r) - 16, None)), ModelFileError,
     "tensor 'e.weight': data runs past the end of the file"),
    (lambda r: set_u32(r, tensor_info_offset(r, "c.weight") + 4 + 16, 99), UnsupportedModelError,
     "tensor 'c.weight': unknown tensor type 99"),
    (lambda r: set_u32(r, tensor_info_offset(r, "d.weight") + 4 + 16, int(Q.Q6_K)), ModelFileError,
     "tensor 'd.weight': data runs past the end"),
    (lambda r: set_u32(r, tensor_info_offset(r, "a.weight"), 9), ModelFileError,
     "tensor 'a.weight': has 9 dimensions"),
], ids=["magic", "version", "big-endian", "truncated-header", "truncated-data", "unknown-type",
        "type-larger-than-data", "dims"])
def test_broken_files_give_clear_errors(sample, tmp_path, edit, error, message):
    broken = corrupt(sample, tmp_path, edit)
    with pytest.raises(error, match=message) as caught:
        GGUFFile.open(broken)
    assert str(broken) in str(caught.value)


def test_dequantizing_an_unsupported_type_names_file_and_tensor(tmp_path):
    # Q2_K has a known block size, so the file opens; decoding it is what the engine cannot do
    path = tmp_path / "q2k.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("q.weight", np.zeros((2, 84), dtype=np.uint8), raw_dtype=Q.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = GGUFFile.open(path)
    assert f.tensors["q.weight"].qtype == Q.Q2_K
    with pytest.raises(UnsupportedModelError, match=r"tensor 'q.weight': quant type Q2_K is not supported") as caught:
        f.dequantize("q.weight")
    assert str(path) in str(caught.value) and "Q4_K" in str(caught.value)  # says what would have worked


def test_row_length_that_does_not_fill_blocks(sample, tmp_path):
    def edit(raw: bytearray) -> None:  # c.weight is Q8_0 (blocks of 32): make its rows 48 long
        at = tensor_info_offset(raw, "c.weight") + 4
        raw[at:at + 8] = struct.pack("<Q", 48)

    broken = corrupt(sample, tmp_path, edit)
    with pytest.raises(ModelFileError, match=r"tensor 'c.weight': shape \(4, 48\) does not fit Q8_0 blocks of 32"):
        GGUFFile.open(broken)


def test_missing_empty_and_directory_paths(tmp_path):
    with pytest.raises(ModelFileError, match="cannot be read"):
        GGUFFile.open(tmp_path / "absent.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelFileError, match="empty.gguf"):
        GGUFFile.open(tmp_path / "empty.gguf")
    with pytest.raises(ModelFileError):
        GGUFFile.open(tmp_path)


def test_duplicate_tensor_names_are_refused(sample, tmp_path):
    def edit(raw: bytearray) -> None:
        at = raw.index(b"b.weight")
        raw[at:at + 8] = b"a.weight"

    with pytest.raises(ModelFileError, match="tensor 'a.weight': appears twice"):
        GGUFFile.open(corrupt(sample, tmp_path, edit))


def test_missing_architecture_is_refused(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "noarch.gguf", "llama")
    w.kv_data[0].pop("general.architecture")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="'general.architecture' is missing"):
        GGUFFile.open(tmp_path / "noarch.gguf")


def test_from_bytes_parses_an_in_memory_image(sample):
    f = GGUFFile.from_bytes(sample.read_bytes(), "in-memory.gguf")
    np.testing.assert_array_equal(f.dequantize("a.weight"), F32_VALUES)
    with pytest.raises(ModelFileError, match="in-memory.gguf: truncated header"):
        GGUFFile.from_bytes(sample.read_bytes()[:30], "in-memory.gguf")


def test_absurd_dimensions_do_not_wrap_around(sample, tmp_path):
    def edit(raw: bytearray) -> None:  # a.weight claims 2^40 x 2^40 floats
        at = tensor_info_offset(raw, "a.weight") + 4
        raw[at:at + 16] = struct.pack("<QQ", 1 << 40, 1 << 40)

    with pytest.raises(ModelFileError, match="tensor 'a.weight': data runs past the end of the file"):
        GGUFFile.open(corrupt(sample, tmp_path, edit))


def test_huge_counts_fail_as_truncated_not_out_of_memory(sample, tmp_path):
    def edit(raw: bytearray) -> None:  # the metadata count claims 2^60 entries
        raw[16:24] = struct.pack("<Q", 1 << 60)

    with pytest.raises(ModelFileError, match="truncated header"):
        GGUFFile.open(corrupt(sample, tmp_path, edit))
