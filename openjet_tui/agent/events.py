"""Typed events the agent emits: the UI renders them, headless mode prints them, tests assert on them.

Every event has a `type` name and `to_json()` (one JSON Lines record in `openjet run --json`). `origin` says which
model produced it: "local" normally; with Slipstream, "cloud" for the orchestrator and "delegate" for the local
model working on a delegated task.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from openjet_tui.agent.proposals import Proposal


@dataclass(slots=True)
class Event:
    """Base of every agent event."""

    type: ClassVar[str] = "event"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the event's type and fields."""
        data: dict[str, Any] = {"type": self.type}
        for item in dataclasses.fields(self):
            data[item.name] = _jsonable(getattr(self, item.name))
        return data


def proposal_json(proposal: Proposal) -> dict[str, Any]:
    """A proposal as plain data: path, status and every hunk with its header and lines."""
    return {"id": proposal.id, "path": proposal.rel_path, "tool": proposal.tool, "status": proposal.status,
            "is_new_file": proposal.old_text is None, "is_stale": proposal.is_stale,
            "hunks": [{"index": h.index, "header": h.header, "lines": h.lines} for h in proposal.hunks]}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Proposal):
        return proposal_json(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


@dataclass(slots=True)
class TurnStarted(Event):
    """A user message started a turn."""

    type: ClassVar[str] = "turn_started"
    session_id: str
    text: str


@dataclass(slots=True)
class TextDelta(Event):
    """Reply text as it streams."""

    type: ClassVar[str] = "text_delta"
    text: str
    origin: str = "local"


@dataclass(slots=True)
class ReasoningDelta(Event):
    """Reasoning text as it streams."""

    type: ClassVar[str] = "reasoning_delta"
    text: str
    origin: str = "local"


@dataclass(slots=True)
class AssistantMessage(Event):
    """One finished model reply (content cleaned of tool calls written as text)."""

    type: ClassVar[str] = "assistant_message"
    content: str
    reasoning: str
    tool_calls: list[dict[str, Any]]
    origin: str = "local"


@dataclass(slots=True)
class ToolRequested(Event):
    """The model asked for a tool."""

    type: ClassVar[str] = "tool_requested"
    call_id: str
    name: str
    arguments: dict[str, Any]
    origin: str = "local"


@dataclass(slots=True)
class ProposalCreated(Event):
    """An edit became a proposal; nothing is written yet."""

    type: ClassVar[str] = "proposal_created"
    proposal: Proposal
    origin: str = "local"


@dataclass(slots=True)
class ProposalResolved(Event):
    """A proposal was decided: which hunks were applied and which rejected, and why."""

    type: ClassVar[str] = "proposal_resolved"
    proposal_id: str
    path: str
    status: str
    applied: list[int]
    rejected: list[int]
    reason: str | None = None


@dataclass(slots=True)
class ProposalStale(Event):
    """A pending proposal's file changed on disk; applying it will be refused."""

    type: ClassVar[str] = "proposal_stale"
    proposal_id: str
    path: str


@dataclass(slots=True)
class ShellResolved(Event):
    """A shell command was allowed or denied, by whom and why."""

    type: ClassVar[str] = "shell_resolved"
    call_id: str
    command: str
    allowed: bool
    decided_by: str  # rule | mode | approver (a person, or headless policy) | policy (a deny rule)
    reason: str


@dataclass(slots=True)
class ToolResult(Event):
    """What a tool returned to the model."""

    type: ClassVar[str] = "tool_result"
    call_id: str
    name: str
    content: str
    is_error: bool = False
    origin: str = "local"


@dataclass(slots=True)
class UsageReported(Event):
    """Token counts of one model request, and the window they must fit."""

    type: ClassVar[str] = "usage"
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    context_window: int | None = None
    origin: str = "local"
    reasoning_tokens: int | None = None  # of completion_tokens, when the server reports them


@dataclass(slots=True)
class EngineStats(Event):
    """Speed figures reported by the engine for one request (never estimated from chunk timing)."""

    type: ClassVar[str] = "engine_stats"
    prompt_n: int | None
    prompt_per_second: float | None
    predicted_n: int | None
    predicted_per_second: float | None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    origin: str = "local"


@dataclass(slots=True)
class SlipstreamTraffic(Event):
    """One request that went to the cloud endpoint, with running totals."""

    type: ClassVar[str] = "slipstream_traffic"
    endpoint: str
    request_bytes: int
    response_bytes: int
    num_messages: int
    prompt_tokens: int | None
    completion_tokens: int | None
    total_requests: int
    total_bytes_sent: int
    total_tokens_sent: int


@dataclass(slots=True)
class TodoUpdated(Event):
    """The agent's todo list changed."""

    type: ClassVar[str] = "todo_updated"
    items: list[dict[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class Compacted(Event):
    """Old turns were summarised to fit the context window."""

    type: ClassVar[str] = "compacted"
    num_messages: int
    summary_chars: int
    tokens_before: int


@dataclass(slots=True)
class Notice(Event):
    """Something a person should know that is not an error."""

    type: ClassVar[str] = "notice"
    message: str
    level: str = "info"


@dataclass(slots=True)
class ErrorEvent(Event):
    """A failure the turn could not recover from."""

    type: ClassVar[str] = "error"
    message: str
    kind: str = "error"


@dataclass(slots=True)
class TurnFinished(Event):
    """The turn ended: done, cancelled, error or max_steps."""

    type: ClassVar[str] = "turn_finished"
    status: str
    num_steps: int
    final_text: str = ""
