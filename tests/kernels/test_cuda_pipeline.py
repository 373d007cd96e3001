"""Host-side contracts of the cp.async-pipelined mmvq and the attention split size (no GPU needed): the Python
mirror of the shared-memory stages, the block shapes the launcher picks, and the switches the benchmark uses."""

from __future__ import annotations

import re

import pytest
from gguf import GGMLQuantizationType as Q

from engine.cuda import instances, mixers, nvrtc, ops

SMEM_PER_BLOCK = 227 * 1024  # the most dynamic shared memory one block may ask for (sm_90)
SMEM_PER_SM = 228 * 1024


def _stage_constants(qtype: Q) -> dict[str, int]:
    """Evaluate the `static constexpr int` lines of Stage<QT_x> in stage.cuh (STAGE_ROWS = 16)."""
    text = (nvrtc.KERNEL_DIR / "stage.cuh").read_text()
    tag = {Q.Q4_K: "QT_Q4_K", Q.Q5_K: "QT_Q5_K", Q.Q6_K: "QT_Q6_K"}[qtype]
    values: dict[str, int] = {"STAGE_ROWS": 16}
    # Q4_K, Q6_K: pitches of a shared template (Q4KStage<PITCH>, Q6KStage<QL_P, QH_P>), its parameters by name
    base = re.search(rf"struct Stage<{tag}> : (\w+)<([\d, ]+)>", text)
    if base:
        params = re.search(rf"template <([^>]+)> struct {base.group(1)} {{", text).group(1)
        names = [part.split("=")[0].split()[-1] for part in params.split(",")]  # trailing ones may default
        given = [int(v) for v in base.group(2).split(",")]
        assert len(given) <= len(names)
        values.update(zip(names, given))
        tag = None
    body = text[text.index(f"struct Stage<{tag}>" if tag else f"struct {base.group(1)} {{"):]
    body = body[: body.index("\n};")]
    for line in re.findall(r"static constexpr int ([^;]+);", body):
        for item in line.split(","):
            name, expr = (part.strip() for part in item.split("=", 1))
            values[name] = eval(expr, {}, dict(values))  # noqa: S307 - integer arithmetic from our own header
    return values


@pytest.mark.parametrize("qtype", list(ops.STAGE_SHAPE), ids=lambda q: q.name)
def test_stage_shape_mirrors_the_header(qtype: Q) -> None:
    consts = _stage_constants(qtype)
    assert ops.STAGE_SHAPE[qtype] == (consts["STAGES"], consts["BYTES"])
    assert consts["BYTES"] % 16 == 0, "stages must keep 16-byte cp.async destinations aligned"


@pytest.mark.parametrize("qtype", list(ops.STAGE_SHAPE), ids=lambda q: q.name)
def test_stage_holds_every_plane_of_16_rows(qtype: Q) -> None:
    """Each region is at least 16 rows of its plane's bytes per superblock, and regions do not overlap."""
    from engine.cuda.repack import PLANES, TILE_WORDS

    consts = _stage_constants(qtype)
    names = {Q.Q4_K: ("QS", "SC", "DM"), Q.Q5_K: ("QS", "QH", "SC", "DM"), Q.Q6_K: ("QL", "QH", "SC", "D")}[qtype]
    starts = [consts[n] for n in names] + [consts["BYTES"]]
    fields = PLANES[qtype] + TILE_WORDS.get(qtype, ())
    for (_, field), lo, hi in zip(fields, starts[:-1], starts[1:], strict=True):
        word = 4 if field == 2 else field  # Q6_K's 2-byte d travels as the aligned word around it
        assert hi - lo >= 16 * word


def test_two_blocks_of_eight_warps_fit_one_multiprocessor() -> None:
    """mmvq_cp's launch bounds ask for 2 blocks of 256 threads per SM: their stages (and the 4 KB reduction) must
    fit."""
    for qtype in instances.STAGED_QTYPES:
        stages, stage_bytes = ops.STAGE_SHAPE[qtype]
        block = ops.MMVQ_WARPS * stages * stage_bytes + 4096
        assert block <= SMEM_PER_BLOCK and 2 * (block + 1024) <= SMEM_PER_SM, qtype.name


def test_every_pipelined_type_has_its_three_instances() -> None:
    for qtype in instances.STAGED_QTYPES:
        assert qtype in ops.STAGE_SHAPE
        for variant in ("cp", "cp_hl", "cp_x2"):
            assert f"mmvq_{instances.qtype_tag(qtype)}_{variant}" in instances.INSTANCES


def test_pipelined_warps_split_evenly_and_fill_one_wave_where_they_can() -> None:
    sms = 132
    assert ops._pipelined_warps(5120, 2176, sms) == 5  # ffn gate|up: 20 superblocks, many waves either way
    assert ops._pipelined_warps(6144, 320, sms) == 6  # ssm_out: 8 warps would spill 448 warps into a second wave
    assert ops._pipelined_warps(17408, 320, sms) == 4  # ffn_down: 68 = 4 x 17
    assert ops._pipelined_warps(5120, 1024, sms) == 4  # 4096 warps = 2 waves, where 5 would need 3
    assert ops._pipelined_warps(768, 63, sms) == 3
    assert ops._pipelined_warps(256, 1, sms) == 1
    for cols in (256 * n for n in range(1, 80)):
        warps = ops._pipelined_warps(cols, 1000, sms)
        assert 1 <= warps <= ops.MMVQ_WARPS


