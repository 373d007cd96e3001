"""The 27B passes of several source trees in one GPU call, round after round: an A/B of code no switch reaches.

A change to a kernel's own code (its launch bounds, the order of its ring's copies) has no bench variant to flip
inside one process, and two calls may land on two machines whose passes differ by more than the change (H100s:
7.21-7.31 ms for the same one-token code, bench/NOTES.md Z25). So one call runs each tree's `gpu_check.py` in
turn, A / B / A / B, each tree from its own kernel cache (bench/precompile.py), on the machine's one 27B file:

  here:  python bench/gpu_trees.py prepare a2a4adf .trees/old --nvrtc DIR   (git archive + its kernel cache)
  call:  python bench/gpu_trees.py run --tree old=.trees/old --tree new=. --rounds 2 --out $OUT/trees
         (carry .trees/old; OPENJET_BENCH_VARIANTS, OPENJET_BENCH_PASSES_ONLY, ... reach every run)

run prints each variant's forward passes by tree, one figure a round, and writes trees.json. summarize() is plain
Python (tests/bench/test_gpu_trees.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCHIVE, CACHE, COMMIT_FILE = ".kcache.tar.xz", ".kcache", "COMMIT"
# what a prepared tree leaves out: a call carries it beside the checkout (64 MiB in all)
NOT_CARRIED = ("bench/results", "tests", "assets")


def prepare(rev: str, dest: Path, nvrtc: str, workers: int) -> None:
    """Tree `rev` of this checkout into dest (less NOT_CARRIED), its commit in dest/COMMIT, and its kernel cache
    built with the GPU machine's NVRTC into dest/.kcache.tar.xz."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, check=True, capture_output=True,
                            text=True).stdout.strip()
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    for part in NOT_CARRIED:
        shutil.rmtree(dest / part, ignore_errors=True)
    (dest / COMMIT_FILE).write_text(commit + "\n")
    subprocess.run([sys.executable, "bench/precompile.py", "--nvrtc", nvrtc, "--workers", str(workers)], cwd=dest,
                   check=True)
    shutil.rmtree(dest / CACHE, ignore_errors=True)  # the archive is what travels
    print(f"{dest}: {commit}, {(dest / ARCHIVE).stat().st_size / 2**20:.1f} MB of kernel cache")


def _env(tree: Path) -> dict[str, str]:
    """The environment of one tree's run: its sources first on the path (the checkout's own left out), its cache,
    its commit."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *paths])
    env["OPENJET_KERNEL_CACHE"] = str(tree / CACHE)
    if (tree / COMMIT_FILE).exists():
        env["OPENJET_COMMIT"] = (tree / COMMIT_FILE).read_text().strip()
    return env


def forward_passes(result: dict) -> dict[str, float]:
    """A gpu_check.json's forward passes: variant (27b.T1, 27b.i8vdown.T5, ...) -> median ms."""
    return {t["variant"]: t["median_ms"] for t in result.get("timings", []) if t["op"] == "forward"}


def summarize(runs: dict[str, list[dict[str, float]]]) -> list[str]:
    """Tree -> its rounds' forward passes, as a table: a row a variant, a column a tree, each cell the rounds'
    figures in order ("-" where a round has none)."""
    trees = list(runs)
    variants = sorted({v for rounds in runs.values() for r in rounds for v in r},
                      key=lambda v: (v.rsplit(".T", 1)[0], int(v.rsplit(".T", 1)[1]) if ".T" in v else 0))
    cells = {(v, t): " / ".join(f"{r[v]:.3f}" if v in r else "-" for r in runs[t]) for v in variants for t in trees}
    width = max([len(v) for v in variants] + [7])
    col = max([len(c) for c in cells.values()] + [len(t) for t in trees])
    lines = [f"{'pass, ms':<{width}}  " + "  ".join(f"{t:<{col}}" for t in trees)]
    lines += [f"{v:<{width}}  " + "  ".join(f"{cells[v, t]:<{col}}" for t in trees) for v in variants]
    return lines


def run(trees: list[tuple[str, Path]], rounds: int, parts: str, out: Path, timeout_s: int) -> int:
    """Each tree's gpu_check.py --parts `parts` in turn, `rounds` times; the table printed and trees.json written."""
    for _, tree in trees:
        if not (tree / CACHE).exists() and (tree / ARCHIVE).exists():
            with tarfile.open(tree / ARCHIVE) as tar:
                tar.extractall(tree, filter="data")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    failed = 0
    for r in range(rounds):
        for name, tree in trees:
            dest = out / f"{name}-r{r + 1}"
            dest.mkdir(parents=True, exist_ok=True)
            with open(dest / "log.txt", "w") as log:
                try:
                    code = subprocess.run([sys.executable, "bench/gpu_check.py", "--parts", parts, "--out",
                                           str(dest)], cwd=tree, env=_env(tree), stdout=log,
                                          stderr=subprocess.STDOUT, timeout=timeout_s).returncode
                except subprocess.TimeoutExpired:
                    code = -1
            path = dest / "gpu_check.json"
            runs[name].append(forward_passes(json.loads(path.read_text())) if path.exists() else {})
            failed += code != 0
            print(f"{name} round {r + 1}: exit {code}, {len(runs[name][-1])} passes", flush=True)
    (out / "trees.json").write_text(json.dumps({"trees": {n: str(t) for n, t in trees}, "runs": runs}, indent=1))
    print("\n".join(summarize(runs)))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="a tree of another commit, with its kernel cache (on this machine)")
    prep.add_argument("rev")
    prep.add_argument("dest", type=Path)
    prep.add_argument("--nvrtc", required=True, help="folder of the GPU machine's libnvrtc (bench/precompile.py)")
    prep.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    go = sub.add_parser("run", help="the trees' passes in turn (on the GPU machine)")
    go.add_argument("--tree", action="append", required=True, metavar="NAME=DIR",
                    help="a tree: its name in the table and its folder (with its .kcache.tar.xz)")
    go.add_argument("--rounds", type=int, default=2)
    go.add_argument("--parts", default="model27b")
    go.add_argument("--out", type=Path, default=Path("out/trees"))
    go.add_argument("--timeout", type=int, default=180, help="seconds a tree's run may take")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.rev, args.dest, args.nvrtc, args.workers)
        return 0
    trees = []
    for spec in args.tree:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not (Path(folder) / "bench" / "gpu_check.py").exists():
            parser.error(f"--tree {spec!r}: NAME=DIR, DIR a checkout (its bench/gpu_check.py)")
        trees.append((name, Path(folder).resolve()))
    return run(trees, args.rounds, args.parts, args.out, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
