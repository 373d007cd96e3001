"""Where requests may go and what they carried: the airgap guard and the traffic log Slipstream shows."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from openjet_tui.errors import AirgappedError

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_loopback_host(host: str) -> bool:
    """True for loopback IP literals and the localhost names (no DNS lookup: that would itself leave the host)."""
    host = host.strip("[]").lower().rstrip(".")
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_of(url: str) -> str:
    """The host part of a URL, for messages and checks."""
    return urlsplit(url).hostname or ""


@dataclass(slots=True)
class NetworkGuard:
    """Refuses every non-loopback destination when airgapped; otherwise lets everything through."""

    airgapped: bool = False

    def check(self, url: str) -> None:
        """Raise AirgappedError if this URL may not be contacted."""
        if self.airgapped and not is_loopback_host(host_of(url)):
            raise AirgappedError(
                f"airgapped = true: refusing to connect to {host_of(url) or url!r}; only loopback addresses "
                "(127.0.0.1, ::1, localhost) may be contacted")


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport that checks every request against the guard before any socket is opened."""

    def __init__(self, guard: NetworkGuard, inner: httpx.AsyncBaseTransport | None = None):
        self.guard = guard
        self._inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Check, then hand over to the real transport."""
        self.guard.check(str(request.url))
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        """Close the real transport."""
        await self._inner.aclose()


@dataclass(slots=True)
class TrafficRecord:
    """One request sent to an endpoint: how many bytes went out and came back, and the tokens it cost."""

    endpoint: str
    request_bytes: int
    response_bytes: int
    num_messages: int
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    status: int | None = None
    error: str | None = None
    started_at: float = field(default_factory=time.time)


class TrafficLog:
    """Every request a client sent, in order; listeners hear about each one as it completes."""

    def __init__(self) -> None:
        self.records: list[TrafficRecord] = []
        self._listeners: list[Callable[[TrafficRecord], None]] = []

    def subscribe(self, listener: Callable[[TrafficRecord], None]) -> None:
        """Call listener with every record added from now on."""
        self._listeners.append(listener)

    def add(self, record: TrafficRecord) -> None:
        """Store a record and tell the listeners."""
        self.records.append(record)
        for listener in self._listeners:
            listener(record)

    @property
    def bytes_sent(self) -> int:
        """Total request bytes."""
        return sum(r.request_bytes for r in self.records)

    @property
    def tokens_sent(self) -> int:
        """Total prompt tokens the endpoint reported."""
        return sum(r.prompt_tokens or 0 for r in self.records)
