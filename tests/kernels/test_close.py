"""Host-side rules of the closers (kernels/act8_close.cuh, engine/cuda/ops.py Closer): when a one-token matmul
forms the next matmul's int8 input behind itself, what its launch hands the kernel against the kernel's struct,
and which launches the FFN of a one-token pass makes with them. The kernel itself is checked on the GPU
(bench/gpu_close.py: against the producer launched apart and the float64 reference)."""

from __future__ import annotations

import re
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import closers, i8b, instances, nvrtc, ops, q6b, tma
from engine.cuda.memory import Buffer
from engine.cuda.model import CudaModel
from engine.cuda.weights import Part, Projection

H, FFN = 5120, 17408


class _Dev:
    """What the launchers ask of a device, launches recorded as (kernel name, args)."""

    def __init__(self, arch: int = 90) -> None:
        self.info = SimpleNamespace(name="NVIDIA H100 80GB HBM3",
                                    arch=arch, max_smem_per_block=232448, multiprocessors=132)
        self.launches: list[tuple[str, list]] = []
        self.grids: list[tuple[str, object, int]] = []  # (kernel name, grid, block) of each launch
        self.filled: list[tuple[Buffer, int]] = []

    def kernel(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(name=name)

    def set_max_dynamic_smem(self, kernel, nbytes: int) -> None:
        pass

    def launch(self, kernel, grid, block, args, smem: int = 0) -> None:
        self.launches.append((kernel.name, args))
        self.grids.append((kernel.name, grid, block))

    def alloc(self, nbytes: int, what: str) -> Buffer:
        return Buffer(0x7000_0000, nbytes, what)

    def fill_u32(self, buf: Buffer, value: int) -> None:
        self.filled.append((buf, value))

    def join(self) -> None:
        pass

    @contextmanager
    def beside(self):
        yield


_next = [0x1000_0000]


def _buf(nbytes: int = 1 << 20, what: str = "", align: int = 256) -> Buffer:
    ptr = _next[0]
    _next[0] += -(-nbytes // align) * align + align
    return Buffer(ptr, nbytes, what)


def _weight(qtype: Q, rows: int, cols: int, name: str = "w") -> ops.DeviceWeight:
    return ops.DeviceWeight(_buf(what=name), qtype, rows, cols, name)


def _act(width: int, i8_tokens: int = 0, int8: bool = True) -> ops.Act:
    act = ops.Act(_buf(), _buf(), _buf(), width, width, 8, _buf(), _buf(), i8_tokens=i8_tokens)
    if int8:
        act.q8, act.scale8, act.sums8, act.sums8_lo = _buf(), _buf(), _buf(), _buf()
    return act


@pytest.fixture
def closing(monkeypatch):
    """Closers on, with the int8 matmuls and their defaults that the pass runs with."""
    monkeypatch.setattr(i8b, "CLOSE", True)
    monkeypatch.setattr(i8b, "ON", True)
    monkeypatch.setattr(i8b, "FUSE", False)
    monkeypatch.setattr(i8b, "SHAPE", i8b.DEFAULT_SHAPE)
    monkeypatch.setattr(i8b, "MAX_SUPERBLOCKS", 24)  # ffn_down's Q4_K on mmvq_i8, as Z1-Z2 measured the closers
    monkeypatch.setattr(ops, "I8_MATMUL", True)
    monkeypatch.setattr(ops, "Q6_I8", True)
    monkeypatch.setattr(ops, "Q6_I8_COUNTS", ops.DEFAULT_Q6_I8_COUNTS)
    monkeypatch.setattr(q6b, "ON", False)  # (the one-token Q6_K launches with no closer on mmvq_q6_i8, as closed)
    monkeypatch.setattr(ops, "Q8_I8", False)
    monkeypatch.setattr(ops, "I8_TILES", 1)
    monkeypatch.setattr(i8b, "quant_map", lambda w: tma.TensorMap())  # the driver encodes it on the GPU


def _norm_closer(dev, mix_out, consumers, num_tokens=1, act=None, norm=None, x=None):
    norm = _buf(4 * H) if norm is None else norm
    return closers.closer_for(dev, mix_out, num_tokens, "rmsnorm", act or _act(H), consumers, _buf(), norm, 1e-6,
                              x=x)


def test_the_ffn_norm_closes_behind_a_q4k_output_projection_only_where_every_consumer_reads_int8(closing) -> None:
    dev, mix_out, gate_up = _Dev(), _weight(Q.Q4_K, H, 6144), _weight(Q.Q4_K, 2 * FFN, H)
    closer = _norm_closer(dev, mix_out, [gate_up])
    assert closer is not None and closer.mode == "rmsnorm" and closer.eps == 1e-6
    assert _norm_closer(dev, mix_out, [gate_up, _weight(Q.Q4_K, 1024, H)]) is not None
    assert _norm_closer(dev, mix_out, [gate_up, _weight(Q.Q8_0, 96, H)]) is None  # DeltaNet's gates read f16
    assert _norm_closer(dev, mix_out, [_weight(Q.F32, 1024, H)]) is None  # the f32 rows, which it never writes
    assert _norm_closer(dev, mix_out, [_weight(Q.Q4_K, 1024, 4096)]) is None  # another width
    assert _norm_closer(dev, mix_out, [gate_up], num_tokens=9) is None  # past one token group
    assert _norm_closer(dev, _weight(Q.Q5_K, H, 6144), [gate_up]) is None  # on the f16 kernels
    assert _norm_closer(dev, _weight(Q.Q4_K, 4096, 6144), [gate_up]) is None  # rows != the norm's width
    assert closers.closing_kernel(_Dev(89), mix_out, 1, "rmsnorm") == "i8"  # no tensor copies: mmvq_i8 closes it
    assert _norm_closer(dev, mix_out, [gate_up], act=_act(H, int8=False)) is None
    assert _norm_closer(dev, mix_out, [gate_up], norm=Buffer(_buf().ptr + 8, 4 * H)) is None  # float4 loads
    assert closers.closer_for(dev, mix_out, 1, "rmsnorm", _act(H), [gate_up], _buf()) is None  # no norm weight


@pytest.mark.parametrize("switch", [(i8b, "CLOSE"), (ops, "I8_MATMUL")])
def test_no_closer_with_a_switch_off(closing, monkeypatch, switch) -> None:
    monkeypatch.setattr(*switch, False)
    assert _norm_closer(_Dev(), _weight(Q.Q4_K, H, 6144), [_weight(Q.Q4_K, 2 * FFN, H)]) is None


def test_each_int8_kernel_closes_only_the_modes_built_into_it(closing, monkeypatch) -> None:
    dev, mix_out = _Dev(), _weight(Q.Q4_K, H, 6144)
    assert closers.closing_kernel(dev, mix_out, 1, "rmsnorm") == "i8b"
    assert closers.closing_kernel(dev, mix_out, 1, "gatednorm") is None
    monkeypatch.setattr(i8b, "ON", False)  # the launch moves to mmvq_i8, which closes both
    assert closers.closing_kernel(dev, mix_out, 1, "rmsnorm") == "i8"
    assert closers.closing_kernel(dev, _weight(Q.Q4_K, 2 * FFN, H), 1, "swiglu") == "i8"
    assert closers.closing_kernel(dev, _weight(Q.Q6_K, H, FFN), 1, "swiglu") is None  # mmvq_q6_i8: the norm only


def test_no_closer_in_a_shape_built_without_them(closing, monkeypatch) -> None:
    other = next(shape for shape in instances.I8B_SHAPES if shape not in instances.I8B_CLOSE_SHAPES)
    monkeypatch.setattr(i8b, "SHAPE", other)
    assert _norm_closer(_Dev(), _weight(Q.Q4_K, H, 6144), [_weight(Q.Q4_K, 2 * FFN, H)]) is None


def test_swiglu_closes_behind_gate_up_where_ffn_down_reads_int8(closing, monkeypatch) -> None:
    dev, gate_up = _Dev(), _weight(Q.Q4_K, 2 * FFN, H)

    def closer(w, down):
        return closers.closer_for(dev, w, 1, "swiglu", _act(FFN), [down], _buf())

    assert closer(gate_up, _weight(Q.Q4_K, H, FFN)).mode == "swiglu"  # mmvq_i8
    assert closer(gate_up, _weight(Q.Q6_K, H, FFN)) is not None  # mmvq_q6_i8
    assert closer(gate_up, _weight(Q.Q5_K, H, FFN)) is None  # the f16 kernels
    assert closer(_weight(Q.Q4_K, FFN, H), _weight(Q.Q4_K, H, FFN)) is None  # the gate rows alone
    monkeypatch.setattr(ops, "Q6_I8", False)
    assert closer(gate_up, _weight(Q.Q6_K, H, FFN)) is None


def test_verify_passes_close_where_the_writer_and_every_consumer_take_int8(closing, monkeypatch) -> None:
    dev, mix_out, gate_up = _Dev(), _weight(Q.Q4_K, H, 6144), _weight(Q.Q4_K, 2 * FFN, H)
    down, x_mix, x_h, x_ffn = _weight(Q.Q4_K, H, FFN), _act(6144), _act(H), _act(FFN)  # precise acts
    expected = {1: "i8b", 2: "i8v", 3: "i8v", 4: "i8v", 5: "i8v", 8: "i8v"}  # gate | up's kernel at each count
    for t, kernel in expected.items():
        assert closers.closing_kernel(dev, mix_out, t, "rmsnorm", x_mix) == kernel
        assert _norm_closer(dev, mix_out, [gate_up], num_tokens=t, x=x_mix) is not None
    # SwiGLU behind gate | up and the input norm behind ffn_down while ffn_down takes int8 (up to 4 tokens)
    for t in (1, 2, 3, 4):
        assert closers.closer_for(dev, gate_up, t, "swiglu", _act(FFN), [down], _buf(), x=x_h) is not None
        assert closers.closing_kernel(dev, down, t, "rmsnorm", x_ffn) == "i8"
    assert closers.closer_for(dev, gate_up, 5, "swiglu", _act(FFN), [down], _buf(), x=x_h) is None  # f16 ffn_down
    assert closers.closing_kernel(dev, down, 5, "rmsnorm", x_ffn) is None  # ffn_down itself on the f16 kernels
    assert closers.closing_kernel(dev, mix_out, 5, "rmsnorm") == "i8v"  # a fast-mode probe: every count on i8v
    monkeypatch.setattr(i8b, "VERIFY_FAST_TOKENS", frozenset({2, 4}))  # fast mode's counts before c077727
    assert closers.closing_kernel(dev, mix_out, 5, "rmsnorm") is None  # 5 tokens on the f16 kernels then


def test_with_int8_at_five_tokens_swiglu_and_the_input_norm_close_there_too(closing, monkeypatch) -> None:
    monkeypatch.setattr(ops, "I8_TOKENS", 5)  # gpu_bench27b's close5
    monkeypatch.setattr(ops, "Q6_I8_COUNTS", frozenset(range(1, 6)))
    dev, gate_up, x_h, x_ffn = _Dev(), _weight(Q.Q4_K, 2 * FFN, H), _act(H), _act(FFN)
    for down in (_weight(Q.Q4_K, H, FFN), _weight(Q.Q6_K, H, FFN)):
        assert closers.closer_for(dev, gate_up, 5, "swiglu", _act(FFN), [down], _buf(), x=x_h) is not None
        attention_in = [_weight(Q.Q4_K, 13312, H), _weight(Q.Q6_K, 1024, H)]
        assert closers.closer_for(dev, down, 5, "rmsnorm", _act(H), attention_in, _buf(), _buf(4 * H), 1e-6,
                                  x=x_ffn) is not None
    assert closers.closing_kernel(dev, _weight(Q.Q4_K, H, FFN), 6, "rmsnorm", x_ffn) is None  # mmvq_i8 stops at 5


def test_the_verify_launch_hands_the_kernel_its_tokens_and_row_stride(closing) -> None:
    dev, mix_out, act_h, scratch = _Dev(), _weight(Q.Q4_K, H, 6144), _act(H), _buf()
    x = _act(6144, i8_tokens=5)
    closer = closers.closer_for(dev, mix_out, 5, "rmsnorm", act_h, [_weight(Q.Q4_K, 2 * FFN, H)], scratch,
                                _buf(4 * H), 1e-6, x=x)
    y = _buf(4 * 8 * 6144)
    ops.matmul(dev, mix_out, x, y, 5, 6144, residual=y, closer=closer)
    ((name, args),) = dev.launches
    assert name == "mmvq_q4_K_i8v_t5_close_rmsnorm"
    assert (args[-2].tokens, args[-2].ld, args[-2].width) == (5, 6144, H) and args[-1] is None  # (y2: whole)
    assert act_h.i8_tokens == 5


def test_the_gated_norm_closes_behind_the_delta_rule(closing, monkeypatch) -> None:
    dev, ssm_out, inner = _Dev(), _weight(Q.Q4_K, H, 6144), 6144
    o, z, norm = _buf(4 * 8 * inner), _buf(4 * 8 * 4 * FFN), _buf(4 * 128)

    def closer(t=1, head=128, z_ld=2 * FFN, consumers=(ssm_out,), act=None):
        return closers.gated_closer_for(dev, t, act or _act(inner), list(consumers), _buf(), o, inner, z, z_ld,
                                        norm, head, 1e-6)

    assert closer().mode == "gatednorm" and closer(t=5) is not None and closer(t=8) is not None
    assert closer(t=9) is None
    assert closer(head=96) is None  # a head size the closer's lanes do not split
    assert closer(z_ld=2 * FFN + 2) is None  # z's rows not 16-byte aligned
    assert closer(consumers=(_weight(Q.Q5_K, H, inner),)) is None  # the f16 kernels
    assert closer(act=_act(inner, int8=False)) is None
    monkeypatch.setattr(i8b, "CLOSE", False)
    assert closer() is None


def _delta_rule_closed_then_committed(dev: _Dev, num_tokens: int):
    """The 27B's delta rule launched with the gated norm's closer (a verify pass), then committing without one;
    returns (act, z, norm)."""
    from engine.cuda import mixers

    act, o, z, norm = _act(6144), _buf(4 * 8 * 6144), _buf(4 * 8 * 4 * FFN), _buf(4 * 128)
    gated = closers.gated_closer_for(dev, num_tokens, act, [_weight(Q.Q4_K, H, 6144)], _buf(), o, 6144, z, 2 * FFN,
                                     norm, 128, 1e-6)
    b = _buf(1 << 22)
    shape = (num_tokens, 16, 48, 128, 128, 2 * 16 * 128, 10240, 6144)
    mixers.gdn_recurrent(dev, b, b, b, b, o, *shape, False, g=b, beta=b, qk_out=b, closer=gated)
    mixers.gdn_recurrent(dev, b, b, b, b, o, *shape, True, g=b, beta=b)
    return act, z, norm


def test_the_delta_rule_launches_its_close_instance(closing) -> None:
    dev = _Dev()
    act, z, norm = _delta_rule_closed_then_committed(dev, 3)
    (first, args), (second, args2) = dev.launches
    assert first == "gdn_k128_close_gatednorm" and second == "gdn_k128_c4"  # the default takes 4 columns a warp
    dst = args[-1]
    assert (dst.x2, dst.w, dst.tokens, dst.ld, dst.ld2, dst.head) == (z.ptr, norm.ptr, 3, 6144, 2 * FFN, 128)
    assert args2[-1].q == 0 and act.i8_tokens == 3


@pytest.mark.parametrize("cols", [4, 8])
def test_the_delta_rule_takes_its_columns_a_warp_but_closes_with_eight(closing, monkeypatch, cols) -> None:
    """mixers.GDN_COLS (OPENJET_CUDA_GDN_COLS): 4 state columns a warp, twice the blocks a head of 8; a launch
    with a closer keeps its 8-column instance (its closer counts 32 warps a superblock)."""
    from engine.cuda import mixers

    monkeypatch.setattr(mixers, "GDN_COLS", cols)
    dev = _Dev()
    _delta_rule_closed_then_committed(dev, 1)
    name = "gdn_k128_c4" if cols == 4 else "gdn_k128"
    assert dev.grids == [("gdn_k128_close_gatednorm", (4, 48), 128), (name, (32 // cols, 48), 128)]
    assert instances.INSTANCES["gdn_k128_c4"].expr == "gdn_recurrent<4, 4, -1, 0>"


def test_the_delta_rules_column_count_comes_from_the_environment_or_is_refused(monkeypatch) -> None:
    from engine.cuda import mixers

    monkeypatch.delenv(mixers.GDN_COLS_ENV, raising=False)
    assert mixers._gdn_cols_default() == 4
    monkeypatch.setenv(mixers.GDN_COLS_ENV, "8")
    assert mixers._gdn_cols_default() == 8
    monkeypatch.setenv(mixers.GDN_COLS_ENV, "6")
    with pytest.raises(ValueError, match="OPENJET_CUDA_GDN_COLS"):
        mixers._gdn_cols_default()


def test_the_scratch_is_zeroed_counters_then_sums() -> None:
    dev = _Dev()
    buf = closers.alloc_close_scratch(dev, H, "scratch")
    nsb = H // 256
    assert closers.close_count_bytes(H) == 96  # nsb + 1 counters, 16-byte aligned
    assert buf.nbytes == 96 + 4 * closers.CLOSE_PART * closers.CLOSE_TOKENS * nsb  # a part per superblock and token
    assert dev.filled == [(buf, 0)]


def test_the_launch_hands_the_kernel_its_closer_and_marks_the_input_written(closing) -> None:
    dev, mix_out, gate_up = _Dev(), _weight(Q.Q4_K, H, 6144), _weight(Q.Q4_K, 2 * FFN, H)
    act_h, scratch, norm = _act(H), _buf(), _buf(4 * H)
    closer = closers.closer_for(dev, mix_out, 1, "rmsnorm", act_h, [gate_up], scratch, norm, 1e-5)
    x, y = _act(6144, i8_tokens=1), _buf(4 * H)
    ops.matmul(dev, mix_out, x, y, 1, H, residual=y, closer=closer)
    ((name, args),) = dev.launches
    assert name == "mmvq_q4_K_i8b_s3n2_close_rmsnorm"
    dst, y2 = args[-2:]  # (the halves' second output last: tests/kernels/test_halves.py)
    assert isinstance(dst, closers.CloseDst) and y2 is None
    assert (dst.w, dst.q, dst.scale, dst.sums, dst.sums_lo) == (norm.ptr, act_h.q8.ptr, act_h.scale8.ptr,
                                                                 act_h.sums8.ptr, act_h.sums8_lo.ptr)
    assert (dst.count, dst.part, dst.width) == (scratch.ptr, scratch.ptr + closers.close_count_bytes(H), H)
    assert dst.eps == pytest.approx(1e-5)
    assert act_h.i8_tokens == 1  # gate | up then take the int8 copy
    assert i8b.runs(dev, gate_up, 1, act_h)


def test_a_producer_in_front_is_launched_apart_even_where_it_would_fuse(closing, monkeypatch) -> None:
    monkeypatch.setattr(i8b, "FUSE", True)
    monkeypatch.setattr(ops, "I8_WARPS_AT", {})
    dev, mix_out = _Dev(), _weight(Q.Q4_K, H, 6144)
    closer = _norm_closer(dev, mix_out, [_weight(Q.Q4_K, 2 * FFN, H)])
    x, y, src = _act(6144), _buf(4 * H), _buf(4 * 6144)
    ops.matmul(dev, mix_out, x, y, 1, H, residual=y, producer=ops.plain_of(src, 6144), closer=closer)
    assert [name for name, _ in dev.launches] == ["act_plain_t1", "mmvq_q4_K_i8b_s3n2_close_rmsnorm"]


def test_a_launch_that_does_not_take_mmvq_i8b_refuses_the_closer(closing) -> None:
    dev, mix_out = _Dev(), _weight(Q.Q4_K, H, 6144)
    closer = _norm_closer(dev, mix_out, [_weight(Q.Q4_K, 2 * FFN, H)])
    with pytest.raises(AssertionError, match="no closer of rmsnorm"):
        ops.matmul(dev, mix_out, _act(6144, i8_tokens=0), _buf(4 * H), 1, H, closer=closer)  # no int8 copy
    with pytest.raises(AssertionError, match="16 bytes"):
        ops.matmul(dev, mix_out, _act(6144, i8_tokens=1), Buffer(_buf().ptr + 4, 4 * H), 1, H, closer=closer)


def _input_norm_closer(dev, down, consumers):
    return closers.closer_for(dev, down, 1, "rmsnorm", _act(H), consumers, _buf(), _buf(4 * H), 1e-6)


def test_the_next_input_norm_closes_behind_ffn_down_of_either_type(closing, monkeypatch) -> None:
    dev = _Dev()
    attention_in = [_weight(Q.Q4_K, 13312, H), _weight(Q.Q6_K, 1024, H)]  # q | k, then v
    deltanet_in = [_weight(Q.Q4_K, 16384, H), _weight(Q.Q8_0, 96, H)]  # qkv | gate, then alpha | beta
    for down, kernel in ((_weight(Q.Q4_K, H, FFN), "i8"), (_weight(Q.Q6_K, H, FFN), "i8q6")):
        assert closers.closing_kernel(dev, down, 1, "rmsnorm") == kernel
        assert closers.closer_for(dev, down, 1, "swiglu", _act(H), attention_in, _buf()) is None  # rows != 2 x width
        assert _input_norm_closer(dev, down, attention_in) is not None
        assert _input_norm_closer(dev, down, deltanet_in) is None  # the gates read the f16 form
    monkeypatch.setattr(ops, "Q8_I8", True)
    assert _input_norm_closer(dev, _weight(Q.Q4_K, H, FFN), deltanet_in) is not None
    monkeypatch.setattr(ops, "I8_TILES", 2)  # mmvq_i8 walking two tiles a block: no closer instance
    assert closers.closing_kernel(dev, _weight(Q.Q4_K, H, FFN), 1, "rmsnorm") is None


@pytest.mark.parametrize("qtype, name", [(Q.Q4_K, "mmvq_q4_K_i8_t1_close_rmsnorm"),
                                         (Q.Q6_K, "mmvq_q6_K_i8_t1_close_rmsnorm")])
def test_ffn_down_launches_its_close_instance_with_the_closer(closing, qtype: Q, name: str) -> None:
    dev, down, act_h, scratch = _Dev(), _weight(qtype, H, FFN), _act(H), _buf()
    closer = closers.closer_for(dev, down, 1, "rmsnorm", act_h, [_weight(Q.Q4_K, 13312, H)], scratch, _buf(4 * H),
                                1e-6)
    x, y = _act(FFN, i8_tokens=1), _buf(4 * H)
    ops.matmul(dev, down, x, y, 1, H, residual=y, closer=closer)
    ((launched, args),) = dev.launches
    assert launched == name
    close, y2 = args[-2:]  # (the halves' second output last: tests/kernels/test_halves.py)
    assert (close.q, close.count, close.width, y2) == (act_h.q8.ptr, scratch.ptr, H, None)
    assert act_h.i8_tokens == 1
    dev.launches.clear()
    ops.matmul(dev, down, x, y, 1, H, residual=y)  # without: the plain instance, a zero closer
    ((launched, args),) = dev.launches
    assert launched == name.removesuffix("_close_rmsnorm") and args[-2].q == 0


def test_q8_0_takes_the_int8_kernel_for_up_to_a_token_group_of_an_int8_copy(closing, monkeypatch) -> None:
    gates = _weight(Q.Q8_0, 96, H)
    assert not ops.q8_i8_runs(gates, 1, _act(H, i8_tokens=1))  # off by default
    monkeypatch.setattr(ops, "Q8_I8", True)
    assert ops.q8_i8_runs(gates, 1, _act(H, i8_tokens=1))
    assert not ops.q8_i8_runs(gates, 1, _act(H, i8_tokens=0))  # no int8 copy written
    assert ops.q8_i8_runs(gates, 8, _act(H, i8_tokens=8))
    assert not ops.q8_i8_runs(gates, 9, _act(H, i8_tokens=9))  # one token group
    assert not ops.q8_i8_runs(gates, 3, _act(H, i8_tokens=2))  # the copy holds fewer tokens than the launch
    assert not ops.q8_i8_runs(_weight(Q.Q4_0, 96, H), 1, _act(H, i8_tokens=1))
    dev, y = _Dev(), _buf(4 * 8 * 16480)
    ops.matmul(dev, gates, _act(H, i8_tokens=3), y, 3, 16480)
    ((name, args),) = dev.launches
    assert name == "mmvq_q8_0_i8" and args[-2:] == [3, 16480]  # tokens, row stride
    monkeypatch.setattr(ops, "I8_MATMUL", False)
    assert not ops.q8_i8_runs(gates, 1, _act(H, i8_tokens=1))


def _model(down_qtype: Q = Q.Q4_K) -> tuple[CudaModel, SimpleNamespace]:
    """A CudaModel with a recording device and the 27B FFN's shapes: enough for _ffn and its closers."""
    model = CudaModel.__new__(CudaModel)
    model.dev = _Dev()
    model.cfg = SimpleNamespace(hidden_size=H, ffn_size=FFN, rms_eps=1e-6, arch="qwen35")
    model.ws = SimpleNamespace(act_h=_act(H), act_ffn=_act(FFN), act_q=_act(6144), act_inner=_act(6144),
                               close_h=_buf(), close_ffn=_buf(),
                               proj=_buf(4 * 8 * 2 * FFN), x=_buf(4 * 8 * H), xn=_buf(4 * 8 * H),
                               ffn=_buf(4 * 8 * FFN), proj_width=2 * FFN)
    gate_up = _weight(Q.Q4_K, 2 * FFN, H, "gate|up")
    lw = SimpleNamespace(kind="deltanet",
                         ffn_in=Projection([Part(gate_up, None, 0)], 2 * FFN, {"ffn_gate": 0, "ffn_up": FFN}),
                         ffn_down=_weight(down_qtype, H, FFN, "ffn_down"), mix_out=_weight(Q.Q4_K, H, 6144, "ssm_out"),
                         vectors={"post_attention_norm": _buf(4 * H)})
    return model, lw


def _ffn_launches(monkeypatch, model, lw, num_tokens: int, norm_closed: bool) -> list[tuple]:
    seen = []
    monkeypatch.setattr(ops, "matmul", lambda dev, w, act, y, t, ld, producer=None, closer=None, **k: seen.append(
        (w.name, producer and producer.mode, closer and closer.mode)))
    monkeypatch.setattr(ops, "act_swiglu", lambda *a, **k: seen.append(("act_swiglu",)))
    model._ffn(lw, num_tokens, norm_closed=norm_closed)
    return seen


def test_a_one_token_ffn_with_both_closers_launches_no_producer(closing, monkeypatch) -> None:
    model, lw = _model()
    assert model._ffn_norm_closer(lw, 1).mode == "rmsnorm"
    assert _ffn_launches(monkeypatch, model, lw, 1, norm_closed=True) == [
        ("gate|up", None, "swiglu"), ("ffn_down", None, None)]


def test_a_five_token_ffn_keeps_swiglu_and_closers_off_keep_every_producer(closing, monkeypatch) -> None:
    model, lw = _model()
    assert model._ffn_norm_closer(lw, 5) is not None  # gate | up on mmvq_i8v reads the int8 copy
    assert _ffn_launches(monkeypatch, model, lw, 5, norm_closed=True) == [  # ffn_down on f16 at 5 tokens
        ("gate|up", None, None), ("act_swiglu",), ("ffn_down", None, None)]
    monkeypatch.setattr(i8b, "CLOSE", False)
    assert model._ffn_norm_closer(lw, 1) is None
    assert _ffn_launches(monkeypatch, model, lw, 1, norm_closed=False) == [
        ("gate|up", "rmsnorm", None), ("act_swiglu",), ("ffn_down", None, None)]


def test_swiglu_stays_a_launch_where_gate_and_up_are_not_one_launch_in_order(closing, monkeypatch) -> None:
    model, lw = _model()
    lw.ffn_in.offsets = {"ffn_up": 0, "ffn_gate": FFN}  # up rows first
    assert _ffn_launches(monkeypatch, model, lw, 1, norm_closed=True) == [
        ("gate|up", None, None), ("act_swiglu",), ("ffn_down", None, None)]


def test_the_launcher_mirrors_the_kernels_struct() -> None:
    src = (nvrtc.KERNEL_DIR / "act8_close.cuh").read_text()
    body = re.search(r"struct Act8Close \{(.*?)\};", src, re.S).group(1)
    fields = re.findall(r"\b(\w+);", re.sub(r"//[^\n]*", "", body))
    assert fields == [name for name, _ in closers.CloseDst._fields_]
    assert int(re.search(r"#define CLOSE_PART (\d+)", src).group(1)) == closers.CLOSE_PART
    assert int(re.search(r"#define CLOSE_TOKENS (\d+)", src).group(1)) == closers.CLOSE_TOKENS
    for file in ("mmvq_i8b", "mmvq_i8", "mmvq_i8q6", "mmvq_i8v"):  # the launchers' last argument (or before y2)
        assert re.search(r"int rows, int K,(\s*int ld_?y,)?\s*const Act8Close close(, float\* __restrict__ y2)?\)",
                         (nvrtc.KERNEL_DIR / f"{file}.cu").read_text()), file
    assert "gdn_recurrent(GdnArgs p, const Act8Close close)" in (nvrtc.KERNEL_DIR / "deltanet.cu").read_text()
    assert "attn_combine(AttnArgs a, int splits, int D, const Act8Close close)" in \
        (nvrtc.KERNEL_DIR / "attention.cu").read_text()
    q8 = (nvrtc.KERNEL_DIR / "mmvq_i8q8.cu").read_text()
    assert int(re.search(r"#define I8Q8_WARPS (\d+)", q8).group(1)) == ops.Q8_I8_WARPS


def test_each_close_mode_has_an_instance_of_the_producers_number() -> None:
    numbers = {name.lower(): int(v) for name, v in
               re.findall(r"#define ACT_(\w+) (\d+)", (nvrtc.KERNEL_DIR / "act8.cuh").read_text())}
    ins, stages, (vs, vn) = instances, instances.ACT_STAGES, instances.I8V_SHAPE
    expected = {f"mmvq_q4_K_i8b_s{s}n{n}_close_{m}": f"mmvq_i8b<{s}, {n}, -1, {numbers[m]}>"
                for s, n in ins.I8B_CLOSE_SHAPES for m in ins.I8B_CLOSE_MODES}
    expected |= {f"mmvq_q4_K_i8_t{t}_close_{m}": f"mmvq_i8<{t}, {stages}, 1, {numbers[m]}>"
                 for t in ins.I8_CLOSE_TOKENS for m in ins.I8_CLOSE_MODES}
    expected |= {f"mmvq_q6_K_i8_t{t}_close_{m}": f"mmvq_q6_i8<{t}, {stages}, {numbers[m]}>"
                 for t in ins.I8_CLOSE_TOKENS for m in ins.Q6_I8_CLOSE_MODES}
    expected |= {f"mmvq_q4_K_i8v_t{t}_close_{m}": f"mmvq_i8v<{t}, {vs}, {vn}, {numbers[m]}>"
                 for t in ins.I8V_TOKENS for m in ins.I8V_CLOSE_MODES}
    expected |= {f"gdn_k{d}_close_gatednorm": f"gdn_recurrent<{d // 32}, 8, {numbers['gatednorm']}, 0>"
                 for d in ins.GDN_KEY_DIMS}
    expected |= {"attn_combine_close_plain": f"attn_combine<{numbers['plain']}>", "attn_combine": "attn_combine<-1>"}
    assert {name: ins.INSTANCES[name].expr for name in expected} == expected
    assert i8b.DEFAULT_SHAPE in instances.I8B_CLOSE_SHAPES


def test_a_one_token_layers_input_norm_closes_behind_the_ffn_down_before_it(closing, monkeypatch) -> None:
    model, before = _model()
    model.ws.close_in = _buf()
    lw = SimpleNamespace(mix_in=Projection([Part(_weight(Q.Q4_K, 16384, H), None, 0),
                                            Part(_weight(Q.Q8_0, 96, H), None, 16384)], 16480),
                         vectors={"attn_norm": _buf(4 * H)})
    assert model._input_norm_closer(lw, before, 1) is None  # a DeltaNet layer: its gates on the f16 kernel
    monkeypatch.setattr(ops, "Q8_I8", True)
    closer = model._input_norm_closer(lw, before, 1)
    assert closer.act is model.ws.act_h and closer.w is lw.vectors["attn_norm"] and closer.scratch is model.ws.close_in
    assert model._input_norm_closer(lw, before, 4) is not None  # ffn_down on mmvq_i8 up to 4 tokens
    assert model._input_norm_closer(lw, before, 5) is None  # then on the f16 kernels



def _deltanet_model() -> tuple[CudaModel, SimpleNamespace]:
    """A CudaModel with the 27B's DeltaNet shapes and a recording device: enough for _deltanet."""
    model = CudaModel.__new__(CudaModel)
    model.dev = _Dev()
    inner, width = 6144, 16480
    model.cfg = SimpleNamespace(hidden_size=H, rms_eps=1e-6, ssm_conv_dim=10240, ssm_num_k_heads=16,
                                ssm_num_v_heads=48, ssm_head_dim=128, ssm_v_head_dim=128, ssm_inner_size=inner,
                                ssm_conv_kernel=4)
    model.ws = SimpleNamespace(act_h=_act(H), act_inner=_act(inner), close_inner=_buf(), proj_width=width,
                               proj=_buf(4 * 8 * width), conv_out=_buf(), mix=_buf(4 * 8 * inner),
                               mix2=_buf(4 * 8 * inner), x=_buf(4 * 8 * H), g=_buf(), beta=_buf(), gdn_chunked=True)
    model.deltanet = {0: SimpleNamespace(window=_buf(), conv_out=_buf(), qk_norm=_buf(), g=_buf(), beta=_buf(),
                                         ssm=_buf())}
    offsets = {"attn_qkv": 0, "attn_gate": 10240, "ssm_beta": 16384, "ssm_alpha": 16432}
    lw = SimpleNamespace(mix_in=Projection([Part(_weight(Q.Q4_K, 16384, H, "qkv|gate"), None, 0),
                                            Part(_weight(Q.Q8_0, 96, H, "beta|alpha"), None, 16384)], width, offsets),
                         mix_out=_weight(Q.Q4_K, H, inner, "ssm_out"),
                         vectors={k: _buf(4 * 128) for k in ("ssm_conv1d", "ssm_a", "ssm_dt.bias", "ssm_norm")})
    return model, lw


def _deltanet_launches(monkeypatch, model, lw, num_tokens: int) -> list[tuple]:
    from engine.cuda import mixers

    seen = []
    monkeypatch.setattr(ops, "matmul", lambda dev, w, act, y, t, ld, producer=None, closer=None, **k: seen.append(
        (w.name, producer and producer.mode, closer and closer.mode)))
    monkeypatch.setattr(mixers, "conv1d_silu", lambda *a, **k: None)
    monkeypatch.setattr(mixers, "gdn_recurrent", lambda *a, closer=None, **k: seen.append(
        ("gdn", closer and closer.mode)))
    model._deltanet(0, lw, num_tokens, False, ops.rmsnorm_of(model.ws.x, _buf(4 * H), H, 1e-6))
    return seen


def test_a_deltanet_layer_forms_its_gated_norm_behind_the_delta_rule(closing, monkeypatch) -> None:
    model, lw = _deltanet_model()
    for t in (1, 5):
        assert _deltanet_launches(monkeypatch, model, lw, t) == [
            ("beta|alpha", None, None), ("qkv|gate", None, None), ("gdn", "gatednorm"), ("ssm_out", None, None)]
    monkeypatch.setattr(i8b, "CLOSE", False)
    assert _deltanet_launches(monkeypatch, model, lw, 1)[2:] == [("gdn", None), ("ssm_out", "gatednorm", None)]


def test_attentions_output_copy_closes_behind_attn_combine_only(closing, monkeypatch) -> None:
    from engine.cuda import mixers

    dev, out_proj, width = _Dev(), _weight(Q.Q4_K, H, 6144), 6144
    out = _buf(4 * 8 * width)

    def closer(t=1, combined=True, d=256, ld=width, consumers=(out_proj,)):
        return closers.plain_closer_for(dev, t, _act(width), list(consumers), _buf(), out, ld, d, combined)

    assert closer().mode == "plain" and closer(t=8, d=128) is not None
    assert closer(combined=False) is None  # one split (attn writes the output) or the prefill mma path
    assert closer(d=96) is None and closer(ld=width + 2) is None and closer(t=9) is None
    assert closer(consumers=(_weight(Q.Q5_K, H, width),)) is None
    plain = closer(t=3)
    b = _buf(1 << 22)
    mixers.attention(dev, b, b, b, b, out, 3, 24, 4, 256, 4096, 24 * 512, 512, width, 0.0625, gate=b,
                     ld_gate=24 * 512, gate_head_stride=512, scratch=_buf(1 << 24), splits=4, closer=plain)
    (attn, _), (combine, args) = dev.launches
    assert combine == "attn_combine_close_plain" and (args[-1].tokens, args[-1].ld) == (3, width)
    assert plain.act.i8_tokens == 3
    with pytest.raises(AssertionError, match="attn_combine"):
        mixers.attention(dev, b, b, b, b, out, 1, 24, 4, 256, 4096, 24 * 512, 512, width, 0.0625, splits=1,
                         closer=closer())


def test_an_attention_layer_closes_its_output_copy_and_its_ffn_norm(closing, monkeypatch) -> None:
    from engine.cuda import mixers

    model = CudaModel.__new__(CudaModel)
    model.dev, model.capacity = _Dev(), 4096
    model.cfg = SimpleNamespace(hidden_size=H, rms_eps=1e-6, head_dim=256, num_heads=24, num_kv_heads=4, q_size=6144,
                                has_attn_gate=True, rope_dim=64, rope_theta=1e7, rope_neox=True)
    width = 13312 + 1024
    model.ws = SimpleNamespace(act_h=_act(H), act_q=_act(6144), close_q=_buf(), proj_width=width,
                               proj=_buf(4 * 8 * width), mix2=_buf(4 * 8 * 6144), x=_buf(4 * 8 * H),
                               attn_scratch=_buf(1 << 24))
    lw = SimpleNamespace(mix_in=Projection([Part(_weight(Q.Q4_K, 13312, H, "q|k"), None, 0),
                                            Part(_weight(Q.Q6_K, 1024, H, "v"), None, 13312)], width,
                                           {"attn_q": 0, "attn_k": 12288, "attn_v": 13312}),
                         mix_out=_weight(Q.Q4_K, H, 6144, "attn_output"), vectors={})
    seen = []
    monkeypatch.setattr(ops, "matmul", lambda dev, w, act, y, t, ld, producer=None, closer=None, **k: seen.append(
        (w.name, producer and producer.mode, closer and closer.mode)))
    monkeypatch.setattr(mixers, "qk_prep", lambda *a, **k: None)
    monkeypatch.setattr(mixers, "attention", lambda *a, closer=None, **k: seen.append(("attention",
                                                                                       closer and closer.mode)))
    kv = SimpleNamespace(k=_buf(), v=_buf())
    ffn_norm = closers.Closer("rmsnorm", model.ws.act_h, _buf(), _buf(4 * H))
    model._attention(lw, kv, 1, _buf(), None, ffn_norm)
    assert seen[-2:] == [("attention", "plain"), ("attn_output", None, "rmsnorm")]
    monkeypatch.setattr(i8b, "CLOSE", False)
    seen.clear()
    model._attention(lw, kv, 1, _buf(), None, None)
    assert seen[-2:] == [("attention", None), ("attn_output", "plain", None)]
