"""The runner protocol says everything ops asks of a runner (run with the work's
estimated cost, map, parallelism, where the last run ran); a runner written for
the older protocol (run(tasks, definition_raw) and map only) still works."""

import threading

import pytest

import mv_assets as mv
from mv_assets.execution.spark import InlineRunner, SparkRunner, as_runner
from mv_assets.execution.tasks import run_task


@mv.udf
def plus(x: float) -> float:
    return x + 1.0


def _catalog(tmp_path, runner):
    db = mv.connect(str(tmp_path), runner=runner)
    t = db.create_table("t", [{"id": i, "x": float(i)} for i in range(10)])
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": plus}))
    return t, v


class OlderRunner:
    """A runner of the older protocol: no estimate, no parallelism, no description of its runs."""

    name = "older"

    def __init__(self):
        self.runs = 0

    def run(self, tasks, definition_raw):
        self.runs += 1
        return [run_task(t, definition_raw) for t in tasks]

    def map(self, func_ref, payloads, shared, rows=0):
        return InlineRunner().map(func_ref, payloads, shared, rows)


def test_a_runner_of_the_older_protocol_refreshes_and_backfills(tmp_path):
    runner = OlderRunner()
    t, v = _catalog(tmp_path, runner)
    r = v.refresh()
    assert runner.runs == 1 and r.runner == "older" and r.udf_rows_computed == {"y": 10}
    t.add_columns({"z": plus})
    assert t.plan_backfill("z").tasks == 1  # one task at a time, as far as planning knows
    assert t.backfill("z").rows_written == 10
    adapted = as_runner(runner)
    assert adapted.parallelism() == 1 and adapted.describe_last_run() == "older" and as_runner(adapted) is adapted


def test_a_subclass_overriding_run_without_the_estimate_still_runs(tmp_path):
    class Counting(InlineRunner):
        def run(self, tasks, definition_raw):
            self.tasks = len(tasks)
            return super().run(tasks, definition_raw)

    runner = Counting()
    _, v = _catalog(tmp_path, runner)
    r = v.refresh()
    assert runner.tasks == r.tasks == 1 and r.runner == "inline"


def test_a_runner_is_given_the_refresh_estimate_and_names_its_runs(tmp_path):
    seen = []

    class Estimating(InlineRunner):
        name = "estimating"

        def run(self, tasks, definition_raw, *, estimated_seconds=None, resources=None):
            seen.append(estimated_seconds)
            return super().run(tasks, definition_raw)

    runner = Estimating()
    assert as_runner(runner) is runner  # the whole protocol: used as it is
    _, v = _catalog(tmp_path, runner)
    assert v.refresh().runner == "estimating"
    assert len(seen) == 1 and seen[0] > 0  # rows x the default cost per row before any was measured


@mv.udf(num_gpus=0.5, memory=1 << 20)
def on_half_a_gpu(x: float) -> float:
    return x * 2


@mv.udf(num_cpus=3)
def on_three_cores(x: float) -> float:
    return x * 3


def test_a_runner_is_asked_for_the_most_the_views_columns_ask(tmp_path):
    """Each task computes all the view's UDF columns: the request is the largest hint of each kind."""
    seen = []

    class Scheduling(InlineRunner):
        def run(self, tasks, definition_raw, *, estimated_seconds=None, resources=None):
            seen.append(resources)
            return super().run(tasks, definition_raw)

    db = mv.connect(str(tmp_path), runner=Scheduling())
    t = db.create_table("t", [{"id": i, "x": float(i)} for i in range(4)])
    db.create_materialized_view("v", t.search(None).select(
        {"id": "id", "y": plus, "g": on_half_a_gpu, "c": on_three_cores}))
    db.create_materialized_view("w", t.search(None).select({"id": "id", "y": plus}))
    db.refresh("v")
    db.refresh("w")
    request, none = seen
    assert none is None  # no hints: nothing asked
    assert (request.label, request.num_cpus, request.num_gpus, request.memory, request.task_cpus) == \
        ("view 'v'", 3.0, 0.5, 1 << 20, 3)
    assert request.hints_dict() == {"g": {"num_cpus": 1.0, "num_gpus": 0.5, "memory": 1 << 20},
                                    "c": {"num_cpus": 3.0, "num_gpus": 0.0, "memory": None}}


