"""N-gram speculation on code edits, the README's "Speculative decoding on the CPU" figures.

Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the catalog's CPU model, fetched and sha256-checked if missing) on the numpy
reference backend, greedy: every change request of tests/engine/spec/codeedit.py (a Python file in context, a small
change asked for) is decoded plainly and with n-gram prompt-lookup drafts, up to --tokens tokens each. The two token
streams must be identical (the script exits 1 otherwise); acceptance figures per prompt and in total go to
bench/results/spec-ngram-<date>.json with the machine, the date and the commit.

    nice -n 10 python bench/spec_acceptance.py                  # 20 prompts x 64 tokens: minutes of CPU
    python bench/spec_acceptance.py --tokens 16 --prompts 2     # a quick look (no file unless --out is given)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.compare_llamacpp import git_commit, machine_info  # noqa: E402
from engine.gguf.reader import GGUFFile  # noqa: E402
from engine.reference.backend import ReferenceBackend  # noqa: E402
from engine.spec import SpecStats  # noqa: E402
from engine.text.chat import ChatTemplate  # noqa: E402
from engine.text.tokenizer import Tokenizer  # noqa: E402
from tests.engine.spec.codeedit import REQUESTS, Run, plain_and_speculative  # noqa: E402

MODEL = "qwen2.5-coder-0.5b"
CONTEXT = 2048  # the file and a request take about 400 tokens


def model_path() -> Path:
    """The real model file, fetched through the app's verified downloader."""
    from openjet_tui.runtime.catalog import load_catalog
    from openjet_tui.runtime.download import fetch_model

    return fetch_model(load_catalog().get(MODEL)).path


def counts(stats: SpecStats) -> dict[str, Any]:
    """The JSON form of one set of cycle counts."""
    return {"passes": stats.num_cycles, "emitted": stats.num_emitted, "drafted": stats.num_drafted,
            "accepted": stats.num_accepted, "tokens_per_pass": round(stats.tokens_per_pass, 3),
            "acceptance_rate": round(stats.acceptance_rate, 4)}


def prompt_entry(run: Run) -> dict[str, Any]:
    """One prompt's result: its output length, whether both decodings agree, and its speculative cycles."""
    return {"request": run.request, "tokens": len(run.speculative), "identical": run.speculative == run.plain,
            **counts(run.stats)}


def measure(path: Path, num_tokens: int, requests: list[str], max_draft: int) -> dict[str, Any]:
    """Decode every request both ways; the results document (without machine and commit)."""
    f = GGUFFile.open(path)
    backend = ReferenceBackend.from_file(f, context_size=CONTEXT)
    tokenizer, template = Tokenizer.from_gguf(f), ChatTemplate.from_gguf(f)
    total, prompts, started = SpecStats(), [], time.perf_counter()
    for run in plain_and_speculative(backend, tokenizer, template, num_tokens, total, max_draft, requests):
        prompts.append(prompt_entry(run))
        p = prompts[-1]
        print(f"{len(prompts):2d} {p['tokens']:3d} tokens in {p['passes']:3d} passes "
              f"({p['tokens_per_pass']:.2f}/pass), {p['accepted']}/{p['drafted']} drafts kept, "
              f"identical={p['identical']}: {run.request}", flush=True)
    return {"model": MODEL, "file": path.name, "backend": "reference", "decoding": "greedy",
            "drafter": "ngram", "max_draft": max_draft, "max_tokens": num_tokens,
            "seconds": round(time.perf_counter() - started, 1),
            "all_identical": all(p["identical"] for p in prompts),
            "total": {"tokens": sum(p["tokens"] for p in prompts), **counts(total)}, "prompts": prompts}


def main(argv: list[str] | None = None) -> int:
    """Run the measurement, write the results file, exit 1 if speculation changed any output."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request (default 64)")
    parser.add_argument("--prompts", type=int, default=len(REQUESTS), help="how many of the requests (default all)")
    parser.add_argument("--max-draft", type=int, default=8, help="the adaptive controller's longest draft")
    parser.add_argument("--out", type=Path, default=None, help="results file (default bench/results/"
                        "spec-ngram-<date>.json for a full run, none otherwise)")
    args = parser.parse_args(argv)
    today = datetime.date.today().isoformat()
    result = {"date": today, "machine": machine_info(), "commit": git_commit(),
              **measure(model_path(), args.tokens, REQUESTS[: args.prompts], args.max_draft)}
    total = result["total"]
    print(f"total: {total['tokens']} tokens in {total['passes']} passes = {total['tokens_per_pass']:.2f} per pass; "
          f"{total['accepted']}/{total['drafted']} drafts accepted; identical on all: {result['all_identical']}")
    out = args.out
    if out is None and args.prompts == len(REQUESTS) and args.tokens == 64:
        out = ROOT / "bench" / "results" / f"spec-ngram-{today}.json"
    if out is not None:
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
    return 0 if result["all_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
