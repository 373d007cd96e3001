"""Asking a server what it can do before the first turn: models, context window, tool support, prompt size."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import httpx

from openjet_tui.errors import LLMResponseError
from openjet_tui.llm.client import ChatClient

CHARS_PER_TOKEN = 3.0  # conservative for code and JSON schemas: overestimating is the safe side here
OLLAMA_DEFAULT_CONTEXT = 4096


@dataclass(slots=True)
class ProbeReport:
    """What a server said about itself; `problems` are reasons this agent cannot work with it."""

    reachable: bool = False
    models: list[str] = field(default_factory=list)
    context_window: int | None = None
    context_source: str | None = None
    supports_tools: bool | None = None  # None: the server did not say
    prompt_tokens: int | None = None
    prompt_tokens_estimated: bool = True
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def is_usable(self) -> bool:
        """True when nothing found rules the server out."""
        return self.reachable and not self.problems


def estimate_tokens(text: str) -> int:
    """A conservative token count for text when the server cannot count for us."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


async def _try(call: Awaitable[Any]) -> Any:
    """Run an optional probe request; None when the endpoint does not exist or answers nonsense."""
    try:
        return await call
    except (LLMResponseError, httpx.HTTPStatusError, httpx.TimeoutException, ValueError):
        return None


async def probe_server(client: ChatClient, system_prompt: str, tools: list[dict[str, Any]]) -> ProbeReport:
    """Probe the client's endpoint and check the system prompt and tool schemas fit its window."""
    report = ProbeReport()
    endpoint = client.endpoint
    try:
        listing = await client.get_json(endpoint.base_url + "/models")
    except (httpx.TransportError, LLMResponseError) as exc:
        report.problems.append(f"cannot reach {endpoint.provider} at {endpoint.base_url} ({type(exc).__name__}); "
                               "is the server running?")
        return report
    report.reachable = True
    _read_models(listing, report)
    if endpoint.model is None and report.models:
        endpoint.model = report.models[0]
    await _read_llama_props(client, report)
    if endpoint.provider == "ollama":
        await _read_ollama(client, report)
    await _count_prompt(client, system_prompt, tools, report)
    _judge(report, endpoint.provider)
    return report


def _read_models(listing: Any, report: ProbeReport) -> None:
    """Model ids, and a context length if the listing carries one (llama-server meta, vLLM, LM Studio, ours)."""
    entries = listing.get("data") if isinstance(listing, dict) else None
    for entry in entries or []:
        if not isinstance(entry, dict):
            continue
        if entry.get("id"):
            report.models.append(str(entry["id"]))
        meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
        for source, value in (("llama-server n_ctx", meta.get("n_ctx")), ("max_model_len", entry.get("max_model_len")),
                              ("context_length", entry.get("context_length")),
                              ("loaded_context_length", entry.get("loaded_context_length")),
                              ("max_context_length", entry.get("max_context_length"))):
            if isinstance(value, int) and value > 0 and report.context_window is None:
                report.context_window, report.context_source = value, f"/models {source}"


async def _read_llama_props(client: ChatClient, report: ProbeReport) -> None:
    """llama-server (and OpenJet's engine) describe the slot context and the chat template's capabilities."""
    props = await _try(client.get_json(client.endpoint.root_url + "/props"))
    if not isinstance(props, dict):
        return
    settings = props.get("default_generation_settings") or {}
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if isinstance(n_ctx, int) and n_ctx > 0:  # the per-slot window is what one request can use
        report.context_window, report.context_source = n_ctx, "/props n_ctx"
    caps = props.get("chat_template_caps")
    if isinstance(caps, dict) and "supports_tool_calls" in caps:
        report.supports_tools = bool(caps["supports_tool_calls"])


async def _read_ollama(client: ChatClient, report: ProbeReport) -> None:
    """Ollama lists capabilities per model and silently truncates to num_ctx, which defaults low."""
    model = client.endpoint.model
    shown = await _try(client.post_json(client.endpoint.root_url + "/api/show", {"model": model}))
    if not isinstance(shown, dict):
        return
    capabilities = shown.get("capabilities")
    if isinstance(capabilities, list):
        report.supports_tools = "tools" in capabilities
    match = re.search(r"num_ctx\s+(\d+)", str(shown.get("parameters") or ""))
    if match:
        report.context_window, report.context_source = int(match.group(1)), "ollama num_ctx"
    else:
        report.context_window, report.context_source = OLLAMA_DEFAULT_CONTEXT, "ollama default num_ctx"
        report.notes.append(f"Ollama truncates prompts to num_ctx ({OLLAMA_DEFAULT_CONTEXT} tokens unless the "
                            "model sets it); raise it with OLLAMA_CONTEXT_LENGTH or a Modelfile")


async def _count_prompt(client: ChatClient, system_prompt: str, tools: list[dict[str, Any]],
                        report: ProbeReport) -> None:
    """Count system prompt + tool schemas with the server's tokenizer when it has one, else estimate."""
    text = system_prompt + "\n" + json.dumps(tools, ensure_ascii=False)
    counted = await _try(client.post_json(client.endpoint.root_url + "/tokenize", {"content": text}))
    if isinstance(counted, dict) and isinstance(counted.get("tokens"), list):
        report.prompt_tokens, report.prompt_tokens_estimated = len(counted["tokens"]), False
    else:
        report.prompt_tokens = estimate_tokens(text)


def _judge(report: ProbeReport, provider: str) -> None:
    """Turn the facts into problems (the agent cannot work) and notes (it can, with caveats)."""
    if report.supports_tools is False:
        hint = " (start llama-server with --jinja)" if provider == "llama-server" else ""
        report.problems.append(f"the server cannot do tool calls: its chat template has no tool support{hint}")
    if report.context_window is not None and report.prompt_tokens is not None:
        kind = "about " if report.prompt_tokens_estimated else ""
        if report.prompt_tokens >= report.context_window:
            report.problems.append(
                f"the context window ({report.context_window} tokens, {report.context_source}) is smaller than the "
                f"system prompt plus tool schemas ({kind}{report.prompt_tokens} tokens)")
        elif report.prompt_tokens > report.context_window // 2:
            report.notes.append(f"system prompt and tools take {kind}{report.prompt_tokens} of "
                                f"{report.context_window} tokens: little room is left for the conversation")
    if report.context_window is None:
        report.notes.append("the server did not report its context window; compaction uses the configured one")
