"""A UDF that raises on a row (on_error="fail"): the error names the column, the
UDF and the row (source row id, primary key value), gives the remedy, is
recorded in the catalog's errors table, and crosses the Spark worker boundary
as our error, not as a Py4J stack."""

import os
import pickle

import lance
import pyarrow as pa
import pytest

import mv_assets as mv
from mv_assets.model.errors import UdfError


@mv.udf
def fragile(x: int) -> int:
    if x == 3:
        raise ZeroDivisionError("cannot score row three")
    return x * 10


@mv.udf(data_type=pa.int64())
def fragile_batch(x: pa.Array) -> pa.Array:
    if 3 in x.to_pylist():
        raise KeyError("no score for 3")
    return pa.array([v * 10 for v in x.to_pylist()], pa.int64())


def _source(db, pk: str | None = "id"):
    src = db.create_table("src", [{"id": 100 + i, "x": i} for i in range(6)], primary_key=pk)
    src.add([{"id": 100 + i, "x": i} for i in range(6, 10)])
    return src


def _row_id_of(table, x: int) -> int:
    rows = lance.dataset(table.uri).to_table(columns=["x"], with_row_id=True).to_pylist()
    return next(r["_rowid"] for r in rows if r["x"] == x)


def test_refresh_failure_names_column_udf_row_and_remedy_and_is_recorded(db):
    src = _source(db)
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "score": fragile}))
    row_id = _row_id_of(src, 3)
    with pytest.raises(UdfError, match=r"UDF 'fragile' raised ZeroDivisionError: cannot score row three") as info:
        view.refresh()
    err = info.value
    assert (err.table, err.column, err.udf, err.row_id, err.key) == ("v", "score", "fragile", row_id, ("id", 103))
    text = str(err)
    for part in ("column 'score' of 'v'", f"source row id {row_id} of 'src' (id=103)", 'on_error="skip"',
                 "mv-assets errors v"):
        assert part in text
    assert isinstance(err.__cause__, ZeroDivisionError)  # inline: the user's exception and traceback are kept
    assert "FAILED_LOAD" == view.status().load_state and "cannot score row three" in (view.status().last_error or "")
    [record] = view.get_errors(column_name="score")
    assert (record.row_id, record.udf_name, record.error_type, record.message) == (
        row_id, "fragile", "ZeroDivisionError", "cannot score row three")
    assert "raise ZeroDivisionError" in (record.traceback or "")


def test_backfill_failure_names_the_table_row_and_lists_it_as_failed(db):
    src = _source(db)
    src.add_columns({"score": fragile})
    row_id = _row_id_of(src, 3)
    with pytest.raises(UdfError, match=r"column 'score' of 'src'.*row id \d+ of 'src' \(id=103\)"):
        src.backfill("score")
    assert [e.row_id for e in src.get_errors(column_name="score")] == [row_id]
    assert src.get_failed_row_ids("score") == [row_id]


def test_batched_udf_failure_names_the_failing_row(db):
    """A batched UDF raises for its whole batch: halves of it are run again
    until the row that raises alone is found, and the error and its record
    name that row, not the batch."""
    src = _source(db, pk=None)
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "score": fragile_batch}))
    row_id = _row_id_of(src, 3)
    with pytest.raises(UdfError, match=rf"UDF 'fragile_batch' raised KeyError: 'no score for 3' .*on source row id "
                                       rf"{row_id} of 'src'") as info:
        view.refresh()
    assert info.value.rows == 1 and info.value.row_id == row_id and info.value.key is None
    assert [(e.error_type, e.row_id) for e in view.get_errors(column_name="score")] == [("KeyError", row_id)]


@mv.udf(data_type=pa.int64())
def needs_small_batches(x: pa.Array) -> pa.Array:
    if len(x) > 2:
        raise MemoryError(f"out of memory for {len(x)} rows")
    return pa.array([v * 10 for v in x.to_pylist()], pa.int64())


def test_a_batch_that_fails_only_as_a_whole_is_named_as_a_batch(db):
    """No row fails alone (the batch is too large for the model, say): the
    error names the smallest part that still fails, as a batch of rows."""
    src = _source(db, pk=None)
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "s": needs_small_batches}))
    with pytest.raises(UdfError, match=r"raised MemoryError: out of memory for 3 rows .* a batch of 3 rows .*source "
                                       r"row ids \d+\.\.\d+; a batched UDF does not say which row") as info:
        view.refresh()
    assert info.value.rows == 3


