"""Generated token ids -> text for the client: UTF-8 kept whole, stop strings found across token boundaries, and each
token's logprobs released together with its text.

Text that could be the start of a stop string is held back until the next token decides; when a stop string
appears, the text before it is released and generation stops (the stop string itself is not returned, as OpenAI does).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from engine.text.tokenizer import Tokenizer


@dataclass(slots=True)
class TokenLogprob:
    """A generated token's log-probability under the model, and the likeliest alternatives at its position."""

    token_id: int
    text: str
    raw: bytes
    logprob: float
    top: list[tuple[int, str, bytes, float]] = field(default_factory=list)  # (id, text, bytes, logprob)


def token_logprob(tokenizer: Tokenizer, logits: np.ndarray, token_id: int, num_top: int) -> TokenLogprob:
    """log_softmax of the model's (biased) logits at the chosen token, plus the num_top likeliest tokens."""
    # logits: [V]
    x = logits.astype(np.float64)
    log_probs = x - (x.max() + np.log(np.exp(x - x.max()).sum()))

    def entry(i: int) -> tuple[int, str, bytes, float]:
        """(id, text, bytes, logprob) of token i."""
        raw = tokenizer.token_bytes(i)
        return i, raw.decode("utf-8", errors="replace"), raw, float(log_probs[i])

    top: list[tuple[int, str, bytes, float]] = []
    if num_top > 0:
        best = np.argpartition(-log_probs, min(num_top, x.shape[0] - 1))[:num_top]
        top = [entry(int(i)) for i in best[np.argsort(-log_probs[best], kind="stable")]]
    _, text, raw, value = entry(token_id)
    return TokenLogprob(token_id, text, raw, value, top)


def _held_length(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


class TextStream:
    """Feeds generated ids, returns (text, logprobs) ready to send; see the module docstring."""

    def __init__(self, tokenizer: Tokenizer, stops: list[str]):
        self._decoder = tokenizer.stream()
        self._stops = stops
        self._held = ""  # decoded text not yet released
        self._decoded = 0  # characters decoded so far
        self._released = 0  # characters released so far
        self._logprobs: deque[tuple[int, int, TokenLogprob]] = deque()  # (start, end, entry) not yet released
        self.is_stopped = False

    def feed(self, token_id: int, logprob: TokenLogprob | None = None) -> tuple[str, list[TokenLogprob]]:
        """Text and logprobs completed by one more token (empty while held back)."""
        assert not self.is_stopped, "feed() after a stop string"
        piece = self._decoder.feed(token_id)
        start, self._decoded = self._decoded, self._decoded + len(piece)
        if logprob is not None:
            self._logprobs.append((start, self._decoded, logprob))
        text = self._held + piece
        found = [i for i in (text.find(stop) for stop in self._stops) if i >= 0]
        if found:
            self.is_stopped = True
            return self._release(text[: min(found)], partial=True)
        keep = _held_length(text, self._stops)
        self._held = text[len(text) - keep :]
        return self._release(text[: len(text) - keep], partial=False)

    def finish(self) -> tuple[str, list[TokenLogprob]]:
        """Everything held back (nothing after a stop string)."""
        if self.is_stopped:
            return "", []
        text = self._held + self._decoder.flush()
        self._held = ""
        out, entries = self._release(text, partial=True)
        entries.extend(entry for _, _, entry in self._logprobs)  # tokens with no text of their own
        self._logprobs.clear()
        return out, entries

    def _release(self, text: str, partial: bool) -> tuple[str, list[TokenLogprob]]:
        """Release text; with it the logprobs of tokens whose text is now out (partial: also tokens cut by it)."""
        self._released += len(text)
        out: list[TokenLogprob] = []
        while self._logprobs:
            start, end, entry = self._logprobs[0]
            if end <= self._released or (partial and start < self._released):
                out.append(entry)
                self._logprobs.popleft()
            else:
                break
        return text, out
