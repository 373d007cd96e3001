"""Programmatic dependent launch: under it (by default the passes of 1, 2, 4 and 5-8 tokens on sm_90+, every pass
with OPENJET_CUDA_PDL=1) every per-op kernel may start before its predecessor has finished, so each must wait
(PDL_ENTER) before it touches anything an earlier kernel wrote. These checks run without a GPU: a kernel added
without the wait would race under PDL and is caught here."""

from __future__ import annotations

import re

import pytest

from engine.cuda import nvrtc

# Kernels whose PDL_ENTER comes after their first weight copies (weights are never written during a pass);
# every other kernel waits before its first statement.
WAIT_AFTER_WEIGHT_PREFETCH = {"mmvq_cp", "mmvq_cpa", "mmvq_persist", "mmvq_i8b", "mmvq_i8v", "mmvq_i8", "mmvq_q6_i8",
                              "mmvq_q6_i8b", "mmvq_q6_i8v"}
# Kernels whose PDL_ENTER comes after loads of their layer's recurrent state (the delta rule: S, the conv window's
# state rows, the conv and gate weights), which only kernels two or more launches back write: a kernel triggers its
# dependents only after its own wait, so those have finished. Nothing of the pass's activations is read and
# nothing global is written before the wait.
WAIT_AFTER_STATE_PREFETCH = {"gdn_recurrent": {"p.state", "p.window", "p.conv_w", "p.a", "p.dt_bias"}}
# ... and the launch's sizes and flags they may read beside them
SIZES = {"p.num_k_heads", "p.Dk", "p.Dv", "p.prepared", "p.save", "p.C"}
# Kernels whose PDL_ENTER comes after copies of KV cache rows that earlier passes wrote (attention: keys below the
# pass's first position, which qk_prep's writes of this pass do not reach; positions is set before a pass), into
# shared memory only, and the sizes that place them.
CACHE_PREFETCH_READS = {"a.positions", "a.kcache", "a.vcache", "a.capacity", "a.T", "a.num_heads", "a.num_kv_heads",
                        "a.tile_tokens", "a.min_keys_log2"}
WAIT_AFTER_CACHE_PREFETCH = {"attn": CACHE_PREFETCH_READS, "attn_prep": CACHE_PREFETCH_READS}


def _body_at(src: str, start: int) -> str:
    """The text between the first "{" after the parameter list opened at or after start and its matching "}"."""
    open_at = src.index("{", src.index(")", start))
    depth, i = 0, open_at
    while True:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        if depth == 0:
            return src[open_at + 1:i]
        i += 1


