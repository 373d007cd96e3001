"""llama.cpp as the peer of `make bench` (issue 5): llama-bench and llama-server on the same file as our engine.

  python bench/gpu_peer.py [--model F] [--peer DIR] [--reps 3] [--mtp-depths 2,4] [--gpu-args "-ngl 99"]

DIR (default .peers/) holds the prebuilt build's *.tar.xz.part* and its README.md: joined, checked against the
README's sha256 (refused if they differ), unpacked under /tmp once; or DIR holds llama-server itself (a bin/).
  llama-bench -fa 1 -p 512,2048,8192 -n 128 -r N -o json: prefill and decode tok/s as llama-bench reports them
    (avg_ts, stddev_ts: mean and sample stddev over the N repetitions of tokens / seconds);
  llama-server --flash-attn on --parallel 1, without speculation, then --spec-type draft-mtp --spec-draft-n-max d:
    timings.predicted_per_second of a fixed 32-token prompt, n_predict 256, temperature 0, EOS ignored (mean and
    sample stddev over N requests after a warm-up); a server that will not load is recorded with its log's tail.
Failures become "error" entries, never exceptions. Every server stops with its step, or with us (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script
    sys.path.insert(0, str(REPO))

from bench.gpu_compare import DECODE_TOKENS, PREFILL_TOKENS, print_peer  # noqa: E402

PEER_DIR = REPO / ".peers"
UNPACK_ROOT = Path("/tmp/openjet-peer")
MODEL_27B = "/tmp/openjet-qwen38-27b.gguf"  # bench/gpu_bench27b.py's file (OPENJET_27B overrides both)
GPU_ARGS = ("-ngl", "99")
N_PREDICT = 256
MTP_DEPTHS = (2, 4)
CTX_SIZE = 4096  # the prompt and 256 tokens; the model's own 262K would size the KV cache for nothing
BENCH_TIMEOUT_S, READY_TIMEOUT_S, REQUEST_TIMEOUT_S, STOP_TIMEOUT_S = 480, 300, 300, 15  # within a 600 s call
PR_SET_PDEATHSIG = 1
STAT_BENCH = "llama-bench avg_ts / stddev_ts: mean and sample stddev over -r repetitions of tokens / seconds"
STAT_SERVER = "mean and sample stddev over requests of timings.predicted_per_second (one warm-up request first)"


class PeerError(RuntimeError):
    """The peer could not be found, unpacked, run or read; the message says why."""


class PeerArchiveError(PeerError):
    """The peer's archive parts are missing, or their joined sha256 is not the README's."""


class PeerServerError(PeerError):
    """llama-server exited, refused the model or did not answer; log_tail holds its last lines."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


def readme_sha256(readme: Path) -> str:
    """The joined archive's sha256 that the peer's README.md gives."""
    if not readme.is_file():
        raise PeerArchiveError(f"{readme} is missing: copy it with the parts (it holds the archive's sha256)")
    found = re.search(r"sha256 of the joined archive:\s*([0-9a-f]{64})", readme.read_text())
    if not found:
        raise PeerArchiveError(f"{readme} gives no 'sha256 of the joined archive: <64 hex digits>'")
    return found.group(1)


def join_parts(parts: list[Path], want: str, dest: Path) -> Path:
    """dest: the parts joined in name order, if their sha256 is want; else PeerArchiveError and no file."""
    digest = hashlib.sha256()
    with dest.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != want:
        dest.unlink()
        names = ", ".join(p.name for p in parts)
        raise PeerArchiveError(f"sha256 of the joined parts ({names}) is {digest.hexdigest()}, the README says {want}:"
                               " refusing to unpack (a part missing, truncated or from another build?)")
    return dest


def unpack(parts: list[Path], want: str, root: Path) -> Path:
    """The bin folder of the checked archive, unpacked once under root/<sha256 prefix>."""
    dest = root / want[:16]
    if not (dest / ".sha256").is_file() or (dest / ".sha256").read_text() != want:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="unpack-", dir=root))
        try:
            archive = join_parts(parts, want, staging / "peer.tar.xz")
            with tarfile.open(archive) as tar:
                tar.extractall(staging / "tree", filter="data")
            (staging / "tree" / ".sha256").write_text(want)
            shutil.rmtree(dest, ignore_errors=True)
            (staging / "tree").rename(dest)  # complete trees only: a killed unpack leaves no .sha256 here
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    servers = sorted(dest.rglob("llama-server"))
    if not servers:
        raise PeerArchiveError(f"the archive unpacked in {dest} holds no llama-server")
    return servers[0].parent


