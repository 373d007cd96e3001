"""Agent events and stored messages turned into conversation items.

Events arrive in per-frame batches (see pump.py); consecutive text and reasoning deltas of one origin are joined
first, so a 1,000 tok/s stream costs one Markdown append per frame, not one per token.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from openjet_tui.agent import events as ev
from openjet_tui.ui.widgets.chat_items import (AssistantReply, NoticeLine, Record, TodoCard, ToolCard,
                                               UserMessage)
from openjet_tui.ui.widgets.conversation import Conversation

CONVERSATION_EVENTS = (ev.TextDelta, ev.ReasoningDelta, ev.AssistantMessage, ev.ToolRequested, ev.ProposalCreated,
                       ev.ProposalResolved, ev.ProposalStale, ev.ShellResolved, ev.ToolResult, ev.TodoUpdated,
                       ev.Compacted, ev.Notice, ev.ErrorEvent, ev.TurnStarted, ev.TurnFinished, ev.UsageReported)
MAX_CARDS = 1000  # tool cards remembered by call id for late updates


@dataclass(slots=True)
class ReasoningRun(ev.ReasoningDelta):
    """Consecutive reasoning deltas joined for drawing, and how many there were (one per streamed chunk)."""

    num_deltas: int = 1


def coalesce(events: Iterable[ev.Event]) -> list[ev.Event]:
    """Join runs of text (or reasoning) deltas from the same origin into one delta each."""
    out: list[ev.Event] = []
    for event in events:
        if isinstance(event, ev.ReasoningDelta) and not isinstance(event, ReasoningRun):
            event = ReasoningRun(event.text, event.origin)
        last = out[-1] if out else None
        if not isinstance(event, (ev.TextDelta, ReasoningRun)) or type(last) is not type(event) \
                or last.origin != event.origin:  # type: ignore[union-attr]
            out.append(event)
        elif isinstance(event, ReasoningRun) and isinstance(last, ReasoningRun):
            out[-1] = ReasoningRun(last.text + event.text, event.origin, last.num_deltas + event.num_deltas)
        else:
            out[-1] = ev.TextDelta(last.text + event.text, event.origin)  # type: ignore[union-attr]
    return out


def resolution_text(event: ev.ProposalResolved) -> str:
    """'applied', 'partial: hunks 2 rejected', 'rejected: reason'."""
    if event.status == "partial":
        return f"partial: hunk{'s' if len(event.rejected) > 1 else ''} " \
               f"{', '.join(str(i + 1) for i in event.rejected)} rejected"
    if event.status == "rejected" and event.reason:
        return f"rejected: {event.reason}"
    return event.status


class EventRenderer:
    """Keeps track of the reply being streamed and the cards of tool calls, and mounts items for events."""

    def __init__(self, conversation: Conversation):
        self.conversation = conversation
        self.reply: AssistantReply | None = None
        self.finished: AssistantReply | None = None  # the last finished reply, until its usage report comes
        self.cards: dict[str, ToolCard] = {}
        self.proposal_cards: dict[str, ToolCard] = {}

    async def apply(self, events: Iterable[ev.Event]) -> None:
        """Render a batch of events in order."""
        for event in coalesce(events):
            await self.apply_one(event)

    async def apply_one(self, event: ev.Event) -> None:
        """Render one event."""
        if isinstance(event, (ev.TextDelta, ev.ReasoningDelta)):
            reply = await self._reply_for(event.origin)
            if isinstance(event, ev.TextDelta):
                await reply.append_text(event.text)
            else:
                await reply.append_reasoning(event.text, getattr(event, "num_deltas", 1))
        elif isinstance(event, ev.AssistantMessage):
            await self._finish_reply(event)
        elif isinstance(event, ev.UsageReported):
            self._count_reasoning(event)
        elif isinstance(event, (ev.TurnStarted, ev.TurnFinished)):
            await self._close_reply()
            if isinstance(event, ev.TurnFinished) and event.status == "cancelled":
                await self.conversation.add(NoticeLine("turn cancelled: nothing more will run", "warning"))
        elif isinstance(event, (ev.ToolRequested, ev.ProposalCreated, ev.ProposalResolved, ev.ProposalStale,
                                ev.ShellResolved, ev.ToolResult)):
            await self._apply_tool_event(event)
        else:
            await self._apply_notice(event)

    async def _reply_for(self, origin: str) -> AssistantReply:
        if self.reply is None or self.reply.origin != origin:
            await self._close_reply()
            self.reply = AssistantReply(origin, is_streaming=True)
            await self.conversation.add(self.reply)
        return self.reply

    async def _close_reply(self) -> None:
        if self.reply is not None:
            await self.reply.finish()
            self.reply = None

    async def _finish_reply(self, event: ev.AssistantMessage) -> None:
        self.finished = None
        if self.reply is not None and self.reply.origin == event.origin:
            await self.reply.finish(event.content)
            self.reply, self.finished = None, self.reply
        elif event.content.strip():  # nothing was streamed (a server that ignored `stream`)
            self.finished = AssistantReply(event.origin, event.content, event.reasoning)
            await self.conversation.add(self.finished)

    def _count_reasoning(self, event: ev.UsageReported) -> None:
        """The server's reasoning token count replaces the counted chunks of the reply it belongs to (a 0 beside
        reasoning text is a server that does not count them)."""
        reply, self.finished = self.finished, None
        if reply is not None and reply.origin == event.origin and event.reasoning_tokens:
            reply.set_reasoning_tokens(event.reasoning_tokens)

    async def _apply_tool_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.ToolRequested):
            await self._close_reply()
            card = ToolCard(event.call_id, event.name, event.arguments, event.origin)
            self.cards[event.call_id] = card
            while len(self.cards) > MAX_CARDS:
                self.cards.pop(next(iter(self.cards)))
            await self.conversation.add(card)
        elif isinstance(event, ev.ProposalCreated):
            card = self.cards.get(event.proposal.call_id or "")
            if card is not None:
                self.proposal_cards[event.proposal.id] = card
                card.update_state(proposal=event.proposal, status="awaiting review")
        elif isinstance(event, ev.ProposalResolved):
            if (card := self.proposal_cards.get(event.proposal_id)) is not None:
                card.update_state(status=resolution_text(event), is_error=event.status in ("stale", "failed"))
        elif isinstance(event, ev.ProposalStale):
            if (card := self.proposal_cards.get(event.proposal_id)) is not None:
                card.update_state(status="stale: the file changed on disk")
        elif isinstance(event, ev.ShellResolved):
            if (card := self.cards.get(event.call_id)) is not None:
                verdict = "allowed" if event.allowed else "denied"
                card.update_state(decision=f"{verdict} by {event.decided_by}: {event.reason}",
                                  status="running" if event.allowed else f"denied: {event.reason}")
        elif isinstance(event, ev.ToolResult):
            if (card := self.cards.get(event.call_id)) is not None:
                if card.state.get("status") in ("running", "awaiting review"):
                    del card.state["status"]  # the result says how it went; decisions keep their status
                card.update_state(result=event.content, is_error=event.is_error or card.state.get("is_error", False))

    async def _apply_notice(self, event: ev.Event) -> None:
        if isinstance(event, ev.TodoUpdated):
            await self.conversation.add(TodoCard(event.items))
        elif isinstance(event, ev.Compacted):
            await self.conversation.add(NoticeLine(
                f"compacted {event.num_messages} earlier messages into a {event.summary_chars:,}-character summary "
                f"(the context held about {event.tokens_before:,} tokens)"))
        elif isinstance(event, ev.Notice):
            await self.conversation.add(NoticeLine(event.message, event.level))
        elif isinstance(event, ev.ErrorEvent):
            await self.conversation.add(NoticeLine(event.message, "error"))


def history_records(messages: list[dict[str, Any]]) -> list[Record]:
    """Conversation items for stored messages (tool results folded into their cards)."""
    results = {m.get("tool_call_id"): m.get("content", "") for m in messages if m["role"] == "tool"}
    records: list[Record] = []
    for message in messages:
        role, origin = message["role"], message.get("_origin", "local")
        content = message.get("content") or ""
        if role == "user" and origin == "delegate":
            task = content.rsplit("Task:\n", 1)[-1].strip().splitlines()
            records.append(functools.partial(NoticeLine, f"delegated to the local model: {task[0] if task else ''}"))
        elif role == "user":
            records.append(functools.partial(UserMessage, content, origin == "cloud"))
        elif role == "assistant":
            if content.strip() or message.get("reasoning"):
                records.append(functools.partial(AssistantReply, origin, content, message.get("reasoning", "")))
            records += [_card_record(call, origin, results) for call in message.get("tool_calls") or []]
    return records


def _card_record(call: dict[str, Any], origin: str, results: dict[Any, str]) -> Record:
    function = call.get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError:
        arguments = {"arguments": function.get("arguments")}
    state: dict[str, Any]
    if call.get("id") in results:
        result = results[call["id"]]
        state = {"result": result, "is_error": result.startswith("Error:")}
    else:
        state = {"status": "never ran"}
    arguments = arguments if isinstance(arguments, dict) else {"arguments": arguments}
    return functools.partial(ToolCard, str(call.get("id")), str(function.get("name")), arguments, origin, state)
