"""Crash and resume: a backfill killed with SIGKILL at random points (driver
process), or losing a Spark Python worker, and started again, loses nothing,
duplicates nothing and recomputes at most one checkpoint batch per task in
flight per crash."""

import glob
import os
import random
import signal
import subprocess
import sys
import time

import lance
import pytest
from oracle import count_calls, record_call

import mv_assets as mv

N = 600
BATCH = 25


def _catalog(path, call_log):
    db = mv.connect(str(path), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(200)])
    t.add([{"id": i, "x": i} for i in range(200, 400)])
    t.add([{"id": i, "x": i} for i in range(400, N)])

    @mv.udf
    def slow_triple(x: int) -> int:
        record_call(call_log, "triple", x)
        time.sleep(0.002)
        return 3 * x

    t.add_columns({"y": slow_triple})
    return db, t


def _check_complete(t):
    ds = lance.dataset(t.uri)
    rows = ds.to_table(columns={"id": "id", "y": "y", "__computed__y": "__computed__y",
                                "v": "_row_last_updated_at_version"}, with_row_id=True).to_pylist()
    assert len(rows) == N and len({r["_rowid"] for r in rows}) == N  # no loss, no duplicates
    assert sorted(r["id"] for r in rows) == list(range(N))
    assert all(r["y"] == 3 * r["id"] for r in rows)
    fp = t.computed_columns()[0].fingerprint
    assert all(r["__computed__y"] == f"{fp}@{r['v']}" for r in rows)  # computed for the row as it is


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_of_the_driver_at_random_points_then_resume(tmp_path, call_log, seed):
    db, t = _catalog(tmp_path / "cat", call_log)
    rng = random.Random(seed)
    code = (
        "import mv_assets as mv; "
        f"db = mv.connect({db.uri!r}, runner=mv.InlineRunner()); "
        f"db.open_table('t').backfill('y', checkpoint_size={BATCH})"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    kills = 0
    for trial in range(4):
        proc = subprocess.Popen([sys.executable, "-c", code], env=env)
        done = count_calls(call_log, "triple")
        if trial < 3:  # kill after a random number of UDF calls: anywhere in the compute phase
            target = done + rng.randint(1, max(1, (N - done) // 2))
            while count_calls(call_log, "triple") < target and proc.poll() is None:
                time.sleep(0.002)
        else:  # all computed: kill somewhere around the write and commit
            while count_calls(call_log, "triple") < N and proc.poll() is None:
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        print(f"seed {seed}: after run {trial + 1}: {count_calls(call_log, 'triple')} calls, {kills} kills")
    assert kills >= 3  # else this trial proved nothing
    before_final = count_calls(call_log, "triple")
    result = t.backfill("y", checkpoint_size=BATCH)
    _check_complete(t)
    calls = count_calls(call_log, "triple")
    # every kill loses at most the batch in flight (inline: one task at a time)
    assert N <= calls <= N + kills * BATCH, (calls, kills)
    assert result.udf_rows_computed == calls - before_final
    t.backfill("y", checkpoint_size=BATCH)  # nothing left: leftover checkpoints are cleared
    leftovers = [f for _, _, fs in os.walk(db._state_dir("checkpoints")) for f in fs if f.endswith(".arrow")]
    assert leftovers == []


# what Spark says when a Python worker is SIGKILLed mid-task
_WORKER_DIED = r"(?is)worker.*(exited|crash|lost)|EOFException|Connection reset"


@pytest.mark.spark
def test_a_killed_spark_worker_fails_the_job_and_the_rerun_resumes(tmp_path, call_log, spark_runner):
    db = mv.connect(str(tmp_path / "cat"), runner=spark_runner)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(300)])
    t.add([{"id": i, "x": i} for i in range(300, N)])
    flag = str(tmp_path / "kill-once")
    open(flag, "w").close()

    @mv.udf
    def triple(x: int) -> int:
        record_call(call_log, "triple", x)
        if x == 450 and os.path.exists(flag):
            os.remove(flag)
            os.kill(os.getpid(), signal.SIGKILL)  # the Python worker dies mid-task
        return 3 * x

    t.add_columns({"y": triple})
    before = t.version
    with pytest.raises(Exception, match=_WORKER_DIED):
        t.backfill("y", checkpoint_size=BATCH, max_rows_per_task=100)
    assert t.version == before  # nothing committed
    first = count_calls(call_log, "triple")
    plan = t.plan_backfill("y", checkpoint_size=BATCH, max_rows_per_task=100)
    assert plan.batches_checkpointed >= 1
    result = t.backfill("y", checkpoint_size=BATCH, max_rows_per_task=100)
    _check_complete(t)
    assert result.batches_resumed == plan.batches_checkpointed
    # the rerun computes only the batches that were not checkpointed
    assert result.udf_rows_computed == N - plan.rows_checkpointed
    assert count_calls(call_log, "triple") == first + N - plan.rows_checkpointed


def test_a_failed_refresh_of_a_filtered_view_redoes_at_most_checkpoint_size_rows(tmp_path, call_log):
    """``checkpoint_size=50`` on a view with a filter: Lance's filtered scan
    of a string column hands over batches of 60 rows (its batch size is not a
    bound on the rows a filter keeps), saved as 60-row checkpoints, so a
    refresh killed mid-way redid more rows than the documented
    ``checkpoint_size``."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "name": f"n{i}", "val": i % 17} for i in range(2000)], primary_key="id")
    flag = str(tmp_path / "fail")
    open(flag, "w").close()

    @mv.udf
    def fragile(name: str) -> int:
        record_call(call_log, "fragile", name)
        if name == "n260" and os.path.exists(flag):
            raise RuntimeError("worker lost")
        return len(name)

    v = db.create_materialized_view("v", t.search(None).where("val < 10").select({"id": "id", "y": fragile}))
    with pytest.raises(RuntimeError, match="worker lost"):
        v.refresh(checkpoint_size=50)
    # what a kill at any moment loses is the rows computed since the last checkpoint: at most 50
    saved = [_arrow_rows(f) for f in glob.glob(os.path.join(db._state_dir("checkpoints", "v", "batches"), "**",
                                                            "*.arrow"), recursive=True)]
    assert saved and max(saved) <= 50, saved
    os.remove(flag)
    r = v.refresh(checkpoint_size=50)
    assert r.udf_rows_resumed["y"] == sum(saved) and r.udf_rows_computed["y"] == 1180 - sum(saved)
    assert sorted(row["id"] for row in v.to_arrow().to_pylist()) == [i for i in range(2000) if i % 17 < 10]


def _arrow_rows(path: str) -> int:
    import pyarrow as pa

    with pa.memory_map(path) as source:
        try:
            return pa.ipc.open_file(source).read_all().num_rows
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).read_all().num_rows


def test_a_failed_refresh_redoes_at_most_one_batch(tmp_path, call_log):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(1000)])
    flag = str(tmp_path / "fail")
    open(flag, "w").close()

    @mv.udf
    def fragile(x: int) -> int:
        record_call(call_log, "fragile", x)
        if x == 549 and os.path.exists(flag):
            raise RuntimeError("worker lost")
        return x * 2

    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": fragile}))
    with pytest.raises(RuntimeError, match="worker lost"):
        v.refresh(checkpoint_size=100)  # one task of 1000 rows, batches of 100
    assert v.count_rows() == 0 and count_calls(call_log, "fragile") == 550
    os.remove(flag)
    r = v.refresh(checkpoint_size=100)
    assert r.udf_rows_computed == {"y": 500}  # five batches were checkpointed
    assert count_calls(call_log, "fragile") == 1050  # the batch in flight (50 calls) was redone
    assert sorted((row["id"], row["y"]) for row in v.to_arrow().to_pylist()) == [(i, 2 * i) for i in range(1000)]
    assert not os.path.exists(db._state_dir("checkpoints", "v", "batches"))  # spent after the commit


def test_sigkill_of_a_refresh_then_resume(tmp_path, call_log):
    db, t = _catalog(tmp_path / "cat", call_log)
    db.create_materialized_view("v", t.search(None).select({"id": "id", "z": t.computed_columns()[0].udf}))
    code = (
        "import mv_assets as mv; "
        f"db = mv.connect({db.uri!r}, runner=mv.InlineRunner()); "
        "db.open_table('v').refresh(checkpoint_size=25, max_rows_per_task=200)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    rng = random.Random(7)
    kills = 0
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", code], env=env)
        target = count_calls(call_log, "triple") + rng.randint(1, 150)
        while count_calls(call_log, "triple") < target and proc.poll() is None:
            time.sleep(0.002)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills == 3
    v = db.open_table("v")
    v.refresh(checkpoint_size=25, max_rows_per_task=200)
    rows = v.to_arrow().to_pylist()
    assert sorted((r["id"], r["z"]) for r in rows) == [(i, 3 * i) for i in range(N)]
    # each kill loses at most the batch in flight (inline: one task at a time)
    assert N <= count_calls(call_log, "triple") <= N + kills * 25


def test_refresh_checkpoints_survive_a_compaction_between_crash_and_retry(tmp_path, call_log):
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(300)])
    for start in range(300, 1000, 350):
        t.add([{"id": i, "x": i} for i in range(start, min(start + 350, 1000))])
    flag = str(tmp_path / "fail")
    open(flag, "w").close()

    @mv.udf
    def fragile(x: int) -> int:
        record_call(call_log, "fragile", x)
        if x == 800 and os.path.exists(flag):
            raise RuntimeError("worker lost")
        return x * 2

    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": fragile}))
    with pytest.raises(RuntimeError, match="worker lost"):
        v.refresh(checkpoint_size=64)
    first = count_calls(call_log, "fragile")
    assert 800 < first <= 1000
    t.optimize()  # every fragment rewritten: new addresses, new tasks, new batches
    assert len(lance.dataset(t.uri).get_fragments()) == 1
    os.remove(flag)
    r = v.refresh(checkpoint_size=100)
    assert count_calls(call_log, "fragile") - first <= 1000 - first + 64  # only what no checkpoint held
    assert r.udf_rows_computed["y"] == count_calls(call_log, "fragile") - first
    assert sorted((row["id"], row["y"]) for row in v.to_arrow().to_pylist()) == [(i, 2 * i) for i in range(1000)]


@pytest.mark.spark
def test_a_killed_spark_worker_during_a_refresh_then_resume(tmp_path, call_log, spark_runner):
    db = mv.connect(str(tmp_path / "cat"), runner=spark_runner)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(N)])
    flag = str(tmp_path / "kill-once")
    open(flag, "w").close()

    @mv.udf
    def triple(x: int) -> int:
        record_call(call_log, "triple", x)
        if x == 450 and os.path.exists(flag):
            os.remove(flag)
            os.kill(os.getpid(), signal.SIGKILL)
        return 3 * x

    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": triple}))
    with pytest.raises(Exception, match=_WORKER_DIED):
        v.refresh(checkpoint_size=BATCH, max_rows_per_task=N)  # one task: the worker dies at row 450
    assert v.count_rows() == 0
    first = count_calls(call_log, "triple")
    v.refresh(checkpoint_size=BATCH, max_rows_per_task=N)
    assert sorted((r["id"], r["y"]) for r in v.to_arrow().to_pylist()) == [(i, 3 * i) for i in range(N)]
    # the rerun computes the rows from the batch that died on: 450 // 25 * 25 = 450 rows were checkpointed
    assert count_calls(call_log, "triple") - first == N - 450


def test_checkpoints_by_time_cost_cheap_udfs_nothing(tmp_path):
    """Default refresh checkpoints are sized by time: a cheap UDF saves none
    during a task (a failure at its last row finds no checkpoint file), while
    checkpoints every N rows save each N."""

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    n = 20_000
    t = db.create_table("t", [{"id": i, "x": i} for i in range(n)])

    @mv.udf
    def fails_last(x: int) -> int:
        if x == n - 1:
            raise ValueError("last row")
        return x

    db.create_materialized_view("v", t.search(None).select({"id": "id", "y": fails_last}))
    batches = db.layout.batch_checkpoints("v")

    def files():  # (under a folder per source identity, then one per UDF)
        return [f for _, _, names in os.walk(batches) for f in names]

    with pytest.raises(Exception, match="last row"):
        db.open_table("v").refresh()
    assert files() == []
    with pytest.raises(Exception, match="last row"):
        db.open_table("v").refresh(checkpoint_size=4096)
    assert len(files()) == n // 4096


def _killed_after_300_calls(db, call: str, call_log: str) -> int:
    """Run ``call`` on the catalog in a fresh interpreter (checkpoints every
    0.1 s of UDF work), SIGKILL it once the UDF was called 300 times; the calls
    made by then."""
    code = f"import mv_assets as mv; db = mv.connect({db.uri!r}, runner=mv.InlineRunner()); {call}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]),
           "MV_ASSETS_CHECKPOINT_SECONDS": "0.1"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    while count_calls(call_log, "triple") < 300 and proc.poll() is None:
        time.sleep(0.002)
    assert proc.poll() is None, f"{call} ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return count_calls(call_log, "triple")


def test_sigkill_with_checkpoints_by_time_loses_about_one_checkpoint(tmp_path, call_log):
    """An expensive UDF under time-sized checkpoints (0.1 s here) saves every
    ~0.1 s of work: a kill loses at most about that (the slice in flight and
    the results held since the last save)."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(N)])  # one fragment, one scanner batch

    @mv.udf
    def slow_triple(x: int) -> int:
        record_call(call_log, "triple", x)
        time.sleep(0.002)
        return 3 * x

    db.create_materialized_view("v", t.search(None).select({"id": "id", "z": slow_triple}))
    before = _killed_after_300_calls(db, "db.open_table('v').refresh(max_rows_per_task=1000)", call_log)
    r = db.open_table("v").refresh(max_rows_per_task=1000)
    lost = count_calls(call_log, "triple") - N
    # 2 ms per row: ~50 rows per 0.1 s checkpoint; the kill lost the held ones and the slice in flight
    assert 0 <= lost <= 120, (before, lost)
    assert r.udf_rows_resumed["z"] >= before - 120
    assert sorted((row["id"], row["z"]) for row in db.open_table("v").to_arrow().to_pylist()) == [
        (i, 3 * i) for i in range(N)
    ]


def test_plan_after_a_killed_one_pass_backfill_counts_its_checkpointed_rows(tmp_path, call_log):
    """A one-pass backfill (checkpoints sized by time, 0.1 s here) killed part
    way: plan_backfill and `mv-assets backfill --dry-run` count the rows whose
    results its checkpoints hold, exactly the rows the next backfill resumes,
    and the rest are exactly the rows it computes."""
    import json

    from click.testing import CliRunner

    from mv_assets.cli import main

    db, t = _catalog(tmp_path / "cat", call_log)
    before = _killed_after_300_calls(db, "db.open_table('t').backfill('y')", call_log)

    plan = t.plan_backfill("y")
    assert plan.one_pass and plan.rows == N
    assert 0 < plan.rows_checkpointed <= before < N, (plan.rows_checkpointed, before)
    cli = ["--db", db.uri, "--runner", "inline", "backfill", "t", "y", "--dry-run"]
    r = CliRunner().invoke(main, [*cli, "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert (s["rows"], s["rows_checkpointed"], s["rows_to_compute"]) == (N, plan.rows_checkpointed, plan.rows_to_compute)
    r = CliRunner().invoke(main, cli, catch_exceptions=False)
    assert (f"{plan.rows_checkpointed:,} row{'s' * (plan.rows_checkpointed != 1)} already checkpointed -> "
            f"{plan.rows_to_compute:,} row{'s' * (plan.rows_to_compute != 1)} to compute") in r.output

    result = t.backfill("y")
    assert (result.rows_resumed, result.udf_rows_computed) == (plan.rows_checkpointed, plan.rows_to_compute)
    assert count_calls(call_log, "triple") == before + plan.rows_to_compute
    _check_complete(t)
    assert t.plan_backfill("y").rows == 0


def test_plan_of_a_view_column_after_a_failed_one_pass_backfill_counts_its_checkpointed_rows(
        tmp_path, call_log, monkeypatch):
    """The same for a view's UDF column (rows identified by their source row):
    a one-pass backfill that failed part way left time-sized checkpoints; the
    plan counts them as the next backfill resumes them."""
    monkeypatch.setenv("MV_ASSETS_CHECKPOINT_SECONDS", "0.05")
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(300)])
    src.add([{"id": i, "x": i} for i in range(300, N)])
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "x": "x"}))
    view.refresh()
    flag = tmp_path / "fail"
    flag.write_text("1")

    @mv.udf
    def slow_square(x: int) -> int:
        if x == 450 and flag.exists():
            raise RuntimeError("worker lost")
        record_call(call_log, "square", x)
        time.sleep(0.002)
        return x * x

    view.add_columns({"q": slow_square})
    with pytest.raises(mv.UdfError, match="worker lost"):
        view.backfill("q")
    before = count_calls(call_log, "square")
    flag.unlink()
    plan = view.plan_backfill("q")
    assert plan.one_pass and plan.rows == N
    assert 0 < plan.rows_checkpointed <= before < N, (plan.rows_checkpointed, before)
    result = view.backfill("q")
    assert (result.rows_resumed, result.udf_rows_computed) == (plan.rows_checkpointed, plan.rows_to_compute)
    assert count_calls(call_log, "square") == before + plan.rows_to_compute
    assert sorted((r["id"], r["q"]) for r in view.to_arrow().to_pylist()) == [(i, i * i) for i in range(N)]
    assert view.plan_backfill("q").rows == 0


