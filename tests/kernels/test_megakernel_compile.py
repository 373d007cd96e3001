"""The megakernel compiles with NVRTC for every supported architecture (no GPU needed), and its three mirrors agree:
opcodes.cuh with instructions.py / layout.py, each instruction's device parser with its dataclass, and globals.cuh
with the ctypes structures the runner passes.

A cubin of the megakernel takes ~15 s of CPU (NVVM and ptxas on one large kernel), so the test builds machine code
for one GPU of each generation (sm_80 Ampere, sm_90 Hopper, sm_120 Blackwell) and PTX, the whole front end, for
sm_86 and sm_89, which share sm_80's instruction set; the runner builds the cubin of the GPU present."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.cuda import nvrtc
from engine.cuda.megakernel import build, instructions, layout, structs
from engine.cuda.megakernel.instructions import CLASSES, INST_ARGS, INST_WORDS, Op

CUBIN_ARCHS = (80, 90, 120)  # A100, H100/H200, RTX 50
PTX_ARCHS = (86, 89)  # RTX 30 / A10, RTX 40 / L4
HEADER = (build.MEGAKERNEL_DIR / "opcodes.cuh").read_text()
DEFINES = {m.group(1): m.group(2).strip() for m in re.finditer(r"^#define (\w+) ([^/\n]+)", HEADER, re.M)}


def define(name: str) -> int:
    """An integer #define of opcodes.cuh (simple expressions of other defines evaluated)."""
    text = re.sub(r"(\d+)(ull|u)\b", r"\1", DEFINES[name])
    text = re.sub(r"[A-Z_][A-Z0-9_]+", lambda m: str(define(m.group(0))), text)
    return int(eval(text, {"__builtins__": {}}))  # only digits, operators and parentheses remain


def test_opcodes_and_words_match_the_header() -> None:
    assert {name: define(f"OP_{name}") for name in Op.__members__} == {n: int(o) for n, o in Op.__members__.items()}
    assert define("NUM_OPCODES") == instructions.NUM_OPCODES
    assert (define("INST_WORDS"), define("INST_ARGS")) == (INST_WORDS, INST_ARGS)
    for name, value in layout.Ctl.__members__.items():
        assert define(f"CTL_{name}") == value, name
    assert define("CTL_WORDS") == layout.CTL_WORDS
    for enum, prefix in ((layout.Mode, "MODE_"), (layout.Err, "ERR_")):
        for name, value in enum.__members__.items():
            assert define(prefix + name) == value, name
    for names, prefix in ((layout.LW, "LW_"), (layout.LV, "LV_"), (layout.LS, "LS_")):
        assert define(prefix + "COUNT") == len(names)
        for slot, key in enumerate(names):
            macro = prefix + key.removeprefix("nextn.").replace(".bias", "").upper()
            aliases = {"LV_POST_ATTENTION_NORM": "LV_POST_NORM", "LV_ATTN_Q_NORM": "LV_Q_NORM",
                       "LV_ATTN_K_NORM": "LV_K_NORM", "LV_SSM_DT": "LV_SSM_DT", "LV_SHARED_HEAD_NORM": "LV_HEAD_NORM"}
            assert define(aliases.get(macro, macro)) == slot, key


def test_limits_and_launch_shape_match_the_header() -> None:
    assert define("MK_MAX_ROWS") == layout.MAX_ROWS and define("MK_MAX_DRAFT") == layout.MAX_DRAFT
    assert define("MK_CAND_MAX") == layout.CAND_MAX
    assert float(DEFINES["MK_SAMPLE_CUTOFF"].rstrip("f")) == layout.SAMPLE_CUTOFF
    assert define("MK_ATTN_MIN_KEYS_LOG2") == layout.ATTN_MIN_KEYS_LOG2
    assert define("MK_TILE_ROWS") == layout.TILE_ROWS and define("MK_PIECE_WIDTH") == layout.PIECE_WIDTH
    roles = define("MK_ROLE_WARPS") if define("MK_CONTROLLER") else 0
    assert (roles + define("MK_CONSUMER_WARPS")) * 32 == build.threads(()) == 256
    assert build.threads(("-DMK_QT_MASK=1", "-DMK_CONSUMER_WARPS=16")) == 512
    assert build.threads(("-DMK_CONTROLLER=1",)) == 320
    common = (build.MEGAKERNEL_DIR / "mk_common.cuh").read_text()
    assert int(re.search(r"#define MK_SMEM_BYTES (\d+)", common).group(1)) == build.smem_bytes(86) == 96 * 1024


