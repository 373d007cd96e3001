"""The table `make bench` prints last: our engine against llama.cpp (bench/gpu_peer.py) on the same 27B file."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass

# issue 5's comparison: prefill of these many tokens, decode of DECODE_TOKENS (llama-bench's tg), on both engines
PREFILL_TOKENS = (512, 2048, 8192)
DECODE_TOKENS = 128
DECODE_ROWS = {("forward", "27b.T1"): "per-op T=1", ("forward", "27b.fast.T1"): "per-op T=1 fast",
               ("forward", "27b.v7pdl.T1"): "per-op T=1 PDL", ("mk_cycle", "27b.d0"): "megakernel d=0"}


def _rows(timings: list) -> list[dict]:
    """Timings as dicts (Timing objects or the dicts of a results file)."""
    return [asdict(t) | {"gbps": t.gbps} if is_dataclass(t) else t for t in timings]


def ours_from_timings(timings: list) -> dict:
    """Our numbers in a bench report: decode and prefill tok/s, megakernel cycle ms and projection by d, copy GB/s."""
    ours: dict = {"decode": {}, "prefill": {}, "cycle_ms": {}, "projected_tok_s": {}, "copy_gbps": None}
    for t in _rows(timings):
        key, ms = (t["op"], t["variant"]), t["median_ms"]
        if key in DECODE_ROWS and ms > 0:
            ours["decode"][DECODE_ROWS[key]] = 1e3 / ms  # one token per pass / cycle without speculation
        if t["op"] == "mk_cycle" and t["variant"].startswith("27b.d"):
            d = int(t["variant"][len("27b.d"):])
            ours["cycle_ms"][d] = ms
            ours["projected_tok_s"][d] = t["extra"].get("projected_tok_s")
        elif t["op"] == "prefill" and t["variant"].startswith("27b."):
            ours["prefill"][t["variant"][len("27b."):]] = t["extra"]["tok_per_s"]
        elif t["op"] == "copy":
            ours["copy_gbps"] = max(ours["copy_gbps"] or 0.0, t["gbps"])
    return ours


def _bench(peer: dict, kind: str, n: int) -> float | None:
    entry = (peer.get("llama_bench") or {}).get(kind, {}).get(str(n))
    return entry["mean_tok_s"] if entry else None


def _server(peer: dict, name: str) -> dict:
    return (peer.get("server") or {}).get(name) or {}


def comparison_rows(ours: dict, peer: dict) -> list[tuple[str, float | None, float | None]]:
    """(what, ours, llama.cpp) rows: decode without speculation, prefill by length."""
    tg = _bench(peer, "decode", DECODE_TOKENS)
    plain = _server(peer, "plain").get("decode_tok_s")
    rows = [(f"decode {name} vs llama-bench tg{DECODE_TOKENS}", value, tg) for name, value in ours["decode"].items()]
    rows += [(f"decode {name} vs llama-server", value, plain) for name, value in ours["decode"].items()]
    if not ours["decode"]:
        rows += [(f"decode vs llama-bench tg{DECODE_TOKENS}", None, tg), ("decode vs llama-server", None, plain)]
    rows += [(f"prefill {n}", ours["prefill"].get(str(n)), _bench(peer, "prefill", n)) for n in PREFILL_TOKENS]
    return rows


def _num(value: float | None) -> str:
    return f"{value:10.1f}" if value is not None else f"{'-':>10}"


def print_peer(peer: dict) -> None:
    """llama.cpp's own numbers, and its errors, in a few lines."""
    lines = str(peer.get("version") or "?").splitlines() or ["?"]
    print(f"llama.cpp peer: {next((v for v in lines if v.startswith('version')), lines[0])} in {peer.get('bin_dir')}")
    for kind in ("prefill", "decode"):
        for n, s in ((peer.get("llama_bench") or {}).get(kind) or {}).items():
            print(f"  llama-bench {kind} {n:>5}: {s['mean_tok_s']:9.1f} +- {s['stddev_tok_s']:.1f} tok/s")
    for name, run in (peer.get("server") or {}).items():
        if "decode_tok_s" in run:
            drafts = f", drafts {run['draft_n_accepted']}/{run['draft_n']} accepted" if run["draft_n"] else ""
            print(f"  llama-server {name:<7} decode {run['decode_tok_s']:9.1f} +- {run['stddev_tok_s']:.1f} tok/s"
                  f"{drafts}")
        else:
            reason = run.get("error") or run.get("skipped")
            tail = run.get("log_tail", "").splitlines()[-3:]
            print(f"  llama-server {name:<7} no numbers: {reason}" + "".join(f"\n      | {line}" for line in tail))
    for line in peer.get("errors", []):
        print(f"  peer error: {line}")


def print_comparison(ours: dict, peer: dict) -> None:
    """Ours vs llama.cpp (tok/s and ratio), the megakernel cycle by d, the copy bandwidth: printed last."""
    print("\n==== ours vs llama.cpp (same file, same run; tok/s) ====")
    print(f"  {'':<44} {'ours':>10} {'llama.cpp':>10}  ratio")
    for what, mine, theirs in comparison_rows(ours, peer):
        ratio = f"{mine / theirs:5.2f}x" if mine and theirs else "    -"
        print(f"  {what:<44} {_num(mine)} {_num(theirs)}  {ratio}")
    peer_depths = {int(k[len("mtp_d"):]) for k in (peer.get("server") or {}) if k.startswith("mtp_d")}
    for d in sorted(set(ours["cycle_ms"]) | peer_depths):
        mtp, ms = _server(peer, f"mtp_d{d}" if d else "plain"), ours["cycle_ms"].get(d)
        mine = (f"megakernel cycle {ms:8.3f} ms, {ours['projected_tok_s'].get(d) or 0:6.1f} tok/s at the published "
                "acceptance (a projection)" if ms else "megakernel not run")
        how = f"MTP d={d}" if d else "no speculation"
        theirs = f"llama-server {how}: no numbers"
        if "decode_tok_s" in mtp:
            theirs = (f"llama-server {how} {mtp['decode_tok_s']:.1f} tok/s measured (drafts "
                      f"{mtp.get('draft_n_accepted', 0)}/{mtp.get('draft_n', 0)} accepted)")
        print(f"  d={d}: {mine}; {theirs}")
    print(f"  copy bandwidth of this run: {ours['copy_gbps'] or 0:.0f} GB/s")
    for line in peer.get("errors", []):
        print(f"  peer error: {line}")
