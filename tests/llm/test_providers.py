"""Providers: defaults, overrides, and keys from the environment or the OS keyring only."""

import keyring
import pytest
from keyring.backend import KeyringBackend

from openjet_tui.errors import ProviderError
from openjet_tui.llm.providers import PROVIDERS, resolve_endpoint


class MemoryKeyring(KeyringBackend):
    """A real keyring backend that keeps passwords in memory."""

    priority = 1

    def __init__(self):
        super().__init__()
        self.store = {}

    def get_password(self, service, username):
        return self.store.get((service, username))

    def set_password(self, service, username, password):
        self.store[(service, username)] = password

    def delete_password(self, service, username):
        self.store.pop((service, username), None)


def test_every_issue_provider_exists_with_a_sane_default():
    assert set(PROVIDERS) == {"openjet", "llama-server", "ollama", "lmstudio", "openai-compatible", "slipstream"}
    assert resolve_endpoint("ollama").base_url == "http://127.0.0.1:11434/v1"
    assert resolve_endpoint("llama-server", "http://127.0.0.1:9000/v1/").base_url == "http://127.0.0.1:9000/v1"


def test_unknown_provider_and_missing_base_url_are_named():
    with pytest.raises(ProviderError, match="unknown provider 'vllm'.*openai-compatible"):
        resolve_endpoint("vllm")
    with pytest.raises(ProviderError, match="needs a base URL"):
        resolve_endpoint("openai-compatible")
    with pytest.raises(ProviderError, match="must be an http"):
        resolve_endpoint("openai-compatible", "ftp://x")


def test_key_from_environment_is_kept_out_of_repr(monkeypatch):
    monkeypatch.setenv("OPENJET_OPENAI_COMPATIBLE_API_KEY", "sk-secret-123")
    endpoint = resolve_endpoint("openai-compatible", "http://gpu-box:8000/v1", "qwen")
    assert endpoint.api_key == "sk-secret-123"
    assert endpoint.key_source == "env:OPENJET_OPENAI_COMPATIBLE_API_KEY"
    assert "sk-secret" not in repr(endpoint)


def test_key_from_os_keyring(monkeypatch):
    backend = MemoryKeyring()
    backend.set_password("openjet", "slipstream", "sk-from-keyring")
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    try:
        endpoint = resolve_endpoint("slipstream", "https://api.example.com/v1", "big")
    finally:
        keyring.set_keyring(previous)
    assert (endpoint.api_key, endpoint.key_source) == ("sk-from-keyring", "keyring")


def test_cloud_provider_without_key_says_where_to_put_it():
    with pytest.raises(ProviderError, match="OPENJET_SLIPSTREAM_API_KEY.*keyring set openjet slipstream"):
        resolve_endpoint("slipstream", "https://api.example.com/v1")


def test_local_servers_do_not_touch_the_keyring_remote_ones_do(monkeypatch):
    backend = MemoryKeyring()
    backend.set_password("openjet", "llama-server", "local-key")
    backend.set_password("openjet", "openai-compatible", "remote-key")
    asked = []
    original = backend.get_password
    backend.get_password = lambda service, user: asked.append(user) or original(service, user)
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    try:
        assert resolve_endpoint("llama-server").api_key is None
        assert resolve_endpoint("openai-compatible", "https://gpu.example.com/v1").api_key == "remote-key"
    finally:
        keyring.set_keyring(previous)
    assert asked == ["openai-compatible"]
