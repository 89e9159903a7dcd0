"""A Spark task that runs several refresh tasks at once on threads of its
Python worker, sharing the worker's model (``SparkRunner(task_threads=k)``,
``$MV_ASSETS_SPARK_TASK_THREADS``): with ``num_gpus=1``, one model per GPU fed
by k threads that decode, compute and write, instead of one.

On real Spark (local[2]): the values equal the oracle, each worker set its
model up once and ran calls on several threads at the same time, results come
back in the tasks' order, a failure on any thread is raised as it is with one,
and a bad setting is refused before anything starts."""

import os
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tables import fragmented

import mv_assets as mv
from mv_assets.execution.spark import SparkRunner


def _runner(spark_runner: SparkRunner, threads: int) -> SparkRunner:
    spark_runner.session()  # the suite's session: this runner uses it (one SparkContext a process)
    return SparkRunner(master=spark_runner.master, local_below_rows=0, task_threads=threads)


def _source(db, fragments: int, rows: int):
    return fragmented(db, fragments, rows, seed=11)


def test_a_spark_task_runs_its_refresh_tasks_at_once_on_threads_sharing_one_model(tmp_path, spark_runner, call_log):
    runner = _runner(spark_runner, 2)
    assert runner.parallelism() == 2 * spark_runner.parallelism()  # planning makes twice the tasks
    db = mv.connect(str(tmp_path / "catalog"), runner=runner)
    src = _source(db, fragments=8, rows=500)

    @mv.udf(data_type=pa.float64(), batch_size=250, version="task-threads")
    class Model:
        def __init__(self) -> None:
            open(os.path.join(call_log, f"setup-{os.getpid()}-{time.time_ns()}"), "w").close()

        def __call__(self, x: pa.Array) -> pa.Array:
            t0 = time.time()
            time.sleep(0.15)
            name = f"call-{os.getpid()}-{threading.get_ident()}-{t0!r}-{time.time()!r}"
            open(os.path.join(call_log, name), "w").close()
            return pc.multiply(x, 2.0)

    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": Model}))
    result = view.refresh()
    assert result.runner == "spark" and result.tasks >= 4, result
    got = view.to_arrow().sort_by("id")
    want = src.to_arrow().sort_by("id")
    assert got.column("id").equals(want.column("id"))
    assert got.column("y").to_pylist() == [x * 2.0 for x in want.column("x").to_pylist()]

    names = os.listdir(call_log)
    setups = [int(n.split("-")[1]) for n in names if n.startswith("setup-")]
    calls = [n.split("-") for n in names if n.startswith("call-")]
    assert len(calls) >= 8 * 2  # batches of at most 250 rows
    assert sorted(setups) == sorted(set(setups))  # one model per worker process, shared by its threads
    overlapped = set()
    for pid in {int(c[1]) for c in calls}:
        spans = [(float(c[3]), float(c[4]), c[2]) for c in calls if int(c[1]) == pid]
        overlapped |= {pid for a in spans for b in spans if a[2] != b[2] and a[0] < b[1] and b[0] < a[1]}
    assert overlapped, "no worker ran calls on two threads at once"


def test_results_come_back_in_the_tasks_order():
    runner = SparkRunner(master="local[2]", local_below_rows=0, task_threads=3)
    try:
        payloads = [f"x = {i}" for i in range(7)]  # Spark tasks of 3, 3 and 1
        assert runner.map("mv_assets.execution.tasks:and_filters", payloads, None) == payloads  # type: ignore[arg-type]
    finally:
        runner.stop()


def test_a_failure_on_one_thread_is_raised_as_with_one_thread_and_nothing_is_committed(tmp_path, spark_runner):
    runner = _runner(spark_runner, 2)
    db = mv.connect(str(tmp_path / "catalog"), runner=runner)
    src = _source(db, fragments=4, rows=200)

    @mv.udf(data_type=pa.float64(), version="task-threads-fail")
    def boom(id: int, x: float) -> float:
        if id == 650:
            raise RuntimeError("bad row")
        return x

    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": boom}))
    with pytest.raises(mv.UdfError, match="bad row") as err:
        view.refresh()
    assert "source row id" in str(err.value)
    assert view.count_rows() == 0


def test_a_started_session_is_asked_its_parallelism_at_most_every_ten_seconds(spark_runner):
    """Every refresh asks how many tasks run at once; asking the JVM is a py4j
    round trip (~1 ms, a tenth of a small refresh), so the answer is held on
    the SparkContext for ten seconds, then asked again."""
    import time

    from mv_assets.execution import spark

    sc = spark_runner.session().sparkContext
    sc.__dict__.pop("_mv_assets_parallelism", None)
    assert spark_runner.parallelism() == sc.defaultParallelism
    held_at, n = sc._mv_assets_parallelism
    assert n == sc.defaultParallelism and time.monotonic() - held_at < spark._PARALLELISM_SECONDS
    sc._mv_assets_parallelism = (time.monotonic(), n + 5)  # held: not asked again
    assert spark_runner.parallelism() == n + 5
    sc._mv_assets_parallelism = (time.monotonic() - spark._PARALLELISM_SECONDS - 1, n + 5)  # too old: asked
    assert spark_runner.parallelism() == n
    sc.__dict__.pop("_mv_assets_parallelism", None)


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_a_bad_thread_count_is_refused_before_spark_starts(monkeypatch, bad):
    monkeypatch.setenv("MV_ASSETS_SPARK_TASK_THREADS", bad)
    runner = SparkRunner(master="local[2]")
    with pytest.raises(ValueError, match="MV_ASSETS_SPARK_TASK_THREADS"):
        runner.parallelism()
    assert not runner.started
    monkeypatch.delenv("MV_ASSETS_SPARK_TASK_THREADS")
    assert SparkRunner(master="local[2]").parallelism() == 2
    assert SparkRunner(master="local[2]", task_threads=4).parallelism() == 8


@pytest.mark.parametrize("bad", [2.7, 0, True, "3x"])
def test_a_bad_task_threads_argument_is_refused_not_rounded(bad):
    runner = SparkRunner(master="local[2]", task_threads=bad)
    with pytest.raises(ValueError, match="task_threads"):
        runner.parallelism()
    assert not runner.started
    assert SparkRunner(master="local[2]", task_threads=3.0).parallelism() == 6  # a whole float is a count


_CONNECT_CLIENT = """
import json, sys
from mv_assets.execution.spark import SparkRunner
runner = SparkRunner(remote=sys.argv[1], local_below_rows=0, task_threads=3)
payloads = [f"x = {i}" for i in range(7)]
print(json.dumps(runner.map("mv_assets.execution.tasks:and_filters", payloads, None)))
"""


def test_on_spark_connect_a_partitions_tasks_run_on_threads_in_order(tmp_path):
    """Spark Connect's path (mapInArrow, a partition's task ids in one call),
    in a client process of its own (pyspark marks a process as a Connect
    client for good)."""
    import json
    import subprocess
    import sys

    from mv_assets.dagster.devserver import free_port
    from mv_assets.execution import connect_server

    state = str(tmp_path / "connect")
    url = connect_server.start(port=free_port(), master="local[2]", state_dir=state)
    try:
        script = tmp_path / "client.py"
        script.write_text(_CONNECT_CLIENT)
        out = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "SPARK_CONNECT_MODE_ENABLED": "1"})
    finally:
        connect_server.stop(state)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [f"x = {i}" for i in range(7)]
