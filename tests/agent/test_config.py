"""Settings layers, sources, errors that name the culprit, and no secrets in files."""

import re
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

from openjet_tui.config import Settings, format_settings, load_settings
from openjet_tui.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_default_config_file_documents_exactly_the_defaults():
    text = (ROOT / "assets" / "default_config.toml").read_text()
    assert Settings.model_validate(tomllib.loads(text)).model_dump() == Settings().model_dump()
    # Every setting is listed, set to its default or commented out, under its table.
    documented, table = set(), ""
    for line in text.splitlines():
        line = line.removeprefix("# ").strip()
        if re.fullmatch(r"\[\w+\]", line):
            table = line[1:-1] + "."
        elif match := re.match(r"(\w+) = ", line):
            documented.add(table + match[1])
    assert documented >= _leaf_names(Settings())


def _leaf_names(model: BaseModel, prefix: str = "") -> set[str]:
    names = set()
    for name in type(model).model_fields:
        value = getattr(model, name)
        names |= _leaf_names(value, f"{prefix}{name}.") if isinstance(value, BaseModel) else {prefix + name}
    return names


def test_layers_override_in_order_and_sources_are_reported(isolated_user_dirs, workspace, monkeypatch):
    write(isolated_user_dirs / ".config/openjet/config.toml",
          'provider = "ollama"\nmode = "auto-edit"\n[shell]\ntimeout_s = 30\n[context]\nwindow = 8192\n')
    write(workspace / ".openjet/config.toml", 'mode = "read-only"\n[shell]\nallow = ["make test"]\n')
    monkeypatch.setenv("OPENJET_SHELL__TIMEOUT_S", "45")
    loaded = load_settings(workspace, {"model": "qwen", "provider": None})
    s = loaded.settings
    assert (s.provider, s.mode, s.model, s.shell.timeout_s, s.shell.allow, s.context.window) == (
        "ollama", "read-only", "qwen", 45.0, ["make test"], 8192)
    assert s.shell.deny == Settings().shell.deny  # untouched nested keys keep their defaults
    table = {}
    for line in format_settings(loaded).splitlines():
        text, _, source = line.partition("  # ")
        key, _, value = text.strip().partition(" = ")
        table[key] = (value, source)
    assert table["provider"] == ('"ollama"', f"user {isolated_user_dirs}/.config/openjet/config.toml")
    assert table["mode"] == ('"read-only"', f"project {workspace}/.openjet/config.toml")
    assert table["shell.timeout_s"] == ("45.0", "environment")
    assert table["model"] == ('"qwen"', "command line")
    assert table["airgapped"] == ("false", "default")
    assert table["shell.allow"] == ('["make test"]', f"project {workspace}/.openjet/config.toml")


def test_bad_values_name_key_and_source(workspace, monkeypatch):
    write(workspace / ".openjet/config.toml", 'mode = "yolo"\n')
    with pytest.raises(ConfigError, match=r"mode: .*unknown mode 'yolo'.*\(from project .*config.toml\)"):
        load_settings(workspace)
    write(workspace / ".openjet/config.toml", "[shell]\ntimeout = 5\n")
    with pytest.raises(ConfigError, match=r"shell.timeout: Extra inputs are not permitted \(from project"):
        load_settings(workspace)
    write(workspace / ".openjet/config.toml", "")
    monkeypatch.setenv("OPENJET_CONTEXT__COMPACT_AT", "1.5")
    with pytest.raises(ConfigError, match=r"context.compact_at: .*\(from environment\)"):
        load_settings(workspace)


@pytest.mark.parametrize("key", ["api_key", "apikey", "auth_token", "password", "client-secret"])
def test_secrets_in_config_files_are_refused(workspace, key):
    write(workspace / ".openjet/config.toml", f'[slipstream]\n{key} = "sk-123"\n')
    with pytest.raises(ConfigError, match=f"slipstream.{key}.*never read from config files") as caught:
        load_settings(workspace)
    assert "sk-123" not in str(caught.value)


def test_settings_whose_names_merely_contain_a_secret_word_are_read(workspace):
    write(workspace / ".openjet/config.toml", "[sampling]\nmax_tokens = 512\ntemperature = 0.0\n")
    loaded = load_settings(workspace)
    assert (loaded.settings.sampling.max_tokens, loaded.settings.sampling.temperature) == (512, 0.0)
    assert re.search(r"^sampling\.max_tokens = 512 +# project ", format_settings(loaded), re.M)


def test_broken_toml_names_the_file(workspace):
    write(workspace / ".openjet/config.toml", "mode = \n")
    with pytest.raises(ConfigError, match=r"\.openjet/config\.toml: not valid TOML"):
        load_settings(workspace)
