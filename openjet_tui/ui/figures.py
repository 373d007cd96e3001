"""Engine figures for the engine panel: what the server reported, from its `/metrics` or a response's `timings`.

Speeds are never computed from chunk arrival times when the server reports them; only a server that reports neither
gets an estimate, and the panel labels it as one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from openjet_tui.agent import events as ev

HISTORY_LENGTH = 40  # decode speeds kept for the sparkline (one per request)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# Prometheus names per figure: OpenJet's engine first, then llama-server's (`--metrics`).
DECODE = ("openjet_decode_tokens_per_second", "llamacpp:predicted_tokens_seconds")
PREFILL = ("openjet_prefill_tokens_per_second", "llamacpp:prompt_tokens_seconds")
DRAFTED = ("openjet_draft_tokens_total", "llamacpp:spec_decode_num_draft_tokens_total")
ACCEPTED = ("openjet_draft_accepted_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total")
GENERATED = ("openjet_generated_tokens_total", "llamacpp:tokens_predicted_total")
CONTEXT_USED = ("openjet_context_tokens",)
CONTEXT_SIZE = ("openjet_context_size",)


@dataclass(slots=True)
class MetricSample:
    """One Prometheus sample: name, labels and value."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[MetricSample]:
    """Samples of a Prometheus text exposition; comment lines and unparsable values are skipped."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        labels = {k: bytes(v, "utf-8").decode("unicode_escape") for k, v in _LABEL.findall(match.group(2) or "")}
        samples.append(MetricSample(match.group(1), labels, value))
    return samples


@dataclass(slots=True)
class EngineFigures:
    """Speed and context figures of the engine serving the conversation, and where they came from."""

    decode_tps: float | None = None
    prefill_tps: float | None = None
    acceptance_rate: float | None = None  # share of drafted tokens the model accepted
    acceptance_length: float | None = None  # tokens emitted per verify pass
    context_used: int | None = None
    context_window: int | None = None
    source: str = ""  # "timings" | "/metrics" | "estimated"
    decode_history: list[float] = field(default_factory=list)
    num_generated_seen: float | None = None  # the /metrics generated-token counter at the last poll

    def record_decode(self, tps: float) -> None:
        """Keep a decode speed for the sparkline."""
        self.decode_tps = tps
        self.decode_history.append(tps)
        del self.decode_history[:-HISTORY_LENGTH]

    def apply_timings(self, prompt_per_second: float | None, predicted_n: int | None,
                      predicted_per_second: float | None, draft_n: int | None,
                      draft_n_accepted: int | None) -> None:
        """Fold in one response's `timings` (llama.cpp's shape, which OpenJet's engine also sends)."""
        if predicted_per_second is not None and math.isfinite(predicted_per_second):
            self.record_decode(predicted_per_second)
        if prompt_per_second is not None and math.isfinite(prompt_per_second):
            self.prefill_tps = prompt_per_second
        if draft_n and draft_n_accepted is not None:
            self.acceptance_rate = draft_n_accepted / draft_n
            if predicted_n and predicted_n > draft_n_accepted:
                # every verify pass emits its accepted drafts plus one token of its own
                self.acceptance_length = predicted_n / (predicted_n - draft_n_accepted)
        self.source = "timings"

    def apply_metrics(self, samples: list[MetricSample]) -> bool:
        """Fold in a /metrics scrape; True when it carried any engine figure."""
        values = {s.name: s.value for s in samples if not s.labels}
        def first(names: tuple[str, ...]) -> float | None:
            """The first of these metrics the server exports."""
            return next((values[n] for n in names if n in values), None)
        generated = first(GENERATED)
        is_new_request = generated is not None and generated != self.num_generated_seen
        decode = first(DECODE)
        if decode is not None and decode > 0 and (is_new_request or self.decode_tps is None):
            self.record_decode(decode)
        self.num_generated_seen = generated
        prefill = first(PREFILL)
        if prefill:
            self.prefill_tps = prefill
        self._apply_drafts(values, first(DRAFTED), first(ACCEPTED))
        used, size = first(CONTEXT_USED), first(CONTEXT_SIZE)
        self.context_used = int(used) if used is not None else self.context_used
        self.context_window = int(size) if size else self.context_window
        found = any(v is not None for v in (generated, decode, prefill, used))
        if found:
            self.source = "/metrics"
        return found

    def _apply_drafts(self, values: dict[str, float], drafted: float | None, accepted: float | None) -> None:
        if drafted and accepted is not None:
            self.acceptance_rate = accepted / drafted
        if values.get("openjet_acceptance_length"):
            self.acceptance_length = values["openjet_acceptance_length"]
        elif values.get("llamacpp:spec_decode_num_drafts_total") and accepted is not None:
            passes = values["llamacpp:spec_decode_num_drafts_total"]
            self.acceptance_length = (accepted + passes) / passes

    def estimate_decode(self, completion_tokens: int, seconds: float) -> bool:
        """Chunk-timing estimate, used only while the server has reported no speed at all; True when recorded."""
        if self.source not in ("", "estimated") or seconds <= 0 or completion_tokens <= 0:
            return False
        self.record_decode(completion_tokens / seconds)
        self.source = "estimated"
        return True


