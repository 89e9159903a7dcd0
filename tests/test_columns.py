"""Column lifecycle with the inline runner (no JVM): add_columns in every form,
validation, backfill semantics, alter_columns, load_columns, error capture and
retry. Spark runs the same code in test_spark_columns.py."""

import os
import typing
import warnings
from typing import NamedTuple

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from oracle import count_calls, record_call

import mv_assets as mv


def _rows(n, start=0):
    return [{"id": i, "x": float(i), "n": i % 7, "s": f"s{i}"} for i in range(start, start + n)]


class Dims(NamedTuple):
    height: int
    width: int


@mv.udf
def dbl(x: float) -> float:
    return 2 * x


@mv.udf(version="2")
def triple(x: float) -> float:
    return 3 * x


@mv.udf
def inc(d: float) -> float:  # (reads the computed column d)
    return d + 1


def _values(table, *cols):
    t = table.to_arrow()
    return {r["id"]: tuple(r[c] for c in cols) for r in t.select(["id", *cols]).to_pylist()}


def test_every_add_columns_form_matches_python(db):
    t = db.create_table("t", _rows(50))

    @mv.udf
    def double(x: float) -> float:
        return 2 * x

    @mv.udf
    def add(a: float, b: int) -> float:
        return a + b

    @mv.udf
    def dims(n: int) -> mv.Columns[Dims]:
        return Dims(n + 10, n + 20)

    assert t.add_columns({"twice": double}) == ["twice"]
    assert t.add_columns({"total": (add, ["x", "n"])}) == ["total"]
    assert t.add_columns({"upper": "upper(s)"}) == ["upper"]
    assert t.add_columns(dims) == ["height", "width"]
    assert t.add_columns(mv.UnpackedUDF(dims, prefix="img_")) == ["img_height", "img_width"]
    # SQL columns are filled right away; UDF columns wait for a backfill
    assert _values(t, "upper")[3] == ("S3",)
    assert _values(t, "twice")[3] == (None,)
    assert t.backfill("twice").rows_written == 50
    assert t.backfill("total").rows_written == 50
    r = t.backfill("height")  # siblings come along, the UDF runs once per row
    assert r.columns == ["height", "width", "img_height", "img_width"] and r.udf_rows_computed == 50
    got = _values(t, "twice", "total", "upper", "height", "width", "img_height", "img_width")
    want = {
        i: (2.0 * i, float(i) + i % 7, f"S{i}", i % 7 + 10, i % 7 + 20, i % 7 + 10, i % 7 + 20) for i in range(50)
    }
    assert got == want
    assert {c.name for c in t.computed_columns()} == set(want[0] and [
        "twice", "total", "upper", "height", "width", "img_height", "img_width"])
    # the hidden markers are not part of what readers see
    assert not [n for n in t.to_arrow().column_names if n.startswith("__")]


@mv.udf
def _plain(x: float) -> float:
    return x


@mv.udf
def _typed(s: str) -> float:
    return 1.0


@mv.udf
def _multi(n: int) -> mv.Columns[Dims]:
    return Dims(1, 2)


@pytest.mark.parametrize(
    "transforms, message",
    [
        ({"y": mv.udf(lambda missing: 1.0, data_type=pa.float64())}, "reads column 'missing'"),
        ({"y": (_typed, ["x"])}, "expects str but column 'x' is double"),
        ({"y": _multi}, "returns several columns"),
        ({"x": _plain}, "already exist"),
        (_plain, "returns one column: name it"),
        ({"__computed__y": _plain}, "reserved"),
        ({"_rowid": _plain}, "reserved"),
        ({"y": "no_such_column + 1"}, "invalid SQL expression"),
        ({"y": (_plain, ["x", "n"])}, "has 1 parameters"),
        ({"y": 42}, "expected a SQL expression, a UDF"),
        ({}, "at least one column"),
        ({"X": "x * 3"}, r"only by case are refused .*'X' \('x' exists\)"),  # (it read itself: all NULL)
        (["y"], "add_columns\\(\\) takes"),
        (mv.UnpackedUDF(_multi, prefix="x"), None),  # 'xheight' is fine: a control case
    ],
)
def test_add_columns_validation_fails_before_writing(db, transforms, message):
    t = db.create_table("t", _rows(5))
    before = t.version
    if message is None:
        t.add_columns(transforms)
        assert t.version > before
        return
    with pytest.raises(ValueError, match=message):
        t.add_columns(transforms)
    assert t.version == before
    assert t.schema.names == ["id", "x", "n", "s"]


def test_unpacked_udf_needs_a_multi_column_udf():
    with pytest.raises(ValueError, match="multi-column UDF"):
        mv.UnpackedUDF(_plain, prefix="p_")


def test_backfill_computes_each_row_once_even_when_the_udf_returns_null(db, call_log):
    t = db.create_table("t", _rows(30))

    @mv.udf
    def maybe(x: float) -> float:
        record_call(call_log, "maybe", x)
        return None if int(x) % 3 == 0 else x

    t.add_columns({"m": maybe})
    plan = t.plan_backfill("m")
    assert (plan.rows, plan.rows_to_compute) == (30, 30)
    r = t.backfill("m", checkpoint_size=8)
    assert count_calls(call_log, "maybe") == 30 == r.udf_rows_computed
    assert t.plan_backfill("m").rows == 0  # NULL results count as computed
    assert t.backfill("m").udf_rows_computed == 0
    assert count_calls(call_log, "maybe") == 30
    # new rows: only they are computed
    t.add(_rows(5, start=100))
    assert t.plan_backfill("m").rows == 5
    t.backfill("m")
    assert count_calls(call_log, "maybe") == 35
    # an update of an input makes just those rows stale; an unrelated column does not
    t.update("id < 4", values_sql={"x": "x + 1000"})
    t.update("id >= 20", values={"s": "changed"})
    assert t.plan_backfill("m").rows == 4
    t.backfill("m")
    assert count_calls(call_log, "maybe") == 39
    assert _values(t, "m")[1] == (1001.0,)
    # where= recomputes the rows it selects, computed or not
    plan = t.plan_backfill("m", where="id >= 100")
    assert plan.rows == 5
    t.backfill("m", where="id >= 100")
    assert count_calls(call_log, "maybe") == 44


def test_alter_columns_makes_the_column_stale_and_backfill_recomputes(db, call_log):
    t = db.create_table("t", _rows(12))

    @mv.udf
    def f(x: float) -> float:
        return x + 1

    @mv.udf(version="2")
    def f2(x: float) -> float:
        record_call(call_log, "f2", x)
        return x + 2

    t.add_columns({"y": f})
    t.backfill("y")
    before = t.version
    t.alter_columns({"path": "y", "udf": f2})
    assert _values(t, "y")[5] == (6.0,)  # values untouched until the backfill
    assert t.plan_backfill("y").rows == 12
    t.backfill("y")
    assert _values(t, "y") == {i: (i + 2.0,) for i in range(12)}
    assert count_calls(call_log, "f2") == 12
    assert t.version > before

    @mv.udf
    def wrong(x: float) -> str:
        return "a"

    with pytest.raises(ValueError, match="returns string; the column holds double"):
        t.alter_columns({"path": "y", "udf": wrong})
    with pytest.raises(ValueError, match="not a computed column"):
        t.alter_columns({"path": "x", "udf": f})
    with pytest.raises(ValueError, match="an alteration is"):
        t.alter_columns({"column": "y", "udf": f})


def test_a_column_computed_from_another_is_stale_once_that_one_is_backfilled(db, call_log):
    """e and f read the computed column d: a backfill of d (new values, row
    versions kept) makes the rows it wrote stale in e and f, whether they were
    computed before d had values or from d's old code; their backfills compute
    exactly those rows from the new values (they read current before, with
    NULLs or old values, and no backfill computed them)."""
    t = db.create_table("t", _rows(6))

    @mv.udf
    def inc(d: float) -> float:
        record_call(call_log, "inc", d)
        return d + 1

    t.add_columns({"d": dbl})
    t.add_columns({"e": inc, "f": "d * 10"})
    t.backfill("e")  # d has no value yet: e is NULL (no call), and computed
    t.backfill("f")
    assert count_calls(call_log, "inc") == 0
    t.backfill("d")
    status = {s["column"]: s["stale"] for s in t.column_status()}
    assert status == {"d": 0, "e": 6, "f": 6}
    assert t.plan_backfill("e").rows == 6 and t.plan_backfill("f").rows == 6
    t.backfill("e")
    t.backfill("f")
    assert count_calls(call_log, "inc") == 6
    assert _values(t, "e") == {i: (2.0 * i + 1,) for i in range(6)}
    assert _values(t, "f") == {i: (20.0 * i,) for i in range(6)}
    # d's code changes: after its backfill, e and f follow again; only the rows d wrote
    t.alter_columns({"path": "d", "udf": triple})
    assert {s["column"]: s["stale"] for s in t.column_status()} == {"d": 6, "e": 0, "f": 0}
    t.backfill("d", where="x < 3")
    assert {s["column"]: s["stale"] for s in t.column_status()} == {"d": 3, "e": 3, "f": 3}
    t.backfill("d")
    t.backfill("e")
    t.backfill("f")
    assert count_calls(call_log, "inc") == 12  # (6 more)
    assert _values(t, "e") == {i: (3.0 * i + 1,) for i in range(6)}
    assert _values(t, "f") == {i: (30.0 * i,) for i in range(6)}
    assert all(s["stale"] == 0 for s in t.column_status())


