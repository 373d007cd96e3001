"""The turn loop: ask the model, run the tools it calls, repeat until it answers without tools. Async and
cancellable at any await; every complete message is stored as it happens."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from openjet_tui.agent import events as ev
from openjet_tui.agent.approver import Approver
from openjet_tui.agent.context import (build_system_prompt, estimate_message_tokens, load_agents_md,
                                       plan_compaction, summarise, wire)
from openjet_tui.agent.proposals import ProposalBook
from openjet_tui.agent.resume import recover_session
from openjet_tui.agent.sessions import SessionInfo, SessionStore
from openjet_tui.agent.shellpolicy import Mode, ShellPolicy
from openjet_tui.agent.tools import Tool, ToolContext, all_tools, run_tool
from openjet_tui.agent.workspace import Workspace
from openjet_tui.errors import OpenJetError, StaleProposalError, WorkspaceError
from openjet_tui.llm.client import ChatClient
from openjet_tui.llm.types import ChatResult, ContentDelta, StreamPart, ToolCall


@dataclass(slots=True)
class AgentConfig:
    """Knobs of one agent."""

    mode: Mode = Mode.ASK
    max_steps: int = 50
    context_window: int | None = None  # tokens; None disables compaction
    compact_share: float = 0.8
    keep_recent_turns: int = 2
    shell_timeout_s: float = 120.0
    max_output_bytes: int = 30000
    origin: str = "local"
    prompt: str = "system"  # assets/prompts/<prompt>.md


@dataclass(slots=True)
class TurnResult:
    """How a turn ended."""

    status: str  # done | cancelled | error | max_steps
    final_text: str
    num_steps: int
    error: str | None = None
    failure: OpenJetError | None = None  # what ended an "error" turn, for callers that map it (exit codes)


class Agent:
    """One conversation with one model over one workspace."""

    def __init__(self, client: ChatClient, workspace: Workspace, approver: Approver, *,
                 config: AgentConfig | None = None, policy: ShellPolicy | None = None,
                 store: SessionStore | None = None, session: SessionInfo | None = None,
                 on_event: Callable[[ev.Event], None] | None = None, tools: dict[str, Tool] | None = None):
        self.client, self.workspace, self.config = client, workspace, config or AgentConfig()
        self.store, self.session = store, session
        self.on_event = on_event or (lambda event: None)
        self.tools = tools if tools is not None else all_tools()
        checkpoints = store.checkpoints(session.id) if store and session else []
        self.ctx = ToolContext(workspace, approver, self.config.mode, policy or ShellPolicy(),
                               ProposalBook(checkpoints), self.emit, store, session.id if session else None,
                               shell_timeout_s=self.config.shell_timeout_s,
                               max_output_bytes=self.config.max_output_bytes, origin=self.config.origin)
        self.history: list[dict[str, Any]] = []
        self.summary: str | None = session.summary if session else None
        self.agents_md = load_agents_md(workspace.root)
        self._counted = (0, 0)  # (tokens the server counted, history length at that time)

    @property
    def mode(self) -> Mode:
        """The current approval mode."""
        return self.ctx.mode

    def set_mode(self, mode: Mode) -> None:
        """Change the approval mode (from the next tool call on)."""
        self.ctx.mode = self.config.mode = mode

    def emit(self, event: ev.Event) -> None:
        """Hand an event to whoever listens."""
        self.on_event(event)

    def system_prompt(self) -> str:
        """The current system prompt."""
        return build_system_prompt(self.workspace.root, self.mode, self.agents_md, self.summary, self.config.prompt)

    def reload_context(self) -> None:
        """Re-read AGENTS.md (the watcher calls this when it changes)."""
        self.agents_md = load_agents_md(self.workspace.root)

    def resume(self) -> list[str]:
        """Load the stored conversation after recovering an interrupted turn; returns notes for the person."""
        if self.store is None or self.session is None:
            return []
        notes = recover_session(self.store, self.session.id)
        self.ctx.book.checkpoints = self.store.checkpoints(self.session.id)
        self.history = [m for m in self.store.messages(self.session.id) if m["_origin"] != "delegate"]
        for note in notes:
            self.emit(ev.Notice(note))
        return notes

    def request_messages(self) -> list[dict[str, Any]]:
        """What the next request sends: system prompt and the history."""
        return [{"role": "system", "content": self.system_prompt()}, *wire(self.history)]

    def _append(self, message: dict[str, Any]) -> None:
        if self.store is not None and self.session is not None:
            message["_id"] = self.store.add_message(self.session.id, message, self.config.origin)
        message["_origin"] = self.config.origin
        self.history.append(message)

    async def run_turn(self, text: str) -> TurnResult:
        """Run one user turn to its end. Cancelling the task stops it at once; the history stays valid."""
        self.emit(ev.TurnStarted(self.session.id if self.session else "", text))
        self._append({"role": "user", "content": text})
        steps, final = 0, ""
        try:
            while steps < self.config.max_steps:
                steps += 1
                await self._maybe_compact()
                result = await self._ask_model()
                final = result.content or final
                if not result.tool_calls:
                    return self._finish("done", final, steps)
                await self._run_calls(result.tool_calls)
            self.emit(ev.Notice(f"stopped after {self.config.max_steps} steps without a final answer", "warning"))
            return self._finish("max_steps", final, steps)
        except asyncio.CancelledError:
            self._close_open_calls("cancelled by the person before it ran")
            self._finish("cancelled", final, steps)
            raise
        except OpenJetError as exc:
            self._close_open_calls(f"not run: the turn failed ({exc})")
            self.emit(ev.ErrorEvent(str(exc), type(exc).__name__))
            return self._finish("error", final, steps, exc)

    def _finish(self, status: str, final: str, steps: int, failure: OpenJetError | None = None) -> TurnResult:
        self.emit(ev.TurnFinished(status, steps, final))
        return TurnResult(status, final, steps, str(failure) if failure else None, failure)

    async def _ask_model(self) -> ChatResult:
        """Stream one reply, emitting deltas; store it and report usage and engine figures."""
        origin = self.config.origin

        def on_part(part: StreamPart) -> None:
            """Forward one streamed delta as an event."""
            kind = ev.TextDelta if isinstance(part, ContentDelta) else ev.ReasoningDelta
            self.emit(kind(part.text, origin))

        result = await self.client.complete(self.request_messages(), [t.schema() for t in self.tools.values()],
                                            on_part)
        self._unique_ids(result.tool_calls)
        message = result.to_message()
        if result.reasoning:
            message["reasoning"] = result.reasoning
        self._append(message)
        self.emit(ev.AssistantMessage(result.content, result.reasoning, message.get("tool_calls", []), origin))
        self._report(result)
        return result

    def _unique_ids(self, calls: list[ToolCall]) -> None:
        """Text-parsed calls reuse ids across steps; sessions need every id unique."""
        seen = {c["id"] for m in self.history for c in m.get("tool_calls") or []}
        for call in calls:
            if not call.id or call.id in seen:
                call.id = f"call_{uuid.uuid4().hex[:12]}"
            seen.add(call.id)

    def _report(self, result: ChatResult) -> None:
        # The server's timings first: whoever reads the usage then knows whether this request's speed was reported.
        origin = self.config.origin
        if result.timings is not None:
            t = result.timings
            self.emit(ev.EngineStats(t.prompt_n, t.prompt_per_second, t.predicted_n, t.predicted_per_second,
                                     t.draft_n, t.draft_n_accepted, origin))
        if result.usage is not None:
            usage = result.usage
            self._counted = (usage.total_tokens, len(self.history))
            self.emit(ev.UsageReported(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens,
                                       self.config.context_window, origin, usage.reasoning_tokens))

    async def _run_calls(self, calls: list[ToolCall]) -> None:
        """Run the calls of one reply in order, storing each result as soon as it exists."""
        for call in calls:
            self.emit(ev.ToolRequested(call.id, call.name, call.arguments, self.config.origin))
            outcome = await run_tool(self.tools, self.ctx, call)
            content = f"Error: {outcome.content}" if outcome.is_error else outcome.content
            self._append({"role": "tool", "tool_call_id": call.id, "content": content})
            self.emit(ev.ToolResult(call.id, call.name, content, outcome.is_error, self.config.origin))

    def _close_open_calls(self, reason: str) -> None:
        """After a cancel or failure, answer the last reply's calls that never ran, so the history stays valid."""
        last = next((m for m in reversed(self.history) if m["role"] != "tool"), None)
        if last is None or not last.get("tool_calls"):
            return
        answered = {m.get("tool_call_id") for m in self.history if m["role"] == "tool"}
        for call in last["tool_calls"]:
            if call["id"] not in answered:
                self._append({"role": "tool", "tool_call_id": call["id"], "content": f"Error: {reason}"})

    def estimated_tokens(self) -> int:
        """Tokens the next request will take: the server's last count plus an estimate of what came after."""
        counted, upto = self._counted
        if upto > len(self.history):  # compaction shrank the history: nothing counted applies
            counted, upto = 0, 0
        base = counted or estimate_message_tokens([{"role": "system", "content": self.system_prompt()}])
        return base + estimate_message_tokens(self.history[upto:])

    async def _maybe_compact(self) -> None:
        window = self.config.context_window
        if window and self.estimated_tokens() >= self.config.compact_share * window:
            await self.compact()

    async def compact(self) -> bool:
        """Summarise all but the recent turns into the system prompt; False if there was nothing to summarise."""
        tokens = self.estimated_tokens()
        plan = plan_compaction(self.history, self.config.keep_recent_turns)
        if plan is None:
            self.emit(ev.Notice("the context is nearly full, but only recent turns remain: nothing to summarise",
                                "warning"))
            return False
        old, recent = plan
        self.summary = await summarise(self.client, old, self.summary)
        self.history, self._counted = recent, (0, 0)
        if self.store is not None and self.session is not None and "_id" in old[-1]:
            self.store.compact(self.session.id, old[-1]["_id"], self.summary)
        self.emit(ev.Compacted(len(old), len(self.summary), tokens))
        return True

    def undo(self) -> str:
        """Undo the newest applied edit; returns what was restored (raises if nothing can be undone)."""
        try:
            checkpoint = self.ctx.book.undo_last()
        except (StaleProposalError, WorkspaceError) as exc:
            raise WorkspaceError(f"undo: {exc}") from exc
        if self.store is not None:
            self.store.mark_undone(checkpoint.id)
        action = "deleted" if checkpoint.before is None else "restored"
        return f"{action} {checkpoint.rel_path} as it was before the edit"
