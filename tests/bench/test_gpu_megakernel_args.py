"""bench/gpu_megakernel.py's options: the kernel variants cycle27b times on one upload of the model."""

import pytest

from bench.gpu_megakernel import parse_args, parse_variants, variant_environment


def test_variants_parse_into_names_and_define_lists():
    assert parse_variants("") == []
    assert parse_variants("batch8:MK_MV_BATCH=8; solo : MK_CONTROLLER=1,MK_MV_PROBE=1 ;") == [
        ("batch8", "MK_MV_BATCH=8"), ("solo", "MK_CONTROLLER=1,MK_MV_PROBE=1")]


@pytest.mark.parametrize("text", ["MK_MV_BATCH=8", "batch8:", ":MK_MV_BATCH=8"])
def test_a_variant_without_a_name_or_defines_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="--variants"):
        parse_variants(text)


def test_the_option_defaults_to_no_variants():
    assert parse_args(["--variants", "a:MK_X=1"]).variants == "a:MK_X=1"
    assert parse_variants(parse_args([]).variants) == []


def test_a_variant_compiles_with_its_defines_after_the_base_and_its_shared_memory_apart():
    assert variant_environment("MK_A=1,SMEM_KB=164,MK_B=2", "MK_C=0") == {
        "OPENJET_MK_DEFINES": "MK_C=0,MK_A=1,MK_B=2", "OPENJET_MK_SMEM_KB": "164"}
    assert variant_environment("MK_A=1", "") == {"OPENJET_MK_DEFINES": "MK_A=1"}
