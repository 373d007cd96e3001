"""Tool calls written as text, in every form local models produce them."""

from openjet_tui.llm.textcalls import extract_text_tool_calls

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "offset": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "edit_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "edits": {"type": "array"}}}}},
]


def test_hermes_tool_call_tags():
    text = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    rest, calls = extract_text_tool_calls(text, TOOLS)
    assert rest == "Let me look."
    assert [(c.name, c.arguments, c.source) for c in calls] == [("read_file", {"path": "a.py"}, "text")]


def test_two_hermes_calls_and_an_unclosed_last_one():
    text = ('<tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call>\n'
            '<tool_call>{"name": "read_file", "arguments": {"path": "b"}}')
    _, calls = extract_text_tool_calls(text, TOOLS)
    assert [c.arguments["path"] for c in calls] == ["a", "b"]
    assert len({c.id for c in calls}) == 2


def test_qwen3_coder_function_parameter_form_with_typed_values():
    text = ("<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/x.py\n</parameter>\n"
            "<parameter=offset>\n40\n</parameter>\n</function>\n</tool_call>")
    _, calls = extract_text_tool_calls(text, TOOLS)
    assert calls[0].name == "read_file"
    assert calls[0].arguments == {"path": "src/x.py", "offset": 40}


def test_qwen3_coder_keeps_multiline_string_values_verbatim():
    text = ("<function=edit_file><parameter=path>\nm.py\n</parameter><parameter=edits>\n"
            '[{"old": "a\\n", "new": "b\\n"}]\n</parameter></function>')
    _, calls = extract_text_tool_calls(text, TOOLS)
    assert calls[0].arguments == {"path": "m.py", "edits": [{"old": "a\n", "new": "b\n"}]}


def test_json_fence_naming_an_offered_tool():
    text = 'I will read it.\n```json\n{"name": "read_file", "arguments": {"path": "main.py"}}\n```\n'
    rest, calls = extract_text_tool_calls(text, TOOLS)
    assert rest == "I will read it."
    assert calls[0].arguments == {"path": "main.py"}


def test_bare_json_object_and_string_encoded_arguments():
    text = '{"name": "read_file", "arguments": "{\\"path\\": \\"z.py\\"}"}'
    rest, calls = extract_text_tool_calls(text, TOOLS)
    assert rest == "" and calls[0].arguments == {"path": "z.py"}


def test_unoffered_names_and_plain_json_stay_text():
    for text in ['{"name": "rm_rf", "arguments": {}}',
                 '```json\n{"name": "read_file"}\n```',  # a data object, not a call: no arguments key
                 'Here is config: {"debug": true}',
                 "<tool_call>not json</tool_call>"]:
        rest, calls = extract_text_tool_calls(text, TOOLS)
        assert calls == [] and rest == text


def test_nothing_offered_means_nothing_parsed():
    text = '<tool_call>{"name": "read_file", "arguments": {}}</tool_call>'
    assert extract_text_tool_calls(text, None) == (text, [])
