"""GPU columns under Spark's stage-level scheduling, without a GPU: a standalone
master and one worker on loopback (from the pyspark wheel) whose discovery
script announces two fake GPUs, "0" and "1". Tasks of a ``num_gpus=1`` column
get distinct addresses, never more at once than there are GPUs; ``num_gpus=0.5``
puts two tasks on one address; ``mv.current_device()`` names the task's GPU.
In local mode the hint is warned about and the tasks run as CPU tasks."""

import glob
import json
import os
import re
import stat
import time
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from spark_cluster import StandaloneCluster

import mv_assets as mv
from mv_assets.execution.spark import SparkRunner

pytestmark = pytest.mark.spark

SLEEP = 0.3  # each UDF call's length after it found its partner


def _recording_udf(log_dir: str, num_gpus: float, sleep: float = SLEEP, partner: str | None = None):
    """A stateful, batched GPU-style UDF: its set-up reads the device (where a
    model would be loaded), each call records device, pid and start/end times.
    ``partner``: each call first waits (at most 5 s) for another call to have
    started, on any device ("any") or on its own ("device"), so that tasks
    Spark runs at once are seen at once even when their start is staggered
    (Python workers starting on a busy machine)."""

    class Doubler:
        def __init__(self) -> None:
            self.device = mv.current_device()  # e.g. torch.load(...).to(self.device)

        def __call__(self, x: pa.Array) -> pa.Array:
            start, device = time.time(), mv.current_device()
            if partner:
                starts = os.path.join(log_dir, "starts")
                os.makedirs(starts, exist_ok=True)
                mine = f"{device}__{uuid.uuid4().hex}"
                open(os.path.join(starts, mine), "w").close()
                deadline = start + 5
                while time.time() < deadline and not any(
                        f != mine and (partner == "any" or f.startswith(f"{device}__")) for f in os.listdir(starts)):
                    time.sleep(0.02)
            time.sleep(sleep)
            record = {"device": device, "setup_device": self.device, "pid": os.getpid(),
                      "start": start, "end": time.time(), "rows": len(x)}
            with open(os.path.join(log_dir, f"{uuid.uuid4().hex}.json"), "w") as fh:
                json.dump(record, fh)
            return pc.multiply(x, 2)

    # A version of its own: a worker keeps stateful instances by fingerprint, and the code alone is the same for
    # every log_dir (the closure's values are not part of it)
    return mv.udf(Doubler, name="doubled", data_type=pa.int64(), num_gpus=num_gpus, version=log_dir)


def _records(log_dir: str) -> list[dict]:
    return [json.load(open(p)) for p in glob.glob(os.path.join(log_dir, "*.json"))]


def _refresh_one_gpu_view(db, tmp_path, caplog, **source_kw):
    """View ``v`` over a new source ``t`` with a one-GPU recording UDF column,
    refreshed in tasks of 5 rows with the runner's log captured: the result,
    the oracle and the UDF's call records."""
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    t, oracle = _source(db, "t", **source_kw)
    gpu_column = _recording_udf(str(log_dir), 1, partner="any")
    db.create_materialized_view("v", t.search(None).select({"id": "id", "y": gpu_column}))
    with caplog.at_level("INFO", logger="mv_assets.execution.spark"):
        r = db.open_table("v").refresh(max_rows_per_task=5)
    return r, oracle, _records(str(log_dir))


def _overlapping(records: list[dict]) -> list[tuple[dict, dict]]:
    return [(a, b) for i, a in enumerate(records) for b in records[i + 1:]
            if a["start"] < b["end"] and b["start"] < a["end"]]


def _most_at_once(records: list[dict]) -> int:
    return max(sum(1 for r in records if r["start"] <= a["start"] < r["end"]) for a in records)


def _source(db, name: str, fragments: int = 6, rows: int = 5):
    t = db.create_table(name, pa.table({"id": list(range(rows)), "x": list(range(rows))}))
    for f in range(1, fragments):
        ids = list(range(f * rows, (f + 1) * rows))
        t.add(pa.table({"id": ids, "x": ids}))
    return t, [(i, i * 2) for i in range(fragments * rows)]


