"""The chat client against the scripted server over real HTTP and SSE."""

import asyncio
import socket
import time

import pytest

from openjet_tui.errors import (AirgappedError, ContextWindowError, LLMConnectionError, LLMResponseError,
                                ServerCapabilityError)
from openjet_tui.llm.client import ChatClient, RetryPolicy
from openjet_tui.llm.network import NetworkGuard, TrafficLog
from openjet_tui.llm.providers import Endpoint
from openjet_tui.llm.types import ChatResult, ContentDelta, ReasoningDelta
from tests.agent.scripted_server import call, reply

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
FAST = RetryPolicy(attempts=3, base_delay_s=0.01)


def client_for(server, **kwargs):
    return ChatClient(Endpoint("llama-server", server.base_url, "m"), retry=FAST, **kwargs)


async def test_streams_deltas_then_result_with_usage_and_timings(server):
    server.push(reply("Hello there, world", reasoning="think first", chunk_chars=3,
                      timings={"predicted_per_second": 80.0, "prompt_n": 12}))
    client = client_for(server)
    parts = [part async for part in client.stream([{"role": "user", "content": "hi"}])]
    await client.aclose()
    text = [p.text for p in parts if isinstance(p, ContentDelta)]
    assert len(text) > 3 and "".join(text) == "Hello there, world"
    assert "".join(p.text for p in parts if isinstance(p, ReasoningDelta)) == "think first"
    result = parts[-1]
    assert isinstance(result, ChatResult) and result.finish_reason == "stop"
    assert result.usage.completion_tokens > 0 and result.timings.predicted_per_second == 80.0
    body = server.chat_bodies[0]
    assert body["stream"] is True and body["model"] == "m" and "tools" not in body


async def test_native_tool_calls_and_tools_sent(server):
    server.push(reply(tool_calls=[call("read_file", path="a.py"), call("read_file", path="b.py")], chunk_chars=4))
    client = client_for(server)
    result = await client.complete([{"role": "user", "content": "x"}], TOOLS)
    await client.aclose()
    assert [c.arguments for c in result.tool_calls] == [{"path": "a.py"}, {"path": "b.py"}]
    assert result.finish_reason == "tool_calls" and server.chat_bodies[0]["tools"] == TOOLS


async def test_text_tool_call_from_content_is_recognised(server):
    server.push(reply('```json\n{"name": "read_file", "arguments": {"path": "q.py"}}\n```'))
    client = client_for(server)
    result = await client.complete([{"role": "user", "content": "x"}], TOOLS)
    await client.aclose()
    assert result.content == "" and result.tool_calls[0].arguments == {"path": "q.py"}


async def test_non_streaming_json_answer_is_accepted(server):
    server.push(reply("whole", as_json=True, tool_calls=[call("read_file", path="j")]))
    client = client_for(server)
    result = await client.complete([{"role": "user", "content": "x"}], TOOLS)
    await client.aclose()
    assert result.content == "whole" and result.tool_calls[0].arguments == {"path": "j"}


async def test_busy_server_is_retried_then_answers(server):
    server.push(reply(status=503, error="loading model"), reply("ok"))
    client = client_for(server)
    result = await client.complete([{"role": "user", "content": "x"}])
    await client.aclose()
    assert result.content == "ok" and len(server.chat_bodies) == 2


async def test_connection_refused_retries_with_backoff_then_fails_clearly():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = ChatClient(Endpoint("ollama", f"http://127.0.0.1:{port}/v1"),
                        retry=RetryPolicy(attempts=3, base_delay_s=0.05))
    started = time.monotonic()
    with pytest.raises(LLMConnectionError, match="after 3 attempts.*is the server running"):
        await client.complete([{"role": "user", "content": "x"}])
    await client.aclose()
    assert time.monotonic() - started >= 0.05 + 0.1  # waited 0.05 then 0.1 between the attempts


async def test_error_statuses_map_to_actionable_errors(server):
    server.push(reply(status=500, error="tools param requires --jinja flag"),
                reply(status=400, error="request (9000 tokens) exceeds the available context size (4096 tokens)"),
                reply(status=404, error="model 'nope' not found"))
    client = client_for(server)
    with pytest.raises(ServerCapabilityError, match="cannot do tool calls.*--jinja"):
        await client.complete([{"role": "user", "content": "x"}], TOOLS)
    with pytest.raises(ContextWindowError, match="context window"):
        await client.complete([{"role": "user", "content": "x"}])
    with pytest.raises(LLMResponseError, match="HTTP 404.*not found"):
        await client.complete([{"role": "user", "content": "x"}])
    await client.aclose()


async def test_cancel_mid_stream_closes_the_connection_quickly(server):
    server.push(reply("a" * 200, chunk_chars=1, hang_after_chunks=5))
    client = client_for(server)
    seen = []

    async def consume():
        async for part in client.stream([{"role": "user", "content": "x"}]):
            seen.append(part)

    task = asyncio.create_task(consume())
    while len(seen) < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 5.0  # the server holds the stream open for good: a cancel that waited hangs
    await client.aclose()
    deadline = time.monotonic() + 3
    while server.disconnects == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert server.disconnects == 1  # the server saw the client go away


async def test_traffic_log_records_bytes_and_tokens_of_every_request(server):
    server.push(reply("one"), reply("two"))
    log = TrafficLog()
    heard = []
    log.subscribe(heard.append)
    client = client_for(server, traffic=log)
    for text in ("first question", "second, longer question"):
        await client.complete([{"role": "user", "content": text}])
    await client.aclose()
    assert [r.request_bytes for r in log.records] == [r.num_bytes for r in server.requests]
    assert all(r.response_bytes > 0 and r.prompt_tokens and r.status == 200 for r in log.records)
    assert heard == log.records and log.bytes_sent == sum(r.num_bytes for r in server.requests)


async def test_airgapped_guard_refuses_non_loopback_before_any_socket(monkeypatch):
    attempts = []
    real_connect = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", lambda self, addr: attempts.append(addr) or real_connect(self, addr))
    client = ChatClient(Endpoint("openai-compatible", "http://203.0.113.7:8000/v1"),
                        guard=NetworkGuard(airgapped=True), retry=FAST)
    with pytest.raises(AirgappedError, match="203.0.113.7"):
        await client.complete([{"role": "user", "content": "x"}])
    await client.aclose()
    assert attempts == []


async def test_airgapped_guard_allows_loopback(server):
    server.push(reply("local ok"))
    client = client_for(server, guard=NetworkGuard(airgapped=True))
    assert (await client.complete([{"role": "user", "content": "x"}])).content == "local ok"
    await client.aclose()


async def test_retried_attempts_are_recorded_and_unsent_ones_are_not(server):
    server.push(reply(status=503, error="busy"), reply("ok"))
    log = TrafficLog()
    client = client_for(server, traffic=log)
    await client.complete([{"role": "user", "content": "x"}])
    await client.aclose()
    assert [(r.status, r.error) for r in log.records] == [(503, "HTTP 503"), (200, None)]
    assert [r.request_bytes for r in log.records] == [r.num_bytes for r in server.requests]
    refused = ChatClient(Endpoint("slipstream", "https://api.example.com/v1", "m"),
                         guard=NetworkGuard(airgapped=True), traffic=log)
    with pytest.raises(AirgappedError):
        await refused.complete([{"role": "user", "content": "x"}])
    await refused.aclose()
    assert len(log.records) == 2
