"""Engine selection: every engine gets a decision with its reason; tested on this machine's real hardware probe,
real GGUF headers, a real llama-server on PATH and real local-server probes."""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import httpx
import pytest

from engine.gguf.testmodel import write_test_model
from openjet_tui.runtime.engines import (
    IS_MEGAKERNEL_SERVED, Facts, engine_command, gather_facts, megakernel_blocker, select_engine,
)
from openjet_tui.runtime.errors import RuntimeSetupError
from openjet_tui.runtime.ggufinfo import GGUFHeaderError, ModelFileInfo, TensorEntry, read_model_info
from openjet_tui.runtime.hardware import GpuInfo, HardwareInfo
from openjet_tui.runtime.launch import start_engine
from openjet_tui.runtime.localservers import probe_ollama
from openjet_tui.runtime.setup import SetupOptions, run_setup
from openjet_tui.runtime.worker import EngineWorker, WorkerSpec
from tests.runtime.procs import wait_gone

REAL_LLAMA_SERVER = Path.home() / ".cache/openjet/llama.cpp/b11434-cpu/bin/llama-server"
REAL_SMALL_MODEL = Path.home() / ".cache/openjet/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
H200 = GpuInfo(0, "NVIDIA H200", (9, 0), 140 << 30, 139 << 30)
DOUBLE = Path(__file__).with_name("engine_double.py")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """Tiny real GGUF files of two architectures (no tokenizer: only the header matters here)."""
    folder = tmp_path_factory.mktemp("models")
    return {arch: write_test_model(folder / f"{arch}.gguf", arch, tokenizer=False) for arch in ("qwen2", "qwen35")}


@pytest.fixture
def no_llama_server(monkeypatch, tmp_path):
    """A PATH without llama-server (the cache is already isolated)."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin") + os.pathsep + "/usr/bin:/bin")
    monkeypatch.delenv("OPENJET_LLAMA_SERVER", raising=False)


def _qwen38_header(path: Path) -> ModelFileInfo:
    """The header facts of a Qwen3.8-27B Q4_K_M file (a full file is 17 GB; selection reads only these)."""
    meta = {"qwen35.embedding_length": 5120, "qwen35.block_count": 65, "qwen35.nextn_predict_layers": 1,
            "qwen35.attention.head_count": 24, "qwen35.attention.head_count_kv": 4,
            "qwen35.attention.key_length": 256, "qwen35.attention.value_length": 256,
            "qwen35.full_attention_interval": 4}
    tensors = {f"blk.64.nextn.{t}.weight": TensorEntry(f"blk.64.nextn.{t}.weight", (5120,), "F32")
               for t in ("eh_proj", "enorm", "hnorm", "shared_head_norm")}
    return ModelFileInfo(path=path, arch="qwen35", name="Qwen3.8-27B", metadata=meta, tensors=tensors,
                         size=17_110_000_000)


def test_no_gpu_gives_the_reason_and_the_cpu_path(tiny_models, no_llama_server):
    facts = gather_facts(tiny_models["qwen2"], probe_local=False)
    selection = select_engine(facts)
    by_engine = {d.engine: d for d in selection.decisions}
    if not facts.hardware.has_gpu:
        assert "no NVIDIA GPU" in by_engine["megakernel"].reason and "no NVIDIA GPU" in by_engine["cuda"].reason
        assert not by_engine["megakernel"].is_available and not by_engine["cuda"].is_available
    assert "not on PATH and not built yet" in by_engine["llama-server"].reason
    assert facts.has_engine_server  # openjet-engine serve is part of this install
    assert selection.chosen.engine == "reference" and "slow" in selection.chosen.reason
    assert len(selection.lines()) == 6 and all(": " in line for line in selection.lines())


def stand_in_llama_server(bin_dir: Path) -> Path:
    """A `llama-server` executable in bin_dir that runs the engine double with llama-server's command line."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "llama-server"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DOUBLE}" "$@"\n')
    script.chmod(0o755)
    return script


