"""Spark's Python workers, and the models their UDFs set up, outlive Spark's
one-minute idle limit (mv_assets.execution.daemon).

The executor closes every idle Python worker once it has started none for a
minute; a worker whose socket is closed used to exit, so every refresh more
than a minute after the last one set every model up again. The daemon parks
such a worker and hands it the executor's next connection.

The protocol tests speak to the daemon as an executor does (over a Unix
socket: a connection, the worker's pid back; the daemon's stdin to kill a
worker or, closed, to stop it), without a JVM. The last test runs refreshes
on real Spark a minute and more apart.
"""

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import mv_assets as mv
from mv_assets.execution import daemon
from mv_assets.execution.spark import SparkRunner


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is not alive
        return fh.read().split(")")[-1].split()[0] != "Z"


def _wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


class Executor:
    """What an executor does with a daemon: start it, open connections (each
    answered by a worker's pid), close them, ask for a kill, stop it."""

    def __init__(self, keep_s: float | str, extra_env: dict | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="mvd", dir="/tmp")  # a Unix socket path is short
        env = dict(os.environ, SPARK_REUSE_WORKER="1", PYTHON_UNIX_DOMAIN_ENABLED="true",
                   PYTHON_WORKER_FACTORY_SOCK_DIR=self.dir, **{daemon.KEEP_ENV: str(keep_s)}, **(extra_env or {}))
        self.proc = subprocess.Popen([sys.executable, "-m", daemon.MODULE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert self.proc.stdout is not None
        (length,) = struct.unpack(">i", self.proc.stdout.read(4))
        self.path = self.proc.stdout.read(length).decode()
        self.pids: set[int] = set()

    def connect(self) -> tuple[socket.socket, int]:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        conn.settimeout(10)
        data = b""
        while len(data) < 4:
            chunk = conn.recv(4 - len(data))
            assert chunk, "the daemon closed the connection without a worker"
            data += chunk
        (pid,) = struct.unpack(">i", data)
        self.pids.add(pid)
        return conn, pid

    def kill(self, pid: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(struct.pack(">i", pid))
        self.proc.stdin.flush()

    def stop(self) -> None:
        """As an executor stopping: close the daemon's stdin, wait for it."""
        try:
            if self.proc.poll() is None:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for pid in self.pids:  # no worker left behind, parked or not
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def executor():
    made: list[Executor] = []

    def make(keep_s: float | str = 60, **env) -> Executor:
        made.append(Executor(keep_s, env))
        return made[-1]

    yield make
    for e in made:
        pids = set(e.pids)
        e.stop()
        assert not [p for p in pids if _alive(p)]


def _next_worker_is_fresh(e: Executor, gone: int) -> None:
    """The worker ``gone`` exits, and the next connection gets another."""
    _wait_until(lambda: not _alive(gone), timeout=20)  # (an exit, not a speed: a loaded 2-core machine took over 5 s once)
    conn, pid = e.connect()
    assert pid != gone
    conn.close()


def _parked_soon() -> None:
    time.sleep(1.0)  # the closed worker tells the daemon it is free (microseconds; a margin for a loaded machine)


def test_the_daemon_module_imports_nothing_that_starts_threads():
    """A process that forks must run no other thread (pyarrow, numpy and lance
    start some on import): importing the daemon module, and so the
    ``mv_assets`` package, imports none of them."""
    probe = ("import json, os, sys; import mv_assets.execution.daemon; "
             "print(json.dumps([len(os.listdir('/proc/self/task')), "
             "sorted(m for m in ('pyarrow', 'numpy', 'lance', 'pandas', 'pyspark.sql') if m in sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [1, []]
    # the package's names still resolve, on first use
    names = ("import mv_assets as mv; [getattr(mv, n) for n in mv.__all__]; "
             "print(mv.connect.__module__, mv.UDF.__name__, mv.progress.__name__, "
             "sorted(set(mv.__all__) - set(dir(mv))))")
    out = subprocess.run([sys.executable, "-c", names], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["mv_assets.api.catalog", "UDF", "mv_assets.api.progress", "[]"]


def test_a_worker_the_executor_lets_go_serves_its_next_connection(executor):
    e = executor(keep_s=60)
    conn, first = e.connect()
    conn.close()  # the executor's idle limit
    _parked_soon()
    assert _alive(first)
    conn, again = e.connect()
    assert again == first
    conn.close()


def test_a_parked_worker_gives_back_the_device_memory_its_framework_caches(executor, tmp_path):
    """torch's CUDA caching allocator keeps the last batches' blocks; a
    worker being parked empties it (``torch.cuda.empty_cache()``), keeping its
    model. Neither torch nor a GPU is on this machine: a stand-in ``torch``
    module, imported before the daemon forks, records the calls."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(
        "import os, types\n"
        "def _empty():\n"
        "    open(os.path.join(os.environ['STAND_IN_LOG'], str(os.getpid())), 'a').write('empty_cache\\n')\n"
        "cuda = types.SimpleNamespace(is_initialized=lambda: True, empty_cache=_empty)\n")
    (site / "sitecustomize.py").write_text("import torch  # noqa: F401\n")
    log = tmp_path / "log"
    log.mkdir()
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    e = executor(keep_s=60, PYTHONPATH=path, STAND_IN_LOG=str(log))
    conn, first = e.connect()
    assert not os.listdir(log)  # a busy worker keeps its caches
    conn.close()
    _parked_soon()
    assert (log / str(first)).read_text() == "empty_cache\n"
    conn, again = e.connect()
    assert again == first  # parked, then handed the next connection
    conn.close()


def test_parked_workers_serve_concurrent_connections_newest_first_then_fresh_ones(executor):
    e = executor(keep_s=60)
    (a, pa_), (b, pb) = e.connect(), e.connect()
    assert pa_ != pb
    a.close()
    _parked_soon()
    b.close()
    _parked_soon()
    (c, pc_), (d, pd), (f, pf) = e.connect(), e.connect(), e.connect()
    assert (pc_, pd) == (pb, pa_)  # the most recently parked first
    assert pf not in (pa_, pb)  # none parked: a fresh worker
    for s in (c, d, f):
        s.close()


def test_a_parked_worker_exits_after_the_keep_time(executor):
    e = executor(keep_s=1)
    conn, first = e.connect()
    conn.close()
    _parked_soon()
    assert _alive(first)
    _next_worker_is_fresh(e, first)


@pytest.mark.parametrize("keep", ["0", "not a number"])
def test_with_no_keep_time_a_worker_exits_as_sparks_own_do(executor, keep):
    e = executor(keep_s=keep)
    conn, first = e.connect()
    conn.close()
    _next_worker_is_fresh(e, first)


def test_a_worker_whose_task_failed_exits_and_is_not_handed_out(executor):
    """pyspark's worker reads a task's split index first; -1 makes it exit
    with an error (its own hook): a failed task. That worker is not parked."""
    e = executor(keep_s=60)
    conn, first = e.connect()
    conn.sendall(struct.pack(">i", -1))
    time.sleep(0.3)
    conn.close()
    _next_worker_is_fresh(e, first)


def test_a_worker_the_executor_kills_is_not_handed_out(executor):
    e = executor(keep_s=60)
    conn, first = e.connect()
    e.kill(first)
    _wait_until(lambda: not _alive(first))
    conn.close()
    _next_worker_is_fresh(e, first)


def test_stopping_the_daemon_stops_its_workers_parked_or_busy(executor):
    e = executor(keep_s=60)
    (busy, p1), (idle, p2) = e.connect(), e.connect()
    idle.close()
    _parked_soon()
    assert _alive(p1) and _alive(p2)
    e.stop()
    _wait_until(lambda: not _alive(p1) and not _alive(p2))
    busy.close()


def test_a_bad_keep_time_is_refused_before_a_session_starts(monkeypatch):
    monkeypatch.setenv(daemon.KEEP_ENV, "-5")
    with pytest.raises(ValueError, match="MV_ASSETS_PYTHON_WORKER_KEEP_S"):
        SparkRunner(master="local[1]").resolved_keep_workers_seconds()
    monkeypatch.setenv(daemon.KEEP_ENV, "soon")
    with pytest.raises(ValueError, match="a number of seconds"):
        SparkRunner(master="local[1]").resolved_keep_workers_seconds()
    monkeypatch.delenv(daemon.KEEP_ENV)
    assert SparkRunner(master="local[1]").resolved_keep_workers_seconds() == daemon.DEFAULT_KEEP_S
    assert SparkRunner(master="spark://h:7077").resolved_keep_workers_seconds() is None  # a cluster: only when asked
    assert SparkRunner(master="spark://h:7077", keep_workers_seconds=60).resolved_keep_workers_seconds() == 60
    assert SparkRunner(master="local[1]", keep_workers_seconds=0).resolved_keep_workers_seconds() is None


SETUP_LOG = "MV_ASSETS_TEST_SETUP_LOG"


@mv.udf(data_type=pa.float64(), batch_size=1024, version="kept-model")
class KeptModel:
    """A model column: each set-up and each batch logs the process's pid."""

    def __init__(self) -> None:
        with open(os.path.join(os.environ[SETUP_LOG], f"setup-{os.getpid()}-{time.time_ns()}"), "w"):
            pass

    def __call__(self, x: pa.Array) -> pa.Array:
        with open(os.path.join(os.environ[SETUP_LOG], f"call-{os.getpid()}"), "a"):
            pass
        time.sleep(0.2)  # the two tasks of a refresh overlap, so each runs in a worker of its own
        return pc.multiply(x, 2.0)


def _log(d: str) -> tuple[list[int], set[int]]:
    names = os.listdir(d)
    setups = [int(n.split("-")[1]) for n in names if n.startswith("setup-")]
    calls = {int(n.split("-")[1]) for n in names if n.startswith("call-")}
    for n in names:
        if n.startswith("call-"):
            os.remove(os.path.join(d, n))
    return setups, calls


def test_a_refresh_more_than_a_minute_after_the_last_finds_its_models_set_up(tmp_path, spark_runner, monkeypatch):
    """Real Spark, refreshes 80 s apart: past the executor's one-minute idle
    limit, the second refresh's tasks run in the workers that set the model up
    in the first one (their pids), and set nothing up again."""
    log = tmp_path / "log"
    log.mkdir()
    monkeypatch.setenv(SETUP_LOG, str(log))
    spark_runner.stop()  # one SparkContext a process: this test's own, whose executors have the variable
    runner = SparkRunner(master="local[2]", local_below_rows=0, forward_env=[SETUP_LOG])
    try:
        db = mv.connect(str(tmp_path / "catalog"), runner=runner)
        rng = np.random.default_rng(3)

        def rows(start: int) -> pa.Table:
            return pa.table({"id": np.arange(start, start + 2000), "x": rng.random(2000)})

        src = db.create_table("src", rows(0))
        src.add(rows(2000))  # two fragments: two tasks
        view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": KeptModel}))
        view.refresh()
        setups, first_workers = _log(str(log))
        assert len(first_workers) == 2 and sorted(set(setups)) == sorted(first_workers), (setups, first_workers)
        time.sleep(80)  # the executor closes idle Python workers after a minute (checked every 10 s)
        src.add(rows(4000))
        src.add(rows(6000))
        view.refresh()
        setups_after, second_workers = _log(str(log))
        assert second_workers and second_workers <= first_workers, (first_workers, second_workers)
        assert sorted(setups_after) == sorted(setups)  # no model set up again
        got = view.to_arrow().sort_by("id")
        want = src.to_arrow().sort_by("id")
        assert got.column("id").equals(want.column("id"))
        assert got.column("y").to_pylist() == [x * 2.0 for x in want.column("x").to_pylist()]
    finally:
        runner.stop()


def test_a_python_that_cannot_import_the_daemon_keeps_sparks_own(tmp_path, monkeypatch, caplog):
    """The executors of a local master run $PYSPARK_PYTHON (the Connect
    server's, its own interpreter): one without mv_assets would fail every
    task with the daemon set, so the session and the server leave Spark's
    daemon in place (one decision, ``daemon.settings_for``, for both) and the
    log says why."""
    monkeypatch.chdir(tmp_path)  # as `python -m`, the probe looks in the working directory too
    monkeypatch.delenv("PYTHONPATH", raising=False)
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    assert daemon.importable(sys.executable)
    assert not daemon.importable(str(bare / "bin" / "python"))
    assert not daemon.importable(str(tmp_path / "no-such-python"))
    bare_python = str(bare / "bin" / "python")
    with caplog.at_level("WARNING", logger="mv_assets.execution.daemon"):
        assert daemon.settings_for(900, True, bare_python) == {}
    assert f"the executors' Python {bare_python} cannot import mv_assets.execution.daemon" in caplog.text
    caplog.clear()
    assert daemon.settings_for(900, True, sys.executable) == daemon.spark_settings(900)
    assert daemon.settings_for(0, True, sys.executable) == {}
    assert daemon.settings_for(900, False, bare_python) == daemon.spark_settings(900)  # a cluster's are not here
    assert not caplog.text
