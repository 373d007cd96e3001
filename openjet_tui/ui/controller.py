"""Everything behind the app that is not drawing: settings, the model client, the agent, sessions, Slipstream.

The app owns one AgentController. It resolves options exactly as `openjet run` does (same settings layers, same
session rules), probes the server, builds the Agent with the app's inline Approver and hands every agent event to
the app. Nothing here imports Textual, so its behaviour is the same under Pilot, in tmux and in a real terminal.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openjet_tui.agent import events as ev
from openjet_tui.agent.approver import Approver
from openjet_tui.agent.context import build_system_prompt, load_agents_md
from openjet_tui.agent.headless import Setup, resolve_setup
from openjet_tui.agent.loop import Agent, AgentConfig, TurnResult
from openjet_tui.agent.proposals import Proposal, current_bytes, make_proposal
from openjet_tui.agent.sessions import SessionInfo
from openjet_tui.agent.shellpolicy import Mode, ShellPolicy
from openjet_tui.agent.slipstream import Slipstream, check_slipstream_allowed
from openjet_tui.agent.tools import all_tools
from openjet_tui.agent.watch import FileIndex
from openjet_tui.config import load_settings
from openjet_tui.errors import OpenJetError, SessionError
from openjet_tui.llm.client import ChatClient
from openjet_tui.llm.network import NetworkGuard
from openjet_tui.llm.probe import ProbeReport, probe_server
from openjet_tui.llm.providers import Endpoint, resolve_endpoint

SLIPSTREAM_SENDS = ("your messages and the conversation so far", "the orchestrator's system prompt",
                    "file contents, listings and search results it reads with its tools",
                    "the local model's reports of delegated work (edits applied or rejected, commands run)")


@dataclass(slots=True)
class LaunchOptions:
    """The options `openjet` (and `openjet run`) take; None means "from settings"."""

    provider: str | None = None
    base_url: str | None = None
    model: str | None = None
    mode: str | None = None
    workspace: Path | None = None
    continue_session: bool = False
    resume: str | None = None
    slipstream: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LaunchOptions:
        """Read the shared agent options from parsed command-line arguments."""
        defaults = cls()
        return cls(**{name: getattr(args, name, getattr(defaults, name)) for name in cls.__dataclass_fields__})

    def namespace(self) -> argparse.Namespace:
        """The same options as the namespace `openjet run`'s setup code reads."""
        return argparse.Namespace(**{name: getattr(self, name) for name in self.__dataclass_fields__})


@dataclass(slots=True)
class SlipstreamPlan:
    """What enabling Slipstream would do: for the confirmation the person must accept."""

    endpoint: Endpoint
    sends: tuple[str, ...] = SLIPSTREAM_SENDS