@pytest.mark.parametrize("rerun", ["t.backfill('y')", "t.backfill('y', checkpoint_size=40)"])
def test_a_killed_staged_backfill_run_again_with_other_arguments_resumes(tmp_path, call_log, rerun):
    """A backfill killed with checkpoint_size=25, run again with the defaults
    (one pass) or another checkpoint_size: its results are kept by batches of
    25 rows, which only a rerun of that size finds, so every row was computed
    again (the README's 'kill it, run it again: nothing lost'). The rerun now
    takes the interrupted run's batch size (with a warning when another one
    was asked), and the plan counts its rows."""
    db, t = _catalog(tmp_path / "cat", call_log)
    before = _killed_after_300_calls(db, f"db.open_table('t').backfill('y', checkpoint_size={BATCH})", call_log)
    plan = t.plan_backfill("y")
    assert plan.rows == N and before - BATCH <= plan.rows_checkpointed <= before
    if "40" in rerun:
        with pytest.warns(UserWarning, match="resuming them with checkpoint_size=25, not 40"):
            result = t.backfill("y", checkpoint_size=40)
    else:
        result = t.backfill("y")
    _check_complete(t)
    assert count_calls(call_log, "triple") - N <= BATCH  # the batch in flight, at most
    assert result.rows_resumed >= before - BATCH
    assert t.plan_backfill("y").rows == 0 and t.backfill("y").udf_rows_computed == 0


