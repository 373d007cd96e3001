"""bench/mk_profile.py: the critical path of a megakernel launch from its timing slots."""

from types import SimpleNamespace

import numpy as np
import pytest

from bench.mk_profile import critical_path, groups_in_order, trace_table, warp_trace


def _inst(stage, name):
    return SimpleNamespace(stage=stage, OPCODE=SimpleNamespace(name=name))


def _program():
    # two SMs; groups (0, A) x2, (0, B) x2, (1, A) x1 - the last group on SM 1 only
    instructions = [_inst(0, "A"), _inst(0, "A"), _inst(0, "B"), _inst(0, "B"), _inst(1, "A")]
    return SimpleNamespace(instructions=instructions, queues=[[0, 2], [1, 3, 4]])


def test_groups_keep_program_order():
    assert [(s, op, m) for s, op, m in groups_in_order(_program())] == [(0, "A", [0, 1]), (0, "B", [2, 3]),
                                                                         (1, "A", [4])]


def test_steps_sum_to_the_launch_and_split_into_gap_and_work():
    times = np.zeros((2, 3, 3), np.uint64)
    us = 1000
    times[0, 0] = (0, 1 * us, 10 * us)     # A on SM 0
    times[1, 0] = (0, 1 * us, 14 * us)     # A on SM 1: the group ends at 14
    times[0, 1] = (2 * us, 16 * us, 30 * us)  # B: ready 2 us after A's end
    times[1, 1] = (3 * us, 15 * us, 20 * us)
    times[1, 2] = (4 * us, 33 * us, 40 * us)  # (1, A): ready 3 us after B's end at 30
    p = critical_path(_program(), times)
    steps = [g["step_us"] for g in p["groups"]]
    assert steps == pytest.approx([14.0, 16.0, 10.0])
    assert p["total_us"] == pytest.approx(sum(steps)) == pytest.approx(40.0)
    assert [g["gap_us"] for g in p["groups"]] == pytest.approx([1.0, 1.0, 3.0])
    b = p["groups"][1]
    assert b["exec_max_us"] == pytest.approx(14.0) and b["exec_med_us"] == pytest.approx((14.0 + 5.0) / 2)
    assert b["tail_us"] == pytest.approx(30.0 - 25.0)
    # by opcode: A's two groups summed, largest share first
    assert list(p["by_op"]) == ["A", "B"]
    assert p["by_op"]["A"]["step_us"] == pytest.approx(24.0) and p["by_op"]["A"]["groups"] == 2


def test_groups_that_did_not_run_are_skipped():
    times = np.zeros((2, 3, 3), np.uint64)
    times[0, 0] = (0, 1000, 5000)
    times[1, 0] = (0, 1000, 6000)
    times[0, 1] = (0, 7000, 9000)
    times[1, 1] = (0, 7000, 8000)
    p = critical_path(_program(), times)  # (1, A) inactive: no slots recorded
    assert [(g["stage"], g["op"]) for g in p["groups"]] == [(0, "A"), (0, "B")]
    assert p["total_us"] == pytest.approx(9.0)


def test_matmul_phases_split_an_instruction_and_skip_stale_slots():
    us = 1000
    times = np.zeros((2, 3, 7), np.uint64)
    # fetched, ready, done, then the last batch's begin, loops done, folded, and the body done
    times[0, 0] = (0, 1 * us, 20 * us, 3 * us, 13 * us, 14 * us, 18 * us)   # A on SM 0
    times[1, 0] = (0, 1 * us, 24 * us, 5 * us, 17 * us, 18 * us, 22 * us)   # A on SM 1
    times[0, 1] = (21 * us, 25 * us, 30 * us, 2 * us, 3 * us, 4 * us, 5 * us)  # B: slots of an earlier launch
    times[1, 1] = (25 * us, 26 * us, 31 * us, 0, 0, 0, 0)
    p = critical_path(_program(), times)
    a = p["by_op"]["A"]["phases"]
    assert a == pytest.approx({"before": 3.0, "loops": 11.0, "fold": 1.0, "after": 4.0, "count": 2.0})
    assert "phases" not in p["by_op"]["B"]


def test_the_first_batch_is_timed_beside_the_phases_where_recorded():
    us = 1000
    times = np.zeros((2, 3, 8), np.uint64)
    # A on SM 0 ran two batches (first loops done at 9 us, the last batch from 10); on SM 1 one (first = last)
    times[0, 0] = (0, 1 * us, 20 * us, 10 * us, 15 * us, 16 * us, 18 * us, 9 * us)
    times[1, 0] = (0, 1 * us, 24 * us, 5 * us, 17 * us, 18 * us, 22 * us, 17 * us)
    times[0, 1] = (21 * us, 25 * us, 30 * us, 26 * us, 27 * us, 28 * us, 29 * us, 3 * us)  # B: a stale first
    times[1, 1] = (25 * us, 26 * us, 31 * us, 27 * us, 28 * us, 29 * us, 30 * us, 0)
    p = critical_path(_program(), times)
    assert p["by_op"]["A"]["phases"]["first"] == pytest.approx((8.0 + 16.0) / 2)
    assert "first" not in p["by_op"]["B"]["phases"]  # ready after the recorded first: an earlier launch's
    assert p["by_op"]["B"]["phases"]["loops"] == pytest.approx(1.0)


