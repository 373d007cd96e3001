"""Must show (property tests): whatever the model asks, no file outside the workspace is ever written, and in
`ask` and `read-only` modes nothing is written or run without approval. Commands reach outside through arguments,
redirects, symlinks, globs, brace lists and run-time expansions (`$HOME`, `~`, `$(...)`, `cd`, `xargs`); none of
them reads or writes there unasked, in any mode."""

import asyncio
import os
import shlex
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from openjet_tui.agent.approver import PathDecision, PolicyApprover, ScriptedApprover
from openjet_tui.agent.proposals import EditDecision, ProposalBook
from openjet_tui.agent.shellpolicy import Mode, ShellPolicy, split_command
from openjet_tui.agent.tools import ToolContext, all_tools, run_tool
from openjet_tui.agent.tools import shell as shell_tool
from openjet_tui.agent.workspace import Workspace
from openjet_tui.config import DEFAULT_ALLOW, DEFAULT_DENY
from openjet_tui.llm.types import ToolCall

SEGMENTS = ["..", ".", "sub", "link_out", "link_in", "dangling", "a.txt", "new.txt", "x", "~", "{OUT}", "{WS}"]
path_strategy = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=5).map("/".join)
edit_call = st.one_of(
    st.builds(lambda p, c: ("write_file", {"path": p, "content": c}), path_strategy, st.text(max_size=20)),
    st.builds(lambda p: ("edit_file", {"path": p, "edits": [{"old_text": "a", "new_text": "pwned"}]}),
              path_strategy))
# Allowed-looking commands that write (redirects) sit beside plainly dangerous ones: a policy that lets an
# allow rule cover a write, or skips a part hidden in a substitution, lets one of them through.
SIMPLE = ["touch t1", "echo hi > out.txt", "ls >> list.txt", "cat a.txt > sub/a.txt", "git status >| s.txt",
          "echo hi &> both.txt", "rm -rf a.txt", "ls", "cat a.txt", "git status", "mkdir d", "wc -l a.txt",
          "python3 -c 'open(\"p\", \"w\")'", "cp a.txt ../out/b.txt", "echo x >> {OUT}/a.txt", "cat {OUT}/a.txt",
          "FOO=1 ls", "$SHELL -c 'touch t2'", "sudo ls", "echo hi | tee t3",
          # reaching outside: redirect targets, symlinks, globs, brace lists, expansions, run-time folders
          "cat < ../out/secret.txt", "wc -l < link_out/secret.txt", "cat link_out/secret.txt", "cat */secret.txt",
          "cat {..,.}/out/secret.txt", "cat < dangling", "echo hi >> link_out/pwned", "ls 2> ../out/err",
          "cat $HOME/secret.txt", "cat ${HOME}/secret.txt", "cat ~/secret.txt", "cat \"$HOME\"/secret.txt",
          "echo hi > $HOME/pwned", "touch ~/pwned", "cd; cat secret.txt", "cd && touch pwned",
          "echo ../out/secret.txt | xargs cat", "cat $(echo ../out/secret.txt)", "cat `echo link_out`/secret.txt",
          "echo $PATH", "echo $HOME", "cat <<< $HOME"]
SECRET = "s3cret-never-shown"
command_strategy = st.recursive(
    st.sampled_from(SIMPLE),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from([" ; ", " && ", " || ", " | ", " & ", "\n"]), inner).map("".join),
        inner.map(lambda c: f"({c})"), inner.map(lambda c: f"echo $({c})"), inner.map(lambda c: f"echo `{c}`"),
        inner.map(lambda c: f"bash -c {shlex.quote(c)}"), inner.map(lambda c: f"xargs {c}")),
    max_leaves=4)
shell_call = command_strategy.map(lambda c: ("run_shell", {"command": c}))


def make_layout(base: Path) -> tuple[Path, Path]:
    """ws/ (the workspace, with symlinks pointing in and out) and out/ (outside it)."""
    ws, out = base / "ws", base / "out"
    (ws / "sub").mkdir(parents=True)
    out.mkdir()
    (ws / "a.txt").write_text("a\n")
    (ws / "sub" / "a.txt").write_text("a\n")
    (out / "a.txt").write_text("a\n")
    (ws / "link_out").symlink_to(out)
    (ws / "link_in").symlink_to(ws / "sub")
    (ws / "dangling").symlink_to(out / "new.txt")
    (out / "secret.txt").write_text(SECRET + "\n")
    return ws, out


def snapshot(*roots: Path) -> dict[str, bytes | str]:
    """Every file, folder and link under the roots (not following links)."""
    found: dict[str, bytes | str] = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for name in dirs + files:
                path = Path(folder) / name
                found[str(path)] = ("link:" + os.readlink(path) if path.is_symlink()
                                    else "dir" if path.is_dir() else path.read_bytes())
    return found