def test_backfill_with_an_override_udf_and_bad_arguments(db):
    t = db.create_table("t", _rows(6))
    t.add_columns({"y": _plain})

    @mv.udf
    def neg(x: float) -> float:
        return -x

    t.backfill("y", udf=neg)
    assert _values(t, "y")[2] == (-2.0,)
    assert t.plan_backfill("y").rows == 6  # computed by another UDF than the column's
    with pytest.raises(ValueError, match="not a computed column"):
        t.backfill("x")
    with pytest.raises(ValueError, match="invalid backfill predicate"):
        t.backfill("y", where="nope > 1")
    with pytest.raises(ValueError, match="one column at a time"):
        t.backfill(["y", "x"])


def test_failed_rows_are_recorded_and_a_retry_fixes_them_after_compaction(db, tmp_path):
    t = db.create_table("t", _rows(40))
    for i in range(40, 80, 10):  # several fragments, so compaction has work
        t.add(_rows(10, start=i))
    broken = tmp_path / "broken"
    broken.write_text("1")

    @mv.udf(on_error="skip")
    def fragile(x: float) -> float:
        if int(x) % 9 == 0 and os.path.exists(str(broken)):
            raise RuntimeError(f"model crashed on {x}")
        return x * 10

    t.add_columns({"y": fragile})
    r = t.backfill("y", checkpoint_size=16)
    bad = {i for i in range(80) if i % 9 == 0}
    assert r.rows_failed == len(bad) and r.rows_written == 80 - len(bad)
    vals = _values(t, "y")
    assert {i for i, (v,) in vals.items() if v is None} == bad
    errors = t.get_errors(job_id=r.job_id)
    assert len(errors) == len(bad)
    e = errors[0]
    assert (e.column, e.udf_name, e.error_type, e.table) == ("y", "fragile", "RuntimeError", "t")
    assert "model crashed" in e.message and "Traceback" in e.traceback and e.attempts == 1
    ids = t.to_arrow().to_pydict()
    rid = dict(zip(lance.dataset(t.uri).to_table(columns=["id"], with_row_id=True).column("id").to_pylist(),
                   lance.dataset(t.uri).to_table(columns=["id"], with_row_id=True).column("_rowid").to_pylist(),
                   strict=True))
    assert t.get_failed_row_ids("y") == sorted(rid[i] for i in bad)
    assert t.get_errors(error_type="KeyError") == [] and ids
    # compaction moves every row: addresses change, stable row ids do not
    t.optimize()
    assert len(lance.dataset(t.uri).get_fragments()) == 1
    broken.unlink()
    fixed = t.retry_errors("y")
    assert fixed.rows_planned == len(bad) and fixed.rows_failed == 0 and fixed.udf_rows_computed == len(bad)
    assert _values(t, "y") == {i: (i * 10.0,) for i in range(80)}
    assert t.get_failed_row_ids("y") == []
    assert len(t.get_errors()) == len(bad)  # history is kept


def test_retry_with_backoff_then_fail_policy(db, tmp_path):
    t = db.create_table("t", _rows(4))
    tries = tmp_path / "tries"
    tries.mkdir()

    @mv.udf(on_error=mv.OnError(retry_on=(ConnectionError,), attempts=3, backoff_s=0.001))
    def flaky(x: float) -> float:
        marker = tries / f"{int(x)}"
        n = int(marker.read_text()) if marker.exists() else 0
        marker.write_text(str(n + 1))
        if n < 2:
            raise ConnectionError("try again")
        return x

    t.add_columns({"y": flaky})
    r = t.backfill("y")
    assert r.rows_failed == 0 and _values(t, "y") == {i: (float(i),) for i in range(4)}
    assert sorted(int(p.read_text()) for p in tries.iterdir()) == [3, 3, 3, 3]

    @mv.udf(on_error=mv.OnError(retry_on=(ConnectionError,), attempts=2, backoff_s=0.001))
    def hopeless(x: float) -> float:
        raise ValueError("bad input")

    t.add_columns({"z": hopeless})
    before = t.version
    with pytest.raises(mv.UdfError, match="UDF 'hopeless' raised ValueError: bad input") as info:
        t.backfill("z")
    assert info.value.attempts == 1  # ValueError is not retried
    assert t.version == before  # nothing committed
    with pytest.raises(ValueError, match="then="):
        mv.OnError(then="ignore")


def test_batched_udf_skip_isolates_the_failing_rows(db):
    t = db.create_table("t", _rows(10))

    @mv.udf(data_type=pa.float64(), on_error="skip")
    def batched(x: pa.Array) -> pa.Array:
        if any(v == 7.0 for v in x.to_pylist()):
            raise ZeroDivisionError("seven")
        return x

    t.add_columns({"y": batched})
    r = t.backfill("y")
    assert r.rows_failed == 1
    assert _values(t, "y") == {i: (None if i == 7 else float(i),) for i in range(10)}


def test_a_failed_job_resumes_from_its_checkpoints_even_after_compaction(db, tmp_path, call_log):
    t = db.create_table("t", _rows(20))
    t.add(_rows(20, start=20))
    stop = tmp_path / "stop"
    stop.write_text("1")

    @mv.udf
    def slow(x: float) -> float:
        record_call(call_log, "slow", x)
        if x >= 30 and stop.exists():
            raise RuntimeError("killed")
        return x + 0.5

    t.add_columns({"y": slow})
    with pytest.raises(RuntimeError, match="killed"):
        t.backfill("y", checkpoint_size=10)
    first = count_calls(call_log, "slow")
    assert first == 31  # three batches finished, the fourth died on its first row
    t.optimize()
    stop.unlink()
    plan = t.plan_backfill("y", checkpoint_size=10)
    assert (plan.batches, plan.batches_checkpointed) == (4, 3)  # compaction kept the checkpoints
    r = t.backfill("y", checkpoint_size=10)
    assert r.batches_resumed == 3 and r.udf_rows_computed == 10
    assert count_calls(call_log, "slow") == first + 10
    assert _values(t, "y") == {i: (i + 0.5,) for i in range(40)}


def test_a_view_selecting_a_column_computed_from_another_follows_both_backfills(db):
    """A view selects e, computed from d: d's backfill makes e stale, and e's
    backfill writes its new values with the same markers as before (row
    versions kept): the view's refreshes took neither for a change and kept
    e's old values, current to its status."""
    t = db.create_table("t", _rows(5))

    t.add_columns({"d": dbl})
    t.add_columns({"e": inc, "f": "d * 10"})
    t.backfill("e")  # (from d's NULLs: NULL, and computed)
    v = db.create_materialized_view("v", t.search(None).select(["id", "e", "f"]))
    v.refresh()
    t.backfill("d")
    t.backfill("e")
    t.backfill("f")
    assert v.refresh().rows_updated == 5
    got = {r["id"]: (r["e"], r["f"]) for r in v.to_arrow().to_pylist()}
    assert got == {i: (2.0 * i + 1, 20.0 * i) for i in range(5)}
    assert v.status().versions_behind == 0 and all(o.passed for o in v.check())


