"""Which files a shell command can reach: its path arguments and redirect targets, resolved against the workspace.

Arguments are resolved with symlinks followed, brace lists and globs expanded as bash would expand them in the
workspace. What is only known when the command runs (`$HOME`, `~`, `$(...)`, `cd` with no folder, `xargs`' input)
cannot be resolved here, so it is reported as a reason to ask.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from pathlib import Path

import bashlex

SAFE_PATHS = frozenset({"/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr"})
PRINTERS = frozenset({"echo", "printf"})  # they print their arguments and never open them
MAY_ESCAPE = "may reach outside the workspace"
_EMPTY_SUBSTITUTION = re.compile(r"`\s*`|\$\(\s*\)")
MAX_ALTERNATIVES = 256  # brace lists multiply; past this the word is treated as reaching anywhere
_NO_FILE_REDIRECTS = frozenset({"<<", "<<-", "<<<"})  # here-documents and here-strings name no file
_SPECIAL_PARAMETERS = re.compile(r"^[?#$!0-9-]$")  # exit status, counts, pids, flags: never a path
_BRACE_LIST = re.compile(r"\{([^{}]*,[^{}]*)\}")  # an innermost `{a,b}` group
_GLOB = re.compile(r"[*?[]")
_SHOWN_CHARS = 40


def word_value(word: bashlex.ast.node, source: str) -> str:
    """A word after quote removal, as bash sees it. bashlex gets mixed quoting wrong (`'it'"'"'s'` stays as
    written), which would hide what a `bash -c` script runs, so POSIX quote removal of the raw text wins."""
    raw = source[word.pos[0]:word.pos[1]]
    try:
        values = shlex.split(raw)
    except ValueError:
        return word.word
    return values[0] if len(values) == 1 else word.word


def redirect_target(redirect: bashlex.ast.node, source: str) -> str | None:
    """The file a redirect opens, or None (here-documents, here-strings, `2>&1`)."""
    output = getattr(redirect, "output", None)
    if redirect.type in _NO_FILE_REDIRECTS or not hasattr(output, "word"):
        return None
    return word_value(output, source)


def expansions(word: bashlex.ast.node, source: str) -> list[str]:
    """The run-time expansions in a word (`$HOME`, `${X:-/}`, `~`, `$(...)`), as written, with why they matter."""
    found = []
    for part in getattr(word, "parts", None) or []:
        text = source[part.pos[0]:part.pos[1]]
        if part.kind == "parameter" and source.startswith("$'", part.pos[0]):
            found.append(f"uses $'...' quoting, which bash decodes when it runs: {MAY_ESCAPE}")
        elif part.kind in ("tilde", "commandsubstitution") or (
                part.kind == "parameter" and not _SPECIAL_PARAMETERS.match(getattr(part, "value", ""))):
            shown = text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."
            found.append(f"expands {shown}: {MAY_ESCAPE}")
    # bashlex leaves empty substitutions out of a word's parts, but bash drops them, so `*/x``` is the glob */x
    unquoted = re.sub(r"'[^']*'", "", source[word.pos[0]:word.pos[1]])
    found += [f"expands {empty}: {MAY_ESCAPE}" for empty in dict.fromkeys(_EMPTY_SUBSTITUTION.findall(unquoted))]
    return found


def run_time_targets(words: list[str]) -> list[str]:
    """Commands whose target folder or arguments are only known when they run."""
    if not words:
        return []
    program = os.path.basename(words[0])
    if program in ("cd", "pushd") and (len(words) == 1 or words[1] in ("-", "--")):
        where = "the home folder" if len(words) == 1 or words[1] == "--" else "the previous folder"
        return [f"changes to {where}: {MAY_ESCAPE}"]
    if program == "xargs":
        return [f"takes its arguments from its input: {MAY_ESCAPE}"]
    return []


def outside_paths(words: list[str], cwd: Path) -> list[str]:
    """Arguments that name a path outside cwd (symlinks followed, braces and globs expanded), for a prompt."""
    if not words or os.path.basename(words[0]) in PRINTERS:
        return []
    return [word for word in words[1:] if any(reaches_outside(value, cwd) for value in _values(word))]


def _values(word: str) -> list[str]:
    """The word and, for `--file=x` or `if=x`, what follows the first `=`."""
    return [word, word.split("=", 1)[1]] if "=" in word else [word]


def reaches_outside(value: str, cwd: Path) -> bool:
    """True when a path as bash would see it (relative to cwd) may resolve outside cwd."""
    if value in SAFE_PATHS:
        return False
    if "\x00" in value:
        return True
    alternatives = brace_alternatives(value)
    if alternatives is None:
        return True
    for alternative in alternatives:
        path = os.path.expanduser(alternative)
        if not _is_inside(path, cwd):
            return True
        if _GLOB.search(path) and any(not _is_inside(match, cwd) for match in glob.iglob(path, root_dir=cwd)):
            return True
    return False


def _is_inside(path: str, cwd: Path) -> bool:
    resolved = Path(os.path.realpath(cwd / path))
    return resolved == cwd or cwd in resolved.parents


def brace_alternatives(word: str) -> list[str] | None:
    """Bash brace expansion of comma lists (`{..,.}/x` -> `../x`, `./x`); None when there would be too many."""
    words, done = [word], []
    while words:
        current = words.pop()
        match = _BRACE_LIST.search(current)
        if match is None:
            done.append(current)
        else:
            head, tail = current[:match.start()], current[match.end():]
            words += [head + option + tail for option in match.group(1).split(",")]
        if len(words) + len(done) > MAX_ALTERNATIVES:
            return None
    return done
