"""sha256 checks and the stamp that marks a model file as verified; a file without a valid stamp is never used."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from openjet_tui.runtime.errors import ChecksumMismatchError
from openjet_tui.runtime.progress import ProgressCallback, ProgressEvent, no_progress

HASH_CHUNK = 8 << 20


@dataclass(slots=True)
class VerifiedStamp:
    """What was checked about a file, so a later start need not hash it again while size and mtime hold."""

    sha256: str
    size: int
    mtime_ns: int
    source: str
    is_pinned: bool  # False: the catalog had no hash and the user allowed an unverified file
    checked_at: float


def stamp_path(path: Path) -> Path:
    """Where the stamp of a model file lives."""
    return path.with_name(path.name + ".verified.json")


def sha256_file(path: Path, progress: ProgressCallback = no_progress, task: str = "") -> str:
    """The hex sha256 of a file, reporting bytes hashed."""
    task = task or f"verify {path.name}"
    total, done = path.stat().st_size, 0
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            progress(ProgressEvent(task, done, total))
    progress(ProgressEvent(task, done, total, is_finished=True))
    return digest.hexdigest()


def check_sha256(path: Path, expected: str, progress: ProgressCallback = no_progress) -> str:
    """Hash `path`; on a mismatch with a known `expected`, delete the file and raise saying so."""
    actual = sha256_file(path, progress)
    if expected and actual != expected:
        size = path.stat().st_size
        path.unlink()
        raise ChecksumMismatchError(
            f"{path.name}: sha256 {actual} does not match the catalog's {expected} ({size} bytes); "
            f"the file has been deleted")
    return actual


def write_stamp(path: Path, sha256: str, source: str, is_pinned: bool) -> VerifiedStamp:
    """Record that `path` (as it is now on disk) has hash `sha256`."""
    stat = path.stat()
    stamp = VerifiedStamp(sha256=sha256, size=stat.st_size, mtime_ns=stat.st_mtime_ns, source=source,
                          is_pinned=is_pinned, checked_at=time.time())
    tmp = stamp_path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(stamp), indent=1))
    tmp.replace(stamp_path(path))
    return stamp


def read_stamp(path: Path) -> VerifiedStamp | None:
    """The stamp of `path` if it exists and still describes the file on disk (same size and mtime)."""
    try:
        stamp = VerifiedStamp(**json.loads(stamp_path(path).read_text()))
        stat = path.stat()
    except (OSError, ValueError, TypeError):
        return None
    if stamp.size != stat.st_size or stamp.mtime_ns != stat.st_mtime_ns:
        return None  # the file changed after it was checked
    return stamp


def is_usable(path: Path, expected_sha256: str, allow_unpinned: bool = True) -> bool:
    """Whether a model file may be used: a current stamp whose hash is the expected one (or, when the catalog
    knows no hash, a stamp the user allowed unverified)."""
    stamp = read_stamp(path)
    if stamp is None:
        return False
    if expected_sha256:
        return stamp.sha256 == expected_sha256
    return allow_unpinned