@pytest.mark.parametrize("between", ["a partition refresh", "a history cleanup"])
def test_a_view_over_a_column_computed_from_another_follows_it_without_the_change_feed(db, between):
    """The same backfills of d, then of e (computed from d), when the view's
    refresh compares every row instead of reading the change feed (after a
    fragment-scoped refresh), or when the source's history since its last
    refresh was cleaned up (nothing shows e was computed again: a full
    refresh). It kept the old values of e as current."""
    from datetime import timedelta

    t = db.create_table("t", _rows(4))
    t.add(_rows(4, start=4))

    t.add_columns({"d": dbl})
    t.backfill("d")
    t.add_columns({"e": inc})
    t.backfill("e")
    v = db.create_materialized_view("v", t.search(None).select(["id", "e"]))
    v.refresh()
    if between == "a partition refresh":
        t.add(_rows(1, start=20))
        v.refresh(fragments=[f.fragment_id for f in lance.dataset(t.uri).get_fragments()][-1:])
    t.alter_columns({"path": "d", "udf": triple})
    t.backfill("d")
    t.backfill("e")
    if between == "a history cleanup":
        t.optimize(cleanup_older_than=timedelta(0))
    r = v.refresh()
    assert r.full == (between == "a history cleanup")
    want = {r_["id"]: r_["e"] for r_ in t.to_arrow().to_pylist()}
    assert {r_["id"]: r_["e"] for r_ in v.to_arrow().to_pylist()} == want
    assert all(want[i] == 3.0 * i + 1 for i in want)
    assert all(o.passed for o in v.check())


def test_a_checkpointed_backfill_never_writes_values_computed_from_inputs_changed_meanwhile(db):
    """e (computed from d) is backfilled in checkpointed batches; while it
    computes, d's code changes and d is backfilled: e's commit wrote its
    values, computed from the old d, as current (its commit checks row
    versions, which backfills keep). They stay stale instead."""
    t = db.create_table("t", _rows(40))

    calls = {"n": 0}

    @mv.udf
    def inc(d: float) -> float:
        calls["n"] += 1
        if calls["n"] == 1:  # meanwhile, another writer changes d
            other = db.open_table("t")
            other.alter_columns({"path": "d", "udf": triple})
            other.backfill("d")
        return d + 1

    t.add_columns({"d": dbl})
    t.backfill("d")
    t.add_columns({"e": inc})
    r = t.backfill("e", checkpoint_size=10)
    assert r.rows_written == 0
    assert {s["column"]: s["stale"] for s in t.column_status()} == {"d": 0, "e": 40}
    t.backfill("e", checkpoint_size=10)
    assert _values(t, "e") == {i: (3.0 * i + 1,) for i in range(40)}


def test_a_table_made_again_under_its_name_keeps_nothing_of_the_old_ones_checkpoints(db, tmp_path, call_log):
    """A backfill dies after saving checkpoints; the table is replaced
    (``mode="overwrite"``, or its files removed by another tool and a table
    created again): the new table's rows have the same row ids and versions,
    and took the old rows' results as their own (current, wrong values)."""
    import shutil

    stop = tmp_path / "stop"

    @mv.udf
    def slow(x: float) -> float:
        record_call(call_log, "slow", x)
        if x >= 30 and stop.exists():
            raise RuntimeError("killed")
        return x + 0.5

    for replace in ("overwrite", "by hand"):
        stop.write_text("1")
        t = db.create_table("t", _rows(40))
        t.add_columns({"y": slow})
        with pytest.raises(RuntimeError, match="killed"):
            t.backfill("y", checkpoint_size=10)
        stop.unlink()
        new_rows = [{**r, "x": r["x"] + 1000} for r in _rows(40)]
        if replace == "overwrite":
            t = db.create_table("t", new_rows, mode="overwrite")
        else:
            shutil.rmtree(t.uri)
            t = db.create_table("t", new_rows)
        t.add_columns({"y": slow})
        assert t.plan_backfill("y", checkpoint_size=10).batches_checkpointed == 0
        assert t.backfill("y", checkpoint_size=10).udf_rows_computed == 40
        assert _values(t, "y") == {i: (i + 1000.5,) for i in range(40)}
        db.drop_table("t")


def test_a_sql_column_failing_on_a_written_row_leaves_it_stale_and_the_write_done(db):
    """A SQL column whose expression fails on a row add() writes (a cast that
    does not hold): the add was committed, so it is not reported failed (a
    retry added the row twice, and every later write of the table raised
    after its commit too); the row stays stale, said in a warning, and the
    rows written with it and after it are filled."""
    t = db.create_table("t", [{"id": i, "s": str(i)} for i in range(5)])
    t.add_columns({"n": "CAST(s AS BIGINT)"})
    with pytest.warns(UserWarning, match=r"SQL column 'n' of 't' .* fails on 1 row\(s\)"):
        # (amid rows of its write: a backfill reads ranges of rows, and evaluated it there too)
        t.add([{"id": 101, "s": "101"}, {"id": 100, "s": "abc"}, {"id": 102, "s": "102"}])
    assert t.count_rows() == 8
    with warnings.catch_warnings():  # (row 100 is tried again, without a word: these writes did not write it)
        warnings.simplefilter("error")
        t.add([{"id": 7, "s": "7"}])
        t.update("id = 1", values={"s": "11"})
    values = {r["id"]: r["n"] for r in t.to_arrow().to_pylist()}
    assert values == {0: 0, 1: 11, 2: 2, 3: 3, 4: 4, 100: None, 101: 101, 102: 102, 7: 7}
    assert {s["column"]: s["stale"] for s in t.column_status()} == {"n": 1}
    u = db.create_table("u", [{"id": 1, "s": "1"}, {"id": 2, "s": "two"}])
    with pytest.warns(UserWarning, match="fails on 1 row.*The column was added"):  # (it raised after adding it)
        u.add_columns({"n": "CAST(s AS BIGINT)"})
    assert {r["id"]: r["n"] for r in u.to_arrow().to_pylist()} == {1: 1, 2: None}
    t.update("id = 100", values={"s": "100"})  # its value fixed: filled
    assert {s["column"]: s["stale"] for s in t.column_status()} == {"n": 0}
    assert t.to_arrow().filter(pa.compute.equal(t.to_arrow().column("id"), 100)).column("n").to_pylist() == [100]


def test_an_explicit_backfill_of_a_sql_column_failing_on_rows_names_them(db):
    """An explicit backfill() of a SQL column whose expression fails on some
    rows raises a ValueError naming them and saying what was committed (it
    raised Lance's cast error, naming no row); the others are backfilled once
    those rows are left out."""
    t = db.create_table("t", [{"id": i, "s": str(i)} for i in range(4)])
    t.add_columns({"n": "CAST(s AS BIGINT)"})
    t.add([{"id": 10, "s": "10"}, {"id": 11, "s": "11"}])
    # another tool: a row appended (stale, computable), then row 11 made one the cast fails on (the last fragment)
    lance.write_dataset(pa.table({"id": [20], "s": ["20"]}), t.uri, mode="append")
    lance.dataset(t.uri).update({"s": "'eleven'"}, where="id = 11")
    before = t.version
    with pytest.raises(ValueError, match=r"SQL column 'n' of 't' .* fails on 1 row\(s\) \(row ids \[5\].*"
                                         r"nothing was written"):
        t.backfill("n")
    assert t.version == before
    with pytest.raises(ValueError, match=r"fails on 1 row.*the groups committed before it stand"):
        t.backfill("n", commit_granularity=1)  # (the first fragment's group committed)
    assert {r["id"]: r["n"] for r in t.to_arrow().to_pylist()} == {0: 0, 1: 1, 2: 2, 3: 3, 10: 10, 11: 11, 20: 20}
    assert {s["column"]: s["stale"] for s in t.column_status()} == {"n": 1}  # (row 11: its old value, stale)
    t.update("id = 11", values={"s": "11"})  # (fills it too)
    t.backfill("n", where="id = 11")
    assert {s["column"]: s["stale"] for s in t.column_status()} == {"n": 0}
    assert t.to_arrow().filter(pa.compute.equal(t.to_arrow().column("id"), 11)).column("n").to_pylist() == [11]
    # the failing row amid the rows to compute (one fragment), left out with where=: the others are computed
    # (the backfill's range scan evaluated the expression on it too, and failed)
    lance.dataset(t.uri).merge_insert("id").when_matched_update_all().execute(
        pa.table({"id": [1, 2, 3], "s": ["21", "twenty-two", "23"]}))
    with pytest.raises(mv.SqlRowsError, match=r"fails on 1 row"):
        t.backfill("n")
    t.backfill("n", where="id <> 2")
    assert {r["id"]: r["n"] for r in t.to_arrow().to_pylist() if r["id"] < 4} == {0: 0, 1: 21, 2: 2, 3: 23}
    assert {s["column"]: s["stale"] for s in t.column_status()} == {"n": 1}