def test_a_runner_without_resource_requests_is_warned_about_and_runs(tmp_path):
    """A runner written before resource requests (run with the estimate, map without requests) keeps working: the
    hints are said unscheduled, by the runner's name, for refreshes and backfills alike."""

    class Estimating(InlineRunner):
        name = "estimating"

        def run(self, tasks, definition_raw, *, estimated_seconds=None):
            return super().run(tasks, definition_raw)

        def map(self, func_ref, payloads, shared, rows=0):
            return super().map(func_ref, payloads, shared, rows)

    runner = Estimating()
    assert as_runner(runner) is not runner
    db = mv.connect(str(tmp_path), runner=runner)
    t = db.create_table("t", [{"id": i, "x": float(i)} for i in range(4)])
    db.create_materialized_view("v", t.search(None).select({"id": "id", "g": on_half_a_gpu}))
    said = r"are not scheduled: runner 'estimating' takes no resource requests \(Runner protocol: run/map\(\.\.\., " \
           r"resources=\)\); its tasks run as CPU tasks, no GPU is reserved, and mv.current_device\(\) is 'cpu'$"
    with pytest.warns(UserWarning, match=r"^view 'v': resource hints \{'g': .*\} " + said):
        assert db.refresh("v").udf_rows_computed == {"g": 4}
    t.add_columns({"z": on_half_a_gpu})
    with pytest.warns(UserWarning, match=r"^backfill of 't': resource hints \{'z': .*\} " + said):
        assert t.backfill("z").rows_written == 4


def test_current_device_is_the_tasks_gpu_else_the_override_else_cpu(monkeypatch):
    """Inside a Spark task holding a GPU: cuda:<its address>; a worker that moves to a task on another GPU makes
    stateful UDF instances anew (their set-up placed them on the old one)."""
    import types

    import pyspark

    from mv_assets.execution.resources import spark_task_device
    from mv_assets.model.udf import UDF

    monkeypatch.delenv("MV_ASSETS_DEVICE", raising=False)
    assert mv.current_device() == "cpu"
    monkeypatch.setenv("MV_ASSETS_DEVICE", "cuda:7")
    assert mv.current_device() == "cuda:7"

    class Task:
        def __init__(self, addresses):
            self.addresses = addresses

        def resources(self):
            return {"gpu": types.SimpleNamespace(name="gpu", addresses=self.addresses)} if self.addresses else {}

    task = Task(["1"])
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: task))
    with spark_task_device() as device:
        assert device == mv.current_device() == "cuda:1"
        UDF._instances["model"] = object()
    assert mv.current_device() == "cuda:7"  # after the task: the override again
    with spark_task_device():  # the same GPU: the instances stay
        assert "model" in UDF._instances
    task.addresses = ["0"]
    with spark_task_device():  # another GPU: made anew
        assert mv.current_device() == "cuda:0" and "model" not in UDF._instances
    task.addresses = []
    with spark_task_device() as device:  # a task without a GPU: the override
        assert device is None and mv.current_device() == "cuda:7"


def _echo(payload: str, shared: bytes) -> str:
    return payload + shared.decode()


def test_where_a_spark_runner_last_ran_is_per_thread():
    """Small work runs on the driver (no JVM here); another thread's last run is its own."""
    runner = SparkRunner(local_below_rows=100)
    assert runner.map("test_runner_protocol:_echo", ["1"], b"!", rows=1) == ["1!"] and not runner.started
    assert runner.describe_last_run() == "spark-driver-local"
    other = []
    thread = threading.Thread(target=lambda: other.append(runner.describe_last_run()))
    thread.start()
    thread.join()
    assert other == ["spark"]


def test_an_object_without_run_or_map_is_no_runner():
    with pytest.raises(TypeError, match="a runner needs run\\(\\) and map\\(\\): object has no run\\(\\)"):
        as_runner(object())


def test_the_zips_shipped_to_executors_are_removed_when_the_process_exits(tmp_path):
    """Each Dagster run is a process of its own: a zip of mv_assets or of a
    configured py_files folder made for its executors must not outlive it (it
    did: one temp directory of ~1.7 MB per process, left in the temp directory)."""
    import os
    import subprocess
    import sys

    pkg = tmp_path / "deps" / "scoring"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    code = (
        "import os, sys\n"
        "from mv_assets.execution.spark import _package_zip, _zip_folder\n"
        "made = [_zip_folder(sys.argv[1]), _package_zip()]\n"
        "assert all(os.path.getsize(p) > 0 for p in made)\n"
        "print('\\n'.join(made))\n"
    )
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    out = subprocess.run([sys.executable, "-c", code, str(pkg)], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert len(out) == 2 and all(p.startswith(str(tmp_path / "tmp")) for p in out)
    assert not any(os.path.exists(os.path.dirname(p)) for p in out)
    assert os.listdir(tmp_path / "tmp") == []
