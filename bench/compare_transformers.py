"""Independent agreement of OpenJet's numpy reference engine with Hugging Face transformers' own model code
(`Qwen3_5ForCausalLM` for GGUF qwen35, `Qwen3ForCausalLM` for qwen3), and the golden fixtures that `make test`
checks the reference against without torch.

Requirements (not OpenJet dependencies: use a separate environment):
  python3.11 -m venv /tmp/hfvenv
  /tmp/hfvenv/bin/pip install torch==2.13.0 transformers==5.17.0 numpy gguf==0.19.0 tokenizers jinja2 httpx
  /tmp/hfvenv/bin/pip install -e . --no-deps
Usage:
  /tmp/hfvenv/bin/python bench/compare_transformers.py                 measure, write fixtures and results
  /tmp/hfvenv/bin/python bench/compare_transformers.py --no-fixtures   measure and report only
  ... --incremental 64     HF's token-by-token decode path over the first 64 positions only (0: skip it)
  ... --device cuda        run transformers on a GPU (float32, TF32 off)

For the generated tiny qwen35 and qwen3 files (the same seed and options as bench/compare_llamacpp.py; their sha256
goes into the manifest), the GGUF weights are dequantized, mapped back to a transformers state dict by inverting
llama.cpp's converter (bench/hf_mapping.py) and loaded with strict=True; transformers then runs the fixed text
(bench/llamacpp_corpus.TINY_TEXT, tokenized by our tokenizer) in float32, and its logits at every position are
compared with the reference's:
  single pass   one forward over all positions (chunked gated delta rule, causal conv over the whole sequence);
  incremental   transformers' decode path, one token at a time through its cache (recurrent delta rule, conv state
                update, KV cache);
  ablations     the same with one converter convention deliberately not undone: the comparison must break;
  llama.cpp     transformers against llama.cpp's exact-mode golden outputs, where those fixtures exist.
The MTP block (blk.N.nextn.*) is not part of transformers' model and is not compared.

Writes tests/engine/fixtures/transformers/ (manifest.json, tiny_<arch>.npz) and
bench/results/agreement-transformers-<date>.json, and prints a summary.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.compare_llamacpp import (  # noqa: E402
    MIN_POSITIONS, TINY_ARCHS, TINY_OPTIONS, git_commit, machine_info, merge_json, reference_logits, sha256_file
)
from bench.hf_mapping import HFWeights, MappingOptions, hf_weights  # noqa: E402
from bench.llamacpp_corpus import TINY_TEXT  # noqa: E402
from bench.llamacpp_metrics import TopK, compare, full_kl  # noqa: E402

FIXTURES = ROOT / "tests" / "engine" / "fixtures" / "transformers"
LLAMACPP_FIXTURES = ROOT / "tests" / "engine" / "fixtures" / "llamacpp"
RESULTS = ROOT / "bench" / "results"
TOPK = 128  # tail mass ~1e-4 on these models: the KL upper bound stays tight
GOLDEN = "transformers"  # the fixture arrays' prefix
ABLATIONS = {"v_heads_not_reordered": MappingOptions(reorder_v_heads=False),
             "norm_offset_not_removed": MappingOptions(norm_offset=False)}


def measure(golden_full: np.ndarray, ours: np.ndarray, k: int = TOPK) -> dict:
    """Agreement of ours with full golden logits [T, V]: the compact-form figures plus the exact KL."""
    measured = compare(TopK.from_logits(golden_full, k), ours).as_dict()
    kl = full_kl(golden_full, ours)
    measured.update(kl_mean=float(kl.mean()), kl_max=float(kl.max()),
                    max_abs_logit_diff=float(np.abs(golden_full - ours).max()))
    return measured


class HFRunner:
    """A transformers model built from a GGUF file's weights, run in float32 on one device."""

    def __init__(self, weights: HFWeights, device: str = "cpu"):
        import torch
        import transformers

        self.torch, self.device = torch, device
        config_class = getattr(transformers, weights.config_class)
        # eager attention: the plain softmax(QK^T)V, no fused kernel whose precision could vary
        self.config = config_class(**weights.config, attn_implementation="eager")
        model = getattr(transformers, weights.model_class)(self.config)
        state = {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in weights.state_dict.items()}
        model.load_state_dict(state, strict=True)  # raises on any missing or unexpected parameter
        self.model = model.to(device=device, dtype=torch.float32).eval()

    def logits(self, ids: list[int]) -> np.ndarray:
        """Logits at every position of ids, in one forward pass without a cache: [T, V]."""
        torch = self.torch
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=False)
        return out.logits[0].float().cpu().numpy()

    def incremental_logits(self, ids: list[int]) -> np.ndarray:
        """Logits of ids fed one token at a time through transformers' cache (its decode path): [T, V]."""
        from transformers import DynamicCache

        torch = self.torch
        cache, rows = DynamicCache(config=self.config), []
        with torch.no_grad():
            for token in ids:
                out = self.model(input_ids=torch.tensor([[token]], device=self.device), past_key_values=cache,
                                 use_cache=True)
                cache = out.past_key_values
                rows.append(out.logits[0, -1].float().cpu().numpy())
        return np.stack(rows)


