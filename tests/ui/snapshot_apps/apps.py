"""Snapshot apps: the real ChatScreen and widgets, fed fixed events, figures and requests (no server, no clock,
no NVML), so each SVG changes only when the UI does."""

from __future__ import annotations

import re
from pathlib import Path

from textual.app import App

from openjet_tui.agent import events as ev
from openjet_tui.agent.approver import ShellRequest
from openjet_tui.agent.proposals import make_proposal
from openjet_tui.agent.shellpolicy import Mode, ShellPolicy
from openjet_tui.config import DEFAULT_ALLOW, DEFAULT_DENY
from openjet_tui.runtime.hardware import GpuSample
from openjet_tui.ui import app as app_module
from openjet_tui.ui.commands import COMMANDS
from openjet_tui.ui.screens.chat import ChatScreen
from openjet_tui.ui.widgets.diff_review import DiffReview
from openjet_tui.ui.widgets.prompt_box import CompletionSources
from openjet_tui.ui.widgets.prompts import ShellPrompt

DATA = Path(__file__).parent / "data"
APP_TCSS = Path(app_module.__file__).with_name("app.tcss")
WORKSPACE = Path("/home/dev/shop")
GPU = GpuSample(0, "NVIDIA H200", 87, int(21.4 * 2**30), int(139.8 * 2**30), 61, 312.0)
TIMINGS = [(2410.0, 40, 98.5, 30, 22), (2480.0, 64, 104.2, 48, 37), (2502.0, 52, 101.7, 40, 31)]


def conversation_events() -> list[ev.Event]:
    """A short turn: reasoning, a read, a plan, an allowed command, usage and engine timings."""
    reasoning = "The report crashes on a blank quantity; read the loader first."
    events: list[ev.Event] = [ev.ReasoningDelta(word) for word in re.findall(r"\S+ ?", reasoning)]  # chunk per token
    events += [
        ev.TextDelta("I'll read the loader first."),
        ev.AssistantMessage("I'll read the loader first.", "", []),
        ev.ToolRequested("call_1", "read_file", {"path": "inventory.py"}),
        ev.ToolResult("call_1", "read_file", "     1\t\"\"\"Stock levels read from a CSV export.\"\"\""),
        ev.TodoUpdated([{"content": "Treat a blank quantity as 0", "status": "in_progress"},
                        {"content": "Add a test for blank rows", "status": "pending"}]),
        ev.ToolRequested("call_2", "run_shell", {"command": "git status --short"}),
        ev.ShellResolved("call_2", "git status --short", True, "rule", "allowed by rule `git status`"),
        ev.ToolResult("call_2", "run_shell", "exit code 0\n M inventory.py"),
        ev.TextDelta("`load_stock` calls `int()` on an empty string. I'll make blank quantities count as **0** "
                     "and add a test:\n\n```python\nstock[row[\"item\"]] = int(row[\"quantity\"] or 0)\n```"),
        ev.UsageReported(5720, 80, 5800, 32768),
    ]
    events += [ev.EngineStats(96, p, n, d, dn, da) for p, n, d, dn, da in TIMINGS]
    return events


class SnapshotApp(App[None]):
    """The app's stylesheet and chat screen, with a fixed status bar."""

    CSS_PATH = str(APP_TCSS)
    DEFAULT_MODE = "chat"

    def __init__(self) -> None:
        super().__init__()
        self.add_mode("chat", lambda: ChatScreen(CompletionSources([(c.slash, c.help) for c in COMMANDS])))

    @property
    def chat(self) -> ChatScreen:
        """The chat screen."""
        screen = self.screen_stack[0]
        assert isinstance(screen, ChatScreen)
        return screen

    async def on_ready(self) -> None:
        """Fixed facts first, then the app-specific content."""
        chat = self.chat
        chat.status_bar.mode, chat.status_bar.model = "ask", "qwen2.5-coder-0.5b"
        chat.status_bar.session_id, chat.status_bar.workspace = "3f2a9c1b7d40", "~/shop"
        panel = chat.engine_panel
        panel.backend, panel.model = "llama-server", "qwen2.5-coder-0.5b-instruct-q4_k_m"
        panel.reason = "no NVIDIA GPU: llama-server (CPU build) comes before the reference engine"
        panel.gpus, panel.gpu_note = [], "no NVIDIA GPU: the NVIDIA driver library (libnvidia-ml) is not installed"
        await self.show()

    async def show(self) -> None:
        """What this snapshot is about."""


