"""Every kernel instance the engine launches, generated from one table: name -> (.cu file, NVRTC name expression).

Instance names follow <op>_<qtype>[_<variant>] (mmvq_q4_K, gemm_q6_K, rope_neox) so logs and profiles read
plainly; the expression is what NVRTC instantiates and mangles ("mmvq<12, 2>").
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

# Weight types with a device path, in the order every file lists them.
MATMUL_QTYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.F16)
# Output row tiles of 16 per block of mmvq: two where the per-row registers allow it.
MMVQ_MT = {Q.Q4_K: 2, Q.Q5_K: 1, Q.Q6_K: 1, Q.Q8_0: 1, Q.Q5_0: 2, Q.Q4_0: 2, Q.F16: 1}
# Output rows per block of the prefill GEMM and its column (token) tile.
GEMM_QTYPES = MATMUL_QTYPES


@dataclass(frozen=True, slots=True)
class Instance:
    """One launchable kernel: its instance name, the .cu file it lives in and the NVRTC name expression."""

    name: str
    file: str
    expr: str


def qtype_tag(qtype: Q) -> str:
    """The ggml spelling used in instance names: q4_K, q8_0, f16."""
    return qtype.name.lower().replace("_k", "_K")


def _build() -> dict[str, Instance]:
    """The whole table."""
    out: list[Instance] = []
    for qt in MATMUL_QTYPES:
        out.append(Instance(f"mmvq_{qtype_tag(qt)}", "mmvq", f"mmvq<{int(qt)}, {MMVQ_MT[qt]}>"))
    out += [Instance("mmv_f32", "mmvq", "mmv_f32"), Instance("act_f16", "mmvq", "act_f16")]
    return {inst.name: inst for inst in out}


INSTANCES: dict[str, Instance] = _build()


def files() -> dict[str, tuple[Instance, ...]]:
    """Instances grouped by .cu file (one NVRTC program per file)."""
    grouped: dict[str, list[Instance]] = {}
    for inst in INSTANCES.values():
        grouped.setdefault(inst.file, []).append(inst)
    return {name: tuple(items) for name, items in grouped.items()}
