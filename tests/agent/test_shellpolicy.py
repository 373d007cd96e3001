"""Shell policy: compound splitting, prefix rules, deny wins, modes, narrow "always" rules."""

from pathlib import Path

import pytest

from openjet_tui.agent.shellpolicy import Mode, Rule, ShellPolicy, narrow_rule, split_command
from openjet_tui.config import DEFAULT_ALLOW, DEFAULT_DENY
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
    assert policy.evaluate("ls -la", Mode.READ_ONLY, CWD).action == "allow"
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


@pytest.fixture
def layout(tmp_path):
    """A real workspace with a symlink out of it, and a secret beside it."""
    ws, out = tmp_path / "ws", tmp_path / "out"
    (ws / "src").mkdir(parents=True)
    out.mkdir()
    (out / "outside.txt").write_text("secret\n")
    (ws / "src" / "a.py").write_text("x = 1\n")
    (ws / "link_out").symlink_to(out)
    return ws


@pytest.mark.parametrize("command", [
    "cat < ../out/outside.txt", "cat 0< ../out/outside.txt", "wc -l <../out/outside.txt", "echo hi > ../out/x",
    "echo hi >> ~/x", "ls 2> /tmp/err", "ls &> ../log", "ls >& ../log", "cat <> ../out/outside.txt",
    "cat link_out/outside.txt", "cat < link_out/outside.txt", "cat link_*/outside.txt", "cat */outside.txt",
    "cat {..,.}/out/outside.txt", "grep -r x --file=../out/outside.txt", "dd if=../out/outside.txt of=copy",
    "echo x | (cat > ../out/x)", "cat ~/.ssh/id_rsa", "ls 2>> ~/log", "cat ~root/x",
])
def test_redirect_targets_and_resolved_arguments_outside_the_workspace_ask(layout, command):
    policy = ShellPolicy(DEFAULT_ALLOW, DEFAULT_DENY)
    for mode in (Mode.ASK, Mode.AUTO_EDIT, Mode.AUTO):
        verdict = policy.evaluate(command, mode, layout)
        assert verdict.action == "ask", (mode, verdict.reason)
        assert "outside the workspace" in verdict.reason and not verdict.can_remember


@pytest.mark.parametrize("command, shown", [
    ("touch $HOME/x", "$HOME"), ("cat $HOME/.ssh/id_rsa", "$HOME"), ("cat ${HOME}/.ssh/id_rsa", "${HOME}"),
    ('cat "$X"', "$X"), ("cat ${A:-/etc}/passwd", "${A:-/etc}"), ("cat ~nosuchuser/x", "~nosuchuser"),
    ("cat $(echo ../out/outside.txt)", "$(echo ../out/outside.txt)"), ("cat `printf ..`/x", "`printf ..`"),
    ("ls > $OUT", "$OUT"), ("X=/etc; cat $X/passwd", "$X"),
    ("for f in *; do wc $f; done", "$f"), ("bash -c 'cat $HOME/x'", "$HOME"), ("timeout 5 echo $HOME", "$HOME"),
    # empty substitutions, which bash drops (a property test found `cat */secret.txt``` reading through a link out)
    ("cat */outside.txt``", "``"), ("cat src/a.py``", "``"), ("echo `echo `x; cat */a.txt``", "``"),
])
def test_expansions_that_may_name_any_path_ask_and_say_which(layout, command, shown):
    policy = ShellPolicy(DEFAULT_ALLOW, DEFAULT_DENY)
    for mode in (Mode.ASK, Mode.AUTO):
        verdict = policy.evaluate(command, mode, layout)
        assert verdict.action == "ask" and not verdict.can_remember, (mode, verdict.reason)
        assert f"expands {shown}: may reach outside the workspace" in verdict.reason


@pytest.mark.parametrize("command, why", [
    ("cd; cat .ssh/id_rsa", "changes to the home folder"), ("cd - && cat x", "changes to the previous folder"),
    ("echo ../out/outside.txt | xargs cat", "takes its arguments from its input"),
])
def test_commands_whose_targets_are_known_only_at_run_time_ask(layout, command, why):
    verdict = ShellPolicy(DEFAULT_ALLOW, DEFAULT_DENY).evaluate(command, Mode.AUTO, layout)
    assert verdict.action == "ask" and f"{why}: may reach outside the workspace" in verdict.reason


