"""Hidden check: __version__ is the latest "Release X.Y.Z" commit (1.8.1), and the CLI reports it."""

import subprocess
import sys

import mailparse


def test_version_attribute():
    assert mailparse.__version__ == "1.8.1"


def test_cli_reports_version():
    result = subprocess.run(
        [sys.executable, "-m", "mailparse", "--version"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "mailparse 1.8.1"


def test_history_left_alone():
    log = subprocess.run(["git", "log", "--format=%s"], capture_output=True, text=True, timeout=30).stdout
    assert log.splitlines()[:2] == ["Start planning the 2.0 streaming parser", "Release 1.8.1"]