def test_a_killed_one_pass_backfill_run_again_with_a_checkpoint_size_resumes(tmp_path, call_log):
    """The reverse: a one-pass backfill (checkpoints by row, sized by time)
    killed part way, run again with checkpoint_size=40: the staged rerun
    looked its batches up by key, found none, and computed every row again.
    It now resumes in one pass (with a warning), as the plan counts."""
    db, t = _catalog(tmp_path / "cat", call_log)
    before = _killed_after_300_calls(db, "db.open_table('t').backfill('y')", call_log)
    with pytest.warns(UserWarning, match="resuming them in one pass, not in batches of checkpoint_size=40"):
        plan = t.plan_backfill("y", checkpoint_size=40)
    assert plan.one_pass and 0 < plan.rows_checkpointed <= before
    with pytest.warns(UserWarning, match="checkpointed by row"):
        result = t.backfill("y", checkpoint_size=40)
    _check_complete(t)
    assert result.rows_resumed == plan.rows_checkpointed
    assert count_calls(call_log, "triple") == before + N - plan.rows_checkpointed
    assert t.plan_backfill("y").rows == 0
    t.add([{"id": N + i, "x": N + i} for i in range(3)])  # (spent: later backfills with a size are staged again)
    assert not t.plan_backfill("y", checkpoint_size=40).one_pass


