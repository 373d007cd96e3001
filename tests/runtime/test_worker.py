"""Engine worker lifecycle with real processes: health wait with progress, restart after a crash with the reason,
bounded restarts, start failures with the log, and no engine process left behind when the app exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from openjet_tui.runtime.errors import EngineStartError
from openjet_tui.runtime.worker import EngineWorker, WorkerSpec, reap_orphans
from tests.runtime.procs import is_gone, wait_gone

DOUBLE = str(Path(__file__).with_name("engine_double.py"))


def _spec(*flags: str, **kwargs: object) -> WorkerSpec:
    return WorkerSpec(name="double", command=[sys.executable, DOUBLE, "--port", "{port}", *flags],
                      start_timeout_s=20.0, **kwargs)


def _pids(worker: EngineWorker) -> dict:
    return httpx.get(f"{worker.base_url}/pid", timeout=5).json()


def test_start_waits_for_health_with_progress_and_stop_kills_the_group(isolated_cache):
    events = []
    worker = EngineWorker(_spec("--loading-polls", "3", "--spawn-child")).start(progress=events.append)
    try:
        assert httpx.get(f"{worker.base_url}/health", timeout=5).status_code == 200
        loading = [e for e in events if e.note == "Loading model"]
        assert loading and loading[0].unit == "%" and loading[-1].done > loading[0].done
        assert events[-1].is_finished and events[-1].note == "ready"
        pids = _pids(worker)
        assert (isolated_cache / "workers" / f"{pids['pid']}.json").exists()
        assert worker.log_path.exists() and "--port" in worker.log_path.read_text()
    finally:
        worker.stop()
    assert wait_gone(pids["pid"]) and wait_gone(pids["child"])
    assert not list((isolated_cache / "workers").glob("*.json"))
    assert [e.kind for e in worker.events] == ["starting", "healthy", "stopped"]


def test_crashed_worker_is_restarted_and_the_reason_surfaces(tmp_path):
    seen = []
    worker = EngineWorker(_spec("--crash-once-marker", str(tmp_path / "crashed")), on_event=seen.append).start()
    try:
        first = _pids(worker)["pid"]
        deadline = time.monotonic() + 15
        while not any(e.kind == "healthy" and "again" in e.message for e in seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [e.kind for e in seen][:5] == ["starting", "healthy", "crashed", "restarting", "healthy"]
        assert "exit code 3" in worker.crash_reasons[0] and "simulated GPU fault" in worker.crash_reasons[0]
        assert _pids(worker)["pid"] != first and wait_gone(first)
    finally:
        worker.stop()


def test_restarts_are_bounded(tmp_path):
    worker = EngineWorker(_spec("--die-after", "2.5", max_restarts=1)).start()
    pid = worker.pid
    deadline = time.monotonic() + 20
    while not any(e.kind == "gave_up" for e in worker.events) and time.monotonic() < deadline:
        time.sleep(0.1)
    kinds = [e.kind for e in worker.events]
    assert kinds.count("crashed") == 2 and kinds[-1] == "gave_up" and "crashed 2 times" in worker.events[-1].message
    assert not worker.is_running() and wait_gone(pid)
    worker.stop()


def test_start_failure_reports_exit_and_log(isolated_cache):
    with pytest.raises(EngineStartError, match=r"(?s)exit code 2.*cannot load model \(simulated\)"):
        EngineWorker(_spec("--die-at-start")).start()
    assert not list((isolated_cache / "workers").glob("*.json"))


APP = textwrap.dedent(f"""
    import json, sys, os
    from openjet_tui.runtime.worker import EngineWorker, WorkerSpec
    worker = EngineWorker(WorkerSpec(name="double", command=[sys.executable, {DOUBLE!r}, "--port", "{{port}}",
                                                             "--spawn-child"], start_timeout_s=20)).start()
    import httpx
    print(json.dumps(httpx.get(worker.base_url + "/pid").json()), flush=True)
    if sys.argv[1] == "hang":
        import time; time.sleep(60)
""")


@pytest.mark.parametrize("how", ["normal exit", "SIGTERM"])
def test_exiting_app_leaves_no_engine_process(how):
    mode = "exit" if how == "normal exit" else "hang"
    app = subprocess.Popen([sys.executable, "-c", APP, mode], stdout=subprocess.PIPE, text=True)
    pids = json.loads(app.stdout.readline())
    if how == "SIGTERM":
        app.send_signal(signal.SIGTERM)  # the app's runtime turns SIGTERM into a normal exit
    app.wait(20)
    assert wait_gone(pids["pid"]) and wait_gone(pids["child"])


def test_engine_of_a_killed_app_is_reaped_at_the_next_start():
    app = subprocess.Popen([sys.executable, "-c", APP, "hang"], stdout=subprocess.PIPE, text=True)
    pids = json.loads(app.stdout.readline())
    app.kill()  # SIGKILL: no atexit, the engine is orphaned
    app.wait(10)
    assert not is_gone(pids["pid"])
    reaped = reap_orphans()
    assert pids["pid"] in reaped and wait_gone(pids["pid"]) and wait_gone(pids["child"])


def test_a_reused_pid_is_never_killed(isolated_cache):
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)  # stands for an unrelated process
    try:
        record = {"owner_pid": 999_999_999, "owner_started": 1, "pgid": stranger.pid, "started": 12345,
                  "command": ["old-engine"]}
        (isolated_cache / "workers").mkdir(parents=True, exist_ok=True)
        (isolated_cache / "workers" / f"{stranger.pid}.json").write_text(json.dumps(record))
        assert reap_orphans() == [] and stranger.poll() is None
        assert not list((isolated_cache / "workers").glob("*.json"))  # the stale record is dropped
    finally:
        stranger.kill()
        stranger.wait()
