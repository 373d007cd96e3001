"""The engine panel: figures from the response `timings` and from a polled /metrics (OpenJet's and llama-server's
names), never estimated from chunk timing for a request whose server reported them, never the Slipstream cloud
model's; GPU figures from NVML samples."""

from __future__ import annotations

import pytest

from openjet_tui.runtime.hardware import GpuSample
from openjet_tui.ui.figures import EngineFigures, backend_info, parse_prometheus
from openjet_tui.ui.screens.confirm import SlipstreamConfirm
from tests.agent.scripted_server import ScriptedServer, call, openjet_metrics, reply
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


TIMINGS = {"prompt_n": 120, "prompt_per_second": 880.0, "predicted_n": 20, "predicted_per_second": 42.5,
           "draft_n": 10, "draft_n_accepted": 7}


def panel_text(panel, selector: str) -> str:
    """What one part of the engine panel shows."""
    return str(panel.query_one(selector).render())


async def test_reported_timings_leave_no_estimate_in_the_sparkline(server, workspace, make_app):
    # the agent emits each request's usage before its timings, as it does for every real server
    (workspace / "a.py").write_text("print(1)\n")
    server.push(reply(tool_calls=[call("read_file", path="a.py")], timings=TIMINGS, delay_s=0.01),
                reply("It prints 1.", timings={**TIMINGS, "predicted_per_second": 40.0}, delay_s=0.01))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "what does a.py do?")
        await wait_idle(pilot)
        figures = app.chat.figures
        assert figures.decode_history == [42.5, 40.0] and figures.source == "timings"
        assert "40.0 tok/s" in panel_text(app.chat.engine_panel, "#engine-decode")


async def test_a_server_without_timings_gets_one_labelled_estimate_per_request(server, workspace, make_app):
    (workspace / "a.py").write_text("print(1)\n")
    server.push(reply(tool_calls=[call("read_file", path="a.py")], delay_s=0.01),
                reply("It prints 1, as the file says.", delay_s=0.01))
    app = make_app(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "what does a.py do?")
        await wait_idle(pilot)
        figures = app.chat.figures
        assert len(figures.decode_history) == 2 and figures.source == "estimated"
        assert figures.decode_tps == figures.decode_history[-1] > 0
        assert "estimated from chunk timing" in panel_text(app.chat.engine_panel, "#engine-source")


async def test_slipstream_cloud_figures_never_reach_the_local_engine_panel(server, workspace, make_app):
    from tests.ui.test_slipstream import configure

    cloud_usage = {"prompt_tokens": 90000, "completion_tokens": 50, "total_tokens": 90050}
    cloud_timings = {**TIMINGS, "predicted_per_second": 999.0}
    with ScriptedServer([reply(tool_calls=[call("delegate_local", task="say hi")], usage=cloud_usage,
                               timings=cloud_timings, delay_s=0.01),
                         reply("Done.", usage=cloud_usage, timings=cloud_timings, delay_s=0.01)],
                        model="cloud-model") as cloud:
        configure(workspace, cloud)
        server.push(reply("hi", delay_s=0.01, timings=TIMINGS,
                          usage={"prompt_tokens": 900, "completion_tokens": 20, "total_tokens": 920}))
        app = make_app(server)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, app.controller.ready.is_set, what="the connection")
            await pilot.press("f3")
            await wait_for(pilot, lambda: isinstance(app.screen, SlipstreamConfirm), what="the confirmation")
            await pilot.press("y")
            await wait_for(pilot, lambda: app.chat.banner.is_on, what="the banner")
            await send(pilot, "greet me")
            await wait_idle(pilot)
            assert len(cloud.chat_bodies) == 2 and len(server.chat_bodies) == 1  # the delegate ran locally
            figures = app.chat.figures
            assert figures.decode_history == [42.5] and figures.source == "timings"  # no 999, no estimate
            assert figures.context_used == 920 and app.chat.status_bar.context_used == 920
            assert "920/32.8k" in panel_text(app.chat.engine_panel, "#engine-speeds")


