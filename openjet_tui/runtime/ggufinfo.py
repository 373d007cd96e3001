"""What engine selection needs from a GGUF file's header: architecture, shape, tensor names and types.

Reads only the header through mmap (arrays are skipped, not decoded), so a 17 GB file answers in milliseconds.
The app speaks to the engine only over HTTP, so this small reader is the app's own.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from openjet_tui.runtime.errors import RuntimeSetupError

GGUF_MAGIC = b"GGUF"
# GGUF value types -> struct format of one scalar; 8 = string, 9 = array.
SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
# ggml type ids of the quant formats a Q4_K_M mix carries (names as ggml spells them).
GGML_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K",
                   11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 30: "BF16"}


class GGUFHeaderError(RuntimeSetupError):
    """A file that is not a readable GGUF model."""


@dataclass(slots=True)
class TensorEntry:
    """One tensor's name, shape (ggml order: innermost first) and type."""

    name: str
    shape: tuple[int, ...]
    type_name: str


@dataclass(slots=True)
class ModelFileInfo:
    """The header facts of a GGUF model file."""

    path: Path
    arch: str
    name: str
    metadata: dict[str, object] = field(default_factory=dict)
    tensors: dict[str, TensorEntry] = field(default_factory=dict)
    size: int = 0

    def meta_int(self, key: str, default: int = 0) -> int:
        """An integer metadata value under the architecture's prefix (e.g. 'block_count')."""
        value = self.metadata.get(f"{self.arch}.{key}", default)
        return int(value) if isinstance(value, (int, float)) else default

    @property
    def num_layers(self) -> int:
        """Transformer blocks, MTP layers included (qwen35 counts them in block_count)."""
        return self.meta_int("block_count")

    def kv_bytes_per_token(self) -> int:
        """f16 K and V bytes per token over the attention layers (an estimate for the VRAM check)."""
        num_heads = max(1, self.meta_int("attention.head_count", 1))
        num_kv_heads = self.meta_int("attention.head_count_kv", num_heads)
        head_dim = self.meta_int("embedding_length") // num_heads
        key_length = self.meta_int("attention.key_length", head_dim)
        value_length = self.meta_int("attention.value_length", head_dim)
        interval = self.meta_int("full_attention_interval", 1)  # hybrid models: one attention layer in N
        num_attention = -(-self.num_layers // interval)
        return num_attention * num_kv_heads * (key_length + value_length) * 2


class _Cursor:
    """Little-endian reads over the mapped header."""

    def __init__(self, data: mmap.mmap):
        self.data, self.pos = data, 0

    def scalar(self, fmt: str) -> object:
        """One little-endian value of struct format `fmt`."""
        (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        """A GGUF string: u64 length, then UTF-8 bytes."""
        length = int(self.scalar("Q"))  # type: ignore[arg-type]
        raw = self.data[self.pos: self.pos + length]
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def value(self, type_id: int) -> object:
        """A metadata value of GGUF type `type_id` (arrays are skipped and stand for their length)."""
        if type_id == STRING:
            return self.string()
        if type_id == ARRAY:
            return self.skip_array()
        return self.scalar(SCALAR_FORMATS[type_id])

    def skip_array(self) -> int:
        """Step over an array; returns its length (the value we keep for arrays)."""
        item_type, count = int(self.scalar("I")), int(self.scalar("Q"))  # type: ignore[arg-type]
        if item_type in SCALAR_FORMATS:
            self.pos += count * struct.calcsize(SCALAR_FORMATS[item_type])
        else:
            for _ in range(count):
                self.value(item_type)
        return count


def _parse(path: Path, data: mmap.mmap) -> ModelFileInfo:
    cursor = _Cursor(data)
    if data[:4] != GGUF_MAGIC:
        raise GGUFHeaderError(f"{path}: not a GGUF file (magic {bytes(data[:4])!r})")
    cursor.pos = 4
    version, num_tensors, num_kv = cursor.scalar("I"), cursor.scalar("Q"), cursor.scalar("Q")
    if version not in (2, 3):
        raise GGUFHeaderError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    metadata: dict[str, object] = {}
    for _ in range(int(num_kv)):  # type: ignore[arg-type]
        key, type_id = cursor.string(), int(cursor.scalar("I"))  # type: ignore[arg-type]
        metadata[key] = cursor.value(type_id)
    tensors = {}
    for _ in range(int(num_tensors)):  # type: ignore[arg-type]
        name, num_dims = cursor.string(), int(cursor.scalar("I"))  # type: ignore[arg-type]
        shape = tuple(int(cursor.scalar("Q")) for _ in range(num_dims))  # type: ignore[arg-type]
        type_id = int(cursor.scalar("I"))  # type: ignore[arg-type]
        cursor.scalar("Q")  # data offset: not needed here
        tensors[name] = TensorEntry(name, shape, GGML_TYPE_NAMES.get(type_id, f"type{type_id}"))
    arch = str(metadata.get("general.architecture", ""))
    return ModelFileInfo(path=path, arch=arch, name=str(metadata.get("general.name", "")), metadata=metadata,
                         tensors=tensors, size=path.stat().st_size)


def read_model_info(path: Path) -> ModelFileInfo:
    """Parse the header of a GGUF file; GGUFHeaderError names the file and the problem."""
    try:
        with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(path, data)
    except (OSError, ValueError) as error:  # unreadable, empty (mmap of 0 bytes) or not a file
        raise GGUFHeaderError(f"{path}: cannot read the GGUF header: {error}") from None
    except (struct.error, KeyError, IndexError) as error:
        raise GGUFHeaderError(f"{path}: truncated or corrupt GGUF header ({error})") from None
