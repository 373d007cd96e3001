"""Pre-tokenizer rules for byte-level BPE vocabularies, keyed by GGUF's `tokenizer.ggml.pre`.

A BPE vocabulary is only half a tokenizer: text is first split into words by one or more regular expressions, and
BPE merges never cross a word boundary. Each `pre` value names the split its model was trained with; guessing a
different one gives plausible but wrong ids, so an unknown value is refused.

The expressions below are the ones llama.cpp applies for each `pre` value (its llama-vocab.cpp documents them), with
the case-insensitive contraction group `(?i:'s|'t|...)` spelled out as ASCII classes the way llama.cpp does. Several
expressions apply in sequence: each splits the pieces the previous one produced.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import UnsupportedModelError

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

# GPT-2's split. llama.cpp drops the final `|\s+` alternative; the lone whitespace it would match is isolated as an
# unmatched span anyway, so the result is the same.
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

# Llama 3: digits in groups of up to three.
LLAMA3_REGEX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")

# Qwen2 / Qwen2.5 / Qwen3: like Llama 3 but every digit is its own word.
QWEN2_REGEX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")

# Qwen3.5 and later: letter runs also take combining marks (\p{M}).
QWEN35_REGEX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# llama.cpp's fallback for BPE files without a `pre` value (or with "default").
DEFAULT_REGEXES = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    """How one family splits text before BPE.

    regexes: applied in order, each isolating its matches within the previous pieces.
    ignore_merges: a word that is already a vocabulary entry becomes that token without running merges (Llama 3).
    add_bos: whether a BOS token is prepended by default; `tokenizer.ggml.add_bos_token` overrides it.
    """

    name: str
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False


_GPT2 = PreTokenizer("gpt2", (GPT2_REGEX,))
_LLAMA3 = PreTokenizer("llama3", (LLAMA3_REGEX,), ignore_merges=True, add_bos=True)
_QWEN2 = PreTokenizer("qwen2", (QWEN2_REGEX,))
_QWEN35 = PreTokenizer("qwen35", (QWEN35_REGEX,))
_DEFAULT = PreTokenizer("default", DEFAULT_REGEXES)
_STARCODER = PreTokenizer("starcoder", (r"\p{N}", GPT2_REGEX))

# `tokenizer.ggml.pre` value -> rule, with the aliases llama.cpp accepts for the same split.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _DEFAULT,
    "gpt-2": _GPT2, "phi-2": _GPT2, "mpt": _GPT2, "olmo": _GPT2, "jais": _GPT2, "exaone4": _GPT2,
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "falcon3": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2, "megrez": _QWEN2, "stablelm2": _QWEN2,
    "qwen35": _QWEN35,
    "starcoder": _STARCODER, "smollm": _STARCODER, "refact": _STARCODER, "codeshell": _STARCODER,
}


def pre_tokenizer_for(pre: str | None, path: object) -> PreTokenizer:
    """The split rule for a `tokenizer.ggml.pre` value; None (key absent) means llama.cpp's default split."""
    if pre is None:
        return _DEFAULT
    rule = PRE_TOKENIZERS.get(pre)
    if rule is None:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise UnsupportedModelError(path, f"unknown pre-tokenizer tokenizer.ggml.pre={pre!r}; supported: {known}")
    return rule