def test_a_backfill_reads_running_while_it_runs_and_failed_once_killed_after_its_commits(tmp_path, call_log):
    """`list_jobs()` while a backfill (commit_granularity=1: a commit per
    fragment) runs in another process, and after it was killed once its first
    fragment committed: it was missing while running, and DONE after the kill
    (its commits made a job that completed), with 200 of 600 rows computed.
    It reads RUNNING, then FAILED after its commit, from its launch time;
    the rerun completes the column and reads DONE."""
    db, t = _catalog(tmp_path / "cat", call_log)
    code = (f"import mv_assets as mv; db = mv.connect({db.uri!r}, runner=mv.InlineRunner()); "
            "db.open_table('t').backfill('y', commit_granularity=1)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    v0 = t.version
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        while lance.dataset(t.uri).version < v0 + 1 and proc.poll() is None:
            time.sleep(0.005)
        assert proc.poll() is None, "the backfill ended before it could be looked at"
        (job,) = db.list_jobs()
        assert (str(job.status), job.metric("rows")) == ("RUNNING", 200)
        assert job.launched_at is not None and abs(job.launched_at.timestamp() - started) < 5
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    (job,) = db.list_jobs()
    assert lance.dataset(t.uri).version - v0 in (1, 2)  # (the second fragment's commit may have landed)
    assert str(job.status) == "FAILED" and "its process ended before it finished" in job.error
    assert job.events[-1].endswith("(they stand): its process ended before it finished (killed?)")
    assert job.metric("rows") == sum(s["current"] for s in t.column_status())
    done = t.backfill("y")
    _check_complete(t)
    assert str(next(j for j in db.list_jobs() if j.job_id == done.job_id).status) == "DONE"
    db.drop_table("t")  # (its records go with it: a table made again under the name starts clean)
    db.create_table("t", [{"id": 0}])
    assert db.list_jobs() == []
