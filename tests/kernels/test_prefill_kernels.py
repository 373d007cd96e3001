"""Host-side rules of the prefill kernels (chunked delta rule, gemm_cp, attn_mma): the launchers' copies of the
kernels' constants, the shared memory they ask for, and which GPUs take each path. The kernels themselves are
checked on the GPU (bench/gpu_mixers.py, bench/gpu_kernels.py, bench/gpu_models.py)."""

from __future__ import annotations

import re

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import gemm, instances, mixers, nvrtc, ops

# opt-in dynamic shared memory per block: sm_90 (H100/H200), sm_80 (A100), sm_86 / sm_89 / sm_120 (GeForce)
SM90, SM80, GEFORCE = 232448, 166912, 101376


def _defines(file: str) -> dict[str, str]:
    return dict(re.findall(r"#define (\w+) (\S+)", (nvrtc.KERNEL_DIR / file).read_text()))


def test_launchers_mirror_the_kernels_constants() -> None:
    """The launchers size grids, scratch and shared memory from their own copies: a drift under-allocates."""
    chunked = _defines("deltanet_chunked.cu")
    assert int(chunked["GDN_CHUNK"]) == mixers.GDN_CHUNK and int(chunked["GDN_SCAN_COLS"]) == mixers.GDN_SCAN_COLS
    attention = _defines("attention_prefill.cu")
    assert int(attention["ATTN_MMA_ROWS"]) == mixers.ATTN_MMA_ROWS == int(attention["ATTN_MMA_KEYS"])
    kernel = _defines("gemm.cu")
    assert int(kernel["GEMM_STAGES"]) == gemm.STAGES
    # GEMM_ACT_BYTES = GEMM_NG groups x 16 steps x 8 tokens x 32 bytes
    assert int(kernel["GEMM_NG"]) * 16 * 8 * 32 == gemm.ACT_BYTES and 8 * int(kernel["GEMM_NG"]) == gemm.TOKENS


def test_chunk_scratch_holds_every_chunk_of_every_head() -> None:
    # per (head, chunk): W, U~, Q', K' (64 x D each), P (64 x 64) and the tail, in floats
    assert mixers.gdn_chunk_work_bytes(512, 48, 128) == 4 * 48 * 8 * (4 * 64 * 128 + 64 * 64 + 4)
    assert mixers.gdn_chunk_work_bytes(65, 2, 64) == mixers.gdn_chunk_work_bytes(128, 2, 64)  # a partial chunk
    assert mixers.gdn_chunk_work_bytes(64, 2, 64) < mixers.gdn_chunk_work_bytes(65, 2, 64)


def test_each_prefill_path_only_where_its_shared_memory_fits() -> None:
    """Every size fits an H100/H200 and an A100; on a GeForce (99 KB a block) the 128-wide DeltaNet heads keep the
    recurrent kernel while 256-wide attention heads fit exactly, and every gemm_cp type fits."""
    for limit in (SM90, SM80):
        assert all(mixers.gdn_chunked_fits(d, d, limit) for d in instances.GDN_CHUNK_DIMS)
        assert all(mixers.attn_runs_mma(512, d, limit) for d in instances.ATTN_MMA_DIMS)
        assert all(gemm.runs_cp(q, limit) for q in instances.GEMM_CP_QTYPES)
    assert not mixers.gdn_chunked_fits(128, 128, GEFORCE) and mixers.gdn_chunked_fits(64, 64, GEFORCE)
    assert mixers.attn_runs_mma(512, 256, GEFORCE) and not mixers.attn_runs_mma(512, 256, GEFORCE - 1)
    assert all(gemm.runs_cp(q, GEFORCE) for q in instances.GEMM_CP_QTYPES)
    assert not mixers.gdn_chunked_fits(128, 64, SM90) and not mixers.gdn_chunked_fits(256, 256, SM90)


def test_attention_on_tensor_cores_only_for_prefill_runs() -> None:
    assert not mixers.attn_runs_mma(8, 256, SM90)  # a verify pass keeps the float32 kernel with key splits
    assert mixers.attn_runs_mma(mixers.ATTN_MMA_MIN_TOKENS, 128, SM90)
    assert not mixers.attn_runs_mma(512, 32, SM90)  # no instance for 32-wide heads


def test_staged_activations_respect_the_gpu_limit() -> None:
    # 8 warps of Q4_K at 1 precise token fit two blocks of an H200's SM but not one GeForce block
    need = 8 * ops._staged_warp_bytes(Q.Q4_K, 1, True)
    assert ops.staged_act_fits(Q.Q4_K, 1, True, 8, max_smem=SM90)
    assert ops.staged_act_fits(Q.Q4_K, 1, True, 8, max_smem=need) and not ops.staged_act_fits(
        Q.Q4_K, 1, True, 8, max_smem=need - 1)


@pytest.mark.parametrize("defines", [(), ("-DGDN_ASYNC_COPY=0",)])
def test_the_chunked_scan_builds_with_either_copy(defines: tuple[str, ...]) -> None:
    """gdn_chunk_scan's per-chunk inputs by cp.async (the default: every copy of a thread in flight at once, the next
    chunk's Q' and P issued during this one), or through registers (GDN_ASYNC_COPY=0), without spills at sm_80 and
    sm_90."""
    exprs = tuple(i.expr for i in instances.files()["deltanet_chunked"])
    for arch in (80, 90):
        options = nvrtc.file_options("deltanet_chunked", arch) + defines
        cubin = nvrtc.compile_file(nvrtc.KERNEL_DIR / "deltanet_chunked.cu", arch, exprs,
                                   options + ("--ptxas-options=-v",))
        assert all(m == "0" for m in re.findall(r"(\d+) bytes spill stores", cubin.log)), cubin.log
        ptx = nvrtc.compile_file(nvrtc.KERNEL_DIR / "deltanet_chunked.cu", arch, exprs, options, ptx=True)
        assert ("cp.async.cg.shared.global" in ptx.image.decode() or "cp.async.ca.shared.global" in
                ptx.image.decode()) == (not defines)
