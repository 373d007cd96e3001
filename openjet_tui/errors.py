"""Failures a person can read. Raised inside the app, turned into messages only at the boundary (CLI, UI)."""


class OpenJetError(Exception):
    """Base class for every OpenJet application failure shown to a user."""


class ConfigError(OpenJetError):
    """A settings file, environment variable or option that cannot be used."""


class ProviderError(OpenJetError):
    """A provider that is unknown, misconfigured, or lacks a key it needs."""


class LLMError(OpenJetError):
    """A chat request that failed."""


class LLMConnectionError(LLMError):
    """The model server could not be reached, even after retries, or the connection dropped mid-reply."""


class LLMResponseError(LLMError):
    """The model server answered with an error status or a malformed stream."""

    def __init__(self, message: str, status: int | None = None):
        self.status = status
        super().__init__(message)


class ServerCapabilityError(LLMError):
    """The server cannot serve this agent: no tool calls, or a context window too small for the prompt."""


class ContextWindowError(ServerCapabilityError):
    """The conversation no longer fits the model's context window."""


class AirgappedError(OpenJetError):
    """A non-loopback connection (or Slipstream) was attempted while `airgapped = true`."""


class WorkspaceError(OpenJetError):
    """A path that cannot be used: outside the workspace, missing, or not a text file."""


class StaleProposalError(OpenJetError):
    """A proposal whose file changed on disk after the proposal was made."""


class SessionError(OpenJetError):
    """A session that does not exist, or a session database that cannot be used."""
