"""Resuming a session that ended mid-turn (closed, crashed or killed): nothing that had been approved is lost.

Approved edits whose write was interrupted are finished (or found done); tool calls left without a result get one
that says what really happened, so the conversation the model sees is complete and true.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openjet_tui.agent.proposals import Proposal, apply_proposal, current_bytes, digest, split_hunks
from openjet_tui.agent.sessions import SessionStore
from openjet_tui.agent.tools.edits import describe_outcome
from openjet_tui.errors import StaleProposalError, WorkspaceError


def proposal_from_row(row: dict[str, Any]) -> Proposal:
    """Rebuild a stored proposal, hunks included."""
    hunks = split_hunks(row["old_text"] or "", row["new_text"])
    return Proposal(row["id"], Path(row["path"]), row["rel_path"], row["old_text"], row["new_text"], hunks,
                    row["base_digest"], row["tool"], row["call_id"], row["status"])


def finish_approved_edits(store: SessionStore, session_id: str) -> list[str]:
    """Complete edits that were approved but whose write may not have happened; returns notes for the person."""
    notes = []
    for row in store.proposals(session_id):
        if row["status"] == "pending":
            store.set_proposal_status(row["id"], "abandoned")
            continue
        if row["status"] != "approved":
            continue
        applied = json.loads(row["applied"] or "[]")
        done_status = "partial" if json.loads(row["rejected"] or "[]") else "applied"
        now = digest(current_bytes(Path(row["path"])))
        if now == row["result_digest"]:
            store.set_proposal_status(row["id"], done_status)
            continue
        proposal = proposal_from_row(row)
        try:
            checkpoint = apply_proposal(proposal, frozenset(applied))
        except (StaleProposalError, WorkspaceError) as exc:
            store.set_proposal_status(row["id"], "stale")
            notes.append(f"approved edit to {row['rel_path']} could not be finished: {exc}")
            continue
        if checkpoint is not None:
            store.save_checkpoint(session_id, checkpoint)
        store.set_proposal_status(row["id"], done_status)
        notes.append(f"finished writing the approved edit to {row['rel_path']}")
    return notes


def _interrupted_result(call_id: str, proposals: dict[str, dict[str, Any]],
                        shells: dict[str, dict[str, Any]]) -> str:
    """What a tool call whose result was never recorded actually did."""
    if call_id in proposals:
        row = proposals[call_id]
        if row["status"] in ("pending", "abandoned", "cancelled"):
            return "Not applied: the session ended before this edit was decided. Nothing was written."
        proposal = proposal_from_row(row)
        reasons = {int(k): v for k, v in json.loads(row["hunk_reasons"] or "{}").items()}
        return describe_outcome(proposal, row["status"], json.loads(row["applied"] or "[]"),
                                json.loads(row["rejected"] or "[]"), row["reason"], reasons)
    if call_id in shells:
        row = shells[call_id]
        if not row["allowed"]:
            return f"Not run: the command was denied ({row['reason']})."
        if row["exit_code"] is not None:
            return f"The command ran and ended with exit code {row['exit_code']}; its output was lost when the " \
                   "session was interrupted."
        return "The command was started but the session was interrupted before it finished; check its effects " \
               "before running it again."
    return "Not run: the session was interrupted before this tool call ran."


def close_open_calls(store: SessionStore, session_id: str) -> int:
    """Give every tool call of the last step a result if it has none; returns how many were added."""
    # a delegated task's own conversation (Slipstream) is transient: only the main one is resumed
    messages = [m for m in store.messages(session_id) if m["_origin"] != "delegate"]
    tail_start = max((i for i, m in enumerate(messages) if m["role"] != "tool"), default=-1)
    if tail_start < 0 or not messages[tail_start].get("tool_calls"):
        return 0
    answered = {m.get("tool_call_id") for m in messages[tail_start + 1:]}
    proposals = {row["call_id"]: row for row in store.proposals(session_id) if row["call_id"]}
    shells = {row["call_id"]: row for row in store.shell_commands(session_id) if row["call_id"]}
    added = 0
    for call in messages[tail_start]["tool_calls"]:
        if call["id"] in answered:
            continue
        content = _interrupted_result(call["id"], proposals, shells)
        store.add_message(session_id, {"role": "tool", "tool_call_id": call["id"], "content": content},
                          messages[tail_start].get("_origin", "local"))
        added += 1
    return added


def recover_session(store: SessionStore, session_id: str) -> list[str]:
    """Finish approved edits, then close open tool calls; returns notes worth showing."""
    notes = finish_approved_edits(store, session_id)
    added = close_open_calls(store, session_id)
    if added:
        notes.append(f"the previous turn was interrupted; {added} tool call(s) were closed with what is known")
    return notes
