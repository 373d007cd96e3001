"""Sessions in SQLite under the XDG data directory: messages, tool calls, proposals, decisions, checkpoints.

Every write commits at once, so a session killed mid-turn keeps everything recorded up to that moment.
Schema changes are numbered migration functions, applied in order and tracked in `PRAGMA user_version`.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openjet_tui.agent.proposals import Checkpoint, Proposal
from openjet_tui.agent.shellpolicy import Rule
from openjet_tui.errors import SessionError


def m001_initial(db: sqlite3.Connection) -> None:
    """Sessions, messages, tool calls, proposals with their decisions, shell decisions, checkpoints."""
    db.executescript("""
        CREATE TABLE sessions (id TEXT PRIMARY KEY, workspace TEXT NOT NULL, title TEXT NOT NULL DEFAULT '',
            provider TEXT, model TEXT, mode TEXT, summary TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
            role TEXT NOT NULL, content TEXT NOT NULL DEFAULT '', reasoning TEXT NOT NULL DEFAULT '',
            tool_calls TEXT, tool_call_id TEXT, origin TEXT NOT NULL DEFAULT 'local',
            is_compacted INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL);
        CREATE INDEX messages_by_session ON messages(session_id, id);
        CREATE TABLE proposals (id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id),
            call_id TEXT, path TEXT NOT NULL, rel_path TEXT NOT NULL, tool TEXT NOT NULL, old_text TEXT,
            new_text TEXT NOT NULL, base_digest TEXT, diff TEXT NOT NULL, num_hunks INTEGER NOT NULL,
            status TEXT NOT NULL, applied TEXT, rejected TEXT, reason TEXT, hunk_reasons TEXT, result_digest TEXT,
            created_at REAL NOT NULL, decided_at REAL);
        CREATE TABLE shell_commands (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
            call_id TEXT, command TEXT NOT NULL, allowed INTEGER NOT NULL, decided_by TEXT NOT NULL,
            reason TEXT, exit_code INTEGER, created_at REAL NOT NULL);
        CREATE TABLE checkpoints (id TEXT PRIMARY KEY, session_id TEXT NOT NULL, proposal_id TEXT NOT NULL,
            path TEXT NOT NULL, rel_path TEXT NOT NULL, before BLOB, after_digest TEXT NOT NULL,
            is_undone INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL);
    """)


def m002_rules_and_traffic(db: sqlite3.Connection) -> None:
    """Remembered "always" shell rules per workspace, and Slipstream's record of cloud requests."""
    db.executescript("""
        CREATE TABLE shell_rules (workspace TEXT NOT NULL, prefix TEXT NOT NULL, action TEXT NOT NULL,
            created_at REAL NOT NULL, PRIMARY KEY (workspace, prefix, action));
        CREATE TABLE traffic (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, endpoint TEXT NOT NULL,
            request_bytes INTEGER NOT NULL, response_bytes INTEGER NOT NULL, num_messages INTEGER NOT NULL,
            prompt_tokens INTEGER, completion_tokens INTEGER, status INTEGER, error TEXT, created_at REAL NOT NULL);
    """)


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [m001_initial, m002_rules_and_traffic]


def migrate(db: sqlite3.Connection) -> int:
    """Apply every migration newer than the database; returns the resulting schema version."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > len(MIGRATIONS):
        raise SessionError(f"session database schema version {version} is newer than this OpenJet "
                           f"({len(MIGRATIONS)}); upgrade OpenJet")
    for number, migration in enumerate(MIGRATIONS[version:], start=version + 1):
        with db:
            migration(db)
            db.execute(f"PRAGMA user_version = {number}")
    return len(MIGRATIONS)


def default_db_path() -> Path:
    """$XDG_DATA_HOME/openjet/sessions.db (default ~/.local/share/openjet/sessions.db)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "openjet" / "sessions.db"


@dataclass(slots=True)
class SessionInfo:
    """One session's header row."""

    id: str
    workspace: str
    title: str
    provider: str | None
    model: str | None
    mode: str | None
    summary: str | None
    created_at: float
    updated_at: float


