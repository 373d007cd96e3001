"""The workspace watcher with real file-system events: stale proposals, the @path index, reloads."""

import asyncio

from openjet_tui.agent.approver import ScriptedApprover
from openjet_tui.agent.events import ProposalResolved, ProposalStale
from openjet_tui.agent.proposals import ProposalBook, make_proposal
from openjet_tui.agent.shellpolicy import Mode, ShellPolicy
from openjet_tui.agent.tools import ToolContext, all_tools, run_tool
from openjet_tui.agent.watch import FileIndex, WorkspaceWatcher
from openjet_tui.agent.workspace import Workspace
from openjet_tui.llm.types import ToolCall


async def until(predicate, action=None, timeout_s=10.0):
    """Repeat action (a file write) until predicate holds: the watcher may not be armed on the first write."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "watcher did not report the change"
        if action is not None:
            action()
        await asyncio.sleep(0.1)


def test_index_and_fuzzy_completion(workspace):
    for rel in ["src/app/main.py", "src/app/models.py", "docs/manual.md", "README.md", ".git/HEAD"]:
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text("x")
    index = FileIndex(Workspace(workspace))
    assert ".git/HEAD" not in index.paths and len(index.paths) == 4
    assert index.complete("main")[0] == "src/app/main.py"
    assert index.complete("mdl") == ["src/app/models.py"]
    assert index.complete("sam")[0] == "src/app/main.py"  # s..a..m across folders still matches
    assert index.complete("zzz") == []
    assert index.complete("")[0] == "README.md"


async def test_outside_change_marks_pending_proposal_stale_and_reloads(workspace):
    target = workspace / "f.txt"
    target.write_text("one\n")
    ws = Workspace(workspace)
    book = ProposalBook()
    proposal = make_proposal(ws.resolve("f.txt"), "f.txt", target.read_bytes(), "two\n")
    book.add(proposal)
    events, reloads = [], []
    watcher = WorkspaceWatcher(ws, book, FileIndex(ws), events.append, lambda: reloads.append("agents"),
                               lambda: reloads.append("config"))
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    try:
        counter = iter(range(10**6))
        await until(lambda: events, lambda: target.write_text(f"changed {next(counter)}\n"))
        assert events[0] == ProposalStale(proposal.id, "f.txt") and proposal.is_stale
        await until(lambda: "new.py" in watcher.index.paths, lambda: (workspace / "new.py").write_text("x"))
        (workspace / "new.py").unlink()
        await until(lambda: "new.py" not in watcher.index.paths)
        await until(lambda: "agents" in reloads, lambda: (workspace / "AGENTS.md").write_text("Use tabs.\n"))
        (workspace / ".openjet").mkdir()
        await until(lambda: "config" in reloads,
                    lambda: (workspace / ".openjet" / "config.toml").write_text('mode = "ask"\n'))
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_our_own_atomic_writes_are_not_reported_as_temporary_files_or_outside_changes(workspace):
    (workspace / "f.txt").write_text("one\ntwo\n")
    ws = Workspace(workspace)
    book, events, seen = ProposalBook(), [], []
    watcher = WorkspaceWatcher(ws, book, FileIndex(ws), events.append)
    real_handle = watcher.handle
    watcher.handle = lambda changes: (seen.extend(changes), real_handle(changes))  # the batches, as they arrive
    context = ToolContext(ws, ScriptedApprover(), Mode.AUTO_EDIT, ShellPolicy(), book, events.append)
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    try:
        await until(lambda: "armed.txt" in watcher.index.paths, lambda: (workspace / "armed.txt").write_text("x"))
        # the real apply path: propose, decide (auto-edit), write through a temporary file and rename
        created = await run_tool(all_tools(), context, ToolCall("c1", "write_file", {"path": "new/made.py",
                                                                                       "content": "x = 1\n"}))
        edited = await run_tool(all_tools(), context, ToolCall("c2", "edit_file", {
            "path": "f.txt", "edits": [{"old_text": "two", "new_text": "TWO"}]}))
        assert not created.is_error and not edited.is_error, (created.content, edited.content)
        await until(lambda: "new/made.py" in watcher.index.paths
                    and any(path.endswith("f.txt") for _, path in seen))
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert (workspace / "f.txt").read_text() == "one\nTWO\n"
    assert [e.status for e in events if isinstance(e, ProposalResolved)] == ["applied", "applied"]
    assert not any(path.endswith(".openjet-tmp") for _, path in seen)  # filtered before the watcher sees them
    assert not any(path.endswith(".openjet-tmp") for path in watcher.index.paths)
    assert list(workspace.rglob("*.openjet-tmp")) == []
    assert not any(isinstance(e, ProposalStale) for e in events)  # applied edits are not "changed outside"