def _rows(db, view: str) -> list[tuple[int, int]]:
    return sorted((r["id"], r["y"]) for r in db.open_table(view).to_arrow().to_pylist())


def test_local_mode_warns_and_runs_gpu_columns_as_cpu_tasks(spark_runner, tmp_path, monkeypatch):
    """(First in the module: the cluster's session replaces the local one after it.)"""
    monkeypatch.delenv("MV_ASSETS_DEVICE", raising=False)
    master = spark_runner.resolved_master()
    if not master.startswith("local"):
        pytest.skip(f"the suite's Spark is {master}, not local mode")
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    db = mv.connect(str(tmp_path / "cat"), runner=spark_runner)
    t, oracle = _source(db, "t", fragments=2)
    db.create_materialized_view("v", t.search(None).select({"id": "id", "y": _recording_udf(str(log_dir), 1, 0)}))
    said = (r"^view 'v': resource hints \{'y': \{'num_cpus': 1.0, 'num_gpus': 1.0, 'memory': None\}\} are not "
            r"scheduled: Spark local mode \(" + re.escape(master) + r"\) has no "
            r"resource profiles \(stage-level scheduling needs a standalone, Kubernetes or "
            r"YARN cluster\); its tasks run as CPU tasks, no GPU is reserved, and "
            r"mv.current_device\(\) is 'cpu'$")
    with pytest.warns(UserWarning, match=said):
        r = db.open_table("v").refresh(max_rows_per_task=5)
    assert r.runner == "spark" and r.tasks >= 2
    assert _rows(db, "v") == oracle
    records = _records(str(log_dir))
    assert records and {(x["device"], x["setup_device"]) for x in records} == {("cpu", "cpu")}


def _gpus_script(directory) -> str:
    path = os.path.join(str(directory), "gpus.sh")
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\necho '{\"name\": \"gpu\", \"addresses\": [\"0\", \"1\"]}'\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory, spark_runner):
    """A one-worker cluster with 4 cores and two fake GPUs."""
    spark_runner.stop()  # one SparkContext per process: the local one steps aside
    work = tmp_path_factory.mktemp("gpu_cluster")
    cluster = StandaloneCluster(str(work / "spark"), workers=1, cores=4, worker_conf={
        "spark.worker.resource.gpu.amount": "2", "spark.worker.resource.gpu.discoveryScript": _gpus_script(work)})
    try:
        yield cluster
    finally:
        cluster.stop()


# What an application on it asks for: one executor holding the worker's 4 cores and both GPUs.
EXECUTOR_CONF = {"spark.executor.memory": "512m", "spark.cores.max": "4", "spark.executor.cores": "4",
                 "spark.executor.resource.gpu.amount": "2"}


@pytest.fixture(scope="module")
def gpu_runner(gpu_cluster):
    runner = SparkRunner(master=gpu_cluster.master_url, driver_host="127.0.0.1", bind_address="127.0.0.1",
                         local_below_rows=0, resource_wait_seconds=90, conf=dict(EXECUTOR_CONF))
    try:
        yield runner
    finally:
        runner.stop()


def test_one_gpu_per_task_distinct_addresses_never_more_than_the_gpus(gpu_runner, tmp_path, caplog):
    db = mv.connect(str(tmp_path / "cat"), runner=gpu_runner)
    r, oracle, records = _refresh_one_gpu_view(db, tmp_path, caplog)
    assert f"view 'v': tasks scheduled on {gpu_runner.master} with a task resource profile: 1 CPU(s) and 1 GPU(s) " \
           "each" in caplog.messages
    assert r.runner == "spark" and r.tasks == 6
    assert _rows(db, "v") == oracle  # the plain-Python oracle: y = 2x
    assert len(records) == 6 and sum(x["rows"] for x in records) == 30
    assert {x["device"] for x in records} == {"cuda:0", "cuda:1"}  # every task had a GPU, both were used
    assert all(x["setup_device"] == x["device"] for x in records)  # set-up ran on the task's GPU
    assert os.getpid() not in {x["pid"] for x in records}
    overlapping = _overlapping(records)
    assert overlapping  # 4 cores: two tasks did run at once...
    assert all(a["device"] != b["device"] for a, b in overlapping)  # ...each on its own GPU
    assert _most_at_once(records) <= 2  # never more tasks than GPUs, with cores to spare

    # A backfill of a GPU column runs under the profile too.
    backfill_log = tmp_path / "backfill"
    backfill_log.mkdir()
    t = db.open_table("t")
    t.add_columns({"z": _recording_udf(str(backfill_log), 1, 0)})
    assert t.backfill("z").rows_written == 30
    assert {x["device"] for x in _records(str(backfill_log))} <= {"cuda:0", "cuda:1"}
    assert sorted((row["id"], row["z"]) for row in t.to_arrow().to_pylist()) == oracle


