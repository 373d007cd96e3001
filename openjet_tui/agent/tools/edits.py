"""Editing tools: edit_file and write_file. Each call becomes a proposal; only approved hunks are written, and the
result tells the model exactly which hunks were applied and which rejected, and why."""

from __future__ import annotations

import asyncio

from openjet_tui.agent.events import ProposalCreated, ProposalResolved
from openjet_tui.agent.proposals import (EditDecision, Proposal, apply_proposal, current_bytes, digest,
                                         make_proposal)
from openjet_tui.agent.shellpolicy import Mode
from openjet_tui.agent.tools.base import Tool, ToolContext, ToolOutcome, confine
from openjet_tui.agent.workspace import read_text
from openjet_tui.errors import StaleProposalError, WorkspaceError
from openjet_tui.llm.types import ToolCall


def replace_exact(text: str, edits: list[dict[str, str]], shown: str) -> str:
    """Apply old -> new replacements in order; each old text must occur exactly once at its turn."""
    for number, edit in enumerate(edits, start=1):
        old, new = edit["old_text"], edit["new_text"]
        if not old:
            raise WorkspaceError(f"edit {number}: old_text is empty; use write_file to create or replace a file")
        count = text.count(old)
        if count == 0:
            hint = " (it differs only in whitespace or line endings)" if _loosely_present(text, old) else ""
            raise WorkspaceError(f"edit {number}: old_text not found in {shown}{hint}; read the file again and "
                                 "copy the exact text")
        if count > 1:
            raise WorkspaceError(f"edit {number}: old_text occurs {count} times in {shown}; include more "
                                 "surrounding lines so it is unique")
        text = text.replace(old, new, 1)
    return text


def _loosely_present(text: str, old: str) -> bool:
    squash = lambda s: " ".join(s.split())  # noqa: E731
    return squash(old) in squash(text)


async def edit_file(ctx: ToolContext, call: ToolCall) -> ToolOutcome:
    """Exact replacements in one existing file, proposed as one diff."""
    path = await confine(ctx, call, call.arguments["path"], "write")
    shown = ctx.workspace.relative(path)
    edits = call.arguments["edits"]
    if not edits:
        raise WorkspaceError("edits is empty: give at least one {old_text, new_text} pair")
    old_bytes = current_bytes(path)
    if old_bytes is None:
        raise WorkspaceError(f"{shown}: no such file; use write_file to create it")
    new_text = replace_exact(read_text(path, shown), edits, shown)
    return await propose(ctx, call, make_proposal(path, shown, old_bytes, new_text, "edit_file", call.id))


async def write_file(ctx: ToolContext, call: ToolCall) -> ToolOutcome:
    """Create a file, or replace its whole content, proposed as a diff against what is there."""
    path = await confine(ctx, call, call.arguments["path"], "write")
    shown = ctx.workspace.relative(path)
    if path.is_dir():
        raise WorkspaceError(f"{shown} is a folder")
    old_bytes = current_bytes(path)
    if old_bytes is not None:
        read_text(path, shown)  # refuse to overwrite binary or non-UTF-8 files through a text diff
    proposal = make_proposal(path, shown, old_bytes, call.arguments["content"], "write_file", call.id)
    return await propose(ctx, call, proposal)


async def propose(ctx: ToolContext, call: ToolCall, proposal: Proposal) -> ToolOutcome:
    """Show the proposal, get a decision (the mode's or the approver's), apply what was accepted."""
    if ctx.mode is Mode.READ_ONLY:
        return ToolOutcome(f"Not written: read-only mode allows no edits ({proposal.rel_path}).", True)
    if not proposal.hunks:
        return ToolOutcome(f"No change: {proposal.rel_path} already has exactly this content.")
    ctx.book.add(proposal)
    if ctx.store is not None and ctx.session_id is not None:
        ctx.store.save_proposal(ctx.session_id, proposal)
    ctx.emit(ProposalCreated(proposal, ctx.origin))
    try:
        if ctx.mode in (Mode.AUTO_EDIT, Mode.AUTO):
            decision = EditDecision.accept_all(proposal)
        else:
            decision = await ctx.approver.review_edit(proposal)
        return resolve(ctx, proposal, decision)
    except asyncio.CancelledError:  # the turn was cancelled while the person was still deciding
        if ctx.store is not None:
            ctx.store.set_proposal_status(proposal.id, "cancelled")
        raise
    finally:
        ctx.book.finish(proposal)


