"""Every command-line flag and OPENJET_* variable that a message in agent/ or llm/ tells the person to use exists."""

import argparse
import ast
import re
from pathlib import Path

import pytest

from openjet_tui.cli import build_parser
from openjet_tui.config import Settings
from openjet_tui.llm.providers import key_env_names

ROOT = Path(__file__).resolve().parents[2] / "openjet_tui"
# Tables of other programs' options that the shell policy matches, not advice to the person.
POLICY_TABLES = {"shellpolicy.py", "shellpaths.py"}
OTHER_PROGRAMS = {"--jinja": "llama-server"}


def message_strings() -> list[tuple[str, str]]:
    """(file, text) for every string constant in agent/ and llm/, f-string pieces included."""
    found = []
    for path in sorted([*(ROOT / "agent").rglob("*.py"), *(ROOT / "llm").rglob("*.py")]):
        if path.name in POLICY_TABLES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append((path.name, node.value))
    return found


def openjet_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every long option of openjet and its subcommands."""
    flags = {flag for action in parser._actions for flag in action.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= openjet_flags(sub)
    return flags


def setting_paths(model: type, prefix: str = "") -> set[str]:
    """`slipstream.model`-style names of every setting."""
    paths = set()
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            paths |= setting_paths(annotation, f"{prefix}{name}.")
        else:
            paths.add(prefix + name)
    return paths


def test_every_flag_named_in_a_message_exists():
    known = openjet_flags(build_parser()) | set(OTHER_PROGRAMS)
    named = {(name, flag) for name, text in message_strings()
             for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", text)}
    assert named, "the scan found no flags at all"
    assert sorted((name, flag) for name, flag in named if flag not in known) == []


def test_every_openjet_variable_named_in_a_message_is_a_setting_or_a_key():
    settings = setting_paths(Settings)
    named = {(name, var) for name, text in message_strings() for var in re.findall(r"\bOPENJET_[A-Z0-9_]+", text)}
    unknown = [(name, var) for name, var in named
               if var not in key_env_names() and var[len("OPENJET_"):].lower().replace("__", ".") not in settings]
    assert named and unknown == []


def test_the_slipstream_model_message_names_a_real_setting(monkeypatch):
    from openjet_tui.agent.slipstream import check_slipstream_allowed
    from openjet_tui.errors import ProviderError
    from openjet_tui.llm.providers import Endpoint

    with pytest.raises(ProviderError) as raised:
        check_slipstream_allowed(Endpoint("slipstream", "https://api.example.com/v1", None), airgapped=False)
    message = str(raised.value)
    assert "slipstream.model" in message and "OPENJET_SLIPSTREAM__MODEL" in message and "--" not in message
    monkeypatch.setenv("OPENJET_SLIPSTREAM__MODEL", "big-cloud")
    assert Settings().slipstream.model == "big-cloud"
