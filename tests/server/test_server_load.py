"""Under many concurrent clients every one is answered (served or 503), none hangs; disconnects stop generation."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from tests.server.conftest import loaded_state, running_server

BODY = {"messages": [{"role": "user", "content": "Count."}], "temperature": 0, "stream": True}


@pytest.fixture(scope="module")
def queued_server(tiny_qwen2):
    with running_server(loaded_state(tiny_qwen2, context_size=512, max_waiting=8, n_draft=0)) as server:
        yield server


async def stream_one(client: httpx.AsyncClient, url: str, index: int) -> tuple[str, int, str | None]:
    """('served', tokens, None) after [DONE], or ('busy', 503, Retry-After)."""
    body = {**BODY, "max_tokens": 6, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Count to {index}."}]}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code == 503:
            await response.aread()
            return "busy", 503, response.headers.get("retry-after")
        assert response.status_code == 200
        lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        return "served", len(lines), None


def wait_until_idle(server, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while server.metric("openjet_requests_running") or server.metric("openjet_requests_waiting"):
        assert time.monotonic() < deadline, "the server never became idle"
        time.sleep(0.05)


def test_fifty_concurrent_streams_are_all_answered(queued_server) -> None:
    async def main() -> list[tuple[str, int, str | None]]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            calls = [stream_one(client, queued_server.url, i) for i in range(50)]
            return await asyncio.wait_for(asyncio.gather(*calls), 90)  # a hang fails here

    rejected_before = queued_server.metric("openjet_requests_total", 'outcome="rejected"')
    results = asyncio.run(main())
    served = [r for r in results if r[0] == "served"]
    busy = [r for r in results if r[0] == "busy"]
    assert len(served) + len(busy) == 50
    assert len(served) >= 9  # the running request and a full queue of 8, at least
    assert busy, "50 requests at once must overflow a queue of 8"
    assert all(retry is not None and int(retry) >= 1 for _, _, retry in busy)
    wait_until_idle(queued_server)
    assert queued_server.metric("openjet_requests_total", 'outcome="rejected"') - rejected_before == len(busy)


def test_disconnect_mid_stream_stops_generation(queued_server) -> None:
    generated_before = queued_server.metric("openjet_generated_tokens_total")
    cancelled_before = queued_server.metric("openjet_requests_total", 'outcome="cancelled"')
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{queued_server.url}/v1/chat/completions",
                           json={**BODY, "max_tokens": 400}) as response:
            lines = response.iter_lines()
            while not next(lines).startswith('data: {"id"'):
                pass
            next(lines)  # a first token arrived: generation is under way; now hang up
    wait_until_idle(queued_server)
    assert queued_server.metric("openjet_requests_total", 'outcome="cancelled"') == cancelled_before + 1
    assert queued_server.metric("openjet_generated_tokens_total") - generated_before < 100  # far from 400


def test_disconnect_while_queued_leaves_the_queue(queued_server) -> None:
    cancelled_before = queued_server.metric("openjet_requests_total", 'outcome="cancelled"')
    passes_before = queued_server.metric("openjet_verify_passes_total")

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            long = asyncio.create_task(client.post(f"{queued_server.url}/v1/chat/completions",
                                                   json={**BODY, "stream": False, "max_tokens": 60}))
            while not queued_server.metric("openjet_requests_running"):
                await asyncio.sleep(0.01)
            waiting = asyncio.create_task(client.post(f"{queued_server.url}/v1/chat/completions",
                                                      json={**BODY, "max_tokens": 60}))
            while not queued_server.metric("openjet_requests_waiting"):
                await asyncio.sleep(0.01)
            waiting.cancel()  # the client gives up while its request waits
            while queued_server.metric("openjet_requests_waiting"):
                await asyncio.sleep(0.01)
            assert (await long).status_code == 200

    asyncio.run(main())
    wait_until_idle(queued_server)
    assert queued_server.metric("openjet_requests_total", 'outcome="cancelled"') == cancelled_before + 1
    assert queued_server.metric("openjet_verify_passes_total") - passes_before == 60  # only the long request ran


def test_stopping_the_worker_cancels_the_running_job(tiny_qwen2) -> None:
    import threading

    from engine.server.generation import Finished, GenerationJob
    from engine.server.prompts import Prompt
    from engine.server.schemas import GenerationOptions
    from engine.server.worker import Job
    from engine.sampling import SamplingParams

    state = loaded_state(tiny_qwen2, context_size=512, n_draft=0)
    worker = state.worker
    events, started = [], threading.Event()

    def emit(event) -> None:
        events.append(event)
        started.set()

    options = GenerationOptions(params=SamplingParams(temperature=0), max_tokens=500)
    worker.submit(Job(GenerationJob(Prompt("", [1, 2, 3]), options), emit))
    assert started.wait(10)
    worker.stop(timeout=5)
    assert not worker._thread.is_alive()
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "cancelled"
    assert events[-1].num_generated < 500
