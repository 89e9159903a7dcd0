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

        def run(self, tasks, definition_raw, *, estimated_seconds=None):
            seen.append(estimated_seconds)
            return super().run(tasks, definition_raw)

    runner = Estimating()
    assert as_runner(runner) is runner  # the whole protocol: used as it is
    _, v = _catalog(tmp_path, runner)
    assert v.refresh().runner == "estimating"
    assert len(seen) == 1 and seen[0] > 0  # rows x the default cost per row before any was measured


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