async def test_metrics_are_polled_from_the_server(server, workspace):
    from openjet_tui.ui.app import OpenJetApp
    from openjet_tui.ui.controller import LaunchOptions

    server.metrics = openjet_metrics(decode_tps=55.5, prefill_tps=1234.0, generated=40, drafted=20, accepted=15,
                                     acceptance_length=2.5, context_tokens=700, context_size=4096,
                                     backend="cuda", backend_reason="per-op kernels: the megakernel runs qwen35 only")
    app = OpenJetApp(LaunchOptions(provider="llama-server", base_url=server.base_url, workspace=workspace),
                     gpu_sampler=None, poll_metrics=True, watch_workspace=False)
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.chat.engine_panel
        await wait_for(pilot, lambda: panel.backend == "cuda", what="the backend from /metrics")
        assert panel.reason == "per-op kernels: the megakernel runs qwen35 only"
        await wait_for(pilot, lambda: "55.5 tok/s" in panel_text(panel, "#engine-decode"), what="the speed")
        speeds = panel_text(panel, "#engine-speeds")
        assert "1,234 tok/s" in speeds and "75% accepted" in speeds and "2.50 tok/pass" in speeds
        assert "700/4.1k" in speeds and "figures from the server's /metrics" in panel_text(panel, "#engine-source")
        server.metrics = openjet_metrics(decode_tps=61.0, generated=90, backend="cuda")  # one more request
        await wait_for(pilot, lambda: app.chat.figures.decode_history == [55.5, 61.0], what="the next request")
    assert sum(r.path == "/metrics" for r in server.requests) >= 2


async def test_panel_shows_timings_context_and_gpu(server, workspace):
    from openjet_tui.ui.app import OpenJetApp
    from openjet_tui.ui.controller import LaunchOptions

    server.push(reply("hi", timings=TIMINGS, usage={"prompt_tokens": 1200, "completion_tokens": 20,
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


async def test_panel_lists_every_engine_decision_with_the_chosen_one_first_class(server, workspace, tiny_model_path):
    from pathlib import Path

    from openjet_tui.runtime.engines import Facts, select_engine
    from openjet_tui.runtime.ggufinfo import read_model_info
    from openjet_tui.runtime.hardware import HardwareInfo
    from openjet_tui.runtime.launch import EngineSession
    from openjet_tui.runtime.progress import ProgressEvent
    from openjet_tui.ui.app import OpenJetApp
    from openjet_tui.ui.controller import LaunchOptions

    model = read_model_info(tiny_model_path("qwen2", hidden_size=64, ffn_size=128, num_heads=2, num_kv_heads=1,
                                            head_dim=32))
    no_gpu = HardwareInfo(nvml_error="the NVIDIA driver library (libnvidia-ml) is not installed", num_cpus=2)
    selection = select_engine(Facts(hardware=no_gpu, model=model))  # this machine's story: no GPU, no llama-server
    chosen = selection.chosen
    assert chosen is not None and chosen.engine == "reference"

    def start_engine(progress, on_event, airgapped) -> EngineSession:
        """What runtime.launch.start_engine returns once its worker is healthy (here the scripted server serves)."""
        assert airgapped is False  # the workspace's setting reaches the runtime
        progress(ProgressEvent("starting the engine", 50, 100, "%"))
        return EngineSession("reference", "openjet", server.base_url, None, chosen.reason, selection)

    server.metrics = openjet_metrics(backend="reference", backend_reason="--backend reference: numpy on the CPU")
    app = OpenJetApp(LaunchOptions(provider="openjet", workspace=workspace), gpu_sampler=None,
                     poll_metrics=True, watch_workspace=False, engine_starter=start_engine)
    async with app.run_test(size=(120, 60)) as pilot:
        panel = app.chat.engine_panel
        await wait_for(pilot, app.controller.ready.is_set, what="the connection")
        assert panel.backend == "OpenJet reference engine (CPU, slow)" and panel.reason == chosen.reason
        await wait_for(pilot, lambda: panel.query(".decision"), what="the engine selection")
        listed = [str(part.render()) for part in panel.query("#engine-selection Static")]
        assert len(listed) == 2 * len(selection.decisions)  # each engine: its name, then why
        assert listed[0] == "✗ OpenJet megakernel (CUDA)" and "no NVIDIA GPU" in listed[1]
        assert listed[2:6:2] == ["✗ OpenJet per-op CUDA", "✗ llama-server"]
        assert listed[6:10:2] == ["✗ Ollama", "✗ LM Studio"] and listed[7] == "not probed"
        assert listed[10:] == ["✓ OpenJet reference engine (CPU, slow)", chosen.reason]
        # the engine's own word on its backend (/metrics) stands beside the app's choice, not over it
        await wait_for(pilot, lambda: panel.report, what="the engine's report")
        assert panel_text(panel, "#engine-report") == "engine reports reference: --backend reference: numpy on the CPU"
        assert panel.backend == "OpenJet reference engine (CPU, slow)" and panel.reason == chosen.reason
