"""`openjet-engine compile`: every kernel file for one architecture into the disk cache, progress as it goes, on a
machine with no GPU (NVRTC compiles cubins without one)."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from engine import cli
from engine.cuda import compile_cmd, instances, nvrtc
from engine.errors import EngineError
from tests.kernels.compiled_cache import full_sm90_cache, run_compile


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch) -> Path:
    """An empty kernel cache for in-process runs."""
    cache = tmp_path / "kernels"
    monkeypatch.setenv("OPENJET_KERNEL_CACHE", str(cache))
    return cache


def _main(capsys, *args: str) -> tuple[int, list[dict], str]:
    """`openjet-engine compile --json ARGS` in this process: exit status, events, stderr."""
    code = cli.main(["compile", "--json", "--jobs", "1", *args])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def _statuses(events: list[dict]) -> dict[str, str]:
    return {e["file"]: e["status"] for e in events if e["event"] == "file"}


def test_every_instance_compiles_for_sm90_and_a_second_run_is_all_cache_hits() -> None:
    cache, first = full_sm90_cache()
    files = instances.files()
    megakernel = compile_cmd.megakernel_units()  # [] until the megakernel exposes its programs
    names = [*files, *(u.name for u in megakernel)]
    start, done = first.events[0], first.events[-1]
    assert (start["event"], start["target"], start["total"], start["cache"]) == ("start", "sm_90", len(names),
                                                                               str(cache))
    assert _statuses(first.events) == {name: "compiled" for name in names}
    assert [e["done"] for e in first.files()] == list(range(1, len(names) + 1))
    num_expressions = len(instances.INSTANCES) + sum(len(u.expressions) for u in megakernel)
    assert sum(e["num_instances"] for e in first.files()) == num_expressions
    assert done["num_compiled"] == len(names) and done["is_ok"] and done["num_failed"] == 0
    # The entries are the ones Device loads: same key, every instance's symbol in its cubin.
    for file, insts in files.items():
        loaded = nvrtc.compile_cached(nvrtc.KERNEL_DIR / f"{file}.cu", 90, tuple(i.expr for i in insts),
                                      nvrtc.file_options(file, 90), directory=cache)
        assert loaded.from_cache and loaded.image[:4] == b"\x7fELF", file
        assert all(loaded.symbols[i.expr].encode() + b"\0" in loaded.image for i in insts), file
    second = run_compile(cache, "--arch", "sm_90")
    assert second.returncode == 0 and _statuses(second.events) == {name: "cached" for name in names}
    assert second.events[-1]["num_cached"] == len(names) and second.events[-1]["seconds"] < 5
    check = run_compile(cache, "--arch", "9.0", "--check")
    assert check.returncode == 0 and set(_statuses(check.events).values()) == {"cached"}


def test_check_force_and_text_progress(kernel_cache, capsys) -> None:
    code, events, _ = _main(capsys, "--arch", "90", "--check", "--only", "norm,rope")
    assert code == 1 and _statuses(events) == {"norm": "missing", "rope": "missing"}
    assert events[-1]["num_missing"] == 2 and not events[-1]["is_ok"]
    assert cli.main(["compile", "--arch", "90", "--only", "norm,rope.cu", "--jobs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("compiling 2 kernel files for sm_90 (NVRTC ") and str(kernel_cache) in lines[0]
    assert [line.split()[0] for line in lines[1:3]] == ["norm", "rope"] and all(" s" in line for line in lines[1:3])
    assert lines[-1].startswith("2 files for sm_90: 2 compiled in ")
    units = {u.name: u for u in compile_cmd.kernel_units()}
    target = compile_cmd.Target(90, 90, False)
    meta_path, image_path, key = compile_cmd.cache_entry(units["norm"], target, kernel_cache)
    assert json.loads(meta_path.read_text())["key"] == key and image_path.read_bytes()[:4] == b"\x7fELF"
    assert not compile_cmd.is_cached(units["norm"], compile_cmd.Target(86, 86, False), kernel_cache)
    before = image_path.stat().st_mtime_ns
    code, events, _ = _main(capsys, "--arch", "90", "--only", "norm", "--force")
    assert code == 0 and _statuses(events) == {"norm": "compiled"} and image_path.stat().st_mtime_ns != before
    code, events, _ = _main(capsys, "--arch", "90", "--only", "rope,norm")
    assert code == 0 and _statuses(events) == {"norm": "cached", "rope": "cached"}


def test_a_broken_kernel_names_its_file_and_carries_the_log(tmp_path) -> None:
    kernels = tmp_path / "kernels"
    shutil.copytree(nvrtc.KERNEL_DIR, kernels)
    rope = kernels / "rope.cu"
    rope.write_text(rope.read_text() + "\n__global__ void broken(float* x) { x[0] = not_declared_anywhere; }\n")
    run = run_compile(tmp_path / "cache", "--arch", "90", "--only", "norm,rope", "--kernel-dir", str(kernels))
    assert run.returncode == 1
    by_file = {e["file"]: e for e in run.files()}
    assert by_file["norm"]["status"] == "compiled" and by_file["rope"]["status"] == "failed"
    assert by_file["rope"]["error"] == f"{rope} did not compile for sm_90"
    assert "not_declared_anywhere" in by_file["rope"]["log"] and "rope.cu" in by_file["rope"]["log"]
    assert str(rope) in run.stderr and "not_declared_anywhere" in run.stderr
    assert run.events[-1]["num_failed"] == 1 and not run.events[-1]["is_ok"]


@pytest.mark.parametrize(("args", "message"), [
    (["--arch", "75"], "sm_75 is older than sm_80"),
    (["--arch", "ninety"], "--arch 'ninety'"),
    (["--arch", "90", "--only", "norm,nope"], "no kernel file nope"),
    (["--arch", "90", "--kernel-dir", "/nonexistent/kernels"], "is not a folder"),
    (["--arch", "90", "--jobs", "0"], "--jobs must be at least 1"),
])
def test_usage_errors_exit_2_with_a_message(kernel_cache, capsys, args, message) -> None:
    assert cli.main(["compile", *args]) == 2
    assert message in capsys.readouterr().err and not kernel_cache.exists()


def test_auto_without_a_gpu_is_a_clear_error(kernel_cache, capsys) -> None:
    try:
        arch = compile_cmd.detect_arch()
    except EngineError as error:
        assert "--arch auto needs an NVIDIA GPU" in str(error) and "--arch N" in str(error)
        assert cli.main(["compile"]) == 2 and "--arch auto needs an NVIDIA GPU" in capsys.readouterr().err
    else:
        pytest.skip(f"this machine has a GPU (sm_{arch})")


def test_targets_follow_the_device_loader() -> None:
    supported = [75, 80, 86, 89, 90, 100, 120]
    assert compile_cmd.resolve_target(90, supported) == compile_cmd.Target(90, 90, False)
    newer = compile_cmd.resolve_target(130, supported)  # a GPU newer than NVRTC: PTX the driver JIT-compiles
    assert newer == compile_cmd.Target(130, 120, True) and newer.name == "compute_120"
    with pytest.raises(EngineError, match="older than sm_80"):
        compile_cmd.resolve_target(75, supported)
    assert [compile_cmd.parse_arch(t) for t in ("auto", "90", "sm_86", "SM_120", "8.9")] == [None, 90, 86, 120, 89]


def test_megakernel_units_are_compiled_through_the_hook(kernel_cache, tmp_path, capsys, monkeypatch) -> None:
    """A package engine.cuda.megakernel with compile_units() gets its programs compiled, in their own group."""
    source = tmp_path / "mk.cu"
    source.write_text('#include "common.cuh"\ntemplate <int N> __global__ void mk(float* x) { x[0] = N; }\n')
    unit = compile_cmd.CompileUnit("mk", "megakernel", source, ("mk<4>",))
    package = types.ModuleType(compile_cmd.MEGAKERNEL_PACKAGE)
    package.compile_units = lambda: [unit]
    monkeypatch.setitem(sys.modules, compile_cmd.MEGAKERNEL_PACKAGE, package)
    code, events, _ = _main(capsys, "--arch", "90", "--only", "mk,norm")
    assert code == 0 and _statuses(events) == {"mk": "compiled", "norm": "compiled"}
    assert {e["file"]: e["group"] for e in events if e["event"] == "file"} == {"mk": "megakernel", "norm": "cuda"}
    assert compile_cmd.is_cached(unit, compile_cmd.Target(90, 90, False), kernel_cache)
