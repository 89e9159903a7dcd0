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

from mv_assets.dagster.coordinator import quick_runs_yaml
from mv_assets.dagster.storage import BATCH_SIZE, sqlite_storage_yaml
from mv_assets.dagster.warm_launcher import warm_runs_yaml

__all__ = ["DAGSTER_ENV", "QUICK_RUNS_YAML", "SENSOR_THREADS_YAML", "WARM_RUNS_YAML", "cache_bytecode", "free_port", "dagster_dev",
           "prepare_home", "port_in_use", "wait_until", "graphql"]

MARKER = "# written by mv_assets: safe to delete, rewritten on the next start\n"
# Runs start within a second or two of being requested, by a sensor or by the UI
# (a backfill too): Dagster's run queue, looked at every second, and requested
# backfills every 2 s instead of 30 (see mv_assets.dagster.coordinator). A queue,
# not DefaultRunCoordinator: with that the UI warns on every backfill launch.
QUICK_RUNS_YAML = MARKER + quick_runs_yaml()
# Each run's process forked from a helper that has imported dagster, lance and
# mv_assets (mv_assets.dagster.warm_launcher): a run starts without importing
# them again (~2.7 s of CPU a run on an idle core).
WARM_RUNS_YAML = warm_runs_yaml()

# What the webserver and daemon processes need in their environment (they
# create runs; the code location cannot set it for them). One planned event per
# asset for a run over a partition range, not one per partition: a run over
# every partition of a 10,000-fragment source wrote 20,000 planned events
# (~7 ms each on SQLite) before starting. Dagster's own switch for single-run
# backfills; its cost: with Dagster's open-source storages a failed run's
# partitions keep their earlier state instead of showing "failed" (the run
# shows the failure), and partitions do not show "in progress" during a run.
# Set it to 0 in the environment to keep Dagster's default.
#
# And the materializations of a run are stored in batches of up to 1,000
# (Dagster's DAGSTER_EVENT_BATCH_SIZE; the home's event log is
# mv_assets.dagster.storage's SQLite storage, which writes a batch in one
# transaction): ~17 ms an event one by one on SQLite, ~200 s at 10,000 partitions.
DAGSTER_ENV = {"DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "1", "DAGSTER_EVENT_BATCH_SIZE": str(BATCH_SIZE)}


# The sensor daemon evaluates sensors on threads (Dagster's own setting): one
# sensor per table, each tick a few small reads, so a catalog of 1,000 tables is
# 1,000 ticks a round; one after another that is ~40-75 ms each on an object
# store, a round longer than the 30-second interval.
SENSOR_THREADS_YAML = "sensors:\n  use_threads: true\n  num_workers: 8\n"


def prepare_home(dagster_home: str, *, immediate_runs: bool = True, warm_runs: bool = True) -> str:
    """Create ``dagster_home`` and its dagster.yaml; never overwrite one we did not write.

    A dagster.yaml without our marker is somebody's configuration (storage,
    run launcher...): it is refused with a clear message, not reused silently.
    """
    os.makedirs(dagster_home, exist_ok=True)
    path = os.path.join(dagster_home, "dagster.yaml")
    if os.path.exists(path):
        with open(path) as fh:
            if not fh.read().startswith(MARKER):
                raise RuntimeError(
                    f"{path} was not written by mv_assets; refusing to use or overwrite it. "
                    "Point DAGSTER_HOME elsewhere or remove the file."
                )
    with open(path, "w") as fh:
        fh.write((QUICK_RUNS_YAML if immediate_runs else MARKER) + (WARM_RUNS_YAML if warm_runs else "")
                 + SENSOR_THREADS_YAML + sqlite_storage_yaml(dagster_home))
    return path


def cache_bytecode(package: str | None = None) -> bool:
    """Compile mv_assets' modules (or those under the folder ``package``) to
    bytecode (``__pycache__``) where missing or stale, best effort; True when
    every module compiled. Each run of
    ``dagster dev`` is a new process that imports them while it loads the
    definitions, before the run starts: where the environment forbids Python
    to write bytecode itself (``PYTHONDONTWRITEBYTECODE=1``, common in
    container images), every run compiled ~100 modules again, ~0.6-1.1 s of
    its start-up on 2 cores. Bytecode written here is read whatever that
    setting says. A package that cannot be written (installed read-only)
    is left as it is."""
    import compileall

    package = package or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        return bool(compileall.compile_dir(package, quiet=2))
    except OSError:
        return False


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5):
    """Poll ``predicate`` until it returns something truthy (returned), or fail
    with an AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def graphql(base_url: str, query: str, **variables) -> dict:
    """One GraphQL request to a running webserver; errors raise."""
    import json

    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(f"{base_url}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        answer = json.loads(r.read())
    if "errors" in answer:
        raise AssertionError(answer["errors"])
    return answer["data"]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


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
    warm_runs: bool = True,
    wait_s: float = 120,
) -> Iterator[str]:
    """Start `dagster dev`, wait until it answers, yield its base URL, stop it
    (``warm_runs=False``: Dagster's own run launcher, for comparisons)."""
    prepare_home(dagster_home, immediate_runs=immediate_runs, warm_runs=warm_runs)
    cache_bytecode()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [dagster, "dev", "-h", "127.0.0.1", "-p", str(port), "-w", workspace],
            cwd=os.path.dirname(os.path.abspath(workspace)),
            env={**DAGSTER_ENV, **os.environ, **env, "DAGSTER_HOME": dagster_home},
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


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop(pid_file: str, wait_s: float = 15.0) -> str:
    """Stop the ``dagster dev`` whose process id ``make demo`` wrote to
    ``pid_file``: interrupted as Ctrl-C does (it stops its webserver, daemon
    and code servers), then, with every process below it, killed if any is
    still there after ``wait_s`` (a run it was executing can hold its shutdown).
    A process id that is not a ``dagster dev`` any more (gone, or reused) is
    left alone. Returns what was done, in words."""
    try:
        with open(pid_file) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return "no Dagster UI recorded as started by make demo"
    try:
        if "dagster" not in _cmdline(pid) or " dev" not in _cmdline(pid):
            return f"the Dagster UI (process {pid}) is not running"
        tree = [pid, *_descendants(pid)]  # (its webserver, daemon, code servers and run workers)
        os.kill(pid, signal.SIGINT)
        if _wait_gone(tree, wait_s):
            return f"stopped the Dagster UI (process {pid})"
        # a run it was executing can hold its shutdown: every process of it is ended
        tree = list(dict.fromkeys(tree + _descendants(pid)))
        for p in tree:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        _wait_gone(tree, 5.0)
        return f"stopped the Dagster UI (process {pid}; {len(tree)} processes ended after {wait_s:g} s)"
    finally:
        if os.path.exists(pid_file):
            os.remove(pid_file)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, theirs...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _wait_gone(pids: list[int], wait_s: float) -> bool:
    deadline = time.time() + wait_s
    while any(_cmdline(p) for p in pids):
        if time.time() > deadline:
            return False
        time.sleep(0.2)
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m mv_assets.dagster.devserver prepare HOME PORT``: what ``make demo``
    runs before ``dagster dev``: HOME's dagster.yaml is ours, PORT is free,
    mv_assets' bytecode is cached (:func:`cache_bytecode`).
    ``... stop PID_FILE``: what ``make demo-stop`` runs: the demo's ``dagster dev``
    stopped (see :func:`stop`)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "stop":
        print(f"mv_assets: {stop(args[1])}")
        return 0
    if len(args) != 3 or args[0] != "prepare":
        print("usage: python -m mv_assets.dagster.devserver prepare DAGSTER_HOME PORT | stop PID_FILE",
              file=sys.stderr)
        return 2
    home, port = args[1], int(args[2])
    try:
        prepare_home(home)
    except RuntimeError as exc:
        print(f"mv_assets: {exc}", file=sys.stderr)
        return 1
    if port_in_use(port):
        print(f"mv_assets: port {port} is already in use; pick another: make demo DEMO_PORT=...", file=sys.stderr)
        return 1
    cache_bytecode()
    return 0


if __name__ == "__main__":
    sys.exit(main())
