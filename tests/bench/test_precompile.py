"""bench/precompile.py: the specs and options it compiles for are the ones the GPU call's parts compute."""

from __future__ import annotations

import argparse

from bench import precompile
from engine.cuda.megakernel import build
from engine.cuda.megakernel.layout import ModelSpec
from engine.gguf.testmodel import write_test_model
from engine.model.weights import load_model


def test_specs_give_the_options_of_the_files_the_parts_open(tmp_path) -> None:
    # the tiny part's file (gpu_megakernel tiny_path) read as the part reads it
    path = write_test_model(tmp_path / "t.gguf", "qwen35", tokenizer=False, vocab_size=512)
    specs = precompile.megakernel_specs()
    assert build.model_options(specs["tiny"]) == build.model_options(ModelSpec.from_tensors(load_model(str(path))[2]))
    # the 27B: Q5_0 (attn_k), Q8_0 (ssm_alpha / beta), Q4_K, Q6_K (attn_v / ffn_down of some layers, the output head)
    assert build.model_options(specs["27b"]) == (
        "-DMK_QT_MASK=" + str((1 << 6) | (1 << 8) | (1 << 12) | (1 << 14)), "-DMK_DN_DK=128", "-DMK_DN_DV=128")


def test_jobs_compile_each_variant_as_its_part_would(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OPENJET_MK_DEFINES", "MK_A=1")
    spec = precompile.megakernel_specs()["27b"]
    args = argparse.Namespace(out=str(tmp_path), nvrtc=None, arch=90, cuda_defines=["WEIGHT_EVICT_FIRST=1"],
                              variants="sync:MK_SYNC_ACQREL=1;big:MK_B=2,SMEM_KB=164,SCHED.split_tiles=1")
    todo = precompile.jobs(args, {"27b": spec, "tiny": precompile.megakernel_specs()["tiny"]})
    mk = [job for job in todo if job[4] == "megakernel"]
    # the variants are cycle27b's: the tiny model's parts build the default (under OPENJET_MK_DEFINES) alone
    assert [job[0] for job in mk] == ["megakernel 27b default", "megakernel tiny default", "megakernel 27b sync",
                                      "megakernel 27b big"]
    mk = [job for job in mk if "27b" in job[0]]
    _, nvrtc_dir, cache, env, _, arch, extra = mk[2]
    assert cache == str(tmp_path.resolve()) and arch == 90 and nvrtc_dir is None
    assert env == {"OPENJET_MK_DEFINES": "MK_A=1,MK_B=2", "OPENJET_MK_SMEM_KB": "164"}
    # the options the call's GpuExecutor.compile_args gives under that environment: the variant's defines after
    # the base's, its shared memory
    assert extra[:3] == ("-DMK_QT_MASK=20800", "-DMK_A=1", "-DMK_B=2") and extra[-1] == f"-DMK_SMEM_BYTES={164 * 1024}"
    assert mk[1][3] == {"OPENJET_MK_DEFINES": "MK_A=1,MK_SYNC_ACQREL=1"} and "-DMK_SYNC_ACQREL=1" in mk[1][6]
    assert sorted(job[6] for job in todo if job[4] == "latency") == [0, 1]
    assert any(job[6] == "gemm_wg" for job in todo if job[4] == "per-op")  # an engine file now (sm_90a)
    per_op = [job for job in todo if job[4] == "per-op"]
    assert {job[3]["OPENJET_CUDA_DEFINES"] for job in per_op} == {"", "WEIGHT_EVICT_FIRST=1"}
    assert len(per_op) == 2 * len({job[6] for job in per_op})


def test_a_job_leaves_the_entry_the_part_then_finds(monkeypatch, tmp_path) -> None:
    from engine.cuda import instances, nvrtc

    for key in ("OPENJET_KERNEL_CACHE", "OPENJET_CUDA_DEFINES"):  # the job sets them in this process
        monkeypatch.setenv(key, "")
    assert precompile.compile_job(("norm", None, str(tmp_path), {"OPENJET_CUDA_DEFINES": ""}, "per-op", 90,
                                   "norm")) > 0
    # what Device._load_file asks for, from the cache the call points OPENJET_KERNEL_CACHE at
    exprs = tuple(i.expr for i in instances.files()["norm"])
    hit = nvrtc.compile_cached(nvrtc.KERNEL_DIR / "norm.cu", 90, exprs, nvrtc.kernel_options(), directory=tmp_path)
    assert hit.from_cache


def test_pruning_keeps_this_sources_entries_and_drops_a_stale_one(monkeypatch, tmp_path) -> None:
    for key in ("OPENJET_KERNEL_CACHE", "OPENJET_CUDA_DEFINES"):
        monkeypatch.setenv(key, "")
    precompile.compile_job(("norm", None, str(tmp_path), {"OPENJET_CUDA_DEFINES": ""}, "per-op", 90, "norm"))
    built = sorted(p.name for p in tmp_path.iterdir())
    assert len(built) == 2  # the cubin and its metadata
    # an earlier source's norm, another define set's act, a megakernel and the latency probe beside it
    others = ["norm-sm90-000000000000000000000000", "act-sm90-111111111111111111111111",
              "megakernel-sm90-222222222222222222222222", "latency_probe-sm90-333333333333333333333333"]
    for stem in others:
        for suffix in (".cubin", ".json"):
            (tmp_path / (stem + suffix)).write_bytes(b"x")
    keep = precompile.per_op_stems(90, [])
    assert built[0].split(".")[0] in keep
    removed = precompile.prune_per_op(tmp_path, keep, 90)
    assert sorted(p.name.split(".")[0] for p in removed) == sorted([others[1]] * 2 + [others[0]] * 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        built + [stem + suffix for stem in others[2:] for suffix in (".cubin", ".json")])
    # a define set is another key for every file: both sets' entries are kept
    assert len(precompile.per_op_stems(90, ["WS_ROWS=128"]) - keep) == len(keep)
