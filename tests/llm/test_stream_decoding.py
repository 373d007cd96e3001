"""SSE decoding, per-index tool-call assembly and reasoning splitting, fed the way real servers cut their bytes."""

import json

import pytest

from openjet_tui.errors import LLMResponseError
from openjet_tui.llm.stream import ReplyBuilder, SSEDecoder, ThinkSplitter, ToolCallAssembler, parse_event
from openjet_tui.llm.types import ContentDelta, ReasoningDelta


def test_sse_decoder_handles_split_bytes_crlf_comments_and_multiline_data():
    stream = b': ping\r\n\r\ndata: {"a":\r\ndata: 1}\r\n\r\nevent: x\ndata: [DONE]\n\n'
    decoder = SSEDecoder()
    events = []
    for i in range(len(stream)):  # one byte at a time: no event may depend on chunk boundaries
        events += decoder.feed(stream[i:i + 1])
    assert events == ['{"a":\n1}', "[DONE]"]
    assert json.loads(events[0]) == {"a": 1}


def test_sse_decoder_flushes_an_unterminated_final_event():
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"x": 2}') == []
    assert decoder.close() == ['{"x": 2}']


def test_sse_multibyte_character_split_across_chunks():
    payload = 'data: {"t": "héllo ✓"}\n\n'.encode()
    decoder = SSEDecoder()
    events = decoder.feed(payload[:12]) + decoder.feed(payload[12:])
    assert json.loads(events[0])["t"] == "héllo ✓"


def test_tool_calls_assembled_per_index_even_when_interleaved():
    assembler = ToolCallAssembler()
    assembler.add([{"index": 0, "id": "a", "function": {"name": "read_file", "arguments": ""}}])
    assembler.add([{"index": 1, "id": "b", "function": {"name": "grep", "arguments": '{"pat'}}])
    assembler.add([{"index": 0, "function": {"arguments": '{"path": '}}])
    assembler.add([{"index": 1, "function": {"arguments": 'tern": "x"}'}}])
    assembler.add([{"index": 0, "function": {"arguments": '"a.py"}'}}])
    calls = assembler.finish()
    assert [(c.id, c.name, c.arguments) for c in calls] == [("a", "read_file", {"path": "a.py"}),
                                                            ("b", "grep", {"pattern": "x"})]


def test_tool_call_with_broken_json_keeps_an_error_for_the_model():
    assembler = ToolCallAssembler()
    assembler.add([{"index": 0, "id": "a", "function": {"name": "read_file", "arguments": '{"path": "a'}}])
    (call,) = assembler.finish()
    assert call.arguments == {} and "not valid JSON" in call.arguments_error


def test_tool_call_arguments_as_object_and_missing_index():
    assembler = ToolCallAssembler()
    assembler.add([{"id": "x", "function": {"name": "list_dir", "arguments": {"path": "src"}}}])
    (call,) = assembler.finish()
    assert (call.id, call.name, call.arguments) == ("x", "list_dir", {"path": "src"})


@pytest.mark.parametrize("cut", range(1, 30))
def test_think_splitter_any_chunking(cut):
    text = "<think>plan it</think>The answer."
    splitter = ThinkSplitter()
    parts = []
    for i in range(0, len(text), cut):
        parts += splitter.feed(text[i:i + cut])
    parts += splitter.close()
    assert "".join(p.text for p in parts if isinstance(p, ReasoningDelta)) == "plan it"
    assert "".join(p.text for p in parts if isinstance(p, ContentDelta)) == "The answer."


def test_think_splitter_leaves_lookalike_text_alone():
    splitter = ThinkSplitter()
    parts = splitter.feed("a <thin") + splitter.feed("g> b") + splitter.close()
    assert "".join(p.text for p in parts) == "a <thing> b"
    assert all(isinstance(p, ContentDelta) for p in parts)


def test_reply_builder_collects_usage_timings_reasoning_and_finish():
    builder = ReplyBuilder()
    builder.feed_chunk({"choices": [{"delta": {"reasoning_content": "hmm"}}]})
    builder.feed_chunk({"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]})
    builder.feed_chunk({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 3},
                        "timings": {"predicted_per_second": 55.5, "draft_n": 8, "draft_n_accepted": 6}})
    _, result = builder.finish()
    assert (result.content, result.reasoning, result.finish_reason) == ("hi", "hmm", "stop")
    assert (result.usage.prompt_tokens, result.usage.total_tokens) == (10, 13)
    assert result.timings.predicted_per_second == 55.5 and result.timings.acceptance_rate == 0.75


def test_error_chunk_and_malformed_chunk_raise():
    with pytest.raises(LLMResponseError, match="out of memory"):
        ReplyBuilder().feed_chunk({"error": {"message": "out of memory"}})
    with pytest.raises(LLMResponseError, match="malformed"):
        parse_event("{not json")
    assert parse_event("[DONE]") is None
