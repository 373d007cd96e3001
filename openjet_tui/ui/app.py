"""`openjet`: the full-screen app. It drives the agent core through its events and answers its Approver with
inline prompts; `main(args)` is what the command line calls when no subcommand is given."""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeVar

import httpx
from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.worker import WorkerCancelled, WorkerFailed

from openjet_tui.agent import events as ev
from openjet_tui.agent.loop import Agent
from openjet_tui.agent.proposals import ProposalBook
from openjet_tui.agent.watch import WorkspaceWatcher
from openjet_tui.errors import OpenJetError
from openjet_tui.llm.probe import ProbeReport
from openjet_tui.runtime.hardware import GpuSample, probe_hardware, sample_gpus
from openjet_tui.ui.approver import InlineApprover
from openjet_tui.ui.commands import COMMANDS, mode_candidates
from openjet_tui.ui.controller import AgentController, LaunchOptions, describe_error
from openjet_tui.ui.figures import backend_info, format_bytes, parse_prometheus
from openjet_tui.ui.pump import EventPump
from openjet_tui.ui.screens.chat import ChatScreen
from openjet_tui.ui.slash import SlashCommands, endpoint_label
from openjet_tui.ui.widgets.prompt_box import CompletionSources, PromptInput
from openjet_tui.ui.widgets.prompts import AnswerPrompt

T = TypeVar("T")
METRICS_INTERVAL_S = 1.0
GPU_INTERVAL_S = 2.0
GC_THRESHOLDS = (5_000, 5, 1_000)  # allocations per young collection; young per middle; middle per full
GpuSampler = Callable[[], list[GpuSample]]
EngineStarter = Callable[..., Any]  # runtime.launch.start_engine's shape: (progress=, on_event=, airgapped=)


# Languages replies and diffs show most; each costs a lexer load on first use.
WARM_UP_SNIPPETS = (("python", "def f(x):\n    return x\n"), ("bash", "echo ok\n"), ("json", '{"a": 1}\n'),
                    ("toml", "a = 1\n"), ("diff", "-a\n+b\n"), ("markdown", "# a\n"))


