"""`airgapped = true` for setup and downloads: every URL the runtime would fetch is checked with the agent's
NetworkGuard before a connection is opened, so a host the setting refuses is never contacted (not even resolved)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from openjet_tui.errors import AirgappedError, ConfigError
from openjet_tui.llm.network import NetworkGuard
from openjet_tui.runtime.errors import AirgappedSourceError, RuntimeSetupError


def settings_guard(airgapped: bool | None = None, workspace: Path | None = None) -> NetworkGuard:
    """A guard for `airgapped`; None reads the setting (user and project config, OPENJET_AIRGAPPED) for `workspace`
    (default: the current folder, the app's default workspace)."""
    if airgapped is None:
        from openjet_tui.config import load_settings  # pydantic settings: only when the setting is not given

        try:
            airgapped = load_settings(workspace or Path.cwd()).settings.airgapped
        except ConfigError as error:
            raise RuntimeSetupError(f"cannot read the settings to check `airgapped`: {error}") from None
    return NetworkGuard(airgapped)


def check_url(guard: NetworkGuard, url: str, what: str) -> None:
    """AirgappedSourceError naming the setting, `what` wanted the URL and the URL itself, when the guard refuses."""
    try:
        guard.check(url)
    except AirgappedError as error:
        raise AirgappedSourceError(f"{what} not contacted: {error} (URL {url})") from None


def guarded_client(guard: NetworkGuard, what: str, **options: Any) -> httpx.Client:
    """An httpx client that checks every request against the guard before it is sent (redirects included)."""

    def check(request: httpx.Request) -> None:
        """httpx request hook: runs before each request leaves, including every redirect hop."""
        check_url(guard, str(request.url), what)

    return httpx.Client(event_hooks={"request": [check]}, **options)