def test_a_udf_backfill_failing_after_some_groups_committed_says_so_and_its_job_failed(db):
    """backfill(commit_granularity=1) whose UDF fails (on_error="fail") in the
    last of four fragments: three groups committed. Its error said "Nothing
    was committed", and its job read DONE with no error (its commits made it
    a job that completed; the row that stopped it was taken for a skipped
    one). The error now says what stands, and the job is FAILED after its
    commits. A backfill skipping rows (on_error="skip") stays DONE."""
    t = db.create_table("t", [{"id": i} for i in range(10)], primary_key="id")
    for k in range(1, 4):
        lance.write_dataset(pa.table({"id": pa.array(range(10 * k, 10 * k + 10), pa.int64())}), t.uri, mode="append")

    @mv.udf
    def c(id: int) -> int:
        if id == 35:
            raise ValueError("boom at 35")
        return id

    t.add_columns({"c": c})
    before = t.version
    with pytest.raises(mv.UdfError, match=r"The 3 commit\(s\) of this backfill before it stand .*30 rows of 3 of "
                                          r"its 4 fragments\); the rest was not committed"):
        t.backfill("c", commit_granularity=1)
    assert t.version == before + 3
    (job,) = db.list_jobs()
    assert (str(job.status), job.error, job.metric("rows")) == ("FAILED", "ValueError: boom at 35", 30)
    assert job.events[-1].endswith("Job failed after 3 commit(s) (they stand): ValueError: boom at 35")
    with pytest.raises(mv.UdfError, match="Nothing was committed"):  # (its first group fails: nothing stands)
        t.backfill("c", commit_granularity=1)

    @mv.udf(on_error="skip")
    def d(id: int) -> int:
        if id % 10 == 5:
            raise ValueError("skipped")
        return id

    t.add_columns({"d": d})
    done = t.backfill("d", commit_granularity=1)
    job = next(j for j in db.list_jobs() if j.job_id == done.job_id)
    assert (str(job.status), job.metric("errors"), job.error) == ("DONE", 4, None)
    assert job.metric("rows") == done.rows_written == 36  # (the 4 skipped rows are written NULL: not counted)


def test_a_sql_column_a_view_cannot_compute_for_some_rows_is_refused_before_it_is_added(db):
    """add_columns() of a SQL column to a view whose expression fails on some
    of the rows it selects (its refreshes evaluate it on them: a full one
    would fail) is refused naming the source rows, and nothing is added (the
    column was added, then Lance's cast error raised)."""
    t = db.create_table("t", [{"id": 1, "s": "1"}, {"id": 2, "s": "abc"}, {"id": 3, "s": "3"}])
    v = db.create_materialized_view("v", t.search(None).where("id > 0").select({"id": "id", "s": "s"}))
    v.refresh()
    version = v.version
    with pytest.raises(mv.SqlRowsError, match=r"SQL column 'n' of view 'v' .* fails on 1 row\(s\) of 't' "
                                              r"\(row ids \[1\].*nothing was added") as raised:
        v.add_columns({"n": "CAST(s AS BIGINT)"})
    assert raised.value.rows == [1]
    assert v.version == version and "n" not in v.to_arrow().column_names
    w = db.create_materialized_view("w", t.search(None).where("id <> 2").select({"id": "id", "s": "s"}))
    w.refresh()
    w.add_columns({"n": "CAST(s AS BIGINT)"})  # (the row it fails on is not the view's)
    assert sorted(w.to_arrow().column("n").to_pylist()) == [1, 3]


def test_backfill_async_returns_a_job(db):
    t = db.create_table("t", _rows(10))
    t.add_columns({"y": _plain})
    job = t.backfill_async("y")
    result = job.result(timeout=60)
    assert job.done() and result.rows_written == 10 and result.job_id == job.job_id
    with pytest.raises(ValueError, match="not a computed column"):
        t.backfill_async("nope")


def test_load_columns_from_parquet_lance_and_ipc(db, tmp_path):
    t = db.create_table("t", _rows(10), primary_key="id")
    ext = pa.table({"id": [1, 2, 3, 42], "emb": [[1.0], [2.0], [3.0], [42.0]], "label": ["a", "b", "c", "z"]})
    pq.write_table(ext, tmp_path / "ext.parquet")
    lance.write_dataset(ext, str(tmp_path / "ext.lance"))
    with pa.OSFile(str(tmp_path / "ext.arrow"), "wb") as sink, pa.ipc.new_file(sink, ext.schema) as w:
        w.write_table(ext)

    v = t.load_columns(str(tmp_path / "ext.parquet"), "id", ["label"])
    assert v == t.version
    assert _values(t, "label") == {i: ({1: "a", 2: "b", 3: "c"}.get(i),) for i in range(10)}
    # carry keeps values of unmatched rows; null clears them
    upd = pa.table({"id": [2, 5], "label": ["B", "F"]})
    pq.write_table(upd, tmp_path / "upd.parquet")
    t.load_columns(str(tmp_path / "upd.parquet"), "id", ["label"], on_missing="carry")
    assert _values(t, "label") == {i: ({1: "a", 2: "B", 3: "c", 5: "F"}.get(i),) for i in range(10)}
    t.load_columns(str(tmp_path / "ext.lance"), "id", ["emb", "label"], on_missing="null")
    assert _values(t, "emb", "label") == {
        i: ({1: ([1.0], "a"), 2: ([2.0], "b"), 3: ([3.0], "c")}.get(i, (None, None))) for i in range(10)
    }
    before = t.version
    with pytest.raises(ValueError, match="have no match"):
        t.load_columns(str(tmp_path / "ext.arrow"), "id", ["label"], on_missing="error")
    assert t.version == before
    t.load_columns([str(tmp_path / "ext.arrow")], "id", ["label"], source_format="ipc")
    dup = pa.table({"id": [1, 1], "label": ["x", "y"]})
    pq.write_table(dup, tmp_path / "dup.parquet")
    for args, message in [
        ((str(tmp_path / "dup.parquet"), "id", ["label"]), "duplicate primary keys"),
        ((str(tmp_path / "ext.parquet"), "id", ["nope"]), "not in the source"),
        ((str(tmp_path / "ext.parquet"), "nope", ["label"]), "primary key 'nope'"),
        ((str(tmp_path / "ext.parquet"), "id", "label"), "non-empty list"),
        ((str(tmp_path / "ext.csv"), "id", ["label"]), "cannot tell the format"),
    ]:
        with pytest.raises(ValueError, match=message):
            t.load_columns(*args)
    with pytest.raises(ValueError, match="on_missing"):
        t.load_columns(str(tmp_path / "ext.parquet"), "id", ["label"], on_missing="skip")
    assert t.version == before + 1


def test_load_columns_from_data_in_memory(db):
    """Columns loaded from an Arrow table, a record batch or a pandas frame
    (it failed with "'pyarrow.lib.Table' object has no attribute 'endswith'");
    anything else is refused in words, nothing written."""
    t = db.create_table("t", _rows(6), primary_key="id")
    ext = pa.table({"id": [1, 2], "q": [10, 20]})
    t.load_columns(ext, "id", ["q"])
    assert _values(t, "q") == {i: ({1: 10, 2: 20}.get(i),) for i in range(6)}
    ds = lance.dataset(t.uri)  # (its commit said "2 files": len() of a table is its rows)
    assert "Table in memory, 2 rows" in ds.read_transaction(ds.version).transaction_properties["mv_assets.load_columns"]
    t.load_columns(pa.record_batch({"id": [3], "q": [30]}), "id", ["q"])
    t.load_columns(pa.table({"id": [4], "q": [40]}).to_pandas(), "id", ["q"])
    assert t.load_columns_async(pa.table({"id": [5], "q": [50]}), "id", ["q"]).result(timeout=60) == t.version
    assert _values(t, "q") == {i: ({1: 10, 2: 20, 3: 30, 4: 40, 5: 50}.get(i),) for i in range(6)}
    before = t.version
    with pytest.raises(ValueError, match="not in the source"):
        t.load_columns(ext, "id", ["nope"])
    with pytest.raises(ValueError, match="source_format"):
        t.load_columns(ext, "id", ["q"], source_format="parquet")
    with pytest.raises(ValueError, match="a path or URI"):
        t.load_columns(42, "id", ["q"])
    assert t.version == before


