"""The Approver seam: the agent asks, something decides. The Textual UI decides with inline prompts; headless runs
with a terminal ask on it (ConsoleApprover), without one deny and say so (PolicyApprover); tests script answers."""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

from openjet_tui.agent.proposals import EditDecision, Proposal
from openjet_tui.agent.shellpolicy import ShellVerdict

__all__ = ["Approver", "ConsoleApprover", "EditDecision", "PathDecision", "PathRequest", "PolicyApprover",
           "ScriptedApprover", "ShellDecision", "ShellRequest"]


@dataclass(slots=True)
class ShellRequest:
    """A command waiting for approval, with the verdict for each part and the rules "always" would store."""

    call_id: str
    command: str
    cwd: Path
    verdict: ShellVerdict


@dataclass(slots=True)
class ShellDecision:
    """Run it or not; `always` stores the request's suggested rules."""

    allow: bool
    always: bool = False
    reason: str | None = None


@dataclass(slots=True)
class PathRequest:
    """A tool wants a path outside the workspace."""

    call_id: str
    tool: str
    path: Path
    action: str  # read | list | write


@dataclass(slots=True)
class PathDecision:
    """Whether the tool may leave the workspace this once."""

    allow: bool
    reason: str | None = None


class Approver(Protocol):
    """Decides what the agent may do. Each method may take as long as a person needs."""

    async def review_edit(self, proposal: Proposal) -> EditDecision:
        """Apply all, some or none of a proposal's hunks."""
        ...

    async def review_shell(self, request: ShellRequest) -> ShellDecision:
        """Run a command once, always (store a rule), or not."""
        ...

    async def review_path(self, request: PathRequest) -> PathDecision:
        """Let a tool use a path outside the workspace."""
        ...


@dataclass(slots=True)
class PolicyApprover:
    """Headless without a terminal: nobody can approve, so everything that needs approval is denied, with why."""

    reason: str = ("ask mode needs a person to approve and there is no terminal; rerun in a terminal, or "
                   "choose --mode auto-edit (edits apply) or --mode auto (commands run too)")
    num_denied: int = 0

    async def review_edit(self, proposal: Proposal) -> EditDecision:
        """Deny every edit that reached approval."""
        self.num_denied += 1
        return EditDecision.reject_all(self.reason)

    async def review_shell(self, request: ShellRequest) -> ShellDecision:
        """Deny every command that reached approval."""
        self.num_denied += 1
        return ShellDecision(False, reason=self.reason)

    async def review_path(self, request: PathRequest) -> PathDecision:
        """Deny leaving the workspace."""
        self.num_denied += 1
        return PathDecision(False, self.reason)


EditScript = EditDecision | Callable[[Proposal], EditDecision]
ShellScript = ShellDecision | Callable[[ShellRequest], ShellDecision]
PathScript = PathDecision | Callable[[PathRequest], PathDecision]


@dataclass
class ScriptedApprover:
    """Answers from queues (decisions or callables) and records every request, for tests and benchmarks.
    An empty queue denies, with a reason that says so."""

    edits: deque[EditScript] = field(default_factory=deque)
    shells: deque[ShellScript] = field(default_factory=deque)
    paths: deque[PathScript] = field(default_factory=deque)
    seen_edits: list[Proposal] = field(default_factory=list)
    seen_shells: list[ShellRequest] = field(default_factory=list)
    seen_paths: list[PathRequest] = field(default_factory=list)

    @classmethod
    def of(cls, edits: Iterable[EditScript] = (), shells: Iterable[ShellScript] = (),
           paths: Iterable[PathScript] = ()) -> ScriptedApprover:
        """Build from plain iterables."""
        return cls(deque(edits), deque(shells), deque(paths))

    async def review_edit(self, proposal: Proposal) -> EditDecision:
        """Next scripted edit decision."""
        self.seen_edits.append(proposal)
        if not self.edits:
            return EditDecision.reject_all("scripted approver: no edit decision queued")
        script = self.edits.popleft()
        return script(proposal) if callable(script) else script

    async def review_shell(self, request: ShellRequest) -> ShellDecision:
        """Next scripted shell decision."""
        self.seen_shells.append(request)
        if not self.shells:
            return ShellDecision(False, reason="scripted approver: no shell decision queued")
        script = self.shells.popleft()
        return script(request) if callable(script) else script

    async def review_path(self, request: PathRequest) -> PathDecision:
        """Next scripted path decision."""
        self.seen_paths.append(request)
        if not self.paths:
            return PathDecision(False, "scripted approver: no path decision queued")
        script = self.paths.popleft()
        return script(request) if callable(script) else script


class ConsoleApprover:
    """Headless with a terminal: asks on it, one line per answer (input runs in a thread; the loop stays live)."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None):
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stderr  # stdout may be carrying --json records

    async def _ask(self, prompt: str) -> str:
        self.stdout.write(prompt)
        self.stdout.flush()
        line = await asyncio.to_thread(self.stdin.readline)
        return line.strip()

    async def review_edit(self, proposal: Proposal) -> EditDecision:
        """Show each hunk and ask y (apply) / n (reject) / a (apply this and the rest) / q (reject the rest)."""
        accepted: set[int] = set()
        reasons: dict[int, str] = {}
        self.stdout.write(f"\nProposed edit to {proposal.rel_path} ({len(proposal.hunks)} hunks)\n")
        rest, rest_reason = "", ""  # rest "a": apply the remaining hunks unasked; "q": reject them
        for hunk in proposal.hunks:
            if rest == "a":
                accepted.add(hunk.index)
                continue
            if rest == "q":
                reasons[hunk.index] = rest_reason
                continue
            self.stdout.write(hunk.text() + "\n")
            answer = (await self._ask(f"Apply hunk {hunk.index + 1}? [y]es/[n]o/[a]ll/[q]uit: ")).lower()[:1]
            if answer in ("y", "a"):
                accepted.add(hunk.index)
                rest = answer if answer == "a" else ""
                continue
            reasons[hunk.index] = await self._ask(f"Reason for rejecting hunk {hunk.index + 1} (optional): ")
            if answer == "q":
                rest, rest_reason = "q", reasons[hunk.index] or "rejected together with an earlier hunk"
        return EditDecision(frozenset(accepted), None, {k: v for k, v in reasons.items() if v})

    async def review_shell(self, request: ShellRequest) -> ShellDecision:
        """Show the command and each part's verdict; y (once) / a (always) / n (deny, with a reason)."""
        self.stdout.write(f"\nRun in {request.cwd}:\n  {request.command}\n")
        for part in request.verdict.parts:
            self.stdout.write(f"  - {part.part.text}: {part.action} ({part.why})\n")
        rules = ", ".join(str(rule) for rule in request.verdict.suggested_rules)
        options = "[y]es/[a]lways/[n]o" if rules else "[y]es/[n]o"
        if rules:
            self.stdout.write(f"  always would allow: {rules}\n")
        answer = (await self._ask(f"Run it? {options}: ")).lower()[:1]
        if answer in ("y", "a"):
            return ShellDecision(True, always=answer == "a" and bool(rules))
        return ShellDecision(False, reason=await self._ask("Reason (optional): ") or None)

    async def review_path(self, request: PathRequest) -> PathDecision:
        """Ask before a tool leaves the workspace."""
        answer = await self._ask(f"\n{request.tool} wants to {request.action} {request.path}, outside the "
                                 "workspace. Allow? [y]es/[n]o: ")
        return PathDecision(answer.lower()[:1] == "y", None)
