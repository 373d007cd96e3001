"""Shell policy: approval modes, allow/deny rules by command prefix, compound commands checked part by part.

Every simple command inside a command line (split on `;`, `&&`, `||`, `|`, `&`, subshells, command and process
substitution, `bash -c` scripts) is checked. Any denied part denies the whole line; the line runs without asking only
when every part is allowed. "Always" approvals store the narrowest useful prefix, never a bare interpreter.
"""

from __future__ import annotations

import enum
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import bashlex

from openjet_tui.agent.shellpaths import (PRINTERS, SAFE_PATHS, expansions, outside_paths, reaches_outside,
                                          redirect_target, run_time_targets, word_value)
from openjet_tui.errors import ConfigError

__all__ = ["CommandPart", "Mode", "Rule", "ShellPolicy", "ShellVerdict", "narrow_rule", "outside_paths",
           "split_command"]


class Mode(enum.StrEnum):
    """How much the agent may do without asking."""

    READ_ONLY = "read-only"  # no edits; only read-only commands run, reading outside the workspace asks
    ASK = "ask"  # edits ask; commands ask unless every part is allowed by a rule
    AUTO_EDIT = "auto-edit"  # edits apply; commands as in ask
    AUTO = "auto"  # edits apply; commands run unless a part is denied or cannot be checked

    @classmethod
    def parse(cls, text: str) -> Mode:
        """Mode from its name, with an error listing the valid names."""
        try:
            return cls(text)
        except ValueError:
            raise ConfigError(f"unknown mode {text!r}; choose one of: {', '.join(m.value for m in cls)}") from None


@dataclass(frozen=True, slots=True)
class Rule:
    """A command prefix, matched word by word: `git status` matches `git status -s`, not `git statusx`."""

    prefix: tuple[str, ...]
    action: str  # "allow" | "deny"
    source: str = "config"  # config | always

    @classmethod
    def parse(cls, text: str, action: str, source: str = "config") -> Rule:
        """A rule from its text form, e.g. `git push --force`."""
        try:
            words = tuple(shlex.split(text))
        except ValueError as exc:
            raise ConfigError(f"shell {action} rule {text!r}: {exc}") from None
        if not words:
            raise ConfigError(f"shell {action} rule {text!r} is empty")
        return cls(words, action, source)

    def matches(self, words: list[str]) -> bool:
        """True when words start with the prefix."""
        return tuple(words[:len(self.prefix)]) == self.prefix

    def __str__(self) -> str:
        return shlex.join(self.prefix)


@dataclass(slots=True)
class CommandPart:
    """One simple command found in a command line."""

    text: str
    words: list[str]  # with leading VAR=value assignments removed
    flags: list[str] = field(default_factory=list)  # why it can never be allowed by a rule alone
    nested: list[CommandPart] = field(default_factory=list)  # what `bash -c`/`sudo`/`xargs` would run
    is_opaque: bool = False  # what runs cannot be known before running it: never runs without asking
    redirects: list[str] = field(default_factory=list)  # the files its redirects open (`< x`, `> y`, `2>> z`)
    escapes: list[str] = field(default_factory=list)  # why its files are only known at run time (`$HOME`, `~`)

    def walk(self) -> list[CommandPart]:
        """This part and everything nested in it."""
        return [self, *(inner for part in self.nested for inner in part.walk())]


@dataclass(slots=True)
class PartVerdict:
    """The decision for one part and the rule (if any) that made it."""

    part: CommandPart
    action: str  # allow | deny | ask
    rule: Rule | None
    why: str


@dataclass(slots=True)
class ShellVerdict:
    """The decision for a whole command line."""

    command: str
    action: str  # allow | deny | ask
    parts: list[PartVerdict]
    reason: str
    suggested_rules: list[Rule]  # what "always" would store; empty if it cannot be remembered safely

    @property
    def can_remember(self) -> bool:
        """True when approving "always" has a narrow rule to store."""
        return bool(self.suggested_rules)


SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "fish"})
WRAPPERS = frozenset({"sudo", "doas", "env", "nohup", "time", "nice", "ionice", "timeout", "xargs", "command",
                      "builtin", "exec", "stdbuf", "setsid", "watch", "strace", "chroot"})
INTERPRETERS = frozenset({"python", "python3", "node", "ruby", "perl", "php", "deno", "bun", "lua", "Rscript"})
DESTRUCTIVE = frozenset({"rm", "rmdir", "mv", "dd", "chmod", "chown", "chgrp", "shred", "truncate", "kill",
                         "pkill", "killall", "mkfs", "ln", "curl", "wget", "scp", "rsync", "ssh"})
