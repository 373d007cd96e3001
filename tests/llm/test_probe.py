"""Probing: servers that cannot do tools, and windows smaller than the system prompt plus tool schemas."""

from openjet_tui.llm.client import ChatClient, RetryPolicy
from openjet_tui.llm.probe import probe_server
from openjet_tui.llm.providers import Endpoint
from tests.agent.scripted_server import ScriptedServer

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file. " * 40,
                                            "parameters": {"type": "object"}}}]


async def probe(server, model=None):
    client = ChatClient(Endpoint("llama-server", server.base_url, model), retry=RetryPolicy(attempts=1))
    try:
        return await probe_server(client, "You are a coding agent. " * 20, TOOLS), client.endpoint
    finally:
        await client.aclose()


async def test_healthy_server_reports_window_tools_and_picks_its_model():
    with ScriptedServer(context_window=32768, supports_tools=True, tokenize=True, model="qwen-coder") as server:
        report, endpoint = await probe(server)
    assert report.is_usable and report.reachable
    assert report.context_window == 32768 and report.context_source == "/props n_ctx"
    assert report.supports_tools is True and report.prompt_tokens_estimated is False
    assert endpoint.model == "qwen-coder"


async def test_template_without_tool_support_is_a_problem():
    with ScriptedServer(context_window=32768, supports_tools=False) as server:
        report, _ = await probe(server, "m")
    assert not report.is_usable
    assert any("cannot do tool calls" in p and "--jinja" in p for p in report.problems)


async def test_window_smaller_than_prompt_and_schemas_is_a_problem():
    with ScriptedServer(context_window=256, supports_tools=True) as server:
        report, _ = await probe(server, "m")
    assert not report.is_usable and report.prompt_tokens > 256
    assert any("smaller than the system prompt plus tool schemas" in p for p in report.problems)


async def test_unreachable_server_is_reported_not_raised():
    server = ScriptedServer().start()
    url = server.base_url
    server.stop()
    client = ChatClient(Endpoint("ollama", url))
    report = await probe_server(client, "x", TOOLS)
    await client.aclose()
    assert not report.reachable and "cannot reach ollama" in report.problems[0]


async def test_silent_server_leaves_window_unknown_with_a_note():
    with ScriptedServer() as server:
        report, _ = await probe(server, "m")
    assert report.is_usable and report.context_window is None and report.supports_tools is None
    assert any("did not report its context window" in n for n in report.notes)


async def ollama_probe(show):
    with ScriptedServer(ollama_show=show, model="qwen2.5-coder:7b") as server:
        client = ChatClient(Endpoint("ollama", server.base_url), retry=RetryPolicy(attempts=1))
        try:
            return await probe_server(client, "system prompt", TOOLS)
        finally:
            await client.aclose()


async def test_ollama_capabilities_and_its_low_default_window():
    report = await ollama_probe({"capabilities": ["completion"], "parameters": ""})
    assert report.supports_tools is False and report.context_window == 4096
    assert any("num_ctx" in note for note in report.notes) and not report.is_usable
    report = await ollama_probe({"capabilities": ["completion", "tools"], "parameters": "num_ctx 32768\n"})
    assert report.is_usable and (report.context_window, report.context_source) == (32768, "ollama num_ctx")


async def test_vllm_style_max_model_len_is_read():
    with ScriptedServer(model_fields={"max_model_len": 131072}) as server:
        report, _ = await probe(server, "m")
    assert (report.context_window, report.context_source) == (131072, "/models max_model_len")
