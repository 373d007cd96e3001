"""Where a megakernel launch spends its time, from the per-instruction timing slots (fetched, ready, done).

A program is a chain of groups (stage, opcode), each waiting for the whole previous one, so the launch's time is
the sum over groups of `step` = (the group's last done) - (the previous group's last done). Each step splits into
`gap` (from the previous group's last done to this group's first instruction becoming ready: the counter's
propagation and the controller's spin) and the rest (the group's own work, its slowest SM deciding). `exec` is one
instruction's done - ready; `tail` is the group's last done minus its median done (stragglers).
"""

from __future__ import annotations

import numpy as np

FETCHED, READY, DONE = 0, 1, 2


def groups_in_order(program) -> list[tuple[int, str, list[int]]]:
    """(stage, opcode name, instruction indices) per group, in program order (schedule.group_runs)."""
    from engine.cuda.megakernel.schedule import group_runs

    insts = program.instructions
    return [(insts[r.start].stage, insts[r.start].OPCODE.name, list(r)) for r in group_runs(insts)]


def instruction_times(program, times: np.ndarray) -> np.ndarray:
    """[len(instructions), 3] ns (fetched, ready, done) from the [num_sms, max_len, 3] slots; 0 where not run."""
    out = np.zeros((len(program.instructions), 3), np.int64)
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
    total = (prev_done - start) / 1e3 if prev_done is not None else 0.0
    return {"total_us": total, "groups": groups,
            "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1]["step_us"]))}


def table(profile: dict, top: int = 12) -> str:
    """The opcodes' share of the launch, largest first: one line each."""
    lines = [f"  launch {profile['total_us']:.0f} us over {len(profile['groups'])} groups; per opcode: "
             "step sum (gap sum) | per group: median exec, max exec, tail"]
    for op, a in list(profile["by_op"].items())[:top]:
        lines.append(f"    {op:<13} {a['step_us']:9.1f} us ({a['gap_us']:7.1f}) in {a['groups']:3d} groups | "
                     f"{a['exec_med_us']:7.1f} {a['exec_max_us']:7.1f} {a['tail_us']:7.1f} us")
    return "\n".join(lines)
