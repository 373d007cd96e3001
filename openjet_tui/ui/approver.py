"""The app's Approver: every decision is an inline prompt in the conversation, answered with keys.

The agent awaits the prompt's answer; cancelling the turn (Esc) cancels that await, and the prompt goes away.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from openjet_tui.agent.approver import PathDecision, PathRequest, ShellDecision, ShellRequest
from openjet_tui.agent.proposals import EditDecision, Proposal
from openjet_tui.ui.widgets.diff_review import DiffReview
from openjet_tui.ui.widgets.prompts import AnswerPrompt, PathPrompt, ShellPrompt

T = TypeVar("T")


class PromptHost(Protocol):
    """Where prompts are shown: the chat screen."""

    async def ask(self, prompt: AnswerPrompt[T]) -> T:
        """Show a prompt, wait for its answer, take it away."""
        ...


class InlineApprover:
    """Implements the agent's Approver with DiffReview, ShellPrompt and PathPrompt widgets."""

    def __init__(self, host: PromptHost | None = None, editor: str | None = None):
        self.host = host
        self.editor = editor  # None: $VISUAL, then $EDITOR, then vi

    def _host(self) -> PromptHost:
        if self.host is None:
            raise RuntimeError("the approver has no screen to ask on yet")
        return self.host

    async def review_edit(self, proposal: Proposal) -> EditDecision:
        """Review the proposal hunk by hunk."""
        return await self._host().ask(DiffReview(proposal, editor=self.editor))

    async def review_shell(self, request: ShellRequest) -> ShellDecision:
        """Allow once, allow always (storing the shown rule) or deny with a reason."""
        return await self._host().ask(ShellPrompt(request))

    async def review_path(self, request: PathRequest) -> PathDecision:
        """Allow or refuse a path outside the workspace."""
        return await self._host().ask(PathPrompt(request))
