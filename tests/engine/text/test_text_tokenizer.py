"""Tokenizer: ids equal to llama.cpp's, exact round trips, special and stop tokens, streaming, clear refusals."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ModelFileError, UnsupportedModelError
from engine.gguf.reader import GGUFFile
from engine.text.tokenizer import Tokenizer

IM_START, IM_END, ENDOFTEXT, TOOL_CALL = 151644, 151645, 151643, 151657


def _with(metadata: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of metadata with tokenizer.ggml.<key> values replaced (None deletes the key)."""
    result = dict(metadata)
    for key, value in changes.items():
        full = f"tokenizer.ggml.{key}"
        if value is None:
            result.pop(full, None)
        else:
            result[full] = value
    return result


# ---- agreement with llama.cpp ------------------------------------------------------------------------------------


def test_ids_equal_llama_cpp_for_qwen2(qwen_tokenizer: Tokenizer, golden: dict) -> None:
    expected = golden["pre"]["qwen2"]
    for number, text in enumerate(golden["texts"]):
        assert qwen_tokenizer.encode(text) == expected["ids"][number], text
        assert qwen_tokenizer.encode(text, parse_special=False) == expected["ids_no_parse_special"][number], text
        assert qwen_tokenizer.encode(text, add_special=True) == expected["ids_add_special"][number], text


@pytest.mark.parametrize("pre", ["qwen35", "llama-bpe", "gpt-2", "default", "smollm"])
def test_ids_equal_llama_cpp_for_other_pre_tokenizers(qwen_metadata: dict, golden: dict, pre: str) -> None:
    # Same vocabulary relabelled: only the split rule differs, so this isolates each rule.
    tokenizer = Tokenizer.from_metadata(_with(qwen_metadata, pre=pre))
    expected = golden["pre"][pre]["ids"]
    mismatches = [text for number, text in enumerate(golden["texts"]) if tokenizer.encode(text) != expected[number]]
    assert not mismatches


def test_pre_tokenizers_really_differ(qwen_metadata: dict, golden: dict) -> None:
    # Guards the test above: the corpus must tell the split rules apart.
    ids = golden["pre"]
    for pre in ("qwen35", "gpt-2", "default", "smollm"):
        assert ids[pre]["ids"] != ids["qwen2"]["ids"], pre


def test_stop_ids_equal_llama_cpp_end_of_generation_set(qwen_tokenizer: Tokenizer, golden: dict) -> None:
    assert sorted(qwen_tokenizer.stop_ids) == golden["eog_ids"]
    assert {IM_END, ENDOFTEXT} <= qwen_tokenizer.stop_ids
    assert qwen_tokenizer.eos_id == IM_END and qwen_tokenizer.is_stop(IM_END)
    assert not qwen_tokenizer.is_stop(IM_START) and not qwen_tokenizer.is_stop(TOOL_CALL)


def test_pieces_equal_llama_cpp(qwen_tokenizer: Tokenizer, golden: dict) -> None:
    for token_id, (shown, hidden) in golden["pieces"].items():
        token_id = int(token_id)
        assert qwen_tokenizer.decode([token_id]) == shown, token_id
        assert qwen_tokenizer.decode([token_id], skip_special=True) == hidden, token_id


# ---- each split rule, on a tiny vocabulary whose merges make the splits visible ---------------------------------

_ASCII = [chr(c) for c in range(33, 127)] + ["Ġ"]  # printable ASCII is itself in the byte-level alphabet; Ġ = space


def _tiny(pre: str, extra: list[str], merges: list[str]) -> Tokenizer:
    tokens = _ASCII + extra
    return Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                                    "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges})


def _ids(tokenizer: Tokenizer, text: str) -> list[str]:
    return [tokenizer.id_to_token(i) for i in tokenizer.encode(text)]


