"""Progress of long refreshes and backfills while they run (mv_assets.progress):
rows done of planned, rate, time left, rows from checkpoints; reported by one
clock thread per process at a steady interval, and nothing for short work."""

import logging
import subprocess
import sys
import threading
import time

import pytest

import mv_assets as mv
from mv_assets import progress
from mv_assets.execution import progress as stages


@mv.udf
def slow(x: int) -> int:
    time.sleep(0.002)
    return x + 1


_REPORTS: list[progress.Progress] = []
_SEEN = threading.Condition()


@mv.udf
def gated(x: int) -> int:
    """At the first row of each slice of 25, wait for the clock to have reported the slices before it."""
    if x and x % 25 == 0:  # (UDFs are pickled by value: the gate is looked up in this module when called)
        here = sys.modules["test_progress"]
        with here._SEEN:
            assert here._SEEN.wait_for(lambda: any(p.rows_done >= x for p in here._REPORTS), timeout=60), x
    return x + 1


def _view(tmp_path, n=200, fragments=1):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    per = n // fragments
    src = db.create_table("src", [{"id": i, "x": i} for i in range(per)], primary_key="id")
    for f in range(1, fragments):
        src.add([{"id": i, "x": i} for i in range(f * per, (f + 1) * per)])
    return db, db.create_materialized_view("v", src.search(None).select({"id": "id", "y": slow}))


def test_a_long_refresh_reports_rows_done_of_planned_while_it_runs(tmp_path):
    """One task of 200 rows computed in slices of 25 (checkpoints): the clock
    reports while it runs, as slices finish, and once when it is done. No
    timing is assumed: the UDF waits, at the start of each slice, for the
    clock to have reported the rows of the slices before it (a report can
    come at any moment, also after the last slice and before the commit)."""
    reports = _REPORTS
    reports.clear()

    def record(p: progress.Progress) -> None:
        with _SEEN:
            reports.append(p)
            _SEEN.notify_all()

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(200)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": gated}))
    with progress.listen(record, every=0.01):
        r = view.refresh(checkpoint_size=25)
    assert r.udf_rows_computed == {"y": 200}
    running, last = reports[:-1], reports[-1]
    assert all(p.rows_planned == 200 and not p.done and p.stage == "computing" for p in running)
    done = [p.rows_done for p in running]
    assert done == sorted(done) and done[-1] <= 200  # never backwards, never past the plan
    assert {25 * k for k in range(1, 8)} <= set(done)  # it moved while it ran, slice by slice
    assert (last.done, last.rows_done, last.rows_resumed) == (True, 200, 0)
    assert last.rate > 0 and last.seconds_left == 0
    assert str(last).startswith("computing: 200 of 200 rows (100%) in ")


def test_a_resumed_refresh_says_how_many_rows_came_from_checkpoints(tmp_path):
    db, view = _view(tmp_path, n=40, fragments=4)

    class CrashAfter(mv.InlineRunner):
        def run(self, tasks, definition_raw):
            from mv_assets.execution.tasks import run_task

            for task in tasks[:2]:
                run_task(task, definition_raw)
            raise RuntimeError("driver died")

    with pytest.raises(RuntimeError, match="driver died"):
        view.refresh(runner=CrashAfter(), max_rows_per_task=10)
    reports: list[progress.Progress] = []
    with progress.listen(reports.append, every=0.01):
        r = view.refresh(max_rows_per_task=10)
    assert (r.tasks, r.tasks_resumed) == (4, 2)
    assert reports and reports[-1].done
    assert (reports[-1].rows_done, reports[-1].rows_planned, reports[-1].rows_resumed) == (40, 40, 20)
    assert "; 20 rows from checkpoints" in str(reports[-1])


def test_a_backfill_reports_its_progress_and_the_logging_hook(tmp_path, monkeypatch, caplog):
    """Without a listener, progress goes to the mv_assets.progress logger when
    it is enabled for INFO (every $MV_ASSETS_PROGRESS_SECONDS)."""
    monkeypatch.setenv("MV_ASSETS_PROGRESS_SECONDS", "0.05")
    monkeypatch.setenv("MV_ASSETS_CHECKPOINT_SECONDS", "0.05")
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(150)], primary_key="id")
    t.add_columns({"y": slow})
    with caplog.at_level(logging.INFO, logger="mv_assets.progress"):
        r = t.backfill("y")
    assert r.rows_written == 150
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "mv_assets.progress"]
    assert len(lines) >= 3 and lines[-1].startswith("computing: 150 of 150 rows (100%)")
    assert any(" of 150 rows (" in line and "left" in line for line in lines[:-1])


