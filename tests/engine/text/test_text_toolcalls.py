"""OutputParser: reasoning, content and both Qwen tool-call forms; streaming safety; malformed calls kept."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.text.toolargs import tool_parameter_schemas
from engine.text.toolcalls import (ContentDelta, Event, MalformedToolCall, OutputParser, ReasoningDelta,
                                   ToolCall)

TOOLS = [{"type": "function", "function": {"name": "edit", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "line": {"type": "integer"}, "scale": {"type": "number"},
    "dry_run": {"type": "boolean"}, "options": {"type": "object"}, "lines": {"type": "array"},
    "note": {"type": ["string", "null"]}, "count": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}}}]


def parse(text: str | list[str], **options: Any) -> list[Event]:
    """All events for text fed as the given deltas, adjacent deltas of one kind merged."""
    parser = OutputParser(call_id_prefix="call_", **options)
    events: list[Event] = []
    for delta in [text] if isinstance(text, str) else text:
        events += parser.feed(delta)
    return merge(events + parser.finish())


def merge(events: list[Event]) -> list[Event]:
    merged: list[Event] = []
    for event in events:
        if merged and isinstance(event, (ContentDelta, ReasoningDelta)) and type(merged[-1]) is type(event):
            merged[-1] = type(event)(merged[-1].text + event.text)
        else:
            merged.append(event)
    return merged


def xml_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


# ---- the forms ---------------------------------------------------------------------------------------------------


def test_reasoning_content_and_json_tool_call() -> None:
    call = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py", "n": [1, 2]}}\n</tool_call>'
    events = parse(f"<think>\nI should read it.\n</think>\n\nReading a.py now.\n{call}\n")
    assert events == [ReasoningDelta("I should read it."), ContentDelta("Reading a.py now."),
                      ToolCall("call_0", "read_file", {"path": "a.py", "n": [1, 2]}, call)]


def test_xml_tool_call_values_are_strings_without_a_schema() -> None:
    call = xml_call("edit", path="src/a b.py", line="12", text="def f():\n    return 1\n")
    assert parse(call) == [ToolCall("call_0", "edit", {"path": "src/a b.py", "line": "12",
                                                        "text": "def f():\n    return 1\n"}, call)]


def test_xml_tool_call_values_take_the_schema_types() -> None:
    call = xml_call("edit", path="007", line="-3", scale="2.5", dry_run="True", options='{"a": 1}', lines="[1, 2]",
                    note="null", count="4")
    [event] = parse(call, tools=TOOLS)
    assert event == ToolCall("call_0", "edit", {"path": "007", "line": -3, "scale": 2.5, "dry_run": True,
                                                "options": {"a": 1}, "lines": [1, 2], "note": None, "count": 4}, call)


@pytest.mark.parametrize(("params", "error"), [
    ({"line": "twelve"}, "parameter 'line' of edit: expected integer, got 'twelve'"),
    ({"dry_run": "maybe"}, "expected boolean"),
    ({"options": "[1]"}, "expected object"),
    ({"count": "many"}, "expected integer or null"),
])
def test_values_that_do_not_fit_the_schema_are_malformed(params: dict[str, str], error: str) -> None:
    [event] = parse(xml_call("edit", **params), tools=TOOLS)
    assert isinstance(event, MalformedToolCall) and error in event.error
    assert event.raw == xml_call("edit", **params)


@pytest.mark.parametrize(("body", "error"), [
    ('{"name": "f", "arguments": {"a": 1}', "invalid JSON"),
    ('{"arguments": {}}', 'no "name"'),
    ('{"name": "f", "arguments": [1]}', '"arguments" must be a JSON object'),
    ('{"name": "f"} trailing', "unexpected text after the JSON object"),
    ("", "empty tool call"),
    ("<function=f><parameter=a>1</parameter>", "not closed by </function>"),
    ("<function=f>stray<parameter=a>1</parameter></function>", "unexpected text in <function=f>"),
    ("<function=f><parameter=a>1</parameter><parameter=a>2</parameter></function>", "sets parameter 'a' twice"),
    ("<function=>x</function>", "has no function name"),
])
def test_unreadable_bodies_are_reported_not_dropped(body: str, error: str) -> None:
    [event] = parse(f"<tool_call>{body}</tool_call>")
    assert isinstance(event, MalformedToolCall) and error in event.error
    assert event.raw == f"<tool_call>{body}</tool_call>"


def test_json_arguments_may_be_a_json_string_or_absent() -> None:
    events = parse('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
                   '<tool_call>{"name": "g"}</tool_call>')
    assert [(e.id, e.name, e.arguments) for e in events] == [("call_0", "f", {"a": 1}), ("call_1", "g", {})]


def test_unclosed_call_at_finish_is_malformed() -> None:
    events = parse('Let me call.\n<tool_call>\n{"name": "f", "argu')
    assert events == [ContentDelta("Let me call."),
                      MalformedToolCall('<tool_call>\n{"name": "f", "argu', events[1].error)]
    assert "ended inside <tool_call>" in events[1].error


def test_call_reopened_before_closing_reports_the_first_and_parses_the_second() -> None:
    events = parse('<tool_call>{"name": "f"\n<tool_call>{"name": "g"}</tool_call>')
    assert isinstance(events[0], MalformedToolCall) and events[0].raw == '<tool_call>{"name": "f"\n'
    assert isinstance(events[1], ToolCall) and events[1].name == "g"


# ---- reasoning ---------------------------------------------------------------------------------------------------


def test_prompt_opened_reasoning() -> None:
    assert parse("\nthinking...\n</think>\n\nanswer", starts_in_reasoning=True) == [
        ReasoningDelta("thinking..."), ContentDelta("answer")]


def test_unclosed_reasoning_stays_reasoning() -> None:
    assert parse("still thinking", starts_in_reasoning=True) == [ReasoningDelta("still thinking")]


def test_think_tag_counts_only_at_the_start() -> None:
    assert parse("Use <think> tags.") == [ContentDelta("Use <think> tags.")]
    assert parse("  <think>a</think>b") == [ReasoningDelta("a"), ContentDelta("b")]


def test_tool_calls_inside_reasoning_are_reasoning_text() -> None:
    text = '<think>maybe <tool_call>{"name": "f"}</tool_call></think>ok'
    assert parse(text) == [ReasoningDelta('maybe <tool_call>{"name": "f"}</tool_call>'), ContentDelta("ok")]


def test_parsing_can_be_switched_off() -> None:
    text = '<think>r</think><tool_call>{"name": "f"}</tool_call>'
    assert parse(text, parse_reasoning=False, parse_tool_calls=False) == [ContentDelta(text)]


# ---- streaming safety --------------------------------------------------------------------------------------------


def test_partial_tags_are_held_back_and_released_when_they_are_not_tags() -> None:
    parser = OutputParser()
    assert parser.feed("x <tool_") == [ContentDelta("x")]  # neither the space nor the partial tag yet
    assert parser.feed("box>") == [ContentDelta(" <tool_box>")]
    assert parser.feed("a </thi") == [ContentDelta("a </thi")]  # </think> is not a tag in content
    assert parser.feed("<") == []
    assert parser.finish() == [ContentDelta("<")]


def test_partial_closing_think_is_held_in_reasoning() -> None:
    parser = OutputParser(starts_in_reasoning=True)
    assert parser.feed("a</thi") == [ReasoningDelta("a")]
    assert parser.feed("nk>b") == [ContentDelta("b")]


def test_plain_text_passes_through_exactly() -> None:
    text = "  leading and trailing whitespace\n\n  kept when no tag is involved  \n"
    assert parse(text) == [ContentDelta(text)]
    assert parse(list(text)) == [ContentDelta(text)]


def test_feed_after_finish_is_an_error() -> None:
    parser = OutputParser()
    parser.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        parser.feed("x")


def test_random_call_ids_differ_between_parsers() -> None:
    ids = {OutputParser().feed('<tool_call>{"name": "f"}</tool_call>')[0].id for _ in range(3)}
    assert len(ids) == 3


def test_tool_definitions_are_checked() -> None:
    with pytest.raises(ValueError, match="without a function name"):
        tool_parameter_schemas([{"type": "function", "function": {"description": "no name"}}])


# ---- property: the split into deltas does not matter -------------------------------------------------------------

# Text pieces cannot spell a tag (no letters of "think" or "tool_call"), so the only tags are the ones placed.
_TEXT = st.text(alphabet="ab xy\n\t<>/={}\"", max_size=12)
_PIECES = st.one_of(
    _TEXT, _TEXT, _TEXT,
    st.sampled_from(["<", "</", "<tool_", "</tool_call", "<thin", "</thi", "</tool_call>", "\n\n", "  "]),
    st.sampled_from(['<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
                     '<tool_call>{"name": "f", "arguments": {"a": </tool_call>',
                     "<tool_call>\n" + "<function=edit>\n<parameter=line>\n7\n</parameter>\n</function>\n"
                     + "</tool_call>",
                     "<tool_call>\n<function=edit>\n<parameter=line>\nseven\n</parameter>\n</function>\n</tool_call>",
                     "<tool_call>unclosed"]),
)
_OUTPUTS = st.tuples(st.sampled_from(["", "<think>", " \n<think>\n"]), _TEXT, st.lists(_PIECES, max_size=8)).map(
    lambda parts: parts[0] + (parts[1] + "</think>" if parts[0] else "") + "".join(parts[2]))


def _nonspace(text: str) -> str:
    return re.sub(r"\s+", "", text)


@settings(max_examples=300, deadline=None)
@given(output=_OUTPUTS, data=st.data())
def test_any_split_gives_the_same_events(output: str, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(output)), max_size=12)))
    deltas = [output[i:j] for i, j in zip([0, *cuts], [*cuts, len(output)])]
    whole = parse(output, tools=TOOLS)
    assert parse(deltas, tools=TOOLS) == whole
    assert parse(list(output), tools=TOOLS) == whole
    # Nothing is lost: apart from whitespace and the recognised <think> tags, every character is in some event.
    kept = "".join(e.raw if isinstance(e, (ToolCall, MalformedToolCall)) else e.text for e in whole)
    expected = output.replace("<think>", "", 1).replace("</think>", "", 1) if output.lstrip().startswith(
        "<think>") else output
    assert _nonspace(kept) == _nonspace(expected)
    assert not any(isinstance(e, ContentDelta) and "<tool_call>" in e.text for e in whole)