def test_udf_columns_on_a_view_follow_refreshes(db, call_log):
    t = db.create_table("t", _rows(20))
    v = db.create_materialized_view("v", t.search(None).where("n < 5").select(["id", "x"]), with_no_data=False)

    @mv.udf
    def cube(x: float) -> float:
        record_call(call_log, "cube", x)
        return x ** 3

    v.add_columns({"c": cube})
    assert v.refresh_state().definition == v.definition.shape_fingerprint()
    assert {c.name for c in v.computed_columns()} == {"c"}
    r = v.backfill("c")
    passing = [i for i in range(20) if i % 7 < 5]
    assert r.rows_written == len(passing) and count_calls(call_log, "cube") == len(passing)
    t.add(_rows(10, start=20))
    res = v.refresh()
    assert not res.full and res.udf_rows_computed == {"c": sum(1 for i in range(20, 30) if i % 7 < 5)}
    want = {i: (i ** 3.0,) for i in range(30) if i % 7 < 5}
    assert _values(v, "c") == want
    assert v.plan_backfill("c").rows == 0
    # a new UDF version: stale rows, no full refresh
    v.alter_columns({"path": "c", "udf": mv.udf(lambda x: -x, data_type=pa.float64(), name="neg", input_columns=["x"])})
    assert not v.refresh().full
    assert v.plan_backfill("c").rows == len(want)
    v.backfill("c")
    assert _values(v, "c") == {i: (-float(i),) for i in want}
    with pytest.raises(ValueError, match="reads column 'nope'"):
        v.add_columns({"d": mv.udf(lambda nope: 1.0, data_type=pa.float64())})
    with pytest.raises(ValueError, match="materialized view"):
        v.load_columns("x.parquet", "id", ["y"])


def test_views_see_a_backfilled_column_of_their_source(db):
    t = db.create_table("t", _rows(8))
    t.add_columns({"y": _plain})
    v = db.create_materialized_view("v", t.search(None).select(["id", "y"]), with_no_data=False)
    assert _values(v, "y") == {i: (None,) for i in range(8)}
    t.backfill("y")
    r = v.refresh()
    assert not r.full and r.rows_updated == 8
    assert _values(v, "y") == {i: (float(i),) for i in range(8)}


def test_refresh_records_rows_a_view_udf_skipped(db):
    t = db.create_table("t", _rows(10))

    @mv.udf(on_error="skip")
    def inv(x: float) -> float:
        return 1 / x

    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "r": inv}), with_no_data=False)
    assert _values(v, "r")[0] == (None,) and _values(v, "r")[4] == (0.25,)
    errors = v.get_errors(column_name="r")
    assert [(e.error_type, e.row_id) for e in errors] == [("ZeroDivisionError", v.to_arrow(with_internal=True).column("__source_row_id")[0].as_py())]
    assert errors[0].job_id.startswith("refresh-1")
    assert v.get_failed_row_ids("r") == [errors[0].row_id]
    assert v.plan_backfill("r").rows == 1  # the failed row is not computed: a backfill retries it


# -- property test: random histories of table writes and backfills -------------

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_STEP = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 15)),
    st.tuples(st.just("delete"), st.integers(0, 6)),
    st.tuples(st.just("update_input"), st.integers(0, 6)),
    st.tuples(st.just("update_other"), st.integers(0, 6)),
    st.tuples(st.just("optimize"), st.just(0)),
    st.tuples(st.just("backfill"), st.integers(1, 12)),
    st.tuples(st.just("alter"), st.integers(1, 3)),
    st.tuples(st.just("partial"), st.integers(0, 6)),
    st.tuples(st.just("refresh"), st.integers(0, 1)),
)


@settings(max_examples=int(os.environ.get("MV_ASSETS_HYPOTHESIS_EXAMPLES", "12")), deadline=None,
          suppress_health_check=list(HealthCheck), derandomize=True)
@given(steps=st.lists(_STEP, min_size=1, max_size=10))
@example(steps=[("refresh", 0), ("backfill", 3), ("refresh", 0), ("alter", 1), ("backfill", 2), ("refresh", 1)])
@example(steps=[("backfill", 4), ("refresh", 0), ("update_input", 1), ("optimize", 0), ("backfill", 5),
                ("update_other", 2), ("refresh", 0)])
@example(steps=[("backfill", 2), ("add", 3), ("backfill", 4), ("optimize", 0), ("add", 2), ("backfill", 6),
                ("partial", 1), ("add", 1), ("backfill", 8), ("alter", 1), ("add", 2), ("backfill", 2),
                ("delete", 1), ("add", 4), ("backfill", 10)])