@pytest.mark.parametrize(("pre", "expected"), [
    ("qwen2", ["1", "2", "3", "4"]),  # every digit is a word
    ("llama-bpe", ["123", "4"]),  # digits in groups of three
    ("default", ["123", "4"]),  # \p{N}+ then [0-9]{3}
    ("gpt-2", ["12", "34"]),  # one word: merge "3 4" ranks first
])
def test_digit_grouping_follows_the_pre_tokenizer(pre: str, expected: list[str]) -> None:
    tokenizer = _tiny(pre, ["12", "34", "123"], ["3 4", "1 2", "12 3"])
    assert _ids(tokenizer, "1234") == expected


def test_llama3_takes_whole_words_from_the_vocabulary_without_merges() -> None:
    # "abc" is a token but no merge chain builds it: only Llama 3's ignore_merges reaches it.
    extra, merges = ["ab", "abc"], ["a b"]
    assert _ids(_tiny("llama-bpe", extra, merges), "abc") == ["abc"]
    assert _ids(_tiny("qwen2", extra, merges), "abc") == ["ab", "c"]


def test_space_attaches_to_the_following_word() -> None:
    tokenizer = _tiny("qwen2", ["Ġa", "Ġab"], ["Ġ a", "Ġa b"])
    assert _ids(tokenizer, "x ab") == ["x", "Ġab"]


# ---- round trip and special tokens -------------------------------------------------------------------------------


def test_round_trip_is_exact_on_the_corpus(qwen_tokenizer: Tokenizer, golden: dict) -> None:
    for text in golden["texts"]:
        for parse_special in (True, False):
            assert qwen_tokenizer.decode(qwen_tokenizer.encode(text, parse_special)) == text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_round_trip_is_exact_for_any_text(qwen_tokenizer: Tokenizer, text: str) -> None:
    assert qwen_tokenizer.decode(qwen_tokenizer.encode(text)) == text


def test_control_tokens_stay_whole_only_with_parse_special(qwen_tokenizer: Tokenizer) -> None:
    text = "<|im_start|>user\nhi<|im_end|>"
    ids = qwen_tokenizer.encode(text)
    assert ids[0] == IM_START and ids[-1] == IM_END
    plain = qwen_tokenizer.encode(text, parse_special=False)
    assert IM_START not in plain and IM_END not in plain
    assert qwen_tokenizer.decode(plain) == text


def test_user_defined_tokens_stay_whole_even_without_parse_special(qwen_tokenizer: Tokenizer) -> None:
    # llama.cpp (like HF) always cuts user-defined tokens such as <tool_call> out of the text.
    assert qwen_tokenizer.encode("<tool_call>x", parse_special=False)[0] == TOOL_CALL


def test_qwen_adds_no_bos_but_a_file_can_ask_for_it(qwen_tokenizer: Tokenizer, qwen_metadata: dict) -> None:
    assert not qwen_tokenizer.add_bos
    assert qwen_tokenizer.encode("hi", add_special=True) == qwen_tokenizer.encode("hi")
    with_bos = Tokenizer.from_metadata(_with(qwen_metadata, add_bos_token=True))
    assert with_bos.encode("hi", add_special=True) == [ENDOFTEXT, *qwen_tokenizer.encode("hi")]


def test_skip_special_hides_control_tokens_but_not_user_defined(qwen_tokenizer: Tokenizer) -> None:
    ids = qwen_tokenizer.encode("<|im_start|>a<tool_call>b<|im_end|>")
    assert qwen_tokenizer.decode(ids) == "<|im_start|>a<tool_call>b<|im_end|>"
    assert qwen_tokenizer.decode(ids, skip_special=True) == "a<tool_call>b"


def test_token_lookup(qwen_tokenizer: Tokenizer) -> None:
    assert qwen_tokenizer.token_to_id("<|im_end|>") == IM_END
    assert qwen_tokenizer.id_to_token(IM_END) == "<|im_end|>"
    assert qwen_tokenizer.token_to_id("no such token") is None
    with pytest.raises(ValueError, match="outside the vocabulary"):
        qwen_tokenizer.decode([qwen_tokenizer.vocab_size])


# ---- streaming ---------------------------------------------------------------------------------------------------


