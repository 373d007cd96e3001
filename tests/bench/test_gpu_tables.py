"""The GPU benchmark's tables name what exists: a variant, shape or kernel shape they name but the engine lacks
would only fail on the GPU machine, after its device time is spent."""

from __future__ import annotations

from bench import gpu_bench27b, gpu_kernels
from engine.cuda import i8b, instances, ops


def test_int8_variants_and_tiles_are_variants_and_built_tile_counts() -> None:
    assert gpu_bench27b.I8_VARIANTS <= set(gpu_bench27b.VARIANTS)
    assert set(gpu_bench27b.I8_TILE_VARIANTS) <= gpu_bench27b.I8_VARIANTS
    assert set(gpu_bench27b.I8_TILE_VARIANTS.values()) <= set(instances.I8_TILE_COUNTS)
    assert "f16" in gpu_bench27b.VARIANTS and "f16" not in gpu_bench27b.I8_VARIANTS  # the same run without it


def test_int8_checks_and_timings_use_known_shapes_token_counts_and_launch_shapes() -> None:
    for name, tokens in gpu_kernels.I8_CHECKS + gpu_kernels.I8_TILE_CHECKS:
        assert name in gpu_kernels.SHAPES_27B and 1 <= tokens <= instances.I8_MAX_TOKENS
        assert gpu_kernels.SHAPES_27B[name][1] % ops.SUPERBLOCK == 0  # Q4_K rows of whole superblocks
    assert all(tokens <= 4 for _, tokens in gpu_kernels.I8_TILE_CHECKS)  # several tiles: up to 4 tokens
    assert set(gpu_kernels.I8_TIMED) <= set(gpu_kernels.SHAPES_27B)
    for _, warps, tiles in gpu_kernels.I8_SHAPE_TRIALS:
        assert tiles in instances.I8_TILE_COUNTS and (warps is None or 1 <= warps <= ops.MMVQ_WARPS)


def test_the_ablation_classes_name_launched_kernels() -> None:
    """Each class's prefixes match at least one instance, and the catch-all class is last."""
    names = list(instances.INSTANCES)
    for label, prefixes in gpu_bench27b.ABLATION[:-1]:
        for prefix in prefixes:
            assert any(n.startswith(prefix) for n in names), (label, prefix)
    assert gpu_bench27b.ABLATION[-1][1] is None


def test_the_one_token_bulk_shapes_the_bench_names_are_built() -> None:
    """Every mmvq_i8b shape a variant or a timed trial names has an instance, and the trial the i8 part times by
    default (the second) is the launcher's default shape."""
    shapes = set(gpu_bench27b.SHAPE_VARIANTS.values())
    shapes |= {shape for shape, _ in gpu_bench27b.SHAPE_SPARE_VARIANTS.values()}
    shapes |= {shape for _, _, (shape, _) in gpu_kernels.I8B_TRIALS}
    assert shapes <= set(instances.I8B_SHAPES)
    assert set(gpu_bench27b.SHAPE_SPARE_VARIANTS) <= gpu_bench27b.I8_VARIANTS
    assert all(spare >= 0 for _, spare in gpu_bench27b.SHAPE_SPARE_VARIANTS.values())
    assert gpu_kernels.I8B_TRIALS[1][2] == (i8b.DEFAULT_SHAPE, True)
