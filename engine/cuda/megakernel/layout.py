"""What the megakernel's memory holds: control words, stages, per-layer slots and every buffer by name.

Mirrors opcodes.cuh (CTL_*, MODE_*, LW_/LV_/LS_*, limits). The VM (vm.py) and the GPU runner (runner.py) allocate
the same buffers from buffer_specs(): the VM in float32 numpy, the device in its own formats (act buffers in the
matmul layout of kernels/mmvq.cu, KV caches in f16), so the diff harness can compare them name by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

from engine.cuda.megakernel.instructions import NUM_OPCODES
from engine.errors import UnsupportedModelError

if TYPE_CHECKING:
    from engine.model.config import ModelConfig
    from engine.model.weights import ModelTensors

MAX_ROWS = 8  # rows of one pass: the pending token and up to 7 drafts (and the MTP pass's n + 1 rows)
MAX_DRAFT = 4
CAND_MAX = 4096
SAMPLE_CUTOFF = 30.0
ATTN_MIN_KEYS_LOG2 = 5
TILE_ROWS = 16
PIECE_WIDTH = 64  # outputs a piece of a split matmul leaves (mv_part): a tile's 16, or FFN_UP's 32 gate + 32 up
SUPERBLOCK = 256


class Ctl(IntEnum):
    """Control words (opcodes.cuh CTL_*)."""

    MODE = 0
    NUM_ROWS = 1
    START = 2
    DRAFT_NEXT = 3
    GREEDY = 4
    TEMPERATURE = 5
    TOP_K = 6
    TOP_P = 7
    MIN_P = 8
    REP_PENALTY = 9
    FREQ_PENALTY = 10
    PRES_PENALTY = 11
    SEED_LO = 12
    SEED_HI = 13
    PENALTIES = 14
    COMMIT_N = 16
    DRAFTS_READY = 17
    MTP_ROWS = 18
    MTP_POS = 19
    NUM_EMITTED = 20
    ERROR = 21
    ERROR_INFO = 22
    SAMPLE_CLIPPED = 28
    IDS = 32
    MTP_IDS = 40
    EMITTED = 48
    DRAFTS = 56


CTL_WORDS = 64


class Mode(IntEnum):
    """What a launch does (opcodes.cuh MODE_*)."""

    CYCLE = 1
    PREFILL = 2
    HOST = 3
    CATCHUP = 4
    DRAFT = 5


class Err(IntEnum):
    """Device error codes (opcodes.cuh ERR_*)."""

    NONE = 0
    WAIT_TIMEOUT = 1
    BAD_OPCODE = 2
    BAD_QTYPE = 3
    BAD_SHAPE = 4


# Per-layer slots, in the order of opcodes.cuh LW_*, LV_*, LS_*; the names are the GGUF keys.
LW = ("attn_q", "attn_k", "attn_v", "attn_output", "attn_qkv", "attn_gate", "ssm_alpha", "ssm_beta", "ssm_out",
      "ffn_gate", "ffn_up", "ffn_down", "nextn.eh_proj")
LV = ("attn_norm", "post_attention_norm", "attn_q_norm", "attn_k_norm", "ssm_conv1d", "ssm_a", "ssm_dt.bias",
      "ssm_norm", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm")
LS = ("k", "v", "window", "ssm", "rk", "rv", "rg", "rb")


def lw(key: str) -> int:
    """The LW slot of a matrix key."""
    return LW.index(key)


# ---- stages ----

def head_stage(cfg: ModelConfig) -> int:
    """Counter row of the head (output norm, lm_head, verify)."""
    return cfg.num_layers


def mtp_stage(cfg: ModelConfig, step: int) -> int:
    """Counter row of MTP step `step` (0: the pass over the committed rows plus the first draft row)."""
    assert 0 <= step < MAX_DRAFT
    return cfg.num_layers + 1 + step


def finish_stage(cfg: ModelConfig) -> int:
    """Counter row of the finish instruction."""
    return cfg.num_layers + 1 + MAX_DRAFT


def num_stages(cfg: ModelConfig) -> int:
    """Rows of the counter table."""
    return cfg.num_layers + 2 + MAX_DRAFT


# ---- the model as the megakernel sees it ----

@dataclass(frozen=True, slots=True)
class MatrixInfo:
    """A weight matrix's type and shape (rows = outputs)."""

    qtype: int
    rows: int
    cols: int


