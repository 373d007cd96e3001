"""bench/gpu_peer.py: llama-bench's JSON read as llama.cpp writes it, the peer's archive checked before it is unpacked,
and llama-server started, measured and always stopped (the cached CPU build of llama.cpp on tiny generated models)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bench import gpu_peer
from bench.gpu_compare import comparison_rows, ours_from_timings
from bench.llamacpp_build import cache_root

ROOT = Path(__file__).resolve().parents[2]
# llama.cpp's own example of `llama-bench -o json` (tools/llama-bench/README.md of b11434, verbatim)
BENCH_SAMPLE = Path(__file__).parent / "fixtures" / "llama_bench_b11434_readme.json"
SERVERS = sorted(cache_root().glob("*/bin/llama-server"))  # resolved at import: the autouse fixture moves HOME
LLAMA_BIN = SERVERS[0].parent if SERVERS else None
needs_llama = pytest.mark.skipif(LLAMA_BIN is None, reason="no cached llama.cpp build with llama-server")
CPU = {"gpu_args": ("-ngl", "0"), "extra_args": ("-t", "1")}


def _make_peer(folder: Path, readme_sha: str | None = None, num_parts: int = 3) -> str:
    """folder: a .tar.xz of bin/llama-server (a shell script) split into parts, and a README; the real sha256."""
    bin_dir = folder / "build" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "llama-server").write_text('#!/bin/sh\necho "version: test peer, LD_LIBRARY_PATH=$LD_LIBRARY_PATH"\n')
    (bin_dir / "llama-server").chmod(0o755)
    (bin_dir / "libggml.so").write_bytes(os.urandom(20000))  # enough bytes that every part holds some
    with tarfile.open(folder / "a.tar.xz", "w:xz") as tar:
        tar.add(bin_dir, arcname="bin")
    data = (folder / "a.tar.xz").read_bytes()
    (folder / "a.tar.xz").unlink()
    size = -(-len(data) // num_parts)
    for i in range(num_parts):
        (folder / f"llama-server-cuda-sm90.tar.xz.part{i:02d}").write_bytes(data[i * size:(i + 1) * size])
    actual = hashlib.sha256(data).hexdigest()
    (folder / "README.md").write_text(f"# peer\n\nsha256 of the joined archive: {readme_sha or actual} (45 MB)\n")
    (folder / "build" / "bin" / "llama-server").unlink()  # only the parts and the README stay
    return actual


def test_archive_checked_then_unpacked_once(tmp_path: Path) -> None:
    peer, root = tmp_path / "peers", tmp_path / "unpacked"
    peer.mkdir()
    _make_peer(peer)
    bin_dir = gpu_peer.find_peer(peer, root)
    assert (bin_dir / "llama-server").stat().st_mode & 0o111 and (bin_dir / "libggml.so").stat().st_size == 20000
    assert root in bin_dir.parents
    version = gpu_peer.server_version(bin_dir)  # it runs, with its folder first on the child's library path
    assert version.startswith(f"version: test peer, LD_LIBRARY_PATH={bin_dir}")
    assert str(bin_dir) not in os.environ.get("LD_LIBRARY_PATH", "")
    inode = (bin_dir / "llama-server").stat().st_ino
    assert gpu_peer.find_peer(peer, root) == bin_dir and (bin_dir / "llama-server").stat().st_ino == inode


def test_wrong_sha256_refused_and_nothing_unpacked(tmp_path: Path) -> None:
    peer, root = tmp_path / "peers", tmp_path / "unpacked"
    peer.mkdir()
    actual = _make_peer(peer, readme_sha="0" * 64)
    with pytest.raises(gpu_peer.PeerArchiveError, match="refusing to unpack") as caught:
        gpu_peer.find_peer(peer, root)
    assert actual in str(caught.value) and "0" * 64 in str(caught.value)
    assert not list(root.rglob("llama-server")) and not list(root.rglob("*.tar.xz"))


def test_missing_part_refused(tmp_path: Path) -> None:
    peer = tmp_path / "peers"
    peer.mkdir()
    _make_peer(peer)
    (peer / "llama-server-cuda-sm90.tar.xz.part01").unlink()
    with pytest.raises(gpu_peer.PeerArchiveError, match="part00, llama-server-cuda-sm90.tar.xz.part02"):
        gpu_peer.find_peer(peer, tmp_path / "unpacked")


def test_missing_readme_and_empty_folder_say_what_to_copy(tmp_path: Path) -> None:
    peer = tmp_path / "peers"
    peer.mkdir()
    with pytest.raises(gpu_peer.PeerArchiveError, match="copy /work/shared/peers/llama-server-cuda-sm90"):
        gpu_peer.find_peer(peer, tmp_path / "unpacked")
    _make_peer(peer)
    (peer / "README.md").unlink()
    with pytest.raises(gpu_peer.PeerArchiveError, match="README.md is missing"):
        gpu_peer.find_peer(peer, tmp_path / "unpacked")


def test_a_missing_peer_is_a_recorded_error_not_an_exception(tmp_path: Path) -> None:
    result = gpu_peer.measure(tmp_path / "model.gguf", tmp_path / "nothing-here", unpack_root=tmp_path / "u")
    assert result["errors"] and "no llama-server" in result["errors"][0]
    assert "llama_bench" not in result and json.loads(json.dumps(result)) == result


def test_a_peer_that_cannot_run_here_is_recorded_step_by_step(tmp_path: Path) -> None:
    """The CUDA build on a machine without its libraries: every step's error recorded, the servers' log kept."""
    for tool in ("llama-server", "llama-bench"):
        (tmp_path / tool).write_text("#!/bin/sh\necho \"$0: error while loading shared libraries: libcublas.so.13\" >&2"
                                     "\nexit 127\n")
        (tmp_path / tool).chmod(0o755)
    result = gpu_peer.measure(tmp_path / "model.gguf", tmp_path, mtp_depths=(2, 4), unpack_root=tmp_path / "u")
    assert [e.split(":")[0] for e in result["errors"]] == ["version", "llama-bench", "server plain"]
    assert all("libcublas.so.13" in e for e in result["errors"][:2])
    plain, mtp = result["server"]["plain"], result["server"]["mtp_d2"]
    assert plain["error"] == "llama-server exited 127 before it was ready" and "libcublas" in plain["log_tail"]
    assert plain["exit_code"] == 127 and "libcublas" in mtp["log_tail"] and "skipped" in result["server"]["mtp_d4"]
    assert json.loads(json.dumps(result)) == result


def test_parse_llama_bench_sample() -> None:
    parsed = gpu_peer.parse_llama_bench(BENCH_SAMPLE.read_text())
    pp, tg = parsed["prefill"]["512"], parsed["decode"]["128"]
    assert (pp["mean_tok_s"], pp["stddev_tok_s"]) == (7100.002165, 140.34152)
    assert (tg["mean_tok_s"], tg["stddev_tok_s"]) == (118.881588, 1.041811)
    assert set(parsed["prefill"]) == {"512"} and set(parsed["decode"]) == {"128"}
    # the statistic we label: the mean and the sample (n - 1) standard deviation of the per-repetition rates
    assert pp["mean_tok_s"] == pytest.approx(statistics.mean(pp["samples_tok_s"]), rel=1e-5)
    assert pp["stddev_tok_s"] == pytest.approx(statistics.stdev(pp["samples_tok_s"]), rel=1e-3)
    assert tg["stddev_tok_s"] == pytest.approx(statistics.stdev(tg["samples_tok_s"]), rel=1e-3)
    assert pp["mean_ms"] == pytest.approx(72.13564)
    assert parsed["build"]["build_commit"] == "8cf427ff" and parsed["build"]["backends"] == "CUDA"


def test_parse_llama_bench_refuses_other_output() -> None:
    with pytest.raises(gpu_peer.PeerError, match="llama-bench's JSON could not be read"):
        gpu_peer.parse_llama_bench("main: error: failed to load model\n")
    with pytest.raises(gpu_peer.PeerError, match="KeyError"):
        gpu_peer.parse_llama_bench('[{"n_prompt": 512}]')


def test_run_llama_bench_command_line_and_missing_tests(tmp_path: Path) -> None:
    """A llama-bench that prints the recorded sample: our command line, its env, and the sizes it left out."""
    (tmp_path / "llama-bench").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\necho "$LD_LIBRARY_PATH" '
                                          f'> {tmp_path}/libpath\ncat {BENCH_SAMPLE}\n')
    (tmp_path / "llama-bench").chmod(0o755)
    result = gpu_peer.run_llama_bench(tmp_path, Path("/m/F.gguf"), 4)
    assert (tmp_path / "argv").read_text().split() == ["-m", "/m/F.gguf", "-ngl", "99", "-fa", "1", "-p",
                                                       "512,2048,8192", "-n", "128", "-r", "4", "-o", "json"]
    assert (tmp_path / "libpath").read_text().strip().split(os.pathsep)[0] == str(tmp_path)
    assert result["error"] == "llama-bench reported no pp2048, pp8192"
    assert result["prefill"]["512"]["mean_tok_s"] == 7100.002165


def test_comparison_rows_from_a_report() -> None:
    timings = [{"op": "forward", "variant": "27b.T1", "median_ms": 10.0, "extra": {}},
               {"op": "prefill", "variant": "27b.512", "median_ms": 100.0, "extra": {"tok_per_s": 5120.0}},
               {"op": "copy", "variant": "d2d", "median_ms": 1.0, "extra": {}, "gbps": 4200.0}]
    ours = ours_from_timings(timings)
    peer = {"llama_bench": gpu_peer.parse_llama_bench(BENCH_SAMPLE.read_text()),
            "server": {"plain": {"decode_tok_s": 50.0}}}
    rows = {what: (mine, theirs) for what, mine, theirs in comparison_rows(ours, peer)}
    assert rows["decode per-op T=1 vs llama-bench tg128"] == (100.0, 118.881588)
    assert rows["decode per-op T=1 vs llama-server"] == (100.0, 50.0)
    assert rows["prefill 512"] == (5120.0, 7100.002165) and rows["prefill 8192"] == (None, None)
    assert ours["copy_gbps"] == 4200.0


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny generated qwen35 (with an MTP layer) and qwen3 (without) files, tokenizer included."""
    folder = tmp_path_factory.mktemp("peer")
    for arch in ("qwen35", "qwen3"):
        subprocess.run([sys.executable, "-m", "engine.cli", "make-test-model", "--arch", arch, "--out",
                        str(folder / f"{arch}.gguf")], check=True, cwd=ROOT, capture_output=True)
    return {arch: folder / f"{arch}.gguf" for arch in ("qwen35", "qwen3")}


