"""Watching the workspace (watchfiles): outside changes mark pending proposals stale at once, keep the file index
for `@path` completion fresh, and reload AGENTS.md and .openjet/config.toml when they change."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import watchfiles
from watchfiles import Change

from openjet_tui.agent.events import Event, ProposalStale
from openjet_tui.agent.proposals import ProposalBook
from openjet_tui.agent.workspace import IGNORED_DIRS, Workspace

TEMP_SUFFIX = ".openjet-tmp"  # our own atomic-write temporaries
AGENTS_FILE = "AGENTS.md"
PROJECT_CONFIG = ".openjet/config.toml"


class FileIndex:
    """The workspace's files as relative posix paths, with fuzzy completion for `@path`."""

    def __init__(self, workspace: Workspace):
        self.workspace = workspace
        self.paths: set[str] = set()
        self.scan()

    def scan(self) -> None:
        """Rebuild from disk."""
        self.paths = {p.relative_to(self.workspace.root).as_posix() for p in self.workspace.walk_files()
                      if not p.name.endswith(TEMP_SUFFIX)}

    def complete(self, query: str, limit: int = 20) -> list[str]:
        """Paths containing the query's characters in order, best first (file-name hits, tight runs, short)."""
        if not query:
            return sorted(self.paths, key=lambda p: (p.count("/"), p))[:limit]
        scored = [(score, path) for path in self.paths if (score := _fuzzy_score(query.lower(), path)) is not None]
        return [path for _, path in sorted(scored, key=lambda item: (item[0], item[1]))[:limit]]


def _fuzzy_score(query: str, path: str) -> tuple[int, int, int] | None:
    """Lower is better; None when the query is not a subsequence of the path."""
    lowered = path.lower()
    name_start = lowered.rfind("/") + 1
    position, gaps, first = -1, 0, -1
    for char in query:
        found = lowered.find(char, position + 1)
        if found < 0:
            return None
        if first < 0:
            first = found
        gaps += found - position - 1 if position >= 0 else 0
        position = found
    in_name = 0 if first >= name_start else 1
    return in_name, gaps, len(path)


def _watched(change: Change, path: str) -> bool:
    """Skip ignored folders and our own temporary files."""
    parts = Path(path).parts
    return not any(part in IGNORED_DIRS for part in parts) and not path.endswith(TEMP_SUFFIX)


class WorkspaceWatcher:
    """Turns file-system changes into stale proposals, index updates and reload callbacks."""

    def __init__(self, workspace: Workspace, book: ProposalBook, index: FileIndex,
                 on_event: Callable[[Event], None], on_agents_md: Callable[[], None] | None = None,
                 on_config: Callable[[], None] | None = None):
        self.workspace, self.book, self.index = workspace, book, index
        self.on_event = on_event
        self.on_agents_md, self.on_config = on_agents_md, on_config
        self.ready = asyncio.Event()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Watch until stop is set (or the task is cancelled)."""
        stop = stop or asyncio.Event()
        self.ready.set()
        async for changes in watchfiles.awatch(self.workspace.root, watch_filter=_watched, stop_event=stop,
                                               debounce=50, step=20, yield_on_timeout=False):
            self.handle(changes)

    def handle(self, changes: set[tuple[Change, str]]) -> None:
        """React to one batch of changes."""
        reload_agents = reload_config = False
        for change, raw in changes:
            path = Path(os.path.realpath(raw))
            if not self.workspace.contains(path):
                continue
            rel = path.relative_to(self.workspace.root).as_posix()
            if change == Change.deleted:
                self.index.paths.discard(rel)
            elif path.is_file():
                self.index.paths.add(rel)
            for proposal in self.book.mark_stale(path):
                self.on_event(ProposalStale(proposal.id, proposal.rel_path))
            reload_agents |= rel == AGENTS_FILE
            reload_config |= rel == PROJECT_CONFIG
        if reload_agents and self.on_agents_md is not None:
            self.on_agents_md()
        if reload_config and self.on_config is not None:
            self.on_config()
