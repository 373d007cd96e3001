"""run_shell: the policy decides allow, deny or ask; approved commands run in the workspace, capped and timed."""

from __future__ import annotations

from openjet_tui.agent.approver import ShellRequest
from openjet_tui.agent.events import ShellResolved
from openjet_tui.agent.runner import run_command
from openjet_tui.agent.tools.base import Tool, ToolContext, ToolOutcome
from openjet_tui.llm.types import ToolCall


def _record(ctx: ToolContext, call: ToolCall, allowed: bool, decided_by: str, reason: str) -> int | None:
    """Store and announce the decision before anything runs."""
    command = call.arguments["command"]
    ctx.emit(ShellResolved(call.id, command, allowed, decided_by, reason))
    if ctx.store is None or ctx.session_id is None:
        return None
    return ctx.store.save_shell(ctx.session_id, call.id, command, allowed, decided_by, reason)


async def run_shell(ctx: ToolContext, call: ToolCall) -> ToolOutcome:
    """Check the command against the policy, ask when needed, then run it."""
    command = call.arguments["command"]
    verdict = ctx.policy.evaluate(command, ctx.mode, ctx.workspace.root)
    if verdict.action == "deny":
        _record(ctx, call, False, "policy", verdict.reason)
        return ToolOutcome(f"Not run: {verdict.reason}. Do not retry it in another form.", True)
    decided_by = "mode" if ctx.mode.value == "auto" else "rule"
    if verdict.action == "ask":
        decision = await ctx.approver.review_shell(ShellRequest(call.id, command, ctx.workspace.root, verdict))
        if not decision.allow:
            why = decision.reason or "no reason given"
            _record(ctx, call, False, "approver", why)
            return ToolOutcome(f"Not run: the command was denied ({why}).", True)
        if decision.always and verdict.suggested_rules:
            ctx.policy.remember(verdict.suggested_rules)
            if ctx.store is not None:
                ctx.store.save_rules(ctx.workspace.root, verdict.suggested_rules)
        decided_by = "approver"
    row = _record(ctx, call, True, decided_by, verdict.reason)
    # the model may shorten the limit, never lengthen it past the configured one
    timeout = max(1.0, min(float(call.arguments.get("timeout_s") or ctx.shell_timeout_s), ctx.shell_timeout_s))
    result = await run_command(command, ctx.workspace.root, timeout, ctx.max_output_bytes)
    if ctx.store is not None and row is not None:
        ctx.store.set_shell_exit(row, result.exit_code)
    return ToolOutcome(result.describe(timeout))


SHELL_TOOLS = [
    Tool("run_shell", "Run a bash command in the workspace folder. Output (stdout and stderr) is capped; long "
                      "runs time out. Commands may need the person's approval.",
         {"type": "object", "required": ["command"], "properties": {
             "command": {"type": "string", "description": "the bash command line"},
             "timeout_s": {"type": "number", "description": "seconds before the command is killed"}}},
         run_shell, changes_things=True),
]
