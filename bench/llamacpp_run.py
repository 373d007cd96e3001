"""Running llama.cpp for the comparison: tokenize with llama-tokenize, logits and greedy tokens with our helper, and
an F32 copy of a GGUF file (the "exact" mode: the same weight values, so llama.cpp computes in float32 throughout
instead of quantizing activations to 8 bits for its quantized matmuls).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from bench.llamacpp_build import LlamaCpp

TIMEOUT_S = 1800


class LlamaCppRunError(RuntimeError):
    """A llama.cpp process failed; the message carries its stderr."""


def _run(cmd: list[str], what: str) -> str:
    """Run one llama.cpp process; its stdout, or LlamaCppRunError with stderr's last lines."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-15:])
        raise LlamaCppRunError(f"llama.cpp failed to {what} (exit {done.returncode}):\n{tail}")
    return done.stdout


def tokenize(llama: LlamaCpp, model: Path, text: str) -> list[int]:
    """llama.cpp's token ids of text: special tokens parsed, BOS as the model asks, escapes not processed."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "text.txt"
        path.write_bytes(text.encode("utf-8"))
        out = _run([str(llama.tokenize_bin), "-m", str(model), "-f", str(path), "--ids", "--no-escape",
                    "--log-disable"], f"tokenize with {model.name}")
    lines = [line for line in out.splitlines() if line.startswith("[")]
    if not lines:
        raise LlamaCppRunError(f"llama-tokenize printed no id list: {out[-500:]!r}")
    return [int(i) for i in json.loads(lines[-1])]


def logits(llama: LlamaCpp, model: Path, ids: list[int], exact: bool = False) -> np.ndarray:
    """llama.cpp's logits at every position of ids, decoded in one batch: float32 [T, V]."""
    with tempfile.TemporaryDirectory() as tmp:
        ids_path, out_path = Path(tmp) / "ids.txt", Path(tmp) / "logits.bin"
        ids_path.write_text(" ".join(map(str, ids)))
        cmd = [str(llama.helper), "logits", str(model), str(ids_path), str(out_path)] + (["exact"] if exact else [])
        _run(cmd, f"compute logits with {model.name}")
        num_tokens, vocab = (int(v) for v in np.fromfile(out_path, dtype=np.int32, count=2))
        if num_tokens != len(ids):
            raise LlamaCppRunError(f"helper wrote {num_tokens} rows of logits for {len(ids)} tokens")
        return np.fromfile(out_path, dtype=np.float32, offset=8).reshape(num_tokens, vocab)


def greedy(llama: LlamaCpp, model: Path, ids: list[int], max_new: int) -> list[int]:
    """llama.cpp's greedy continuation of ids (default context): up to max_new ids, ending after an EOG token."""
    with tempfile.TemporaryDirectory() as tmp:
        ids_path, out_path = Path(tmp) / "ids.txt", Path(tmp) / "tokens.txt"
        ids_path.write_text(" ".join(map(str, ids)))
        _run([str(llama.helper), "greedy", str(model), str(ids_path), str(max_new), str(out_path)],
             f"generate with {model.name}")
        return [int(line) for line in out_path.read_text().split()]


def write_f32_copy(src: Path, dst: Path) -> Path:
    """dst: src with every tensor stored as F32 (values bit-identical to src's dequantized ones), metadata kept."""
    from engine.gguf.reader import GGUFFile
    from engine.gguf.writer import GGUFStreamWriter

    f = GGUFFile.open(src)
    with GGUFStreamWriter(dst, f.arch) as writer:
        for key, value in f.metadata.items():
            if key == "general.architecture":
                continue  # the writer emits it itself
            vtype, sub_type = f.value_types[key]
            writer.add_metadata(key, 0 if key == "general.file_type" else value, vtype, sub_type)  # 0 = ALL_F32
        for name, info in f.tensors.items():
            writer.add_tensor(name, info.shape, GGMLQuantizationType.F32)
        writer.begin()
        for name, info in f.tensors.items():
            writer.write(f.dequantize(name).astype(np.float32).reshape(-1, info.shape[-1]))
        return writer.finish()