def _port_closed(command: list[str]) -> bool:
    port = int(command[command.index("--port") + 1])
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@needs_llama
def test_server_plain_and_mtp_measured_then_stopped(tiny_models: dict[str, Path]) -> None:
    runs = gpu_peer.server_runs(LLAMA_BIN, tiny_models["qwen35"], mtp_depths=(2,), reps=2, n_predict=40, **CPU)
    plain, mtp = runs["plain"], runs["mtp_d2"]
    assert "error" not in plain and "error" not in mtp, (plain, mtp)
    assert plain["predicted_n"] == [40, 40] and mtp["predicted_n"] == [40, 40]
    assert plain["decode_tok_s"] == pytest.approx(statistics.mean(plain["samples_tok_s"]))
    assert plain["decode_tok_s"] > 0 and plain["timings"]["predicted_per_second"] == plain["samples_tok_s"][-1]
    assert plain["draft_n"] == 0 and "--spec-type" not in plain["command"]  # no speculation
    assert mtp["draft_n"] > 0  # the MTP head drafted
    args = plain["command"]
    assert args[args.index("--flash-attn") + 1] == "on" and args[args.index("-ngl") + 1] == "0"
    assert args[args.index("--parallel") + 1] == "1"
    assert mtp["command"][-4:] == ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]
    assert plain["exit_code"] is not None and mtp["exit_code"] is not None
    assert _port_closed(plain["command"]) and _port_closed(mtp["command"])