class SessionStore:
    """The session database. Methods are thread-safe and commit immediately."""

    def __init__(self, path: Path | str | None = None):
        self.path: Path | str = ":memory:" if path == ":memory:" else Path(path) if path else default_db_path()
        if isinstance(self.path, Path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode = WAL")
            migrate(self.db)
        except sqlite3.DatabaseError as exc:
            raise SessionError(f"session database {self.path}: {exc}") from exc
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the database."""
        self.db.close()

    def _run(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        with self._lock:
            return self.db.execute(sql, params)

    def create(self, workspace: Path, provider: str | None, model: str | None, mode: str | None) -> SessionInfo:
        """Start a new session."""
        now = time.time()
        session_id = uuid.uuid4().hex[:12]
        self._run("INSERT INTO sessions (id, workspace, provider, model, mode, created_at, updated_at) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?)", (session_id, str(workspace), provider, model, mode, now, now))
        return self.get(session_id)

    def get(self, prefix: str) -> SessionInfo:
        """A session by id or unique id prefix."""
        rows = self._run("SELECT * FROM sessions WHERE substr(id, 1, ?) = ? ORDER BY updated_at DESC",
                         (len(prefix), prefix)).fetchall()
        if not rows or not prefix:
            raise SessionError(f"no session with id {prefix!r}; `openjet sessions list` shows them")
        if len(rows) > 1 and rows[0]["id"] != prefix:
            raise SessionError(f"session id {prefix!r} is ambiguous: {', '.join(r['id'] for r in rows[:5])}")
        return SessionInfo(**dict(rows[0]))

    def latest(self, workspace: Path) -> SessionInfo | None:
        """The most recently used session of a workspace (for --continue)."""
        row = self._run("SELECT * FROM sessions WHERE workspace = ? ORDER BY updated_at DESC LIMIT 1",
                        (str(workspace),)).fetchone()
        return SessionInfo(**dict(row)) if row else None

    def list(self, workspace: Path | None = None, limit: int = 50) -> list[SessionInfo]:
        """Sessions, newest first, optionally of one workspace."""
        if workspace is None:
            rows = self._run("SELECT * FROM sessions ORDER BY updated_at DESC LIMIT ?", (limit,))
        else:
            rows = self._run("SELECT * FROM sessions WHERE workspace = ? ORDER BY updated_at DESC LIMIT ?",
                             (str(workspace), limit))
        return [SessionInfo(**dict(row)) for row in rows.fetchall()]

    def touch(self, session_id: str, title: str | None = None) -> None:
        """Bump updated_at; set the title if it is still empty."""
        self._run("UPDATE sessions SET updated_at = ?, title = CASE WHEN title = '' AND ? IS NOT NULL "
                  "THEN ? ELSE title END WHERE id = ?", (time.time(), title, (title or "")[:80], session_id))

    def add_message(self, session_id: str, message: dict[str, Any], origin: str = "local") -> int:
        """Store one complete message (OpenAI form); returns its row id."""
        calls = message.get("tool_calls")
        cursor = self._run(
            "INSERT INTO messages (session_id, role, content, reasoning, tool_calls, tool_call_id, origin, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (session_id, message["role"], message.get("content") or "", message.get("reasoning") or "",
             json.dumps(calls) if calls else None, message.get("tool_call_id"), origin, time.time()))
        self.touch(session_id, message["content"] if message["role"] == "user" else None)
        return int(cursor.lastrowid or 0)

    def messages(self, session_id: str, include_compacted: bool = False) -> list[dict[str, Any]]:
        """The conversation in OpenAI form, oldest first (each dict also carries its row `_id` and `_origin`)."""
        rows = self._run("SELECT * FROM messages WHERE session_id = ? AND (? OR is_compacted = 0) ORDER BY id",
                         (session_id, include_compacted)).fetchall()
        out = []
        for row in rows:
            message: dict[str, Any] = {"role": row["role"], "content": row["content"], "_id": row["id"],
                                       "_origin": row["origin"]}
            if row["tool_calls"]:
                message["tool_calls"] = json.loads(row["tool_calls"])
            if row["tool_call_id"]:
                message["tool_call_id"] = row["tool_call_id"]
            if row["reasoning"]:
                message["reasoning"] = row["reasoning"]
            out.append(message)
        return out

    def compact(self, session_id: str, last_message_id: int, summary: str) -> None:
        """Mark messages up to last_message_id as summarised, and keep the summary."""
        with self._lock, self.db:
            self.db.execute("UPDATE messages SET is_compacted = 1 WHERE session_id = ? AND id <= ?",
                            (session_id, last_message_id))
            self.db.execute("UPDATE sessions SET summary = ? WHERE id = ?", (summary, session_id))

    def save_proposal(self, session_id: str, proposal: Proposal) -> None:
        """Record a proposal before anyone decides on it."""
        self._run("INSERT OR REPLACE INTO proposals (id, session_id, call_id, path, rel_path, tool, old_text, "
                  "new_text, base_digest, diff, num_hunks, status, created_at) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (proposal.id, session_id, proposal.call_id, str(proposal.path), proposal.rel_path, proposal.tool,
                   proposal.old_text, proposal.new_text, proposal.base_digest, proposal.diff(), len(proposal.hunks),
                   proposal.status, time.time()))

    def save_decision(self, proposal: Proposal, applied: list[int], rejected: list[int], reason: str | None,
                      hunk_reasons: dict[int, str], result_digest: str | None) -> None:
        """Record the decision, before the file is written: an approved edit survives a crash mid-write."""
        status = "approved" if applied else "rejected"
        self._run("UPDATE proposals SET status = ?, applied = ?, rejected = ?, reason = ?, hunk_reasons = ?, "
                  "result_digest = ?, decided_at = ? WHERE id = ?",
                  (status, json.dumps(applied), json.dumps(rejected), reason, json.dumps(hunk_reasons),
                   result_digest, time.time(), proposal.id))

    def set_proposal_status(self, proposal_id: str, status: str) -> None:
        """applied | partial | stale | failed after the write (or its refusal)."""
        self._run("UPDATE proposals SET status = ? WHERE id = ?", (status, proposal_id))

    def proposals(self, session_id: str) -> list[dict[str, Any]]:
        """Every proposal of a session with its decision, oldest first."""
        rows = self._run("SELECT * FROM proposals WHERE session_id = ? ORDER BY created_at", (session_id,))
        return [dict(row) for row in rows.fetchall()]

    def save_shell(self, session_id: str, call_id: str, command: str, allowed: bool, decided_by: str,
                   reason: str | None) -> int:
        """Record a shell decision before anything runs; returns the row id for set_shell_exit."""
        cursor = self._run("INSERT INTO shell_commands (session_id, call_id, command, allowed, decided_by, reason, "
                           "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (session_id, call_id, command, int(allowed), decided_by, reason, time.time()))
        return int(cursor.lastrowid or 0)

    def set_shell_exit(self, row_id: int, exit_code: int | None) -> None:
        """Record how an approved command ended (None: killed by timeout)."""
        self._run("UPDATE shell_commands SET exit_code = ? WHERE id = ?", (exit_code, row_id))

    def shell_commands(self, session_id: str) -> list[dict[str, Any]]:
        """Every shell decision of a session, oldest first."""
        rows = self._run("SELECT * FROM shell_commands WHERE session_id = ? ORDER BY id", (session_id,))
        return [dict(row) for row in rows.fetchall()]

    def save_checkpoint(self, session_id: str, checkpoint: Checkpoint) -> None:
        """Keep what a file held before an applied change, for undo (also after resume)."""
        self._run("INSERT INTO checkpoints (id, session_id, proposal_id, path, rel_path, before, after_digest, "
                  "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                  (checkpoint.id, session_id, checkpoint.proposal_id, str(checkpoint.path), checkpoint.rel_path,
                   checkpoint.before, checkpoint.after_digest, time.time()))

    def mark_undone(self, checkpoint_id: str) -> None:
        """A checkpoint was restored."""
        self._run("UPDATE checkpoints SET is_undone = 1 WHERE id = ?", (checkpoint_id,))

    def checkpoints(self, session_id: str) -> list[Checkpoint]:
        """Checkpoints not yet undone, oldest first."""
        rows = self._run("SELECT * FROM checkpoints WHERE session_id = ? AND is_undone = 0 ORDER BY created_at",
                         (session_id,)).fetchall()
        return [Checkpoint(r["id"], Path(r["path"]), r["rel_path"], r["before"], r["after_digest"],
                           r["proposal_id"]) for r in rows]

    def save_rules(self, workspace: Path, rules: list[Rule]) -> None:
        """Remember "always" rules for a workspace."""
        for rule in rules:
            self._run("INSERT OR IGNORE INTO shell_rules (workspace, prefix, action, created_at) VALUES (?, ?, ?, ?)",
                      (str(workspace), json.dumps(list(rule.prefix)), rule.action, time.time()))

    def rules(self, workspace: Path) -> list[Rule]:
        """The remembered rules of a workspace."""
        rows = self._run("SELECT prefix, action FROM shell_rules WHERE workspace = ? ORDER BY created_at",
                         (str(workspace),)).fetchall()
        return [Rule(tuple(json.loads(r["prefix"])), r["action"], "always") for r in rows]

    def save_traffic(self, session_id: str | None, record: Any) -> None:
        """Keep one Slipstream request record (a llm.network.TrafficRecord)."""
        self._run("INSERT INTO traffic (session_id, endpoint, request_bytes, response_bytes, num_messages, "
                  "prompt_tokens, completion_tokens, status, error, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (session_id, record.endpoint, record.request_bytes, record.response_bytes, record.num_messages,
                   record.prompt_tokens, record.completion_tokens, record.status, record.error, record.started_at))

    def traffic(self, session_id: str) -> list[dict[str, Any]]:
        """Recorded cloud requests of a session."""
        rows = self._run("SELECT * FROM traffic WHERE session_id = ? ORDER BY id", (session_id,))
        return [dict(row) for row in rows.fetchall()]