class MainScreenApp(SnapshotApp):
    """A conversation mid-turn."""

    async def show(self) -> None:
        """The user message, then the turn's events."""
        await self.chat.add_user_message("The stock report crashes on rows with a blank quantity. Fix it.")
        await self.chat.show_events(conversation_events())


class DiffReviewApp(SnapshotApp):
    """A two-hunk edit under review, first hunk accepted."""

    async def show(self) -> None:
        """Propose an edit to the fixed inventory.py and open the review."""
        path = DATA / "inventory.py"
        old = path.read_text()
        new = old.replace("read from a CSV export.", "read from a CSV export; a blank quantity counts as 0.").replace(
            'int(row["quantity"])', 'int(row["quantity"] or 0)').replace("quantity <= limit", "0 < quantity <= limit")
        proposal = make_proposal(path, "inventory.py", old.encode(), new, "edit_file", "call_3")
        await self.chat.add_user_message("Treat blank quantities as zero, and skip items with no stock.")
        review = DiffReview(proposal)
        self.run_worker(self.chat.ask(review))


class ShellPromptApp(SnapshotApp):
    """A compound command: one part allowed by a rule, the others asking."""

    async def show(self) -> None:
        """Evaluate the command with the default rules and ask."""
        command = "git status && pytest -q tests | tee test.log"
        verdict = ShellPolicy(DEFAULT_ALLOW, DEFAULT_DENY).evaluate(command, Mode.ASK, WORKSPACE)
        await self.chat.add_user_message("Run the tests and keep a log.")
        self.run_worker(self.chat.ask(ShellPrompt(ShellRequest("call_4", command, WORKSPACE, verdict))))


class EnginePanelApp(SnapshotApp):
    """The engine panel with speeds, drafts, context and a GPU."""

    async def show(self) -> None:
        """Per-op CUDA figures and an H200 sample."""
        panel = self.chat.engine_panel
        panel.backend, panel.model = "OpenJet per-op CUDA", "qwen3.8-27b-q4_k_m"
        panel.reason = "sm_90, 118.4 GiB free of the 17.9 GiB needed"
        panel.gpus = [GPU]
        await self.chat.show_events([ev.UsageReported(5720, 80, 5800, 32768)] +
                                    [ev.EngineStats(96, p, n, d, dn, da) for p, n, d, dn, da in TIMINGS])


class EngineSelectionApp(EnginePanelApp):
    """The engine panel after the app chose the engine: every engine considered, the chosen one first-class."""

    async def show(self) -> None:
        """Per-op CUDA chosen on an H200, with the engine's own report from /metrics."""
        from openjet_tui.runtime.engines import Decision

        await super().show()
        panel = self.chat.engine_panel
        fits = "NVIDIA H200 (sm_90) has 139.3 GiB free, Qwen3.8-27B-Q4_K_M.gguf needs about 19.6 GiB at 32768 tokens"
        panel.backend, panel.reason = "OpenJet per-op CUDA", fits
        panel.report = "cuda: --backend cuda, sm_90"
        panel.decisions = [
            Decision("megakernel", False, f"not yet served by openjet-engine; this GPU and file would qualify: {fits}"),
            Decision("cuda", True, fits, is_chosen=True),
            Decision("llama-server", False, "not on PATH and not built yet"),
            Decision("ollama", False, "not running at http://127.0.0.1:11434"),
            Decision("lmstudio", False, "not running at http://127.0.0.1:1234"),
            Decision("reference", True, "numpy on 16 CPU cores: always works, slow (not needed: OpenJet per-op "
                                        "CUDA comes first)")]