def kernel_bodies() -> dict[str, str]:
    """name -> body text of every __global__ function in kernels/*.cu (braces matched); a kernel whose body is one
    call of a __device__ function of its file (attn, attn_prep: attn_body) gets that function's body."""
    bodies = {}
    for path in sorted(nvrtc.KERNEL_DIR.glob("*.cu")):
        src = path.read_text()
        for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\)?\s*)?(?:\)\s*)?(\w+)\s*\(", src):
            body = _body_at(src, m.end())
            call = re.fullmatch(r"\s*(\w+)\s*<[^;]*>\s*\([^;]*\);\s*", body)
            device = call and re.search(rf"__device__[^;{{]*\b{call.group(1)}\s*\(", src)
            bodies[m.group(1)] = _body_at(src, device.end()) if device else body
    return bodies


def test_every_kernel_is_found() -> None:
    names = set(kernel_bodies())
    assert {"mmvq", "mmvq_cp", "mmvq_persist", "gemm", "attn", "gdn_recurrent", "act_from", "rms_norm",
            "choose_rows"} <= names
    total = sum(p.read_text().count("__global__") for p in nvrtc.KERNEL_DIR.glob("*.cu"))
    assert len(names) == total


@pytest.mark.parametrize("name", sorted(kernel_bodies()))
def test_kernel_waits_for_its_predecessor(name: str) -> None:
    body = kernel_bodies()[name]
    assert body.count("PDL_ENTER();") == 1, f"{name} must call PDL_ENTER() exactly once"
    before = body.split("PDL_ENTER();")[0]
    if name in WAIT_AFTER_STATE_PREFETCH:
        reads = set(re.findall(r"\bp\.\w+", before))
        assert reads <= WAIT_AFTER_STATE_PREFETCH[name] | SIZES, (name, reads - WAIT_AFTER_STATE_PREFETCH[name] - SIZES)
        stores = re.findall(r"(\w+)\[[^\]=;]*\](?:\[[^\]=;]*\])*\s*=[^=]", before)
        assert set(stores) <= {"s", "wq", "wk", "hq", "hkk", "hv"}, (name, stores)  # registers
        assert "gdn_load" not in before, name  # the token loads read the pass's activations
    elif name in WAIT_AFTER_CACHE_PREFETCH:
        reads = set(re.findall(r"\ba\.\w+", before))
        assert reads <= WAIT_AFTER_CACHE_PREFETCH[name], (name, reads - WAIT_AFTER_CACHE_PREFETCH[name])
        stores = re.findall(r"(\w+(?:\[[^\]=;]*\])+)\s*=[^=]", before)
        assert not stores, (name, stores)  # nothing stored before the wait but the copies into shared memory
        assert "cp_async16(smem_u32(" in before, name
    elif name in WAIT_AFTER_WEIGHT_PREFETCH:
        # only the weight ring's first copies may precede the wait: no activation, output or count access
        code = re.sub(r"//[^\n]*", "", before).replace("cp_async", "")  # (comments may name them)
        for arg in ("act", "sums", "q8", "scale8", "y[", "y +", "residual", "counts", "partials", "bias"):
            assert not re.search(rf"\b{re.escape(arg)}", code), (name, arg)
    else:
        assert before.strip() == "", f"{name}: PDL_ENTER() must be its first statement"


def test_the_wait_is_compiled_only_where_the_hardware_has_it() -> None:
    """griddepcontrol is sm_90+: the sm_90 PTX holds it, the sm_80 PTX does not (the macro is empty there)."""
    source = nvrtc.KERNEL_DIR / "norm.cu"
    ptx90 = nvrtc.compile_file(source, 90, ("rms_norm",), ptx=True).image.decode()
    ptx80 = nvrtc.compile_file(source, 80, ("rms_norm",), ptx=True).image.decode()
    assert "griddepcontrol.wait" in ptx90 and "griddepcontrol.launch_dependents" in ptx90
    assert "griddepcontrol" not in ptx80


def test_the_default_policy_launches_the_measured_passes_with_pdl(monkeypatch) -> None:
    """Unset: PDL on the passes of 1-4 and PDL_VERIFY_TOKENS..VERIFY_MAX tokens (where it measured faster),
    never on a prefill chunk; "1" and "0" force it on and off; before sm_90 it is always off."""
    from engine.cuda.device import PDL_ENV, PDL_VERIFY_TOKENS, _pdl_policy, pdl_for
    from engine.cuda.model import VERIFY_MAX

    monkeypatch.delenv(PDL_ENV, raising=False)
    policy = _pdl_policy(90)
    assert policy == "auto"
    on = [n for n in range(1, 65) if pdl_for(policy, n, VERIFY_MAX)]
    assert on == [1, 2, 3, 4] + list(range(PDL_VERIFY_TOKENS, VERIFY_MAX + 1))
    assert _pdl_policy(89) == "off" and _pdl_policy(80) == "off"
    monkeypatch.setenv(PDL_ENV, "1")
    assert _pdl_policy(90) == "on" and pdl_for("on", 1, VERIFY_MAX) and pdl_for("on", 512, VERIFY_MAX)
    assert _pdl_policy(86) == "off"
    monkeypatch.setenv(PDL_ENV, "0")
    assert _pdl_policy(90) == "off" and not any(pdl_for("off", n, VERIFY_MAX) for n in range(1, 65))