def test_the_timing_slots_and_the_warp_trace_match_the_header() -> None:
    """runner.py sizes the timings buffer and bench/mk_profile.py reads it by opcodes.cuh's TIME_* / TRACE_*."""
    from bench import mk_profile
    from engine.cuda.megakernel import runner

    assert define("TIME_SLOTS") == runner.TIME_SLOTS
    assert (define("TRACE_WARPS"), define("TRACE_EVENTS")) == (runner.TRACE_WARPS, runner.TRACE_EVENTS)
    for name in ("START", "FIRST", "LAST", "FOLDED", "BODY"):
        assert define(f"TRACE_{name}") == getattr(mk_profile, f"TRACE_{name}"), name
    for name in ("ENTER", "PRIMED", "UNIT0_READY", "UNIT0_DONE", "LOOP_DONE", "UNITS"):
        assert define(f"TRACE_{name}") == getattr(mk_profile, name), name
    assert define("TRACE_LAST") + mk_profile.UNITS < define("TRACE_FOLDED") < define("TRACE_EVENTS")
    assert (define("TIME_READY"), define("TIME_DONE")) == (mk_profile.READY, mk_profile.DONE)


def test_shared_memory_stays_within_each_architectures_limit(monkeypatch) -> None:
    """The opt-in maximum a block may have (sm_80 163 KB, sm_86 / sm_89 / sm_120 99 KB, sm_90 / sm_100 227 KB),
    less the kernel's static shared memory (under 1 KB), whatever the override asks for."""
    limits = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 120: 101376}
    for want in (None, "128", "1000"):
        if want is None:
            monkeypatch.delenv("OPENJET_MK_SMEM_KB", raising=False)
        else:
            monkeypatch.setenv("OPENJET_MK_SMEM_KB", want)
        for arch, limit in limits.items():
            assert build.smem_bytes(arch) <= limit - 1024, (arch, want)
            assert f"-DMK_SMEM_BYTES={build.smem_bytes(arch)}" in build.arch_options(arch)
    monkeypatch.setenv("OPENJET_MK_SMEM_KB", "128")
    assert build.smem_bytes(90) == 128 * 1024 and build.smem_bytes(86) == 98 * 1024
    monkeypatch.delenv("OPENJET_MK_SMEM_KB")
    assert build.smem_bytes(90) == 140 * 1024 and build.smem_bytes(80) == build.smem_bytes(120) == 96 * 1024


def runner_stages_extra() -> int:
    """Counter rows past the trunk's layers, as layout.num_stages counts them."""
    from engine.model.config import qwen38_27b_config

    cfg = qwen38_27b_config()
    return layout.num_stages(cfg) - cfg.num_layers


def device_parsers() -> dict[int, list[str]]:
    """opcode -> the fields its device parser reads, in word order (from every instruction's .cuh)."""
    out: dict[int, list[str]] = {}
    for path in build.MEGAKERNEL_DIR.glob("*.cuh"):
        text = path.read_text()
        for m in re.finditer(r"static constexpr int OPCODE = (OP_\w+);(.*?)\n    struct Loader", text, re.S):
            fields = re.findall(r"(\w+)\(w\[INST_ARGS \+ (\d+)\]\)", m.group(2))
            assert [int(i) for _, i in fields] == list(range(len(fields))), f"{path.name}: words out of order"
            out[define(m.group(1))] = [name for name, _ in fields]
    return out


