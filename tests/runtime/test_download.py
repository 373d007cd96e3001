"""Verified downloads against a Hugging Face hub and a PyPI index served on loopback by the tests."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")  # read when huggingface_hub is imported; set per test too

import pytest
from huggingface_hub import constants as hf_constants

from openjet_tui.runtime.catalog import ModelEntry, Source
from openjet_tui.runtime.download import describe_plan, fetch_model, find_ready_model, model_path
from openjet_tui.runtime.errors import (
    ChecksumMismatchError, DiskSpaceError, SourceNotFoundError, SourceUnreachableError, UnverifiedModelError,
)
from openjet_tui.runtime.partfile import part_paths
from openjet_tui.runtime.verify import read_stamp
from tests.runtime.servers import Behaviour, LoopbackServer

# huggingface_hub writes what it receives in 10 MiB chunks: a cut at 12 MiB leaves one chunk on disk to resume from.
CHUNK = hf_constants.DOWNLOAD_CHUNK_SIZE
PAYLOAD = os.urandom(2 * CHUNK + (3 << 20))
CUT = CHUNK + (2 << 20)
SHA = hashlib.sha256(PAYLOAD).hexdigest()
REPO, PATH = "acme/tiny-GGUF", "tiny-q4_k_m.gguf"


def _model(sources: list[Source], sha256: str = SHA, size: int = len(PAYLOAD)) -> ModelEntry:
    return ModelEntry(name="tiny", title="Tiny Q4_K_M", arch="qwen2", quant="Q4_K_M", filename="tiny.gguf",
                      size=size, is_size_exact=True, sha256=sha256, context_length=4096, default_context=2048,
                      kv_bytes_per_token=1024, overhead_mib=16, is_gpu_only=False, sources=sources)


HUB_SOURCE = Source(kind="huggingface", repo=REPO, path=PATH)


@pytest.fixture
def hub(monkeypatch):
    """A loopback hub holding PAYLOAD at acme/tiny-GGUF/tiny-q4_k_m.gguf."""
    server = LoopbackServer(Behaviour(hub_files={f"{REPO}/{PATH}": PAYLOAD}))
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield server
    server.close()


def _gets(server: LoopbackServer) -> list[tuple[str, str, str]]:
    return [r for r in server.behaviour.requests if r[0] == "GET"]


def test_hub_download_with_progress_then_cached(hub, tmp_path):
    events = []
    result = fetch_model(_model([HUB_SOURCE]), folder=tmp_path, progress=events.append)
    assert result.path.read_bytes() == PAYLOAD and result.sha256 == SHA and result.is_pinned
    assert not result.was_cached and "Hugging Face acme/tiny-GGUF" in result.source
    downloads = [e for e in events if e.task == "download tiny.gguf"]
    assert downloads[-1].is_finished and downloads[-1].done == len(PAYLOAD) == downloads[-2].total
    assert any(e.task == "verify tiny.gguf.part" and e.is_finished for e in events)
    assert read_stamp(result.path).sha256 == SHA
    assert not part_paths(result.path)[0].exists() and not part_paths(result.path)[1].exists()
    # A second call uses the verified file and sends nothing.
    num_requests = len(hub.behaviour.requests)
    again = fetch_model(_model([HUB_SOURCE]), folder=tmp_path)
    assert again.was_cached and len(hub.behaviour.requests) == num_requests


def test_interrupted_transfer_resumes_within_the_run(hub, tmp_path):
    hub.behaviour.cut_after = CUT
    result = fetch_model(_model([HUB_SOURCE]), folder=tmp_path)
    assert result.path.read_bytes() == PAYLOAD
    assert [r[2] for r in _gets(hub)] == ["", f"bytes={CHUNK}-"]


def test_interrupted_download_resumes_in_a_later_run(hub, tmp_path):
    hub.behaviour.cut_after, hub.behaviour.status_after_cut = CUT, 503
    with pytest.raises(SourceUnreachableError, match="partial file is kept"):
        fetch_model(_model([HUB_SOURCE]), folder=tmp_path)
    part = part_paths(tmp_path / "tiny.gguf")[0]
    assert part.stat().st_size == CHUNK
    assert find_ready_model(_model([HUB_SOURCE]), tmp_path) is None  # a partial file is never used
    hub.behaviour.status_after_cut = None
    result = fetch_model(_model([HUB_SOURCE]), folder=tmp_path)
    assert result.path.read_bytes() == PAYLOAD
    assert _gets(hub)[-1][2] == f"bytes={CHUNK}-"


def test_corrupted_file_is_rejected_and_deleted(hub, tmp_path):
    hub.behaviour.hub_files[f"{REPO}/{PATH}"] = PAYLOAD[:-1] + bytes([PAYLOAD[-1] ^ 1])
    with pytest.raises(ChecksumMismatchError, match="has been deleted"):
        fetch_model(_model([HUB_SOURCE]), folder=tmp_path)
    assert not (tmp_path / "tiny.gguf").exists() and not part_paths(tmp_path / "tiny.gguf")[0].exists()


def test_missing_file_is_reported(hub, tmp_path):
    source = Source(kind="huggingface", repo=REPO, path="absent.gguf")
    with pytest.raises(SourceNotFoundError, match="has no file acme/tiny-GGUF/absent.gguf"):
        fetch_model(_model([source]), folder=tmp_path)


def test_full_disk_is_refused_before_any_transfer(hub, tmp_path):
    too_big = shutil.disk_usage(tmp_path).free + (1 << 40)  # larger than this filesystem's free space
    hub.behaviour.hub_sizes[f"{REPO}/{PATH}"] = too_big
    with pytest.raises(DiskSpaceError, match="GiB free"):
        fetch_model(_model([HUB_SOURCE], size=too_big), folder=tmp_path)
    assert _gets(hub) == [] and not part_paths(tmp_path / "tiny.gguf")[0].exists()


def test_unknown_hash_needs_explicit_permission(hub, tmp_path):
    with pytest.raises(UnverifiedModelError, match="--allow-unverified"):
        fetch_model(_model([HUB_SOURCE], sha256=""), folder=tmp_path)
    assert _gets(hub) == []
    result = fetch_model(_model([HUB_SOURCE], sha256=""), folder=tmp_path, allow_unverified=True)
    assert not result.is_pinned and SHA in result.notes[0]
    assert find_ready_model(_model([HUB_SOURCE], sha256=""), tmp_path) is None
    assert find_ready_model(_model([HUB_SOURCE], sha256=""), tmp_path, allow_unverified=True) == result.path


def test_existing_file_is_adopted_or_replaced(hub, tmp_path):
    dest = model_path(_model([HUB_SOURCE]), tmp_path)
    dest.write_bytes(PAYLOAD)
    result = fetch_model(_model([HUB_SOURCE]), folder=tmp_path)
    assert result.was_cached and _gets(hub) == [] and read_stamp(dest).sha256 == SHA
    dest.unlink()
    dest.write_bytes(b"not the model")
    result = fetch_model(_model([HUB_SOURCE]), folder=tmp_path)
    assert "has been deleted" in result.notes[0] and dest.read_bytes() == PAYLOAD


def test_dry_run_plan_describes_without_fetching(hub, tmp_path):
    plan = describe_plan(_model([HUB_SOURCE]), tmp_path)
    assert "fetch" in plan[0] and "sha256 pinned" in plan[0] and _gets(hub) == []
    assert "refused" in describe_plan(_model([HUB_SOURCE], sha256=""), tmp_path)[0]


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs mounted for the test (root only), so that a transfer can really run out of space."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "small-disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(folder)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def test_disk_filling_mid_transfer_fails_cleanly_and_resumes_later(hub, small_disk):
    """The pre-check passes, then another writer fills the disk while the body arrives: the download stops with a
    clear error, no model file exists or is usable, and once space is freed the next attempt resumes and verifies."""
    filler = small_disk / "filler"

    def fill_the_disk() -> None:
        """Leave 4 MiB free: less than the 23 MiB body still to come."""
        filler.write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - (4 << 20)))

    hub.behaviour.before_body = fill_the_disk
    with pytest.raises(DiskSpaceError, match=r"the disk filled up at \d+ of \d+ bytes of tiny.gguf"):
        fetch_model(_model([HUB_SOURCE, Source(kind="huggingface", repo=REPO, path="other.gguf")]),
                    folder=small_disk)
    assert len(_gets(hub)) == 1  # a full disk is not a reason to try the next source
    dest = small_disk / "tiny.gguf"
    assert not dest.exists() and find_ready_model(_model([HUB_SOURCE]), small_disk) is None
    kept = part_paths(dest)[0].stat().st_size
    assert kept < len(PAYLOAD)
    filler.unlink()
    result = fetch_model(_model([HUB_SOURCE]), folder=small_disk)
    assert result.path == dest and dest.read_bytes() == PAYLOAD and result.sha256 == SHA
    assert _gets(hub)[-1][2] == (f"bytes={kept}-" if kept else "")