def find_peer(folder: Path, root: Path = UNPACK_ROOT) -> Path:
    """The folder holding llama-server: folder itself, its bin/, or its checked archive parts unpacked under root."""
    for candidate in (folder, folder / "bin"):
        if (candidate / "llama-server").is_file():
            return candidate
    parts = sorted(folder.glob("*.tar.xz.part*"))
    if not parts:
        raise PeerArchiveError(f"no llama-server and no *.tar.xz.part* in {folder}: copy "
                               "/work/shared/peers/llama-server-cuda-sm90/* there (bench/MEGAKERNEL.md)")
    return unpack(parts, readme_sha256(folder / "README.md"), root)


def child_env(bin_dir: Path) -> dict[str, str]:
    """This process's environment with the build's libraries first on LD_LIBRARY_PATH (for children only)."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(bin_dir), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def server_version(bin_dir: Path) -> str:
    """What `llama-server --version` prints."""
    done = subprocess.run([str(bin_dir / "llama-server"), "--version"], capture_output=True, text=True,
                          env=child_env(bin_dir), timeout=60)
    if done.returncode != 0:  # a library missing: this build is for another machine
        raise PeerError(f"llama-server --version exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return (done.stdout + done.stderr).strip()


def bench_command(bin_dir: Path, model: Path, reps: int, gpu_args: tuple[str, ...] = GPU_ARGS) -> list[str]:
    """The llama-bench command line: prefill at PREFILL_TOKENS, decode of DECODE_TOKENS, flash attention, JSON."""
    return [str(bin_dir / "llama-bench"), "-m", str(model), *gpu_args, "-fa", "1",
            "-p", ",".join(map(str, PREFILL_TOKENS)), "-n", str(DECODE_TOKENS), "-r", str(reps), "-o", "json"]


def _stat(row: dict) -> dict:
    return {"mean_tok_s": row["avg_ts"], "stddev_tok_s": row["stddev_ts"], "samples_tok_s": row["samples_ts"],
            "mean_ms": row["avg_ns"] / 1e6}


def parse_llama_bench(text: str) -> dict:
    """Prefill and decode tok/s by token count, and the build fields, from llama-bench's -o json output."""
    try:
        rows = json.loads(text[text.index("["):])
        out: dict = {"statistic": STAT_BENCH, "prefill": {}, "decode": {}, "build": {}}
        for row in rows:
            if row["n_depth"] == 0 and row["n_gen"] == 0 and row["n_prompt"] > 0:
                out["prefill"][str(row["n_prompt"])] = _stat(row)
            elif row["n_depth"] == 0 and row["n_prompt"] == 0 and row["n_gen"] > 0:
                out["decode"][str(row["n_gen"])] = _stat(row)
            out["build"] = {k: row.get(k) for k in ("build_commit", "build_number", "backends", "gpu_info",
                                                    "model_type", "model_size", "n_gpu_layers", "flash_attn",
                                                    "n_batch", "n_ubatch", "type_k", "type_v")}
    except (ValueError, KeyError, TypeError) as e:
        raise PeerError(f"llama-bench's JSON could not be read ({type(e).__name__}: {e}): {text[:300]!r}") from e
    return out