@dataclass(slots=True)
class ModelSpec:
    """A qwen35 model's config and the type and shape of every matrix; layer index num_layers is the MTP block."""

    cfg: ModelConfig
    matrices: dict[tuple[int | None, str], MatrixInfo]  # (layer or None for top level, key) -> info
    has_mtp: bool
    draft_vocab: int  # rows 0 .. draft_vocab - 1 of the MTP output head are what drafts choose from

    @classmethod
    def from_tensors(cls, tensors: ModelTensors, use_mtp: bool = True, draft_vocab: int | None = None) -> ModelSpec:
        """The spec of bound tensors; UnsupportedModelError for anything but qwen35."""
        cfg = tensors.config
        if cfg.arch != "qwen35":
            raise UnsupportedModelError(tensors.path, f"the megakernel runs qwen35 models, not {cfg.arch}")
        matrices: dict[tuple[int | None, str], MatrixInfo] = {}
        layers = list(tensors.layers) + (list(tensors.nextn[:1]) if use_mtp else [])
        for i, layer in enumerate(layers):
            for key, info in layer.items():
                if len(info.shape) == 2 and key in LW + ("nextn.embed_tokens", "nextn.shared_head_head"):
                    matrices[(i, key)] = MatrixInfo(int(info.qtype), *info.shape)
        for key in ("token_embd", "output"):
            info = tensors.global_tensors[key]
            matrices[(None, key)] = MatrixInfo(int(info.qtype), *info.shape)
        has_mtp = use_mtp and cfg.num_nextn_layers > 0 and bool(tensors.nextn)
        vocab = cfg.vocab_size if draft_vocab is None else int(draft_vocab)
        if not 0 < vocab <= cfg.vocab_size:
            raise ValueError(f"draft_vocab {draft_vocab} must be in 1..{cfg.vocab_size}")
        return cls(cfg, matrices, has_mtp, vocab)

    def matrix(self, layer: int | None, key: str) -> MatrixInfo:
        """Type and shape of one matrix."""
        return self.matrices[(layer, key)]

    @property
    def mtp_layer(self) -> int:
        """Layer index of the MTP block (its slot in the per-layer tables)."""
        return self.cfg.num_layers

    @property
    def num_layer_slots(self) -> int:
        """Entries of the per-layer tables: the trunk, plus the MTP block when drafting."""
        return self.cfg.num_layers + int(self.has_mtp)

    def layer_kind(self, layer: int) -> str:
        """"attention" or "deltanet" (the MTP block is an attention layer)."""
        return "attention" if layer >= self.cfg.num_layers else self.cfg.layer_kinds[layer]

    def mtp_output_key(self) -> tuple[int | None, str]:
        """The MTP output head: its own shared_head_head when the file has one, else the trunk's output."""
        own = (self.mtp_layer, "nextn.shared_head_head")
        return own if own in self.matrices else (None, "output")


def proj_offsets(cfg: ModelConfig) -> dict[int, int]:
    """Column offset in the proj buffer of each mixer input matrix stored there (LW slot -> column)."""
    q_rows = 2 * cfg.q_size if cfg.has_attn_gate else cfg.q_size
    return {lw("attn_q"): 0, lw("attn_k"): q_rows, lw("attn_v"): q_rows + cfg.kv_size,
            lw("attn_gate"): 0, lw("ssm_alpha"): cfg.ssm_inner_size,
            lw("ssm_beta"): cfg.ssm_inner_size + cfg.ssm_num_v_heads}


def proj_width(cfg: ModelConfig) -> int:
    """Columns of the proj buffer: the widest mixer's outputs."""
    q_rows = 2 * cfg.q_size if cfg.has_attn_gate else cfg.q_size
    return max(q_rows + 2 * cfg.kv_size, cfg.ssm_inner_size + 2 * cfg.ssm_num_v_heads)