def test_random_histories_keep_computed_columns_exact(tmp_path_factory, steps):
    """After every backfill each row holds f(x) for the column's current UDF;
    a backfill computes exactly the rows that are stale (oracle: plain Python
    over the rows, tracking which rows changed since they were computed)."""
    db = mv.connect(str(tmp_path_factory.mktemp("h") / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", _rows(10))
    k = {"v": 1}

    def make(kk):
        return mv.udf(lambda x: x * 10 + kk, data_type=pa.float64(), name="f", input_columns=["x"], version=str(kk))

    t.add_columns({"y": make(1)})
    calls = str(tmp_path_factory.mktemp("calls"))

    @mv.udf
    def blind_udf(s: str) -> str:
        record_call(calls, "blind", s)
        return s.upper()

    @mv.udf
    def mixed_udf(s: str) -> str:
        record_call(calls, "mixed", s)
        return s.upper()

    reads = db.create_materialized_view("reads", t.search(None).where("y > 40").select(["id", "y"]))
    blind = db.create_materialized_view("blind", t.search(None).select({"id": "id", "u": blind_udf}))
    # selects y beside a UDF not reading it: backfills rewrite its rows, the UDF called as the blind one's
    mixed = db.create_materialized_view("mixed", t.search(None).select({"id": "id", "y": "y", "u": mixed_udf}))
    dirty: set[int] = set(range(10))  # rows user writes touched since the blind view's last refresh
    computed_with: dict[int, tuple] = {}  # id -> (x, k) the value was computed from
    next_id = 10
    for op, arg in steps:
        if op == "add":
            t.add(_rows(arg, start=next_id))
            dirty.update(range(next_id, next_id + arg))
            next_id += arg
        elif op == "delete":
            t.delete(f"n = {arg}")
        elif op == "update_input":
            t.update(f"n = {arg}", values_sql={"x": "x + 0.5"})
            dirty.update(r["id"] for r in t.to_arrow().to_pylist() if r["n"] == arg)
        elif op == "update_other":
            t.update(f"n = {arg}", values={"s": "changed"})
            dirty.update(r["id"] for r in t.to_arrow().to_pylist() if r["n"] == arg)
        elif op == "optimize":
            t.optimize()
        elif op == "alter":
            k["v"] += arg
            t.alter_columns({"path": "y", "udf": make(k["v"])})
        current = {r["id"]: r for r in t.to_arrow().to_pylist()}
        stale = {i for i, r in current.items() if computed_with.get(i) != (r["x"], k["v"])}
        if op == "partial":
            sel = {i for i in stale if current[i]["n"] == arg}
            plan = t.plan_backfill("y", where=f"n = {arg}")
            assert plan.rows == sum(1 for r in current.values() if r["n"] == arg)
            t.backfill("y", where=f"n = {arg}")
            for i in {i for i, r in current.items() if r["n"] == arg}:
                computed_with[i] = (current[i]["x"], k["v"])
            assert sel <= {i for i in current if current[i]["n"] == arg}
        elif op == "refresh":
            before = count_calls(calls, "blind")
            mixed_before = count_calls(calls, "mixed")
            reads.refresh(mode="full" if arg else "auto")
            blind.refresh()
            mixed.refresh()
            src_now = {r["id"]: r for r in lance.dataset(t.uri).to_table(
                columns=["id", "s", "y", "_row_last_updated_at_version"]).to_pylist()}
            assert _values(reads, "y") == {
                i: (r["y"],) for i, r in src_now.items() if r["y"] is not None and r["y"] > 40
            }
            assert _values(blind, "u") == {i: (r["s"].upper(),) for i, r in src_now.items()}
            # the blind view computed exactly the rows user writes touched: backfills are invisible to it
            assert count_calls(calls, "blind") - before == len(dirty & set(src_now))
            assert count_calls(calls, "mixed") - mixed_before == len(dirty & set(src_now))
            assert _values(mixed, "y", "u") == {i: (r["y"], r["s"].upper()) for i, r in src_now.items()}
            dirty = set()
        elif op == "backfill":
            assert t.plan_backfill("y").rows == len(stale)
            # odd: the staged path in batches of `arg` rows; even: one pass (later plans narrowed to new fragments)
            r = t.backfill("y", checkpoint_size=arg) if arg % 2 else t.backfill("y")
            assert r.udf_rows_computed == len(stale) == r.rows_written
            for i in stale:
                computed_with[i] = (current[i]["x"], k["v"])
            got = {i: row["y"] for i, row in ((r_["id"], r_) for r_ in t.to_arrow().to_pylist())}
            assert got == {i: current[i]["x"] * 10 + k["v"] for i in current}
    assert t.count_rows() == len({r["id"] for r in t.to_arrow().to_pylist()})


def test_backfill_of_a_column_a_view_does_not_read_costs_the_view_nothing(db, call_log):
    t = db.create_table("t", _rows(20))

    @mv.udf
    def tagged(x: float) -> float:
        record_call(call_log, "view_udf", x)
        return x

    t.add_columns({"y": _plain, "s2": "concat(s, '!')"})
    blind = db.create_materialized_view("blind", t.search(None).select({"id": "id", "z": tagged}), with_no_data=False)
    reads = db.create_materialized_view("reads", t.search(None).where("y > 5").select({"id": "id", "y": "y"}),
                                        with_no_data=False)
    assert reads.count_rows() == 0  # y is NULL everywhere until the backfill
    assert count_calls(call_log, "view_udf") == 20
    t.backfill("y")
    r = blind.refresh()
    assert (r.rows_inserted, r.rows_updated, r.rows_deleted, r.udf_rows_computed) == (0, 0, 0, {})
    assert count_calls(call_log, "view_udf") == 20
    r2 = reads.refresh()
    assert not r2.full and r2.rows_inserted == 14  # the backfill made rows pass the filter
    assert _values(reads, "y") == {i: (float(i),) for i in range(6, 20)}
    # a new UDF version changes values: the reading view follows, the blind one does not care
    t.alter_columns({"path": "y", "udf": mv.udf(lambda x: -x, data_type=pa.float64(), name="neg", input_columns=["x"])})
    t.backfill("y")
    assert reads.refresh().rows_deleted == 14 and reads.count_rows() == 0
    assert blind.refresh().udf_rows_computed == {} and count_calls(call_log, "view_udf") == 20
    # sync-mode refreshes (by fragment) agree: nothing left to do
    assert reads.plan_refresh(fragments=[0]).is_noop and blind.plan_refresh(fragments=[0]).is_noop


def test_a_backfill_of_a_column_no_view_udf_reads_rewrites_the_view_rows_without_calling_its_udfs(db, call_log):
    """A view selecting a source's computed column ``y`` beside a UDF of
    other columns: a backfill of ``y`` with new code (values rewritten, no
    row version moved) recomputed the view's UDF on every row (a model run
    again over the whole view). Its rows are rewritten with the new values,
    their UDF values kept; a UDF reading ``y`` is computed again; rows also
    updated since are computed whole."""
    t = db.create_table("t", _rows(20), primary_key="id")

    @mv.udf
    def model(s: str) -> str:
        record_call(call_log, "model", s)
        return s.upper()

    @mv.udf
    def of_y(y: float) -> float:
        record_call(call_log, "of_y", y)
        return -y

    t.add_columns({"y": _plain})
    t.backfill("y")
    v = db.create_materialized_view("v", t.search(None).where("n != 3").select(
        {"id": "id", "y": "y", "y2": "y * 2", "m": model}), with_no_data=False)
    w = db.create_materialized_view("w", t.search(None).select({"id": "id", "m": model, "ny": of_y}),
                                    with_no_data=False)
    held = v.count_rows()
    assert count_calls(call_log, "model") == held + 20 and count_calls(call_log, "of_y") == 20
    t.alter_columns({"path": "y", "udf": mv.udf(lambda x: x + 100, data_type=pa.float64(), name="shifted",
                                                input_columns=["x"])})
    t.backfill("y")
    t.update(where="id = 4", values={"s": "changed"})  # this row also changed: computed whole
    plan = v.plan_refresh()
    assert plan.udf_rows == {"m": 1} and plan.rows_to_update == held
    r = v.refresh()
    assert not r.full and r.udf_rows_computed == {"m": 1} and r.rows_updated == held
    assert count_calls(call_log, "model") == held + 20 + 1
    expected = {i: (i + 100.0, 2 * (i + 100.0), ("changed" if i == 4 else f"s{i}").upper())
                for i in range(20) if i % 7 != 3}
    assert _values(v, "y", "y2", "m") == expected
    assert all(c.passed for c in v.check())
    r = w.refresh()  # its UDF reads y: computed again; the other UDF of the row too (one task computes the row)
    assert r.udf_rows_computed == {"m": 20, "ny": 20} and count_calls(call_log, "of_y") == 40
    assert _values(w, "ny") == {i: (-(i + 100.0),) for i in range(20)}
    assert v.refresh().nothing_done() and w.refresh().nothing_done()
    # the same by fragment (a Dagster partition's refresh)
    t.alter_columns({"path": "y", "udf": mv.udf(lambda x: x + 200, data_type=pa.float64(), name="shifted2",
                                                input_columns=["x"])})
    t.backfill("y")
    calls = count_calls(call_log, "model")
    r = v.refresh(fragments=[f.fragment_id for f in lance.dataset(t.uri).get_fragments()])
    assert not any(r.udf_rows_computed.values()) and r.rows_updated == held and count_calls(call_log, "model") == calls
    assert _values(v, "y", "m") == {i: (i + 200.0, m) for i, (_, _, m) in expected.items()}
    assert all(c.passed for c in v.check())


def _chained(db):
    """t (id, x, s, n) with y = x * 10 + k and z = y + 0.5, computed columns, z from y."""
    t = db.create_table("t", [{"id": i, "x": float(i), "s": f"s{i}", "n": i % 5} for i in range(10)], primary_key="id")
    t.add_columns({"y": _ycode(0)})
    t.add_columns({"z": mv.udf(lambda y: y + 0.5, data_type=pa.float64(), name="zcode", input_columns=["y"],
                               version="z1")})
    return t


def _ycode(k):
    return mv.udf(lambda x: x * 10 + k, data_type=pa.float64(), name=f"ycode{k}", input_columns=["x"], version=f"y{k}")


@pytest.mark.parametrize("where", [None, "z > 30"])
def test_a_view_of_a_chained_column_follows_its_values_whatever_its_markers_at_both_ends(db, call_log, where):
    """z = f(y): backfills of y then z, then y's code swapped and y backfilled
    again (z's markers NULL again, its values kept). The markers of z were
    NULL at both ends, so the refresh saw nothing: the view stayed empty (or
    held NULLs) while the query gave 7 (10) rows, status LOADED and current,
    and no later refresh repaired it."""
    t = _chained(db)

    @mv.udf
    def m(s: str) -> str:
        record_call(call_log, "m", s)
        return s.upper()

    q = t.search(None) if where is None else t.search(None).where(where)
    v = db.create_materialized_view("v", q.select({"id": "id", "z": "z", "m": m}), with_no_data=False)
    t.backfill("y")
    t.backfill("z")
    t.alter_columns({"path": "y", "udf": _ycode(4)})
    t.backfill("y")
    v.refresh()
    src = lance.dataset(t.uri, version=v.source_version).to_table(filter=where).to_pylist()
    assert _values(v, "z", "m") == {r["id"]: (r["z"], r["s"].upper()) for r in src} and len(src) >= 7
    assert all(c.passed for c in v.check()) and v.refresh().nothing_done()


def test_backfills_of_a_chain_call_only_the_udfs_whose_inputs_changed(db, call_log):
    """A view of z (computed from y) and a UDF of s: two backfills of y with
    new code recomputed the UDF on every row (the first kept it); a view of z
    and a UDF of y: a backfill of some rows of y with the same code, then of
    z, recomputed the UDF of y where nothing had changed. Their rows are read
    again with their UDF values kept."""
    t = _chained(db)
    t.backfill("y")
    t.backfill("z")

    @mv.udf
    def of_s(s: str) -> str:
        record_call(call_log, "of_s", s)
        return s.upper()

    @mv.udf
    def of_y(y: float) -> float:
        record_call(call_log, "of_y", y)
        return y * 3

    a = db.create_materialized_view("a", t.search(None).select({"id": "id", "z": "z", "z1": "z + 1", "u": of_s}),
                                    with_no_data=False)
    b = db.create_materialized_view("b", t.search(None).select({"id": "id", "z": "z", "u": of_y}), with_no_data=False)
    assert count_calls(call_log, "of_s") == 10 and count_calls(call_log, "of_y") == 10
    for k in (1, 2):  # two swaps of y's code, each backfilled (z's markers NULL after each)
        t.alter_columns({"path": "y", "udf": _ycode(k)})
        t.backfill("y")
    t.backfill("z")
    r = a.refresh()
    assert r.rows_updated == 10 and not any(r.udf_rows_computed.values()) and count_calls(call_log, "of_s") == 10
    src = {r_["id"]: r_ for r_ in lance.dataset(t.uri).to_table().to_pylist()}
    assert _values(a, "z", "z1", "u") == {i: (r_["z"], r_["z"] + 1, r_["s"].upper()) for i, r_ in src.items()}
    r = b.refresh()  # y changed on every row: its UDF is called on every row
    assert r.udf_rows_computed == {"u": 10} and count_calls(call_log, "of_y") == 20
    t.backfill("y", where="n = 1")  # rows 1 and 6: the same code, the same values; their z markers cleared
    t.backfill("z")  # and set again: the same values
    r = b.refresh()
    assert not any(r.udf_rows_computed.values()) and count_calls(call_log, "of_y") == 20
    src = {r_["id"]: r_ for r_ in lance.dataset(t.uri).to_table().to_pylist()}
    assert _values(b, "z", "u") == {i: (r_["z"], r_["y"] * 3) for i, r_ in src.items()}
    assert all(c.passed for c in b.check()) and all(c.passed for c in a.check())


def test_rows_changed_while_a_backfill_computes_are_left_stale(db, tmp_path):
    t = db.create_table("t", _rows(30))
    once = tmp_path / "once"

    @mv.udf
    def meddling(x: float) -> float:
        if x == 10.0 and not once.exists():  # a concurrent writer, mid-job
            once.write_text("1")
            t.update("id = 20", values_sql={"x": "x + 100"})
            t.delete("id = 25")
            t.add([{"id": 99, "x": 99.0, "n": 1, "s": "new"}])
        return x

    t.add_columns({"y": meddling})
    r = t.backfill("y", checkpoint_size=8)
    assert r.rows_planned == 30 and r.rows_skipped == 2 and r.rows_written == 28  # 20 (updated), 25 (deleted)
    vals = _values(t, "y")
    assert vals[20] == (None,) and vals[99] == (None,) and 25 not in vals
    assert all(vals[i] == (float(i),) for i in range(30) if i not in (20, 25))
    assert t.plan_backfill("y").rows == 2  # the updated row and the new one
    t.backfill("y")
    assert _values(t, "y")[20] == (120.0,) and _values(t, "y")[99] == (99.0,)


def test_a_view_column_reading_an_untracked_computed_source_column_is_refused(db):
    t = db.create_table("t", _rows(5))
    t.add_columns({"y": _plain})
    v = db.create_materialized_view("v", t.search(None).select(["id", "x"]), with_no_data=False)

    @mv.udf
    def from_y(y: float) -> float:
        return y

    with pytest.raises(ValueError, match="does not select"):
        v.add_columns({"z": from_y})
    w = db.create_materialized_view("w", t.search(None).select(["id", "y"]), with_no_data=False)
    assert w.add_columns({"z": from_y}) == ["z"]  # w keeps y's markers: allowed


_VIEW_STEP = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 15)),
    st.tuples(st.just("delete"), st.integers(0, 6)),
    st.tuples(st.just("update_input"), st.integers(0, 6)),
    st.tuples(st.just("optimize"), st.just(0)),
    st.tuples(st.just("refresh"), st.integers(0, 1)),
    st.tuples(st.just("alter"), st.integers(1, 3)),
    st.tuples(st.just("backfill"), st.integers(1, 12)),
)


