"""Hidden check: TTL is 15 minutes, gzip is on, nothing else changed."""

import tomllib

from shortener.settings import load_settings

EXPECTED = {
    "server": {"host": "0.0.0.0", "port": 8080, "workers": 4, "gzip": True},
    "cache": {"backend": "memory", "ttl_seconds": 900, "max_entries": 10000},
    "logging": {"level": "INFO", "format": "%(asctime)s %(levelname)s %(message)s"},
}


def test_whole_file_is_as_expected():
    with open("config/app.toml", "rb") as handle:
        assert tomllib.load(handle) == EXPECTED


def test_application_loads_new_values():
    settings = load_settings()
    assert settings.cache.ttl_seconds == 900
    assert settings.server.gzip is True
    assert settings.server.port == 8080
