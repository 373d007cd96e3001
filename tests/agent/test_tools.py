"""The tools one by one: reading, searching, exact edits, writes, todo, argument checks."""

import asyncio

import pytest

from openjet_tui.agent import events as ev
from openjet_tui.agent.approver import ScriptedApprover
from openjet_tui.agent.proposals import EditDecision, ProposalBook
from openjet_tui.agent.shellpolicy import Mode, ShellPolicy
from openjet_tui.agent.tools import ToolContext, all_tools, check_arguments, run_tool
from openjet_tui.agent.tools.files import glob_regex
from openjet_tui.agent.workspace import Workspace
from openjet_tui.llm.types import ToolCall


@pytest.fixture
def tool(workspace):
    """Call a tool by name in auto-edit mode; returns (outcome, events)."""
    events = []
    context = ToolContext(Workspace(workspace), ScriptedApprover.of(edits=[EditDecision.accept_all] * 5),
                          Mode.AUTO_EDIT, ShellPolicy(), ProposalBook(), events.append)

    def call(name, **arguments):
        events.clear()
        return asyncio.run(run_tool(all_tools(), context, ToolCall("c1", name, arguments))), list(events)
    call.context = context
    return call


def test_read_file_numbers_lines_and_pages(workspace, tool):
    (workspace / "big.py").write_text("".join(f"row {i}\n" for i in range(1, 2501)))
    out, _ = tool("read_file", path="big.py")
    lines = out.content.splitlines()
    assert lines[0] == "     1\trow 1" and lines[1999] == "  2000\trow 2000"
    assert lines[-1] == "[500 more lines; read on with offset=2001]"
    out, _ = tool("read_file", path="big.py", offset=2499, limit=5)
    assert out.content == "  2499\trow 2499\n  2500\trow 2500"
    out, _ = tool("read_file", path="big.py", offset=9999)
    assert out.is_error and "has 2500 lines" in out.content
    (workspace / "blob.bin").write_bytes(b"\x00\x01")
    assert "binary file" in tool("read_file", path="blob.bin")[0].content
    assert "no such file" in tool("read_file", path="nope.txt")[0].content


def test_list_dir_glob_and_grep(workspace, tool):
    for rel in ["src/a.py", "src/deep/b.py", "src/c.txt", ".git/config", "node_modules/x.js"]:
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text("def hello():\n    return 'Hello'\n")
    listing = tool("list_dir")[0].content
    assert listing.splitlines()[:2] == ["./", "src/"] and "ignored folders not shown: .git, node_modules" in listing
    assert tool("glob", pattern="**/*.py")[0].content == "src/a.py\nsrc/deep/b.py"
    assert tool("glob", pattern="src/*.py")[0].content == "src/a.py"
    found = tool("grep", pattern="hello", ignore_case=True, glob="*.py")[0].content.splitlines()
    assert found == ["src/a.py:1: def hello():", "src/a.py:2:     return 'Hello'",
                     "src/deep/b.py:1: def hello():", "src/deep/b.py:2:     return 'Hello'"]
    bad = tool("grep", pattern="(")[0]
    assert bad.is_error and "invalid regular expression" in bad.content


def test_glob_translation():
    assert glob_regex("**/*.py").match("a/b/c.py") and glob_regex("**/*.py").match("c.py")
    assert not glob_regex("*.py").match("a/c.py")
    assert glob_regex("t?st_[!x]*.py").match("test_a.py") and not glob_regex("t?st_[!x]*.py").match("test_x.py")


def test_edit_file_exact_replacements_and_their_errors(workspace, tool):
    (workspace / "m.py").write_text("a = 1\nb = 2\nb = 2\nc  =  3\n")
    out, events = tool("edit_file", path="m.py", edits=[{"old_text": "a = 1", "new_text": "a = 10"},
                                                        {"old_text": "a = 10\nb", "new_text": "a = 10\nbb"}])
    assert out.content == "Applied: all 1 hunk of the edit to m.py."
    assert (workspace / "m.py").read_text() == "a = 10\nbb = 2\nb = 2\nc  =  3\n"
    assert [type(e) for e in events] == [ev.ProposalCreated, ev.ProposalResolved]
    out, _ = tool("edit_file", path="m.py", edits=[{"old_text": "b = 2", "new_text": "x"}])
    assert out.is_error and "occurs 2 times" in out.content
    out, _ = tool("edit_file", path="m.py", edits=[{"old_text": "c = 3", "new_text": "x"}])
    assert "not found" in out.content and "differs only in whitespace" in out.content
    out, _ = tool("edit_file", path="m.py", edits=[{"old_text": "", "new_text": "x"}])
    assert "old_text is empty" in out.content
    assert "no such file; use write_file" in tool("edit_file", path="n.py", edits=[
        {"old_text": "a", "new_text": "b"}])[0].content
    assert (workspace / "m.py").read_text() == "a = 10\nbb = 2\nb = 2\nc  =  3\n"


def test_write_file_creates_and_reports_no_change(workspace, tool):
    out, _ = tool("write_file", path="pkg/new.py", content="x = 1\n")
    assert out.content == "Applied: all 1 hunk of the edit to pkg/new.py."
    assert (workspace / "pkg" / "new.py").read_text() == "x = 1\n"
    assert tool("write_file", path="pkg/new.py", content="x = 1\n")[0].content.startswith("No change")
    assert tool("write_file", path="pkg", content="x")[0].content == "write_file: pkg is a folder"


def test_read_only_mode_refuses_edits_without_asking(workspace, tool):
    (workspace / "f.txt").write_text("a\n")
    tool.context.mode = Mode.READ_ONLY
    out, events = tool("write_file", path="f.txt", content="b\n")
    assert out.is_error and "read-only mode" in out.content and events == []
    assert tool.context.approver.seen_edits == []


def test_todo_replaces_the_list(tool):
    out, events = tool("todo", items=[{"content": "read code", "status": "done"}, {"content": "fix bug"}])
    assert out.content == "[x] read code\n[ ] fix bug"
    assert events == [ev.TodoUpdated([{"content": "read code", "status": "done"},
                                      {"content": "fix bug", "status": "pending"}])]
    assert "not one of" in tool("todo", items=[{"content": "x", "status": "later"}])[0].content


def test_check_arguments_names_the_problem():
    schema = all_tools()["edit_file"].parameters
    assert check_arguments(schema, {"path": "a", "edits": []}) is None
    assert check_arguments(schema, {"path": "a"}) == "missing required argument 'edits'"
    assert check_arguments(schema, {"path": "a", "edits": [], "force": True}) == \
        "unknown argument 'force'; expected: path, edits"
    assert check_arguments(schema, {"path": "a", "edits": ["x"]}) == "argument edits[0] must be an object"
    assert check_arguments(all_tools()["read_file"].parameters, {"path": "a", "offset": True}) == \
        "argument 'offset' must be integer, got bool"