def _traced(times_ready_done):
    """Timing slots with the given (ready, done) ns per (sm, slot), and an empty trace of 2 warps."""
    times = np.zeros((2, 3, 8), np.uint64)
    for (sm, slot), (ready, done) in times_ready_done.items():
        times[sm, slot, 1], times[sm, slot, 2] = ready, done
    return times, np.zeros((2, 3, 2, 16), np.uint64)


def test_the_warp_trace_splits_each_batch_and_leaves_out_stale_events():
    us = 1000
    times, trace = _traced({(0, 0): (1 * us, 40 * us), (1, 0): (1 * us, 40 * us), (0, 1): (50 * us, 60 * us),
                            (1, 1): (50 * us, 60 * us)})
    # A on SM 0: two batches; warp 0 starts at 2, enters at 3, primed 4, first unit landed 6, done 7, its 5 units
    # done at 11 (1 us each after the first); warp 1 the same 2 us later. The last batch: 1 unit, 20 .. 25.
    for w, lag in ((0, 0), (1, 2 * us)):
        trace[0, 0, w, 0] = 2 * us + lag
        trace[0, 0, w, 1:7] = (3 * us + lag, 4 * us + lag, 6 * us + lag, 7 * us + lag, 11 * us + lag, 5)
        trace[0, 0, w, 7:13] = (20 * us, 21 * us, 22 * us, 24 * us, 24 * us, 1)
        trace[0, 0, w, 13], trace[0, 0, w, 14] = 26 * us, 30 * us
    # A on SM 1: one batch only; its last-batch events are an earlier launch's (before ready)
    trace[1, 0, :, 0] = 2 * us
    trace[1, 0, :, 1:7] = (3 * us, 4 * us, 6 * us, 7 * us, 11 * us, 5)
    trace[1, 0, :, 7:13] = (500, 600, 700, 800, 900, 9)
    trace[1, 0, :, 13], trace[1, 0, :, 14] = 12 * us, 14 * us
    # B: no batch (a norm): start and body only, so it has no trace entry
    trace[0, 1, :, 0], trace[0, 1, :, 14] = 51 * us, 55 * us
    program = _program()
    t = warp_trace(program, times, trace)
    assert list(t) == ["A"]
    a = t["A"]
    assert a["start"] == pytest.approx(1.0)  # samples 1, 3 (SM 0) and 1, 1 (SM 1)
    first = a["first"]
    assert first["enter"] == pytest.approx(2.0) and first["primed"] == pytest.approx(1.0)
    assert first["wait0"] == pytest.approx(2.0) and first["unit0"] == pytest.approx(1.0)
    assert first["per_unit"] == pytest.approx(1.0) and first["units"] == 5 and first["loop"] == pytest.approx(8.0)
    assert first["spread"] == pytest.approx((2.0 + 0.0) / 2)  # SM 0's warps 2 us apart, SM 1's together
    last = a["last"]  # SM 0 only: SM 1's are stale
    assert last["enter"] == pytest.approx(19.0) and last["unit0"] == pytest.approx(2.0) and last["units"] == 1
    assert last["per_unit"] is None and last["spread"] == pytest.approx(0.0)
    # fold from the last batch's units done where there is one (SM 0: 24 -> 26), else the first's (11 -> 12)
    assert a["fold"] == pytest.approx((2.0 + 1.0) / 2)
    assert "warp trace" in trace_table(t) and "A" in trace_table(t)


def test_kept_profiles_compare_side_by_side_from_a_result_file(tmp_path, capsys):
    from bench.mk_profile import main

    def profile(total, up, down, loops):
        return {"total_us": total, "by_op": {
            "FFN_UP": {"step_us": up, "phases": {"first": 22.0, "loops": loops, "fold": 2.3, "after": 4.4}},
            "DN_RULE": {"step_us": down}}}

    trace = {"FFN_UP": {"start": 0.5, "body": 40.0, "fold": 1.0, "first": {
        "enter": 2.0, "primed": 1.0, "wait0": 1.5, "unit0": 0.4, "per_unit": 0.3, "units": 20, "loop": 8.0,
        "spread": 1.2}}}
    result = {"parts": {"cycle27b": {"info": {
        "mk_profile": {"d0": profile(12656, 3674, 769, 14.6), "d0.ef": profile(11000, 3000, 700, 14.0),
                       "d4": profile(21421, 6817, 1195, 33.7)},
        "mk_warp_trace": {"d0.ef": trace}}}}}
    path = tmp_path / "cycle.json"
    path.write_text(__import__("json").dumps(result))
    assert main([str(path)]) == 0  # every d = 0 profile by default
    out = capsys.readouterr().out
    assert "d0: 12656 us | d0.ef: 11000 us" in out and "d4" not in out
    up = next(line for line in out.splitlines() if "FFN_UP" in line and "lp" in line)
    assert "3674" in up and "3000 (-674)" in up and "lp 14.6" in up and "lp 14.0" in up
    assert "warp trace" in out and "first   2.00" in out
    assert main([str(path), "d0", "d9"]) == 2 and "no profile d9" in capsys.readouterr().out


