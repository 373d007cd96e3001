"""The vocabulary a GGUF file describes: token texts, their kinds, merges, special ids and end-of-generation ids.

Everything here follows llama.cpp's reading of the same keys, including its name-based fix-ups: tokens such as
`<|im_end|>` or `<|endoftext|>` end generation and count as control tokens even when the file marks them normal,
and FIM padding/separator tokens end generation too. Matching that is what makes our ids, stop behaviour and
special-token handling equal llama.cpp's on the same file.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gguf import TokenType

from engine.errors import ModelFileError, UnsupportedModelError
from engine.text.pretokenizers import PreTokenizer, pre_tokenizer_for

_KEY = "tokenizer.ggml."


class TokenAttr(enum.IntFlag):
    """What kind of token an id is (llama.cpp's token attributes; one token may carry several).

    Vocab.attrs stores these as plain ints: IntFlag arithmetic is too slow for 250K-token loops.
    """

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 4
    USER_DEFINED = 8
    UNUSED = 16
    BYTE = 32


_ATTR_OF_TYPE = {
    int(TokenType.NORMAL): int(TokenAttr.NORMAL), int(TokenType.UNKNOWN): int(TokenAttr.UNKNOWN),
    int(TokenType.CONTROL): int(TokenAttr.CONTROL), int(TokenType.USER_DEFINED): int(TokenAttr.USER_DEFINED),
    int(TokenType.UNUSED): int(TokenAttr.UNUSED), int(TokenType.BYTE): int(TokenAttr.BYTE),
}
_CONTROL = int(TokenAttr.CONTROL)

# Texts that llama.cpp recognises as end-of-turn (the first one present becomes eot_id) ...
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
             "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
# ... and as end-of-generation: sampling one of these stops the sequence.
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
})
# Fill-in-the-middle tokens by text: role -> candidates. pad, repo and file separator also end generation.
FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# Special-id keys, with the deprecated spellings of the FIM ones.
_ID_KEYS = {
    "bos": ("bos_token_id",), "eos": ("eos_token_id",), "eot": ("eot_token_id",), "eom": ("eom_token_id",),
    "unk": ("unknown_token_id",), "pad": ("padding_token_id",),
    "fim_pre": ("fim_pre_token_id", "prefix_token_id"), "fim_suf": ("fim_suf_token_id", "suffix_token_id"),
    "fim_mid": ("fim_mid_token_id", "middle_token_id"), "fim_pad": ("fim_pad_token_id",),
    "fim_rep": ("fim_rep_token_id",), "fim_sep": ("fim_sep_token_id",),
}


@dataclass(slots=True)
class Vocab:
    """A parsed byte-level BPE vocabulary. special_ids maps a role (bos, eos, eot, fim_pre, ...) to its id."""

    pre: PreTokenizer
    tokens: list[str]
    attrs: list[int]  # TokenAttr bits per id
    merges: list[tuple[str, str]]
    special_ids: dict[str, int]
    add_bos: bool
    add_eos: bool
    eog_ids: frozenset[int]

    @property
    def num_tokens(self) -> int:
        """Vocabulary size (the model's logit count may be larger when the embedding is padded)."""
        return len(self.tokens)


def _require_str_list(md: Mapping[str, Any], key: str, path: object) -> list[str]:
    value = md.get(_KEY + key)
    if value is None:
        raise ModelFileError(path, f"metadata has no {_KEY}{key}: not a model with a tokenizer")
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ModelFileError(path, f"{_KEY}{key} must be a list of strings")
    return value


def _attrs(md: Mapping[str, Any], num_tokens: int, path: object) -> list[int]:
    types = md.get(_KEY + "token_type")
    if types is None:  # optional in GGUF: every token is then normal
        return [int(TokenAttr.NORMAL)] * num_tokens
    if not isinstance(types, list) or len(types) != num_tokens:
        found = len(types) if isinstance(types, list) else type(types).__name__
        raise ModelFileError(path, f"{_KEY}token_type has {found} entries for {num_tokens} tokens")
    try:
        return [_ATTR_OF_TYPE[t] for t in types]
    except (KeyError, TypeError):
        bad = next(t for t in types if not isinstance(t, int) or t not in _ATTR_OF_TYPE)
        raise ModelFileError(path, f"{_KEY}token_type has unknown token type {bad!r}") from None


def _merges(md: Mapping[str, Any], path: object) -> list[tuple[str, str]]:
    merges = []
    for index, merge in enumerate(_require_str_list(md, "merges", path)):
        # llama.cpp splits at the first space after the first character, so a merge may start with a space.
        cut = merge.find(" ", 1)
        if cut < 0:
            raise ModelFileError(path, f"{_KEY}merges[{index}] = {merge!r} is not two tokens separated by a space")
        merges.append((merge[:cut], merge[cut + 1:]))
    return merges


# llama.cpp's defaults for BPE vocabularies whose file names no BOS/EOS (GPT-2 heritage); they matter because the
# EOS id also ends generation.
_DEFAULT_IDS = {"bos": 11, "eos": 11}


def _special_ids(md: Mapping[str, Any], num_tokens: int, path: object) -> dict[str, int]:
    ids = {role: i for role, i in _DEFAULT_IDS.items() if i < num_tokens}
    given: set[str] = set()
    for role, keys in _ID_KEYS.items():
        for key in keys:
            value = md.get(_KEY + key)
            if value is None or role in given:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < num_tokens:
                raise ModelFileError(path, f"{_KEY}{key} = {value!r} is not a token id (vocabulary has "
                                           f"{num_tokens} tokens)")
            ids[role] = value
            given.add(role)
    return ids


def _detect_by_text(tokens: list[str], attrs: list[int], ids: dict[str, int]) -> set[int]:
    """Fills eot and FIM roles from token texts and returns the end-of-generation ids, as llama.cpp does."""
    index = {text: i for i, text in enumerate(tokens)}
    roles = {"eot": EOT_TEXTS, **FIM_TEXTS}
    for role, texts in roles.items():
        found = next((index[t] for t in texts if t in index), None) if role not in ids else None
        if found is not None:
            ids[role] = found
            attrs[found] |= _CONTROL
    eog = {ids[role] for role in ("fim_pad", "fim_rep", "fim_sep") if role in ids}
    for text in EOG_TEXTS & index.keys():
        eog.add(index[text])
        attrs[index[text]] |= _CONTROL
    eog.update(ids[role] for role in ("eos", "eot", "eom") if role in ids)
    _apply_eog_exceptions(tokens, attrs, eog)
    return eog


def _apply_eog_exceptions(tokens: list[str], attrs: list[int], eog: set[int]) -> None:
    """llama.cpp's two exceptions: harmony-style `<|end|>` and a normal `</s>` do not end generation."""
    by_text = {tokens[i]: i for i in eog}
    has = by_text.keys()
    if "<|end|>" in has and ({"<|return|>", "<|call|>"} <= has or {"<|calls|>", "<|flush|>"} <= has):
        eog.discard(by_text["<|end|>"])
        attrs[by_text["<|end|>"]] = int(TokenAttr.USER_DEFINED)
    if "</s>" in has and ("<|tool_response>" in has or "<|plamo:eos|>" in has):
        eog.discard(by_text["</s>"])
        attrs[by_text["</s>"]] = int(TokenAttr.NORMAL)


def _flag(md: Mapping[str, Any], key: str, default: bool, path: object) -> bool:
    value = md.get(_KEY + key, default)
    if not isinstance(value, bool):
        raise ModelFileError(path, f"{_KEY}{key} = {value!r} must be a boolean")
    return value


def parse_vocab(md: Mapping[str, Any], path: object = "<metadata>") -> Vocab:
    """Reads and checks the tokenizer.ggml.* keys of a GGUF metadata dict (ModelFileError names what is wrong)."""
    model = md.get(_KEY + "model")
    if model != "gpt2":
        what = "no tokenizer.ggml.model" if model is None else f"tokenizer.ggml.model={model!r}"
        hint = " (SentencePiece vocabularies are not supported)" if model == "llama" else ""
        raise UnsupportedModelError(path, f"{what}: only byte-level BPE ('gpt2') tokenizers are supported{hint}")
    pre = pre_tokenizer_for(md.get(_KEY + "pre"), path)
    tokens = _require_str_list(md, "tokens", path)
    if not tokens:
        raise ModelFileError(path, f"{_KEY}tokens is empty")
    attrs = _attrs(md, len(tokens), path)
    ids = _special_ids(md, len(tokens), path)
    eog = _detect_by_text(tokens, attrs, ids)
    add_bos, add_eos = _flag(md, "add_bos_token", pre.add_bos, path), _flag(md, "add_eos_token", False, path)
    for role, wanted in (("bos", add_bos), ("eos", add_eos)):
        if wanted and role not in ids:
            raise ModelFileError(path, f"{_KEY}add_{role}_token is true but there is no {_KEY}{role}_token_id")
    return Vocab(pre=pre, tokens=tokens, attrs=attrs, merges=_merges(md, path), special_ids=ids, add_bos=add_bos,
                 add_eos=add_eos, eog_ids=frozenset(eog))