@pytest.mark.parametrize("command", [
    "echo $PATH", "echo $HOME", "printf '%s' ${USER}", "echo $? $$ $#", "cat <<< $HOME", "echo '$HOME' > note.txt",
    "cat src/a.py", "cat src/../src/a.py", "ls src/*.py", "cat {src,src}/a.py", "ls > /dev/null 2>&1",
    "cd src && cat a.py", "echo $(cat src/a.py)", "diff <(cat src/a.py) src/a.py",
])
def test_reasonable_commands_inside_the_workspace_still_run_in_auto_mode(layout, command):
    verdict = ShellPolicy(DEFAULT_ALLOW, DEFAULT_DENY).evaluate(command, Mode.AUTO, layout)
    assert verdict.action == "allow", verdict.reason


def test_echo_of_a_variable_is_allowed_by_its_rule_but_not_its_redirect(layout):
    policy = ShellPolicy(DEFAULT_ALLOW, DEFAULT_DENY)
    assert policy.evaluate("echo $PATH", Mode.ASK, layout).action == "allow"
    verdict = policy.evaluate("echo hi > $HOME/x", Mode.AUTO, layout)
    assert verdict.action == "ask" and "expands $HOME" in verdict.reason


def test_substitutions_in_redirects_and_here_documents_are_checked(policy):
    assert policy.evaluate("ls > $(sudo id)", Mode.AUTO, CWD).action == "deny"
    assert policy.evaluate("cat <<< $(curl x)", Mode.AUTO, CWD).action == "deny"
    heredoc = policy.evaluate("cat <<EOF\n$(touch x)\nEOF\n", Mode.AUTO, CWD)
    assert heredoc.action == "ask" and "cannot be checked" in heredoc.reason
    assert policy.evaluate("cat <<EOF\nplain $HOME text\nEOF\n", Mode.ASK, CWD).action == "allow"


@pytest.mark.parametrize("command", [
    "make build", "touch x", "echo hi > notes.txt", "ls >> list.txt", "FOO=1 ls", "git diff --output=patch.txt",
    "git commit -m x", "rg --pre ./run.sh x", "python3 -c 'print(1)'", "ls | tee out", "timeout 5 cat x",
    "$CMD", "cat <<EOF\n$(touch x)\nEOF\n",
])
def test_read_only_mode_refuses_anything_but_read_only_commands_without_asking(command):
    policy = ShellPolicy(allow=["make", "touch", "tee", "python3", "timeout"])  # allow rules do not widen it
    verdict = policy.evaluate(command, Mode.READ_ONLY, CWD)
    assert verdict.action == "deny" and "read-only mode runs only read-only commands" in verdict.reason


def test_read_only_mode_runs_read_only_commands_and_asks_to_read_outside(layout):
    policy = ShellPolicy()  # no allow rules at all
    for command in ["ls -la", "cat src/a.py | grep x | wc -l", "git status", "git log --oneline", "cd src && ls"]:
        assert policy.evaluate(command, Mode.READ_ONLY, layout).action == "allow", command
    assert policy.evaluate("cat ../out/outside.txt", Mode.READ_ONLY, layout).action == "ask"
    assert policy.evaluate("cat $HOME/x", Mode.READ_ONLY, layout).action == "ask"


@pytest.mark.parametrize("command", [
    "echo $(ls\ntouch t1)", "echo `ls\ntouch t1`", "bash -c 'echo `bash -c '\"'\"'touch t1'\"'\"'`'",
])
def test_commands_bashlex_misreads_are_still_found(policy, command):
    # bashlex stops a substitution at a newline and keeps mixed quotes as written; both would hide `touch`
    assert any(part.words[:1] == ["touch"] for top in split_command(command) for part in top.walk())
    assert policy.evaluate(command, Mode.ASK, CWD).action == "ask"


def test_ansi_c_quoting_is_decoded_only_at_run_time(layout):
    verdict = ShellPolicy(DEFAULT_ALLOW, DEFAULT_DENY).evaluate("cat $'\\x2e\\x2e/out/outside.txt'", Mode.AUTO, layout)
    assert verdict.action == "ask" and "uses $'...' quoting" in verdict.reason