def tokenize_text(path: Path) -> list[int]:
    """TINY_TEXT tokenized by our tokenizer from the file's metadata (llama.cpp's ids for it, as its fixture shows)."""
    from engine.gguf.reader import GGUFFile
    from engine.text.tokenizer import Tokenizer

    ids = Tokenizer.from_gguf(GGUFFile.open(path)).encode(TINY_TEXT, parse_special=True, add_special=True)
    if len(ids) < MIN_POSITIONS:
        raise SystemExit(f"the tiny text gives {len(ids)} tokens, fewer than {MIN_POSITIONS}")
    return ids


def llamacpp_cross_check(arch: str, ids: list[int], hf: np.ndarray) -> dict | None:
    """transformers against llama.cpp's exact-mode golden outputs on the same tokens, if those fixtures exist."""
    path = LLAMACPP_FIXTURES / f"tiny_{arch}.npz"
    if not path.is_file():
        return None
    with np.load(path) as npz:
        if npz["token_ids"].tolist() != ids:
            return {"skipped": "llama.cpp's fixture holds other token ids"}
        golden = TopK.from_arrays(npz, "exact")
    return compare(golden, hf).as_dict()


def run_ablations(path: Path, ids: list[int], ours: np.ndarray, device: str) -> dict:
    """Each deliberately wrong mapping against the reference: how far transformers then lands from it."""
    from engine.gguf.reader import GGUFFile

    out = {}
    for name, options in ABLATIONS.items():
        weights = hf_weights(GGUFFile.open(path), options)
        logits = HFRunner(weights, device).logits(ids)
        m = measure(logits, ours)
        out[name] = {key: m[key] for key in ("top1", "kl_mean", "max_abs_logit_diff")}
    return out


def tiny_model(arch: str, work: Path, incremental: int | None, device: str) -> tuple[dict, dict[str, np.ndarray]]:
    """One generated tiny model: transformers (single pass, incremental, ablations) against the reference."""
    from engine.gguf.reader import GGUFFile
    from engine.gguf.testmodel import write_test_model

    path = write_test_model(work / f"tiny-{arch}.gguf", arch, **TINY_OPTIONS)
    ids = tokenize_text(path)
    ours = reference_logits(path, ids)
    weights = hf_weights(GGUFFile.open(path))
    runner = HFRunner(weights, device)
    hf = runner.logits(ids)
    measured: dict = {"single_pass": measure(hf, ours)}
    if incremental != 0:
        num = len(ids) if incremental is None else min(incremental, len(ids))
        steps = runner.incremental_logits(ids[:num])
        measured["incremental"] = measure(steps, ours[:num])
        measured["transformers_incremental_vs_single_pass"] = measure(hf[:num], steps)
    if arch == "qwen35":  # the conventions the ablations undo exist only in qwen35 files
        measured["ablations"] = run_ablations(path, ids, ours, device)
    measured["transformers_vs_llamacpp_exact"] = llamacpp_cross_check(arch, ids, hf)
    summary = {"options": TINY_OPTIONS, "sha256": sha256_file(path), "size": path.stat().st_size,
               "file": f"tiny_{arch}.npz", "num_positions": len(ids), "topk": TOPK,
               "hf_config_class": weights.config_class, "hf_model_class": weights.model_class,
               "hf_config": weights.config,
               "hf_parameters": {name: list(value.shape) for name, value in weights.state_dict.items()},
               "not_compared": weights.skipped, "measured": measured}
    arrays = {"token_ids": np.asarray(ids, dtype=np.int32), **TopK.from_logits(hf, TOPK).arrays(GOLDEN)}
    return summary, arrays


