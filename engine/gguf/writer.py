"""Streaming GGUF writer: header through gguf.GGUFWriter, then tensor data appended chunk by chunk, so a file of any
size is written without holding its tensors in memory. The file appears under its final name only when complete."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from engine.gguf.quants import row_bytes
from engine.gguf.reader import GGUFFile


@dataclass(slots=True)
class PlannedTensor:
    """A tensor declared in the header: name, numpy shape, type and size in bytes."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    nbytes: int


class GGUFStreamWriter:
    """Declare metadata and tensors, begin(), write each tensor's bytes in declaration order, finish().

    Writes go to "<name>.partial" and are renamed into place by finish(); abort() (or leaving a with-block on an
    exception) removes the partial file.
    """

    def __init__(self, path: str | Path, arch: str):
        self.path = Path(path)
        self.partial_path = self.path.with_name(self.path.name + ".partial")
        self._writer = GGUFWriter(self.partial_path, arch)
        self._plan: list[PlannedTensor] = []
        self._index = 0  # tensor being written
        self._filled = 0  # bytes of it written so far
        self._started = False

    def add_metadata(self, key: str, value: Any, vtype: GGUFValueType,
                     sub_type: GGUFValueType | None = None) -> None:
        """Adds one metadata key with an explicit GGUF type (arrays: vtype ARRAY and the element sub_type)."""
        if vtype == GGUFValueType.ARRAY and sub_type is None:
            sub_type = GGUFValueType.get_type(value[0])
        self._writer.add_key_value(key, value, vtype, sub_type=sub_type)

    def add_tensor(self, name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType) -> PlannedTensor:
        """Declares a tensor of numpy shape (rows, cols); its bytes must follow in declaration order."""
        if self._started:
            raise RuntimeError("add_tensor after begin()")
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        planned = PlannedTensor(name, tuple(shape), qtype, rows * row_bytes(qtype, shape[-1]))
        # Passing a non-uint8 dtype with raw_dtype makes GGUFWriter take shape as element counts.
        self._writer.add_tensor_info(name, shape, np.dtype(np.float32), planned.nbytes, raw_dtype=qtype)
        self._plan.append(planned)
        return planned

    @property
    def planned(self) -> list[PlannedTensor]:
        """The declared tensors, in file order."""
        return list(self._plan)

    def begin(self) -> None:
        """Writes header, metadata and tensor index; tensor data follows through write()."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer.write_header_to_file()
        self._writer.write_kv_data_to_file()
        self._writer.write_ti_data_to_file()
        self._started = True

    @property
    def _fout(self) -> BinaryIO:
        assert self._writer.fout is not None and len(self._writer.fout) == 1
        return self._writer.fout[0]

    def write(self, data: np.ndarray) -> None:
        """Appends bytes (any dtype, C order) to the current tensor, moving to the next when it is full."""
        if not self._started:
            raise RuntimeError("write before begin()")
        if self._index >= len(self._plan):
            raise ValueError("more tensor data than declared")
        current = self._plan[self._index]
        data = np.ascontiguousarray(data)
        if self._filled + data.nbytes > current.nbytes:
            raise ValueError(f"{current.name}: {self._filled + data.nbytes} bytes written, {current.nbytes} declared")
        fout = self._fout
        if self._filled == 0:
            self._writer.write_padding(fout, fout.tell())  # each tensor starts aligned
        data.tofile(fout)
        self._filled += data.nbytes
        if self._filled == current.nbytes:
            self._index, self._filled = self._index + 1, 0

    def finish(self) -> Path:
        """Checks every declared byte was written, closes and renames the file into place."""
        if self._index != len(self._plan):
            missing = self._plan[self._index].name if self._index < len(self._plan) else "?"
            raise ValueError(f"tensor data incomplete: next expected tensor is {missing}")
        self._writer.write_padding(self._fout, self._fout.tell())
        self._writer.close()
        os.replace(self.partial_path, self.path)
        return self.path

    def abort(self) -> None:
        """Closes and deletes the partial file."""
        self._writer.close()
        self.partial_path.unlink(missing_ok=True)

    def __enter__(self) -> GGUFStreamWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is not None:
            self.abort()


def rewrite(src: GGUFFile, dst: str | Path, *, drop_tensors: tuple[str, ...] = (),
            set_tensors: dict[str, tuple[GGMLQuantizationType, tuple[int, ...], np.ndarray]] | None = None,
            set_metadata: dict[str, tuple[Any, GGUFValueType]] | None = None,
            drop_metadata: tuple[str, ...] = ()) -> Path:
    """Copies an open GGUFFile to dst with tensors dropped / replaced / added and metadata changed.

    set_tensors maps a name to (type, numpy shape, stored bytes); set_metadata maps a key to (value, type).
    """
    set_tensors, set_metadata = set_tensors or {}, set_metadata or {}
    writer = GGUFStreamWriter(dst, src.arch if "general.architecture" not in set_metadata
                              else set_metadata["general.architecture"][0])
    with writer:
        for key, value in src.metadata.items():
            if key in drop_metadata or key in set_metadata or key == "general.architecture":
                continue
            vtype, sub_type = src.value_types[key]
            writer.add_metadata(key, value, vtype, sub_type)
        for key, (value, vtype) in set_metadata.items():
            if key != "general.architecture":
                writer.add_metadata(key, value, vtype)
        tensors = {name: (t.qtype, t.shape, t.data) for name, t in src.tensors.items() if name not in drop_tensors}
        tensors.update(set_tensors)
        for name, (qtype, shape, _) in tensors.items():
            writer.add_tensor(name, shape, qtype)
        writer.begin()
        for _, _, data in tensors.values():
            writer.write(data)
        return writer.finish()
