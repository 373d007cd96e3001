"""The accept of a verify pass's prefix in every DeltaNet layer at once (mixers.gdn_accept_layers, kernels/
deltanet.cu LAYERS): what CudaModel.accept launches, the table of layer buffers the kernel reads, and that the
instance spills nothing. The arithmetic is checked on the GPU (bench/gpu_mixers.py check_accept_layers: each
layer's window and state against ops.causal_conv1d and ops.gated_delta_rule)."""

from __future__ import annotations

import ctypes
import re
from types import SimpleNamespace

import numpy as np
import pytest

from engine.cuda import instances, mixers, nvrtc
from engine.cuda.model import CudaModel
from tests.kernels.ptxas import usage
from tests.kernels.recording import RecordingDev as _Dev
from tests.kernels.recording import buf as _buf

HK, HV, DK, C = 16, 48, 128, 10240  # the 27B's DeltaNet: key and value heads, head size, conv channels


class _UploadingDev(_Dev):
    """The recording device, keeping what is uploaded and where."""

    def __init__(self) -> None:
        super().__init__()
        self.uploads: dict[int, bytes] = {}

    def alloc(self, nbytes: int, what: str):
        return _buf(nbytes, what)

    def upload(self, buf, array: np.ndarray, offset: int = 0) -> None:
        self.uploads[buf.ptr + offset] = np.ascontiguousarray(array).tobytes()


def _model(num_layers: int) -> CudaModel:
    """A CudaModel with num_layers of the 27B's DeltaNet buffers (every other layer attention) and no MTP head."""
    model = CudaModel.__new__(CudaModel)
    model.dev = _UploadingDev()
    model.cfg = SimpleNamespace(ssm_conv_dim=C, ssm_num_k_heads=HK, ssm_num_v_heads=HV, ssm_head_dim=DK,
                                ssm_v_head_dim=DK, ssm_conv_kernel=4, ssm_inner_size=HV * DK)
    model.last_hidden, model.ws = None, SimpleNamespace(mix=_buf())
    model.deltanet = {2 * i: SimpleNamespace(window=_buf(), conv_out=_buf(), qk_norm=_buf(), g=_buf(), beta=_buf(),
                                             ssm=_buf()) for i in range(num_layers)}
    model.accept_table = model._accept_table()
    return model


def test_the_table_holds_each_layers_buffers_in_layer_order() -> None:
    model = _model(3)
    rows = (mixers.GdnLayer * 3).from_buffer_copy(model.dev.uploads[model.accept_table.ptr])
    for row, layer in zip(rows, model.deltanet.values()):
        # v's channels follow q and k in the conv output's rows
        assert (row.qk, row.v, row.g, row.beta, row.state, row.window) == (
            layer.qk_norm.ptr, layer.conv_out.ptr + 4 * 2 * HK * DK, layer.g.ptr, layer.beta.ptr, layer.ssm.ptr,
            layer.window.ptr)
    assert model.accept_table.nbytes == 3 * ctypes.sizeof(mixers.GdnLayer) == 3 * 48


@pytest.mark.parametrize("n", [1, 4])
def test_accept_is_one_launch_over_every_layer(n) -> None:
    model = _model(48)
    model.accept(5, n)
    (name, grid, block), = model.dev.grids
    assert (name, grid, block) == ("gdn_k128_layers", (4, HV, 48), 128)  # 32 state columns a block
    args = model.dev.launches[0][1][0]
    assert (args.T, args.layers, args.C, args.conv_k) == (n, model.accept_table.ptr, C, 4)
    assert (args.commit, args.prepared, args.save) == (1, 1, 0)
    assert (args.ld_qk, args.ld_v, args.num_k_heads, args.Dk, args.Dv) == (2 * HK * DK, C, HK, DK, DK)


def test_the_switch_launches_each_layer_apart(monkeypatch) -> None:
    monkeypatch.setattr(mixers, "GDN_ACCEPT_LAYERS", False)
    model = _model(2)
    model.accept(5, 3)
    assert [g[0] for g in model.dev.grids] == ["conv_commit", "gdn_k128_c4"] * 2


def test_the_layers_instances_are_the_plain_rule_and_spill_nothing() -> None:
    assert instances.INSTANCES["gdn_k128_layers"].expr == "gdn_recurrent<4, 8, 0, 1>"
    assert instances.INSTANCES["gdn_k128_c4_layers"].expr == "gdn_recurrent<4, 4, 0, 1>"
    found = usage("deltanet")
    for name in ("gdn_k128_layers", "gdn_k128_c4_layers"):
        assert found[name].spill_bytes == 0 and found[name].static_smem == 0


def test_the_layer_table_is_all_it_reads_before_the_wait() -> None:
    """gdn_layer_args runs before the kernel's own PDL_ENTER (tests/kernels/test_pdl.py sees the kernel's body
    only): it may read the table, written once at load, and must wait before the window, which the pass wrote."""
    source = (nvrtc.KERNEL_DIR / "deltanet.cu").read_text()
    body = re.search(r"void gdn_layer_args\(GdnArgs& p\) \{(.*?)\n\}", source, re.S).group(1)
    before, after = body.split("PDL_ENTER();")
    assert re.findall(r"\b(?:p\.\w+|L\.\w+)\[", before) == ["p.layers["]
    assert "L.window" not in before and "L.window[" in after