@needs_llama
def test_mtp_refusal_recorded_and_later_depths_skipped(tiny_models: dict[str, Path]) -> None:
    runs = gpu_peer.server_runs(LLAMA_BIN, tiny_models["qwen3"], mtp_depths=(2, 4), reps=1, n_predict=8, **CPU)
    assert "error" not in runs["plain"] and runs["plain"]["predicted_n"] == [8]
    refused = runs["mtp_d2"]
    assert "exited" in refused["error"] and "before it was ready" in refused["error"]
    assert "doesn't contain MTP layers" in refused["log_tail"]
    assert runs["mtp_d4"]["skipped"].startswith("an earlier MTP run failed")


CHILD = """
import sys, time
from pathlib import Path
from bench import gpu_peer
server = gpu_peer.Server(Path(sys.argv[1]), Path(sys.argv[2]), ("-ngl", "0", "-t", "1", "-c", "512")).__enter__()
server.wait_ready()
print(server.process.pid, server.port, flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


@needs_llama
def test_server_dies_when_the_bench_is_killed(tiny_models: dict[str, Path]) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(LLAMA_BIN), str(tiny_models["qwen35"])],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        pid, port = (int(v) for v in child.stdout.readline().split())
        child.send_signal(signal.SIGKILL)  # no finally, no atexit: only the kernel can stop the server now
        child.wait()
        # The leader shows as a zombie while its other threads still tear down (and hold the socket): wait for both.
        deadline = time.monotonic() + 10
        while not (_gone(pid) and _port_closed(["--port", str(port)])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid)
        assert _port_closed(["--port", str(port)])
    finally:
        if child.poll() is None:
            child.kill()
        if pid is not None and not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_make_bench_runs_the_peer_part_and_prints_the_comparison_last(tmp_path: Path, monkeypatch, capsys) -> None:
    """gpu_check's `peer` part with no peer present: a recorded error that survives the merge, and the table last."""
    from bench import gpu_check
    from bench.gpu_common import Report, Timing

    assert gpu_check.BENCH_PARTS.index("model27b") < gpu_check.BENCH_PARTS.index("mk27b") < gpu_check.BENCH_PARTS.index("peer")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")  # exists: no 27B file is generated
    monkeypatch.setenv("OPENJET_27B", str(tmp_path / "m.gguf"))
    monkeypatch.setenv("OPENJET_PEER", str(tmp_path / "no-peer"))
    report = Report()
    gpu_check.run_part("peer", None, report, None, None)
    assert "no llama-server" in report.info["peer"]["errors"][0] and report.notes[0].startswith("peer: ")
    report.timings += [Timing("forward", "27b.T1", "ctx512", 10.0, 0.0),
                       Timing("prefill", "27b.512", "512 tokens", 100.0, 0.0, 0, {"tok_per_s": 5120.0})]
    report.info["peer"]["llama_bench"] = gpu_peer.parse_llama_bench(BENCH_SAMPLE.read_text())
    report.write(tmp_path / "part_peer.json")
    merged = gpu_check.merge(tmp_path, ["peer"])
    assert merged.info["peer"] == report.info["peer"]
    capsys.readouterr()
    gpu_check.summary(merged)
    out = capsys.readouterr().out
    assert out.index("==== summary ====") < out.index("==== ours vs llama.cpp")
    assert "prefill 512" in out.split("==== ours vs llama.cpp")[1] and "0.72x" in out  # 5120 / 7100
