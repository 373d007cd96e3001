"""Prometheus metrics of the engine server (GET /metrics), one registry per server.

Counters (since start): openjet_prompt_tokens_total (prompt tokens prefilled), openjet_prefix_cache_hit_tokens_total
(prompt tokens reused from the previous request), openjet_generated_tokens_total, openjet_draft_tokens_total,
openjet_draft_accepted_tokens_total, openjet_verify_passes_total (decoding cycles: one forward pass each),
openjet_requests_total{outcome} with outcome stop | length | cancelled | error | rejected (503, queue full).
Gauges: openjet_prefill_tokens_per_second and openjet_decode_tokens_per_second (last request),
openjet_acceptance_length (tokens per verify pass, last request), openjet_draft_length (draft tokens the adaptive
controller chose last), openjet_context_tokens (positions in use) and openjet_context_size, openjet_requests_waiting,
openjet_requests_running. Info: openjet_backend{backend, backend_reason, model}.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from engine.server.generation import Finished

CONTENT_TYPE = CONTENT_TYPE_LATEST
OUTCOMES = ("stop", "length", "cancelled", "error", "rejected")


class ServerMetrics:
    """Every metric the server exports; safe to update from the engine thread and read from the event loop."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.prompt_tokens = Counter("openjet_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.cache_hit_tokens = Counter("openjet_prefix_cache_hit_tokens",
                                        "Prompt tokens reused from the previous request (prefix cache)", registry=r)
        self.generated_tokens = Counter("openjet_generated_tokens", "Tokens generated", registry=r)
        self.draft_tokens = Counter("openjet_draft_tokens", "Draft tokens proposed for verification", registry=r)
        self.accepted_tokens = Counter("openjet_draft_accepted_tokens", "Draft tokens the model accepted", registry=r)
        self.verify_passes = Counter("openjet_verify_passes", "Decoding cycles (one verify pass each)", registry=r)
        self.requests = Counter("openjet_requests", "Requests by outcome", ["outcome"], registry=r)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)  # present at 0 from the start
        self.prefill_rate = Gauge("openjet_prefill_tokens_per_second", "Prefill speed of the last request", registry=r)
        self.decode_rate = Gauge("openjet_decode_tokens_per_second", "Decode speed of the last request", registry=r)
        self.acceptance_length = Gauge("openjet_acceptance_length",
                                       "Tokens emitted per verify pass in the last request", registry=r)
        self.draft_length = Gauge("openjet_draft_length", "Draft length the adaptive controller chose last",
                                  registry=r)
        self.context_tokens = Gauge("openjet_context_tokens", "Context positions in use", registry=r)
        self.context_size = Gauge("openjet_context_size", "Context window in tokens", registry=r)
        self.waiting = Gauge("openjet_requests_waiting", "Requests waiting in the queue", registry=r)
        self.running = Gauge("openjet_requests_running", "Requests being generated", registry=r)
        self.backend = Info("openjet_backend", "Backend serving the model and why it was chosen", registry=r)

    def observe(self, finished: Finished) -> None:
        """Fold in one finished generation."""
        prompt_n = finished.num_prompt_tokens - finished.num_cached_tokens
        self.prompt_tokens.inc(prompt_n)
        self.cache_hit_tokens.inc(finished.num_cached_tokens)
        self.generated_tokens.inc(finished.num_generated)
        self.draft_tokens.inc(finished.spec.num_drafted)
        self.accepted_tokens.inc(finished.spec.num_accepted)
        self.verify_passes.inc(finished.spec.num_cycles)
        self.requests.labels(finished.finish_reason).inc()
        if finished.prefill_s > 0 and prompt_n:
            self.prefill_rate.set(prompt_n / finished.prefill_s)
        if finished.decode_s > 0 and finished.num_generated:
            self.decode_rate.set(finished.num_generated / finished.decode_s)
        if finished.spec.num_cycles:
            self.acceptance_length.set(finished.spec.tokens_per_pass)
        self.context_tokens.set(finished.context_tokens)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
