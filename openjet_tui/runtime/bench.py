"""`openjet bench` measurements: decode and prefill tokens/s, time to first token and draft acceptance on a fixed
prompt set, for OpenJet's engine and llama-server on the same model file, over their OpenAI-compatible HTTP API."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field

import httpx

# A fixed prompt set: a short answer, code from scratch, and two edits with the source in context (the edit prompts
# are where n-gram and MTP drafts get accepted, so acceptance is reported per prompt).
SOURCE = '''def parse_ranges(text):
    """Parse "1-3,7,10-12" into a sorted list of ints."""
    result = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            start, end = part.split("-")
            result.extend(range(int(start), int(end) + 1))
        else:
            result.append(int(part))
    return sorted(result)
'''
PROMPTS = {
    "short-answer": "In one sentence: what does a Python generator do?",
    "write-function": "Write a Python function `is_palindrome(s)` that ignores case and non-letters. Code only.",
    "edit-rename": f"Rename the function to `expand_ranges` and return the full file:\n\n```python\n{SOURCE}```",
    "edit-dedupe": f"Change this function so the result has no duplicates; return the full file:\n\n"
                   f"```python\n{SOURCE}```",
}


@dataclass(slots=True)
class PromptResult:
    """Figures of one streamed completion."""

    prompt: str
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    total_s: float
    decode_tps: float
    prefill_tps: float
    draft_n: int = 0
    draft_accepted: int = 0

    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted tokens, None when the server drafted nothing."""
        return self.draft_accepted / self.draft_n if self.draft_n else None


@dataclass(slots=True)
class EngineBench:
    """All prompts on one engine, or why it could not be measured."""

    engine: str
    reason: str
    results: list[PromptResult] = field(default_factory=list)
    error: str = ""

    def summary(self) -> dict[str, float | None]:
        """Means over the prompts (acceptance: total accepted over total drafted)."""
        if not self.results:
            return {}
        drafted = sum(r.draft_n for r in self.results)
        return {"decode_tps": statistics.fmean(r.decode_tps for r in self.results),
                "prefill_tps": statistics.fmean(r.prefill_tps for r in self.results),
                "ttft_ms": 1000 * statistics.fmean(r.ttft_s for r in self.results),
                "acceptance": sum(r.draft_accepted for r in self.results) / drafted if drafted else None}


def _read_stream(response: httpx.Response, started: float) -> tuple[float | None, dict, dict]:
    """(time of the first token, the usage object, the llama.cpp-style timings object) of an SSE stream."""
    first, usage, timings = None, {}, {}
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if first is None and (delta.get("content") or delta.get("reasoning_content")):
                first = time.perf_counter() - started
        usage = chunk.get("usage") or usage
        timings = chunk.get("timings") or timings
    return first, usage, timings


def measure_prompt(client: httpx.Client, base_url: str, name: str, prompt: str, max_tokens: int,
                   model: str | None = None) -> PromptResult:
    """Stream one greedy completion and derive its figures (server timings preferred over client clocks)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    started = time.perf_counter()
    with client.stream("POST", f"{base_url}/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise httpx.HTTPStatusError(f"{response.status_code}: {response.read()[:300]!r}",
                                        request=response.request, response=response)
        first, usage, timings = _read_stream(response, started)
    total = time.perf_counter() - started
    first = first if first is not None else total
    completion = int(timings.get("predicted_n") or usage.get("completion_tokens") or 0)
    prompt_tokens = int(timings.get("prompt_n") or usage.get("prompt_tokens") or 0)
    decode = float(timings.get("predicted_per_second") or
                   (max(completion - 1, 0) / (total - first) if total > first else 0.0))
    prefill = float(timings.get("prompt_per_second") or (prompt_tokens / first if first else 0.0))
    return PromptResult(name, prompt_tokens, completion, first, total, decode, prefill,
                        int(timings.get("draft_n") or 0), int(timings.get("draft_n_accepted") or 0))


def bench_endpoint(engine: str, reason: str, base_url: str, *, prompts: dict[str, str] | None = None,
                   max_tokens: int = 128, model: str | None = None) -> EngineBench:
    """Warm up once, then measure every prompt against an OpenAI-compatible base URL (ending in /v1)."""
    prompts = prompts or PROMPTS
    result = EngineBench(engine, reason)
    # A fresh connection per request: llama-server may close a kept-alive connection after a stream, and a request
    # sent on it fails; a loopback connect costs far less than the timing resolution that matters here.
    limits = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0), limits=limits) as client:
        try:
            measure_prompt(client, base_url, "warm-up", "Hello", 4, model)
            for name, prompt in prompts.items():
                result.results.append(measure_prompt(client, base_url, name, prompt, max_tokens, model))
        except (httpx.HTTPError, ValueError) as error:
            result.error = f"{engine} failed during the benchmark: {error}"
    return result


def format_table(benches: list[EngineBench]) -> list[str]:
    """Side-by-side summary lines, one per engine."""
    lines = [f"{'engine':<16}{'decode tok/s':>14}{'prefill tok/s':>15}{'TTFT ms':>10}{'acceptance':>12}"]
    for bench in benches:
        if not bench.results:
            lines.append(f"{bench.engine:<16}  not measured: {bench.error or bench.reason}")
            continue
        s = bench.summary()
        acceptance = f"{s['acceptance']:.2f}" if s["acceptance"] is not None else "-"
        lines.append(f"{bench.engine:<16}{s['decode_tps']:>14.1f}{s['prefill_tps']:>15.1f}{s['ttft_ms']:>10.0f}"
                     f"{acceptance:>12}")
    return lines
