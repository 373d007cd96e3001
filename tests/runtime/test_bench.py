"""`openjet bench`: summaries, the side-by-side table, and engines that cannot be measured say why."""

from __future__ import annotations

import json

import pytest

from engine.gguf.testmodel import write_test_model
from openjet_tui.runtime import bench_cmd
from openjet_tui.runtime.bench import PROMPTS, EngineBench, PromptResult, format_table


def test_summary_and_table():
    ours = EngineBench("megakernel", "fits", results=[
        PromptResult("a", 20, 100, 0.05, 1.05, 100.0, 4000.0, draft_n=40, draft_accepted=30),
        PromptResult("b", 30, 100, 0.15, 1.15, 120.0, 2000.0, draft_n=60, draft_accepted=30)])
    summary = ours.summary()
    assert summary["decode_tps"] == 110.0 and summary["prefill_tps"] == 3000.0
    assert summary["ttft_ms"] == pytest.approx(100.0) and summary["acceptance"] == 0.6
    peer = EngineBench("llama-server", "", error="not on PATH and not built yet")
    header, first, second = format_table([ours, peer])
    assert header.split() == ["engine", "decode", "tok/s", "prefill", "tok/s", "TTFT", "ms", "acceptance"]
    assert first.split() == ["megakernel", "110.0", "3000.0", "100", "0.60"]
    assert second.endswith("not measured: not on PATH and not built yet")
    assert set(PROMPTS) == {"short-answer", "write-function", "edit-rename", "edit-dedupe"}


def test_unavailable_engines_are_reported_not_crashed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("OPENJET_LLAMA_SERVER", raising=False)
    model = write_test_model(tmp_path / "tiny.gguf", "qwen2", tokenizer=False)
    out = tmp_path / "bench.json"
    code = bench_cmd.main(["--model", str(model), "--vs", "llama-server", "--only-vs", "--json", "--out", str(out)])
    document = json.loads(out.read_text())
    peer = document["engines"][-1]
    assert peer["engine"] == "llama-server" and "not on PATH and not built yet" in peer["error"]
    assert json.loads(capsys.readouterr().out) == document and document["model"] == str(model)
    assert code == 1 and len(document["engines"]) == 1


def test_bench_needs_a_model(capsys):
    assert bench_cmd.main([]) == 2
    assert "no model is set up yet" in capsys.readouterr().err
    assert bench_cmd.main(["--model", "qwen3-8b"]) == 2
    assert "is not downloaded and verified" in capsys.readouterr().err


def test_bench_measures_the_reference_engine_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    """`openjet bench --model F --max-tokens 4` starts OpenJet's engine for the file, runs the fixed prompt set and
    reports decode and prefill tok/s, time to first token and draft acceptance for each engine."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("OPENJET_LLAMA_SERVER", raising=False)
    model = write_test_model(tmp_path / "tiny.gguf", "qwen2")  # with the tokenizer: it must chat
    out = tmp_path / "bench.json"
    assert bench_cmd.main(["--model", str(model), "--max-tokens", "4", "--ctx", "2048", "--out", str(out)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["engine", "decode", "tok/s", "prefill", "tok/s", "TTFT", "ms", "acceptance"]
    [bench] = json.loads(out.read_text())["engines"]
    assert bench["engine"] in ("reference", "cuda") and not bench["error"]
    assert [r["prompt"] for r in bench["results"]] == list(PROMPTS)
    assert all(1 <= r["completion_tokens"] <= 4 and r["prompt_tokens"] > 10 for r in bench["results"])
    summary = bench["summary"]
    assert summary["decode_tps"] > 0 and summary["prefill_tps"] > 0 and summary["ttft_ms"] > 0
    assert "acceptance" in summary  # None when the engine drafted nothing in 4 tokens
    cells = row.split()
    assert cells[0] == bench["engine"] and float(cells[1]) == pytest.approx(summary["decode_tps"], abs=0.05)
    assert float(cells[2]) == pytest.approx(summary["prefill_tps"], abs=0.05)
    assert cells[4] == ("-" if summary["acceptance"] is None else f"{summary['acceptance']:.2f}")
