"""Load config/app.toml into typed settings."""

import tomllib
from dataclasses import dataclass
from pathlib import Path

CONFIG_PATH = Path(__file__).resolve().parent.parent / "config" / "app.toml"


@dataclass(frozen=True)
class ServerSettings:
    host: str
    port: int
    workers: int
    gzip: bool


@dataclass(frozen=True)
class CacheSettings:
    backend: str
    ttl_seconds: int
    max_entries: int


@dataclass(frozen=True)
class Settings:
    server: ServerSettings
    cache: CacheSettings
    log_level: str


def load_settings(path: Path = CONFIG_PATH) -> Settings:
    """Read the TOML file and check the types of every value we use."""
    with open(path, "rb") as handle:
        data = tomllib.load(handle)
    server = ServerSettings(**data["server"])
    cache = CacheSettings(**data["cache"])
    for name, value, kind in [
        ("server.port", server.port, int),
        ("server.workers", server.workers, int),
        ("server.gzip", server.gzip, bool),
        ("cache.ttl_seconds", cache.ttl_seconds, int),
    ]:
        if type(value) is not kind:
            raise TypeError(f"{name} must be {kind.__name__}, got {value!r}")
    return Settings(server, cache, data["logging"]["level"])
