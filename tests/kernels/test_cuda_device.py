"""The CUDA runtime's behaviour on a machine without a usable GPU, and the host-side contracts of the launchers."""

from __future__ import annotations

import ctypes
import re
from types import SimpleNamespace

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import device, instances, mixers, nvrtc, ops
from engine.cuda.device import Buffer
from engine.cuda.select import select_backend
from engine.errors import EngineError


def _has_gpu() -> bool:
    try:
        device.Device().close()
    except device.NoGpuError:
        return False
    return True


HAS_GPU = _has_gpu()
no_gpu_only = pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")


@no_gpu_only
def test_no_driver_is_a_clear_engine_error() -> None:
    with pytest.raises(device.NoGpuError, match="NVIDIA driver") as err:
        device.Device()
    assert isinstance(err.value, EngineError)


@no_gpu_only
def test_auto_falls_back_to_the_reference_with_the_reason(tiny_model_path) -> None:
    from engine.reference.backend import ReferenceBackend

    backend, reason = select_backend(tiny_model_path("llama"), "auto", context_size=64)
    assert isinstance(backend, ReferenceBackend)
    assert reason.startswith("reference: CUDA backend unavailable") and "NVIDIA driver" in reason


@no_gpu_only
def test_cuda_requested_without_a_gpu_raises(tiny_model_path) -> None:
    with pytest.raises(device.NoGpuError):
        select_backend(tiny_model_path("llama"), "cuda", context_size=64)


def test_unknown_backend_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        select_backend(tmp_path / "x.gguf", "tpu")


def test_argument_packing_uses_the_kernel_abi() -> None:
    buf = device.Buffer(0x7F00_0000_1000, 64, "x")
    ptrs, values = device._pack_args([buf, None, 3, 2.5, buf.view(16), ctypes.c_uint64(7)])
    assert [type(v) for v in values] == [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_float,
                                         ctypes.c_uint64, ctypes.c_uint64]
    assert values[0].value == buf.ptr and values[1].value == 0 and values[4].value == buf.ptr + 16
    assert ptrs[2] == ctypes.addressof(values[2])
    with pytest.raises(TypeError):
        device._pack_args(["not an argument"])


def test_views_stay_inside_their_buffer() -> None:
    buf = device.Buffer(4096, 256, "x")
    assert buf.view(64, 32).ptr == 4160 and buf.view(64).nbytes == 192
    with pytest.raises(AssertionError):
        buf.view(200, 100)


def _c_struct(file: str, name: str) -> list[tuple[str, str]]:
    """(field, kind) of a struct in a kernel file: kind "ptr", "int" or "float"."""
    source = (nvrtc.KERNEL_DIR / file).read_text()
    body = re.search(r"struct " + name + r" \{(.*?)\};", source, re.S).group(1)
    fields = []
    for decl in re.findall(r"^\s*([^/;]+);", body, re.M):
        ctype, names = re.match(r"(const \w+\*|\w+\*|\w+)\s+(.*)", decl.strip()).groups()
        fields += [(n.strip(), "ptr" if "*" in ctype else ctype) for n in names.split(",")]
    return fields


@pytest.mark.parametrize("file, struct", [("attention.cuh", mixers.AttnArgs), ("attention.cu", mixers.QkPrep),
                                          ("deltanet.cu", mixers.GdnArgs), ("deltanet.cu", mixers.GdnLayer),
                                          ("deltanet_chunked.cu", mixers.GdnChunkArgs), ("act.cu", ops.ActSrc)],
                         ids=lambda v: getattr(v, "__name__", v))
def test_structs_passed_by_value_mirror_the_kernels(file: str, struct) -> None:
    """The ctypes struct passed by value has the C struct's fields, in order, with matching types."""
    kinds = {ctypes.c_uint64: "ptr", ctypes.c_int32: "int", ctypes.c_float: "float"}
    assert [(name, kinds[t]) for name, t in struct._fields_] == _c_struct(file, struct.__name__)


def test_dispatch_names_existing_instances_for_every_weight_type() -> None:
    assert set(ops.DISPATCH.values()) <= set(instances.INSTANCES)
    for qtype in instances.MATMUL_QTYPES + (Q.F32,):
        assert ("mmvq", qtype) in ops.DISPATCH
    for qtype in instances.EMBED_QTYPES:
        assert ops.DISPATCH[("get_rows", qtype)] == f"get_rows_{instances.qtype_tag(qtype)}"
    assert instances.qtype_tag(Q.Q4_K) == "q4_K" and instances.qtype_tag(Q.Q8_0) == "q8_0"


