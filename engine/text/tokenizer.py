"""The model's tokenizer, rebuilt from GGUF metadata so that ids equal llama.cpp's on the same file.

Encoding runs in two steps, exactly as llama.cpp does them:
1. Special-token partition: control, user-defined and unknown tokens are cut out of the text whole, longest token
   text first. User-defined tokens (e.g. Qwen's `<tool_call>`) are always cut out; control tokens only when
   parse_special is true, otherwise their text is tokenized like any other text.
2. Byte-level BPE on each remaining piece: the pre-tokenizer regexes of `tokenizer.ggml.pre` split it into words,
   then merges apply within each word (HF `tokenizers` runs this part; no normalizer, since llama.cpp applies none).

Decoding maps each id to its bytes (byte-level alphabet undone; control tokens as their text unless skipped) and
joins them, so decode(encode(text)) == text for any text.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from engine.errors import ModelFileError
from engine.text.vocab import TokenAttr, Vocab, parse_vocab

if TYPE_CHECKING:  # the reader is only a type here: these objects also build from plain metadata
    from engine.gguf.reader import GGUFFile

_SPECIAL = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)  # hidden by skip_special, plain text without parse_special
_PARTITIONED = _SPECIAL | int(TokenAttr.USER_DEFINED)  # cut out of the text before BPE
_NORMAL, _BYTE = int(TokenAttr.NORMAL), int(TokenAttr.BYTE)
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[int, int]:
    """GPT-2's byte -> printable character map (bytes that print stay themselves, the rest move above 255)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = 256 + extra
            extra += 1
    return mapping


# character code -> the byte it stands for, as a str.translate table (byte b becomes chr(b), then latin-1 encodes)
_UNBYTE = {char: chr(byte) for byte, char in _byte_level_alphabet().items()}


def _byte_level_decode(text: str) -> bytes:
    """The bytes a byte-level BPE token stands for; characters outside the alphabet keep their UTF-8 bytes."""
    raw = text.translate(_UNBYTE)
    try:
        return raw.encode("latin-1")
    except UnicodeEncodeError:
        return b"".join(c.encode("latin-1") if ord(c) < 256 else c.encode("utf-8") for c in raw)


def _token_bytes(text: str, attr: int) -> bytes:
    """A token's piece with special tokens shown (llama.cpp's token_to_piece with special=true)."""
    if attr & _PARTITIONED:
        return text.encode("utf-8")
    if attr & _NORMAL:
        return _byte_level_decode(text)
    if attr & _BYTE and (match := _BYTE_TOKEN.fullmatch(text)):
        return bytes([int(match.group(1), 16)])
    return b""  # unused and undefined tokens print nothing


def _check_merges(vocab: Vocab, index: Mapping[str, int], path: object) -> None:
    """HF's BPE builder aborts the process on a merge outside the vocabulary: refuse such files with a message."""
    for number, (left, right) in enumerate(vocab.merges):
        for part in (left, right, left + right):
            if part not in index:
                raise ModelFileError(path, f"tokenizer.ggml.merges[{number}] = {left + ' ' + right!r} uses "
                                           f"{part!r}, which is not in tokenizer.ggml.tokens")


def _build_bpe(vocab: Vocab, index: dict[str, int], path: object) -> HFTokenizer:
    """HF BPE model over the vocabulary, with the file's pre-tokenizer regexes and GPT-2's byte alphabet."""
    _check_merges(vocab, index, path)
    bpe = models.BPE(index, vocab.merges, ignore_merges=vocab.pre.ignore_merges)
    tokenizer = HFTokenizer(bpe)
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in vocab.pre.regexes]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
    return tokenizer


