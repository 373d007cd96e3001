"""GGUF header and tensor index: metadata as plain Python values, tensors as memory-mapped arrays (no math here).

The header is parsed here, over the same read-only np.memmap gguf.GGUFReader would use, rather than by GGUFReader
itself: GGUFReader builds numpy memmap views for every part of every string (about 3 million for the 151,936 tokens
and 151,387 merges of the Qwen vocabulary), and with gguf 0.19.0 it took 9 to 16 s to open Qwen2.5-Coder-0.5B Q4_K_M
and 11 to 14 s to open a generated tiny qwen35 (same vocabulary), against 0.5 to 0.8 s here (2026-12-01, 2 busy
cores). gguf-py's constants (types, block sizes) stay the source of truth, and the tests check this parser against
gguf.GGUFReader on the same files.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from engine.errors import ModelFileError, UnsupportedModelError

SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4

# Scalar value types -> struct format (little-endian).
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
# Numeric array element types -> numpy dtype, so big arrays (token types, scores) decode in one call.
_ARRAY_DTYPES = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4", GGUFValueType.FLOAT32: "<f4", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8",
}
# Tensor types stored as plain numpy arrays of their element type (everything else is raw block bytes).
_PLAIN_DTYPES = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.BF16: np.uint16,  # numpy has no bfloat16: the raw 16-bit words
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32, GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor as stored: GGUF name, type, numpy-order shape ((rows, cols) = (out, in)) and memory-mapped data.

    data is uint8 [*shape[:-1], bytes_per_row] for block-quantized types, the float array for F32/F16, and the raw
    uint16 words for BF16 (numpy has no bfloat16). offset is the absolute file offset of the first data byte.
    """

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray
    offset: int = 0

    @property
    def num_elements(self) -> int:
        """Number of weights (not bytes)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies in the file."""
        return int(self.data.nbytes)

    @property
    def is_quantized(self) -> bool:
        """True for block-quantized types (Q4_K, Q8_0, ...)."""
        return self.qtype not in _PLAIN_DTYPES


class _Cursor:
    """Sequential little-endian reads over the mapped header, raising ModelFileError when the file ends early."""

    def __init__(self, path: Path, buf: memoryview):
        self.path, self.buf, self.pos = path, buf, 0

    def _need(self, size: int, what: str) -> int:
        start = self.pos
        if size < 0 or start + size > len(self.buf):
            raise ModelFileError(self.path, f"truncated header: {what} needs {size} bytes at offset {start}, "
                                            f"file has {len(self.buf)}")
        self.pos = start + size
        return start

    def scalar(self, vtype: GGUFValueType, what: str) -> Any:
        """One scalar of vtype (float32 as its shortest decimal)."""
        fmt = _SCALAR_FORMATS[vtype]
        start = self._need(struct.calcsize(fmt), what)
        value = struct.unpack_from(fmt, self.buf, start)[0]
        if vtype == GGUFValueType.FLOAT32:
            # The shortest decimal that is the same float32 (1e-06, not 9.99999997e-07): no loss for f32 math.
            value = float(str(np.float32(value)))
        return value

    def u32(self, what: str) -> int:
        """One uint32."""
        return self.scalar(GGUFValueType.UINT32, what)

    def u64(self, what: str) -> int:
        """One uint64."""
        return self.scalar(GGUFValueType.UINT64, what)

    def string(self, what: str) -> str:
        """A length-prefixed UTF-8 string."""
        size = self.u64(what)
        start = self._need(size, what)
        try:
            return str(self.buf[start:start + size], "utf-8")
        except UnicodeDecodeError as exc:
            raise ModelFileError(self.path, f"{what} is not valid UTF-8 ({exc.reason})") from None

    def value_type(self, what: str) -> GGUFValueType:
        """A uint32 GGUF value type tag."""
        raw = self.u32(what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise ModelFileError(self.path, f"{what} has unknown value type {raw}") from None

    def value(self, vtype: GGUFValueType, what: str) -> Any:
        """One metadata value of vtype as plain Python."""
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype == GGUFValueType.ARRAY:
            return self.array(what)
        return self.scalar(vtype, what)

    def array(self, what: str) -> list[Any]:
        """A typed array as a list (numeric arrays decoded in one numpy call)."""
        item_type = self.value_type(what)
        count = self.u64(what)
        dtype = _ARRAY_DTYPES.get(item_type)
        if dtype is not None:
            itemsize = np.dtype(dtype).itemsize
            start = self._need(count * itemsize, what)
            return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).tolist()
        if count > len(self.buf) - self.pos:  # every element takes at least one byte
            raise ModelFileError(self.path, f"truncated header: {what} claims {count} elements")
        return [self.value(item_type, what) for _ in range(count)]


