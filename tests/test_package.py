"""The distribution installs both packages and their console scripts."""

import importlib.metadata


def test_console_scripts_declared():
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts["openjet"] == "openjet_tui.cli:main"
    assert scripts["openjet-engine"] == "engine.cli:main"
