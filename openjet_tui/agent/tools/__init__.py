"""The agent's tools, one module per family, and the sets offered in each situation."""

from __future__ import annotations

from openjet_tui.agent.tools.base import Tool, ToolContext, ToolOutcome, check_arguments, run_tool
from openjet_tui.agent.tools.edits import EDIT_TOOLS
from openjet_tui.agent.tools.files import FILE_TOOLS
from openjet_tui.agent.tools.shell import SHELL_TOOLS
from openjet_tui.agent.tools.todo import TODO_TOOLS

__all__ = ["Tool", "ToolContext", "ToolOutcome", "check_arguments", "run_tool", "all_tools", "reading_tools"]


def all_tools() -> dict[str, Tool]:
    """Every tool, by name, in the order they are offered."""
    return {tool.name: tool for tool in [*FILE_TOOLS, *EDIT_TOOLS, *SHELL_TOOLS, *TODO_TOOLS]}


def reading_tools() -> dict[str, Tool]:
    """Tools that change nothing (Slipstream's orchestrator gets these plus delegate_local)."""
    return {name: tool for name, tool in all_tools().items() if not tool.changes_things}