# ---- buffers ----

@dataclass(frozen=True, slots=True)
class BufferSpec:
    """One buffer: kind f32 | i32 | u32 | u8 | act (matmul input, VM f32 [rows, width]) | kv (device f16)."""

    name: str
    kind: str
    shape: tuple[int, ...]
    is_state: bool = False  # part of the sequence state (checkpointed), not per-launch scratch


def buffer_specs(spec: ModelSpec, capacity: int, num_lm_parts: int, num_draft_parts: int,
                 attn_splits: int, num_pieces: int) -> list[BufferSpec]:
    """Every buffer of a megakernel instance, in a fixed order. num_pieces: the most pieces one matmul group
    leaves (the schedule's SM count): their partial products [piece][row][PIECE_WIDTH] and a count per split
    tile."""
    cfg, r = spec.cfg, MAX_ROWS
    h, v = cfg.hidden_size, cfg.vocab_size
    out = [
        BufferSpec("ctl", "i32", (CTL_WORDS,), True), BufferSpec("counters", "u32", (num_stages(cfg), NUM_OPCODES)),
        BufferSpec("x", "f32", (r, h)), BufferSpec("mtp_x", "f32", (r, h)),
        BufferSpec("proj", "f32", (r, proj_width(cfg))), BufferSpec("conv_out", "f32", (r, max(cfg.ssm_conv_dim, 1))),
        BufferSpec("attn_part", "f32", (attn_splits, r, cfg.num_heads, cfg.head_dim + 2)),
        BufferSpec("hidden", "f32", (r, h)), BufferSpec("mtp_hidden", "f32", (r, h)),
        BufferSpec("last_hidden", "f32", (h,), True), BufferSpec("logits", "f32", (r, v)),
        BufferSpec("lm_part_v", "f32", (r, num_lm_parts)), BufferSpec("lm_part_i", "i32", (r, num_lm_parts)),
        BufferSpec("draft_logits", "f32", (1, spec.draft_vocab)),
        BufferSpec("draft_part_v", "f32", (1, max(num_draft_parts, 1))),
        BufferSpec("draft_part_i", "i32", (1, max(num_draft_parts, 1))),
        BufferSpec("counts", "i32", (v,), True), BufferSpec("seen", "u8", (v,), True),
        BufferSpec("mv_part", "f32", (num_pieces, r, PIECE_WIDTH)), BufferSpec("mv_count", "u32", (num_pieces,)),
        BufferSpec("act_h", "act", (r, h)), BufferSpec("act_mix", "act", (r, max(cfg.q_size, cfg.ssm_inner_size))),
        BufferSpec("act_ffn", "act", (r, cfg.ffn_size)), BufferSpec("act_eh", "act", (r, 2 * h)),
    ]
    for layer in range(spec.num_layer_slots):
        out += layer_buffer_specs(spec, layer, capacity)
    return out


def layer_buffer_specs(spec: ModelSpec, layer: int, capacity: int) -> list[BufferSpec]:
    """The state buffers of one layer: a KV cache, or the DeltaNet window, state and last-pass rows."""
    cfg, r = spec.cfg, MAX_ROWS
    name = f"blk.{layer}."
    if spec.layer_kind(layer) == "attention":
        kv = (cfg.num_kv_heads, capacity, cfg.head_dim)
        return [BufferSpec(name + "k", "kv", kv, True), BufferSpec(name + "v", "kv", kv, True)]
    hv, dk, dv = cfg.ssm_num_v_heads, cfg.ssm_head_dim, cfg.ssm_v_head_dim
    return [
        BufferSpec(name + "window", "f32", (cfg.ssm_conv_kernel - 1 + r, cfg.ssm_conv_dim), True),
        BufferSpec(name + "ssm", "f32", (hv, dk, dv), True),
        BufferSpec(name + "rk", "f32", (r, hv, dk), True), BufferSpec(name + "rv", "f32", (r, hv, dv), True),
        BufferSpec(name + "rg", "f32", (r, hv), True), BufferSpec(name + "rb", "f32", (r, hv), True),
    ]
