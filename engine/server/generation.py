"""One request's generation on the engine thread: prefix reuse, speculative cycles, stop conditions, events out.

The Generator owns nothing shared with the event loop: it reads a GenerationJob and calls emit() with TextChunk
events and one Finished at the end (or raises; the worker turns that into an error event). It checks
is_cancelled() before every cycle and between prefill chunks, so a client that goes away stops generation within
one cycle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.backend import AcceptRule, Backend, Draft, TokenSequence
from engine.sampling import SamplingParams
from engine.server.prompts import Prompt
from engine.server.schemas import GenerationOptions
from engine.server.textstream import TextStream, TokenLogprob, token_logprob
from engine.session import PrefillStats, Session
from engine.spec.decode import SpecStats, SpeculativeDecoder
from engine.spec.verify import rule_for, with_logit_bias
from engine.text.tokenizer import Tokenizer


@dataclass(slots=True)
class GenerationJob:
    """What to generate: the prompt (ids and message boundaries) and the options."""

    prompt: Prompt
    options: GenerationOptions


@dataclass(slots=True)
class TextChunk:
    """Text released to the client, with the logprobs of the tokens it completes (when asked for)."""

    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass(slots=True)
class Finished:
    """The end of a generation. finish_reason: "stop", "length" or "cancelled"."""

    finish_reason: str
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generated: int
    prefill_s: float
    decode_s: float
    spec: SpecStats
    context_tokens: int

    def timings(self) -> dict[str, Any]:
        """llama.cpp's `timings` object."""
        prompt_n = self.num_prompt_tokens - self.num_cached_tokens
        prompt_ms, predicted_ms = 1000 * self.prefill_s, 1000 * self.decode_s
        return {
            "cache_n": self.num_cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": self.num_generated,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / self.num_generated if self.num_generated else 0.0,
            "predicted_per_second": 1000 * self.num_generated / predicted_ms if predicted_ms else 0.0,
            "draft_n": self.spec.num_drafted,
            "draft_n_accepted": self.spec.num_accepted,
        }


Event = TextChunk | Finished


def stop_at_ids(rule: AcceptRule, stop_ids: frozenset[int]) -> AcceptRule:
    """A rule that ends the cycle's tokens at the first stop id, so nothing after it is committed to the state."""

    def cut(out: list[int]) -> list[int]:
        for i, token in enumerate(out):
            if token in stop_ids:
                return out[: i + 1]
        return out

    def stopping(draft: Draft, logits: np.ndarray, seq: TokenSequence, params: SamplingParams) -> list[int]:
        """The inner rule's tokens, cut after the first stop id."""
        return cut(rule(draft, logits, seq, params))

    inner = getattr(rule, "on_choices", None)
    if inner is not None:  # the rows' choices made on the device pass through the same cut
        stopping.on_choices = lambda draft, choices: cut(inner(draft, choices))
    return stopping


def capture_logits(rule: AcceptRule, sink: list[np.ndarray]) -> AcceptRule:
    """A rule that records, for each token it emits, the logits row it was chosen from."""

    def capturing(draft: Draft, logits: np.ndarray, seq: TokenSequence, params: SamplingParams) -> list[int]:
        """The inner rule's tokens; their logits rows go to sink."""
        out = rule(draft, logits, seq, params)
        sink.extend(logits[: len(out)])
        return out

    return capturing


class Generator:
    """Generates for one job at a time on a backend; owned by the engine thread."""

    def __init__(self, backend: Backend, tokenizer: Tokenizer, session: Session, decoder: SpeculativeDecoder):
        self.backend, self.tokenizer, self.session, self.decoder = backend, tokenizer, session, decoder

    def run(self, job: GenerationJob, emit: Callable[[Event], None], is_cancelled: Callable[[], bool]) -> Finished:
        """Generate for job, emitting events; returns the Finished event it emitted last."""
        options, ids = job.options, job.prompt.ids
        if not options.cache_prompt:
            self.session.invalidate()
        prefill = self.session.prepare(ids, job.prompt.boundaries, is_cancelled)
        spec = SpecStats()
        if prefill.is_cancelled:
            return self._finish(emit, "cancelled", job, prefill, 0, 0.0, spec)
        seq = TokenSequence.start(ids, options.params)
        self.decoder.start(seq)
        logits_rows: list[np.ndarray] = []
        rule = self._rule(options, logits_rows)
        stream, started = TextStream(self.tokenizer, options.stop), time.perf_counter()
        limit = self.backend.context_size - len(ids) + 1  # tokens that fit after the prompt
        max_tokens = limit if options.max_tokens is None else min(options.max_tokens, limit)
        num_generated, reason = 0, "length"
        while num_generated < max_tokens:
            if is_cancelled():
                reason = "cancelled"
                break
            result = self.decoder.step(seq, options.params, max_tokens - num_generated, rule)
            self.session.sync(seq)
            spec.add(result)
            chunk = TextChunk("")
            for token, row in zip(result.tokens, self._rows(logits_rows, result.tokens)):
                if self.tokenizer.is_stop(token):
                    reason = "stop"
                    break
                num_generated += 1
                lp = None if row is None else token_logprob(self.tokenizer, row, token, options.logprobs or 0)
                text, entries = stream.feed(token, lp)
                chunk.text += text
                chunk.logprobs.extend(entries)
                if stream.is_stopped:
                    reason = "stop"
                    break
            if chunk.text or chunk.logprobs:
                emit(chunk)
            if reason == "stop":
                break
        text, entries = stream.finish()
        if text or entries:
            emit(TextChunk(text, entries))
        self.session.mark_boundary()  # the end of the reply: the next turn's history starts with it
        return self._finish(emit, reason, job, prefill, num_generated, time.perf_counter() - started, spec)

    def _rule(self, options: GenerationOptions, sink: list[np.ndarray]) -> AcceptRule:
        rule = rule_for(options.params)
        if options.logprobs is not None:
            rule = capture_logits(rule, sink)  # inside the bias: logprobs describe the biased distribution
        if options.logit_bias:
            bias = np.zeros(self.backend.vocab_size, np.float32)
            for token, value in options.logit_bias.items():
                bias[token] = value
            rule = with_logit_bias(rule, bias)
        return stop_at_ids(rule, self.tokenizer.stop_ids)

    @staticmethod
    def _rows(sink: list[np.ndarray], tokens: list[int]) -> list[np.ndarray | None]:
        """The captured logits rows of this cycle's tokens (Nones when logprobs are off)."""
        if not sink:
            return [None] * len(tokens)
        rows = sink[: len(tokens)]  # the rule may have captured rows past a stop id it then cut off
        sink.clear()
        return rows

    def _finish(self, emit: Callable[[Event], None], reason: str, job: GenerationJob, prefill: PrefillStats,
                num_generated: int, decode_s: float, spec: SpecStats) -> Finished:
        finished = Finished(reason, len(job.prompt.ids), prefill.num_reused, num_generated, prefill.seconds,
                            decode_s, spec, self.backend.num_tokens)
        emit(finished)
        return finished