def test_half_a_gpu_puts_two_tasks_on_one_address(gpu_runner, tmp_path):
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    db = mv.connect(str(tmp_path / "cat"), runner=gpu_runner)
    t, oracle = _source(db, "t", fragments=4)
    half_gpu_column = _recording_udf(str(log_dir), 0.5, partner="device")
    db.create_materialized_view("v", t.search(None).select({"id": "id", "y": half_gpu_column}))
    r = db.open_table("v").refresh(max_rows_per_task=5)
    assert r.tasks == 4 and _rows(db, "v") == oracle
    records = _records(str(log_dir))
    assert {x["device"] for x in records} <= {"cuda:0", "cuda:1"} and len(records) == 4
    assert any(a["device"] == b["device"] for a, b in _overlapping(records))  # two tasks shared a GPU at once
    for device in ("cuda:0", "cuda:1"):  # never more than two on one
        on_it = [x for x in records if x["device"] == device]
        assert not on_it or _most_at_once(on_it) <= 2


def test_more_gpus_than_any_executor_has_fail_before_running(gpu_runner, tmp_path):
    """Spark would wait forever for an executor with 3 GPUs: the refresh says so instead, the lock is released."""
    db = mv.connect(str(tmp_path / "cat"), runner=gpu_runner)
    t, oracle = _source(db, "t", fragments=1)
    db.create_materialized_view("v", t.search(None).select({"id": "id", "y": _recording_udf(str(tmp_path), 3, 0)}))
    with pytest.raises(RuntimeError, match=r"^view 'v': each task asks for 1 CPU\(s\) and 3 GPU\(s\) .* but no executor "
                                           r"of spark://127.0.0.1:\d+ has them \(executor 0: 4 core\(s\), 2 GPU\(s\)\)"):
        db.open_table("v").refresh()
    with pytest.warns(UserWarning, match=r"^view 'v': resource hints .* are not scheduled: the inline runner"):
        db.open_table("v").refresh(runner=mv.InlineRunner(), lock_timeout=1)  # the lock was released
    assert _rows(db, "v") == oracle


def test_spark_connect_on_the_cluster_schedules_the_profile_too(gpu_cluster, gpu_runner, tmp_path, caplog,
                                                                monkeypatch):
    """(Last in the module: the classic session steps aside, its executor's cores go to the Connect server's.)"""
    from mv_assets.dagster.devserver import free_port
    from mv_assets.execution import connect_server

    # pyspark marks the process as a Connect client for good (then no classic session starts): undone after the test
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    gpu_runner.stop()
    state = str(tmp_path / "connect")
    url = connect_server.start(port=free_port(), master=gpu_cluster.master_url, state_dir=state,
                               conf={**EXECUTOR_CONF, "spark.driver.host": "127.0.0.1"})
    try:
        runner = SparkRunner(remote=url, local_below_rows=0)
        db = mv.connect(str(tmp_path / "cat"), runner=runner)
        r, oracle, records = _refresh_one_gpu_view(db, tmp_path, caplog, fragments=4)
        assert f"view 'v': tasks scheduled on {gpu_cluster.master_url} with a task resource profile: 1 CPU(s) and " \
               "1 GPU(s) each" in caplog.messages
        assert r.tasks == 4 and _rows(db, "v") == oracle
        assert len(records) == 4 and {x["device"] for x in records} == {"cuda:0", "cuda:1"}
        assert _overlapping(records) and all(a["device"] != b["device"] for a, b in _overlapping(records))
        runner.stop()
    finally:
        connect_server.stop(state)
