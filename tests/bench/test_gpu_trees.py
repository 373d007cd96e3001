"""The trees' A/B (bench/gpu_trees.py) without a GPU: each tree's gpu_check.py run in its own folder with its own
path, cache and commit, round after round, and the passes tabled by variant and tree."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from bench import gpu_trees

# A stand-in for a tree's bench/gpu_check.py: its passes from what its run was handed (the tree's path entry, its
# cache and commit), written where --out says, as the real one writes them.
FAKE_CHECK = '''
import json, os, sys
from pathlib import Path
out = Path(sys.argv[sys.argv.index("--out") + 1])
tree = Path.cwd()
first = os.environ["PYTHONPATH"].split(os.pathsep)[0]
base = float((tree / "base_ms").read_text())
ok = (first == str(tree) and os.environ["OPENJET_KERNEL_CACHE"] == str(tree / ".kcache")
      and (tree / ".kcache" / "k").exists())
timings = [{"op": "forward", "variant": f"27b.T{t}", "median_ms": base + t if ok else -1.0} for t in (1, 5)]
timings.append({"op": "copy", "variant": "d2d", "median_ms": 1.4})
(out / "gpu_check.json").write_text(json.dumps({"timings": timings, "commit": os.environ.get("OPENJET_COMMIT")}))
'''


def _tree(root: Path, name: str, base_ms: float, commit: str | None) -> Path:
    tree = root / name
    (tree / "bench").mkdir(parents=True)
    (tree / "bench" / "gpu_check.py").write_text(FAKE_CHECK)
    (tree / "base_ms").write_text(str(base_ms))
    (tree / ".kcache").mkdir()
    (tree / ".kcache" / "k").write_text("kernel")
    with tarfile.open(tree / gpu_trees.ARCHIVE, "w:xz") as tar:  # the cache as a call carries it
        tar.add(tree / ".kcache", arcname=".kcache")
    (tree / ".kcache" / "k").unlink()
    (tree / ".kcache").rmdir()
    if commit:
        (tree / gpu_trees.COMMIT_FILE).write_text(commit + "\n")
    return tree


def test_each_tree_runs_from_its_own_folder_cache_and_commit_round_after_round(tmp_path, monkeypatch,
                                                                                   capsys) -> None:
    old, new = _tree(tmp_path, "old", 7.0, "a2a4adf"), _tree(tmp_path, "new", 6.5, None)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/tmp/site", str(gpu_trees.REPO)]))
    out = tmp_path / "out"
    code = gpu_trees.main(["run", "--tree", f"old={old}", "--tree", f"new={new}", "--rounds", "2", "--out",
                           str(out)])
    assert code == 0
    runs = json.loads((out / "trees.json").read_text())["runs"]
    assert runs == {"old": [{"27b.T1": 8.0, "27b.T5": 12.0}] * 2, "new": [{"27b.T1": 7.5, "27b.T5": 11.5}] * 2}
    assert json.loads((out / "old-r2" / "gpu_check.json").read_text())["commit"] == "a2a4adf"
    table = capsys.readouterr().out.splitlines()[-3:]
    assert table[0].split() == ["pass,", "ms", "old", "new"]
    assert table[1].split() == ["27b.T1", "8.000", "/", "8.000", "7.500", "/", "7.500"]


def test_the_table_orders_token_counts_as_numbers_and_marks_missing_rounds() -> None:
    runs = {"a": [{"27b.T10": 1.0, "27b.T2": 2.0, "27b.x.T1": 3.0}, {}], "b": [{"27b.T2": 2.5}]}
    lines = gpu_trees.summarize(runs)
    assert [line.split()[0] for line in lines[1:]] == ["27b.T2", "27b.T10", "27b.x.T1"]
    assert lines[1].split()[1:] == ["2.000", "/", "-", "2.500"]
    assert lines[2].split()[1:] == ["1.000", "/", "-", "-"]


def test_a_tree_that_is_not_a_checkout_is_refused(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        gpu_trees.main(["run", "--tree", f"x={tmp_path}"])
    assert stop.value.code == 2 and "NAME=DIR" in capsys.readouterr().err


def test_a_run_that_fails_is_counted_and_tabled_as_missing(tmp_path) -> None:
    broken = _tree(tmp_path, "broken", 7.0, None)
    (broken / "bench" / "gpu_check.py").write_text("raise SystemExit(3)\n")
    out = tmp_path / "out"
    assert gpu_trees.main(["run", "--tree", f"broken={broken}", "--rounds", "1", "--out", str(out)]) == 1
    assert json.loads((out / "trees.json").read_text())["runs"] == {"broken": [{}]}
