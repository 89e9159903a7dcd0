"""A backfill's shape: the plan its dry run shows is the plan it runs (one pass
or staged), its tasks are in the execution layer, and its commit is retried a
bounded number of times against the latest version, then fails with a typed
error naming what could not be committed."""

import pytest

import mv_assets as mv
from mv_assets.storage import commits


def _rows(n, start=0):
    return [{"id": i, "x": float(i)} for i in range(start, start + n)]


def test_a_backfill_whose_commit_always_conflicts_fails_with_a_concurrent_write_error(tmp_path, monkeypatch):
    """Another writer updates the table during every attempt: after
    COMMIT_ATTEMPTS conflicts the backfill stops, commits nothing and says so."""
    monkeypatch.setattr(commits, "COMMIT_ATTEMPTS", 3)
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    t = db.create_table("t", _rows(20))
    attempts = tmp_path / "attempts"
    attempts.write_text("")

    @mv.udf
    def meddling(x: float) -> float:
        if x == 0.0:  # a concurrent writer, during each attempt
            attempts.write_text(attempts.read_text() + "1")
            t.update("id = 5", values_sql={"x": "x + 1"})
        return x

    t.add_columns({"y": meddling})
    before = t.version
    with pytest.raises(mv.ConcurrentWriteError,
                       match=r"could not commit the backfill of \['y'\] into 't': another writer "
                             r"committed first 3 times in a row; nothing was committed") as err:
        t.backfill("y")
    assert type(err.value.__cause__).__name__ == "CommitConflictError"
    assert attempts.read_text() == "111" and t.version == before + 3  # the three updates, no backfill
    assert t.plan_backfill("y").rows == 20


def test_a_staged_backfill_whose_write_always_conflicts_fails_with_a_concurrent_write_error(tmp_path, monkeypatch):
    """The staged path's write is redone against each new version (no UDF runs
    again), up to COMMIT_ATTEMPTS times; then the same typed error."""
    monkeypatch.setattr(commits, "COMMIT_ATTEMPTS", 2)
    writes = []

    class Meddling(mv.InlineRunner):
        def map(self, func_ref, payloads, shared, rows=0):
            if func_ref.endswith(":run_write_task"):  # a concurrent writer, in the fragment written
                writes.append(func_ref)
                t.update(f"id = {len(writes)}", values_sql={"x": "x + 1"})
            return super().map(func_ref, payloads, shared, rows)

    db = mv.connect(str(tmp_path), runner=Meddling())
    t = db.create_table("t", _rows(20))
    t.add_columns({"y": plus})
    with pytest.raises(mv.ConcurrentWriteError, match=r"could not commit \['y', '__computed__y'\] into 't': another "
                                                      r"writer committed first 2 times in a row"):
        t.backfill("y", checkpoint_size=8)
    assert len(writes) == 2
    assert t.backfill("y", checkpoint_size=8, runner=mv.InlineRunner()).rows_written == 20  # resumed


@mv.udf
def plus(x: float) -> float:
    return x + 1.0


def test_every_backfill_task_a_runner_runs_is_in_the_execution_layer(tmp_path):
    """Executors import only mv_assets.execution (and below) for a backfill:
    the one pass of a table and of a view, and the staged path's two stages."""
    refs = []

    class Recording(mv.InlineRunner):
        def map(self, func_ref, payloads, shared, rows=0):
            refs.append(func_ref)
            return super().map(func_ref, payloads, shared, rows)

    db = mv.connect(str(tmp_path), runner=Recording())
    t = db.create_table("t", _rows(20))
    t.add_columns({"y": plus, "z": "x * 2"})
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
    v.refresh()
    v.add_columns({"w": plus})
    t.backfill("y")
    t.backfill("z")
    v.backfill("w")
    t.backfill("y", where="id < 5", checkpoint_size=4)
    assert {r.rpartition(":")[2] for r in refs} == {"run_fused_task", "run_compute_task", "run_write_task"}
    assert all(r.startswith("mv_assets.execution.") for r in refs), refs


class TwoCores(mv.InlineRunner):
    def parallelism(self) -> int:
        return 2


@pytest.mark.parametrize("path", ["one pass of a table", "one pass of a view", "staged UDF", "staged SQL"])
def test_a_backfill_runs_the_plan_its_dry_run_shows(tmp_path, monkeypatch, path):
    """backfill() plans with the function plan_backfill() is, and runs that plan:
    the same rows, tasks and path (one pass or staged) as the dry run."""
    from mv_assets.ops import backfill

    planned = []

    def recording(*args, **kwargs):
        planned.append(real(*args, **kwargs))
        return planned[-1]

    real = backfill.plan_backfill
    monkeypatch.setattr(backfill, "plan_backfill", recording)
    db = mv.connect(str(tmp_path), runner=TwoCores())
    t = db.create_table("t", _rows(1000))
    for k in (1, 2):
        t.add(_rows(1000, 1000 * k))
    handle, column, kwargs = t, "y", {}
    if path == "one pass of a view":
        handle = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
        handle.refresh()
    if path.startswith("staged"):
        kwargs = {"checkpoint_size": 512, "max_rows_per_task": 1024}
    if path == "staged SQL":
        column, kwargs["where"] = "z", "id >= 100"  # (a SQL column is computed when added)
    handle.add_columns({"y": plus, "z": "x * 2"})
    handle.backfill("y", where="id < 100")  # some rows computed already
    planned.clear()
    dry = handle.plan_backfill(column, **kwargs)
    assert dry.one_pass == path.startswith("one pass") and dry.rows == 2900 and dry.tasks >= 2
    r = handle.backfill(column, **kwargs)
    assert len(planned) == 1 and planned[0].summary() == dry.summary()
    assert (planned[0].one_pass_tasks, planned[0].task_ranges) == (dry.one_pass_tasks, dry.task_ranges)
    assert r.rows_planned == dry.rows == r.rows_written and r.timings["tasks"] == dry.tasks


def test_a_one_pass_plan_shown_can_be_run_as_it_is(tmp_path):
    from mv_assets.ops.backfill import execute_backfill, plan_backfill

    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    t = db.create_table("t", _rows(30))
    t.add_columns({"y": plus})
    plan = plan_backfill(t.ref(), "y")
    assert plan.one_pass and plan.rows == 30
    r = execute_backfill(t.ref(), plan, mv.InlineRunner(), "job")
    assert r.rows_written == 30 and t.plan_backfill("y").rows == 0
    assert sorted(t.to_arrow().column("y").to_pylist()) == [i + 1.0 for i in range(30)]
