"""Reading tools: read_file, list_dir, glob, grep. They never change anything; outside the workspace they ask."""

from __future__ import annotations

import re
from pathlib import Path

from openjet_tui.agent.tools.base import Tool, ToolContext, ToolOutcome, confine
from openjet_tui.agent.workspace import IGNORED_DIRS, read_text
from openjet_tui.errors import WorkspaceError
from openjet_tui.llm.types import ToolCall

MAX_READ_LINES = 2000
MAX_READ_CHARS = 100_000
MAX_LISTED = 500
MAX_MATCHES = 200
MAX_GREP_FILE_BYTES = 2_000_000


async def read_file(ctx: ToolContext, call: ToolCall) -> ToolOutcome:
    """Numbered lines of a text file, from `offset` (1-based) for up to `limit` lines."""
    args = call.arguments
    path = await confine(ctx, call, args["path"], "read")
    shown = ctx.workspace.relative(path)
    lines = read_text(path, shown).splitlines()
    offset = max(1, int(args.get("offset") or 1))
    limit = max(1, min(int(args.get("limit") or MAX_READ_LINES), MAX_READ_LINES))
    if not lines:
        return ToolOutcome(f"{shown} is empty")
    if offset > len(lines):
        raise WorkspaceError(f"{shown} has {len(lines)} lines; offset {offset} is past the end")
    out, size = [], 0
    for number in range(offset, min(len(lines), offset + limit - 1) + 1):
        row = f"{number:6d}\t{lines[number - 1]}"
        size += len(row) + 1
        if size > MAX_READ_CHARS:
            break
        out.append(row)
    last = offset + len(out) - 1
    if last < len(lines):
        out.append(f"[{len(lines) - last} more lines; read on with offset={last + 1}]")
    return ToolOutcome("\n".join(out))


async def list_dir(ctx: ToolContext, call: ToolCall) -> ToolOutcome:
    """The entries of a folder, folders marked with a trailing slash."""
    path = await confine(ctx, call, call.arguments.get("path") or ".", "list")
    shown = ctx.workspace.relative(path)
    if not path.is_dir():
        raise WorkspaceError(f"{shown}: not a folder")
    entries = sorted(path.iterdir(), key=lambda p: (not p.is_dir(), p.name))
    names = [p.name + ("/" if p.is_dir() else "") for p in entries if p.name not in IGNORED_DIRS]
    hidden = len(entries) - len(names)
    text = "\n".join(names[:MAX_LISTED]) or "(empty folder)"
    if len(names) > MAX_LISTED:
        text += f"\n[{len(names) - MAX_LISTED} more entries]"
    if hidden:
        text += f"\n[{hidden} ignored folders not shown: {', '.join(sorted(IGNORED_DIRS & {p.name for p in entries}))}]"
    return ToolOutcome(f"{shown}/\n{text}")


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Compile a glob with `**` (any folders), `*`, `?` and `[...]`, matched against a relative posix path."""
    out, index = [], 0
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
            continue
        if pattern.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and "]" in pattern[index + 1:]:
            end = pattern.index("]", index + 1)
            body = pattern[index + 1:end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            index = end
        else:
            out.append(re.escape(char))
        index += 1
    return re.compile("".join(out) + r"\Z")


async def glob_files(ctx: ToolContext, call: ToolCall) -> ToolOutcome:
    """Files whose path (relative to `path`) matches a glob pattern."""
    base = await confine(ctx, call, call.arguments.get("path") or ".", "list")
    if not base.is_dir():
        raise WorkspaceError(f"{ctx.workspace.relative(base)}: not a folder")
    matcher = glob_regex(call.arguments["pattern"])
    found = [p for p in ctx.workspace.walk_files(base) if matcher.match(p.relative_to(base).as_posix())]
    shown = [ctx.workspace.relative(p) for p in found[:MAX_LISTED]]
    text = "\n".join(shown) or f"no files match {call.arguments['pattern']!r}"
    if len(found) > MAX_LISTED:
        text += f"\n[{len(found) - MAX_LISTED} more matches]"
    return ToolOutcome(text)


async def grep(ctx: ToolContext, call: ToolCall) -> ToolOutcome:
    """Lines matching a regular expression, as `path:line: text`."""
    args = call.arguments
    base = await confine(ctx, call, args.get("path") or ".", "read")
    try:
        regex = re.compile(args["pattern"], re.IGNORECASE if args.get("ignore_case") else 0)
    except re.error as exc:
        raise WorkspaceError(f"invalid regular expression {args['pattern']!r}: {exc}") from None
    files = [base] if base.is_file() else list(ctx.workspace.walk_files(base))
    if args.get("glob"):
        matcher = glob_regex(args["glob"])
        files = [p for p in files if matcher.match(p.name) or matcher.match(p.relative_to(base).as_posix())]
    matches = _search(ctx, files, regex)
    if not matches:
        return ToolOutcome(f"no matches for {args['pattern']!r}")
    text = "\n".join(matches[:MAX_MATCHES])
    if len(matches) > MAX_MATCHES:
        text += f"\n[more than {MAX_MATCHES} matches; narrow the pattern or the path]"
    return ToolOutcome(text)


def _search(ctx: ToolContext, files: list[Path], regex: re.Pattern[str]) -> list[str]:
    matches: list[str] = []
    for path in files:
        try:
            if path.stat().st_size > MAX_GREP_FILE_BYTES:
                continue
            text = read_text(path, str(path))
        except (WorkspaceError, OSError):  # binary, unreadable or vanished: not searchable text
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if regex.search(line):
                matches.append(f"{ctx.workspace.relative(path)}:{number}: {line[:300]}")
                if len(matches) > MAX_MATCHES:
                    return matches
    return matches


def _schema(properties: dict[str, dict[str, str]], required: list[str]) -> dict[str, object]:
    return {"type": "object", "properties": properties, "required": required}


FILE_TOOLS = [
    Tool("read_file", "Read a text file with line numbers. Use offset/limit for long files.",
         _schema({"path": {"type": "string", "description": "file path, relative to the workspace"},
                  "offset": {"type": "integer", "description": "first line to read (1-based)"},
                  "limit": {"type": "integer", "description": f"lines to read (max {MAX_READ_LINES})"}},
                 ["path"]), read_file),
    Tool("list_dir", "List a folder's entries; folders end with a slash.",
         _schema({"path": {"type": "string", "description": "folder, relative to the workspace (default .)"}},
                 []), list_dir),
    Tool("glob", "Find files by glob pattern, e.g. **/*.py or src/*.ts.",
         _schema({"pattern": {"type": "string", "description": "glob; ** matches any folders"},
                  "path": {"type": "string", "description": "folder to search from (default .)"}},
                 ["pattern"]), glob_files),
    Tool("grep", "Search file contents with a regular expression; prints path:line: text.",
         _schema({"pattern": {"type": "string", "description": "Python regular expression"},
                  "path": {"type": "string", "description": "file or folder to search (default .)"},
                  "glob": {"type": "string", "description": "only files matching this glob, e.g. *.py"},
                  "ignore_case": {"type": "boolean", "description": "case-insensitive search"}},
                 ["pattern"]), grep),
]