def resolve(ctx: ToolContext, proposal: Proposal, decision: EditDecision) -> ToolOutcome:
    """Record the decision, write the accepted hunks, and describe the outcome for the model."""
    indices = [h.index for h in proposal.hunks]
    applied = [i for i in indices if i in decision.accepted]
    rejected = [i for i in indices if i not in decision.accepted]
    result_digest = digest(proposal.result_text(frozenset(applied)).encode("utf-8")) if applied else None
    if ctx.store is not None:
        ctx.store.save_decision(proposal, applied, rejected, decision.reason, decision.hunk_reasons, result_digest)
    status = "rejected"
    if applied:
        try:
            checkpoint = apply_proposal(proposal, frozenset(applied))
            status = "applied" if not rejected else "partial"
        except StaleProposalError:
            status = "stale"
        except WorkspaceError:
            status = "failed"
        else:
            assert checkpoint is not None
            ctx.book.push(checkpoint)
            if ctx.store is not None and ctx.session_id is not None:
                ctx.store.save_checkpoint(ctx.session_id, checkpoint)
    proposal.status = status
    if ctx.store is not None:
        ctx.store.set_proposal_status(proposal.id, status)
    ctx.emit(ProposalResolved(proposal.id, proposal.rel_path, status, applied, rejected, decision.reason))
    text = describe_outcome(proposal, status, applied, rejected, decision.reason, decision.hunk_reasons)
    return ToolOutcome(text, is_error=status in ("stale", "failed"))


def describe_outcome(proposal: Proposal, status: str, applied: list[int], rejected: list[int],
                     reason: str | None, hunk_reasons: dict[int, str]) -> str:
    """Exactly what happened to each hunk, in words the model can act on (hunks numbered from 1)."""
    path, total = proposal.rel_path, len(proposal.hunks)
    if status == "stale":
        return (f"Not applied: {path} changed on disk after this edit was proposed, so nothing was written. "
                "Read the file again and propose the edit against its current content.")
    if status == "failed":
        return f"Not applied: {path} could not be written safely (its path now resolves elsewhere)."
    why = f" Reason: {reason}" if reason else ""
    if status == "rejected":
        return f"Rejected: the whole edit to {path} ({total} hunk{'s' if total != 1 else ''}); nothing was " \
               f"written.{why}" + _rejected_lines(proposal, rejected, hunk_reasons)
    if status == "applied":
        return f"Applied: all {total} hunk{'s' if total != 1 else ''} of the edit to {path}."
    lines = [f"Partly applied: {len(applied)} of {total} hunks of the edit to {path}; {len(rejected)} rejected.{why}"]
    lines += [f"  applied hunk {i + 1} {proposal.hunks[i].header}" for i in applied]
    lines.append(_rejected_lines(proposal, rejected, hunk_reasons).lstrip("\n"))
    lines.append(f"{path} now contains only the applied hunks; read it again before editing near the "
                 "rejected changes.")
    return "\n".join(lines)


def _rejected_lines(proposal: Proposal, rejected: list[int], hunk_reasons: dict[int, str]) -> str:
    """One line per rejected hunk with its range and, when given, the reason for it."""
    rows = []
    for index in rejected:
        reason = hunk_reasons.get(index)
        rows.append(f"  rejected hunk {index + 1} {proposal.hunks[index].header}" + (f": {reason}" if reason else ""))
    return "".join("\n" + row for row in rows)


EDIT_TOOLS = [
    Tool("edit_file", "Edit an existing file by exact text replacement. Each old_text must appear exactly once; "
                      "several edits are applied in order. The person may accept some hunks and reject others: "
                      "the result says which.",
         {"type": "object", "required": ["path", "edits"], "properties": {
             "path": {"type": "string", "description": "file path, relative to the workspace"},
             "edits": {"type": "array", "description": "replacements, applied in order", "items": {
                 "type": "object", "required": ["old_text", "new_text"], "properties": {
                     "old_text": {"type": "string", "description": "exact text to replace (unique in the file)"},
                     "new_text": {"type": "string", "description": "replacement text"}}}}}},
         edit_file, changes_things=True),
    Tool("write_file", "Create a file or replace its entire content (prefer edit_file for changes).",
         {"type": "object", "required": ["path", "content"], "properties": {
             "path": {"type": "string", "description": "file path, relative to the workspace"},
             "content": {"type": "string", "description": "the complete new file content"}}},
         write_file, changes_things=True),
]