def test_udf_error_survives_pickling():
    err = UdfError("f", "ValueError", "bad", traceback="tb", attempts=2, row_index=4, rows=1)
    err.locate(column="c", row_id=7, row_version=3, last_row_id=7, fingerprint="abc")
    err.attribute(table="v", rows_of="src", key=("id", 5))
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.to_dict() == err.to_dict()
    assert UdfError.from_dict(err.to_dict()).to_dict() == err.to_dict()


@pytest.mark.spark
def test_spark_refresh_failure_is_our_error_not_a_py4j_stack(spark_db):
    src = _source(spark_db)
    view = spark_db.create_materialized_view("v", src.search(None).select({"id": "id", "score": fragile}))
    row_id = _row_id_of(src, 3)
    with pytest.raises(UdfError, match=r"UDF 'fragile' raised ZeroDivisionError: cannot score row three") as info:
        view.refresh()
    err = info.value
    assert (err.column, err.row_id, err.key) == ("score", row_id, ("id", 103))
    assert "Py4J" not in str(err) and "java" not in str(err).lower() and len(str(err)) < 600
    assert "raise ZeroDivisionError" in err.traceback  # the worker's traceback travels as text
    assert [e.row_id for e in view.get_errors(column_name="score")] == [row_id]


_CONNECT_CLIENT = r"""
import json, sys
import mv_assets as mv
from mv_assets.execution.spark import SparkRunner
from mv_assets.model.errors import UdfError

def fragile(x: int) -> int:
    if x == 3:
        raise ZeroDivisionError("cannot score row three")
    return x * 10

runner = SparkRunner(remote=sys.argv[1], local_below_rows=0)
db = mv.connect(sys.argv[2], runner=runner)
src = db.create_table("src", [{"id": 100 + i, "x": i} for i in range(6)], primary_key="id")
view = db.create_materialized_view("v", src.search(None).select({"id": "id", "score": mv.udf(fragile)}))
try:
    view.refresh()
    print(json.dumps({"raised": None}))
except UdfError as err:
    print(json.dumps({"raised": "UdfError", "text": str(err), **err.to_dict(),
                      "records": [e.row_id for e in view.get_errors(column_name="score")]}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "text": str(exc)[:2000]}))
finally:
    runner.stop()
"""


@pytest.mark.spark
def test_spark_connect_refresh_failure_is_our_error_too(tmp_path):
    """A UDF failing in a task run by a Spark Connect server comes back to the
    client as our UdfError (column, UDF, row, key, the worker's traceback as
    text), recorded in the errors table, not as a gRPC/JVM stack. (The client
    runs in a process of its own: pyspark marks a process as a Connect client
    for good.)"""
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
        out = subprocess.run([sys.executable, str(script), url, str(tmp_path / "cat")], capture_output=True,
                             text=True, timeout=300, env={**os.environ, "SPARK_CONNECT_MODE_ENABLED": "1"})
    finally:
        connect_server.stop(state)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["raised"] == "UdfError", got
    assert "UDF 'fragile' raised ZeroDivisionError: cannot score row three" in got["text"]
    assert (got["column"], got["key"]) == ("score", ["id", 103])
    assert "raise ZeroDivisionError" in got["traceback"]
    assert "grpc" not in got["text"].lower() and "java" not in got["text"].lower()
    assert got["records"] == [got["row_id"]]


_SKIPPING_VIEW = """
import os, sys
import mv_assets as mv
import mv_assets.storage.objects as objects

@mv.udf(on_error="skip", version="1")
def f(x: int) -> int:
    if x % 10 == 3:
        raise ValueError(f"bad {x}")
    return x

db = mv.connect(sys.argv[1], runner=mv.InlineRunner())
if sys.argv[2] == "create":
    t = db.create_table("raw", [{"id": i, "x": i} for i in range(30)], primary_key="id")
    db.create_materialized_view("v", t.search(None).select({"id": "id", "y": f}))
elif sys.argv[2] == "die_before_commit":
    objects.commit = lambda *a, **k: os._exit(9)  # the errors recorded, the commit never made
    db.open_view("v").refresh()
else:
    r = db.open_view("v").refresh()
    print(r.job_id, sorted((e.job_id, e.row_id) for e in db.open_view("v").get_errors()))
"""


