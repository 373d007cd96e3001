"""Edit proposals: a unified diff split into hunks, applied in part or whole, atomically, never over newer changes."""

from __future__ import annotations

import difflib
import hashlib
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from openjet_tui.errors import StaleProposalError, WorkspaceError

CONTEXT_LINES = 3


def digest(data: bytes | None) -> str | None:
    """sha256 of file bytes; None stands for "the file does not exist"."""
    return None if data is None else hashlib.sha256(data).hexdigest()


def current_bytes(path: Path) -> bytes | None:
    """A file's bytes, or None when it does not exist."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


@dataclass(slots=True)
class Hunk:
    """One contiguous change with its context, numbered from 0 within its proposal."""

    index: int
    old_start: int  # 0-based first line of the hunk in the old text
    old_end: int
    new_start: int
    new_end: int
    lines: list[str]  # diff body lines: " ", "-", "+" prefixes, no line endings
    ops: list[tuple[str, int, int, int, int]] = field(repr=False)  # difflib opcodes covering the hunk

    @property
    def header(self) -> str:
        """The unified-diff range line, e.g. `@@ -3,7 +3,8 @@`."""
        def span(start: int, end: int) -> str:
            """`start,count` with diff's 1-based start (0 for an empty range)."""
            count = end - start
            return f"{start + 1 if count else start},{count}"
        return f"@@ -{span(self.old_start, self.old_end)} +{span(self.new_start, self.new_end)} @@"

    @property
    def num_added(self) -> int:
        """Lines this hunk adds."""
        return sum(1 for line in self.lines if line.startswith("+"))

    @property
    def num_removed(self) -> int:
        """Lines this hunk removes."""
        return sum(1 for line in self.lines if line.startswith("-"))

    def text(self) -> str:
        """The hunk as unified-diff text."""
        return "\n".join([self.header, *self.lines])


@dataclass(slots=True)
class Proposal:
    """An edit waiting for a decision: nothing is written until it is applied."""

    id: str
    path: Path  # resolved absolute path
    rel_path: str
    old_text: str | None  # None: the file does not exist yet
    new_text: str
    hunks: list[Hunk]
    base_digest: str | None
    tool: str = "edit_file"
    call_id: str | None = None
    status: str = "pending"  # pending | applied | partial | rejected | stale | failed
    is_stale: bool = False

    def diff(self) -> str:
        """The whole unified diff, with file headers."""
        old_name = "/dev/null" if self.old_text is None else f"a/{self.rel_path}"
        return "\n".join([f"--- {old_name}", f"+++ b/{self.rel_path}", *(h.text() for h in self.hunks)]) + "\n"

    def result_text(self, accepted: set[int] | frozenset[int]) -> str:
        """The file's text with only the accepted hunks applied."""
        old_lines = _lines(self.old_text or "")
        new_lines = _lines(self.new_text)
        out: list[str] = []
        position = 0
        for hunk in self.hunks:
            out += old_lines[position:hunk.old_start]
            if hunk.index in accepted:
                for tag, i1, i2, j1, j2 in hunk.ops:
                    out += old_lines[i1:i2] if tag == "equal" else new_lines[j1:j2]
            else:
                out += old_lines[hunk.old_start:hunk.old_end]
            position = hunk.old_end
        out += old_lines[position:]
        return "".join(out)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _diff_lines(prefix: str, lines: list[str]) -> list[str]:
    """Diff body lines, marking a last line that has no newline the way `diff -u` does."""
    out = []
    for line in lines:
        out.append(prefix + line.rstrip("\r\n"))
        if not line.endswith(("\n", "\r")):
            out.append("\\ No newline at end of file")
    return out


def split_hunks(old_text: str, new_text: str, context: int = CONTEXT_LINES) -> list[Hunk]:
    """Diff two texts line by line and split the result into hunks with `context` lines around each change."""
    old_lines, new_lines = _lines(old_text), _lines(new_text)
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    hunks = []
    for index, group in enumerate(matcher.get_grouped_opcodes(context)):
        body: list[str] = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                body += _diff_lines(" ", old_lines[i1:i2])
                continue
            body += _diff_lines("-", old_lines[i1:i2])
            body += _diff_lines("+", new_lines[j1:j2])
        hunks.append(Hunk(index, group[0][1], group[-1][2], group[0][3], group[-1][4], body, list(group)))
    return hunks


