"""The causal conv inside the delta rule (kernels/deltanet.cu TAPS, mixers.GdnConv): which passes take it, what
its launch hands the kernel, and that its instance keeps the 27B's grid in one wave. The arithmetic is checked on
the GPU (bench/gpu_mixers.py check_delta_rule_conv: against ops.causal_conv1d and ops.gated_delta_rule, then the
accept path on what the pass left)."""

from __future__ import annotations

import re

import pytest

from engine.cuda import instances, mixers, nvrtc, ops
from tests.kernels.ptxas import usage
from tests.kernels.recording import RecordingDev as _Dev
from tests.kernels.recording import buf as _buf
from tests.kernels.recording import deltanet_model as _deltanet_model

HV, DK, C = 48, 128, 10240  # the 27B's DeltaNet: value heads, head size, conv channels


def _layer_launches(monkeypatch, num_tokens: int, commit: bool) -> tuple[list[tuple], object, object]:
    """The mixer launches of one 27B DeltaNet layer (matmuls recorded by name), and the model and layer."""
    model, lw = _deltanet_model()
    seen = []
    monkeypatch.setattr(ops, "matmul", lambda dev, w, *a, **k: seen.append((w.name,)))
    real_conv, real_rule = mixers.conv1d_silu, mixers.gdn_recurrent
    monkeypatch.setattr(mixers, "conv1d_silu", lambda *a, **k: (seen.append(("conv1d_silu",)), real_conv(*a, **k)))
    monkeypatch.setattr(mixers, "gdn_recurrent", lambda *a, **k: (seen.append(("gdn", k.get("conv"))),
                                                                   real_rule(*a, **k)))
    model._deltanet(0, lw, num_tokens, commit, None)
    return seen, model, lw


@pytest.mark.parametrize("num_tokens", [1, 5, 8])
def test_a_verify_pass_convolves_inside_the_rule(monkeypatch, num_tokens) -> None:
    seen, model, lw = _layer_launches(monkeypatch, num_tokens, commit=False)
    layer = model.deltanet[0]
    assert [s[0] for s in seen] == ["beta|alpha", "qkv|gate", "gdn", "ssm_out"]  # no conv1d_silu launch
    conv = seen[2][1]
    assert (conv.window, conv.weight, conv.out, conv.channels) == (layer.window, lw.vectors["ssm_conv1d"],
                                                                   layer.conv_out, C)
    (name, grid, block), args = model.dev.grids[-1], model.dev.launches[-1][1][0]
    assert (name, grid, block) == ("gdn_k128_c4_conv", (8, HV), 128)
    proj, width = model.ws.proj.ptr, model.ws.proj_width
    # the raw projections at the model's stride, the conv's buffers, the saved inputs of the accept path
    assert (args.q, args.k, args.v, args.ld_qk, args.ld_v) == (proj, proj + 4 * 2048, proj + 8 * 2048, width, width)
    assert (args.conv_w, args.window, args.conv_out, args.C) == (lw.vectors["ssm_conv1d"].ptr, layer.window.ptr,
                                                                 layer.conv_out.ptr, C)
    assert (args.commit, args.save, args.prepared, args.qk_out) == (0, 1, 0, layer.qk_norm.ptr)
    assert args.T == num_tokens


def test_a_committing_pass_and_the_switch_launch_the_conv_apart(monkeypatch) -> None:
    seen, model, _ = _layer_launches(monkeypatch, 1, commit=True)
    assert [s[0] for s in seen] == ["beta|alpha", "qkv|gate", "conv1d_silu", "gdn", "ssm_out"]
    names = [g[0] for g in model.dev.grids]
    assert seen[3][1] is None and names == ["conv1d_silu", "conv_commit", "gdn_k128_c4"]  # matmuls recorded apart
    monkeypatch.setattr(mixers, "GDN_CONV", False)
    seen, model, _ = _layer_launches(monkeypatch, 5, commit=False)
    assert [s[0] for s in seen] == ["beta|alpha", "qkv|gate", "conv1d_silu", "gdn", "ssm_out"]
    assert model.dev.launches[-1][1][0].conv_w == 0
    monkeypatch.setattr(mixers, "GDN_CONV", True)
    monkeypatch.setattr(mixers, "GDN_COLS", 8)  # the conv instances have 4 columns a warp
    seen, _, _ = _layer_launches(monkeypatch, 5, commit=False)
    assert ("conv1d_silu",) in seen


def test_the_conv_inside_takes_only_what_it_was_built_for() -> None:
    assert all(mixers.gdn_conv_runs(t, 4, commit=False) for t in range(1, 9))
    assert not mixers.gdn_conv_runs(9, 4, commit=False)  # past the tokens one launch stages
    assert not mixers.gdn_conv_runs(1, 4, commit=True)  # the committed state rows would race between blocks
    assert not mixers.gdn_conv_runs(1, 3, commit=False)  # the instances convolve with 4 taps
    dev, b = _Dev(), _buf(1 << 22)
    conv = mixers.GdnConv(b, b, b, C)
    shape = (1, 16, HV, DK, DK, C, C, 6144)
    with pytest.raises(ValueError, match="non-committing"):
        mixers.gdn_recurrent(dev, b, b, b, b, b, *shape, True, g=b, beta=b, alpha=b, b=b, a=b, dt_bias=b, conv=conv)
    with pytest.raises(ValueError, match="non-committing"):  # prepared inputs were convolved already
        mixers.gdn_recurrent(dev, b, b, b, b, b, *shape, False, g=b, beta=b, conv=conv)
    with pytest.raises(ValueError, match="at most 8"):
        mixers.gdn_recurrent(dev, b, b, b, b, b, 9, *shape[1:], False, g=b, beta=b, alpha=b, b=b, a=b, dt_bias=b,
                             conv=conv)
    odd = mixers.GdnConv(b, b.view(4), b, C)
    with pytest.raises(ValueError, match="16-byte"):
        mixers.gdn_recurrent(dev, b, b, b, b, b, *shape, False, g=b, beta=b, alpha=b, b=b, a=b, dt_bias=b, conv=odd)
    assert dev.launches == []


def test_the_conv_instance_keeps_the_27b_rule_in_one_wave() -> None:
    """The 27B's rule is 8 x 48 = 384 blocks of 128 threads: on 132 SMs, three blocks an SM. The conv's history
    and weights must leave each thread few enough registers for three (65,536 an SM), and spill nothing."""
    assert instances.INSTANCES["gdn_k128_c4_conv"].expr == f"gdn_recurrent<4, 4, {instances.GDN_CONV_TAPS}>"
    found = usage("deltanet")
    conv, plain = found["gdn_k128_c4_conv"], found["gdn_k128_c4"]
    assert conv.spill_bytes == 0 and 3 * 128 * conv.registers <= 65536
    # every token staged: q | k rows, the block's 16 v columns, alpha | b
    assert conv.static_smem == 4 * mixers.GDN_CONV_MAX_TOKENS * (2 * DK + 16 + 2) and plain.static_smem == 0


def test_the_staged_token_count_is_the_kernels() -> None:
    source = (nvrtc.KERNEL_DIR / "deltanet.cu").read_text()
    assert int(re.search(r"#define GDN_CONV_TOKENS (\d+)", source).group(1)) == mixers.GDN_CONV_MAX_TOKENS
    from engine.cuda.model import VERIFY_MAX

    assert VERIFY_MAX <= mixers.GDN_CONV_MAX_TOKENS  # every verify pass can take it