def test_errors_of_a_refresh_run_again_after_a_crash_are_recorded_once(tmp_path):
    """Skipped rows are recorded before the commit; a refresh that died in
    between was run again under the same job id and recorded them again: 6
    records of 3 failing rows, and the CLI said 6 still failing."""
    import subprocess
    import sys

    script = tmp_path / "views.py"
    script.write_text(_SKIPPING_VIEW)
    root = str(tmp_path / "catalog")

    def run(step: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), root, step], capture_output=True, text=True, timeout=300)

    assert run("create").returncode == 0
    assert run("die_before_commit").returncode == 9
    out = run("again")
    assert out.returncode == 0, out.stderr
    job, records = out.stdout.strip().split(" ", 1)
    assert records == str(sorted([(job, 3), (job, 13), (job, 23)]))


def test_a_row_a_failed_refresh_stopped_on_is_still_failing_until_it_is_gone_or_computed(db):
    """A refresh that fails on a row (``on_error="fail"``) commits nothing, so
    the view does not hold that row: get_failed_row_ids (and the CLI's
    ``errors``) took that for the failure being fixed."""
    t = db.create_table("raw", [{"id": i, "x": i} for i in range(20)], primary_key="id")

    @mv.udf(version="1")
    def f(x: int) -> int:
        if x == 13:
            raise RuntimeError("bad row 13")
        return x

    v = db.create_materialized_view("v", t.search(None).where("x < 100").select({"id": "id", "y": f}))
    with pytest.raises(mv.UdfError):
        v.refresh()
    assert v.count_rows() == 0 and v.get_failed_row_ids("y") == [13]
    t.update(where="id = 13", values={"x": 500})  # no longer passes the filter: nothing left to compute
    assert v.get_failed_row_ids("y") == []
    t.update(where="id = 13", values={"x": 13})
    assert v.get_failed_row_ids("y") == [13]
    t.delete("id = 13")
    assert v.get_failed_row_ids("y") == []
    v.refresh()
    assert v.count_rows() == 19 and v.get_failed_row_ids("y") == []


def test_a_dropped_columns_errors_go_with_it(db):
    """A computed column whose UDF skipped a row, dropped, then a column of
    the same name added with other code: the new column has no failures (the
    old records were read as its own: failed 1, retry_errors computed the
    row); the table's other columns keep theirs."""
    t = db.create_table("t", pa.table({"id": list(range(10)), "a": list(range(10))}))

    @mv.udf(on_error="skip")
    def c(a: int) -> int:
        if a == 3:
            raise ValueError("bad 3")
        return a

    @mv.udf(on_error="skip")
    def d(a: int) -> int:
        if a == 4:
            raise ValueError("bad 4")
        return a

    @mv.udf
    def c_new(a: int) -> int:
        return a * 100

    t.add_columns({"c": c, "d": d})
    t.backfill("c")
    t.backfill("d")
    t.drop_columns(["c"])
    t.add_columns({"c": c_new})
    assert t.get_failed_row_ids("c") == [] and t.get_errors(column_name="c") == []
    assert {s["column"]: s["failed"] for s in t.column_status()} == {"d": 1, "c": 0}
    assert t.retry_errors("c").rows_written == 0 and len(t.get_errors(column_name="d")) == 1


def test_a_renamed_columns_errors_follow_it(db):
    """A computed column whose UDF skipped a row, renamed: its failures are
    the new name's (they stayed under the old name: the renamed column read
    0 failed, ``retry_errors`` of it computed nothing, and a column added
    later under the old name inherited them)."""
    t = db.create_table("t", pa.table({"id": list(range(10)), "a": list(range(10))}))

    @mv.udf(on_error="skip")
    def c(a: int) -> int:
        if a == 3:
            raise ValueError("bad 3")
        return a

    @mv.udf
    def fresh(a: int) -> int:
        return a * 100

    t.add_columns({"c": c})
    t.backfill("c")
    assert t.get_failed_row_ids("c") == [3]
    t.alter_columns({"path": "c", "rename": "c2"})
    assert t.get_failed_row_ids("c2") == [3] and [e.column for e in t.get_errors(column_name="c2")] == ["c2"]
    assert {s["column"]: s["failed"] for s in t.column_status()} == {"c2": 1}
    t.add_columns({"c": fresh})  # a new column under the old name starts clean
    assert t.get_failed_row_ids("c") == [] and t.get_errors(column_name="c") == []
    assert t.retry_errors("c").rows_written == 0