DESTRUCTIVE_SUBCOMMANDS = frozenset({("git", "push"), ("git", "reset"), ("git", "clean"), ("git", "checkout"),
                                     ("git", "rebase"), ("git", "branch"), ("git", "restore"), ("git", "stash")})
RUNNERS = frozenset({("npm", "run"), ("yarn", "run"), ("pnpm", "run"), ("cargo", "run"), ("go", "run"),
                     ("uv", "run"), ("poetry", "run"), ("npx", ""), ("make", "")})
_OPTIONS_WITH_VALUES = {"nice": {"-n"}, "xargs": {"-I", "-n", "-P", "-L", "-d", "-s", "-E", "-a"},
                        "timeout": {"-s", "-k", "--signal", "--kill-after"}, "env": {"-u", "-C", "-S"},
                        "sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-U"}, "ionice": {"-c", "-n", "-p"},
                        "watch": {"-n", "-d"}, "strace": {"-o", "-e", "-p", "-s"}}
_SUBCOMMAND = re.compile(r"^[A-Za-z][A-Za-z0-9_:-]*$")
_WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&"})
# What read-only mode runs: commands that only read, each with the options that would make it write or run
# another program. Allow rules do not extend it (a rule allowing `make` must not let read-only mode build).
READ_ONLY_COMMANDS: dict[tuple[str, ...], frozenset[str]] = {
    **{(name,): frozenset() for name in ("ls", "pwd", "cat", "head", "tail", "wc", "grep", "echo", "printf",
                                          "stat", "du", "diff", "cmp", "basename", "dirname", "realpath",
                                          "readlink", "sha256sum", "md5sum", "cut", "tr", "nl", "which", "true", "cd")},
    ("file",): frozenset({"-C", "--compile"}),
    ("rg",): frozenset({"--pre"}),
    **{("git", sub): frozenset({"--output", "--ext-diff", "-O", "--open-files-in-pager"})
       for sub in ("status", "diff", "log", "show", "blame", "grep", "ls-files", "rev-parse")},
}


def split_command(command: str) -> list[CommandPart]:
    """Every simple command in a command line; falls back to a crude split flagged `unparsed` if bash syntax
    is beyond the parser (the fallback parts can still be denied, never allowed)."""
    try:
        trees = bashlex.parse(command)
    except Exception:  # bashlex raises ParsingError, NotImplementedError and others on syntax it lacks
        return _fallback_split(command)
    parts: list[CommandPart] = []
    for tree in trees:
        _collect(tree, command, parts)
    return parts


def _fallback_split(command: str) -> list[CommandPart]:
    parts = []
    for piece in re.split(r"\|\||&&|[;|&\n()`]|\$\(", command):
        try:
            words = shlex.split(piece)
        except ValueError:
            words = piece.split()
        if words:
            parts.append(CommandPart(piece.strip(), _strip_assignments(words), ["cannot be parsed reliably"],
                                     is_opaque=True))
    return parts or [CommandPart(command, [], ["cannot be parsed reliably"], is_opaque=True)]


def _strip_assignments(words: list[str]) -> list[str]:
    index = 0
    while index < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[index]):
        index += 1
    return words[index:]


def _collect(node: bashlex.ast.node, source: str, parts: list[CommandPart]) -> None:
    """Walk a bashlex tree, adding a CommandPart per simple command, substitutions included."""
    kind = node.kind
    if kind == "command":
        parts.append(_command_part(node, source, parts))
        return
    if kind in ("commandsubstitution", "processsubstitution") and not _is_whole(node, source):
        parts += _fallback_split(source[node.pos[0]:])  # bashlex lost part of it: check every piece, run none
        return
    for child in _children(node):
        _collect(child, source, parts)


def _is_whole(substitution: bashlex.ast.node, source: str) -> bool:
    """False when bashlex parsed only part of a `$(...)`, `` `...` `` or `<(...)` (it stops at a newline inside)."""
    text = source[substitution.pos[0]:substitution.pos[1]]
    opener, closer = (1, "`") if text.startswith("`") else (2, ")")
    if len(text) <= opener or not text.endswith(closer) or not hasattr(substitution.command, "pos"):
        return False
    start, end = substitution.command.pos
    return not source[substitution.pos[0] + opener:start].strip() and not source[end:substitution.pos[1] - 1].strip()


def _children(node: bashlex.ast.node) -> list[bashlex.ast.node]:
    children = []
    for name in ("parts", "list"):
        children += [c for c in getattr(node, name, None) or [] if hasattr(c, "kind")]
    if getattr(node, "command", None) is not None:
        children.append(node.command)
    if node.kind == "function":
        return [node.body]
    return [c for c in children if c.kind not in ("operator", "pipe", "reservedword")]