def run_llama_bench(bin_dir: Path, model: Path, reps: int, gpu_args: tuple[str, ...] = GPU_ARGS) -> dict:
    """llama-bench on model: its command, parsed numbers, and which of the asked tests it did not report."""
    cmd = bench_command(bin_dir, model, reps, gpu_args)
    if not Path(cmd[0]).is_file():
        raise PeerError(f"{cmd[0]} is missing (this build has no llama-bench)")
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(bin_dir), timeout=BENCH_TIMEOUT_S)
    if done.returncode != 0:
        raise PeerError(f"llama-bench exited {done.returncode}: " + "\n".join(done.stderr.splitlines()[-15:]))
    result = {"command": cmd} | parse_llama_bench(done.stdout)
    missing = [f"pp{n}" for n in PREFILL_TOKENS if str(n) not in result["prefill"]]
    missing += [f"tg{DECODE_TOKENS}"] if str(DECODE_TOKENS) not in result["decode"] else []
    if missing:
        result["error"] = f"llama-bench reported no {', '.join(missing)}"
    return result


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def _die_with_parent(parent: int) -> None:
    """In the child before exec: SIGKILL when the process that started it dies, however it ends."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


class Server:
    """One llama-server process on a loopback port; a context manager that always stops it."""

    def __init__(self, bin_dir: Path, model: Path, args: tuple[str, ...], port: int | None = None) -> None:
        self.port = port or _free_port()
        self.command = [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1",
                        "--port", str(self.port), *args]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env, self.exit_code, self.process = child_env(bin_dir), None, None
        self.log = tempfile.TemporaryFile()

    def __enter__(self) -> Server:
        parent = os.getpid()
        self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=self.log,
                                        stderr=subprocess.STDOUT, env=self.env,
                                        preexec_fn=lambda: _die_with_parent(parent))
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, num_lines: int = 20) -> str:
        """The last lines the server printed."""
        self.log.seek(0)
        return "\n".join(self.log.read().decode(errors="replace").splitlines()[-num_lines:])

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until /health answers 200; PeerServerError if the server exits first or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PeerServerError(f"llama-server exited {self.process.returncode} before it was ready",
                                      self.log_tail())
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):  # 503 while loading, refused before listening
                pass
            time.sleep(0.25)
        raise PeerServerError(f"llama-server not ready after {timeout_s:.0f} s", self.log_tail())

    def stop(self) -> int | None:
        """Terminate (kill after STOP_TIMEOUT_S); the exit code."""
        if self.process is not None and self.exit_code is None:
            self.process.terminate()
            try:
                self.exit_code = self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.exit_code = self.process.wait()
        return self.exit_code


def fixed_prompt() -> list[int]:
    """The 32 token ids bench/gpu_megakernel.py decodes the 27B file from (below every vocabulary's 150000)."""
    import numpy as np

    return [int(t) for t in np.random.default_rng(3).integers(0, 150000, 32)]


def complete(base_url: str, prompt: list[int], n_predict: int) -> dict:
    """One greedy /completion of n_predict tokens (EOS ignored, no prompt cache): the response."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "seed": 0, "ignore_eos": True,
            "cache_prompt": False}
    request = urllib.request.Request(base_url + "/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            answer = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise PeerServerError(f"/completion failed: {e}") from e
    if "timings" not in answer:
        raise PeerServerError(f"/completion answered without timings: {str(answer)[:300]}")
    return answer


def measure_decode(base_url: str, prompt: list[int], n_predict: int, reps: int) -> dict:
    """Decode tok/s from timings.predicted_per_second of reps requests after one warm-up request."""
    complete(base_url, prompt, 8)
    timings = [complete(base_url, prompt, n_predict)["timings"] for _ in range(reps)]
    samples = [t["predicted_per_second"] for t in timings]
    out = {"statistic": STAT_SERVER, "decode_tok_s": statistics.mean(samples),
           "stddev_tok_s": statistics.stdev(samples) if len(samples) > 1 else 0.0, "samples_tok_s": samples,
           "predicted_n": [t["predicted_n"] for t in timings], "timings": timings[-1],
           "draft_n": sum(t.get("draft_n", 0) for t in timings),
           "draft_n_accepted": sum(t.get("draft_n_accepted", 0) for t in timings)}
    if any(n != n_predict for n in out["predicted_n"]):
        out["error"] = f"asked for {n_predict} tokens, the server predicted {out['predicted_n']}"
    return out


def server_run(bin_dir: Path, model: Path, spec_args: tuple[str, ...], *, gpu_args: tuple[str, ...] = GPU_ARGS,
               extra_args: tuple[str, ...] = (), reps: int = 3, n_predict: int = N_PREDICT) -> dict:
    """Start llama-server with spec_args, measure decode, stop it: the command, numbers or error, exit code."""
    args = ("--flash-attn", "on", *gpu_args, "--parallel", "1", "-c", str(CTX_SIZE), *extra_args, *spec_args)
    server = Server(bin_dir, model, args)
    entry: dict = {"command": server.command}
    try:
        with server:
            server.wait_ready()
            entry |= measure_decode(server.base_url, fixed_prompt(), n_predict, reps)
    except PeerServerError as e:
        entry |= {"error": str(e), "log_tail": e.log_tail or server.log_tail()}
    finally:
        entry["exit_code"] = server.exit_code
        server.log.close()
    return entry


def server_runs(bin_dir: Path, model: Path, *, mtp_depths: tuple[int, ...] = MTP_DEPTHS, **kwargs) -> dict:
    """No speculation, then MTP drafting at each depth; once an MTP server has failed, later depths are skipped."""
    runs, failure = {"plain": server_run(bin_dir, model, (), **kwargs)}, ""
    for d in mtp_depths:
        if failure:
            runs[f"mtp_d{d}"] = {"skipped": f"an earlier MTP run failed: {failure}"}
            continue
        run = runs[f"mtp_d{d}"] = server_run(bin_dir, model, ("--spec-type", "draft-mtp", "--spec-draft-n-max",
                                                              str(d)), **kwargs)
        failure = run["error"] if "log_tail" in run else ""  # refused to load or died: the same for every d
    return runs


def _step(result: dict, name: str, fn) -> object:
    """fn(), or {'error': why} with why added to result['errors'] (a peer failure never stops the bench)."""
    try:
        return fn()
    except (PeerError, OSError, subprocess.SubprocessError) as e:
        result["errors"].append(f"{name}: {type(e).__name__}: {e}")
        return {"error": str(e)}


def measure(model: Path, peer_dir: Path = PEER_DIR, *, reps: int = 3, mtp_depths: tuple[int, ...] = MTP_DEPTHS,
            gpu_args: tuple[str, ...] = GPU_ARGS, extra_args: tuple[str, ...] = (), n_predict: int = N_PREDICT,
            unpack_root: Path = UNPACK_ROOT) -> dict:
    """Everything about the peer on model, as one JSON-able dict; failures are entries, never exceptions."""
    result: dict = {"model": str(model), "peer_dir": str(peer_dir), "errors": []}
    bin_dir = _step(result, "peer", lambda: find_peer(peer_dir, unpack_root))
    if not isinstance(bin_dir, Path):
        return result
    result["bin_dir"] = str(bin_dir)
    result["version"] = _step(result, "version", lambda: server_version(bin_dir))
    result["llama_bench"] = _step(result, "llama-bench", lambda: run_llama_bench(bin_dir, model, reps, gpu_args))
    result["server"] = server_runs(bin_dir, model, mtp_depths=mtp_depths, gpu_args=gpu_args, extra_args=extra_args,
                                   reps=reps, n_predict=n_predict)
    result["errors"] += [f"server {k}: {r['error']}" for k, r in result["server"].items()
                         if "error" in r and k == "plain"]  # an MTP refusal is a finding, not an error
    return result


def model_file() -> Path:
    """The generated 27B-shaped file of the bench (written here if no part wrote it yet)."""
    path = Path(os.environ.get("OPENJET_27B", MODEL_27B))
    if not path.exists():
        from engine.gguf.testmodel import write_preset

        write_preset(path, "qwen3.8-27b", workers=os.cpu_count())
    return path


def run_into(report) -> None:
    """The `peer` part of bench/gpu_check.py: measure() on the 27B file ($OPENJET_PEER or .peers/) into info['peer']."""
    t0 = time.perf_counter()
    try:
        peer = measure(model_file(), Path(os.environ.get("OPENJET_PEER") or PEER_DIR))
    except Exception as e:  # noqa: BLE001 -- the boundary: whatever broke, the rest of the bench goes on
        peer = {"errors": [f"peer raised {type(e).__name__}: {e}"]}
    peer["wall_s"] = round(time.perf_counter() - t0, 1)
    report.info["peer"] = peer
    report.notes += [f"peer: {line}" for line in peer["errors"]]
    print_peer(peer)


def main(argv: list[str] | None = None) -> int:
    """Measure the peer alone; JSON to --out; exit 1 when a step failed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help=f"GGUF file (default $OPENJET_27B or {MODEL_27B})")
    parser.add_argument("--peer", type=Path, default=PEER_DIR, help="archive parts + README, or a bin/ folder")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--mtp-depths", default=",".join(map(str, MTP_DEPTHS)))
    parser.add_argument("--gpu-args", default=" ".join(GPU_ARGS), help="'-ngl 0' for a CPU build")
    parser.add_argument("--server-args", default="", help="more llama-server flags, e.g. '-t 2'")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or REPO / "bench/results"))
    args = parser.parse_args(argv)
    peer = measure(args.model or model_file(), args.peer, reps=args.reps, gpu_args=tuple(shlex.split(args.gpu_args)),
                   mtp_depths=tuple(int(d) for d in args.mtp_depths.split(",") if d),
                   extra_args=tuple(shlex.split(args.server_args)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_peer.json").write_text(json.dumps(peer, indent=1))
    print_peer(peer)
    return 1 if peer["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