@settings(max_examples=int(os.environ.get("MV_ASSETS_HYPOTHESIS_EXAMPLES", "12")), deadline=None,
          suppress_health_check=list(HealthCheck), derandomize=True)
@given(steps=st.lists(_VIEW_STEP, min_size=1, max_size=10))
@example(steps=[("alter", 1), ("update_input", 2), ("add", 5), ("backfill", 2), ("optimize", 0), ("alter", 1),
                ("backfill", 3), ("refresh", 0), ("backfill", 4)])
def test_random_histories_keep_a_view_udf_column_exact(tmp_path_factory, steps):
    """A view's UDF column through source writes, refreshes, code changes and
    backfills (odd: staged in batches of that many rows; even: one pass).
    Oracle, plain pyarrow over the view's and the source's files: a backfill
    computes exactly the stale view rows whose source row is unchanged since
    the view's refresh, with the current code, and touches no other row; a
    refresh gives the view of the source at its version with the current code."""
    from mv_assets.model.names import computed_marker

    MARKER = computed_marker("y")  # noqa: N806
    db = mv.connect(str(tmp_path_factory.mktemp("hv") / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", _rows(20))
    t.add(_rows(10, start=20))
    k = {"v": 1}

    def make(kk):
        return mv.udf(lambda x: x * 10 + kk, data_type=pa.float64(), name="f", input_columns=["x"], version=str(kk))

    view = db.create_materialized_view("v", t.search(None).where("n != 3").select({"id": "id", "y": make(1)}))
    view.refresh()
    next_id = 30
    for op, arg in steps:
        if op == "add":
            t.add(_rows(arg, start=next_id))
            next_id += arg
        elif op == "delete":
            t.delete(f"n = {arg}")
        elif op == "update_input":
            t.update(f"n = {arg}", values_sql={"x": "x + 0.5"})
        elif op == "optimize":
            t.optimize()
        elif op == "alter":
            k["v"] += arg
            view.alter_columns({"path": "y", "udf": make(k["v"])})
        elif op == "refresh":
            view.refresh(mode="full" if arg else "auto")
            _check_view_rows(view, t, k["v"], MARKER)
        elif op == "backfill":
            fp = view.computed_columns()[0].fingerprint
            v_rows = lance.dataset(view.uri).to_table(
                columns=["id", "y", "__source_row_id", "__source_row_version", MARKER]).to_pylist()
            s_rows = {r["_rowid"]: r for r in lance.dataset(t.uri).to_table(
                columns=["x", "_row_last_updated_at_version"], with_row_id=True).to_pylist()}
            due = {r["id"]: s_rows[r["__source_row_id"]]["x"] * 10 + k["v"] for r in v_rows
                   if r[MARKER] != fp and r["__source_row_id"] in s_rows
                   and s_rows[r["__source_row_id"]]["_row_last_updated_at_version"] == r["__source_row_version"]}
            before = {r["id"]: r["y"] for r in v_rows}
            r = view.backfill("y", checkpoint_size=arg) if arg % 2 else view.backfill("y")
            assert r.rows_written == r.udf_rows_computed == len(due)
            assert {i: y for i, (y,) in _values(view, "y").items()} == {**before, **due}
    # in the end: a refresh and a backfill give every row of the source through the current code
    view.refresh()
    view.backfill("y")
    src = lance.dataset(t.uri).to_table(columns=["id", "x", "n"]).to_pylist()
    assert _values(view, "y") == {r["id"]: (r["x"] * 10 + k["v"],) for r in src if r["n"] != 3}


def _check_view_rows(view, t, k: int, marker: str) -> None:
    """After a refresh: the view has the source's passing rows; those its
    current code computed hold f(x) (a code change leaves the others to the
    next backfill)."""
    src = {r["id"]: r for r in lance.dataset(t.uri).to_table(columns=["id", "x", "n"]).to_pylist()}
    fp = view.computed_columns()[0].fingerprint
    rows = lance.dataset(view.uri).to_table(columns=["id", "y", marker]).to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(i for i, r in src.items() if r["n"] != 3)
    assert all(r["y"] == src[r["id"]]["x"] * 10 + k for r in rows if r[marker] == fp)


def test_load_columns_refuses_bad_columns_before_writing_and_says_what_a_new_column_committed(db):
    """A column named twice, or a pandas column pyarrow cannot type, is refused
    with a ValueError before anything is written (they failed with a KeyError
    and an ArrowInvalid from inside); a new column whose source matches no row
    is still added (all NULL), and the call returns that commit's version (it
    returned None, as when nothing changed, after committing the column)."""
    t = db.create_table("t", _rows(4), primary_key="id")
    before = t.version
    with pytest.raises(ValueError, match="named more than once"):
        t.load_columns(pa.table({"id": [1], "q": [10]}), "id", ["q", "q"])
    mixed = pa.table({"id": [1, 2]}).to_pandas()
    mixed["q"] = [1, "a"]
    with pytest.raises(ValueError, match="column 'q'.*cannot be read as one Arrow type"):
        t.load_columns(mixed, "id", ["q"])
    assert t.version == before and "q" not in t.schema.names
    v = t.load_columns(pa.table({"id": [100], "q": [10]}), "id", ["q"])
    assert v is not None and v == t.version > before
    assert "q" in t.schema.names and _values(t, "q") == {i: (None,) for i in range(4)}
    assert t.load_columns(pa.table({"id": [100], "q": [10]}), "id", ["q"]) is None  # nothing changed
    assert t.version == v


def test_names_with_a_dot_and_legacy_tables_are_refused_in_words_before_writing(db):
    """A column name with a '.' (add_columns, load_columns, alter_columns'
    rename, a view's output, an aggregate's) and add_columns / load_columns on
    a table in Lance's legacy file format raise ValueError naming the cause,
    nothing written (they failed with an OSError from inside Lance's writer)."""
    t = db.create_table("t", pa.table({"id": pa.array([1, 2], pa.int64()), "a": pa.array([1, 2], pa.int64())}),
                        primary_key="id")
    before = t.version
    for call in (lambda: t.add_columns({"a.b": "a + 1"}),
                 lambda: t.load_columns(pa.table({"id": [1], "l.x": [5]}), "id", ["l.x"]),
                 lambda: t.alter_columns({"path": "a", "rename": "a.b"}),
                 lambda: db.create_materialized_view("v", t.search(None).select({"id": "id", "v.x": "a"})),
                 lambda: db.create_materialized_view("g", t.search(None).group_by("id").agg({"n.x": "count(*)"}))):
        with pytest.raises(ValueError, match="'.'"):
            call()
    assert t.version == before and db.table_names() == ["t"]
    lance.write_dataset(pa.table({"id": pa.array([0, 1], pa.int64()), "a": pa.array([0, 1], pa.int64())}),
                        os.path.join(db.uri, "legacy.lance"), enable_stable_row_ids=True,
                        data_storage_version="legacy")
    legacy = db.open_table("legacy")
    version = legacy.version
    for call in (lambda: legacy.add_columns({"q": "a * 2"}), lambda: legacy.add_columns({"d": (dbl, ["a"])}),
                 lambda: legacy.load_columns(pa.table({"id": [1], "q": [5]}), "id", ["q"])):
        with pytest.raises(ValueError, match="legacy"):
            call()
    assert legacy.version == version


def test_load_columns_refills_sql_columns_and_refuses_blob_columns(db):
    """A SQL computed column reading a loaded column is computed again for
    the rows loaded, as after update() (it kept its old value, stale, until
    the next write); a blob column is refused (it was stored as plain
    large_binary, its blob encoding dropped without a word)."""
    t = db.create_table("t", pa.table({"id": pa.array([1, 2], pa.int64()), "lab": ["p", "q"]}), primary_key="id")
    t.add_columns({"al": "concat(lab, '!')"})
    t.load_columns(pa.table({"id": [1], "lab": ["NEW"]}), "id", ["lab"])
    assert _values(t, "lab", "al") == {1: ("NEW", "NEW!"), 2: ("q", "q!")}
    assert t.load_columns_async(pa.table({"id": [2], "lab": ["X"]}), "id", ["lab"]).result(timeout=60) == t.version
    assert _values(t, "lab", "al") == {1: ("NEW", "NEW!"), 2: ("X", "X!")}
    before = t.version
    blob = pa.field("bl", pa.large_binary(), metadata={"lance-encoding:blob": "true"})
    with pytest.raises(ValueError, match="blob"):
        t.load_columns(pa.table([pa.array([1, 2], pa.int64()), pa.array([b"xx", b"yy"], pa.large_binary())],
                                schema=pa.schema([pa.field("id", pa.int64()), blob])), "id", ["bl"])
    assert t.version == before and "bl" not in t.schema.names


def test_update_values_sql_that_does_not_fit_the_column_is_refused(db):
    """update(values_sql={"a": "7.9"}) on an integer column is refused as
    values={"a": 7.9} is (7 was stored); expressions that fit are written."""
    t = db.create_table("t", pa.table({"id": pa.array([1, 2], pa.int64()), "a": pa.array([10, 20], pa.int64()),
                                       "f": pa.array([0.5, 1.5])}), primary_key="id")
    before = t.version
    with pytest.raises(ValueError, match="do not fit column 'a'"):
        t.update("id = 1", values_sql={"a": "7.9"})
    with pytest.raises(ValueError, match="do not fit column 'a'"):
        t.update(None, values_sql={"a": "f * 3"})  # (1.5 * 3: 4.5)
    assert t.version == before
    t.update("id = 1", values_sql={"a": "7.0", "f": "f + 1"})
    t.update("id = 2", values_sql={"a": "a * 2"})
    assert _values(t, "a", "f") == {1: (7, 1.5), 2: (40, 1.5)}


def test_a_row_a_sql_column_fails_on_is_warned_of_by_the_write_that_wrote_it_only(db):
    """A row a SQL column's expression fails on is named by the write that
    wrote it; later writes of other rows try it again without a word (each
    warned "fails on 1 row(s) (row ids [1] ...)" for a row it did not write);
    it stays stale, and a write of it that still fails names it again."""

    t = db.create_table("t", pa.table({"id": pa.array([0, 1], pa.int64()), "s": ["1", "abc"]}), primary_key="id")
    with pytest.warns(UserWarning, match=r"fails on 1 row\(s\) \(row ids \[1\]"):
        t.add_columns({"n": "CAST(s AS BIGINT)"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning fails the test
        t.add([{"id": 2, "s": "2"}])
        t.update("id = 0", {"s": "7"})
        t.load_columns(pa.table({"id": [2], "s": ["5"]}), "id", ["s"])
    assert _values(t, "s", "n") == {0: ("7", 7), 1: ("abc", None), 2: ("5", 5)}
    assert t.column_status()[0]["stale"] == 1
    with pytest.warns(UserWarning, match=r"fails on 1 row\(s\) \(row ids \[1\]"):
        t.update("id = 1", {"s": "xyz"})
    t.update("id = 1", {"s": "9"})
    assert _values(t, "n") == {0: (7,), 1: (9,), 2: (5,)}


class _Pair(typing.NamedTuple):
    a: int
    b: str


def test_a_namedtuple_return_annotation_is_a_struct_column_and_a_dict_key_no_field_is_refused(db):
    """``-> MyTuple`` makes one struct column (it was refused by a message
    naming NamedTuples among the annotations taken); a dict returned for a
    struct column with a key that is no field of it fails the row (the key
    was dropped, the field NULL, the row counted computed)."""
    t = db.create_table("t", [{"id": i, "x": i} for i in range(3)], primary_key="id")

    @mv.udf
    def pair(x: int) -> _Pair:
        return _Pair(x, f"s{x}")

    @mv.udf(data_type=pa.struct([("a", pa.int64()), ("b", pa.string())]))
    def typo(x: int):
        return {"a": x, "bb": "typo"}

    t.add_columns({"p": pair, "q": typo})
    t.backfill("p")
    assert t.schema.field("p").type == pa.struct([("a", pa.int64()), ("b", pa.string())])
    assert _values(t, "p") == {i: ({"a": i, "b": f"s{i}"},) for i in range(3)}
    with pytest.raises(Exception, match=r"keys \['bb'\], which are no field"):
        t.backfill("q")
    assert t.plan_backfill("q").total_rows_pending == 3


def test_a_column_added_to_a_source_leaves_its_views_zero_versions_behind(tmp_path):
    """A column added to a source (add_columns here, a SQL one and an empty
    one, or pylance's add_columns beside) is a Lance Merge that changes no row
    and nothing a view reads: the view's status said "behind 1" (the legend:
    "source versions since the view's that change what it reads") where its
    plan and refresh said nothing changed. Now 0, and the table's data version
    (what Dagster compares) stays; an append after still counts."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "k": i % 10} for i in range(100)], primary_key="id")
    v = db.create_materialized_view("v", t.search(None).where("k < 5").select(["id", "k"]))
    v.refresh()
    data_version = t.data_version()
    t.add_columns({"extra": "k * 3"})
    t.add_columns({"empty": mv.udf(lambda k: k + 1, data_type=pa.int64(), name="inc", input_columns=["k"])})
    st = v.status()
    assert (st.versions_behind, st.stale_count) == (0, 0), st
    assert t.data_version() == data_version
    plan = v.plan_refresh()
    assert (plan.rows_to_insert, plan.rows_to_update, plan.rows_to_delete) == (0, 0, 0)
    # another tool's add_columns moves every row's version (Lance's): the view's next refresh rewrites its
    # rows, and its status says so (one version behind, the rows stale), as its plan does
    lance.dataset(t.uri).add_columns({"other": "k + 100"})
    t = db.open_table("t")
    st = v.status()
    assert (st.versions_behind, st.stale_count) == (1, 100), st
    assert v.plan_refresh().rows_to_update == 50
    t.add([{"id": 100, "k": 1, "extra": 3, "other": 101}])
    assert v.status().versions_behind == 2 and t.data_version() > data_version
    v.refresh()
    want = sorted((r["id"], r["k"]) for r in lance.dataset(t.uri).to_table().to_pylist() if r["k"] < 5)
    assert sorted(zip(*v.to_arrow().select(["id", "k"]).to_pydict().values(), strict=True)) == want
