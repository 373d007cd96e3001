"""Under many concurrent clients every one is answered (served or 503), none hangs; disconnects stop generation."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from tests.server.conftest import loaded_state, running_server

BODY = {"messages": [{"role": "user", "content": "Count."}], "temperature": 0, "stream": True}
N_DRAFT = 0  # one token per cycle: "stops within one cycle" then means at most one token after the hang-up
# Tokens a streamed job runs unless cancelled: enough that a client leaving after its first chunk is seen gone before
# its job ends (at 24 the tiny model's job sometimes finished first, counted as served, about one run in five)
STREAM_TOKENS = 256


@pytest.fixture(scope="module")
def queued_server(tiny_qwen2):
    with running_server(loaded_state(tiny_qwen2, context_size=512, max_waiting=8, n_draft=N_DRAFT)) as server:
        yield server


def never_stop(server) -> dict[str, float]:
    """A logit_bias that rules out the end-of-generation tokens, so a generation runs until max_tokens or a cancel."""
    model, _ = server.state.ready_model()
    return {str(token): -100.0 for token in model.tokenizer.stop_ids}


def has_content(line: str) -> bool:
    """Whether an SSE line is a chat chunk carrying generated text (not the opening role chunk)."""
    if not line.startswith('data: {"id"'):
        return False
    choices = json.loads(line[6:])["choices"]
    return bool(choices) and bool(choices[0]["delta"].get("content") or choices[0]["delta"].get("reasoning_content"))


async def stream_one(client: httpx.AsyncClient, url: str, index: int, bias: dict[str, float],
                     tickets: Iterator[int]) -> tuple[str, int, str | None]:
    """('served', SSE lines, None) after [DONE], ('busy', 503, Retry-After), or ('hung up', lines, None): every
    second client to be served leaves after its first content chunk, so some always leave while being served."""
    body = {**BODY, "max_tokens": STREAM_TOKENS, "stream_options": {"include_usage": True}, "logit_bias": bias,
            "messages": [{"role": "user", "content": f"Count to {index}."}]}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code == 503:
            await response.aread()
            return "busy", 503, response.headers.get("retry-after")
        assert response.status_code == 200
        leaves = next(tickets) % 2 == 1
        lines = []
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                lines.append(line)
            if leaves and has_content(line):
                return "hung up", len(lines), None  # leaving the block closes the connection mid-stream
        assert lines[-1] == "data: [DONE]"
        return "served", len(lines), None


def wait_until_idle(server, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while server.metric("openjet_requests_running") or server.metric("openjet_requests_waiting"):
        assert time.monotonic() < deadline, "the server never became idle"
        time.sleep(0.05)


def test_fifty_concurrent_streams_are_all_answered(queued_server) -> None:
    # no early stop: every job runs its STREAM_TOKENS tokens or is cancelled
    bias, tickets = never_stop(queued_server), itertools.count()

    async def main() -> list[tuple[str, int, str | None]]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            calls = [stream_one(client, queued_server.url, i, bias, tickets) for i in range(50)]
            return await asyncio.wait_for(asyncio.gather(*calls), 90)  # a hang fails here

    before = {outcome: queued_server.metric("openjet_requests_total", f'outcome="{outcome}"')
              for outcome in ("rejected", "cancelled", "length")}
    results = asyncio.run(main())
    served = [r for r in results if r[0] == "served"]
    hung_up = [r for r in results if r[0] == "hung up"]
    busy = [r for r in results if r[0] == "busy"]
    assert len(served) + len(hung_up) + len(busy) == 50
    assert len(served) + len(hung_up) >= 9  # the running request and a full queue of 8, at least
    assert busy, "50 requests at once must overflow a queue of 8"
    assert len(hung_up) >= 4
    assert all(retry is not None and int(retry) >= 1 for _, _, retry in busy)
    wait_until_idle(queued_server)
    after = {outcome: queued_server.metric("openjet_requests_total", f'outcome="{outcome}"') for outcome in before}
    assert after["rejected"] - before["rejected"] == len(busy)
    # each client that left mid-stream stopped its own generation, and only those did
    assert after["cancelled"] - before["cancelled"] == len(hung_up)
    assert after["length"] - before["length"] == len(served)


class VerifyGate:
    """Lets the backend's verify passes (one per decode cycle) through only as the test allows.

    A hang-up reaches the server a few milliseconds after the client closes, longer on a loaded machine, while a
    cycle of the tiny model takes about as long; holding the next cycle until the server has seen the hang-up makes
    "at most one more cycle" a deterministic check instead of a race.
    """

    def __init__(self, backend) -> None:
        self._verify = backend.verify
        self._permits = threading.Semaphore(0)
        backend.verify = self.verify  # the instance attribute shadows the method for Backend.cycle

    def verify(self, tokens: list[int]):
        """The real verify pass, once a permit is there."""
        assert self._permits.acquire(timeout=60), "the test never let this cycle run"
        return self._verify(tokens)

    def allow(self, num_cycles: int) -> None:
        """Let num_cycles more verify passes run."""
        self._permits.release(num_cycles)


def hang_up_seen(state) -> bool:
    """Whether the running job was cancelled (or has already ended, which only a cancel can do here)."""
    job = state.worker._current
    return job is None or job.cancelled.is_set()


@pytest.fixture
def gated_server(tiny_qwen2):
    """A server on its own tiny qwen2 whose decode cycles wait for the test's VerifyGate."""
    state = loaded_state(tiny_qwen2, context_size=512, n_draft=N_DRAFT)
    gate = VerifyGate(state.worker.generator.backend)
    with running_server(state) as server:
        yield server, gate


