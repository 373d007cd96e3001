"""Hidden check: production overrides pool and timeout; staging and the defaults are untouched."""

import configparser

from app.db import DatabaseSettings, load_database_settings


def test_production_settings():
    assert load_database_settings("production") == DatabaseSettings(
        host="prod-db.internal", port=5432, database="links", pool_size=25, timeout_seconds=30
    )


def test_staging_keeps_defaults():
    assert load_database_settings("staging") == DatabaseSettings(
        host="staging-db.internal", port=5432, database="links_staging", pool_size=5, timeout_seconds=10
    )


def test_defaults_and_sections_unchanged():
    parser = configparser.ConfigParser()
    parser.read("deploy/settings.ini")
    assert parser.sections() == ["staging", "production"]
    assert dict(parser.defaults()) == {"port": "5432", "pool_size": "5", "timeout_seconds": "10"}
