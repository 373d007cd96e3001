"""Shell policy: compound splitting, prefix rules, deny wins, modes, narrow "always" rules."""

from pathlib import Path

import pytest

from openjet_tui.agent.shellpolicy import Mode, Rule, ShellPolicy, narrow_rule, split_command
from openjet_tui.errors import ConfigError

CWD = Path("/home/dev/project")


@pytest.fixture
def policy():
    return ShellPolicy(allow=["ls", "git status", "git diff", "cat", "grep", "pytest", "echo"],
                       deny=["rm -rf", "sudo", "git push --force", "curl"])


@pytest.mark.parametrize("command, texts", [
    ("a; b && c || d | e", ["a", "b", "c", "d", "e"]),
    ("(cd x && make) | tee log", ["cd x", "make", "tee log"]),
    ("echo $(whoami) `id`", ["whoami", "id", "echo $(whoami) `id`"]),
    ("diff <(ls a) b", ["ls a", "diff <(ls a) b"]),
    ("for f in *; do wc $f; done", ["wc $f"]),
    ("a & b\nc", ["a", "b", "c"]),
])
def test_split_finds_every_simple_command(command, texts):
    assert sorted(p.text for p in split_command(command)) == sorted(texts)


def test_quoted_operators_are_not_split():
    (part,) = split_command('echo "a && rm -rf /"')
    assert part.words == ["echo", "a && rm -rf /"]


def test_prefix_rules_match_on_word_boundaries(policy):
    assert policy.evaluate("git status -s", Mode.ASK, CWD).action == "allow"
    assert policy.evaluate("git statusx", Mode.ASK, CWD).action == "ask"
    assert policy.evaluate("git", Mode.ASK, CWD).action == "ask"


@pytest.mark.parametrize("command", [
    "ls && rm -rf build", "git status; sudo ls", "cat x | bash -c 'rm -rf y'", "echo $(curl evil.sh)",
    "/bin/rm -rf x", "xargs rm -rf < list", "git push --force origin main", "(ls; (sudo id))",
    "env FOO=1 sudo true", "timeout 5 curl x",
])
def test_deny_wins_wherever_the_denied_part_hides(policy, command):
    for mode in Mode:
        verdict = policy.evaluate(command, mode, CWD)
        assert verdict.action == "deny", (mode, command)
        assert "denied" in verdict.reason and not verdict.can_remember


def test_every_part_must_be_allowed(policy):
    verdict = policy.evaluate("ls | wc -l", Mode.ASK, CWD)
    assert verdict.action == "ask"
    assert [(v.part.text, v.action) for v in verdict.parts] == [("ls", "allow"), ("wc -l", "ask")]
    assert [str(r) for r in verdict.suggested_rules] == ["wc"]


def test_redirects_assignments_and_outside_paths_are_never_rule_allowed(policy):
    assert policy.evaluate("echo hi > notes.txt", Mode.ASK, CWD).action == "ask"
    assert policy.evaluate("echo hi > /dev/null", Mode.ASK, CWD).action == "allow"
    assert policy.evaluate("PATH=/tmp/evil ls", Mode.ASK, CWD).action == "ask"
    outside = policy.evaluate("cat ../../etc/passwd", Mode.AUTO, CWD)
    assert outside.action == "ask" and "outside the workspace" in outside.reason
    assert policy.evaluate("cat ~/.ssh/id_rsa", Mode.ASK, CWD).action == "ask"
    assert policy.evaluate("cat src/../README.md", Mode.ASK, CWD).action == "allow"


def test_modes(policy):
    assert policy.evaluate("ls", Mode.READ_ONLY, CWD).action == "ask"
    assert policy.evaluate("make build", Mode.AUTO_EDIT, CWD).action == "ask"
    assert policy.evaluate("make build && echo ok > log", Mode.AUTO, CWD).action == "allow"
    assert policy.evaluate("$CMD x", Mode.AUTO, CWD).action == "ask"  # cannot be checked against deny rules
    assert policy.evaluate("case x in a) rm y;; esac", Mode.AUTO, CWD).action == "ask"


def test_unparseable_command_is_still_denied_by_rules(policy):
    assert policy.evaluate("case x in a) sudo y;; esac", Mode.AUTO, CWD).action == "deny"


@pytest.mark.parametrize("command, rule", [
    ("git status -s", "git status"), ("pytest tests/a.py -q", "pytest"), ("python -m pytest -q", "python -m pytest"),
    ("npm run build --prod", "npm run build"), ("rm build/x.o", "rm build/x.o"), ("git push origin main",
                                                                                   "git push origin main"),
    ("python script.py", "python script.py"), ("./run.sh --fast", "./run.sh --fast"), ("make test", "make test"),
])
def test_always_rules_are_narrow(command, rule):
    assert str(narrow_rule(split_command(command)[0].words)) == rule


def test_remembered_rule_allows_next_time_but_deny_still_wins(policy):
    verdict = policy.evaluate("make test", Mode.ASK, CWD)
    assert verdict.action == "ask"
    policy.remember(verdict.suggested_rules)
    assert policy.evaluate("make test", Mode.ASK, CWD).action == "allow"
    assert policy.evaluate("make install", Mode.ASK, CWD).action == "ask"
    policy.remember([Rule(("sudo",), "allow", "always")])
    assert policy.evaluate("sudo ls", Mode.ASK, CWD).action == "deny"


def test_flagged_parts_offer_no_always_rule(policy):
    assert not policy.evaluate("wc -l > out.txt", Mode.ASK, CWD).can_remember


def test_bad_rules_and_modes_are_named():
    with pytest.raises(ConfigError, match="empty"):
        ShellPolicy(allow=["  "])
    with pytest.raises(ConfigError, match="unknown mode 'yolo'"):
        Mode.parse("yolo")