def test_llama_server_on_path_is_used_with_the_reason_shown(tmp_path, monkeypatch):
    """Whatever the machine has built: a llama-server found on PATH is chosen over the reference engine, with the
    reason naming it, and the launch path starts it (with the model and a port) as a real process."""
    script = stand_in_llama_server(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}/usr/bin:/bin")
    monkeypatch.delenv("OPENJET_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:9")
    model = write_test_model(tmp_path / "tiny.gguf", "qwen2", tokenizer=False)
    record = run_setup(SetupOptions(model=str(model), context=2048)).record
    assert record.engine in ("llama-server", "cuda")  # per-op CUDA comes first on a GPU machine
    session = start_engine(record, forced=None if record.engine == "llama-server" else "llama-server",
                           start_build=False)
    try:
        assert (session.engine, session.provider) == ("llama-server", "llama-server")
        assert session.reason == f"llama-server at {script} (PATH)"
        assert f"[chosen] llama-server: llama-server at {script} (PATH)" in session.selection.lines()
        props = httpx.get(f"{session.worker.base_url}/props", timeout=5).json()
        assert props["model_path"] == str(model.resolve())  # the file setup recorded, handed over with -m
        reply = httpx.post(f"{session.base_url}/chat/completions", timeout=10,
                           json={"messages": [{"role": "user", "content": "Hi"}]})
        assert reply.json()["choices"][0]["message"]["content"]
        pid = session.worker.pid
    finally:
        session.close()
    assert wait_gone(pid)


@pytest.mark.skipif(not (REAL_LLAMA_SERVER.exists() and REAL_SMALL_MODEL.exists()),
                    reason="needs the cached llama-server build and the real small model")