def versions(device: str) -> dict:
    """transformers, torch and numpy versions and the device transformers ran on."""
    import numpy
    import torch
    import transformers

    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    return {"transformers": transformers.__version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "device": device, "device_name": name, "dtype": "float32", "attn_implementation": "eager"}


def setup_torch(device: str, threads: int | None) -> None:
    """float32 everywhere: TF32 off on GPUs (it would round matmul and conv inputs to 10 bits)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if threads:
        torch.set_num_threads(threads)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: torch sees no CUDA device")


def write_fixtures(sections: dict, files: dict[str, dict[str, np.ndarray]], header: dict) -> None:
    """Fixture arrays and the manifest."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, arrays in files.items():
        np.savez_compressed(FIXTURES / name, **arrays)
    merge_json(FIXTURES / "manifest.json", header, sections)


def print_summary(sections: dict) -> None:
    """The headline figures, one line per comparison."""
    for arch, summary in sections["tiny"].items():
        for mode in ("single_pass", "incremental"):
            m = summary["measured"].get(mode)
            if m:
                print(f"tiny {arch:6s} {mode:11s}: top-1 {m['top1']:.2%} over {m['num_positions']} positions, "
                      f"mean KL {m['kl_mean']:.2e} (max {m['kl_max']:.2e}), max |dlogit| "
                      f"{m['max_abs_logit_diff']:.3g}, mismatches at {m['mismatches']}")
        for name, m in summary["measured"].get("ablations", {}).items():
            print(f"tiny {arch:6s} ablation {name}: top-1 {m['top1']:.2%}, mean KL {m['kl_mean']:.3g}")
        cross = summary["measured"]["transformers_vs_llamacpp_exact"]
        if cross and "top1" in cross:
            print(f"tiny {arch:6s} transformers vs llama.cpp exact: top-1 {cross['top1']:.2%}, mean KL in "
                  f"[{cross['kl_low_mean']:.2e}, {cross['kl_high_mean']:.2e}] (top-{TOPK} bounds), max |dlogprob| "
                  f"{cross['max_logprob_diff']:.2e}")
        print(f"tiny {arch:6s} not compared (no transformers counterpart): {summary['not_compared'] or 'nothing'}")


def main(argv: list[str] | None = None) -> int:
    """Run the comparison, write fixtures and results, print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-fixtures", action="store_true", help="do not rewrite tests/engine/fixtures")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default bench/results)")
    parser.add_argument("--incremental", type=int, default=None,
                        help="positions for transformers' token-by-token path (default all; 0 skips it)")
    parser.add_argument("--device", default="cpu", help="torch device for transformers (default cpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default torch's choice)")
    args = parser.parse_args(argv)
    if args.incremental is not None and args.incremental < 0:
        parser.error("--incremental takes a count of positions >= 0")
    setup_torch(args.device, args.threads)
    today = datetime.date.today().isoformat()
    header = {"transformers": versions(args.device), "date": today, "machine": machine_info(),
              "commit": git_commit()}
    sections: dict = {"tiny": {}}
    files: dict[str, dict[str, np.ndarray]] = {}
    with tempfile.TemporaryDirectory(prefix="openjet-compare-hf-") as work:
        for arch in TINY_ARCHS:
            print(f"tiny {arch}: transformers and the reference ...", flush=True)
            sections["tiny"][arch], files[f"tiny_{arch}.npz"] = tiny_model(arch, Path(work), args.incremental,
                                                                           args.device)
    if not args.no_fixtures:
        write_fixtures(sections, files, header)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / f"agreement-transformers-{today}.json"
    merge_json(results_path, header, sections)
    print_summary(sections)
    print(f"results: {results_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
