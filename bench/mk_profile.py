"""Where a megakernel launch spends its time, from the per-instruction timing slots (fetched, ready, done, and
the matmul's phases).

A program is a chain of groups (stage, opcode), each waiting for the whole previous one, so the launch's time is
the sum over groups of `step` = (the group's last done) - (the previous group's last done). Each step splits into
`gap` (from the previous group's last done to this group's first instruction becoming ready: the counter's
propagation and the controller's spin) and the rest (the group's own work, its slowest SM deciding). `exec` is one
instruction's done - ready; `tail` is the group's last done minus its median done (stragglers).

An instruction with a matmul also records its last batch (opcodes.cuh TIME_BATCH ..): `phases` splits its exec
into `before` (ready to the last batch: the earlier batches and their stores), `loops` (the last batch's unit
loops: its weights streamed and multiplied), `fold` (the warps' sums added), `after` (the stores and the op's
epilogue) and `count` (the fence and the counter), medians over the opcode's instructions; `first` (TIME_FIRST)
runs from ready to the end of the first batch's loops.
"""

from __future__ import annotations

import numpy as np

FETCHED, READY, DONE, BATCH, LOOPS, FOLDED, BODY, FIRST = range(8)
PHASES = {"before": (READY, BATCH), "loops": (BATCH, LOOPS), "fold": (LOOPS, FOLDED), "after": (FOLDED, BODY),
          "count": (BODY, DONE)}
# Beside the phases (it overlaps them): ready to the first batch's loops done, where the launch recorded it. An
# instruction of one batch has first = before + loops; of two, the second batch's loops against first's tell
# what an instruction's first batch costs beyond its bytes (bench/MEGAKERNEL.md round 6).
FIRST_PHASE = ("first", (READY, FIRST))


def groups_in_order(program) -> list[tuple[int, str, list[int]]]:
    """(stage, opcode name, instruction indices) per group, in program order (schedule.group_runs)."""
    from engine.cuda.megakernel.schedule import group_runs

    insts = program.instructions
    return [(insts[r.start].stage, insts[r.start].OPCODE.name, list(r)) for r in group_runs(insts)]


def instruction_times(program, times: np.ndarray) -> np.ndarray:
    """[len(instructions), slots] ns from the [num_sms, max_len, slots] timing slots; 0 where not run."""
    out = np.zeros((len(program.instructions), times.shape[-1]), np.int64)
    for sm, queue in enumerate(program.queues):
        for slot, index in enumerate(queue):
            out[index] = times[sm, slot].astype(np.int64)
    return out


