"""Hidden check: `make clean` removes build/ and every __pycache__, keeps sources, and is phony."""

import pathlib
import subprocess


def make(*targets: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", *targets], capture_output=True, text=True, timeout=30)


def test_clean_removes_outputs_and_keeps_sources():
    assert make("all").returncode == 0
    assert pathlib.Path("build/handbook.txt").is_file()
    for folder in ("tools/__pycache__", "src/nested/__pycache__", "__pycache__"):
        pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(folder) / "join.cpython-311.pyc").write_bytes(b"\0")
    result = make("clean")
    assert result.returncode == 0, result.stderr
    assert not pathlib.Path("build").exists()
    leftovers = [str(p) for p in pathlib.Path(".").rglob("__pycache__")]
    assert leftovers == []
    assert pathlib.Path("src/01-welcome.txt").is_file()
    assert pathlib.Path("tools/join.py").is_file()
    assert pathlib.Path("Makefile").is_file()


def test_clean_runs_even_when_a_file_named_clean_exists():
    # A non-phony target would be "up to date" here and do nothing.
    pathlib.Path("build").mkdir(exist_ok=True)
    pathlib.Path("clean").write_text("")
    try:
        result = make("clean")
        assert result.returncode == 0, result.stderr
        assert not pathlib.Path("build").exists()
    finally:
        pathlib.Path("clean").unlink()


def test_clean_twice_is_fine_and_build_still_works():
    assert make("clean").returncode == 0
    assert make("clean").returncode == 0
    assert make("all").returncode == 0
    assert pathlib.Path("build/handbook.txt").read_text().startswith("Welcome")
