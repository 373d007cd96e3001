"""The session database: migrations (exact columns), lookups, rules and traffic."""

import sqlite3

import pytest

from openjet_tui.agent.sessions import MIGRATIONS, SessionStore, default_db_path, migrate
from openjet_tui.agent.shellpolicy import Rule
from openjet_tui.errors import SessionError
from openjet_tui.llm.network import TrafficRecord


def columns(db, table):
    return [row[1] for row in db.execute(f"PRAGMA table_info({table})")]


def test_migrations_build_exactly_these_columns():
    db = sqlite3.connect(":memory:")
    assert migrate(db) == len(MIGRATIONS) == 2
    assert columns(db, "sessions") == ["id", "workspace", "title", "provider", "model", "mode", "summary",
                                       "created_at", "updated_at"]
    assert columns(db, "messages") == ["id", "session_id", "role", "content", "reasoning", "tool_calls",
                                       "tool_call_id", "origin", "is_compacted", "created_at"]
    assert columns(db, "proposals") == ["id", "session_id", "call_id", "path", "rel_path", "tool", "old_text",
                                        "new_text", "base_digest", "diff", "num_hunks", "status", "applied",
                                        "rejected", "reason", "hunk_reasons", "result_digest", "created_at",
                                        "decided_at"]
    assert columns(db, "shell_commands") == ["id", "session_id", "call_id", "command", "allowed", "decided_by",
                                             "reason", "exit_code", "created_at"]
    assert columns(db, "checkpoints") == ["id", "session_id", "proposal_id", "path", "rel_path", "before",
                                          "after_digest", "is_undone", "created_at"]
    assert columns(db, "shell_rules") == ["workspace", "prefix", "action", "created_at"]
    assert columns(db, "traffic") == ["id", "session_id", "endpoint", "request_bytes", "response_bytes",
                                      "num_messages", "prompt_tokens", "completion_tokens", "status", "error",
                                      "created_at"]
    assert migrate(db) == 2  # applying again changes nothing


def test_migrations_resume_from_an_older_version_and_refuse_a_newer_one():
    db = sqlite3.connect(":memory:")
    MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    assert migrate(db) == 2 and "traffic" in [r[0] for r in db.execute("SELECT name FROM sqlite_master")]
    db.execute("PRAGMA user_version = 9")
    with pytest.raises(SessionError, match="version 9 is newer"):
        migrate(db)


def test_default_location_follows_xdg(isolated_user_dirs):
    assert default_db_path() == isolated_user_dirs / ".local" / "share" / "openjet" / "sessions.db"
    store = SessionStore()
    assert store.path == default_db_path() and default_db_path().exists()


def test_lookup_by_prefix_latest_and_messages(tmp_path, workspace):
    store = SessionStore(":memory:")
    first = store.create(workspace, "ollama", "m", "ask")
    store.add_message(first.id, {"role": "user", "content": "hello there"})
    store.add_message(first.id, {"role": "assistant", "content": "", "reasoning": "hmm", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}]})
    store.add_message(first.id, {"role": "tool", "tool_call_id": "c1", "content": "a.txt"})
    assert store.get(first.id[:4]).title == "hello there"
    messages = store.messages(first.id)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["reasoning"] == "hmm" and messages[2]["tool_call_id"] == "c1"
    second = store.create(workspace, "ollama", "m", "ask")
    store.add_message(second.id, {"role": "user", "content": "again"})
    assert store.latest(workspace).id == second.id
    with pytest.raises(SessionError, match="no session with id 'zzz'"):
        store.get("zzz")
    with pytest.raises(SessionError, match="no session"):
        store.get("")


def test_rules_and_traffic_are_kept(workspace):
    store = SessionStore(":memory:")
    session = store.create(workspace, "p", "m", "ask")
    store.save_rules(workspace, [Rule(("make", "test"), "allow", "always")] * 2)
    assert store.rules(workspace) == [Rule(("make", "test"), "allow", "always")]
    assert store.rules(workspace / "other") == []
    store.save_traffic(session.id, TrafficRecord("https://cloud/v1/chat/completions", 120, 800, 3, 40, 9, 200))
    (row,) = store.traffic(session.id)
    assert (row["request_bytes"], row["response_bytes"], row["prompt_tokens"]) == (120, 800, 40)


def test_corrupt_database_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.db"
    path.write_bytes(b"not a database" * 100)
    with pytest.raises(SessionError, match="bad.db"):
        SessionStore(path)