def test_a_row_a_refresh_failed_on_reads_as_failing_while_the_view_holds_its_older_value(db):
    """A row the view holds (its UDF computed at an older version) is updated
    to a value the UDF fails on (on_error="fail"): after the failed refresh,
    get_failed_row_ids, column_status and `mv-assets errors` say it fails (they
    said fixed: the view held a current-looking value of the older version);
    once an update makes it pass, it is fixed."""
    import subprocess
    import sys

    t = db.create_table("t", pa.table({"id": pa.array(range(5), pa.int64()), "x": pa.array(range(5), pa.int64())}))

    @mv.udf
    def boom(x: int) -> int:
        if x == 13:
            raise ValueError("thirteen")
        return x

    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": boom}))
    v.refresh()
    t.update("id = 2", values={"x": 13})
    with pytest.raises(UdfError):
        v.refresh()
    assert v.get_failed_row_ids("y") == [2] and v.column_status()[0]["failed"] == 1
    out = subprocess.run([sys.executable, "-m", "mv_assets", "--db", db.uri, "errors", "v"],
                         capture_output=True, text=True, check=False).stdout
    assert "1 still failing" in out and "FAILING" in out
    t.update("id = 2", values={"x": 14})
    v.refresh()
    assert v.get_failed_row_ids("y") == [] and v.column_status()[0]["failed"] == 0


def test_get_failed_row_ids_refuses_a_name_that_is_no_computed_column(db):
    """get_failed_row_ids(job_id, column), the order get_failed_row_addresses
    and get_errors take, read as "nothing failed" ([]): a name that is no
    computed column is refused, naming the order; `mv-assets errors` after
    the column is dropped (its records with it) still answers."""
    import subprocess
    import sys

    t = db.create_table("t", [{"id": i, "x": i} for i in range(5)], primary_key="id")

    @mv.udf(on_error=mv.skip_on_error())
    def fl(x: int) -> int:
        if x == 2:
            raise RuntimeError("nope")
        return x

    t.add_columns({"fl": fl})
    job = t.backfill("fl").job_id
    assert t.get_failed_row_ids("fl") == [2] == t.get_failed_row_ids("fl", job)
    assert t.get_failed_row_addresses(job, "fl") == [2]
    for call in (lambda: t.get_failed_row_ids(job, "fl"), lambda: t.get_failed_row_ids("nope"),
                 lambda: t.get_failed_row_addresses(job, "nope")):
        with pytest.raises(ValueError, match=r"no computed column .*takes \(column, job_id=None\)"):
            call()
    t.drop_columns(["fl"])
    out = subprocess.run([sys.executable, "-m", "mv_assets", "--db", db.uri, "errors", "t"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "errors in t: none" in out.stdout, (out.stdout, out.stderr)


def test_a_batched_udf_returning_text_for_a_number_column_is_refused(db):
    """A batched UDF declared int64 that returns strings fails (Arrow parsed
    "7" into 7 and it was written), as a scalar UDF returning str does;
    dictionary-encoded or large strings for a string column are taken."""
    import pyarrow.compute as pc

    t = db.create_table("t", [{"id": i, "x": i} for i in range(3)], primary_key="id")

    @mv.udf(data_type=pa.int64())
    def as_text(x: pa.Array) -> pa.Array:
        return pc.cast(pc.multiply(x, 7), pa.string())

    @mv.udf(data_type=pa.string())
    def label(x: pa.Array) -> pa.Array:
        return pc.cast(pc.cast(x, pa.string()), pa.large_string()).dictionary_encode()

    t.add_columns({"tx": as_text, "lb": label})
    with pytest.raises(Exception, match="returned string; expected int64"):
        t.backfill("tx")
    t.backfill("lb")
    assert sorted(t.to_arrow()["lb"].to_pylist()) == ["0", "1", "2"]
    assert t.to_arrow()["tx"].to_pylist() == [None, None, None]