def test_attention_tiles_and_splits() -> None:
    assert mixers.attn_tile_tokens(24, 4, 256) == 8  # 6 query heads per KV head, 48 queries per block
    assert mixers.attn_tile_tokens(14, 2, 64) == 9
    with pytest.raises(ValueError, match="head size 96"):
        mixers.attn_tile_tokens(8, 8, 96)
    assert mixers.attn_splits(1, 4, 8, 132) == mixers.MAX_SPLITS
    assert mixers.attn_splits(2048, 4, 8, 132) == 1


def test_decode_attention_spreads_a_tokens_queries_over_the_warps() -> None:
    """Up to 8 tokens: the narrowest instance whose 4 warps hold one token's query heads (27B: 6 in 3 warps)."""
    assert mixers.attn_qpw(24, 4, 256, 1) == 2 and mixers.attn_tile_tokens(24, 4, 256, 1) == 1
    assert mixers.attn_qpw(24, 4, 256, 8) == 2
    assert mixers.attn_qpw(24, 4, 256, 9) == 12 and mixers.attn_qpw(24, 4, 256) == 12  # longer: the wide one
    assert mixers.attn_qpw(8, 8, 128, 1) == 1 and mixers.attn_tile_tokens(8, 8, 128, 5) == 4
    assert mixers.attn_qpw(32, 2, 64, 1) == 4  # 16 query heads a KV head
    assert mixers.attn_qpw(64, 2, 64, 1) == 16  # 32: no narrow instance holds them, the wide one does
    for head_dim in instances.ATTN_HEAD_DIMS:
        for qpw in instances.ATTN_DECODE_QPW:
            assert f"attn_d{head_dim}_q{qpw}" in instances.INSTANCES


def test_mmvq_warps_divide_the_superblocks() -> None:
    assert ops._mmvq_warps(5120) == 5  # 20 superblocks: 5 warps of 4
    assert ops._mmvq_warps(17408) == 4  # 68 = 4 x 17
    assert ops._mmvq_warps(256) == 1


def test_decode_attention_asks_for_shared_memory_for_the_keys_it_copies_before_its_wait(monkeypatch) -> None:
    """With ATTN_PRE the narrow instances (decode and verify) take their _pre form, which stages ATTN_PRE_KEYS keys and
    values of earlier passes (f16 rows at a pitch of D + 8, kernels/attention.cu ATTN_PRE_PITCH) beside its queries;
    the wide one (a long run) never does."""
    monkeypatch.delenv(mixers.ATTN_PRE_ENV, raising=False)
    assert mixers._attn_pre_default()  # on by default since Z19's H100 run
    monkeypatch.setenv(mixers.ATTN_PRE_ENV, "0")
    assert not mixers._attn_pre_default()
    launches: list[tuple[str, int]] = []
    dev = SimpleNamespace(info=SimpleNamespace(max_smem_per_block=227 * 1024),
                          kernel=lambda name: SimpleNamespace(name=name), set_max_dynamic_smem=lambda k, n: None,
                          launch=lambda k, grid, block, args, smem=0: launches.append((k.name, smem)))
    buf = Buffer(0x10000, 1 << 24, "buf")
    src = (nvrtc.KERNEL_DIR / "attention.cu").read_text()
    assert "#define ATTN_PRE_PITCH(D) ((D) + 8)" in src and instances.ATTN_PRE_KEYS == 32
    assert all(instances.INSTANCES[f"attn_d{d}_q{n}_pre"].expr == f"attn<{d}, {n}, 32>" and
               instances.INSTANCES[f"attn_d{d}_q{n}"].expr == f"attn<{d}, {n}, 0>"
               for d in instances.ATTN_HEAD_DIMS for n in instances.ATTN_DECODE_QPW)
    for pre, launched in ((True, ("attn_d256_q2_pre", 4 * 2 * 256 * 4 + 2 * 32 * 264 * 2)),
                          (False, ("attn_d256_q2", 4 * 2 * 256 * 4))):
        monkeypatch.setattr(mixers, "ATTN_PRE", pre)
        mixers.attention(dev, buf, buf, buf, buf, buf, 1, 24, 4, 256, 4096, 12288, 512, 6144, 0.0625, scratch=buf,
                         splits=64)
        assert launches == [launched, ("attn_combine", 0)]
        launches.clear()
    monkeypatch.setattr(mixers, "ATTN_PRE", True)
    mixers.attention(dev, buf, buf, buf, buf, buf, 12, 8, 8, 32, 4096, 256, 32, 256, 0.125)  # no mma at D = 32
    assert launches == [("attn_d32", 4 * 16 * 32 * 4)]