def _command_part(node: bashlex.ast.node, source: str, parts: list[CommandPart]) -> CommandPart:
    words, word_nodes, flags, redirects, escapes = [], [], [], [], []
    is_opaque = False
    for child in node.parts:
        if child.kind == "word":
            words.append(word_value(child, source))
            word_nodes.append(child)
        elif child.kind == "assignment":
            flags.append("sets environment variables")
        elif child.kind == "redirect" and _redirect(child, source, parts, redirects, flags, escapes):
            is_opaque = True
        for inner in getattr(child, "parts", None) or []:  # $(...), `...`, <(...) inside words
            _collect(inner, source, parts)
    if words and re.search(r"[$`]", words[0]):
        is_opaque = True
        flags.append("the command name is computed at run time")
    if words and os.path.basename(words[0]) not in PRINTERS:  # `echo $HOME` prints a value, opens nothing
        escapes += [reason for word in word_nodes[1:] for reason in expansions(word, source)]
    part = CommandPart(source[node.pos[0]:node.pos[1]], words, flags, is_opaque=is_opaque, redirects=redirects,
                       escapes=escapes)
    part.nested = _nested_commands(words)
    return part


def _redirect(node: bashlex.ast.node, source: str, parts: list[CommandPart], redirects: list[str],
              flags: list[str], escapes: list[str]) -> bool:
    """Note the file a redirect opens, whether it writes, and commands substituted into it; True when it runs
    commands that cannot be seen before it runs (`$(...)` in an unquoted here-document)."""
    if hasattr(node.output, "kind"):  # `> $(cmd)` and `<<< $(cmd)` run cmd
        _collect(node.output, source, parts)
    heredoc = getattr(node, "heredoc", None)
    if heredoc is not None and re.search(r"\$\(|`", heredoc.value):
        flags.append("its here-document runs commands")
        return True
    target = redirect_target(node, source)
    if target is None:
        return False
    redirects.append(target)
    escapes += expansions(node.output, source)
    if node.type in _WRITE_REDIRECTS and target not in SAFE_PATHS:
        flags.append(f"writes to {target}")
    return False


def _nested_commands(words: list[str]) -> list[CommandPart]:
    """What a wrapper or shell would run: `sudo rm x` runs `rm x`, `bash -c "rm x"` runs its script."""
    if not words:
        return []
    program = os.path.basename(words[0])
    if program in SHELLS or program == "eval":
        script = " ".join(words[1:]) if program == "eval" else _dash_c_script(words)
        return split_command(script) if script else []
    if program in WRAPPERS:
        index = 1
        while index < len(words) and words[index].startswith("-"):  # the wrapper's own options
            index += 2 if words[index] in _OPTIONS_WITH_VALUES.get(program, ()) else 1
        rest = _strip_assignments(words[index:])
        if program == "timeout" and rest:
            rest = rest[1:]  # the duration
        return [CommandPart(shlex.join(rest), rest, nested=_nested_commands(rest))] if rest else []
    return []


def _dash_c_script(words: list[str]) -> str | None:
    for index, word in enumerate(words[1:-1], start=1):
        if word.startswith("-") and "c" in word[1:] and not word.startswith("--"):
            return words[index + 1]
    return None


def narrow_rule(words: list[str]) -> Rule | None:
    """The narrowest prefix worth remembering for an approved command; the whole command for risky ones."""
    if not words:
        return None
    program = words[0]
    second = words[1] if len(words) > 1 else ""
    if "/" in program or program in SHELLS or program in WRAPPERS or program in DESTRUCTIVE \
            or (program, second) in DESTRUCTIVE_SUBCOMMANDS:
        return Rule(tuple(words), "allow", "always")
    if program in INTERPRETERS:
        if second == "-m" and len(words) > 2:
            return Rule((program, "-m", words[2]), "allow", "always")
        return Rule(tuple(words), "allow", "always")
    prefix = [program]
    if _SUBCOMMAND.match(second):
        prefix.append(second)
        if (program, second) in RUNNERS and len(words) > 2:
            prefix.append(words[2])
    elif (program, "") in RUNNERS and second:
        prefix.append(second)
    return Rule(tuple(prefix), "allow", "always")


