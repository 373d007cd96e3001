"""Fetching one file from the Hugging Face hub through huggingface_hub, into a partial file that survives restarts.

huggingface_hub's own `hf_hub_download` deletes its partial file when a transfer fails, so a killed download would
start again from zero. We use its metadata, URL, auth and transfer functions on a `.part` file of our own instead:
the transfer resumes within a run (huggingface_hub retries with a Range request) and across runs (we pass the bytes
already on disk as `resume_size`).
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors
from huggingface_hub import HfFileMetadata, get_hf_file_metadata, hf_hub_url
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers
from huggingface_hub.utils import tqdm as hf_tqdm

from openjet_tui.llm.network import NetworkGuard
from openjet_tui.runtime.airgap import check_url, settings_guard
from openjet_tui.runtime.catalog import Source
from openjet_tui.runtime.errors import (
    DiskSpaceError, SourceMismatchError, SourceNotFoundError, SourceUnreachableError,
)
from openjet_tui.runtime.partfile import check_disk_space, part_paths
from openjet_tui.runtime.progress import ProgressCallback, ProgressEvent


def _transport_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [hf_errors.HfHubHTTPError, httpx.HTTPError, OSError]
    try:
        import httpx2  # the HTTP client of huggingface_hub 1.x and later

        errors.append(httpx2.HTTPError)
    except ImportError:
        pass  # older releases use requests, whose errors are OSErrors
    return tuple(errors)


TRANSPORT_ERRORS = _transport_errors()
METADATA_TIMEOUT_S = 10.0


def hub_endpoint() -> str:
    """The hub to talk to, read at call time: $HF_ENDPOINT, else huggingface_hub's default."""
    return (os.environ.get("HF_ENDPOINT") or hf_constants.ENDPOINT).rstrip("/")


@dataclass(slots=True)
class PartialInfo:
    """What a `.part` file was being downloaded from; a resume only continues the very same file."""

    url: str
    etag: str
    commit: str
    size: int


def _tqdm_bridge(progress: ProgressCallback, task: str) -> type[hf_tqdm]:
    """A tqdm class that turns huggingface_hub's progress updates into ProgressEvents."""

    class Bridge(hf_tqdm):
        """Counts bytes itself (tqdm is disabled) and forwards every update."""

        def __init__(self, *args: object, **kwargs: object):
            self._done = float(kwargs.get("initial") or 0)  # type: ignore[arg-type]
            self._total = kwargs.get("total")
            kwargs["disable"] = True  # we render, not tqdm
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            """Advance by n bytes (negative when huggingface_hub rewinds after a refused Range)."""
            self._done += n or 0
            progress(ProgressEvent(task, self._done, self._total))  # type: ignore[arg-type]
            return None

    return Bridge


def _metadata(source: Source, revision: str, guard: NetworkGuard) -> tuple[str, HfFileMetadata]:
    url = hf_hub_url(source.repo, source.path, revision=revision, endpoint=hub_endpoint())
    where = f"{source.repo}/{source.path} at {revision}"
    check_url(guard, url, "the Hugging Face hub")
    try:
        # One try with huggingface_hub's 10 s timeout: an unreachable hub must hand over to the next source quickly.
        return url, get_hf_file_metadata(url, timeout=METADATA_TIMEOUT_S, retry_on_errors=False,
                                         endpoint=hub_endpoint())
    except hf_errors.RemoteEntryNotFoundError:
        raise SourceNotFoundError(f"Hugging Face hub has no file {where}") from None
    except hf_errors.RevisionNotFoundError:
        raise SourceNotFoundError(f"Hugging Face hub has no revision {revision} of {source.repo}") from None
    except hf_errors.RepositoryNotFoundError:
        raise SourceNotFoundError(f"Hugging Face hub has no repository {source.repo} (or it is gated)") from None
    except TRANSPORT_ERRORS as error:
        raise SourceUnreachableError(f"cannot reach the Hugging Face hub at {hub_endpoint()}: {error}") from None


def _resume_offset(part: Path, sidecar: Path, info: PartialInfo) -> int:
    """Bytes of `part` that belong to the same remote file; anything else is discarded."""
    try:
        previous = PartialInfo(**json.loads(sidecar.read_text()))
    except (OSError, ValueError, TypeError):
        previous = None
    size = part.stat().st_size if part.exists() else 0
    if previous != info or size > info.size:
        part.unlink(missing_ok=True)  # a different file (or revision) than the one on disk: start over
        size = 0
    sidecar.write_text(json.dumps(asdict(info)))
    return size


def fetch_hub_file(source: Source, dest: Path, expected_size: int | None, progress: ProgressCallback,
                   guard: NetworkGuard | None = None) -> Path:
    """Download `source` into dest's `.part` file (resuming what is there) and return the complete part; `guard`
    (default: the `airgapped` setting) vets every URL before it is contacted."""
    if hf_constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE") == "1":
        raise SourceUnreachableError("HF_HUB_OFFLINE is set: the Hugging Face hub is not contacted")
    guard = guard or settings_guard()
    revision = source.revision or "main"
    url, meta = _metadata(source, revision, guard)
    size = meta.size if meta.size is not None else expected_size
    if size is None:
        raise SourceMismatchError(f"the hub did not report the size of {source.repo}/{source.path}")
    if expected_size is not None and size != expected_size:
        raise SourceMismatchError(f"the hub's {source.repo}/{source.path} is {size} bytes, the catalog's file "
                                  f"{expected_size}: not the same file")
    check_url(guard, meta.location, "the Hugging Face hub's download location")  # may redirect to a CDN
    part, sidecar = part_paths(dest)
    info = PartialInfo(url=url, etag=meta.etag or "", commit=meta.commit_hash or "", size=size)
    offset = _resume_offset(part, sidecar, info)
    check_disk_space(dest.parent, size - offset, f"downloading {dest.name}")
    task = f"download {dest.name}"
    headers = build_hf_headers(headers={"Accept-Encoding": "identity"})
    try:
        with part.open("ab") as handle:
            http_get(meta.location, handle, resume_size=offset, headers=headers, expected_size=size,
                     displayed_filename=dest.name, tqdm_class=_tqdm_bridge(progress, task))
    except TRANSPORT_ERRORS as error:
        kept = part.stat().st_size if part.exists() else 0
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            raise DiskSpaceError(f"the disk filled up at {kept} of {size} bytes of {dest.name}") from None
        raise SourceUnreachableError(f"download of {dest.name} interrupted at {kept} of {size} bytes ({error}); "
                                     f"the partial file is kept and the next attempt resumes it") from None
    progress(ProgressEvent(task, size, size, is_finished=True))
    return part