class OpenJetApp(SlashCommands, App[int]):
    """Conversation, approvals, engine panel and Slipstream over one AgentController."""

    CSS_PATH = "app.tcss"
    TITLE = "OpenJet"
    BINDINGS = [
        Binding("escape", "cancel_turn", "Cancel turn"),
        Binding("f1", "command('/help')", "Keys"),
        Binding("f2", "command('/engine')", "Engine panel"),
        Binding("f3", "command('/slipstream')", "Slipstream"),
        Binding("f4", "command('/resume')", "Resume"),
    ]
    DEFAULT_MODE = "chat"  # a mode's base screen gets its CSS_PATH loaded (a plain default screen would not)
    is_busy: reactive[bool] = reactive(False, init=False)

    def __init__(self, options: LaunchOptions, *, editor: str | None = None,
                 gpu_sampler: GpuSampler | None = sample_gpus, poll_metrics: bool = True,
                 watch_workspace: bool = True, engine_starter: EngineStarter | None = None):
        super().__init__()
        self.add_mode("chat", self._new_chat_screen)
        self.approver = InlineApprover(self, editor=editor)
        self.pump = EventPump(self.deliver_events, settle=self._drawn, on_error=self._drawing_failed)
        self.controller = AgentController(options, self.approver, self.on_agent_event)
        self.gpu_sampler, self.poll_metrics, self.watch_enabled = gpu_sampler, poll_metrics, watch_workspace
        self.queued: list[str] = []
        self.models: list[str] = []
        self.engine_session: Any = None  # runtime.launch.EngineSession when the app started the engine
        self.engine_starter = engine_starter  # None: runtime.launch.start_engine
        self.watcher: WorkspaceWatcher | None = None
        self._gpu_timer: Timer | None = None
        self._stop_watch = asyncio.Event()

    # ---- screens and state ---------------------------------------------------------------------------------
    def _new_chat_screen(self) -> ChatScreen:
        """The chat screen, with completion fed by the controller."""
        sources = CompletionSources([(c.slash, c.help) for c in COMMANDS], self._argument_candidates,
                                    lambda query: self.controller.index.complete(query))
        return ChatScreen(sources)

    @property
    def chat(self) -> ChatScreen:
        """The main screen (under any modal)."""
        screen = self.screen_stack[0] if self.screen_stack else self.screen
        assert isinstance(screen, ChatScreen)
        return screen

    def _argument_candidates(self, command: str, partial_text: str) -> list[tuple[str, str]]:
        if command == "/mode":
            return mode_candidates(partial_text)
        if command == "/model":
            return [(name, "") for name in self.models]
        if command == "/resume":
            return [(s.id, s.title[:50]) for s in self.controller.sessions()]
        return []

    def on_ready(self) -> None:
        """Once the screen is up: show who we are talking to, connect, watch the workspace, start the live figures."""
        # Long streams allocate many short-lived line objects; default thresholds then run full collections over
        # the whole heap every few seconds (pauses of 100-300 ms, felt as a frozen keyboard). Startup objects
        # leave the collector's scans, and full collections become rarer.
        gc.freeze()
        gc.set_threshold(GC_THRESHOLDS[0], GC_THRESHOLDS[1], GC_THRESHOLDS[2])
        controller, chat = self.controller, self.chat
        chat.set_workspace(controller.workspace_root)
        chat.status_bar.mode = controller.mode.value
        chat.status_bar.model = controller.endpoint.model or "(server default)"
        chat.status_bar.session_id = controller.session.id if controller.session else "new"
        chat.engine_panel.backend, chat.engine_panel.reason = endpoint_label(controller)
        if controller.session is not None:
            chat.remember_sent(controller.stored_messages())
        self.connect()
        self.warm_up_highlighting()
        if self.watch_enabled:
            self.watch_workspace()
        if self.gpu_sampler is not None:
            self.sample_gpu()
            self._gpu_timer = self.set_interval(GPU_INTERVAL_S, self.sample_gpu)

    @property
    def is_showing(self) -> bool:
        """False while the app shuts down (workers may still be finishing)."""
        return self.is_running and bool(self.screen_stack) and isinstance(self.screen_stack[0], ChatScreen)

    def watch_is_busy(self, is_busy: bool) -> None:
        """Say in the status bar that a turn is running."""
        if self.is_showing:
            self.chat.status_bar.activity = "working" if is_busy else ""

    def on_agent_event(self, event: ev.Event) -> None:
        """Every agent event: timed as it happens, drawn with the next frame's batch."""
        if self.is_showing:
            self.chat.clock(event)
        self.pump.push(event)

    async def deliver_events(self, events: list[ev.Event]) -> None:
        """Draw a batch of agent events (the pump calls this at most once per frame)."""
        if self.is_showing:
            await self.chat.show_events(events)

    async def _drawn(self) -> None:
        """Until the screen has refreshed (the pump times its frames by this)."""
        if not self.is_showing:
            return
        refreshed = asyncio.get_running_loop().create_future()
        self.chat.call_after_refresh(lambda: refreshed.done() or refreshed.set_result(None))
        try:
            await asyncio.wait_for(refreshed, timeout=1.0)
        except asyncio.TimeoutError:
            pass  # no refresh came (nothing visible changed); do not hold the next frame back

    def _drawing_failed(self, exc: BaseException) -> None:
        self.log.error("drawing events failed", exc)
        self.notify(f"could not draw part of the conversation: {describe_error(exc)}", severity="error")

    async def ask(self, prompt: AnswerPrompt[T]) -> T:
        """Show an approval prompt after everything the agent said before it."""
        await self.pump.flush()
        return await self.chat.ask(prompt)

    # ---- connecting ----------------------------------------------------------------------------------------
    @work(exclusive=True, group="connect")
    async def connect(self) -> None:
        """Start the local engine when needed, probe the server, load a resumed session."""
        controller = self.controller
        try:
            if controller.needs_local_engine:
                await self.start_local_engine()
            report = await controller.connect()
        except (OpenJetError, httpx.HTTPError) as exc:
            if self.is_showing:
                await self.chat.notice(f"cannot use the model server: {describe_error(exc)}", "error")
            return
        if self.is_showing:  # the person may have quit while we waited
            await self._show_connection(report)

    async def _show_connection(self, report: ProbeReport) -> None:
        chat, controller = self.chat, self.controller
        for note in report.notes:
            await chat.notice(note)
        if not report.is_usable:
            for problem in report.problems:
                await chat.notice(f"{controller.endpoint.provider} at {controller.endpoint.base_url}: {problem}",
                                  "error")
            return
        chat.status_bar.model = controller.endpoint.model or "(server default)"
        chat.engine_panel.model = controller.endpoint.model or "-"
        chat.figures.context_window = controller.context_window
        chat.show_figures()
        if controller.wants_slipstream:  # asked for on the command line or in settings: confirm it all the same
            self.run_command("/slipstream")
        if controller.setup.is_resumed and controller.session is not None:
            await chat.show_history(controller.stored_messages())
            await self.pump.flush()  # notes from recovering an interrupted turn
        controller.mark_ready()  # only now: the history must not replace a message sent meanwhile
        if self.poll_metrics and controller.endpoint.is_loopback:
            self.poll_engine_metrics()
        self._start_queued()

    async def start_local_engine(self) -> None:
        """Set up if needed and start the best engine (runtime.launch); the panel shows why it was chosen."""
        from openjet_tui.runtime.launch import start_engine
        from openjet_tui.runtime.progress import ProgressEvent

        panel = self.chat.engine_panel
        panel.backend, panel.reason = "starting…", "choosing and starting the best engine for this machine"

        def progress(event: ProgressEvent) -> None:
            """Setup and start-up progress, from the runtime's thread, into the panel."""
            amount = format_bytes(int(event.done)) if event.unit == "B" else f"{event.done:.0f}{event.unit}"
            if event.total:
                amount += f" of {format_bytes(int(event.total)) if event.unit == 'B' else f'{event.total:.0f}'}"
            self.call_from_thread(setattr, panel, "reason", f"{event.task}: {amount} {event.note}".strip())

        def worker_event(event: Any) -> None:
            """The engine worker started, crashed, restarted...: a line in the conversation."""
            self.call_from_thread(self.pump.push, ev.Notice(f"engine {event.kind}: {event.message}",
                                                            "warning" if event.kind != "healthy" else "info"))

        starter = self.engine_starter or start_engine
        # The workspace's own airgapped setting (it may be another folder than the one the app started in).
        session = await asyncio.to_thread(starter, progress=progress, on_event=worker_event,
                                          airgapped=self.controller.is_airgapped)
        self.engine_session = session
        self.controller.use_local_engine(session)
        panel.backend, panel.reason = session.label, session.reason
        panel.decisions = list(session.selection.decisions)  # every engine considered, with its reason
        for note in session.notes:
            await self.chat.notice(note)

    @work(exclusive=True, group="metrics")
    async def poll_engine_metrics(self) -> None:
        """Read the server's /metrics every second while it answers (loopback servers only)."""
        url = self.controller.endpoint.root_url + "/metrics"
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            while True:
                try:
                    response = await http.get(url)
                except httpx.HTTPError:
                    await asyncio.sleep(METRICS_INTERVAL_S * 5)
                    continue
                if response.status_code == 404:
                    return  # this server has no metrics: its `timings` are all there is
                if response.status_code == 200:
                    self.show_engine_metrics(response.text)
                await asyncio.sleep(METRICS_INTERVAL_S)

    def show_engine_metrics(self, text: str) -> None:
        """Fold a /metrics scrape into the engine panel: figures, and the backend the engine reports with its reason
        (beside the app's own choice and reason when the app chose the engine)."""
        samples = parse_prometheus(text)
        chat = self.chat
        if chat.figures.apply_metrics(samples):
            chat.show_figures()
        info, panel = backend_info(samples), chat.engine_panel
        if not info.get("backend"):
            return
        if self.engine_session is not None:
            reason = info.get("backend_reason", "")
            panel.report = f"{info['backend']}{': ' + reason if reason else ''}"
        else:
            panel.backend, panel.reason = info["backend"], info.get("backend_reason", "")

    @work(thread=True, exclusive=True, group="warm-up")
    def warm_up_highlighting(self) -> None:
        """Load the syntax highlighter and its common lexers now, off the event loop: done lazily by the first code
        block of a reply, it froze the keyboard for ~150 ms (the import and the first lexer)."""
        from textual.highlight import highlight

        for language, code in WARM_UP_SNIPPETS:
            highlight(code, language=language)

    @work(thread=True, exclusive=True, group="gpu")
    def sample_gpu(self) -> None:
        """NVML figures in a thread; without NVML, say why once and stop asking."""
        sampler = self.gpu_sampler
        if sampler is None:
            return
        gpus = sampler()
        note = ""
        if not gpus:
            note = probe_hardware().gpu_summary() if sampler is sample_gpus else "no GPU figures"
            self.gpu_sampler = None  # nothing to poll
        self.call_from_thread(self._show_gpus, gpus, note)

    def _show_gpus(self, gpus: list[GpuSample], note: str) -> None:
        if not gpus and self._gpu_timer is not None:
            self._gpu_timer.stop()
        if self.is_showing:
            panel = self.chat.engine_panel
            panel.gpus, panel.gpu_note = gpus, note

    @work(group="watch")
    async def watch_workspace(self) -> None:
        """Watch the workspace: stale proposals, the @path index, AGENTS.md and project config reloads."""
        controller = self.controller
        book = controller.agent.ctx.book if controller.agent else ProposalBook()
        self.watcher = WorkspaceWatcher(controller.setup.workspace, book, controller.index, self.pump.push,
                                        on_agents_md=self._reload_agents_md, on_config=self._reload_config)
        controller.on_agent_changed = self._follow_agent
        await self.watcher.run(self._stop_watch)

    def _follow_agent(self, agent: Agent) -> None:
        if self.watcher is not None:
            self.watcher.book = agent.ctx.book

    def _reload_agents_md(self) -> None:
        if self.controller.agent is not None:
            self.controller.agent.reload_context()
            self.pump.push(ev.Notice("AGENTS.md changed: project instructions reloaded"))

    def _reload_config(self) -> None:
        try:
            self.pump.push(ev.Notice(self.controller.reload_settings()))
        except OpenJetError as exc:
            self.pump.push(ev.Notice(f"project settings not reloaded: {exc}", "warning"))

    # ---- turns ---------------------------------------------------------------------------------------------
    @on(PromptInput.Submitted)
    async def message_submitted(self, event: PromptInput.Submitted) -> None:
        """A slash command runs; anything else is a message to the agent (queued while a turn runs)."""
        text = event.text
        if text.startswith("/") and not text.startswith("//"):
            self.run_command(text)
            return
        text = text[1:] if text.startswith("//") else text
        if self.is_busy or not self.controller.ready.is_set():
            self.queued.append(text)
            self.notify("queued: it is sent when the running turn ends (esc cancels the turn and the queue)"
                        if self.is_busy else "queued: it is sent once the model server answers")
            return
        await self.chat.add_user_message(text)
        self.run_turn(text)

    @work(exclusive=True, group="turn")
    async def run_turn(self, text: str) -> None:
        """Run one turn; errors at this edge become a line in the conversation."""
        self.is_busy = True
        try:
            await self.controller.run_turn(text)
        except (OpenJetError, httpx.HTTPError) as exc:
            await self.chat.notice(describe_error(exc), "error")
        finally:
            await self._turn_ended()  # everything drawn before the turn counts as over
            self.is_busy = False
        self._start_queued()

    def _start_queued(self) -> None:
        """Send the oldest queued message, if any (the new turn's worker replaces the finished one)."""
        if self.queued and self.is_showing and not self.is_busy:
            following = self.queued.pop(0)
            self.is_busy = True  # at once, so nothing else starts a turn before the worker runs
            self.run_worker(self._send_queued(following), exclusive=True, group="queue")

    async def _send_queued(self, text: str) -> None:
        await self.chat.add_user_message(text)
        self.run_turn(text)

    async def _turn_ended(self) -> None:
        """Draw what is left and show the session (unless the app is closing)."""
        if not self.is_showing:
            return
        await self.pump.flush()
        if self.is_showing:
            session = self.controller.session
            self.chat.status_bar.session_id = session.id if session else "new"

    def action_cancel_turn(self) -> None:
        """Esc: stop the running turn at once (and drop queued messages)."""
        if not self.is_busy:
            return
        if self.queued:
            self.notify(f"dropped {len(self.queued)} queued message(s)")
            self.queued.clear()
        self.workers.cancel_group(self, "turn")

    def action_command(self, text: str) -> None:
        """Run a slash command from a key or the palette."""
        self.run_command(text)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The command palette: every slash command and key action, then Textual's own."""
        yield SystemCommand("Cancel the running turn", "stop the agent now (esc)", self.action_cancel_turn)
        for command in COMMANDS:
            yield SystemCommand(command.usage, command.help + (f" ({command.key})" if command.key else ""),
                                partial(self.run_command, command.slash))
        yield SystemCommand("Load earlier messages", "mount the whole history (ctrl+home)",
                            self.chat.conversation.action_load_all_older)
        yield from self._prompt_commands()
        yield from super().get_system_commands(screen)

    def _prompt_commands(self) -> Iterable[SystemCommand]:
        """The keys of the approval prompts waiting for an answer (diff review, shell or path prompt)."""
        if not self.is_showing:
            return
        for prompt in self.chat.prompt_area.query(AnswerPrompt):
            for binding in prompt.palette_actions():
                yield SystemCommand(f"{binding.description} ({binding.key})", f"answer the {prompt.KIND}",
                                    partial(prompt.run_action, binding.action))

    async def on_unmount(self) -> None:
        """End a running turn as Esc would (the session stays resumable), stop watching, close clients, and stop
        an engine the app started."""
        for worker in [w for w in self.workers if w.group == "turn" and w.is_running]:
            worker.cancel()
            try:
                await worker.wait()
            except (WorkerCancelled, WorkerFailed):
                pass  # cancelled is what we asked for; a failure was already reported where it happened
        self._stop_watch.set()
        await self.pump.close()
        await self.controller.aclose()
        if self.engine_session is not None:
            await asyncio.to_thread(self.engine_session.close)


def main(args: argparse.Namespace) -> int:
    """Open the app with the options of `openjet run`; bad options or settings exit 2 with the reason."""
    try:
        app = OpenJetApp(LaunchOptions.from_args(args))
    except OpenJetError as exc:
        print(f"openjet: error: {exc}", file=sys.stderr)
        return 2
    return app.run() or 0