class ShellPolicy:
    """Allow and deny rules plus the mode: decides allow, deny or ask for a command line."""

    def __init__(self, allow: list[str] | tuple[str, ...] = (), deny: list[str] | tuple[str, ...] = (),
                 remembered: list[Rule] | tuple[Rule, ...] = ()):
        self.deny_rules = [Rule.parse(text, "deny") for text in deny]
        self.allow_rules = [Rule.parse(text, "allow") for text in allow]
        self.remember(list(remembered))

    def remember(self, rules: list[Rule]) -> None:
        """Add "always" allow rules (deny rules still win over them)."""
        for rule in rules:
            if rule not in self.allow_rules:
                self.allow_rules.append(rule)

    def evaluate(self, command: str, mode: Mode, cwd: Path) -> ShellVerdict:
        """Judge every part of the command line and combine: any deny denies, all allowed allows."""
        if not command.strip():
            return ShellVerdict(command, "deny", [], "empty command", [])
        verdicts = [self._judge(part, mode, cwd) for part in split_command(command)]
        denied = [v for v in verdicts if v.action == "deny"]
        asking = [v for v in verdicts if v.action == "ask"]
        if denied:
            reason = "; ".join(f"`{v.part.text}` {v.why}" for v in denied)
            return ShellVerdict(command, "deny", verdicts, f"denied: {reason}", [])
        if not asking:
            return ShellVerdict(command, "allow", verdicts, "; ".join(v.why for v in verdicts), [])
        reason = "; ".join(f"`{v.part.text}` {v.why}" for v in asking)
        return ShellVerdict(command, "ask", verdicts, f"needs approval: {reason}", _suggestions(asking))

    def _deny_rule(self, part: CommandPart) -> Rule | None:
        """Deny rules match the words as written, with the program's folder dropped, and nested commands."""
        for inner in part.walk():
            candidates = [inner.words]
            if inner.words and "/" in inner.words[0]:
                candidates.append([os.path.basename(inner.words[0]), *inner.words[1:]])
            for rule in self.deny_rules:
                if any(rule.matches(words) for words in candidates):
                    return rule
        return None

    def _judge(self, part: CommandPart, mode: Mode, cwd: Path) -> PartVerdict:
        deny = self._deny_rule(part)
        if deny is not None:
            return PartVerdict(part, "deny", deny, f"matches deny rule `{deny}`")
        inner_parts = part.walk()
        if mode is Mode.READ_ONLY and (why := _not_read_only(inner_parts)):
            return PartVerdict(part, "deny", None, f"read-only mode runs only read-only commands: {why}")
        outside = [p for inner in inner_parts
                   for p in outside_paths(inner.words, cwd) + [t for t in inner.redirects if reaches_outside(t, cwd)]]
        if outside:
            return PartVerdict(part, "ask", None, f"refers to paths outside the workspace: {', '.join(outside)}")
        escapes = [why for inner in inner_parts for why in inner.escapes + run_time_targets(inner.words)]
        if escapes:
            return PartVerdict(part, "ask", None, "; ".join(dict.fromkeys(escapes)))
        if any(inner.is_opaque for inner in inner_parts):
            return PartVerdict(part, "ask", None, "cannot be checked before it runs")
        if mode is Mode.READ_ONLY:
            return PartVerdict(part, "allow", None, "read-only command")
        if mode is Mode.AUTO:
            return PartVerdict(part, "allow", None, "auto mode")
        flags = [flag for inner in inner_parts for flag in inner.flags]
        if flags:
            return PartVerdict(part, "ask", None, "; ".join(flags))
        allow = next((rule for rule in self.allow_rules if rule.matches(part.words)), None)
        if allow is None:
            return PartVerdict(part, "ask", None, "no allow rule matches")
        return PartVerdict(part, "allow", allow, f"allowed by rule `{allow}`")


def _not_read_only(parts: list[CommandPart]) -> str | None:
    """Why these parts are not all read-only commands, or None when they are."""
    for part in parts:
        if part.is_opaque or part.flags:
            return "; ".join(part.flags) or "it cannot be checked before it runs"
        if not part.words:
            continue
        prefix = next((p for p in READ_ONLY_COMMANDS if tuple(part.words[:len(p)]) == p), None)
        if prefix is None:
            return f"`{' '.join(part.words[:2])}` is not one of them"
        forbidden = READ_ONLY_COMMANDS[prefix]
        if option := next((w for w in part.words if w.split("=", 1)[0] in forbidden), None):
            return f"`{' '.join(prefix)} {option}` writes files or runs another program"
    return None


def _suggestions(asking: list[PartVerdict]) -> list[Rule]:
    """One narrow rule per part that asked; none at all if any such part could not be remembered safely."""
    rules: list[Rule] = []
    for verdict in asking:
        part = verdict.part
        rule = None if part.flags or part.is_opaque or "outside" in verdict.why else narrow_rule(part.words)
        if rule is None:
            return []
        if rule not in rules:
            rules.append(rule)
    return rules
