"""todo: the agent's own plan, shown to the person as it changes."""

from __future__ import annotations

from openjet_tui.agent.events import TodoUpdated
from openjet_tui.agent.tools.base import Tool, ToolContext, ToolOutcome
from openjet_tui.errors import WorkspaceError
from openjet_tui.llm.types import ToolCall

STATUSES = ("pending", "in_progress", "done")
MARKS = {"pending": "[ ]", "in_progress": "[~]", "done": "[x]"}


async def todo(ctx: ToolContext, call: ToolCall) -> ToolOutcome:
    """Replace the todo list with the given items and echo it back."""
    items = []
    for number, item in enumerate(call.arguments["items"], start=1):
        status = item.get("status", "pending")
        if status not in STATUSES:
            raise WorkspaceError(f"item {number}: status {status!r} is not one of {', '.join(STATUSES)}")
        if not item["content"].strip():
            raise WorkspaceError(f"item {number}: content is empty")
        items.append({"content": item["content"].strip(), "status": status})
    ctx.todos[:] = items
    ctx.emit(TodoUpdated(list(items)))
    if not items:
        return ToolOutcome("Todo list cleared.")
    return ToolOutcome("\n".join(f"{MARKS[i['status']]} {i['content']}" for i in items))


TODO_TOOLS = [
    Tool("todo", "Keep a short plan: pass the whole list each time, marking items pending, in_progress or done.",
         {"type": "object", "required": ["items"], "properties": {"items": {"type": "array", "items": {
             "type": "object", "required": ["content"], "properties": {
                 "content": {"type": "string", "description": "what to do"},
                 "status": {"type": "string", "enum": list(STATUSES)}}}}}},
         todo),
]