def test_short_work_reports_nothing_and_starts_no_thread_without_a_listener(tmp_path):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(10)], primary_key="id")
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": mv.udf(lambda x: x,
                                                                     data_type=slow.data_type, name="same",
                                                                     input_columns=["x"])}))
    code = ("import sys, threading, mv_assets as mv; db = mv.connect(sys.argv[1], runner=mv.InlineRunner()); "
            "db.open_table('src').add([{'id': 99, 'x': 99}]); print(db.open_view('v').refresh().rows_inserted, "
            "[t.name for t in threading.enumerate() if t.name == 'mv_assets-progress'])")
    out = subprocess.run([sys.executable, "-c", code, db.uri], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["11", "[]"]  # a refresh nobody listens to: no clock thread
    view.refresh()
    src.add([{"id": 10, "x": 10}])
    reports: list = []
    with progress.listen(reports.append, every=5):
        view.refresh()
    assert reports == []  # done before the first report was due: nothing, not even "done"
    with pytest.raises(ValueError, match="every must be > 0 seconds"):
        with progress.listen(reports.append, every=0):
            pass


def test_a_failing_listener_never_fails_the_work(tmp_path, monkeypatch):
    monkeypatch.setenv("MV_ASSETS_CHECKPOINT_SECONDS", "0.05")
    db, view = _view(tmp_path, n=100)

    def broken(p):
        raise OSError("the log is gone")

    with progress.listen(broken, every=0.02):
        assert view.refresh().udf_rows_computed == {"y": 100}


@pytest.mark.spark
def test_a_spark_jobs_progress_follows_its_finished_tasks(tmp_path, spark_runner):
    """On Spark the rows are counted on executors: the driver follows the
    job's finished tasks (Spark's status tracker) while it waits for them."""
    db = mv.connect(str(tmp_path / "cat"), runner=spark_runner)
    src = db.create_table("src", [{"id": i, "x": i} for i in range(50)], primary_key="id")
    for f in range(1, 8):
        src.add([{"id": i, "x": i} for i in range(50 * f, 50 * (f + 1))])
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": slow}))
    view.refresh(src_version=1)  # Spark started and warm: the job below is all compute
    reports: list[progress.Progress] = []
    with progress.listen(reports.append, every=0.1):
        r = view.refresh(max_rows_per_task=50)
    assert r.runner == "spark" and r.tasks == 7
    running = [p.rows_done for p in reports if not p.done]
    assert running == sorted(running) and any(0 < n < 350 for n in running)  # tasks finished one by one
    assert reports[-1].done and reports[-1].rows_done == reports[-1].rows_planned == 350


def test_the_last_report_is_the_done_one_even_when_the_clock_reported_as_the_stage_ended():
    """The clock takes a stage that is due and reports it outside its lock: a
    stage ending meanwhile said "done" first and the clock's report came
    after it (seen on Spark under load: the last report was 350 of 350, not
    done). The done report now waits for the clock's and is the last."""
    reports: list[progress.Progress] = []
    in_clock, done_said = threading.Event(), threading.Event()

    def listener(p: progress.Progress) -> None:
        if p.done:
            reports.append(p)
            done_said.set()
            return
        in_clock.set()
        done_said.wait(timeout=1)  # before the mend the done report came meanwhile
        reports.append(p)

    with progress.listen(listener, every=0.01):
        with stages.stage(10) as st:
            assert st is not None
            stages.advance(10)
            assert in_clock.wait(timeout=30)  # the clock is reporting it now
    time.sleep(0.05)  # the clock would have reported again by now had it kept the stage
    assert [p.done for p in reports] == [False, True]
    assert reports[-1].rows_done == reports[-1].rows_planned == 10


def test_a_stage_that_failed_says_nothing_more():
    reports: list[progress.Progress] = []
    with progress.listen(reports.append, every=0.01):
        with pytest.raises(RuntimeError):
            with stages.stage(10):
                stages.advance(3)
                time.sleep(0.05)
                raise RuntimeError("the work failed")
    seen = len(reports)
    time.sleep(0.05)
    assert seen >= 1 and len(reports) == seen and not any(p.done for p in reports)