def _align(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


# A metadata value's GGUF type, and for arrays the element type (None otherwise).
ValueType = tuple[GGUFValueType, GGUFValueType | None]


def _read_kv(cur: _Cursor, count: int) -> tuple[dict[str, Any], dict[str, ValueType]]:
    metadata: dict[str, Any] = {}
    types: dict[str, ValueType] = {}
    for index in range(count):
        key = cur.string(f"metadata key #{index}")
        vtype = cur.value_type(f"metadata {key!r}")
        item_type = None
        if vtype == GGUFValueType.ARRAY:  # peek at the element type, then read the array from its start
            start = cur.pos
            item_type = cur.value_type(f"metadata {key!r}")
            cur.pos = start
        metadata[key] = cur.value(vtype, f"metadata {key!r}")
        types[key] = (vtype, item_type)
    return metadata, types


def _read_tensor_index(cur: _Cursor, count: int) -> list[tuple[str, GGMLQuantizationType, tuple[int, ...], int]]:
    """Tensor infos in file order: (name, type, numpy-order shape, offset relative to the data section)."""
    infos, seen = [], set()
    for index in range(count):
        name = cur.string(f"tensor name #{index}")
        num_dims = cur.u32(f"tensor {name!r} dimension count")
        if not 1 <= num_dims <= MAX_DIMS:
            raise ModelFileError(cur.path, f"has {num_dims} dimensions (1 to {MAX_DIMS} allowed)", tensor=name)
        dims = [cur.u64(f"tensor {name!r} dimensions") for _ in range(num_dims)]
        raw_type = cur.u32(f"tensor {name!r} type")
        offset = cur.u64(f"tensor {name!r} offset")
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise UnsupportedModelError(cur.path, f"unknown tensor type {raw_type}", tensor=name) from None
        if name in seen:
            raise ModelFileError(cur.path, "appears twice in the tensor index", tensor=name)
        seen.add(name)
        infos.append((name, qtype, tuple(reversed(dims)), offset))  # GGUF stores ne[0] (the row length) first
    return infos


def _tensor_view(path: Path, mm: np.ndarray, name: str, qtype: GGMLQuantizationType, shape: tuple[int, ...],
                 offset: int) -> TensorInfo:
    """Checks one tensor against the file (block multiple, bounds) and returns its zero-copy view."""
    if qtype not in GGML_QUANT_SIZES:
        raise UnsupportedModelError(path, f"tensor type {qtype.name} has no known block size", tensor=name)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if any(d == 0 for d in shape) or shape[-1] % block_size:
        raise ModelFileError(path, f"shape {shape} does not fit {qtype.name} blocks of {block_size}", tensor=name)
    num_rows = math.prod(shape[:-1])  # Python ints: absurd dimensions cannot wrap around
    row_bytes = shape[-1] // block_size * type_size
    nbytes = num_rows * row_bytes
    if offset + nbytes > mm.size:
        raise ModelFileError(path, f"data runs past the end of the file (bytes {offset}..{offset + nbytes}, "
                                   f"file has {mm.size}): truncated file?", tensor=name)
    raw = mm[offset:offset + nbytes]
    plain = _PLAIN_DTYPES.get(qtype)
    data = raw.view(plain).reshape(shape) if plain is not None else raw.reshape(*shape[:-1], row_bytes)
    return TensorInfo(name=name, qtype=qtype, shape=shape, data=data, offset=offset)


class GGUFFile:
    """An open GGUF file: metadata, tensor index and memory-mapped tensor data."""

    def __init__(self, path: Path, version: int, metadata: dict[str, Any], value_types: dict[str, ValueType],
                 tensors: dict[str, TensorInfo], alignment: int, data_offset: int):
        self.path, self.version, self.alignment, self.data_offset = path, version, alignment, data_offset
        self.metadata, self.value_types, self.tensors = metadata, value_types, tensors
        arch = metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise ModelFileError(path, "metadata key 'general.architecture' is missing")
        self.arch: str = arch

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        """Opens and indexes a GGUF file; raises ModelFileError (corrupt) or UnsupportedModelError (unknown type)."""
        path = Path(path)
        try:
            mm = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:  # ValueError: numpy refuses to map an empty file
            raise ModelFileError(path, f"cannot be read ({exc})") from None
        return cls._parse(path, mm)

    @classmethod
    def from_bytes(cls, data: bytes, label: str | Path) -> GGUFFile:
        """Parses a GGUF image held in memory (e.g. a decompressed asset); label stands in for the path in errors."""
        return cls._parse(Path(label), np.frombuffer(data, dtype=np.uint8))

    @classmethod
    def _parse(cls, path: Path, mm: np.ndarray) -> GGUFFile:
        cur = _Cursor(path, memoryview(mm))
        magic = cur.scalar(GGUFValueType.UINT32, "magic")
        if magic != GGUF_MAGIC:
            raise ModelFileError(path, f"not a GGUF file (magic {magic:#010x}, expected {GGUF_MAGIC:#010x})")
        version = cur.u32("version")
        if version not in SUPPORTED_VERSIONS:
            hint = " (a big-endian file?)" if version & 0xFFFF == 0 else ""
            raise UnsupportedModelError(path, f"GGUF version {version} is not supported{hint}")
        num_tensors, num_kv = cur.u64("tensor count"), cur.u64("metadata count")
        metadata, value_types = _read_kv(cur, num_kv)
        index = _read_tensor_index(cur, num_tensors)
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ModelFileError(path, f"general.alignment {alignment!r} is not a power of two")
        data_offset = _align(cur.pos, alignment)
        tensors = {}
        for name, qtype, shape, rel_offset in index:
            if rel_offset % alignment:
                raise ModelFileError(path, f"data offset {rel_offset} is not aligned to {alignment}", tensor=name)
            tensors[name] = _tensor_view(path, mm, name, qtype, shape, data_offset + rel_offset)
        return cls(path, version, metadata, value_types, tensors, alignment, data_offset)

    def get(self, key: str, default: Any = None) -> Any:
        """Metadata value for key, or default."""
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """Metadata value for f"{arch}.{suffix}", or default."""
        return self.metadata.get(f"{self.arch}.{suffix}", default)

    def require(self, key: str) -> Any:
        """Metadata value for key; ModelFileError naming the key when it is missing."""
        if key not in self.metadata:
            raise ModelFileError(self.path, f"metadata key {key!r} is missing")
        return self.metadata[key]

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called name; ModelFileError naming it when it is missing."""
        info = self.tensors.get(name)
        if info is None:
            raise ModelFileError(self.path, "is missing", tensor=name)
        return info

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor called name as float32 of its numpy shape."""
        # quants imports nothing from here; keep the header module light
        from engine.gguf.quants import QuantTypeError, dequantize

        info = self.tensor(name)
        try:
            return dequantize(info.data, info.qtype, info.shape)
        except QuantTypeError as exc:  # a type gguf knows the size of but we do not decode (Q2_K, IQ*, ...)
            raise UnsupportedModelError(self.path, str(exc), tensor=name) from None

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, arch={self.arch!r}, tensors={len(self.tensors)})"
