"""Hidden check: -r/--reverse sorts descending, alone and with -n, from stdin and from a file."""

import subprocess
import sys

import pytest

WORDS = "pear\napple\nfig\nbanana\n"
NUMBERS = "10\n9\n-2\n100\n3.5\n"


def sortlines(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "sortlines.py", *args], input=stdin, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("flag", ["-r", "--reverse"])
def test_reverse_text(flag):
    result = sortlines(flag, stdin=WORDS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["pear", "fig", "banana", "apple"]


@pytest.mark.parametrize("flags", [["-n", "-r"], ["-r", "-n"], ["-rn"], ["--numeric", "--reverse"]])
def test_reverse_numeric(flags):
    result = sortlines(*flags, stdin=NUMBERS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["100", "10", "9", "3.5", "-2"]


def test_default_order_unchanged():
    assert sortlines(stdin=WORDS).stdout.splitlines() == ["apple", "banana", "fig", "pear"]
    assert sortlines("-n", stdin=NUMBERS).stdout.splitlines() == ["-2", "3.5", "9", "10", "100"]


def test_reverse_from_file(tmp_path):
    path = tmp_path / "words.txt"
    path.write_text(WORDS)
    assert sortlines("--reverse", str(path)).stdout.splitlines() == ["pear", "fig", "banana", "apple"]


def test_help_mentions_reverse():
    assert "--reverse" in sortlines("--help").stdout


def test_bad_number_still_reported():
    result = sortlines("-n", "-r", stdin="1\nx\n")
    assert result.returncode == 1
    assert "sortlines:" in result.stderr
