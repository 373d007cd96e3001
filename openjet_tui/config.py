"""Settings: defaults < user file (~/.config/openjet/config.toml) < project file (.openjet/config.toml) <
OPENJET_* environment variables < command-line options. `openjet config show` prints each value and its source.
API keys are never read from these files (see llm/providers.py)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from openjet_tui.errors import ConfigError

DEFAULT_ALLOW = ["ls", "pwd", "cat", "head", "tail", "wc", "grep", "rg", "echo", "git status", "git diff",
                 "git log", "git show"]
DEFAULT_DENY = ["sudo", "su", "doas", "mkfs", "shutdown", "reboot", "rm -rf /", "rm -rf ~", "git push --force",
                "git push -f"]
# Whole trailing words only: `api_key`, `auth_token` and `password` are secrets, `max_tokens` is not.
_SECRET_KEY = re.compile(r"(^|[_-])(api[_-]?key|key|token|secret|password)$", re.IGNORECASE)


class ShellSettings(BaseModel):
    """[shell]: command rules and limits."""

    model_config = ConfigDict(extra="forbid")
    timeout_s: float = Field(120.0, gt=0)
    max_output_bytes: int = Field(30000, ge=1000)
    allow: list[str] = Field(default_factory=lambda: list(DEFAULT_ALLOW))
    deny: list[str] = Field(default_factory=lambda: list(DEFAULT_DENY))


class ContextSettings(BaseModel):
    """[context]: the model's window and when to compact."""

    model_config = ConfigDict(extra="forbid")
    window: int | None = Field(None, gt=0)  # used when the server does not report its window
    compact_at: float = Field(0.8, gt=0.1, lt=1.0)
    keep_recent_turns: int = Field(2, ge=1)


class SlipstreamSettings(BaseModel):
    """[slipstream]: the cloud orchestrator (off by default)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    base_url: str = "https://api.openai.com/v1"
    model: str | None = None


class SamplingSettings(BaseModel):
    """[sampling]: sent with every chat request; an unset value leaves the server's own default."""

    model_config = ConfigDict(extra="forbid")
    # Servers differ in their defaults (llama-server's is its --temp, OpenJet's engine 1.0), so a run is only
    # repeatable when the request itself says 0.
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    seed: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=1)  # cap on one reply; unset: until the model stops or the window ends

    def request_fields(self) -> dict[str, Any]:
        """The OpenAI request fields these settings add to a chat request (only the ones set)."""
        return {name: value for name, value in self.model_dump().items() if value is not None}


class Settings(BaseSettings):
    """Every setting OpenJet reads."""

    model_config = SettingsConfigDict(env_prefix="OPENJET_", env_nested_delimiter="__", extra="forbid")
    provider: str = "openjet"
    base_url: str | None = None
    model: str | None = None
    mode: str = "ask"
    airgapped: bool = False
    max_steps: int = Field(50, ge=1)
    request_timeout_s: float = Field(600.0, gt=0)
    shell: ShellSettings = Field(default_factory=ShellSettings)
    context: ContextSettings = Field(default_factory=ContextSettings)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    slipstream: SlipstreamSettings = Field(default_factory=SlipstreamSettings)

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, value: str) -> str:
        from openjet_tui.agent.shellpolicy import Mode

        try:
            return Mode.parse(value).value
        except ConfigError as exc:  # pydantic reports ValueErrors with the key they belong to
            raise ValueError(str(exc)) from None

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str) -> str:
        from openjet_tui.llm.providers import PROVIDERS

        if value not in PROVIDERS:
            raise ValueError(f"unknown provider {value!r}; choose one of: {', '.join(PROVIDERS)}")
        return value


class _DictSource(PydanticBaseSettingsSource):
    """A settings layer already read and checked (one TOML file)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]):
        super().__init__(settings_cls)
        self.data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Not used: the whole dict is returned by __call__."""
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self.data


def user_config_path() -> Path:
    """$XDG_CONFIG_HOME/openjet/config.toml (default ~/.config/openjet/config.toml)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "openjet" / "config.toml"


def project_config_path(workspace: Path) -> Path:
    """<workspace>/.openjet/config.toml."""
    return workspace / ".openjet" / "config.toml"


def read_toml_layer(path: Path) -> dict[str, Any]:
    """One config file's values ({} if absent); refuses keys that look like secrets."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for key in _leaf_keys(data):
        if _SECRET_KEY.search(key.rsplit(".", 1)[-1]):
            raise ConfigError(f"{path}: {key!r} looks like a secret; keys are never read from config files. "
                              "Set it in the environment (e.g. OPENJET_SLIPSTREAM_API_KEY) or the OS keyring "
                              "(`keyring set openjet <provider>`)")
    return data


def _leaf_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        keys += _leaf_keys(value, dotted + ".") if isinstance(value, dict) else [dotted]
    return keys


@dataclass(slots=True)
class LoadedSettings:
    """The merged settings and, for each dotted key, where its value came from."""

    settings: Settings
    sources: dict[str, str]


def load_settings(workspace: Path, overrides: dict[str, Any] | None = None) -> LoadedSettings:
    """Merge every layer for a workspace; errors name the key and the layer it came from."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    user_path, project_path = user_config_path(), project_config_path(workspace)
    layers = [("command line", overrides), ("environment", EnvSettingsSource(Settings)()),
              (f"project {project_path}", read_toml_layer(project_path)),
              (f"user {user_path}", read_toml_layer(user_path))]

    class _Layered(Settings):
        @classmethod
        def settings_customise_sources(cls, settings_cls: type[BaseSettings], *args: Any,
                                       **kwargs: Any) -> tuple[PydanticBaseSettingsSource, ...]:
            """Command line, environment, project file, user file: highest priority first."""
            return tuple(_DictSource(settings_cls, data) for _, data in layers)

    sources = _sources(layers)
    try:
        merged = _Layered()
    except ValidationError as exc:
        raise ConfigError(_validation_message(exc, sources)) from None
    return LoadedSettings(merged, sources)


def _sources(layers: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """First layer (highest priority) that sets each dotted key; lists count as one value."""
    found: dict[str, str] = {}
    for label, data in layers:
        for key in _leaf_keys(data):
            found.setdefault(key, label)
    return found


def _validation_message(exc: ValidationError, sources: dict[str, str]) -> str:
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        where = sources.get(key) or next((v for k, v in sources.items() if k.startswith(key + ".")), "defaults")
        lines.append(f"{key}: {error['msg']} (from {where})")
    return "invalid settings:\n  " + "\n  ".join(lines)


def format_settings(loaded: LoadedSettings) -> str:
    """`key = value    # source`, one line per setting, in declaration order."""
    rows = []
    for key, value in _flatten(loaded.settings.model_dump()):
        rows.append((f"{key} = {json.dumps(value)}", loaded.sources.get(key, "default")))
    width = min(48, max(len(text) for text, _ in rows))  # align the sources, but not behind a long list
    return "\n".join(f"{text.ljust(width)}  # {source}" for text, source in rows)


def _flatten(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in data.items():
        if isinstance(value, dict):
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`openjet config show [--workspace DIR]`."""
    actions = parser.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="print the merged settings and where each value came from")
    show.add_argument("--workspace", type=Path, help="project folder (default: the current folder)")


def run(args: argparse.Namespace) -> int:
    """Print the merged settings."""
    workspace = (args.workspace or Path.cwd()).resolve()
    try:
        loaded = load_settings(workspace)
    except ConfigError as exc:
        print(f"openjet: error: {exc}", file=sys.stderr)
        return 2
    print(format_settings(loaded))
    return 0
