"""The prefill matmul on warpgroup MMA (kernels/gemm_wg.cu, gemm_ws.cu, wgmma.cuh): built with sm_90a's feature set
for sm_90 alone and a trapping stub elsewhere, compiled into asynchronous warpgroup MMAs (A in registers; the
warp-specialised form with both operands in shared memory), launched by ops.matmul only where OPENJET_CUDA_GEMM_WG
asks, with the kernels' own tile and shared-memory sizes."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from gguf import GGMLQuantizationType as Q

import numpy as np

from engine.cuda import gemm, instances, nvrtc, ops, tma

SOURCE = "\n".join((nvrtc.KERNEL_DIR / f).read_text() for f in ("wgmma.cuh", "gemm_wg.cu", "gemm_ws.cu"))
EXPRS = tuple(i.expr for i in instances.files()["gemm_wg"])
WS_EXPRS = tuple(i.expr for i in instances.files()["gemm_ws"])


def define(name: str) -> str:
    return re.search(rf"#define {name} (.+?)(?:\s+//|$)", SOURCE, re.M).group(1).strip()


def test_launch_constants_are_the_kernels() -> None:
    warps = int(define("WG_WARPS"))
    assert gemm.WG_THREADS == 32 * warps and gemm.WG_TOKENS == int(define("WG_TOKENS"))
    assert gemm.WG_ROWS == 16 * warps  # WG_ROWS: 16 rows a warp
    assert define("WG_SMEM_BYTES") == "(2 * (WG_WARPS * 4096 + WG_ACT_BYTES) + 128)"
    assert define("WG_ACT_BYTES") == "(SB_STEPS * WG_STEP_BYTES)" and define("WG_STEP_BYTES") == "(WG_TOKENS * 32)"
    assert gemm.WG_SMEM == 2 * (warps * 4096 + 16 * gemm.WG_TOKENS * 32) + 128
    assert {i.name for i in instances.files()["gemm_wg"]} == {
        f"gemm_wg_{t}{o}" for t in ("q4_K", "q6_K") for o in ("", "_o")}
    assert {i.name for i in instances.files()["gemm_ws"]} == {f"gemm_wg_{t}_ws{e}" for t in ("q4_K", "q6_K")
                                                             for e in ("", "_swiglu")}
    # the warp-specialised form: two producer warpgroups and two consumers; two slots of raw weights, then
    # WS_ASLOTS slots of a chunk's A (WS_ROWS rows x 32 bytes a step) and as many of its B as fit (WsSmem)
    assert gemm.WS_THREADS == int(define("WS_THREADS")) == 4 * 128
    assert "static constexpr int FIXED = 1024 + 2 * RAW + WS_ASLOTS * WS_A_BYTES + WS_BARS_BYTES;" in SOURCE
    assert define("WS_STEP_A_BYTES") == "(WS_ROWS * 32)" and define("WS_ROWS") == "256"
    assert define("WS_A_BYTES") == "(WS_CHUNK_STEPS * WS_STEP_A_BYTES)"
    assert define("WS_B_BYTES") == "(WS_CHUNK_STEPS * WG_STEP_BYTES)"
    assert define("WS_CHUNK_STEPS") == "(SB_STEPS / WS_CHUNKS)"
    assert gemm.WS_SMEM == 227 * 1024 and define("WS_SMEM_MAX") == "(227 * 1024)"  # every build within it

def test_only_sm_90_builds_it_with_its_feature_set() -> None:
    for file in ("gemm_wg", "gemm_ws"):
        assert nvrtc.file_options(file, 90) == ("-arch=sm_90a",)
        assert nvrtc.file_options(file, 90, ptx=True) == () and nvrtc.file_options(file, 89) == ()
    assert all(instances.arch_options(f, 90) == () for f in instances.files() if f not in ("gemm_wg", "gemm_ws"))


def test_sm_90a_build_is_asynchronous_warpgroup_mma_without_spills() -> None:
    path = nvrtc.KERNEL_DIR / "gemm_wg.cu"
    cubin = nvrtc.compile_file(path, 90, EXPRS, nvrtc.file_options("gemm_wg", 90) + ("--ptxas-options=-v",))
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", cubin.log)
    assert len(spills) == len(EXPRS) and all(s == ("0", "0") for s in spills), cubin.log
    assert "serialized" not in cubin.log  # ptxas keeps the wgmmas asynchronous (its C7513 warning where it cannot)
    ptx = nvrtc.compile_file(path, 90, EXPRS, nvrtc.file_options("gemm_wg", 90), ptx=True).image.decode()
    assert ".target sm_90a" in ptx
    mma = r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16 \{[^}]*\}, \{[^}]*\}"  # {d}, {a}: A in registers
    assert len(re.findall(mma, ptx)) == 4 * 16  # a step's, 16 a superblock, in each of the four instances
    for op in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
               "fence.proxy.async.shared::cta"):
        assert op in ptx
    # anywhere else the kernels trap rather than leave y unwritten
    other = nvrtc.compile_file(path, 80, EXPRS, nvrtc.file_options("gemm_wg", 80), ptx=True).image.decode()
    assert "wgmma" not in other and other.count("trap;") >= len(EXPRS)


def test_matmul_takes_it_only_where_asked(monkeypatch) -> None:
    monkeypatch.setattr(gemm, "WG", 0)
    assert gemm.wg_instance(90, Q.Q4_K, 8192, 5120, False) is None  # OPENJET_CUDA_GEMM_WG=0: off
    monkeypatch.setattr(gemm, "WG", 1)
    assert gemm.wg_instance(90, Q.Q4_K, 512, 5120, False) == "gemm_wg_q4_K"
    assert gemm.wg_instance(90, Q.Q6_K, gemm.WG_MIN_TOKENS, 17408, False) == "gemm_wg_q6_K"
    for args in ((89, Q.Q4_K, 512, 5120, False), (120, Q.Q4_K, 512, 5120, False), (90, Q.Q5_K, 512, 5120, False),
                 (90, Q.Q4_K, gemm.WG_MIN_TOKENS - 1, 5120, False), (90, Q.Q4_K, 512, 5000, False),
                 (90, Q.Q4_K, 512, 5120, True)):
        assert gemm.wg_instance(*args) is None, args
    monkeypatch.setattr(gemm, "WG", 2)
    assert gemm.wg_instance(90, Q.Q4_K, 8192, 5120, False) == "gemm_wg_q4_K_o"
    for mode in (3, 4):  # 4: the same kernel on a persistent grid
        monkeypatch.setattr(gemm, "WG", mode)
        assert gemm.wg_instance(90, Q.Q6_K, 8192, 17408, False) == "gemm_wg_q6_K_ws"
    assert all(name in instances.INSTANCES for name in ("gemm_wg_q4_K", "gemm_wg_q4_K_o", "gemm_wg_q6_K_o",
                                                         "gemm_wg_q4_K_ws"))


def test_unset_the_default_policy_takes_the_persistent_gemm_ws_from_its_token_count(monkeypatch) -> None:
    """OPENJET_CUDA_GEMM_WG unset: gemm_ws on its persistent grid from WS_AUTO_TOKENS tokens a matmul (sm_90, its
    types), gemm_cp below, and the prefill in chunks of WS_PREFILL_TOKENS on sm_90 only; the variable set, its mode
    everywhere (the larger chunk with gemm_ws's modes); WS_AUTO_TOKENS None keeps gemm_cp and chunks of 512."""
    monkeypatch.setattr(gemm, "WG", None)
    assert (gemm.WS_AUTO_TOKENS, gemm.WS_PREFILL_TOKENS) == (2048, 4096)  # bench/NOTES.md Z17
    assert [gemm.mode_for(t) for t in (512, 2047, 2048, 8192)] == [0, 0, 4, 4]
    assert gemm.wg_instance(90, Q.Q4_K, 2048, 5120, False) == "gemm_wg_q4_K_ws"
    assert gemm.wg_instance(90, Q.Q4_K, 512, 5120, False) is None
    assert gemm.wg_instance(89, Q.Q4_K, 8192, 5120, False) is None  # no wgmma there
    assert (gemm.prefill_tokens(90), gemm.prefill_tokens(89), gemm.prefill_tokens(120)) == (4096, 512, 512)
    for mode, chunk in ((0, 512), (1, 512), (3, 4096), (4, 4096)):
        monkeypatch.setattr(gemm, "WG", mode)
        assert gemm.mode_for(512) == gemm.mode_for(8192) == mode and gemm.prefill_tokens(90) == chunk, mode
    monkeypatch.setattr(gemm, "WG", None)
    monkeypatch.setattr(gemm, "WS_AUTO_TOKENS", None)
    assert gemm.mode_for(1 << 20) == 0 and gemm.prefill_tokens(90) == 512


def test_the_switch_refuses_a_bad_value(monkeypatch) -> None:
    monkeypatch.setenv(gemm.WG_ENV, "on")
    with pytest.raises(ValueError, match="OPENJET_CUDA_GEMM_WG='on'"):
        gemm.wg_mode()
    monkeypatch.setenv(gemm.WG_ENV, "4")
    assert gemm.wg_mode() == 4
    monkeypatch.delenv(gemm.WG_ENV)
    assert gemm.wg_mode() is None  # the default policy
    monkeypatch.setenv(gemm.WG_ENV, "5")
    with pytest.raises(ValueError, match="persistent"):
        gemm.wg_mode()


@pytest.mark.parametrize("defines", [(), ("-DWS_TMA_B=0",), ("-DWS_KEEP_CONSTS=0",), ("-DWS_KEEP_CONSTS=2",),
                                     ("-DWS_ROWS=128",),
                                     ("-DWS_ROWS=128", "-DWS_SWIZZLE=0"),
                                     ("-DWS_ROWS=128", "-DWS_CHUNKS=2", "-DWS_BSLOTS=3"),
                                     ("-DWS_ROWS=128", "-DWS_CHUNKS=8", "-DWS_ASLOTS=4", "-DWS_BSLOTS=16",
                                      "-DWS_SWIZZLE=0")])
def test_the_warp_specialised_form_builds_in_each_layout(defines: tuple[str, ...]) -> None:
    """gemm_ws with both operands in shared memory (a chunk's steps of wgmma: 16 a superblock), FULL and EMPTY barriers
    an A slot, asynchronous, without spills, trapping elsewhere; 128-byte swizzled descriptors but with WS_SWIZZLE=0."""
    path, options = nvrtc.KERNEL_DIR / "gemm_ws.cu", nvrtc.file_options("gemm_ws", 90) + defines
    cubin = nvrtc.compile_file(path, 90, WS_EXPRS, options + ("--ptxas-options=-v",))
    assert "serialized" not in cubin.log
    assert all(m == ("0", "0") for m in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", cubin.log))
    ptx = nvrtc.compile_file(path, 90, WS_EXPRS, options, ptx=True).image.decode()
    both_shared = r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16 \{[^}]*\}, %rd\d+, %rd\d+"
    chunks = next((int(d.split("=")[1]) for d in defines if d.startswith("-DWS_CHUNKS=")), 4)
    # a chunk's steps in each of the two instances (or more, where NVVM unrolls the consumers' loop)
    assert len(re.findall(both_shared, ptx)) >= 2 * (16 // chunks)
    assert not re.findall(r"wgmma\.mma_async[^\n]*\{[^}]*\}, \{", ptx)  # no A in registers here
    assert "bar.arrive" in ptx and "bar.sync" in ptx
    assert "shfl" not in ptx and "st.shared.v2.u32" in ptx  # a row's 4 k' of a step in one store, no regrouping
    # the descriptors' constant part: SWIZZLE_128B (1 << 62), the 1,024-byte atoms (SBO 64 << 32), LBO 1 << 16
    assert (str((1 << 62) | (64 << 32) | (1 << 16)) in ptx) == ("-DWS_SWIZZLE=0" not in defines)
    other = nvrtc.compile_file(path, 80, WS_EXPRS, nvrtc.file_options("gemm_ws", 80), ptx=True).image.decode()
    assert "wgmma" not in other and other.count("trap;") >= len(WS_EXPRS)


@pytest.mark.parametrize("defines, what", [
    (("-DWS_CHUNKS=3",), "equal chunks"), (("-DWS_ASLOTS=1",), "FULL and EMPTY"), (("-DWS_ROWS=192",), "row tiles"),
    (("-DWS_ASLOTS=6", "-DWS_BSLOTS=6"), "shared memory"),
    (("-DWS_ROWS=128", "-DWS_CHUNKS=8", "-DWS_BSLOTS=16"), "swizzled row")])
def test_a_slot_count_that_cannot_work_is_refused_at_build_time(defines: tuple[str, ...], what: str) -> None:
    path = nvrtc.KERNEL_DIR / "gemm_ws.cu"
    with pytest.raises(Exception, match=what):
        nvrtc.compile_file(path, 90, WS_EXPRS, nvrtc.file_options("gemm_ws", 90) + defines, ptx=True)


@pytest.mark.parametrize("mode, grid", [(3, (68 * 64,)), (4, (132,))])
def test_gemm_ws_walks_one_dimension_of_tiles_a_block_each_or_a_block_an_sm(monkeypatch, mode: int, grid) -> None:
    """gemm_ws reads its tiles from blockIdx.x alone (WsWalk: row tiles fastest): mode 3 launches one block a tile,
    mode 4 one block an SM; 512 threads and sm_90's 227 KB either way."""
    from tests.kernels.recording import RecordingDev as _Dev, act as _act, buf as _buf, weight as _weight

    monkeypatch.setattr(gemm, "WG", mode)
    monkeypatch.setattr(gemm, "b_map", lambda x16, t, cols: tma.TensorMap())  # the driver encodes it on the GPU
    dev, w = _Dev(), _weight(Q.Q4_K, 17408, 5120, "ffn_up")
    smem: list[int] = []
    monkeypatch.setattr(dev, "launch", lambda k, g, b, args, smem_=0, **kw: dev.grids.append((k.name, g, b)) or
                        smem.append(kw.get("smem", smem_)))
    act = _act(5120, int8=False)
    act.max_tokens = 8192
    ops.matmul(dev, w, act, _buf(4 * 8192 * 17408), 8192, 17408)
    assert dev.grids == [("gemm_wg_q4_K_ws", grid, 512)] and smem == [227 * 1024]


def test_256_row_tiles_build_without_spills_with_registers_moved_to_the_consumers(monkeypatch) -> None:
    """WS_ROWS=256, the default (bench/NOTES.md Z17): two wgmmas a consumer step (128 accumulators), setmaxnreg
    giving the consumers 160 registers and the producers 96 (ptxas spills and serialises the wgmmas at 152), and the
    launcher's grid counts 256-row tiles unless OPENJET_CUDA_DEFINES builds 128."""
    path, options = nvrtc.KERNEL_DIR / "gemm_ws.cu", nvrtc.file_options("gemm_ws", 90)
    cubin = nvrtc.compile_file(path, 90, WS_EXPRS, options + ("--ptxas-options=-v",))
    assert "serialized" not in cubin.log
    assert all(m == ("0", "0") for m in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", cubin.log))
    ptx = nvrtc.compile_file(path, 90, WS_EXPRS, options, ptx=True).image.decode()
    assert "setmaxnreg.dec.sync.aligned.u32 96" in ptx and "setmaxnreg.inc.sync.aligned.u32 160" in ptx
    monkeypatch.setenv(nvrtc.DEFINES_ENV, "WS_ROWS=128")
    assert gemm.ws_rows() == 128
    monkeypatch.setenv(nvrtc.DEFINES_ENV, "")
    assert gemm.ws_rows() == 256


def test_tma_b_build_copies_b_with_the_tensor_copy_engine_without_spills() -> None:
    """WS_TMA_B (the default): one 4-D tensor copy a chunk into B slots read through 32-byte swizzled descriptors,
    counted in at mbarriers, no spills, the wgmmas asynchronous; WS_TMA_B=0 copies them with cp.async."""
    path = nvrtc.KERNEL_DIR / "gemm_ws.cu"
    options = nvrtc.file_options("gemm_ws", 90)
    cubin = nvrtc.compile_file(path, 90, WS_EXPRS, options + ("--ptxas-options=-v",))
    assert "serialized" not in cubin.log
    assert all(m == ("0", "0") for m in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", cubin.log))
    ptx = nvrtc.compile_file(path, 90, WS_EXPRS, options, ptx=True).image.decode()
    assert "cp.async.bulk.tensor.4d" in ptx and "mbarrier.try_wait.parity" in ptx and "mbarrier.init" in ptx
    sw32 = (3 << 62) | (64 << 32) | (1 << 16)  # SWIZZLE_32B, the token groups 4 x 256 bytes apart (signed in PTX)
    assert str(sw32 - (1 << 64)) in ptx
    off = nvrtc.compile_file(path, 90, WS_EXPRS, options + ("-DWS_TMA_B=0",), ptx=True).image.decode()
    assert "cp.async.bulk.tensor" not in off and "mbarrier" not in off


def test_b_map_boxes_land_what_the_32_byte_swizzled_descriptors_read(monkeypatch) -> None:
    """Replays the tensor copy of every chunk's box (b_map's dims, strides and box; the map's 32-byte swizzle: 16-byte
    chunk bit 4 of an address XORed with its bit 7) and wgmma's reads through wg_desc_sw32 (a step at 256 s, token
    r's row at (r / 8) SBO + 32 (r % 8), the same swizzle) on an act layout of random halves: each token's step is
    the act layout's 32 bytes of it, tokens past T zeros."""
    captured = {}
    monkeypatch.setattr(tma, "encode", lambda *a: captured.setdefault("args", a))
    monkeypatch.setenv(nvrtc.DEFINES_ENV, "")
    cols, T = 512, 300
    gemm.b_map(SimpleNamespace(ptr=4096), T, cols)
    ptr, dtype, dims, strides, box, swizzle = captured["args"]
    assert (ptr, dtype, swizzle) == (4096, "f16", 32) and box[0] * 2 == 32  # a row: one step's 32 bytes
    nsb, groups = cols // 256, (T + 7) // 8
    rng = np.random.default_rng(0)
    act = rng.integers(1, 1 << 15, size=groups * nsb * 2048, dtype=np.uint16)  # the act layout's halves
    steps = 16 // int(define("WS_CHUNKS"))
    sbo = int(re.search(r"\(\(u64\)\(WS_CHUNK_STEPS \* (\d+) >> 4\) << 32\)", SOURCE).group(1)) * steps
    for grp0 in (0, 16, 32):  # the token tiles (the last one partial)
        for step0 in range(0, nsb * 16, steps):
            smem = np.zeros(np.prod(box), np.uint16)
            idx = np.indices(box[::-1]).reshape(len(box), -1)[::-1]  # coordinates, innermost first, box order
            coord = idx + np.array([0, 0, step0, grp0])[:, None]
            live = np.all(coord < np.array(dims)[:, None], axis=0)
            src = (coord * np.array([1] + [s // 2 for s in strides])[:, None]).sum(axis=0)
            offset = np.arange(smem.size) * 2  # the box lands densely, then the swizzle moves 16-byte chunks
            swizzled = offset ^ (((offset >> 7) & 1) << 4)
            smem[swizzled // 2] = np.where(live, act[np.where(live, src, 0)], 0)
            for r in range(128):  # wgmma's row r (token) of each step through the descriptor
                for s_ in range(steps):
                    base = 256 * s_ + (r // 8) * sbo + 32 * (r % 8)
                    got = [smem[((base + b) ^ ((((base + b) >> 7) & 1) << 4)) // 2] for b in range(0, 32, 2)]
                    t, step = 8 * grp0 + r, step0 + s_
                    want = act[(t // 8) * nsb * 2048 + step * 128 + (t % 8) * 16:][:16] if t // 8 < groups else [0] * 16
                    assert list(got) == list(want), (grp0, step0, r, s_)


def test_gemm_ws_forms_swiglu_behind_gate_up_only_where_it_runs_in_256_row_tiles(monkeypatch) -> None:
    """gemm.swiglu_instance: gate | up (its halves whole superblocks) where the matmul runs gemm_ws in 256-row tiles
    and the switch is on; launch_swiglu launches that instance like gemm_ws, its output the f16 act values, no
    residual."""
    from tests.kernels.recording import RecordingDev as _Dev, buf as _buf, weight as _weight

    monkeypatch.setattr(gemm, "WG", None)
    monkeypatch.setattr(gemm, "SWIGLU", True)
    monkeypatch.setenv(nvrtc.DEFINES_ENV, "")
    w = _weight(Q.Q4_K, 2 * 17408, 5120, "gate|up")
    assert gemm.swiglu_instance(90, w, 4096) == "gemm_wg_q4_K_ws_swiglu"
    assert gemm.swiglu_instance(90, _weight(Q.Q6_K, 1024, 512), 2048) == "gemm_wg_q6_K_ws_swiglu"
    for arch, weight, tokens in ((90, w, 512),  # gemm_cp below WS_AUTO_TOKENS
                                 (89, w, 4096),  # no wgmma
                                 (90, _weight(Q.Q4_K, 2 * 17408 + 256, 5120), 4096),  # halves not whole superblocks
                                 (90, _weight(Q.Q5_K, 2 * 17408, 5120), 4096)):  # a type without gemm_ws
        assert gemm.swiglu_instance(arch, weight, tokens) is None, (arch, weight.qtype, weight.rows, tokens)
    monkeypatch.setattr(gemm, "WG", 1)  # gemm_wg asked for: no SwiGLU form
    assert gemm.swiglu_instance(90, w, 4096) is None
    monkeypatch.setattr(gemm, "WG", None)
    monkeypatch.setenv(nvrtc.DEFINES_ENV, "WS_ROWS=128")  # one accumulator set a consumer
    assert gemm.swiglu_instance(90, w, 4096) is None
    monkeypatch.setenv(nvrtc.DEFINES_ENV, "")
    monkeypatch.setattr(gemm, "SWIGLU", False)
    assert gemm.swiglu_instance(90, w, 4096) is None
    monkeypatch.setattr(gemm, "SWIGLU", True)
    monkeypatch.setattr(gemm, "b_map", lambda x16, t, cols: ("map", x16, t, cols))
    dev, x16, out16 = _Dev(), _buf(), _buf()
    gemm.launch_swiglu(dev, w, x16, out16, 4096)
    assert dev.grids == [("gemm_wg_q4_K_ws_swiglu", (132,), 512)]
    assert dev.launches[0][1] == [("map", x16, 4096, 5120), w.buf, x16, out16, None, 2 * 17408, 5120, 4096, 0]


def test_a_prefill_ffn_takes_the_swiglu_gemm_where_ffn_downs_input_is_gemm_only(monkeypatch) -> None:
    """model._ffn at a prefill chunk: the norm, gate | up forming SwiGLU itself, ffn_down; two launches for SwiGLU
    where its act keeps what a GEMM does not read (not gemm_only), where ffn_down has no prefill GEMM, or where
    gemm_ws does not run."""
    from tests.kernels.recording import ffn_model as _model

    monkeypatch.setattr(gemm, "WG", None)
    monkeypatch.setattr(gemm, "SWIGLU", True)
    monkeypatch.setenv(nvrtc.DEFINES_ENV, "")

    def launches(model, lw, tokens: int) -> list[tuple]:
        seen: list[tuple] = []
        monkeypatch.setattr(ops, "produce", lambda dev, producer, act, t: seen.append(("produce", producer.mode)))
        monkeypatch.setattr(gemm, "launch_swiglu", lambda dev, w, x16, out16, t: seen.append(
            ("gemm swiglu", w.name, x16 is model.ws.act_h.x16, out16 is model.ws.act_ffn.x16)))
        monkeypatch.setattr(ops, "matmul", lambda dev, w, act, y, t, ld, producer=None, **k: seen.append(
            (w.name, producer and producer.mode)))
        monkeypatch.setattr(ops, "act_swiglu", lambda *a, **k: seen.append(("act_swiglu",)))
        model._ffn(lw, tokens)
        return seen

    model, lw = _model()
    model.ws.act_ffn.gemm_only = True
    assert launches(model, lw, 4096) == [("produce", "rmsnorm"), ("gemm swiglu", "gate|up", True, True),
                                         ("ffn_down", None)]
    apart = [("produce", "rmsnorm"), ("gate|up", None), ("act_swiglu",), ("ffn_down", None)]
    assert launches(model, lw, 512) == apart  # gemm_cp
    model.ws.act_ffn.gemm_only = False
    assert launches(model, lw, 4096) == apart
    model, lw = _model(down_qtype=Q.F16)
    model.ws.act_ffn.gemm_only = True
    assert launches(model, lw, 4096) == apart
