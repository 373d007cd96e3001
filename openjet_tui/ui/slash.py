"""The app's slash commands, one `cmd_<name>` method each (mixed into OpenJetApp)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
from textual import work

from openjet_tui.agent.shellpolicy import Mode
from openjet_tui.errors import OpenJetError
from openjet_tui.ui.commands import mode_candidates, parse_command, UnknownCommandError
from openjet_tui.ui.controller import AgentController, describe_error
from openjet_tui.ui.screens.confirm import SlipstreamConfirm
from openjet_tui.ui.screens.diff import DiffScreen
from openjet_tui.ui.screens.help import HelpScreen
from openjet_tui.ui.screens.picker import PickerScreen, session_choices

if TYPE_CHECKING:
    from openjet_tui.ui.screens.chat import ChatScreen

PROVIDER_LABELS = {"openjet": "OpenJet engine", "llama-server": "llama-server", "ollama": "Ollama",
                   "lmstudio": "LM Studio", "openai-compatible": "OpenAI-compatible server",
                   "slipstream": "cloud endpoint"}


def endpoint_label(controller: AgentController) -> tuple[str, str]:
    """The engine panel's backend line and why that backend serves."""
    endpoint, options = controller.endpoint, controller.options
    if controller.needs_local_engine:
        return "starting…", "choosing the best engine for this machine"
    label = PROVIDER_LABELS.get(endpoint.provider, endpoint.provider)
    where = "the command line" if options.base_url or options.provider else "the settings (openjet config show)"
    if not endpoint.is_loopback:
        return f"cloud: {label}", f"{endpoint.base_url}, chosen in {where}"
    return label, f"{endpoint.base_url}, chosen in {where}"


class SlashCommands:
    """`/help`, `/model`, `/mode`, `/resume`, `/compact`, `/undo`, `/diff`, `/clear`, `/slipstream`, `/engine`,
    `/quit`. Commands that change the conversation wait for the running turn to end."""

    controller: AgentController
    models: list[str]
    is_busy: bool
    chat: ChatScreen
    notify: Any
    push_screen: Any
    exit: Any

    @work(group="command")
    async def run_command(self, text: str) -> None:
        """Parse and run one slash command; errors become a line in the conversation."""
        try:
            command, argument = parse_command(text)
            await getattr(self, f"cmd_{command.name}")(argument)
        except UnknownCommandError as exc:
            self.notify(str(exc), severity="warning")
        except (OpenJetError, httpx.HTTPError) as exc:
            await self.chat.notice(describe_error(exc), "error")

    def _refuse_while_busy(self, name: str) -> bool:
        if self.is_busy:
            self.notify(f"/{name} waits for the running turn: esc cancels it", severity="warning")
        return self.is_busy

    async def cmd_help(self, argument: str) -> None:
        """Show the keys and commands."""
        await self.push_screen(HelpScreen())

    async def cmd_model(self, argument: str) -> None:
        """Set the model, or pick one from those the server lists."""
        name = argument
        if not name:
            self.models = await self.controller.list_models()
            name = await self.push_screen(PickerScreen("model", [(m, m) for m in self.models],
                                                       "the server lists no models"), wait_for_dismiss=True) or ""
        if name:
            self.controller.set_model(name)
            self.chat.status_bar.model = self.chat.engine_panel.model = name
            await self.chat.notice(f"model: {name} (from the next request)")

    async def cmd_mode(self, argument: str) -> None:
        """Set the approval mode, or pick one."""
        text = argument
        if not text:
            choices = [(value, f"{value:10} {note}") for value, note in mode_candidates("")]
            text = await self.push_screen(PickerScreen("approval mode", choices), wait_for_dismiss=True) or ""
        if text:
            mode = Mode.parse(text)
            self.controller.set_mode(mode)
            self.chat.status_bar.mode = mode.value
            await self.chat.notice(f"mode: {mode.value}")

    async def cmd_resume(self, argument: str) -> None:
        """Switch to a stored session of this workspace (picker without an id)."""
        if self._refuse_while_busy("resume"):
            return
        session_id = argument
        if not session_id:
            current = self.controller.session.id if self.controller.session else None
            choices = session_choices(self.controller.sessions(), current)
            session_id = await self.push_screen(PickerScreen("resume a session", choices,
                                                             "no stored sessions in this workspace"),
                                                wait_for_dismiss=True) or ""
        if session_id:
            messages = await self.controller.resume(session_id)
            await self.chat.show_history(messages)
            assert self.controller.session is not None
            self.chat.status_bar.session_id = self.controller.session.id
            self.chat.remember_sent(messages)
            await self.chat.notice(f"resumed session {self.controller.session.id} ({len(messages)} messages)")

    async def cmd_compact(self, argument: str) -> None:
        """Summarise older turns now."""
        if self._refuse_while_busy("compact"):
            return
        if not await self.controller.compact():
            await self.chat.notice("nothing to compact yet: only recent turns remain")

    async def cmd_undo(self, argument: str) -> None:
        """Restore the file of the newest applied edit."""
        if not self._refuse_while_busy("undo"):
            await self.chat.notice(f"undone: {self.controller.undo()}")

    async def cmd_diff(self, argument: str) -> None:
        """Show what this session changed."""
        await self.push_screen(DiffScreen(self.controller.session_changes()))

    async def cmd_clear(self, argument: str) -> None:
        """Start a new conversation."""
        if self._refuse_while_busy("clear"):
            return
        await self.controller.new_session()
        await self.chat.conversation.clear()
        self.chat.status_bar.session_id = "new"

    async def cmd_slipstream(self, argument: str) -> None:
        """Turn Slipstream off, or on after the person confirms where what goes (never when airgapped)."""
        if self._refuse_while_busy("slipstream"):
            return
        if self.controller.is_slipstream_on:
            await self.controller.disable_slipstream()
            self._show_slipstream()
            await self.chat.notice("Slipstream is off: everything stays on this machine")
            return
        try:
            plan = self.controller.slipstream_plan()
        except OpenJetError as exc:
            self.notify(str(exc), title="Slipstream cannot be turned on", severity="error", timeout=10)
            await self.chat.notice(f"Slipstream stays off: {exc}", "warning")
            return
        if await self.push_screen(SlipstreamConfirm(plan), wait_for_dismiss=True):
            endpoint = await self.controller.enable_slipstream()
            self._show_slipstream()
            await self.chat.notice(f"Slipstream is on: planning and review go to {endpoint.base_url} "
                                   f"({endpoint.model})", "warning")

    def _show_slipstream(self) -> None:
        """Banner on or off, naming the endpoint."""
        banner, slipstream = self.chat.banner, self.controller.slipstream
        banner.is_on = slipstream is not None
        if slipstream is not None:
            banner.endpoint, banner.model = slipstream.cloud.endpoint.base_url, slipstream.cloud.endpoint.model or "-"

    async def cmd_engine(self, argument: str) -> None:
        """Show or hide the engine panel."""
        self.chat.toggle_engine_panel()

    async def cmd_quit(self, argument: str) -> None:
        """Leave the app."""
        self.exit(0)
