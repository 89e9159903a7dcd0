"""Run `dagster dev` (webserver + daemon) on 127.0.0.1 for a catalog.

Used by the end-to-end test and the benchmark; handy for scripts too.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

__all__ = ["IMMEDIATE_RUNS_YAML", "free_port", "dagster_dev"]

# Launch runs as soon as a sensor requests them, instead of through the run queue.
IMMEDIATE_RUNS_YAML = "run_coordinator:\n  module: dagster._core.run_coordinator\n  class: DefaultRunCoordinator\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def dagster_dev(
    workspace: str,
    dagster_home: str,
    env: dict[str, str],
    log_path: str,
    *,
    immediate_runs: bool = False,
    wait_s: float = 120,
) -> Iterator[str]:
    """Start `dagster dev`, wait until it answers, yield its base URL, stop it."""
    os.makedirs(dagster_home, exist_ok=True)
    if immediate_runs:
        with open(os.path.join(dagster_home, "dagster.yaml"), "w") as fh:
            fh.write(IMMEDIATE_RUNS_YAML)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [dagster, "dev", "-h", "127.0.0.1", "-p", str(port), "-w", workspace],
            cwd=os.path.dirname(os.path.abspath(workspace)),
            env={**os.environ, **env, "DAGSTER_HOME": dagster_home},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.time() + wait_s
            while not _up(url):
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"dagster dev did not come up on {url}; see {log_path}")
                time.sleep(0.5)
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
