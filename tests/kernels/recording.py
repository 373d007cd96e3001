"""A recording device and the 27B's FFN and DeltaNet layer on it, for the host-side rules of the launchers and of
CudaModel's layer methods (which kernel a launch takes, with what arguments): nothing is computed; launches are
recorded as (kernel name, args) and (kernel name, grid, block)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

from gguf import GGMLQuantizationType as Q

from engine.cuda import ops
from engine.cuda.memory import Buffer
from engine.cuda.model import CudaModel
from engine.cuda.weights import Part, Projection

H, FFN = 5120, 17408


class RecordingDev:
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


def buf(nbytes: int = 1 << 20, what: str = "", align: int = 256) -> Buffer:
    """A made-up device buffer, apart from every other."""
    ptr = _next[0]
    _next[0] += -(-nbytes // align) * align + align
    return Buffer(ptr, nbytes, what)


def weight(qtype: Q, rows: int, cols: int, name: str = "w") -> ops.DeviceWeight:
    return ops.DeviceWeight(buf(what=name), qtype, rows, cols, name)


def act(width: int, i8_tokens: int = 0, int8: bool = True) -> ops.Act:
    """An Act of 8 tokens (with an int8 copy unless int8 is off), i8_tokens of it written."""
    out = ops.Act(buf(), buf(), buf(), width, width, 8, buf(), buf(), i8_tokens=i8_tokens)
    if int8:
        out.q8, out.scale8, out.sums8, out.sums8_lo = buf(), buf(), buf(), buf()
    return out


def ffn_model(down_qtype: Q = Q.Q4_K) -> tuple[CudaModel, SimpleNamespace]:
    """A CudaModel with a recording device and the 27B FFN's shapes: enough for _ffn."""
    model = CudaModel.__new__(CudaModel)
    model.dev = RecordingDev()
    model.cfg = SimpleNamespace(hidden_size=H, ffn_size=FFN, rms_eps=1e-6, arch="qwen35")
    model.ws = SimpleNamespace(act_h=act(H), act_ffn=act(FFN), act_q=act(6144), act_inner=act(6144),
                               proj=buf(4 * 8 * 2 * FFN), x=buf(4 * 8 * H), xn=buf(4 * 8 * H),
                               ffn=buf(4 * 8 * FFN), proj_width=2 * FFN)
    gate_up = weight(Q.Q4_K, 2 * FFN, H, "gate|up")
    lw = SimpleNamespace(kind="deltanet",
                         ffn_in=Projection([Part(gate_up, None, 0)], 2 * FFN, {"ffn_gate": 0, "ffn_up": FFN}),
                         ffn_down=weight(down_qtype, H, FFN, "ffn_down"), mix_out=weight(Q.Q4_K, H, 6144, "ssm_out"),
                         vectors={"post_attention_norm": buf(4 * H)})
    return model, lw


def deltanet_model() -> tuple[CudaModel, SimpleNamespace]:
    """A CudaModel with the 27B's DeltaNet shapes and a recording device: enough for _deltanet."""
    model = CudaModel.__new__(CudaModel)
    model.dev = RecordingDev()
    inner, width = 6144, 16480
    model.cfg = SimpleNamespace(hidden_size=H, rms_eps=1e-6, ssm_conv_dim=10240, ssm_num_k_heads=16,
                                ssm_num_v_heads=48, ssm_head_dim=128, ssm_v_head_dim=128, ssm_inner_size=inner,
                                ssm_conv_kernel=4)
    model.ws = SimpleNamespace(act_h=act(H), act_inner=act(inner), proj_width=width,
                               proj=buf(4 * 8 * width), conv_out=buf(), mix=buf(4 * 8 * inner),
                               mix2=buf(4 * 8 * inner), x=buf(4 * 8 * H), g=buf(), beta=buf(), gdn_chunked=True)
    model.deltanet = {0: SimpleNamespace(window=buf(), conv_out=buf(), qk_norm=buf(), g=buf(), beta=buf(),
                                         ssm=buf())}
    offsets = {"attn_qkv": 0, "attn_gate": 10240, "ssm_beta": 16384, "ssm_alpha": 16432}
    lw = SimpleNamespace(mix_in=Projection([Part(weight(Q.Q4_K, 16384, H, "qkv|gate"), None, 0),
                                            Part(weight(Q.Q8_0, 96, H, "beta|alpha"), None, 16384)], width, offsets),
                         mix_out=weight(Q.Q4_K, H, inner, "ssm_out"),
                         vectors={k: buf(4 * 128) for k in ("ssm_conv1d", "ssm_a", "ssm_dt.bias", "ssm_norm")})
    return model, lw
