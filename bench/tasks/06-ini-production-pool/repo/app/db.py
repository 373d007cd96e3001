"""Database connection settings read from deploy/settings.ini."""

import configparser
from dataclasses import dataclass
from pathlib import Path

SETTINGS_PATH = Path(__file__).resolve().parent.parent / "deploy" / "settings.ini"


@dataclass(frozen=True)
class DatabaseSettings:
    host: str
    port: int
    database: str
    pool_size: int
    timeout_seconds: int


def load_database_settings(environment: str, path: Path = SETTINGS_PATH) -> DatabaseSettings:
    """Return the settings for one environment (a section of the INI file)."""
    parser = configparser.ConfigParser()
    if not parser.read(path):
        raise FileNotFoundError(path)
    if not parser.has_section(environment):
        raise KeyError(f"no section [{environment}] in {path}")
    section = parser[environment]
    return DatabaseSettings(
        host=section["host"],
        port=section.getint("port"),
        database=section["database"],
        pool_size=section.getint("pool_size"),
        timeout_seconds=section.getint("timeout_seconds"),
    )
