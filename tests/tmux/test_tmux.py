"""What a new user does, in a real terminal: start `openjet` in tmux against the scripted server, type a request,
accept one hunk and reject the other with keys, and check the screen and the file on disk."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent.scripted_server import ScriptedServer, call, reply

OPENJET = Path(sys.executable).with_name("openjet")
SOURCE = "".join(f"line {i}\n" for i in range(1, 31))
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (apt-get install tmux); this test drives the real "
                                       "openjet in a tmux terminal")


class Tmux:
    """One detached tmux session running a command in a 120x40 terminal."""

    def __init__(self, command: str, env: dict[str, str], config: Path):
        self.name = f"openjet-test-{uuid.uuid4().hex[:8]}"
        self.socket = self.name  # a private tmux server: nobody else's sessions or options are touched
        # without an attached client tmux would shrink the window to 80x24; fix the size before the app starts
        config.write_text("set -g default-size 120x40\n")
        exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        self.tmux("-f", str(config), "new-session", "-d", "-s", self.name, "-x", "120", "-y", "40",
                  f"env {exports} {command}")

    def tmux(self, *arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a tmux command on the private server."""
        return subprocess.run(["tmux", "-L", self.socket, *arguments], capture_output=True, text=True, check=check)

    def screen(self) -> str:
        """The pane's text as shown now."""
        return self.tmux("capture-pane", "-p", "-t", self.name, check=False).stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        """Type keys (tmux key names, or literal text)."""
        self.tmux("send-keys", "-t", self.name, *(["-l"] if literal else []), *keys)

    def wait_for(self, condition: Callable[[str], bool], what: str, timeout: float = 30.0) -> str:
        """The screen, once `condition(screen)` holds; fails with the last screen after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if condition(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the screen was:\n{text}")
            time.sleep(0.1)

    def is_alive(self) -> bool:
        """Whether the session (and so the app) is still running."""
        return self.tmux("has-session", "-t", self.name, check=False).returncode == 0

    def close(self) -> None:
        """Stop the private tmux server, and with it the app if it still runs."""
        self.tmux("kill-server", check=False)


def test_new_user_reviews_an_edit_in_a_real_terminal(tmp_path):
    workspace = tmp_path / "project"
    workspace.mkdir()
    (workspace / "app.py").write_text(SOURCE)
    home = tmp_path / "home"
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / "data"),
           "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring", "TERM": "xterm-256color",
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    edits = [{"old_text": "line 2\n", "new_text": "line two\n"},
             {"old_text": "line 25\n", "new_text": "line twenty-five\n"}]
    replies = [reply("I'll rename both lines.", tool_calls=[call("edit_file", path="app.py", edits=edits)]),
               reply("Renamed line 2; line 25 stays as you asked.")]
    with ScriptedServer(replies, context_window=32768) as server:
        command = (f"{OPENJET} --provider llama-server --base-url {server.base_url} --workspace {workspace}")
        tmux = Tmux(command, env, tmp_path / "tmux.conf")
        try:
            tmux.wait_for(lambda s: "f1 keys" in s and "scripted-model" in s, "the app to connect")
            tmux.keys("rename lines 2 and 25 to words", literal=True)
            tmux.keys("Enter")
            screen = tmux.wait_for(lambda s: "Review edit: app.py" in s, "the diff review")
            assert "+ line two" in screen and "hunk 1/2" in screen
            assert (workspace / "app.py").read_text() == SOURCE  # nothing written before the decision
            tmux.keys("y")
            tmux.wait_for(lambda s: "hunk 2 of 2 · 1 accepted · 0 rejected" in s, "hunk 1 accepted")
            tmux.keys("n")
            tmux.wait_for(lambda s: "Why reject hunk 2?" in s, "the reason field")
            tmux.keys("keep 25 as a number", literal=True)
            tmux.keys("Enter")
            screen = tmux.wait_for(lambda s: "line 25 stays as you asked" in s, "the final answer")
            assert "partial: hunk 2 rejected" in screen
            assert (workspace / "app.py").read_text() == SOURCE.replace("line 2\n", "line two\n")
            tool_message = [m for m in server.chat_bodies[1]["messages"] if m["role"] == "tool"][-1]["content"]
            assert "rejected hunk 2 @@ -22,7 +22,7 @@: keep 25 as a number" in tool_message
            tmux.keys("C-q")
            deadline = time.monotonic() + 10
            while tmux.is_alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not tmux.is_alive(), "ctrl+q did not quit the app"
        finally:
            tmux.close()
