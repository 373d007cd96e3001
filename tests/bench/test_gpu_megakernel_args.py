"""bench/gpu_megakernel.py's options: the kernel variants cycle27b times on one upload of the model."""

import concurrent.futures
import os
from types import SimpleNamespace

import pytest

from bench.gpu_megakernel import (parse_args, parse_variants, precompile_variants, variant_environment,
                                  variant_schedule, wait_precompiled)


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


class _InlinePool:
    """concurrent.futures.ProcessPoolExecutor's interface, running each job at submit (no processes)."""

    def __init__(self, max_workers, mp_context):
        self.max_workers, self.closed = max_workers, False

    def submit(self, fn, *args):
        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001 - the future carries it, as a worker's would
            future.set_exception(exc)
        return future

    def shutdown(self):
        self.closed = True


def test_variants_compile_ahead_each_under_its_own_environment(monkeypatch):
    from engine.cuda.megakernel import build

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _InlinePool)
    monkeypatch.setenv("OPENJET_MK_DEFINES", "MK_C=0")
    monkeypatch.delenv("OPENJET_MK_SMEM_KB", raising=False)
    seen, compiled = [], []

    def compile_args():  # what the executor would compile with, read from the environment
        seen.append((os.environ["OPENJET_MK_DEFINES"], os.environ.get("OPENJET_MK_SMEM_KB")))
        if "MK_BAD" in os.environ["OPENJET_MK_DEFINES"]:
            raise ValueError("OPENJET_MK_DEFINES: 'MK_BAD' is not MK_NAME=value")
        return 90, (f"-D{os.environ['OPENJET_MK_DEFINES']}",), False

    def fake_compile(arch, extra, directory, ptx):
        if "MK_FAIL" in extra[0]:
            raise RuntimeError("did not compile")
        compiled.append(extra)
        return "image"

    monkeypatch.setattr(build, "compile_megakernel", fake_compile)
    mk = SimpleNamespace(ex=SimpleNamespace(compile_args=compile_args))
    variants = [("a", "MK_A=1,SMEM_KB=164"), ("b", "MK_B=2"), ("bad", "MK_BAD"), ("fail", "MK_FAIL=1")]
    base = {"OPENJET_MK_DEFINES": "MK_C=0", "OPENJET_MK_SMEM_KB": None}
    pool, ahead = precompile_variants(mk, variants, base)
    assert seen == [("MK_C=0,MK_A=1", "164"), ("MK_C=0,MK_B=2", None), ("MK_C=0,MK_BAD", None),
                    ("MK_C=0,MK_FAIL=1", None)]
    assert compiled == [("-DMK_C=0,MK_A=1",), ("-DMK_C=0,MK_B=2",)]
    assert set(ahead) == {"a", "b", "fail"}  # a variant whose options failed is compiled (and reported) later
    assert os.environ["OPENJET_MK_DEFINES"] == "MK_C=0" and "OPENJET_MK_SMEM_KB" not in os.environ
    wait_precompiled(ahead["a"], "a")
    wait_precompiled(ahead["fail"], "fail")  # its failure is left for the variant's own compile
    wait_precompiled(None, "bad")
    assert precompile_variants(mk, [], base) == (None, {})


def test_a_variant_may_change_the_schedule_apart_from_the_kernel():
    from engine.cuda.megakernel.schedule import ScheduleConfig

    base = ScheduleConfig(num_sms=132)
    assert variant_schedule("MK_A=1", base) is base
    split = variant_schedule("SCHED.split_tiles=1,MK_A=1, SCHED.tiles_per_sm=2", base)
    assert split.split_tiles is True and split.tiles_per_sm == 2 and split.num_sms == 132 and not base.split_tiles
    assert variant_environment("SCHED.split_tiles=1,MK_A=1", "") == {"OPENJET_MK_DEFINES": "MK_A=1"}
    assert variant_environment("SCHED.joint_rows=0", "MK_C=0") == {"OPENJET_MK_DEFINES": "MK_C=0"}
    for bad in ("SCHED.split=1", "SCHED.split_tiles=yes", "SCHED.tiles_per_sm"):
        with pytest.raises(ValueError, match="--variants"):
            variant_schedule(bad, base)
