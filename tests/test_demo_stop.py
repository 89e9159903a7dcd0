"""`make demo-stop` stops the demo's `dagster dev` with everything below it:
interrupted as Ctrl-C does, then, where something (a run it was executing)
holds its shutdown, every process of it killed; a recorded process id that is
no `dagster dev` any more is left alone. Stand-in processes named as `dagster
dev` is (the real one is stopped by the end-to-end demo check)."""

import os
import subprocess
import sys
import time

from mv_assets.dagster.devserver import stop

# a "dagster dev" that ignores Ctrl-C and has a child that does too (a run worker holding the shutdown)
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"])
time.sleep(600)
"""
POLITE = "import time; time.sleep(600)"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start(code: str, tmp_path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", code, "dagster", "dev", "-p", "0"])
    pid_file = str(tmp_path / "dagster.pid")
    with open(pid_file, "w") as f:
        f.write(str(proc.pid))
    time.sleep(0.5)  # (its child started)
    return proc, pid_file


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def test_a_dagster_dev_that_stops_on_ctrl_c(tmp_path):
    proc, pid_file = _start(POLITE, tmp_path)
    assert stop(pid_file, wait_s=10) == f"stopped the Dagster UI (process {proc.pid})"
    proc.wait(timeout=5)
    assert not os.path.exists(pid_file)


def test_a_shutdown_held_by_a_child_ends_every_process(tmp_path):
    proc, pid_file = _start(STUBBORN, tmp_path)
    children = _children(proc.pid)
    assert children
    said = stop(pid_file, wait_s=1)
    assert said.startswith(f"stopped the Dagster UI (process {proc.pid}; 2 processes ended")
    proc.wait(timeout=5)
    time.sleep(0.3)
    assert not any(_alive(c) for c in children)


def test_a_pid_that_is_not_dagster_dev_is_left_alone(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", POLITE])
    try:
        pid_file = tmp_path / "dagster.pid"
        pid_file.write_text(str(other.pid))
        assert stop(str(pid_file)) == f"the Dagster UI (process {other.pid}) is not running"
        assert other.poll() is None and not pid_file.exists()
        assert stop(str(pid_file)) == "no Dagster UI recorded as started by make demo"
    finally:
        other.kill()
        other.wait()