class AgentController:
    """One conversation at a time over one workspace, with the app's approver and event sink."""

    def __init__(self, options: LaunchOptions, approver: Approver, on_event: Callable[[ev.Event], None]):
        self.options = options
        self.setup: Setup = resolve_setup(options.namespace())
        self.approver, self.on_event = approver, on_event
        settings = self.setup.settings
        self.mode = Mode.parse(settings.mode)
        self.guard = NetworkGuard(settings.airgapped)
        self.endpoint = resolve_endpoint(settings.provider, settings.base_url, settings.model)
        self.client: ChatClient | None = None
        self.policy = ShellPolicy(settings.shell.allow, settings.shell.deny,
                                  self.setup.store.rules(self.setup.workspace.root))
        self.index = FileIndex(self.setup.workspace)
        self.agent: Agent | None = None
        self.slipstream: Slipstream | None = None
        self._is_slipstream_used = False  # an orchestrator was built on it (its traffic log has a listener)
        self.context_window: int | None = settings.context.window
        self.report: ProbeReport | None = None
        self.ready = asyncio.Event()
        self.on_agent_changed: Callable[[Agent], None] | None = None  # the watcher follows the agent's proposals

    # ---- facts the app shows -------------------------------------------------------------------------------
    @property
    def workspace_root(self) -> Path:
        """The resolved workspace folder."""
        return self.setup.workspace.root

    @property
    def session(self) -> SessionInfo | None:
        """The current session (None until the first message of a new one)."""
        return self.setup.session

    @property
    def is_airgapped(self) -> bool:
        """Whether only loopback connections are allowed."""
        return self.setup.settings.airgapped

    @property
    def wants_slipstream(self) -> bool:
        """Slipstream was asked for (--slipstream or slipstream.enabled); the app still asks the person first."""
        return self.options.slipstream or self.setup.settings.slipstream.enabled

    @property
    def is_slipstream_on(self) -> bool:
        """Whether the cloud orchestrator is driving the turns."""
        return self.slipstream is not None

    def stored_messages(self) -> list[dict[str, Any]]:
        """The current session's messages as stored (compacted ones included), for display."""
        if self.session is None:
            return []
        return self.setup.store.messages(self.session.id, include_compacted=True)

    # ---- connecting ----------------------------------------------------------------------------------------
    @property
    def needs_local_engine(self) -> bool:
        """OpenJet's own engine with no address given: the app starts the best engine for this machine."""
        settings = self.setup.settings
        return settings.provider == "openjet" and settings.base_url is None

    def use_local_engine(self, engine: Any) -> None:
        """Talk to the engine the runtime started (a runtime.launch.EngineSession); before connect()."""
        endpoint = resolve_endpoint(engine.provider, engine.base_url, self.setup.settings.model or engine.model)
        self.guard.check(endpoint.base_url)
        self.endpoint = endpoint

    async def connect(self) -> ProbeReport:
        """Probe the server; build the agent when it can serve (a resumed session is loaded too). Turns wait
        until mark_ready(), which the app calls once the resumed conversation is on screen."""
        self.guard.check(self.endpoint.base_url)
        if self.client is None:
            self.client = ChatClient(self.endpoint, guard=self.guard,
                                     timeout_s=self.setup.settings.request_timeout_s,
                                     sampling=self.setup.settings.sampling.request_fields())
        system = build_system_prompt(self.workspace_root, self.mode, load_agents_md(self.workspace_root))
        self.report = await probe_server(self.client, system, [t.schema() for t in all_tools().values()])
        if self.report.is_usable:
            self.context_window = self.report.context_window or self.setup.settings.context.window
            await self._rebuild(self.setup.session, resume=self.setup.is_resumed)
        return self.report

    def mark_ready(self) -> None:
        """Let turns run (the agent exists and the app shows the conversation)."""
        assert self.agent is not None, "mark_ready() before a successful connect()"
        self.ready.set()

    def agent_config(self) -> AgentConfig:
        """The agent's knobs from the settings, the mode and the probed window."""
        settings = self.setup.settings
        return AgentConfig(mode=self.mode, max_steps=settings.max_steps, context_window=self.context_window or None,
                           compact_share=settings.context.compact_at,
                           keep_recent_turns=settings.context.keep_recent_turns,
                           shell_timeout_s=settings.shell.timeout_s, max_output_bytes=settings.shell.max_output_bytes)

    async def _rebuild(self, session: SessionInfo | None, resume: bool = False,
                       history: list[dict[str, Any]] | None = None) -> None:
        """A fresh agent (plain, or Slipstream's orchestrator) on `session`, keeping or loading history."""
        assert self.client is not None
        config, store = self.agent_config(), self.setup.store
        if self.slipstream is None:
            self.agent = Agent(self.client, self.setup.workspace, self.approver, config=config, policy=self.policy,
                               store=store, session=session, on_event=self.on_event)
        else:
            slipstream = await self._unused_slipstream()
            self.agent = slipstream.build_agent(self.setup.workspace, self.approver, config, policy=self.policy,
                                                store=store, session=session, on_event=self.on_event)
            self._is_slipstream_used = True
        self.setup.session = session
        if resume:
            self.agent.resume()
        elif history is not None:
            self.agent.history = history
        if self.on_agent_changed is not None:
            self.on_agent_changed(self.agent)

    # ---- turns ---------------------------------------------------------------------------------------------
    async def run_turn(self, text: str) -> TurnResult:
        """Run one user message to the end of its turn (waits for the connection first)."""
        await self.ready.wait()
        assert self.agent is not None
        if self.setup.session is None:
            self.setup.session = self.setup.store.create(self.workspace_root, self.endpoint.provider,
                                                         self.endpoint.model, self.mode.value)
            await self._rebuild(self.setup.session, history=self.agent.history)
        assert self.agent is not None
        return await self.agent.run_turn(text)

    def set_mode(self, mode: Mode) -> None:
        """Change the approval mode from the next tool call on."""
        self.mode = mode
        if self.agent is not None:
            self.agent.set_mode(mode)

    def set_model(self, name: str) -> None:
        """Request another model from the same server from the next request on."""
        self.endpoint.model = name

    async def list_models(self) -> list[str]:
        """Model ids the server lists."""
        if self.client is None:
            return []
        listing = await self.client.get_json(self.endpoint.base_url + "/models")
        return [str(e["id"]) for e in listing.get("data", []) if isinstance(e, dict) and e.get("id")]

    async def new_session(self) -> None:
        """Start over: an empty conversation; a new session is stored with the next message."""
        if self.agent is not None:
            await self._rebuild(None, history=[])

    async def resume(self, session_id: str) -> list[dict[str, Any]]:
        """Switch to a stored session of this workspace; returns its messages for display."""
        info = self.setup.store.get(session_id)
        if Path(info.workspace) != self.workspace_root:
            raise SessionError(f"session {info.id} belongs to {info.workspace}; open it there with "
                               f"`openjet --workspace {info.workspace} --resume {info.id}`")
        if self.agent is None:
            raise SessionError("not connected to a model server yet; try again once it answers")
        await self._rebuild(info, resume=True)
        return self.stored_messages()

    def sessions(self) -> list[SessionInfo]:
        """This workspace's sessions, newest first."""
        return self.setup.store.list(self.workspace_root)

    async def compact(self) -> bool:
        """Summarise old turns now; False if there was nothing to summarise."""
        assert self.agent is not None
        return await self.agent.compact()

    def undo(self) -> str:
        """Undo the newest applied edit; returns what was restored."""
        if self.agent is None:
            raise SessionError("nothing to undo: no conversation yet")
        return self.agent.undo()

    def session_changes(self) -> list[Proposal]:
        """Each file changed by this session's applied edits, as one diff from before the first edit to now."""
        if self.agent is None:
            return []
        first: dict[Path, Any] = {}
        for checkpoint in self.agent.ctx.book.checkpoints:
            first.setdefault(checkpoint.path, checkpoint)
        changes = []
        for path, checkpoint in first.items():
            now = current_bytes(path)
            text = "" if now is None else now.decode("utf-8", errors="replace")
            proposal = make_proposal(path, checkpoint.rel_path, checkpoint.before, text, "session")
            if proposal.hunks:
                changes.append(proposal)
        return changes

    def reload_settings(self) -> str:
        """Re-read the settings after .openjet/config.toml changed: shell rules and Slipstream's endpoint apply
        from the next command; the server, model and airgap setting keep their values until a restart."""
        options = self.options
        overrides = {"provider": options.provider, "base_url": options.base_url, "model": options.model,
                     "mode": options.mode}
        settings = load_settings(self.workspace_root, overrides).settings
        remembered = [rule for rule in self.policy.allow_rules if rule.source == "always"]
        fresh = ShellPolicy(settings.shell.allow, settings.shell.deny, remembered)
        self.policy.allow_rules, self.policy.deny_rules = fresh.allow_rules, fresh.deny_rules
        self.setup.settings.shell, self.setup.settings.slipstream = settings.shell, settings.slipstream
        return "project settings reloaded: shell rules updated (server, model and airgap apply after a restart)"

    # ---- Slipstream ----------------------------------------------------------------------------------------
    def slipstream_plan(self) -> SlipstreamPlan:
        """Check Slipstream may be enabled and say where it would send what (raises with the reason if not)."""
        settings = self.setup.settings.slipstream
        check_slipstream_allowed(Endpoint("slipstream", settings.base_url, settings.model), self.is_airgapped)
        return SlipstreamPlan(resolve_endpoint("slipstream", settings.base_url, settings.model))

    async def enable_slipstream(self) -> Endpoint:
        """Let the cloud orchestrator drive from the next turn on, keeping the conversation."""
        plan = self.slipstream_plan()
        assert self.client is not None
        if self.slipstream is None:
            self.slipstream = Slipstream.create(plan.endpoint, self.client, airgapped=self.is_airgapped,
                                                timeout_s=self.setup.settings.request_timeout_s)
            self._is_slipstream_used = False
            history = self.agent.history if self.agent is not None else []
            await self._rebuild(self.setup.session, history=history)
        return plan.endpoint

    async def _unused_slipstream(self) -> Slipstream:
        """Slipstream for a new orchestrator. build_agent subscribes to the traffic log for good (with the session
        of that moment), so each rebuild gets a fresh one; the totals sent so far carry over."""
        old = self.slipstream
        assert old is not None and self.client is not None
        if not self._is_slipstream_used:
            return old
        fresh = Slipstream.create(old.cloud.endpoint, self.client, airgapped=self.is_airgapped,
                                  timeout_s=self.setup.settings.request_timeout_s)
        fresh.traffic.records = list(old.traffic.records)
        self.slipstream, self._is_slipstream_used = fresh, False
        await old.aclose()
        return fresh

    async def disable_slipstream(self) -> None:
        """Back to the local model alone, keeping the conversation."""
        if self.slipstream is None:
            return
        slipstream, self.slipstream = self.slipstream, None
        history = self.agent.history if self.agent is not None else []
        await self._rebuild(self.setup.session, history=history)
        await slipstream.aclose()

    async def aclose(self) -> None:
        """Close clients and the session database."""
        if self.slipstream is not None:
            await self.slipstream.aclose()
        if self.client is not None:
            await self.client.aclose()
        self.setup.store.close()


def describe_error(exc: BaseException) -> str:
    """One line for a person, for errors that reach the app's edge."""
    if isinstance(exc, OpenJetError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