def test_set_pipelined_switches_and_rejects_types_without_the_kernel() -> None:
    saved = ops.pipeline_state()
    try:
        ops.set_pipelined(frozenset())
        assert ops.pipeline_kernel(Q.Q4_K, True, 1) is None and ops.pipeline_kernel(Q.Q4_K, True, 5) is None
        ops.set_pipelined({Q.Q4_K}, everywhere=True)
        assert ops.pipeline_kernel(Q.Q4_K, False, 8) == "cp" and ops.pipeline_kernel(Q.Q6_K, True, 1) is None
        with pytest.raises(ValueError, match="Q8_0"):
            ops.set_pipelined({Q.Q4_K, Q.Q8_0})
    finally:
        ops.set_pipelined(*saved)


def test_default_policy_runs_each_pipelined_kernel_only_where_it_measured_faster() -> None:
    saved = ops.pipeline_state()
    try:
        ops.set_pipelined(instances.STAGED_QTYPES)
        # one token: the activations staged with the weights; precise: the residue packed into spare columns up
        # to 4 tokens; above, the persistent two-pass kernel for Q4_K and the plain kernel for Q6_K
        assert [ops.pipeline_kernel(Q.Q4_K, True, t) for t in range(1, 9)] == ["cpa"] + ["cp"] * 3 + ["persist"] * 4
        assert [ops.pipeline_kernel(Q.Q6_K, True, t) for t in range(1, 9)] == ["cpa"] + ["cp"] * 3 + [None] * 4
        assert [ops.pipeline_kernel(Q.Q4_K, False, t) for t in range(1, 9)] == ["cpa"] * 2 + [None] * 6
        assert [ops.pipeline_kernel(Q.Q6_K, False, t) for t in (1, 2, 3, 4, 5)] == ["cpa", "cpa", "cp", "cp", None]
        assert ops.pipeline_kernel(Q.Q8_0, True, 1) is None
        ops.set_pipelined({Q.Q6_K})  # a type left out runs plain whatever the table says
        assert ops.pipeline_kernel(Q.Q4_K, True, 5) is None
    finally:
        ops.set_pipelined(*saved)


def test_environment_picks_plain_table_or_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ops.MMVQ_ENV, "plain")
    assert ops._default_pipelined() == (frozenset(), False, "cp")
    monkeypatch.setenv(ops.MMVQ_ENV, "cp")
    assert ops._default_pipelined() == (frozenset(instances.STAGED_QTYPES), True, "cp")
    monkeypatch.setenv(ops.MMVQ_ENV, "fast")
    with pytest.raises(ValueError, match="OPENJET_CUDA_MMVQ='fast'"):
        ops._default_pipelined()
    monkeypatch.delenv(ops.MMVQ_ENV)
    assert ops._default_pipelined() == (frozenset(instances.STAGED_QTYPES), False, "cp")


@pytest.mark.parametrize("min_keys", [0, 48])
def test_attention_split_size_must_be_a_power_of_two(min_keys: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        mixers.attention(None, None, None, None, None, None, 1, 24, 4, 256, 64, 256, 256, 6144, 0.0625,
                         min_keys=min_keys)


def test_staged_activations_only_up_to_four_tokens_and_where_two_blocks_fit() -> None:
    # 4 warps: every packed mode fits (two stages of weights plus 2T columns of 16 steps)
    assert all(ops.staged_act_fits(q, t, precise, 4) for q in instances.STAGED_QTYPES for t in range(1, 5)
               for precise in (False, True))
    assert not any(ops.staged_act_fits(Q.Q4_K, t, False, 4) for t in range(5, 9))  # the two-pass modes never
    # 8 warps of Q6_K at 4 precise tokens: 8 x (2 x (3648 + 8 x 544) + 512) bytes, more than half an SM
    assert ops.staged_act_fits(Q.Q6_K, 1, True, 8) and not ops.staged_act_fits(Q.Q6_K, 4, True, 8)
    assert ops.staged_act_bytes(Q.Q4_K, 1, False) == 544 + 32 and ops.staged_act_bytes(Q.Q6_K, 2, True) == 4 * 544


def test_staged_layout_constants_mirror_the_kernel_header() -> None:
    """ops sizes mmvq_cpa's shared memory from its own copies of the header's constants: they must agree, or a
    launch under-allocates its stages."""
    header = (nvrtc.KERNEL_DIR / "mmvq.cuh").read_text()
    defines = dict(re.findall(r"#define (ACT_\w+) (\d+)", header))
    assert int(defines["ACT_SLOT_PITCH"]) == ops.ACT_SLOT_PITCH and int(defines["ACT_ZERO_BYTES"]) == ops.ACT_ZERO_BYTES
    stage = (nvrtc.KERNEL_DIR / "stage.cuh").read_text()
    assert "struct Stage<QT_Q4_K> : Q4KStage<144>" in stage
    assert "static constexpr int STAGES = 4;" in stage.split("struct Q4KStage")[1][:200]
    assert ops.STAGE_SHAPE[Q.Q4_K] == (4, 2560) and ops.STAGE_SHAPE[Q.Q6_K] == (3, 3648)
