"""What every tool shares: its description for the model, the context it runs in, argument checks, confinement."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openjet_tui.agent.approver import Approver, PathRequest
from openjet_tui.agent.events import Event
from openjet_tui.agent.proposals import ProposalBook
from openjet_tui.agent.sessions import SessionStore
from openjet_tui.agent.shellpolicy import Mode, ShellPolicy
from openjet_tui.agent.workspace import Workspace
from openjet_tui.errors import OpenJetError, WorkspaceError
from openjet_tui.llm.types import ToolCall


@dataclass(slots=True)
class ToolOutcome:
    """What the model reads back; is_error marks a call that did not do what was asked."""

    content: str
    is_error: bool = False


@dataclass(slots=True)
class ToolContext:
    """Everything a tool may use. One per agent; `origin` tags the events it emits."""

    workspace: Workspace
    approver: Approver
    mode: Mode
    policy: ShellPolicy
    book: ProposalBook
    emit: Callable[[Event], None]
    store: SessionStore | None = None
    session_id: str | None = None
    todos: list[dict[str, str]] = field(default_factory=list)
    shell_timeout_s: float = 120.0
    max_output_bytes: int = 30000
    origin: str = "local"


Handler = Callable[[ToolContext, ToolCall], Awaitable[ToolOutcome]]


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model may call: name, description, JSON-schema parameters and the coroutine that runs it."""

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    changes_things: bool = False  # writes files or runs commands

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools` entry."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                       "boolean": (bool,), "array": (list,), "object": (dict,)}


def check_arguments(schema: dict[str, Any], arguments: dict[str, Any], where: str = "") -> str | None:
    """A message naming the first argument that breaks the schema (missing, unknown, wrong type), or None."""
    properties: dict[str, Any] = schema.get("properties") or {}
    for name in schema.get("required") or []:
        if name not in arguments:
            return f"missing required argument {where}{name!r}"
    for name, value in arguments.items():
        if name not in properties:
            return f"unknown argument {where}{name!r}; expected: {', '.join(properties) or 'none'}"
        expected = properties[name].get("type")
        kinds = _TYPES.get(expected or "", (object,))
        if not isinstance(value, kinds) or (expected in ("integer", "number") and isinstance(value, bool)):
            return f"argument {where}{name!r} must be {expected}, got {type(value).__name__}"
        items = properties[name].get("items") or {}
        if expected == "array" and items.get("type") == "object":
            for index, item in enumerate(value):
                if not isinstance(item, dict):
                    return f"argument {where}{name}[{index}] must be an object"
                problem = check_arguments(items, item, f"{where}{name}[{index}].")
                if problem:
                    return problem
    return None


async def confine(ctx: ToolContext, call: ToolCall, raw_path: str, action: str) -> Path:
    """Resolve a path; outside the workspace it needs the approver's yes (refused otherwise)."""
    path = ctx.workspace.resolve(raw_path)
    if ctx.workspace.contains(path):
        return path
    decision = await ctx.approver.review_path(PathRequest(call.id, call.name, path, action))
    if not decision.allow:
        why = f": {decision.reason}" if decision.reason else ""
        raise WorkspaceError(f"{raw_path} resolves to {path}, outside the workspace {ctx.workspace.root}; "
                             f"leaving it was not approved{why}")
    return path


async def run_tool(tools: dict[str, Tool], ctx: ToolContext, call: ToolCall) -> ToolOutcome:
    """Run one call; every failure becomes an error result the model can read (cancellation propagates)."""
    tool = tools.get(call.name)
    if tool is None:
        return ToolOutcome(f"unknown tool {call.name!r}; available tools: {', '.join(tools)}", True)
    if call.arguments_error:
        return ToolOutcome(f"{call.name}: {call.arguments_error}", True)
    problem = check_arguments(tool.parameters, call.arguments)
    if problem:
        return ToolOutcome(f"{call.name}: {problem}", True)
    try:
        return await tool.handler(ctx, call)
    except OpenJetError as exc:
        return ToolOutcome(f"{call.name}: {exc}", True)
    except OSError as exc:
        return ToolOutcome(f"{call.name}: {exc.strerror or exc} ({exc.filename or ''})", True)
    except Exception as exc:  # a bug in a tool must not end the session; the model and the log both see it
        return ToolOutcome(f"{call.name}: internal error {type(exc).__name__}: {exc}", True)