def test_every_instruction_parses_its_dataclass_fields_in_order() -> None:
    parsers = device_parsers()
    dispatch = (build.MEGAKERNEL_DIR / "megakernel.cu").read_text()
    for op, cls in CLASSES.items():
        assert parsers.get(int(op)) == list(cls.arg_names()), f"{op.name}: device parser differs from {cls.__name__}"
        assert re.search(rf"X\(OP_{op.name}, \w+\)", dispatch), f"{op.name} is not dispatched"


def c_struct_fields(name: str) -> list[str]:
    """Member names of a struct in globals.cuh, in declaration order."""
    text = (build.MEGAKERNEL_DIR / "globals.cuh").read_text()
    body = re.search(rf"struct {name} \{{(.*?)\n\}};", text, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    return [re.sub(r"\[.*\]", "", d.split()[-1]).lstrip("*") for d in body.split(";") if d.strip()]


@pytest.mark.parametrize("name", ["WeightRef", "ActRef", "LayerRefs", "Globals"])
def test_ctypes_structs_mirror_globals_cuh(name: str) -> None:
    assert [f[0] for f in getattr(structs, name)._fields_] == c_struct_fields(name)


@pytest.fixture(scope="session")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[int, nvrtc.CompiledKernels]:
    """The megakernel for the Qwen3.8-27B shape (its Q4_K_M types and head sizes) for every architecture, two
    compilations at a time, into a fresh cache."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.cuda.megakernel.costs import spec_from_config
    from engine.model.config import qwen38_27b_config

    directory = tmp_path_factory.mktemp("megakernel_cache")
    extra = build.model_options(spec_from_config(qwen38_27b_config()))
    with ThreadPoolExecutor(2) as pool:  # NVRTC releases the GIL while it compiles
        jobs = {arch: pool.submit(build.compile_megakernel, arch, extra + build.arch_options(arch), directory,
                                  arch in PTX_ARCHS)
                for arch in CUBIN_ARCHS + PTX_ARCHS}
        return {arch: job.result() for arch, job in jobs.items()}


def test_megakernel_compiles_for_every_architecture(compiled) -> None:
    assert set(CUBIN_ARCHS + PTX_ARCHS) <= set(nvrtc.supported_archs())
    for arch, kernels in compiled.items():
        symbol = kernels.symbols[build.ENTRY]
        if arch in PTX_ARCHS:
            text = kernels.image.decode(errors="replace")
            assert f".target sm_{arch}" in text and f".entry {symbol}" in text, f"compute_{arch}: no entry point"
        else:
            assert kernels.image[:4] == b"\x7fELF", f"sm_{arch}: not an ELF cubin"
            assert symbol.encode() + b"\0" in kernels.image, f"{symbol} missing from sm_{arch}"
        assert "error" not in kernels.log.lower(), kernels.log


def test_the_compile_cache_covers_the_shared_headers(tmp_path: Path, monkeypatch) -> None:
    """Editing a header of engine/cuda/kernels changes the megakernel's options, hence its cache key."""
    before = build.options()
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for name in build.SHARED_HEADERS:
        (kernels / name).write_bytes((nvrtc.KERNEL_DIR / name).read_bytes())
    (kernels / "common.cuh").write_text((kernels / "common.cuh").read_text() + "\n// edited\n")
    monkeypatch.setattr(nvrtc, "KERNEL_DIR", kernels)
    assert build.options() != before


def test_the_dn_rule_state_prefetch_is_compiled_only_with_its_knob() -> None:
    """MK_DN_PREFETCH=1 (megakernel.cu, a benchmark knob): warp 1 asks L2 for a waiting DN_RULE's state; off, the
    build has no such function. PTX for sm_90, the whole front end."""
    on = build.compile_megakernel(90, extra=("-DMK_DN_PREFETCH=1",), ptx=True).image.decode(errors="ignore")
    off = build.compile_megakernel(90, ptx=True).image.decode(errors="ignore")
    body = re.search(r"\.func[^;{]*prefetch_dn_state[^;{]*\{(.*?)\n\}\n", on, re.S)  # its definition, to its end
    assert body and "prefetch.global.L2" in body.group(1) and "prefetch_dn_state" not in off
