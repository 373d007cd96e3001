"""bench/gpu_megakernel.py's options: the kernel variants cycle27b times on one upload of the model."""

import pytest

from bench.gpu_megakernel import parse_args, parse_variants


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
