"""The console approver's answers, the policy approver's denials, event records and the human printer."""

import asyncio
import io
import json
from pathlib import Path

from openjet_tui.agent import events as ev
from openjet_tui.agent.approver import ConsoleApprover, PathRequest, PolicyApprover, ShellRequest
from openjet_tui.agent.printer import HumanPrinter, JsonPrinter
from openjet_tui.agent.proposals import make_proposal
from openjet_tui.agent.shellpolicy import Mode, ShellPolicy

OLD = "".join(f"line {i}\n" for i in range(1, 41))
NEW = OLD.replace("line 2\n", "LINE 2\n").replace("line 20\n", "LINE 20\n").replace("line 38\n", "LINE 38\n")


def three_hunks():
    return make_proposal(Path("/w/f.txt"), "f.txt", OLD.encode(), NEW)


def console(answers):
    return ConsoleApprover(io.StringIO("".join(a + "\n" for a in answers)), io.StringIO())


def test_console_per_hunk_answers_with_reasons():
    approver = console(["y", "n", "too risky", "y"])
    decision = asyncio.run(approver.review_edit(three_hunks()))
    assert decision.accepted == frozenset({0, 2}) and decision.hunk_reasons == {1: "too risky"}
    assert "@@ -17,7 +17,7 @@" in approver.stdout.getvalue()


def test_console_all_and_quit_shortcuts():
    assert asyncio.run(console(["n", "", "a"]).review_edit(three_hunks())).accepted == frozenset({1, 2})
    decision = asyncio.run(console(["y", "q", "stop here"]).review_edit(three_hunks()))
    assert decision.accepted == frozenset({0}) and decision.hunk_reasons == {1: "stop here", 2: "stop here"}


def test_console_shell_always_and_deny_with_reason():
    verdict = ShellPolicy(["ls"]).evaluate("ls && make test", Mode.ASK, Path("/w"))
    request = ShellRequest("c", "ls && make test", Path("/w"), verdict)
    approver = console(["a"])
    decision = asyncio.run(approver.review_shell(request))
    assert decision.allow and decision.always
    shown = approver.stdout.getvalue()
    assert "- ls: allow (allowed by rule `ls`)" in shown and "always would allow: make test" in shown
    decision = asyncio.run(console(["n", "not now"]).review_shell(request))
    assert not decision.allow and decision.reason == "not now"
    assert not asyncio.run(console([]).review_shell(request)).allow  # end of input denies


def test_policy_approver_denies_everything_and_says_why():
    approver = PolicyApprover()
    edit = asyncio.run(approver.review_edit(three_hunks()))
    path = asyncio.run(approver.review_path(PathRequest("c", "read_file", Path("/etc/x"), "read")))
    assert edit.accepted == frozenset() and "no terminal" in edit.reason and not path.allow
    assert approver.num_denied == 2


def test_every_event_serialises_to_json():
    proposal = three_hunks()
    samples = [ev.TurnStarted("s", "t"), ev.TextDelta("x"), ev.ReasoningDelta("r"),
               ev.AssistantMessage("c", "", [], "cloud"), ev.ToolRequested("c", "read_file", {"path": "a"}),
               ev.ProposalCreated(proposal), ev.ProposalResolved("p", "f.txt", "partial", [0], [1], "why"),
               ev.ProposalStale("p", "f.txt"), ev.ShellResolved("c", "ls", True, "rule", "ok"),
               ev.ToolResult("c", "ls", "out"), ev.UsageReported(1, 2, 3, 4096), ev.EngineStats(1, 2.0, 3, 4.0),
               ev.SlipstreamTraffic("u", 1, 2, 3, 4, 5, 6, 7, 8), ev.TodoUpdated([]), ev.Compacted(1, 2, 3),
               ev.Notice("n"), ev.ErrorEvent("e"), ev.TurnFinished("done", 1)]
    records = [json.loads(json.dumps(e.to_json())) for e in samples]
    assert len({r["type"] for r in records}) == len(samples)
    created = records[5]["proposal"]
    assert created["path"] == "f.txt" and len(created["hunks"]) == 3 and created["hunks"][0]["lines"][1] == "-line 2"


def test_printers():
    out, err = io.StringIO(), io.StringIO()
    printer = HumanPrinter(out, err)
    printer(ev.TextDelta("Working"))
    printer(ev.ToolRequested("c", "edit_file", {"path": "a.py", "edits": [{"old_text": "x" * 100}]}))
    printer(ev.ShellResolved("c", "rm -rf x", False, "policy", "denied: matches `rm -rf`"))
    printer(ev.TextDelta("done."))
    printer(ev.TurnFinished("done", 2))
    assert out.getvalue() == "Working\ndone.\n"
    lines = err.getvalue().splitlines()
    assert lines[0].startswith("-> edit_file(path=a.py, edits=[{") and lines[0].endswith("...)")
    assert lines[1] == "   $ rm -rf x  [not run; denied: matches `rm -rf`]"
    stream = io.StringIO()
    JsonPrinter(stream)(ev.Notice("hi"))
    assert json.loads(stream.getvalue()) == {"type": "notice", "message": "hi", "level": "info"}
