"""Hidden check: the agent's tests pass on the real is_leap_year and fail on each wrong version of it."""

import os
import pathlib
import subprocess
import sys

import pytest

from mutants import MUTANTS

CHECK_DIR = pathlib.Path(__file__).resolve().parent


def run_agent_tests(mutant: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(CHECK_DIR), os.getcwd()]))
    env.pop("LEAP_MUTANT", None)
    if mutant:
        env["LEAP_MUTANT"] = mutant
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "mutants", "-p", "no:cacheprovider", "tests/test_dates.py"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_tests_mention_is_leap_year():
    assert "is_leap_year" in pathlib.Path("tests/test_dates.py").read_text()


def test_tests_pass_on_the_real_function():
    result = run_agent_tests(None)
    assert result.returncode == 0, result.stdout[-2000:]


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_tests_catch_the_mutant(mutant):
    result = run_agent_tests(mutant)
    assert result.returncode == 1, f"{mutant}: the tests did not fail\n{result.stdout[-2000:]}"