def test_code_split_compares_matmuls_on_sms_with_and_without_a_small_group_at_equal_rows(capsys):
    from bench.mk_profile import code_split, split_table

    def mm(stage, name, rows):
        return SimpleNamespace(stage=stage, OPCODE=SimpleNamespace(name=name), row_begin=0, row_end=rows)

    # three SMs, one layer: SM 0 runs the norm, then all run FFN_UP (SM 2's tile larger); then a norm of the next
    # layer on SM 1, which must not count for this layer's FFN_UP
    instructions = [_inst(0, "FFN_NORM"), mm(0, "FFN_UP", 32), mm(0, "FFN_UP", 32), mm(0, "FFN_UP", 64),
                    _inst(1, "FFN_NORM")]
    program = SimpleNamespace(instructions=instructions, queues=[[0, 1], [2, 4], [3]])
    us = 1000
    times = np.zeros((3, 2, 8), np.uint64)
    times[0, 0] = (0, 1 * us, 5 * us, 0, 0, 0, 0, 0)
    # FFN_UP: fetched, ready, done, batch, loops, folded, body, first
    times[0, 1] = (5 * us, 6 * us, 30 * us, 10 * us, 20 * us, 22 * us, 27 * us, 18 * us)  # with: exec 24
    times[1, 0] = (0, 6 * us, 22 * us, 8 * us, 16 * us, 17 * us, 19 * us, 13 * us)        # without: exec 16
    times[2, 0] = (0, 6 * us, 40 * us, 8 * us, 30 * us, 31 * us, 33 * us, 20 * us)        # 64 rows: left out
    times[1, 1] = (22 * us, 31 * us, 35 * us, 0, 0, 0, 0, 0)
    split = code_split(program, times)
    assert list(split) == ["FFN_UP"] and split["FFN_UP"]["rows"] == 32
    assert split["FFN_UP"]["with"] == pytest.approx({"n": 1, "exec": 24.0, "first": 12.0, "after": 5.0})
    assert split["FFN_UP"]["without"] == pytest.approx({"n": 1, "exec": 16.0, "first": 7.0, "after": 2.0})
    assert "FFN_UP" in split_table(split) and "with n=1: exec 24.0" in split_table(split)


def test_repeat_split_compares_an_sms_first_instruction_of_a_group_with_its_next_ones():
    from bench.mk_profile import repeat_split, split_table

    def mm(stage, rows):
        return SimpleNamespace(stage=stage, OPCODE=SimpleNamespace(name="MIX_OUT"), row_begin=0, row_end=rows)

    # SM 0 runs two MIX_OUT instructions of layer 0 (the second "again"), SM 1 one of layer 0 and one of layer 1
    # (each the first of its layer there: neither is "again")
    instructions = [mm(0, 16), mm(0, 16), mm(0, 16), mm(1, 16)]
    program = SimpleNamespace(instructions=instructions, queues=[[0, 1], [2, 3]])
    us = 1000
    times = np.zeros((2, 2, 8), np.uint64)
    # fetched, ready, done, batch, loops, folded, body, first
    times[0, 0] = (0, 1 * us, 20 * us, 4 * us, 15 * us, 16 * us, 18 * us, 15 * us)   # first: before 3, first 14
    times[0, 1] = (20 * us, 21 * us, 33 * us, 22 * us, 30 * us, 31 * us, 32 * us, 30 * us)  # again: before 1
    times[1, 0] = (0, 1 * us, 22 * us, 6 * us, 17 * us, 18 * us, 20 * us, 17 * us)   # first: before 5, first 16
    times[1, 1] = (22 * us, 40 * us, 60 * us, 45 * us, 55 * us, 56 * us, 58 * us, 55 * us)  # first (layer 1)
    split = repeat_split(program, times)
    a = split["MIX_OUT"]
    assert a["rows"] == 16 and a["again"] == pytest.approx({"n": 1, "exec": 12.0, "before": 1.0, "first": 9.0})
    assert a["first_on_sm"]["n"] == 3 and a["first_on_sm"]["before"] == pytest.approx(5.0)  # median of 3, 5, 5
    text = split_table(split, ("first_on_sm", "again"), "first against next")
    assert "first against next" in text and "again n=1: exec 12.0 before 1.0" in text
    # a schedule of one instruction an SM and group has nothing to compare
    single = SimpleNamespace(instructions=instructions[:1] + instructions[2:3], queues=[[0], [1]])
    assert repeat_split(single, times[:, :1]) == {}
