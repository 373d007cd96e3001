"""The engine panel: figures from the response `timings` and from /metrics (OpenJet's and llama-server's names),
never replaced by an estimate once the server reports them; GPU figures from NVML samples."""

from __future__ import annotations

import pytest

from openjet_tui.runtime.hardware import GpuSample
from openjet_tui.ui.figures import EngineFigures, backend_info, parse_prometheus
from tests.agent.scripted_server import reply
from tests.ui.support import send, wait_for, wait_idle

OPENJET_METRICS = """# HELP openjet_decode_tokens_per_second Decode speed of the last request
# TYPE openjet_decode_tokens_per_second gauge
openjet_decode_tokens_per_second 105.4
openjet_prefill_tokens_per_second 4190.0
openjet_generated_tokens_total 512.0
openjet_draft_tokens_total 400.0
openjet_draft_accepted_tokens_total 300.0
openjet_acceptance_length 3.28
openjet_context_tokens 5800.0
openjet_context_size 32768.0
openjet_requests_total{outcome="stop"} 3.0
openjet_backend_info{backend="megakernel",backend_reason="sm_90 with 139 GiB free",model="qwen3.8-27b"} 1.0
"""
LLAMA_METRICS = """llamacpp:prompt_tokens_seconds 2429.5
llamacpp:predicted_tokens_seconds 77.4
llamacpp:tokens_predicted_total 90
llamacpp:spec_decode_num_draft_tokens_total 60
llamacpp:spec_decode_num_accepted_tokens_total 45
llamacpp:spec_decode_num_drafts_total 30
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 25
"""


def test_openjet_metrics_give_every_figure_and_the_backend():
    figures = EngineFigures()
    samples = parse_prometheus(OPENJET_METRICS)
    assert figures.apply_metrics(samples)
    assert (figures.decode_tps, figures.prefill_tps) == (105.4, 4190.0)
    assert figures.acceptance_rate == 0.75 and figures.acceptance_length == 3.28
    assert (figures.context_used, figures.context_window, figures.source) == (5800, 32768, "/metrics")
    assert backend_info(samples) == {"backend": "megakernel", "backend_reason": "sm_90 with 139 GiB free",
                                     "model": "qwen3.8-27b"}
    figures.apply_metrics(samples)  # the same scrape again: no new request, no new sparkline point
    assert figures.decode_history == [105.4]


def test_llama_server_metrics_give_acceptance_length_per_verify_pass():
    figures = EngineFigures()
    assert figures.apply_metrics(parse_prometheus(LLAMA_METRICS))
    assert figures.decode_tps == 77.4 and figures.prefill_tps == 2429.5
    assert figures.acceptance_rate == 0.75 and figures.acceptance_length == pytest.approx((45 + 30) / 30)
    assert not EngineFigures().apply_metrics(parse_prometheus("# nothing here\nprocess_cpu_seconds_total 3\n"))


def test_an_estimate_never_replaces_reported_figures():
    figures = EngineFigures()
    figures.apply_timings(900.0, 20, 42.5, None, None)
    figures.estimate_decode(100, 0.5)  # 200 tok/s by chunk timing: ignored, the server reported 42.5
    assert (figures.decode_tps, figures.source) == (42.5, "timings")
    fresh = EngineFigures()
    fresh.estimate_decode(100, 0.5)
    assert (fresh.decode_tps, fresh.source) == (200.0, "estimated")


async def test_panel_shows_timings_context_and_gpu(server, workspace):
    from openjet_tui.ui.app import OpenJetApp
    from openjet_tui.ui.controller import LaunchOptions

    timings = {"prompt_n": 120, "prompt_per_second": 880.0, "predicted_n": 20, "predicted_per_second": 42.5,
               "draft_n": 10, "draft_n_accepted": 7}
    server.push(reply("hi", timings=timings, usage={"prompt_tokens": 1200, "completion_tokens": 20,
                                                    "total_tokens": 1220}))
    gpu = GpuSample(0, "NVIDIA H200", 87, 20 * 2**30, 140 * 2**30, 61, 312.4)
    app = OpenJetApp(LaunchOptions(provider="llama-server", base_url=server.base_url, workspace=workspace),
                     gpu_sampler=lambda: [gpu], poll_metrics=False, watch_workspace=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "hello")
        await wait_idle(pilot)
        panel = app.chat.engine_panel
        speeds = str(panel.query_one("#engine-speeds").render())
        assert "42.5 tok/s" in str(panel.query_one("#engine-decode").render())
        assert "880 tok/s" in speeds and "70% accepted" in speeds and "1.54 tok/pass" in speeds
        assert "1.2k/32.8k" in speeds  # the scripted server's window is 32,768 tokens
        assert "figures from the server's timings" in str(panel.query_one("#engine-source").render())
        await wait_for(pilot, lambda: panel.gpus, what="the GPU sample")
        gpu_text = str(panel.query_one("#engine-gpu").render())
        assert "NVIDIA H200" in gpu_text and "util 87% · VRAM 20.0/140.0 GiB" in gpu_text
        assert "61 °C · 312 W" in gpu_text
        assert "llama-server" in str(panel.query_one("#engine-backend").render())


async def test_panel_reads_nvml_or_says_why_it_cannot(server, workspace):
    from openjet_tui.ui.app import OpenJetApp
    from openjet_tui.ui.controller import LaunchOptions

    app = OpenJetApp(LaunchOptions(provider="llama-server", base_url=server.base_url, workspace=workspace),
                     poll_metrics=False, watch_workspace=False)  # the real NVML sampler
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.chat.engine_panel
        await wait_for(pilot, lambda: panel.gpus or panel.gpu_note, what="NVML figures or the reason for none")
        text = str(panel.query_one("#engine-gpu").render())
        assert (panel.gpus and "util" in text) or text.startswith("no NVIDIA GPU: ")