def test_stream_never_splits_a_character(qwen_tokenizer: Tokenizer) -> None:
    text = "emoji 👨‍👩‍👧 日本語 ½ 🚀 done"
    ids = qwen_tokenizer.encode(text)
    # Byte-level BPE splits some characters across tokens: the check below is only meaningful if it did here.
    assert any(_is_partial(qwen_tokenizer.token_bytes(i)) for i in ids)
    stream = qwen_tokenizer.stream()
    chunks = [stream.feed(i) for i in ids] + [stream.flush()]
    assert "".join(chunks) == text
    assert all("\ufffd" not in chunk for chunk in chunks)


def _is_partial(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_stream_reports_a_character_left_incomplete(qwen_tokenizer: Tokenizer) -> None:
    # U+1D518 is two tokens in this vocabulary: its first three bytes, then the last one.
    first, last = qwen_tokenizer.encode("\U0001D518")
    assert _is_partial(qwen_tokenizer.token_bytes(first))
    stream = qwen_tokenizer.stream()
    assert stream.feed(first) == ""
    assert stream.flush() == "\ufffd"


def test_stream_skips_special_tokens_when_asked(qwen_tokenizer: Tokenizer) -> None:
    stream = qwen_tokenizer.stream(skip_special=True)
    assert stream.feed(qwen_tokenizer.encode("ok<|im_end|>")) == "ok"


# ---- refusals ----------------------------------------------------------------------------------------------------


def test_unknown_pre_tokenizer_is_refused_by_name(qwen_metadata: dict) -> None:
    with pytest.raises(UnsupportedModelError, match="'mystery-bpe'"):
        Tokenizer.from_metadata(_with(qwen_metadata, pre="mystery-bpe"), "m.gguf")


def test_sentencepiece_vocabulary_is_refused_by_name(qwen_metadata: dict) -> None:
    with pytest.raises(UnsupportedModelError, match="tokenizer.ggml.model='llama'.*SentencePiece"):
        Tokenizer.from_metadata(_with(qwen_metadata, model="llama"), "m.gguf")


@pytest.mark.parametrize(("changes", "message"), [
    ({"tokens": None}, "no tokenizer.ggml.tokens"),
    ({"merges": None}, "no tokenizer.ggml.merges"),
    ({"token_type": [1, 1]}, "token_type has 2 entries"),
    ({"eos_token_id": 10**9}, "eos_token_id = 1000000000 is not a token id"),
    ({"merges": ["Ġ Ġ", "nospace"]}, r"merges\[1\] = 'nospace'"),
    ({"merges": ["Ġ zzzz"]}, r"merges\[0\].*'zzzz', which is not in tokenizer.ggml.tokens"),
])
def test_broken_metadata_names_the_problem(qwen_metadata: dict, changes: dict, message: str) -> None:
    with pytest.raises(ModelFileError, match=message) as info:
        Tokenizer.from_metadata(_with(qwen_metadata, **changes), "broken.gguf")
    assert str(info.value).startswith("broken.gguf: ")


def test_bos_required_when_the_file_asks_for_it() -> None:
    # (Vocabularies of more than 11 tokens fall back to llama.cpp's default BOS id 11.)
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
                "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.add_bos_token": True}
    with pytest.raises(ModelFileError, match="add_bos_token is true but there is no tokenizer.ggml.bos_token_id"):
        Tokenizer.from_metadata(metadata)


def test_missing_eos_falls_back_to_llama_cpp_default(qwen_metadata: dict) -> None:
    tokenizer = Tokenizer.from_metadata(_with(qwen_metadata, eos_token_id=None))
    assert tokenizer.eos_id == 11 and tokenizer.is_stop(11)


def test_unpaired_surrogate_is_refused(qwen_tokenizer: Tokenizer) -> None:
    with pytest.raises(UnicodeEncodeError):
        qwen_tokenizer.encode("a\ud800b")


@pytest.mark.slow
def test_real_model_file_tokenizes_like_its_vocabulary(real_model_path, golden: dict) -> None:
    tokenizer = Tokenizer.from_gguf(GGUFFile.open(real_model_path))
    assert sorted(tokenizer.stop_ids) == golden["eog_ids"]
    for number, text in enumerate(golden["texts"]):
        assert tokenizer.encode(text) == golden["pre"]["qwen2"]["ids"][number], text
