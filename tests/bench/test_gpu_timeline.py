"""The timeline's analysis (bench/gpu_timeline.py) on made-up replays: CUPTI's demangled names read as instance
names, a Chrome trace's kernels as spans, and a replay split into increments that add up to its wall time with
overlapping (PDL) spans and kernels on a second stream."""

from __future__ import annotations

import pytest

from bench.gpu_timeline import (TOKEN_COUNTS, TOKENS_ENV, Span, instance_names, kernel_name, spans_of_trace, summarize,
                                table, token_counts)


def test_demangled_names_read_as_instance_names() -> None:
    names = instance_names()
    assert kernel_name("void mmvq_i8b<2, 2>(TensorMap, unsigned char const*, signed char const*)",
                       names) == "mmvq_q4_K_i8b_s2n2"
    assert kernel_name("void mmvq_i8b<3, 2, true>(TensorMap, unsigned char const*)", names) == \
        "mmvq_q4_K_i8b_s3n2_halves"
    assert kernel_name("void act_from<1, 1, 1>(ActSrc, unsigned short*, Act8, int, int)", names) == "act_rmsnorm_t1"
    assert kernel_name("rms_norm(float const*, float const*, float*, int, int, int, float)", names) == "rms_norm"
    assert kernel_name("void something_else<Foo<1>, 2>(int)", names) == "something_else<Foo<1>, 2>"


def test_a_chrome_traces_kernels_become_spans_in_start_order() -> None:
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "rms_norm(float const*)", "ts": 20.0, "dur": 3.0, "args": {"stream": 7}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cuGraphLaunch", "ts": 1.0, "dur": 5.0},
        {"ph": "X", "cat": "kernel", "name": "void act_from<1, 1, 1>(ActSrc)", "ts": 10.0, "dur": 4.5,
         "args": {"stream": 7}}]}
    spans = spans_of_trace(trace, instance_names())
    assert spans == [Span("act_rmsnorm_t1", 10.0, 14.5, 7), Span("rms_norm", 20.0, 23.0, 7)]


def test_increments_split_the_wall_time_under_overlap_and_a_second_stream() -> None:
    spans = [Span("a", 0.0, 10.0, 1),
             Span("b", 8.0, 15.0, 1),   # started under PDL before a ended: adds 5 us
             Span("g", 9.0, 12.0, 2),   # beside b, wholly inside its span: adds nothing
             Span("h", 9.0, 11.0, 2),   # ... and inside g's too: nothing
             Span("a", 14.0, 24.0, 1),  # adds 9 us
             Span("d", 23.0, 25.0, 2),  # beside, but ending after a: the 1 us past a's end
             Span("c", 25.0, 26.0, 2)]  # 1 us of work after d, on another stream: adds 1 us
    summary = summarize(spans)
    assert summary.wall_us == 26.0 and summary.kernels == 7 and summary.streams == 2
    assert summary.by_name["a"] == (2, 19.0, 20.0)
    assert summary.by_name["h"] == (1, 0.0, 2.0) and summary.by_name["g"] == (1, 0.0, 3.0)
    assert summary.beside == {"g": 1, "h": 1}
    assert summary.by_name["b"] == (1, 5.0, 7.0)
    assert summary.by_name["d"] == (1, 1.0, 2.0) and summary.by_name["c"] == (1, 1.0, 1.0)
    assert sum(inc for _, inc, _ in summary.by_name.values()) == pytest.approx(summary.wall_us)
    assert summary.largest[0] == (10.0, "a", "(start)") and summary.largest[1] == (9.0, "a", "b")
    text = table(summary, "T=1").splitlines()
    assert text[0] == "T=1: 0.026 ms wall, 7 kernels on 2 stream(s)"
    assert text[2] == "  beside another kernel (adding nothing): g 1, h 1"


def test_a_kernel_beside_a_longer_one_takes_none_of_its_time() -> None:
    """The H100 run of 2026-12-06 (bench/NOTES.md Z3): a 6-block matmul beside qkv's matmul, starting and ending
    inside its span, had been read as 6 us a layer; without it the pass took the same time. Removing a kernel
    counted beside another must not change the other kernels' increments."""
    chain = [Span("norm", 0.0, 3.0, 1), Span("qkv", 3.0, 20.0, 1), Span("rule", 19.0, 27.0, 1)]
    with_side = summarize(chain + [Span("gates", 4.0, 12.0, 2)])
    alone = summarize(chain)
    assert with_side.by_name["gates"] == (1, 0.0, 8.0)
    assert {k: v for k, v in with_side.by_name.items() if k != "gates"} == alone.by_name
    assert with_side.beside == {"gates": 1} and alone.beside == {}


def test_identical_spans_count_one_of_them_beside_the_other() -> None:
    summary = summarize([Span("x", 0.0, 5.0, 1), Span("y", 0.0, 5.0, 2)])
    assert summary.by_name["x"] == (1, 5.0, 5.0) and summary.by_name["y"] == (1, 0.0, 5.0)
    assert summary.beside == {"y": 1}


def test_the_table_splits_the_pass_by_kernel_class() -> None:
    spans = [Span("mmvq_q4_K_i8b_s2n2", 0.0, 10.0, 1), Span("act_rmsnorm_t1", 8.0, 13.0, 1),
             Span("gdn_k128", 12.0, 20.0, 1), Span("rms_norm", 20.0, 21.0, 1)]
    line = table(summarize(spans), "T=1").splitlines()[1]
    assert line == ("  by class (increments / kernels): matmuls 0.010 ms / 1, deltanet 0.007 ms / 1, "
                    "producers 0.003 ms / 1, other 0.001 ms / 1")


def test_an_empty_replay_is_an_error_that_says_so() -> None:
    with pytest.raises(ValueError, match="no kernels"):
        summarize([])


def test_the_token_counts_come_from_the_environment_when_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKENS_ENV, raising=False)
    assert token_counts() == TOKEN_COUNTS
    monkeypatch.setenv(TOKENS_ENV, "4,5")
    assert token_counts() == (4, 5)
