"""The servers OpenJet can talk to, their default addresses, and where their keys come from (env or keyring only)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from openjet_tui.errors import ProviderError
from openjet_tui.llm.network import host_of, is_loopback_host

KEYRING_SERVICE = "openjet"


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """What OpenJet knows about one kind of server."""

    name: str
    default_base_url: str | None
    description: str
    needs_key: bool = False
    extra_key_env: tuple[str, ...] = ()

    @property
    def key_env(self) -> tuple[str, ...]:
        """Environment variables checked for the key, in order."""
        own = "OPENJET_" + self.name.upper().replace("-", "_") + "_API_KEY"
        return (own, *self.extra_key_env)


PROVIDERS: dict[str, ProviderSpec] = {spec.name: spec for spec in (
    ProviderSpec("openjet", "http://127.0.0.1:18080/v1", "OpenJet's own engine (openjet-engine serve's default port)"),
    ProviderSpec("llama-server", "http://127.0.0.1:8080/v1", "llama.cpp's llama-server (start it with --jinja)",
                 extra_key_env=("LLAMA_API_KEY",)),
    ProviderSpec("ollama", "http://127.0.0.1:11434/v1", "Ollama's OpenAI-compatible API"),
    ProviderSpec("lmstudio", "http://127.0.0.1:1234/v1", "LM Studio's local server"),
    ProviderSpec("openai-compatible", None, "any OpenAI-compatible server (vLLM, SGLang, ...); needs base_url",
                 extra_key_env=("OPENAI_API_KEY",)),
    ProviderSpec("slipstream", "https://api.openai.com/v1", "the cloud orchestrator used by Slipstream",
                 needs_key=True, extra_key_env=("OPENAI_API_KEY",)),
)}


def key_env_names() -> frozenset[str]:
    """Every environment variable a provider reads its key from (kept out of shell commands' environment)."""
    return frozenset(name for spec in PROVIDERS.values() for name in spec.key_env)


@dataclass(slots=True)
class Endpoint:
    """A resolved server: provider, base URL, model, and the key (kept out of repr, logs and files)."""

    provider: str
    base_url: str
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    key_source: str | None = None  # "env:NAME" or "keyring": says where, never what

    @property
    def is_loopback(self) -> bool:
        """True when the server lives on this machine."""
        return is_loopback_host(host_of(self.base_url))

    @property
    def root_url(self) -> str:
        """The server root: base URL without a trailing /v1 (llama-server's /props, Ollama's /api live there)."""
        base = self.base_url.rstrip("/")
        return base[: -len("/v1")] if base.endswith("/v1") else base


def lookup_key(spec: ProviderSpec, use_keyring: bool = True) -> tuple[str | None, str | None]:
    """Find a provider's key: environment first, then the OS keyring; returns (key, where it came from)."""
    for name in spec.key_env:
        value = os.environ.get(name, "").strip()
        if value:
            return value, f"env:{name}"
    if not use_keyring:
        return None, None
    import keyring
    import keyring.errors

    try:
        value = keyring.get_password(KEYRING_SERVICE, spec.name)
    except keyring.errors.KeyringError:  # no usable backend on this machine: same as no key
        return None, None
    return (value, "keyring") if value else (None, None)


def resolve_endpoint(provider: str, base_url: str | None = None, model: str | None = None,
                     use_keyring: bool = True) -> Endpoint:
    """Turn a provider name and optional overrides into an Endpoint, or raise ProviderError saying what is missing."""
    spec = PROVIDERS.get(provider)
    if spec is None:
        raise ProviderError(f"unknown provider {provider!r}; choose one of: {', '.join(PROVIDERS)}")
    url = (base_url or spec.default_base_url or "").strip()
    if not url:
        raise ProviderError(f"provider {provider!r} needs a base URL: set base_url in the config or pass --base-url")
    if not url.startswith(("http://", "https://")) or not host_of(url):
        raise ProviderError(f"base URL {url!r} for provider {provider!r} must be an http:// or https:// URL")
    # a local server that needs no key gets no keyring lookup (it could pop up a desktop unlock prompt)
    needs_keyring = use_keyring and (spec.needs_key or not is_loopback_host(host_of(url)))
    key, source = lookup_key(spec, needs_keyring)
    if spec.needs_key and key is None and not is_loopback_host(host_of(url)):
        raise ProviderError(
            f"provider {provider!r} needs an API key: set {spec.key_env[0]} in the environment or store it with "
            f"`keyring set {KEYRING_SERVICE} {spec.name}` (keys are never read from config files)")
    return Endpoint(provider, url.rstrip("/"), model or None, key, source)