def make_proposal(path: Path, rel_path: str, old_bytes: bytes | None, new_text: str, tool: str = "edit_file",
                  call_id: str | None = None) -> Proposal:
    """Build a proposal from the bytes the change was computed against (None for a new file)."""
    old_text = None if old_bytes is None else old_bytes.decode("utf-8")
    hunks = split_hunks(old_text or "", new_text)
    return Proposal(uuid.uuid4().hex[:12], path, rel_path, old_text, new_text, hunks, digest(old_bytes), tool,
                    call_id)


@dataclass(slots=True)
class EditDecision:
    """What the person decided: which hunks to apply (by index), and why, overall or per rejected hunk."""

    accepted: frozenset[int]
    reason: str | None = None
    hunk_reasons: dict[int, str] = field(default_factory=dict)

    @classmethod
    def accept_all(cls, proposal: Proposal) -> EditDecision:
        """Apply every hunk."""
        return cls(frozenset(h.index for h in proposal.hunks))

    @classmethod
    def reject_all(cls, reason: str | None = None) -> EditDecision:
        """Apply nothing."""
        return cls(frozenset(), reason)


@dataclass(slots=True)
class Checkpoint:
    """The state of one file before an applied change: `undo` writes `before` back (None: delete the file)."""

    id: str
    path: Path
    rel_path: str
    before: bytes | None
    after_digest: str
    proposal_id: str


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename, so readers see old or new, never half."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".openjet-tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if mode is not None:
            os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def apply_proposal(proposal: Proposal, accepted: frozenset[int]) -> Checkpoint | None:
    """Write the accepted hunks if the file is unchanged since the proposal; returns the checkpoint (None: nothing)."""
    if not accepted & {h.index for h in proposal.hunks}:
        return None
    if Path(os.path.realpath(proposal.path)) != proposal.path:  # a symlink appeared or moved since the proposal
        raise WorkspaceError(f"{proposal.rel_path}: the path now resolves elsewhere; refusing to write")
    before = current_bytes(proposal.path)
    if digest(before) != proposal.base_digest:
        proposal.is_stale, proposal.status = True, "stale"
        raise StaleProposalError(f"{proposal.rel_path} changed on disk since this edit was proposed")
    data = proposal.result_text(accepted).encode("utf-8")
    atomic_write(proposal.path, data)
    return Checkpoint(uuid.uuid4().hex[:12], proposal.path, proposal.rel_path, before, digest(data) or "",
                      proposal.id)


def undo_checkpoint(checkpoint: Checkpoint) -> None:
    """Restore a file to its state before the checkpoint, refusing if it changed since the change was applied."""
    if digest(current_bytes(checkpoint.path)) != checkpoint.after_digest:
        raise StaleProposalError(f"{checkpoint.rel_path} changed after the edit was applied; undo would lose "
                                 "those changes, so nothing was restored")
    if checkpoint.before is None:
        checkpoint.path.unlink()
    else:
        atomic_write(checkpoint.path, checkpoint.before)


class ProposalBook:
    """Proposals waiting for a decision, and the checkpoints of applied ones (newest last) for undo."""

    def __init__(self, checkpoints: list[Checkpoint] | None = None):
        self.pending: dict[str, Proposal] = {}
        self.checkpoints: list[Checkpoint] = list(checkpoints or [])

    def add(self, proposal: Proposal) -> None:
        """Track a proposal until it is decided."""
        self.pending[proposal.id] = proposal

    def finish(self, proposal: Proposal) -> None:
        """Stop tracking a decided proposal."""
        self.pending.pop(proposal.id, None)

    def mark_stale(self, path: Path) -> list[Proposal]:
        """Mark pending proposals on a changed file stale; returns the ones that just became stale."""
        newly = []
        for proposal in self.pending.values():
            if proposal.path == path and not proposal.is_stale:
                if digest(current_bytes(path)) != proposal.base_digest:
                    proposal.is_stale, proposal.status = True, "stale"
                    newly.append(proposal)
        return newly

    def push(self, checkpoint: Checkpoint) -> None:
        """Remember an applied change."""
        self.checkpoints.append(checkpoint)

    def undo_last(self) -> Checkpoint:
        """Undo the newest applied change; raises if there is none or its file changed since."""
        if not self.checkpoints:
            raise WorkspaceError("nothing to undo")
        checkpoint = self.checkpoints[-1]
        undo_checkpoint(checkpoint)
        self.checkpoints.pop()
        return checkpoint
