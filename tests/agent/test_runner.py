"""The command runner: exit codes, head+tail output cap, timeout and cancel kill the whole process group."""

import asyncio
import os
import time

from openjet_tui.agent.runner import OutputCap, run_command


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): look at its state
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


async def wait_dead(pid: int, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def our_children() -> list[int]:
    """Processes whose parent is this one."""
    children = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().split(")")[-1].split()[1]) == os.getpid():
                    children.append(int(entry))
        except (ValueError, OSError):
            continue
    return children


def test_output_cap_keeps_head_and_tail():
    cap = OutputCap(20)
    for i in range(100):
        cap.add(f"{i:03d}\n".encode())
    text = cap.text()
    assert text.startswith("000\n001\n00") and text.endswith("098\n099\n")
    assert cap.is_truncated and "380 bytes of output omitted" in text


async def test_exit_code_output_and_cwd(tmp_path):
    (tmp_path / "f.txt").write_text("hello\n")
    result = await run_command("cat f.txt; echo err >&2; exit 3", tmp_path, 10, 1000)
    assert result.exit_code == 3 and result.output == "hello\nerr\n" and not result.timed_out
    assert result.describe(10).startswith("exit code 3\nhello")


async def test_large_output_is_capped(tmp_path):
    result = await run_command("seq 1 100000", tmp_path, 10, 2000)
    assert result.is_truncated and result.num_output_bytes == len("".join(f"{i}\n" for i in range(1, 100001)))
    assert result.output.startswith("1\n2\n3\n") and result.output.endswith("99999\n100000\n")
    assert len(result.output) < 2100


async def test_timeout_kills_the_whole_group(tmp_path):
    started = time.monotonic()
    result = await run_command("sleep 30 & echo $! > child.pid; sleep 30", tmp_path, 0.3, 1000)
    assert result.timed_out and result.exit_code is None and time.monotonic() - started < 5
    assert await wait_dead(int((tmp_path / "child.pid").read_text()))
    assert "timed out after 0.3s" in result.describe(0.3)


async def test_cancel_kills_the_whole_group(tmp_path):
    task = asyncio.create_task(run_command("sleep 30 & echo $! > child.pid; wait", tmp_path, 60, 1000))
    while not (tmp_path / "child.pid").exists() or not (tmp_path / "child.pid").read_text().strip():
        await asyncio.sleep(0.02)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the run was not cancelled")
    assert await wait_dead(int((tmp_path / "child.pid").read_text()))


async def test_cancel_while_the_shell_starts_kills_the_whole_group(tmp_path):
    """Cancelled while asyncio still connects the pipes: asyncio's own clean-up kills the shell alone, so the
    runner must still get hold of the process and kill its group (the likely cause of a CI failure of the test
    above: a loaded machine can hold the loop in that window while the shell starts its child)."""
    earlier = set(our_children())  # what other tests of this worker left running
    task = asyncio.create_task(run_command("sleep 120 & echo $! > child.pid; wait", tmp_path, 60, 1000))
    deadline = time.monotonic() + 10
    while not set(our_children()) - earlier:  # the step that forks the shell ends waiting for its pipes
        assert time.monotonic() < deadline, "the shell never started"
        await asyncio.sleep(0)
    while not (tmp_path / "child.pid").exists() or not (tmp_path / "child.pid").read_text().strip():
        assert time.monotonic() < deadline, "the shell never started its child"
        time.sleep(0.01)  # blocking on purpose: the pipes stay unconnected until the cancel
    task.cancel()
    # the orphaned child holds the pipes, so a runner that lost it hangs until the child ends on its own
    done, _ = await asyncio.wait({task}, timeout=15)
    assert task in done and task.cancelled()
    assert await wait_dead(int((tmp_path / "child.pid").read_text()))


async def test_background_child_does_not_hold_the_result(tmp_path):
    started = time.monotonic()
    result = await run_command("(sleep 30 &) ; echo done", tmp_path, 20, 1000)
    assert result.exit_code == 0 and result.output == "done\n" and time.monotonic() - started < 3


SECRET_KEY_NAMES = ["OPENAI_API_KEY", "LLAMA_API_KEY", "OPENJET_SLIPSTREAM_API_KEY",
                    "OPENJET_OPENAI_COMPATIBLE_API_KEY", "OPENJET_SOME_FUTURE_PROVIDER_API_KEY", "GITHUB_TOKEN",
                    "ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD", "hf_token"]


async def test_commands_never_see_the_api_keys_providers_read(monkeypatch, tmp_path):
    from openjet_tui.llm.providers import key_env_names

    assert {"OPENAI_API_KEY", "LLAMA_API_KEY", "OPENJET_SLIPSTREAM_API_KEY"} <= key_env_names()
    for number, name in enumerate(SECRET_KEY_NAMES):
        monkeypatch.setenv(name, f"sk-secret-{number}")
    monkeypatch.setenv("OPENJET_VISIBLE_SETTING", "kept")
    script = "; ".join(f'echo "{name}=${{{name}:-unset}}"' for name in SECRET_KEY_NAMES)
    result = await run_command(f"{script}; echo visible=$OPENJET_VISIBLE_SETTING; env", tmp_path, 10, 100_000)
    assert "sk-secret" not in result.output
    assert all(f"{name}=unset" in result.output for name in SECRET_KEY_NAMES)
    assert "visible=kept" in result.output and "PATH=" in result.output  # the rest of the environment is there
    assert os.environ["OPENAI_API_KEY"] == "sk-secret-0"  # our own environment keeps the key


async def test_a_key_echoed_by_the_model_reaches_neither_the_model_nor_the_session_db(monkeypatch, server, workspace,
                                                                                       make_agent, tmp_path):
    from openjet_tui.agent.approver import ScriptedApprover
    from openjet_tui.agent.shellpolicy import Mode
    from tests.agent.scripted_server import call, reply

    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-0123456789")
    server.push(reply(tool_calls=[call("run_shell", command="echo key=$OPENAI_API_KEY")]), reply("Printed it."))
    agent, _ = make_agent(server, workspace, ScriptedApprover(), Mode.AUTO)
    assert (await agent.run_turn("print the key")).status == "done"
    result = [m for m in server.chat_bodies[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert result.startswith("exit code 0") and "key=" in result and "sk-live" not in result
    stored = b"".join(path.read_bytes() for path in tmp_path.glob("sessions.db*"))  # the WAL too
    assert b"echo key=" in stored and b"sk-live" not in stored