def run_calls(ws: Path, out: Path, calls, mode: Mode, approver, allow=(), results=None):
    """Run tool calls as the model would ask them; returns the commands that reached the runner (what the model
    read back goes into `results`)."""
    context = ToolContext(Workspace(ws), approver, mode, ShellPolicy(list(allow), DEFAULT_DENY), ProposalBook(),
                          lambda event: None, shell_timeout_s=5)
    ran = []
    real_run = shell_tool.run_command

    async def spy(command, *args, **kwargs):  # records, then really runs
        ran.append(command)
        return await real_run(command, *args, **kwargs)

    async def go():
        for number, (name, arguments) in enumerate(calls):
            text = {k: v.replace("{OUT}", str(out)).replace("{WS}", str(ws)) if isinstance(v, str) else v
                    for k, v in arguments.items()}
            outcome = await run_tool(all_tools(), context, ToolCall(f"c{number}", name, text))
            if results is not None:
                results.append(outcome.content)

    shell_tool.run_command = spy
    try:
        asyncio.run(go())
    finally:
        shell_tool.run_command = real_run
    return ran


PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY
@given(st.lists(edit_call, min_size=1, max_size=4), st.sampled_from(list(Mode)))
def test_no_file_outside_the_workspace_is_ever_written(isolated_user_dirs, calls, mode):
    approve_edits = ScriptedApprover.of(edits=[EditDecision.accept_all] * 10)
    with tempfile.TemporaryDirectory() as base:
        ws, out = make_layout(Path(base).resolve())
        outside_before = snapshot(out, isolated_user_dirs)
        run_calls(ws, out, calls, mode, approve_edits)
        assert snapshot(out, isolated_user_dirs) == outside_before
        assert all(not Workspace(ws).contains(r.path) for r in approve_edits.seen_paths)
        assert all(Workspace(ws).contains(p.path) for p in approve_edits.seen_edits)


@PROPERTY
@given(st.lists(st.one_of(edit_call, shell_call), min_size=1, max_size=4),
       st.sampled_from([Mode.ASK, Mode.READ_ONLY]))
def test_nothing_is_written_without_approval(isolated_user_dirs, calls, mode):
    with tempfile.TemporaryDirectory() as base:
        ws, out = make_layout(Path(base).resolve())
        before = snapshot(ws, out)
        run_calls(ws, out, calls, mode, PolicyApprover(), DEFAULT_ALLOW)
        assert snapshot(ws, out) == before


@settings(PROPERTY, max_examples=150)
@given(st.lists(shell_call, min_size=1, max_size=3), st.sampled_from([Mode.ASK, Mode.READ_ONLY]), st.booleans())
def test_only_allow_rules_run_commands_unasked_and_they_never_write(isolated_user_dirs, calls, mode, with_rules):
    with tempfile.TemporaryDirectory() as base:
        ws, out = make_layout(Path(base).resolve())
        before = snapshot(ws, out)
        ran = run_calls(ws, out, calls, mode, PolicyApprover(), DEFAULT_ALLOW if with_rules else ())
        assert snapshot(ws, out) == before  # what allow rules let run never writes
        if mode is Mode.ASK and not with_rules:
            assert ran == []
        if mode is Mode.READ_ONLY:  # read-only runs only commands that read, whatever the rules
            assert all(programs(command) <= READERS for command in ran), ran


READERS = {"ls", "cat", "wc", "echo", "git status"}


def programs(command: str) -> set[str]:
    """The programs of every part of a command line (`git status` with its subcommand)."""
    return {" ".join(p.words[:2]) if p.words[0] == "git" else p.words[0] for p in split_command(command) if p.words}


def fresh_home(base: Path) -> Path:
    """A new home folder (HOME points at it) with a secret in it, which `$HOME`, `~` and `cd` reach."""
    home = base / "home"
    home.mkdir()
    (home / "secret.txt").write_text(SECRET + "\n")
    os.environ["HOME"] = str(home)  # the isolated_user_dirs fixture restores it after the test
    return home


@settings(PROPERTY, max_examples=150)
@given(st.lists(shell_call, min_size=1, max_size=3), st.sampled_from(list(Mode)))
# found by this test: bashlex keeps the empty `` in the word, bash drops it and globs */secret.txt through link_out
@example(calls=[("run_shell", {"command": "echo `echo `touch t1 ; cat */secret.txt``"})], mode=Mode.READ_ONLY)
def test_no_command_reads_or_writes_outside_the_workspace_unasked(isolated_user_dirs, calls, mode):
    with tempfile.TemporaryDirectory() as base:
        ws, out = make_layout(Path(base).resolve())
        home = fresh_home(Path(base).resolve())
        outside_before = snapshot(out, home)
        results = []
        run_calls(ws, out, calls, mode, PolicyApprover(), DEFAULT_ALLOW, results)
        assert snapshot(out, home) == outside_before
        assert not any(SECRET in result for result in results), results


def test_path_approval_is_what_lets_a_read_leave_the_workspace(tmp_path):
    ws, out = make_layout(tmp_path)
    (out / "secret.txt").write_text("s3cret\n")
    approver = ScriptedApprover.of(paths=[PathDecision(False, "no"), PathDecision(True)])
    context = ToolContext(Workspace(ws), approver, Mode.AUTO, ShellPolicy(), ProposalBook(), lambda e: None)

    async def read(path):
        return await run_tool(all_tools(), context, ToolCall("c", "read_file", {"path": path}))

    denied = asyncio.run(read("link_out/secret.txt"))
    assert denied.is_error and "outside the workspace" in denied.content and "s3cret" not in denied.content
    assert "s3cret" in asyncio.run(read(str(out / "secret.txt"))).content
    assert [r.action for r in approver.seen_paths] == ["read", "read"]