class Tokenizer:
    """Byte-level BPE tokenizer of a GGUF model: encode, decode, special and stop tokens."""

    def __init__(self, vocab: Vocab, path: object = "<metadata>"):
        self.vocab, self.path = vocab, str(path)
        self._token_index = {text: i for i, text in enumerate(vocab.tokens)}
        self._bpe = _build_bpe(vocab, self._token_index, path)
        partitioned = [i for i, attr in enumerate(vocab.attrs) if attr & _PARTITIONED]
        # Longest UTF-8 first, so a special token containing another one wins (llama.cpp's order); ties by id.
        self._partition_order = sorted(partitioned, key=lambda i: (-len(vocab.tokens[i].encode()), i))
        self._pieces = [_token_bytes(text, attr) for text, attr in zip(vocab.tokens, vocab.attrs)]
        self.special_ids = frozenset(i for i, attr in enumerate(vocab.attrs) if attr & _SPECIAL)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], path: object = "<metadata>") -> Tokenizer:
        """Builds the tokenizer from a GGUF metadata dict (tokenizer.ggml.* keys); path only labels errors."""
        return cls(parse_vocab(metadata, path), path)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Tokenizer:
        """Builds the tokenizer of an open GGUFFile."""
        return cls.from_metadata(f.metadata, f.path)

    # ---- ids -------------------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of tokens in the vocabulary."""
        return self.vocab.num_tokens

    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence id (llama.cpp's default 11 when a BPE file names none)."""
        return self.vocab.special_ids.get("bos")

    @property
    def eos_id(self) -> int | None:
        """End-of-sequence id (llama.cpp's default 11 when a BPE file names none)."""
        return self.vocab.special_ids.get("eos")

    @property
    def eot_id(self) -> int | None:
        """End-of-turn id (from the file or found by text, e.g. `<|im_end|>`)."""
        return self.vocab.special_ids.get("eot")

    @property
    def pad_id(self) -> int | None:
        """Padding id, if the file names one."""
        return self.vocab.special_ids.get("pad")

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end generation: eos, end-of-turn tokens (<|im_end|>, <|endoftext|>, ...), FIM pad/separators."""
        return self.vocab.eog_ids

    @property
    def add_bos(self) -> bool:
        """Whether encode(add_special=True) prepends BOS (false for Qwen, true for Llama 3)."""
        return self.vocab.add_bos

    def is_stop(self, token_id: int) -> bool:
        """True if sampling token_id ends generation."""
        return token_id in self.vocab.eog_ids

    def token_to_id(self, text: str) -> int | None:
        """The id whose vocabulary entry is exactly text (byte-level form for normal tokens), or None."""
        return self._token_index.get(text)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry of an id as stored in the file."""
        self._check_id(token_id)
        return self.vocab.tokens[token_id]

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < len(self._pieces):
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{len(self._pieces) - 1})")

    # ---- encode ----------------------------------------------------------------------------------------------

    def encode(self, text: str, parse_special: bool = True, add_special: bool = False) -> list[int]:
        """Token ids of text, as llama.cpp's llama_tokenize(text, add_special, parse_special) returns them.

        parse_special: control tokens written in the text (`<|im_start|>`) become their ids; when false they are
        tokenized as plain text. User-defined tokens (`<tool_call>`) become their ids either way.
        add_special: prepend BOS / append EOS where the file asks for it (add_bos_token / add_eos_token). Rendered
        chat templates already carry their BOS text, so leave it false for them.
        """
        if not text.isascii():
            text.encode("utf-8")  # raises UnicodeEncodeError naming the position of an unpaired surrogate
        ids: list[int] = []
        if add_special and self.vocab.add_bos:
            ids.append(self.vocab.special_ids["bos"])
        for fragment in self._partition(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
            else:
                ids.extend(self._bpe.encode(fragment, add_special_tokens=False).ids)
        if add_special and self.vocab.add_eos:
            ids.append(self.vocab.special_ids["eos"])
        return ids

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Splits text around special-token texts: each token in turn cuts every text fragment it occurs in."""
        fragments: list[str | int] = [text] if text else []
        for token_id in self._partition_order:
            if not parse_special and self.vocab.attrs[token_id] & _SPECIAL:
                continue
            needle = self.vocab.tokens[token_id]
            if not any(isinstance(f, str) and needle in f for f in fragments):
                continue
            cut: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or needle not in fragment:
                    cut.append(fragment)
                    continue
                for number, part in enumerate(fragment.split(needle)):
                    if number:
                        cut.append(token_id)
                    if part:
                        cut.append(part)
            fragments = cut
        return fragments

    # ---- decode ----------------------------------------------------------------------------------------------

    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        """The bytes one token stands for (may be part of a UTF-8 character); b"" for skipped special tokens."""
        self._check_id(token_id)
        if skip_special and token_id in self.special_ids:
            return b""
        return self._pieces[token_id]

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of a token sequence; invalid UTF-8 (a cut-off character) becomes U+FFFD."""
        return b"".join(self.token_bytes(i, skip_special) for i in ids).decode("utf-8", errors="replace")

    def stream(self, skip_special: bool = False) -> StreamDecoder:
        """A decoder for ids that arrive one at a time."""
        return StreamDecoder(self, skip_special)


class StreamDecoder:
    """Turns ids into text as they arrive, holding back the bytes of a UTF-8 character until it is complete."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer, self._skip_special = tokenizer, skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: int | Iterable[int]) -> str:
        """Text completed by these ids (possibly "" while a multi-byte character is still arriving)."""
        batch = [ids] if isinstance(ids, int) else ids
        data = b"".join(self._tokenizer.token_bytes(i, self._skip_special) for i in batch)
        return self._utf8.decode(data)

    def flush(self) -> str:
        """Ends the stream: a character left incomplete comes out as U+FFFD."""
        return self._utf8.decode(b"", final=True)
