"""The live engine panel: which backend serves and why, its speeds, drafts, context, and the GPU from NVML."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Sparkline, Static

from openjet_tui.runtime.hardware import GpuSample
from openjet_tui.ui.figures import EngineFigures, format_rate, format_tokens

if TYPE_CHECKING:
    from openjet_tui.runtime.engines import Decision

BAR_CELLS = 8
DECISION_MARKS = {"chosen": ("✓", "bold $text-success"), "ok": ("·", "$text-muted"), "no": ("✗", "$text-error")}


def context_bar(used: int | None, window: int | None) -> Content:
    """'3.2k / 32k ███░░░░░░ 10%' (or what is known of it)."""
    if used is None:
        return Content(f"-/{format_tokens(window)}" if window else "-")
    if not window:
        return Content(f"{format_tokens(used)}/? (window unknown)")
    share = min(1.0, used / window)
    filled = round(share * BAR_CELLS)
    style = "$text-error" if share > 0.8 else "$text-warning" if share > 0.6 else "$text-success"
    return Content.assemble(f"{format_tokens(used)}/{format_tokens(window)} ", ("█" * filled, style),
                            ("░" * (BAR_CELLS - filled), "$text-muted"), f" {share:.0%}")


def gpu_lines(gpus: list[GpuSample], note: str) -> Content:
    """One block per GPU: name, utilisation, VRAM used/total, temperature, power."""
    if not gpus:
        return Content.styled(note or "no GPU figures yet", "$text-muted")
    blocks = []
    for gpu in gpus:
        temperature = f"{gpu.temperature_c} °C" if gpu.temperature_c is not None else "- °C"
        power = f"{gpu.power_w:.0f} W" if gpu.power_w is not None else "- W"
        blocks.append(Content.assemble((gpu.name, "bold"), "\n",
                                       f"util {gpu.utilization_pct}% · VRAM {gpu.vram_used / 2**30:.1f}/"
                                       f"{gpu.vram_total / 2**30:.1f} GiB\n{temperature} · {power}"))
    return Content("\n").join(blocks)


def decision_title(decision: Decision) -> Content:
    """'✓ OpenJet per-op CUDA' (chosen, bold), '· ...' (available, not chosen) or '✗ ...' (not available)."""
    verdict = "chosen" if decision.is_chosen else "ok" if decision.is_available else "no"
    mark, style = DECISION_MARKS[verdict]
    return Content.assemble((f"{mark} ", style), Content.styled(decision.label, "bold" if decision.is_chosen else ""))


def _row(label: str, value: Content | str) -> Content:
    return Content.assemble((f"{label:<8}", "$text-muted"), value)


class EnginePanel(VerticalScroll):
    """Figures reported by the engine and NVML; parents set the reactives, the panel redraws itself."""

    DEFAULT_CSS = """
    EnginePanel {
        width: 38; height: 1fr; border: round $panel-lighten-2; padding: 0 1; background: $surface;
        scrollbar-size-vertical: 1;
    }
    EnginePanel .panel-section { margin-top: 1; text-style: bold; color: $text-accent; }
    EnginePanel #engine-reason { color: $text-muted; padding-left: 8; }
    EnginePanel Sparkline { height: 1; margin-left: 8; }
    EnginePanel #engine-source { color: $text-muted; margin-top: 1; }
    EnginePanel #engine-report { color: $text-muted; padding-left: 8; }
    EnginePanel #engine-selection { height: auto; }
    EnginePanel .decision-reason { color: $text-muted; padding-left: 2; }
    """
    backend: reactive[str] = reactive("connecting…")
    reason: reactive[str] = reactive("")
    model: reactive[str] = reactive("-")
    figures: reactive[EngineFigures] = reactive(EngineFigures, always_update=True)
    gpus: reactive[list[GpuSample]] = reactive(list, always_update=True)
    gpu_note: reactive[str] = reactive("")
    report: reactive[str] = reactive("")  # the engine's own word on its backend (/metrics), beside the choice
    decisions: reactive[list[Decision]] = reactive(list, always_update=True)  # when the app chose the engine

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.border_title = "engine"

    def compose(self) -> ComposeResult:
        """Backend and why, model, speeds with a sparkline, drafts, context, GPU, every engine considered."""
        yield Static(id="engine-backend")
        yield Static(id="engine-reason")
        yield Static(id="engine-report")
        yield Static(id="engine-model")
        yield Static(id="engine-decode")
        yield Sparkline([], id="engine-sparkline")
        yield Static(id="engine-speeds")
        yield Static(id="engine-source")
        yield Static("GPU", classes="panel-section")
        yield Static(id="engine-gpu")
        yield Static("engine selection", id="selection-title", classes="panel-section")
        yield Vertical(id="engine-selection")

    def on_mount(self) -> None:
        """Draw the initial state."""
        self._draw_engine()
        self._draw_figures()
        self._draw_gpu()
        self._draw_selection()

    def watch_backend(self) -> None:
        """Redraw the backend lines."""
        self._draw_engine()

    def watch_reason(self) -> None:
        """Redraw the backend lines."""
        self._draw_engine()

    def watch_model(self) -> None:
        """Redraw the backend lines."""
        self._draw_engine()

    def watch_report(self) -> None:
        """Redraw the backend lines."""
        self._draw_engine()

    def watch_decisions(self) -> None:
        """Redraw the engine selection."""
        self._draw_selection()

    def watch_figures(self) -> None:
        """Redraw speeds, drafts and context."""
        self._draw_figures()

    def watch_gpus(self) -> None:
        """Redraw the GPU block."""
        self._draw_gpu()

    def watch_gpu_note(self) -> None:
        """Redraw the GPU block."""
        self._draw_gpu()

    def _draw_engine(self) -> None:
        if not self.children:  # not composed yet: on_mount draws
            return
        self.query_one("#engine-backend", Static).update(_row("backend", Content.styled(self.backend, "bold")))
        self.query_one("#engine-reason", Static).update(Content(self.reason))
        report = self.query_one("#engine-report", Static)
        report.update(Content(f"engine reports {self.report}"))
        report.display = bool(self.report)
        self.query_one("#engine-model", Static).update(_row("model", self.model))

    def _draw_figures(self) -> None:
        if not self.children:  # not composed yet: on_mount draws
            return
        figures = self.figures
        self.query_one("#engine-decode", Static).update(_row("decode", format_rate(figures.decode_tps)))
        self.query_one(Sparkline).data = list(figures.decode_history)
        rate, length = figures.acceptance_rate, figures.acceptance_length
        lines = [_row("prefill", format_rate(figures.prefill_tps)),
                 _row("drafts", "- (none reported)" if rate is None else f"{rate:.0%} accepted"),
                 _row("length", "-" if length is None else f"{length:.2f} tok/pass"),
                 _row("context", context_bar(figures.context_used, figures.context_window))]
        self.query_one("#engine-speeds", Static).update(Content("\n").join(lines))
        source = {"estimated": "speed estimated from chunk timing: the server reports none",
                  "": "no figures reported yet"}.get(figures.source, f"figures from the server's {figures.source}")
        self.query_one("#engine-source", Static).update(source)

    def _draw_gpu(self) -> None:
        if self.children:
            self.query_one("#engine-gpu", Static).update(gpu_lines(self.gpus, self.gpu_note))

    def _draw_selection(self) -> None:
        if not self.children:  # not composed yet: on_mount draws
            return
        box = self.query_one("#engine-selection", Vertical)
        box.remove_children()
        for decision in self.decisions:  # in preference order, each with why (reasons wrap under their engine)
            box.mount(Static(decision_title(decision), classes="decision"),
                      Static(decision.reason, classes="decision-reason", markup=False))
        self.query_one("#selection-title").display = box.display = bool(self.decisions)
