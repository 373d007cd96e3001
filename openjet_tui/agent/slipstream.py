"""Slipstream: a cloud model plans and reviews; the local model does the work through `delegate_local`.

Off by default. Every request to the cloud is recorded (endpoint, bytes, tokens), stored with the session and
emitted as a SlipstreamTraffic event. With `airgapped = true` it cannot be created at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from openjet_tui.agent import events as ev
from openjet_tui.agent.approver import Approver
from openjet_tui.agent.context import load_prompt
from openjet_tui.agent.loop import Agent, AgentConfig
from openjet_tui.agent.sessions import SessionInfo, SessionStore
from openjet_tui.agent.shellpolicy import ShellPolicy
from openjet_tui.agent.tools import Tool, ToolContext, ToolOutcome, reading_tools
from openjet_tui.agent.workspace import Workspace
from openjet_tui.errors import AirgappedError, ProviderError
from openjet_tui.llm.client import ChatClient
from openjet_tui.llm.network import NetworkGuard, TrafficLog, TrafficRecord
from openjet_tui.llm.providers import Endpoint
from openjet_tui.llm.types import ToolCall

DELEGATE_PARAMETERS = {"type": "object", "required": ["task"], "properties": {
    "task": {"type": "string", "description": "one self-contained task for the local model: which files, what to "
                                              "change, how to check it"}}}


def check_slipstream_allowed(endpoint: Endpoint, airgapped: bool) -> None:
    """Refuse Slipstream when airgapped, or when the cloud endpoint is incomplete; says what to change."""
    if airgapped:
        raise AirgappedError(
            f"Slipstream is impossible while airgapped = true: it sends planning and review requests to "
            f"{endpoint.base_url}. Nothing was sent. Set airgapped = false to allow it.")
    if not endpoint.model:
        raise ProviderError("Slipstream needs a cloud model: set model under [slipstream] in the config "
                            "(slipstream.model) or OPENJET_SLIPSTREAM__MODEL in the environment")


@dataclass(slots=True)
class DelegateReport:
    """What the local model did for one delegated task."""

    actions: list[str] = field(default_factory=list)

    def collect(self, event: ev.Event) -> None:
        """Note edits and commands as the delegate's events go by."""
        if isinstance(event, ev.ProposalResolved):
            rejected = f", rejected hunks {[i + 1 for i in event.rejected]}" if event.rejected else ""
            reason = f" ({event.reason})" if event.reason else ""
            self.actions.append(f"edit {event.path}: {event.status}{rejected}{reason}")
        elif isinstance(event, ev.ShellResolved):
            verdict = "ran" if event.allowed else f"denied: {event.reason}"
            self.actions.append(f"command `{event.command}`: {verdict}")


class Slipstream:
    """Builds the orchestrator agent (cloud model, reading tools + delegate_local) over a local worker model."""

    def __init__(self, cloud: ChatClient, local: ChatClient, traffic: TrafficLog):
        self.cloud, self.local, self.traffic = cloud, local, traffic

    @classmethod
    def create(cls, endpoint: Endpoint, local: ChatClient, *, airgapped: bool,
               timeout_s: float = 600.0) -> Slipstream:
        """Check the rules, then open the cloud client with a traffic log attached."""
        check_slipstream_allowed(endpoint, airgapped)
        traffic = TrafficLog()
        cloud = ChatClient(endpoint, guard=NetworkGuard(airgapped), traffic=traffic, timeout_s=timeout_s)
        return cls(cloud, local, traffic)

    async def aclose(self) -> None:
        """Close the cloud client (the local one belongs to the caller)."""
        await self.cloud.aclose()

    def build_agent(self, workspace: Workspace, approver: Approver, config: AgentConfig, *,
                    policy: ShellPolicy | None = None, store: SessionStore | None = None,
                    session: SessionInfo | None = None,
                    on_event: Callable[[ev.Event], None] | None = None) -> Agent:
        """The orchestrator agent; its delegate_local tool runs a local agent sharing approver, policy and undo."""
        emit = on_event or (lambda event: None)
        self._report_traffic(emit, store, session)
        tools = reading_tools()
        orchestrator_config = AgentConfig(**{**_fields(config), "origin": "cloud", "prompt": "orchestrator"})
        orchestrator = Agent(self.cloud, workspace, approver, config=orchestrator_config, policy=policy,
                             store=store, session=session, on_event=emit, tools=tools)

        async def delegate_local(ctx: ToolContext, call: ToolCall) -> ToolOutcome:
            """The tool handler: run the task on the local model."""
            return await self._delegate(orchestrator, config, call.arguments["task"], emit)

        tools["delegate_local"] = Tool("delegate_local", "Give one concrete task to the local model, which can "
                                       "read, edit files and run commands (with the person's approval). Returns "
                                       "its report and what was applied, rejected or denied.",
                                       DELEGATE_PARAMETERS, delegate_local, changes_things=True)
        return orchestrator

    async def _delegate(self, orchestrator: Agent, config: AgentConfig, task: str,
                        emit: Callable[[ev.Event], None]) -> ToolOutcome:
        """Run the task in a fresh local conversation and summarise it for the orchestrator."""
        report = DelegateReport()

        def forward(event: ev.Event) -> None:
            """Note the delegate's actions and pass its events on."""
            report.collect(event)
            emit(event)

        worker = Agent(self.local, orchestrator.workspace, orchestrator.ctx.approver,
                       config=AgentConfig(**{**_fields(config), "origin": "delegate"}),
                       policy=orchestrator.ctx.policy, store=orchestrator.store, session=orchestrator.session,
                       on_event=forward)
        worker.ctx.book = orchestrator.ctx.book  # one undo stack for the whole session
        worker.set_mode(orchestrator.mode)
        result = await worker.run_turn(f"{load_prompt('delegate')}\nTask:\n{task}")
        lines = [f"Local model finished with status {result.status}.", "Report:", result.final_text or "(none)"]
        if report.actions:
            lines += ["Actions:", *(f"- {action}" for action in report.actions)]
        if result.error:
            lines.append(f"Error: {result.error}")
        return ToolOutcome("\n".join(lines), is_error=result.status == "error")

    def _report_traffic(self, emit: Callable[[ev.Event], None], store: SessionStore | None,
                        session: SessionInfo | None) -> None:
        """Store and announce every cloud request as it completes."""
        def on_record(record: TrafficRecord) -> None:
            """Store one cloud request and emit it."""
            if store is not None:
                store.save_traffic(session.id if session else None, record)
            emit(ev.SlipstreamTraffic(record.endpoint, record.request_bytes, record.response_bytes,
                                      record.num_messages, record.prompt_tokens, record.completion_tokens,
                                      len(self.traffic.records), self.traffic.bytes_sent,
                                      self.traffic.tokens_sent))
        self.traffic.subscribe(on_record)


def _fields(config: AgentConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in AgentConfig.__dataclass_fields__}