def test_real_llama_server_on_path_is_chosen_and_served(tmp_path, monkeypatch):
    """The same with the real build, where this machine has one (an extra to the stand-in test above)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llama-server").symlink_to(REAL_LLAMA_SERVER)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    facts = gather_facts(REAL_SMALL_MODEL, context=2048, probe_local=False)
    selection = select_engine(facts)
    assert selection.chosen.engine == "llama-server"
    assert selection.chosen.reason == f"llama-server at {bin_dir / 'llama-server'} (PATH)"
    command = engine_command("llama-server", REAL_SMALL_MODEL, 2048, facts)
    worker = EngineWorker(WorkerSpec("llama-server", command, start_timeout_s=120)).start()
    try:
        models = httpx.get(f"{worker.base_url}/v1/models", timeout=10).json()
        assert models["data"][0]["id"]
        pid = worker.pid
    finally:
        worker.stop()
    assert wait_gone(pid)


def test_megakernel_needs_the_qwen38_shape_and_mtp_head(tiny_models):
    tiny = read_model_info(tiny_models["qwen35"])
    assert "embedding_length is 256" in megakernel_blocker(tiny)
    assert "is qwen2; the megakernel runs qwen35 only" in megakernel_blocker(read_model_info(tiny_models["qwen2"]))
    full = _qwen38_header(tiny_models["qwen35"])
    assert megakernel_blocker(full) == ""
    del full.tensors["blk.64.nextn.hnorm.weight"]
    assert "no MTP head: blk.64.nextn.{hnorm} missing" in megakernel_blocker(full)


def test_gpu_machine_prefers_megakernel_then_per_op_by_vram(tiny_models):
    full = _qwen38_header(tiny_models["qwen35"])
    selection = select_engine(Facts(hardware=HardwareInfo(gpus=[H200]), model=full, context=32768))
    megakernel, cuda = selection.decisions[:2]
    # openjet-engine serve has no megakernel backend yet: it is never chosen, and says why (and that it would fit).
    assert not megakernel.is_available and megakernel.reason.startswith(
        "not yet served by openjet-engine (bench/MEGAKERNEL.md); this GPU and file would qualify: ")
    assert selection.chosen is cuda and "139.0 GiB free" in cuda.reason and "MTP head" not in cuda.reason
    with pytest.raises(RuntimeSetupError, match="megakernel.*not yet served"):
        engine_command("megakernel", full.path, 32768, selection.facts)
    # Once it is served, the same facts choose it first and per-op CUDA becomes the runner-up.
    served = select_engine(Facts(hardware=HardwareInfo(gpus=[H200]), model=full, context=32768,
                                 is_megakernel_served=True))
    assert served.chosen.engine == "megakernel" and "not needed" in served.decisions[1].reason
    card_16g = GpuInfo(0, "RTX 4080", (8, 9), 16 << 30, 15 << 30)
    selection = select_engine(Facts(hardware=HardwareInfo(gpus=[card_16g]), model=full, context=32768))
    assert selection.chosen.engine == "reference"
    assert "too little" in selection.decisions[0].reason and "too little" in selection.decisions[1].reason
    small = read_model_info(tiny_models["qwen2"])
    selection = select_engine(Facts(hardware=HardwareInfo(gpus=[card_16g]), model=small))
    assert selection.chosen.engine == "cuda" and "15.0 GiB free" in selection.chosen.reason
    assert "megakernel runs qwen35 only" in selection.decisions[0].reason
    turing = GpuInfo(0, "Tesla T4", (7, 5), 16 << 30, 15 << 30)
    selection = select_engine(Facts(hardware=HardwareInfo(gpus=[turing]), model=small))
    assert "Tesla T4 (sm_75): the CUDA engines need sm_80 or newer" == selection.decisions[1].reason
    assert selection.decisions[0].reason.endswith("; Tesla T4 (sm_75): the CUDA engines need sm_80 or newer")


def test_megakernel_flag_follows_the_engine_server():
    """IS_MEGAKERNEL_SERVED must change the day `openjet-engine serve --backend megakernel` exists."""
    from engine.server.loader import BACKENDS

    assert IS_MEGAKERNEL_SERVED == ("megakernel" in BACKENDS)


def test_running_ollama_is_found_and_preferred_over_the_reference(tiny_models):
    class Tags(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"models": [{"name": "llama3:8b"}, {"name": "qwen2.5-coder:7b"}]}).encode()
            self.send_response(200 if self.path == "/api/tags" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Tags)
    Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        ollama = probe_ollama(f"http://127.0.0.1:{httpd.server_address[1]}")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert ollama.is_running and ollama.preferred_model() == "qwen2.5-coder:7b"
    facts = Facts(hardware=HardwareInfo(), model=read_model_info(tiny_models["qwen2"]), local_servers=[ollama])
    selection = select_engine(facts)
    assert selection.chosen.engine == "ollama" and "would use qwen2.5-coder:7b" in selection.chosen.reason
    assert "not needed: Ollama comes first" in selection.decisions[-1].reason
    assert probe_ollama("http://127.0.0.1:9").error == "not running"


def test_forcing_an_engine_and_bad_inputs(tiny_models, tmp_path):
    facts = Facts(hardware=HardwareInfo(gpus=[H200]), model=read_model_info(tiny_models["qwen2"]))
    assert select_engine(facts, forced="reference").chosen.engine == "reference"
    with pytest.raises(RuntimeSetupError, match="unknown engine 'vllm'"):
        select_engine(facts, forced="vllm")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x01" * 7)
    with pytest.raises(GGUFHeaderError, match="truncated or corrupt"):
        read_model_info(broken)
    broken.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(GGUFHeaderError, match="not a GGUF file"):
        read_model_info(broken)
    facts = gather_facts(broken, probe_local=False)
    assert facts.model is None and "not a GGUF file" in select_engine(facts).decisions[2].reason  # llama-server


def test_engine_commands_carry_model_port_and_backend(tiny_models):
    model = tiny_models["qwen2"]
    facts = Facts(hardware=HardwareInfo(), model=read_model_info(model))
    command = engine_command("reference", model, 4096, facts)
    assert command[:4] == [sys.executable, "-m", "engine.cli", "serve"]
    assert command[command.index("--backend") + 1] == "reference" and "{port}" in command
    with pytest.raises(RuntimeSetupError, match="not started by OpenJet"):
        engine_command("ollama", model, 4096, facts)