def critical_path(program, times: np.ndarray) -> dict:
    """Per group and per opcode: step, gap, exec and tail in microseconds; `total_us` is the launch's span."""
    t = instruction_times(program, times)
    groups, prev_done = [], None
    ran = t[:, DONE] > 0
    start = int(t[ran, FETCHED].min()) if ran.any() else 0
    for stage, op, members in groups_in_order(program):
        m = t[members]
        m = m[(m[:, READY] > 0) & (m[:, DONE] > 0)]
        if not len(m):  # an inactive stage: its instructions did not record
            continue
        done, first_ready = int(m[:, DONE].max()), int(m[:, READY].min())
        base = start if prev_done is None else prev_done
        execs = (m[:, DONE] - m[:, READY]) / 1e3
        groups.append({"stage": stage, "op": op, "n": len(m), "step_us": (done - base) / 1e3,
                       "gap_us": max(first_ready - base, 0) / 1e3, "exec_med_us": float(np.median(execs)),
                       "exec_max_us": float(execs.max()), "tail_us": (done - np.median(m[:, DONE])) / 1e3})
        prev_done = done
    by_op: dict[str, dict] = {}
    for g in groups:
        agg = by_op.setdefault(g["op"], {"groups": 0, "step_us": 0.0, "gap_us": 0.0, "exec_med_us": 0.0,
                                         "exec_max_us": 0.0, "tail_us": 0.0})
        agg["groups"] += 1
        for key in ("step_us", "gap_us", "exec_med_us", "exec_max_us", "tail_us"):
            agg[key] += g[key]
    for agg in by_op.values():  # sums over groups, except the per-instruction figures, averaged per group
        for key in ("exec_med_us", "exec_max_us", "tail_us"):
            agg[key] /= agg["groups"]
    for op, phases in matmul_phases(program, t).items():
        if op in by_op:
            by_op[op]["phases"] = phases
    total = (prev_done - start) / 1e3 if prev_done is not None else 0.0
    return {"total_us": total, "groups": groups,
            "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1]["step_us"]))}


def matmul_phases(program, t: np.ndarray) -> dict[str, dict[str, float]]:
    """Per opcode, the median microseconds of each of PHASES over its instructions that recorded a batch inside
    their own ready .. done (slots of an earlier launch, or of none, are left out)."""
    if t.shape[1] <= BODY:
        return {}
    names = np.array([inst.OPCODE.name for inst in program.instructions])
    inside = (t[:, READY] > 0) & (t[:, READY] <= t[:, BATCH]) & (t[:, BATCH] <= t[:, LOOPS]) \
        & (t[:, LOOPS] <= t[:, FOLDED]) & (t[:, FOLDED] <= t[:, BODY]) & (t[:, BODY] <= t[:, DONE])
    out = {}
    for op in sorted(set(names[inside])):
        m = t[inside & (names == op)]
        out[str(op)] = {k: float(np.median(m[:, b] - m[:, a])) / 1e3 for k, (a, b) in PHASES.items()}
        if t.shape[1] > FIRST:
            name, (a, b) = FIRST_PHASE
            first = m[(m[:, a] <= m[:, b]) & (m[:, b] <= m[:, LOOPS])]
            if len(first):
                out[str(op)][name] = float(np.median(first[:, b] - first[:, a])) / 1e3
    return out


# The groups of few instructions whose code an SM runs beside its matmuls in a layer: on the SMs that run one, a
# layer's code (~125-150 KB against ~100 KB on the others: bench/MEGAKERNEL.md round 14) passes the ~128 KB the SM
# keeps of it, so its matmuls' code would come from L2 every layer.
SMALL_OPS = frozenset({"ATTN_NORM", "FFN_NORM", "DN_RULE", "ATTN_CORE", "ATTN_COMBINE"})
MATMUL_OPS = ("MIX_IN", "MIX_OUT", "FFN_UP", "FFN_DOWN")


# An instruction's spans the splits below compare: (from slot, to slot).
SPLIT_PHASES = {"before": (READY, BATCH), "first": (READY, FIRST), "after": (FOLDED, BODY)}


def _rows(inst) -> int:
    """The rows a matmul instruction computes."""
    return inst.row_end - inst.row_begin


def _compare(rows: dict[tuple[bool, int], list[np.ndarray]], width: int, sides: tuple[tuple[str, bool], ...],
             phases: tuple[str, ...]) -> dict | None:
    """Timing rows by (side, row count): at the row count every side has most of, each side's count `n`, median
    exec and median `phases` (us; from the rows whose slots are in order), or None where the sides share none."""
    keys = [key for _, key in sides]
    shared = {n for (key, n) in rows if all((k, n) in rows for k in keys)}
    if not shared:
        return None
    n = max(sorted(shared), key=lambda r: min(len(rows[(k, r)]) for k in keys))
    out: dict = {"rows": n}
    for name, key in sides:
        m = np.array(rows[(key, n)])
        fig = {"n": len(m), "exec": float(np.median(m[:, DONE] - m[:, READY])) / 1e3}
        for phase in phases:
            a, b = SPLIT_PHASES[phase]
            if width > max(a, b):
                ok = (m[:, a] > 0) & (m[:, a] <= m[:, b]) & (m[:, b] <= m[:, DONE])
                if ok.any():
                    fig[phase] = float(np.median(m[ok, b] - m[ok, a])) / 1e3
        out[name] = fig
    return out


def code_split(program, times: np.ndarray) -> dict[str, dict]:
    """Per matmul opcode, its instructions' median exec, first batch and epilogue (us) on the SMs that also ran a
    small group's instruction (SMALL_OPS) in the same stage (`with`) and on the others (`without`), at the row
    count both have most of (an SM's tiles set most of its time); `n` counts each side. Where the code a layer
    runs is what an SM keeps, the two sides match; where it is not, `with` is slower by what its code costs."""
    t = instruction_times(program, times)
    insts = program.instructions
    small = {(sm, insts[i].stage) for sm, queue in enumerate(program.queues) for i in queue
             if insts[i].OPCODE.name in SMALL_OPS}
    out: dict[str, dict] = {}
    for op in MATMUL_OPS:
        rows: dict[tuple[bool, int], list[np.ndarray]] = {}
        for sm, queue in enumerate(program.queues):
            for i in queue:
                inst = insts[i]
                if inst.OPCODE.name == op and 0 < t[i, READY] <= t[i, DONE]:
                    rows.setdefault(((sm, inst.stage) in small, _rows(inst)), []).append(t[i])
        got = _compare(rows, t.shape[1], (("with", True), ("without", False)), ("first", "after"))
        if got:
            out[op] = got
    return out


def repeat_split(program, times: np.ndarray) -> dict[str, dict]:
    """Per matmul opcode, where an SM runs two or more of a group's instructions in a row (a schedule with
    tiles_per_sm > 1): the medians (us) of its first of them (`first_on_sm`: its code and the layer's tables last
    used a layer ago) and of the later ones (`again`: the same code and tables just used), at the row count both have
    most of. What `first_on_sm` costs beyond `again` in `before` and `first` is what a cold start costs; `n` counts
    each side."""
    t = instruction_times(program, times)
    insts = program.instructions
    out: dict[str, dict] = {}
    for op in MATMUL_OPS:
        rows: dict[tuple[bool, int], list[np.ndarray]] = {}
        for queue in program.queues:
            seen: set[int] = set()
            for i in queue:
                inst = insts[i]
                if inst.OPCODE.name != op:
                    continue
                again = inst.stage in seen
                seen.add(inst.stage)
                if 0 < t[i, READY] <= t[i, DONE]:
                    rows.setdefault((again, _rows(inst)), []).append(t[i])
        got = _compare(rows, t.shape[1], (("first_on_sm", False), ("again", True)), ("before", "first"))
        if got:
            out[op] = got
    return out


def split_table(split: dict[str, dict], sides: tuple[str, str] = ("with", "without"),
                title: str = "matmuls on SMs that also ran a small group in the layer (with) against the others") -> str:
    """code_split's (or repeat_split's, with its sides and title) figures, an opcode a line."""
    lines = [f"  {title}, at equal rows:"]
    for op, a in split.items():
        cells = [f"{side} n={a[side]['n']}: " + " ".join(f"{k} {v:.1f}" for k, v in a[side].items() if k != "n")
                 for side in sides]
        lines.append(f"    {op:<9} {a['rows']:5d} rows | " + " | ".join(cells) + " us")
    return "\n".join(lines)


def table(profile: dict, top: int = 12) -> str:
    """The opcodes' share of the launch, largest first: one line each."""
    lines = [f"  launch {profile['total_us']:.0f} us over {len(profile['groups'])} groups; per opcode: "
             "step sum (gap sum) | per group: median exec, max exec, tail"]
    for op, a in list(profile["by_op"].items())[:top]:
        lines.append(f"    {op:<13} {a['step_us']:9.1f} us ({a['gap_us']:7.1f}) in {a['groups']:3d} groups | "
                     f"{a['exec_med_us']:7.1f} {a['exec_max_us']:7.1f} {a['tail_us']:7.1f} us")
        if "phases" in a:
            lines.append("      median instruction: " + ", ".join(f"{k} {v:.1f}" for k, v in a["phases"].items())
                         + " us")
    return "\n".join(lines)


# The warp trace (a build with MK_TRACE=1: engine/cuda/megakernel/opcodes.cuh TRACE_*, runner.read_trace).
TRACE_START, TRACE_FIRST, TRACE_LAST, TRACE_FOLDED, TRACE_BODY = 0, 1, 7, 13, 14
ENTER, PRIMED, UNIT0_READY, UNIT0_DONE, LOOP_DONE, UNITS = range(6)
# A batch's segments: (name, from, to) as event offsets in its set; `per_unit` is apart (the units after the first).
BATCH_SEGMENTS = (("primed", ENTER, PRIMED), ("wait0", PRIMED, UNIT0_READY), ("unit0", UNIT0_READY, UNIT0_DONE),
                  ("loop", ENTER, LOOP_DONE))


def instruction_trace(program, trace: np.ndarray) -> np.ndarray:
    """[len(instructions), warps, events] from the [num_sms, max_len, warps, events] trace."""
    out = np.zeros((len(program.instructions),) + trace.shape[2:], np.int64)
    for sm, queue in enumerate(program.queues):
        for slot, index in enumerate(queue):
            out[index] = trace[sm, slot].astype(np.int64)
    return out


def warp_trace(program, times: np.ndarray, trace: np.ndarray) -> dict[str, dict]:
    """Per opcode, medians over its instructions' consumer warps (microseconds): `start` (ready to the warp past
    the first barrier), for the first and the last matmul batch (`first`, `last`: the last only where an
    instruction ran two or more) `enter` (ready to the batch), the BATCH_SEGMENTS, `per_unit` (each unit after the
    first), `units` (a warp's) and `spread` (an instruction's latest warp to finish the batch's units less its
    earliest), then `fold` (the last batch's units done to the warp's share of the fold) and `body` (ready to the
    warp done). Events outside their instruction's ready .. done (an earlier launch's, or none) are left out."""
    t, tr = instruction_times(program, times), instruction_trace(program, trace)
    ready, done = t[:, READY, None, None], t[:, DONE, None, None]
    stamped = (tr > 0) & (ready > 0) & (tr >= ready) & (tr <= done)
    names = np.array([inst.OPCODE.name for inst in program.instructions])
    us = lambda a: float(np.median(a)) / 1e3 if len(a) else None  # noqa: E731

    out = {}
    for op in sorted(set(names)):
        rows = np.flatnonzero(names == op)
        ev, ok_ev, r0 = tr[rows], stamped[rows], t[rows, READY, None]  # [n, warps, events], [n, 1]
        if not ok_ev[..., TRACE_FIRST + ENTER].any():  # no matmul batch in this opcode (or not traced)
            continue

        def span(a, b):  # b - a over the (instruction, warp) samples where both are stamped, in order
            ok = ok_ev[..., a] & ok_ev[..., b] & (ev[..., b] >= ev[..., a])
            return us((ev[..., b] - ev[..., a])[ok])

        def since_ready(e):
            return us((ev[..., e] - r0)[ok_ev[..., e]])

        r = {"start": since_ready(TRACE_START), "body": since_ready(TRACE_BODY)}
        for name, base in (("first", TRACE_FIRST), ("last", TRACE_LAST)):
            ok = ok_ev[..., base + ENTER]
            if not ok.any():
                continue
            b = {"enter": since_ready(base + ENTER)}
            for seg, a, z in BATCH_SEGMENTS:
                b[seg] = span(base + a, base + z)
            units, done_at = ev[..., base + UNITS], ev[..., base + LOOP_DONE]
            many = ok & ok_ev[..., base + UNIT0_DONE] & ok_ev[..., base + LOOP_DONE] & (units > 1)
            b["per_unit"] = us(((done_at - ev[..., base + UNIT0_DONE]) / np.maximum(units - 1, 1))[many])
            b["units"] = float(np.median(units[ok]))
            fin = np.where(ok_ev[..., base + LOOP_DONE], done_at, -1)
            has = (fin >= 0).any(axis=1)
            earliest = np.where(fin >= 0, fin, np.iinfo(np.int64).max).min(axis=1)
            b["spread"] = us((fin.max(axis=1) - earliest)[has])
            r[name] = b
        # the fold follows the last batch: the instruction's set 1 where it ran one, else its set 0
        two = ok_ev[..., TRACE_LAST + LOOP_DONE]
        loops = np.where(two, ev[..., TRACE_LAST + LOOP_DONE], ev[..., TRACE_FIRST + LOOP_DONE])
        folded = ev[..., TRACE_FOLDED]
        ok = (two | ok_ev[..., TRACE_FIRST + LOOP_DONE]) & ok_ev[..., TRACE_FOLDED] & (folded >= loops)
        r["fold"] = us((folded - loops)[ok])
        out[str(op)] = r
    return out


def trace_table(trace: dict[str, dict]) -> str:
    """warp_trace's figures, an opcode a line (first batch | last batch)."""
    f = lambda v: "   -  " if v is None else f"{v:6.2f}"  # noqa: E731
    lines = ["  warp trace, median us: start | batch: enter primed wait0 unit0 per_unit x units loop spread | fold body"]
    for op, r in trace.items():
        parts = []
        for name in ("first", "last"):
            if name in r:
                b = r[name]
                parts.append(f"{name} {f(b['enter'])}{f(b['primed'])}{f(b['wait0'])}{f(b['unit0'])}"
                             f"{f(b['per_unit'])} x {b['units']:4.0f}{f(b['loop'])}{f(b['spread'])}")
        lines.append(f"    {op:<13}{f(r['start'])} | " + " | ".join(parts) + f" | {f(r['fold'])}{f(r['body'])}")
    return "\n".join(lines)


PHASE_SHORT = (("first", "1st "), ("loops", "lp "), ("fold", "fd "), ("after", "af "))


def compare_table(profiles: dict[str, dict], tags: list[str], top: int = 12) -> str:
    """Kept profiles (a cycle27b result's info.mk_profile) side by side: the launch, then per opcode (the first
    tag's largest steps first) each tag's step sum and, for the matmuls, its median first / loops / fold / after
    (1st, lp, fd, af).
    The first tag is the base: the others' steps also as differences from it."""
    base = profiles[tags[0]]
    lines = ["  " + " | ".join(f"{t}: {profiles[t]['total_us']:.0f} us" for t in tags)]
    for op in list(base["by_op"])[:top]:
        cells = []
        for t in tags:
            a = profiles[t]["by_op"].get(op)
            if a is None:
                cells.append(f"{'-':>8}")
                continue
            d = "" if t == tags[0] else f" ({a['step_us'] - base['by_op'][op]['step_us']:+.0f})"
            ph = a.get("phases", {})
            extra = "".join(f" {short}{ph[k]:.1f}" for k, short in PHASE_SHORT if k in ph)
            cells.append(f"{a['step_us']:8.0f}{d}{extra}")
        lines.append(f"    {op:<13}" + " | ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """python bench/mk_profile.py RESULT.json [TAG ...]: a cycle27b result's kept profiles compared (TAG: d0,
    d4.<variant>, ...; default every d = 0 one), and its warp traces where it kept them."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(main.__doc__)
        return 2
    info = json.loads(open(args[0]).read())["parts"]["cycle27b"]["info"]
    profiles = info["mk_profile"]
    tags = args[1:] or [t for t in profiles if t.split(".")[0] == "d0"]
    missing = [t for t in tags if t not in profiles]
    if missing:
        print(f"no profile {', '.join(missing)} in {args[0]}; it has {', '.join(profiles)}")
        return 2
    print(compare_table(profiles, tags))
    for t in tags:
        if t in info.get("mk_warp_trace", {}):
            print(f"  {t}:\n" + trace_table(info["mk_warp_trace"][t]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