def is_local(event: ev.UsageReported | ev.EngineStats | ev.ToolResult) -> bool:
    """Whether the local engine served it (with Slipstream, "cloud" events are the orchestrator's)."""
    return event.origin != "cloud"


class ChunkTiming:
    """Chunk-timing decode estimates for requests whose server reported no timings.

    The agent emits a request's EngineStats (only when the server reported them) before its UsageReported, so when
    the usage is emitted it is known whether the speed was reported. Cloud requests (the Slipstream orchestrator)
    are not the local engine's: not timed.
    """

    def __init__(self) -> None:
        self._started: float | None = None  # when the current local request was sent
        self._is_reported = False  # the current request's server sent timings
        self._seconds: dict[int, float] = {}  # id(UsageReported) -> seconds its unreported request streamed

    def clock(self, event: ev.Event, now: float) -> None:
        """As events are emitted: note when local requests start, whether timings came, and how long each streamed."""
        if isinstance(event, ev.TurnStarted) or (isinstance(event, ev.ToolResult) and is_local(event)):
            self._started, self._is_reported = now, False
        elif isinstance(event, ev.EngineStats) and is_local(event):
            self._is_reported = True
        elif isinstance(event, ev.UsageReported) and is_local(event) and self._started is not None:
            if not self._is_reported:
                self._seconds[id(event)] = now - self._started
            self._is_reported = False  # the next request of the same step is timed afresh

    def settle(self, event: ev.Event, figures: EngineFigures) -> bool:
        """As events are drawn: apply a usage report's estimate; True when the figures changed."""
        if not isinstance(event, ev.UsageReported):
            return False
        seconds = self._seconds.pop(id(event), None)
        return seconds is not None and figures.estimate_decode(event.completion_tokens, seconds)


def backend_info(samples: list[MetricSample]) -> dict[str, str]:
    """The labels of OpenJet's `openjet_backend_info` sample (backend, backend_reason, model), if any."""
    return next((s.labels for s in samples if s.name == "openjet_backend_info"), {})


def format_rate(value: float | None) -> str:
    """'42.1 tok/s', '1,234 tok/s' or '-'."""
    if value is None:
        return "-"
    return f"{value:,.1f} tok/s" if value < 100 else f"{value:,.0f} tok/s"


def format_tokens(value: int | None) -> str:
    """'850', '3.2k', '262k' or '?'."""
    if value is None:
        return "?"
    if value < 1000:
        return str(value)
    return f"{value / 1000:.1f}k" if value < 100_000 else f"{value // 1000}k"


def format_bytes(value: int) -> str:
    """'512 B', '12.4 KiB', '3.1 MiB'."""
    if value < 1024:
        return f"{value} B"
    if value < 1024 ** 2:
        return f"{value / 1024:.1f} KiB"
    return f"{value / 1024 ** 2:.1f} MiB"