def wait_for(condition, what: str, timeout: float = 20) -> None:
    """Poll condition() until it holds; fail (rather than hang) after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def test_disconnect_mid_stream_stops_generation_within_one_cycle(gated_server) -> None:
    server, gate = gated_server
    generated_before = server.metric("openjet_generated_tokens_total")
    # completions with logprobs: every chunk lists the tokens it carries, so the client can count them
    body = {"prompt": "Count:", "max_tokens": 400, "temperature": 0, "stream": True, "logprobs": 0,
            "logit_bias": never_stop(server)}
    gate.allow(3)
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{server.url}/v1/completions", json=body) as response:
            received = 0
            for line in response.iter_lines():
                if line.startswith('data: {"id"'):
                    received += len(json.loads(line[6:])["choices"][0]["logprobs"]["tokens"])
                if received == 3:
                    break  # three cycles streamed; the fourth waits at the gate; hang up
    wait_for(lambda: hang_up_seen(server.state), "the server noticed the client leave")
    gate.allow(1000)  # from here on the engine may run freely: it must stop after the cycle in progress
    wait_until_idle(server)
    assert server.metric("openjet_requests_total", 'outcome="cancelled"') == 1
    after_hang_up = server.metric("openjet_generated_tokens_total") - generated_before - received
    # at most the cycle under way when the server learnt of it (none if it learnt before the next one began)
    assert 0 <= after_hang_up <= N_DRAFT + 1


def test_disconnect_while_queued_leaves_the_queue(gated_server) -> None:
    server, gate = gated_server

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            # the long request holds the engine at its first cycle, so the second one surely waits behind it
            long = asyncio.create_task(client.post(f"{server.url}/v1/chat/completions",
                                                   json={**BODY, "stream": False, "max_tokens": 60}))
            await asyncio.to_thread(wait_for, lambda: server.metric("openjet_requests_running"), "one runs")
            waiting = asyncio.create_task(client.post(f"{server.url}/v1/chat/completions",
                                                      json={**BODY, "max_tokens": 60}))
            await asyncio.to_thread(wait_for, lambda: server.metric("openjet_requests_waiting"), "one waits")
            waiting.cancel()  # the client gives up while its request waits
            await asyncio.to_thread(wait_for, lambda: not server.metric("openjet_requests_waiting"), "it left")
            gate.allow(1000)
            assert (await long).status_code == 200

    asyncio.run(asyncio.wait_for(main(), 60))
    wait_until_idle(server)
    assert server.metric("openjet_requests_total", 'outcome="cancelled"') == 1
    assert server.metric("openjet_verify_passes_total") == 60  # only the long request ran


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
