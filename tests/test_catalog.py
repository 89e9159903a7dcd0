"""Catalog, tables, query validation and refresh semantics with the inline
runner (no JVM). Spark runs the same code paths in test_spark_*.py."""

import os
from pathlib import Path

import cloudpickle
import lance
import pyarrow as pa
import pytest
from oracle import count_calls, record_call

import mv_assets as mv
from mv_assets.model.errors import SourceBehindError, TableExistsError, TableNotFoundError


@mv.udf
def sq(x: float) -> float:
    return x * x


def _rows(n, start=0):
    return [{"id": i, "x": float(i), "s": f"s{i}"} for i in range(start, start + n)]


def _snapshot(db):
    out = {}
    for name in sorted(os.listdir(db.uri)):
        if name.endswith(".lance"):
            out[name] = lance.dataset(os.path.join(db.uri, name)).version
    return out


def test_tables_are_plain_lance_with_stable_row_ids(db):
    t = db.create_table("raw", _rows(3), primary_key="id")
    ds = lance.dataset(os.path.join(db.uri, "raw.lance"))
    assert ds.has_stable_row_ids
    assert ds.count_rows() == 3
    assert t.primary_key == "id"
    assert db.table_names() == ["raw"]


@pytest.mark.parametrize("name", ["../x", "a/b", "", "..", "a b", ".hidden", "x" * 200, "docs\n", "docs\r\n"])
def test_bad_names_rejected(db, name):
    with pytest.raises(ValueError, match="invalid table name"):
        db.create_table(name, _rows(1))
    assert db.table_names() == []


def test_create_modes(db):
    db.create_table("raw", _rows(2))
    with pytest.raises(TableExistsError, match="already exists"):
        db.create_table("raw", _rows(5))
    assert db.open_table("raw").count_rows() == 2
    db.create_table("raw", _rows(5), mode="overwrite")
    assert db.open_table("raw").count_rows() == 5
    with pytest.raises(ValueError, match="mode must be"):
        db.create_table("raw", _rows(1), mode="append")


def test_create_from_schema_and_open_drop(db):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    t = db.create_table("e", schema=schema)
    assert t.count_rows() == 0 and t.schema.field("id").type == pa.int64()
    t.add(pa.table({"id": [1], "v": ["a"]}, schema=schema))
    t.add([{"id": 2}])
    assert t.to_arrow().column("v").to_pylist() == ["a", None]
    db.drop_table("e")
    with pytest.raises(TableNotFoundError):
        db.open_table("e")
    with pytest.raises(TableNotFoundError):
        db.drop_table("e")
    db.drop_table("e", ignore_missing=True)  # as lancedb's (Geneva passes it through)


def test_the_catalog_as_lancedb_lists_opens_counts_and_drops_its_tables(db):
    """lancedb's catalog surface: ``db["name"]``, ``len(db)``, ``list_tables``
    and ``table_names`` by pages, ``drop_all_tables`` (views before what they
    read); each failed before (TypeError or AttributeError)."""
    t = db.create_table("t", [{"id": i} for i in range(3)])
    for name in ("a", "b", "c"):
        db.create_table(name, [{"id": 1}])
    db.create_materialized_view("v", t.search(None).where("id > 0"))
    db.create_materialized_view("vv", db.open_table("v").search(None))
    db.create_view("plain", t.search(None))
    assert db["t"].count_rows() == 3 and isinstance(db["v"], mv.MaterializedView)
    with pytest.raises(TableNotFoundError):
        db["nope"]
    assert len(db) == 6 and "plain" not in db.table_names()  # (tables and materialized views, as table_names)
    assert db.table_names() == ["a", "b", "c", "t", "v", "vv"]
    assert db.table_names(limit=2) == ["a", "b"] and db.table_names(page_token="b", limit=2) == ["c", "t"]
    pages, token = [], None
    while True:
        page = db.list_tables(page_token=token, limit=4)
        pages.append(page.tables)
        token = page.page_token
        if not token:
            break
    assert pages == [["a", "b", "c", "t"], ["v", "vv"]] and db.list_tables().tables == db.table_names()
    assert db.table_names(limit=0) == [] and db.list_tables(limit=0).tables == []  # (as lancedb's)
    for bad in ({"limit": -1}, {"page_token": 5}):  # (a TypeError from inside before)
        with pytest.raises(ValueError, match="limit|page_token"):
            db.table_names(**bad)
    db.drop_all_tables()
    assert db.table_names() == [] and len(db) == 0 and db.view_names() == []


def test_add_validation(db):
    t = db.create_table("raw", _rows(2), primary_key="id")
    v = t.version
    with pytest.raises(ValueError, match="not in the table schema"):
        t.add([{"id": 9, "nope": 1}])
    with pytest.raises(ValueError, match="duplicate values for primary key"):
        t.add([{"id": 9, "x": 1.0, "s": "a"}, {"id": 9, "x": 2.0, "s": "b"}])
    with pytest.raises(ValueError, match="cannot convert|do not match"):
        t.add([{"id": "abc", "x": 1.0, "s": "a"}])
    assert t.version == v


def test_update_and_delete(db):
    t = db.create_table("raw", _rows(4), primary_key="id")
    t.update("id = 1", {"s": "it's"})
    t.update("id >= 2", values_sql={"x": "x * 10"})
    t.delete("id = 0")
    rows = {r["id"]: r for r in t.to_arrow().to_pylist()}
    assert rows[1]["s"] == "it's" and rows[2]["x"] == 20.0 and 0 not in rows
    v = t.version
    with pytest.raises(ValueError, match="unknown columns"):
        t.update("id = 1", {"nope": 1})
    with pytest.raises(ValueError, match="primary key"):
        t.update("id = 1", {"id": 5})
    with pytest.raises(ValueError, match="invalid delete predicate"):
        t.delete("nope > 1")
    with pytest.raises(ValueError, match="needs values"):
        t.update("id = 1")
    assert t.version == v


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda q: q.select({"y": "nope + 1"}), "No field named nope"),
        (lambda q: q.where("nope > 1"), "No field named nope"),
        (lambda q: q.where("id >"), "invalid query"),
        (lambda q: q.select({"y": sq.with_inputs(["nope"])}), "does not have"),
        (lambda q: q.select({"y": sq.with_inputs(["s"])}), "expects float but column 's' is string"),
        (lambda q: q.select(["id", "id"]), "duplicate output column"),
        (lambda q: q.select({"__source_row_id": "id"}), "reserved"),
        (lambda q: q.select({"y": 3}), "must be a column name"),
    ],
)
def test_bad_queries_raise_before_writing(db, build, match):
    t = db.create_table("raw", _rows(3))
    before = _snapshot(db)
    with pytest.raises(ValueError, match=match):
        db.create_materialized_view("v", build(t.search(None)))
    assert _snapshot(db) == before
    assert db.table_names() == ["raw"]


def test_query_builder_validation(db):
    q = db.create_table("raw", _rows(1)).search(None)
    with pytest.raises(ValueError):
        q.limit(-1)
    with pytest.raises(ValueError):
        q.shuffle(seed="x")
    with pytest.raises(ValueError):
        q.where("")
    with pytest.raises(ValueError, match="'raw' has no vector column"):  # a vector search needs one
        db.open_table("raw").search([1.0, 2.0]).to_arrow()


def test_view_definition_stored_with_view_and_usable_by_name(db, tmp_path):
    t = db.create_table("raw", _rows(5))
    db.create_materialized_view("v", t.search(None).where("id > 1").select({"id": "id", "y": sq}))
    # A fresh connection (no UDF objects in hand) refreshes by name.
    db2 = mv.connect(db.uri, runner=mv.InlineRunner())
    view = db2.open_table("v")
    assert isinstance(view, mv.MaterializedView)
    assert view.definition.filter == "id > 1"
    db2.refresh("v")
    assert sorted(view.to_arrow().column("y").to_pylist()) == [4.0, 9.0, 16.0]


def test_views_are_read_only(db):
    t = db.create_table("raw", _rows(2))
    v = db.create_materialized_view("v", t.search(None))
    for call in (lambda: v.add(_rows(1)), lambda: v.delete("true"), lambda: v.update(values={"x": 1.0})):
        with pytest.raises(ValueError, match="maintained by refresh"):
            call()


def test_with_no_data_false_populates(db):
    t = db.create_table("raw", _rows(4))
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": sq}), with_no_data=False)
    assert v.count_rows() == 4 and v.source_version == t.version
    v2 = db.create_materialized_view("v2", t.search(None))
    assert v2.count_rows() == 0 and v2.source_version is None


def test_noop_refresh_commits_nothing(db):
    t = db.create_table("raw", _rows(4))
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": sq}))
    v.refresh()
    version = v.version
    r = v.refresh()
    assert r.udf_rows_computed == {} and v.version == version


def test_refresh_to_pinned_source_version(db):
    t = db.create_table("raw", _rows(3))
    v1 = t.version
    t.add(_rows(3, start=3))
    v = db.create_materialized_view("v", t.search(None).select({"id": "id"}))
    v.refresh(src_version=v1)
    assert v.count_rows() == 3 and v.source_version == v1
    v.refresh()
    assert v.count_rows() == 6
    with pytest.raises(ValueError, match="src_version must be between"):
        v.refresh(src_version=99)


def test_incremental_strict_and_full_modes(db):
    t = db.create_table("raw", _rows(3))
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": sq}))
    v.refresh()
    t.add(_rows(1, start=3))
    r = v.refresh(mode="incremental_strict")
    assert r.udf_rows_computed == {"y": 1} and not r.full
    r = v.refresh(mode="full")
    assert r.full and r.udf_rows_computed == {"y": 4} and v.count_rows() == 4
    with pytest.raises(ValueError, match="refresh mode"):
        v.refresh(mode="sometimes")


def test_overwritten_source_forces_full_and_strict_refuses(db):
    t = db.create_table("raw", _rows(3))
    v = db.create_materialized_view("v", t.search(None).select({"id": "id"}))
    v.refresh()
    lance.write_dataset(pa.Table.from_pylist(_rows(2, start=10)), t.uri, mode="overwrite")
    with pytest.raises(ValueError, match="cannot be incremental.*Overwrite"):
        v.refresh(mode="incremental_strict")
    r = v.refresh()
    assert r.full and sorted(v.to_arrow().column("id").to_pylist()) == [10, 11]


def test_view_over_view_lineage_and_behind_check(db):
    t = db.create_table("raw", _rows(6))
    a = db.create_materialized_view("a", t.search(None).where("id >= 2").select({"id": "id", "y": sq}))
    b = db.create_materialized_view("b", a.search(None).where("y > 10").select({"id": "id", "y": "y"}))
    assert db.lineage_order() == ["a", "b"]
    with pytest.raises(SourceBehindError, match="refresh 'a' first"):
        db.refresh("b")
    assert b.count_rows() == 0
    db.refresh("b", upstream=True)
    assert sorted(b.to_arrow().column("id").to_pylist()) == [4, 5]
    t.add(_rows(2, start=6))
    results = db.refresh(["b", "a"])  # any order in, lineage order out
    assert [r.view for r in results] == ["a", "b"]
    assert sorted(b.to_arrow().column("id").to_pylist()) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="views \\['b'\\] are defined over it"):
        db.drop_table("a")


def test_a_chain_refreshed_in_order_never_fails_for_a_write_landing_inside_it(db, monkeypatch):
    """``db.refresh("b", upstream=True)`` while an ingest job writes: a source
    commit landing after the refresh of ``a`` and before that of ``b`` failed
    the call with SourceBehindError telling to call upstream=True (~1 call in
    120 beside a writer committing every 30 ms). ``b`` reflects ``a`` as
    refreshed; the write is the next refresh's."""
    t = db.create_table("raw", _rows(6))
    a = db.create_materialized_view("a", t.search(None).where("id >= 2").select({"id": "id", "y": sq}))
    b = db.create_materialized_view("b", a.search(None).where("y > 10").select({"id": "id", "y": "y"}))
    real = mv.MaterializedView.refresh
    landed = []

    def refresh_then_a_write_lands(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        if self.name == "a":  # another process's commit, between the two refreshes
            t.add(_rows(1, start=100 + len(landed)))
            landed.append(t.version)
        return result

    monkeypatch.setattr(mv.MaterializedView, "refresh", refresh_then_a_write_lands)
    results = db.refresh("b", upstream=True)
    assert [r.view for r in results] == ["a", "b"] and landed
    assert sorted(b.to_arrow().column("id").to_pylist()) == [4, 5]  # a's rows as its refresh left them
    assert a.source_version == landed[0] - 1 and a.status().stale_count == 1
    with pytest.raises(SourceBehindError):  # refreshed alone, b is still told a is behind
        db.refresh("b")
    monkeypatch.undo()
    db.refresh("b", upstream=True)
    assert sorted(b.to_arrow().column("id").to_pylist()) == [4, 5, 100]


def test_plan_is_exact_dry_run(db):
    t = db.create_table("raw", _rows(10))
    v = db.create_materialized_view("v", t.search(None).where("id % 2 = 0").select({"id": "id", "y": sq}))
    v.refresh()
    t.add(_rows(3, start=10))  # 10, 12 pass
    t.delete("id = 4")
    t.update("id = 6", {"x": 0.5})
    t.update("id = 3", {"x": 0.5})  # fails the filter, never in the view
    plan = v.plan_refresh()
    version = v.version
    assert v.version == version  # planning writes nothing
    r = v.refresh()
    assert (plan.rows_to_insert, plan.rows_to_update, plan.rows_to_delete) == (2, 1, 1)
    assert (r.rows_inserted, r.rows_updated, r.rows_deleted) == (2, 1, 1)
    assert plan.udf_rows == {"y": 3} == r.udf_rows_computed


def test_limit_and_shuffle_hold_on_every_refresh(db):
    t = db.create_table("raw", _rows(20))
    v = db.create_materialized_view("v", t.search(None).shuffle(seed=5).limit(5).select({"id": "id", "y": sq}))
    fresh = db.create_materialized_view("fresh", t.search(None).shuffle(seed=5).limit(5).select({"id": "id"}))
    v.refresh()
    for step in range(3):
        t.delete(f"id IN ({','.join(str(i) for i in sorted(v.to_arrow().column('id').to_pylist())[:2])})")
        t.add(_rows(5, start=100 + 10 * step))
        v.refresh()
        db.drop_table("fresh")
        fresh = db.create_materialized_view(
            "fresh", t.search(None).shuffle(seed=5).limit(5).select({"id": "id"}), with_no_data=False
        )
        # incremental maintenance == computing from scratch at this version
        assert sorted(v.to_arrow().column("id").to_pylist()) == sorted(fresh.to_arrow().column("id").to_pylist())
        assert v.count_rows() == 5


def test_checkpointed_tasks_are_not_recomputed_after_a_crash(db, tmp_path):
    t = db.create_table("raw", _rows(4))
    for i in range(3):
        t.add(_rows(4, start=10 * (i + 1)))  # 4 fragments
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": sq}))

    class CrashAfter(mv.InlineRunner):
        def __init__(self, n):
            self.n = n

        def run(self, tasks, definition_raw):
            from mv_assets.execution.tasks import run_task

            for task in tasks[: self.n]:
                run_task(task, definition_raw)
            raise RuntimeError("driver died")

    with pytest.raises(RuntimeError, match="driver died"):
        v.refresh(runner=CrashAfter(2), max_rows_per_task=4)  # a task per fragment
    assert v.count_rows() == 0 and v.source_version is None  # nothing half-visible
    r = v.refresh(max_rows_per_task=4)
    assert r.tasks == 4 and r.tasks_resumed == 2
    assert r.udf_rows_computed == {"y": 8}  # the two unfinished tasks
    assert r.udf_rows_resumed == {"y": 8}  # the two checkpointed ones: read back, not recomputed
    assert v.count_rows() == 16
    assert not os.listdir(db._state_dir("checkpoints", "v"))


def test_fragment_scoped_refresh_then_global_computes_each_row_once(db):
    t = db.create_table("raw", _rows(5))
    t.add(_rows(5, start=5))
    t.add(_rows(5, start=10))
    frags = [f.fragment_id for f in lance.dataset(t.uri).get_fragments()]
    assert len(frags) == 3
    v = db.create_materialized_view("v", t.search(None).where("id != 7").select({"id": "id", "y": sq}))
    r = v.refresh(fragments=[frags[1]])
    assert r.udf_rows_computed == {"y": 4}
    assert sorted(v.to_arrow().column("id").to_pylist()) == [5, 6, 8, 9]
    assert v.source_version is None  # the whole view does not reflect a version yet
    r = v.refresh(fragments=[frags[1]])  # idempotent: nothing to compute
    assert r.udf_rows_computed == {}
    t.delete("id = 0")
    r = v.refresh()
    assert r.udf_rows_computed == {"y": 9}  # 14 passing rows - 4 already current - 1 deleted
    assert sorted(v.to_arrow().column("id").to_pylist()) == [i for i in range(1, 15) if i != 7]
    with pytest.raises(ValueError, match="limit"):
        db.create_materialized_view("lim", t.search(None).limit(2)).refresh(fragments=[frags[0]])


def test_refresh_back_to_an_older_source_version(db):
    t = db.create_table("raw", _rows(4))
    old = t.version
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x", "y": sq}))
    v.refresh()
    t.add(_rows(2, start=4))
    t.delete("id = 1")
    t.update("id = 2", {"x": 20.0})
    t.optimize()
    v.refresh()
    r = v.refresh(src_version=old)
    assert not r.full and r.udf_rows_computed == {"y": 2}  # row 1 comes back, row 2 reverts
    got = {row["id"]: (row["x"], row["y"]) for row in v.to_arrow().to_pylist()}
    assert got == {i: (float(i), float(i * i)) for i in range(4)}
    assert v.source_version == old


def test_recompute_one_udf_column_only(db, tmp_path):
    log = str(tmp_path)

    @mv.udf
    def a(x: float) -> float:
        record_call(log, "a", x)
        return x + 1

    @mv.udf
    def b(x: float) -> float:
        record_call(log, "b", x)
        return x + 2

    def calls():
        return {"a": count_calls(log, "a"), "b": count_calls(log, "b")}

    t = db.create_table("raw", _rows(6))
    t.add(_rows(4, start=6))
    v = db.create_materialized_view("v", t.search(None).where("id != 2").select({"id": "id", "s": "s", "a": a, "b": b}))
    v.refresh()
    before = {r["id"]: r for r in v.to_arrow().to_pylist()}
    assert calls() == {"a": 9, "b": 9}
    t.add(_rows(1, start=10))  # one changed row is refreshed as usual (both UDFs)
    r = v.refresh(recompute=["b"])
    assert calls() == {"a": 10, "b": 19}  # 'a' only for the new row; 'b' for all 10 rows
    assert r.udf_rows_computed == {"a": 1, "b": 10}
    actual = {r["id"]: r for r in v.to_arrow().to_pylist()}
    assert len(actual) == 10 and actual[10]["b"] == 12.0
    for k, row in before.items():  # other columns copied unchanged, including the source row version
        assert actual[k] == row
    with pytest.raises(ValueError, match="recompute takes UDF columns"):
        v.refresh(recompute=["s"])
    frag = lance.dataset(t.uri).get_fragments()[0].fragment_id
    v.refresh(fragments=[frag], recompute=["a"])
    assert calls() == {"a": 15, "b": 19} and v.count_rows() == 10


def test_small_refreshes_can_skip_the_spark_job(tmp_path):
    runner = mv.SparkRunner(master="local[1]", local_below_rows=100)
    db = mv.connect(str(tmp_path / "cat"), runner=runner)
    t = db.create_table("raw", _rows(5))
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": sq}))
    r = v.refresh()
    assert r.runner == "spark-driver-local" and r.udf_rows_computed == {"y": 5}
    assert not runner.started  # no JVM for 5 rows
    assert sorted(v.to_arrow().column("y").to_pylist()) == [0.0, 1.0, 4.0, 9.0, 16.0]


def test_many_scattered_and_ranged_deletes(db):
    import numpy as np

    n = 20_000
    t = db.create_table("t", pa.table({"id": pa.array(np.arange(n)), "x": pa.array(np.arange(n))}))
    v = db.create_materialized_view("v", t.search(None).select({"id": "id"}))
    v.refresh()
    t.delete("id % 2 = 0")  # 10k scattered rows: deleted by id list
    assert v.refresh().rows_deleted == n // 2
    t.delete("id >= 10000 AND id < 15000")  # contiguous: deleted by address ranges
    assert v.refresh().rows_deleted == 2500
    assert sorted(v.to_arrow().column("id").to_pylist()) == [i for i in range(n) if i % 2 and not 10000 <= i < 15000]


def test_query_to_arrow_runs_the_query_in_process(db):
    t = db.create_table("raw", _rows(12))
    q = t.search(None).where("id > 2").shuffle(seed=3).limit(4).select({"id": "id", "y": sq})
    direct = q.to_arrow()
    v = db.create_materialized_view("v", q, with_no_data=False)
    assert direct.num_rows == 4
    assert sorted(direct.column("id").to_pylist()) == sorted(v.to_arrow().column("id").to_pylist())
    assert all(r["y"] == float(r["id"]) ** 2 for r in direct.to_pylist())


def test_overwriting_a_table_that_views_read_is_refused(db):
    t = db.create_table("raw", _rows(3))
    db.create_materialized_view("v", t.search(None))
    with pytest.raises(ValueError, match=r"views \['v'\] are defined over it"):
        db.create_table("raw", _rows(1), mode="overwrite")
    assert db.open_table("raw").count_rows() == 3


def test_refresh_names_and_versions_are_checked(db):
    """Unknown names say so (not 'not a view'); a bool is no source version; a
    view never loaded is 100 % stale, not rows / 1."""
    t = db.create_table("raw", _rows(5))
    v = db.create_materialized_view("v", t.search(None).select(["id"]))
    assert v.status().stale_pct == 100.0
    with pytest.raises(TableNotFoundError, match="no table or view named 'missing'"):
        db.refresh("missing")
    with pytest.raises(ValueError, match="is a table, not a materialized view"):
        db.refresh("raw")
    with pytest.raises(ValueError, match="src_version must be between 1 and"):
        v.refresh(src_version=True)
    assert v.source_version is None  # nothing was written


def test_lossy_values_are_refused_before_writing(db):
    t = db.create_table("t", schema=pa.schema([pa.field("id", pa.int64()), pa.field("a", pa.int32())]))
    before = t.version
    with pytest.raises(ValueError, match="truncated"):
        t.add([{"id": 1, "a": 1.5}])
    assert t.version == before
    t.add([{"id": 1, "a": 2.0}, {"id": 2}])  # exact floats and missing values are fine
    with pytest.raises(ValueError, match="does not fit column 'a'"):
        t.update("id = 1", values={"a": 1.7})
    assert sorted((r["id"], r["a"]) for r in t.to_arrow().to_pylist()) == [(1, 2), (2, None)]


def test_a_dropped_view_leaves_nothing_for_its_successor(db):
    """Status and error records of a dropped table or view are dropped with it."""
    t = db.create_table("raw", _rows(4))

    @mv.udf
    def boom(x: float) -> float:
        raise RuntimeError("model exploded")

    @mv.udf(on_error="skip")
    def half(x: float) -> float:
        if x == 2.0:
            raise RuntimeError("bad row")
        return x / 2

    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": boom}))
    with pytest.raises(Exception, match="model exploded"):
        v.refresh()
    assert v.status().load_state == "FAILED_LOAD" and "model exploded" in v.status().last_error
    t.add_columns({"h": half})
    t.backfill("h")
    assert len(t.get_errors(column_name="h")) == 1
    db.drop_table("v")
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
    status = v.status()
    assert status.load_state == "NEVER_LOADED" and status.last_error is None
    v.refresh()  # (its load record set aside after the commit: <name>.json.spare, dropped with the view too)
    db.drop_table("v")
    assert [p.name for p in (Path(db.uri) / "_mv_assets").rglob("v.json*")] == []
    db.drop_table("raw")
    t = db.create_table("raw", _rows(4))
    assert t.get_errors() == []


def test_a_view_dropped_and_created_again_gets_job_ids_of_its_own(db):
    """The same view dropped and created again over the same source version:
    its refresh's job id is not the dropped view's (both were
    ``refresh-1-<plan>``, so an id kept from before the drop named the new
    job); a job id of the dropped view is not found."""
    t = db.create_table("raw", _rows(4))
    query = t.search(None).select({"id": "id", "x": "x"})
    v = db.create_materialized_view("v", query)
    first = v.refresh().job_id
    assert db.get_job(first).table_name == "v"
    db.drop_table("v")
    v = db.create_materialized_view("v", query)
    second = v.refresh().job_id
    assert second != first
    assert [j.job_id for j in db.list_jobs("v")] == [second]
    with pytest.raises(ValueError):
        db.get_job(first)


def test_with_no_data_false_that_fails_leaves_no_view_behind(db):
    t = db.create_table("raw", _rows(3))

    @mv.udf
    def boom(x: float) -> float:
        raise RuntimeError("model exploded")

    with pytest.raises(mv.UdfError, match="model exploded") as failed:
        db.create_materialized_view("v", t.search(None).select({"id": "id", "y": boom}), with_no_data=False)
    assert "v" not in db
    # its remedy: not `mv-assets errors v` (no such view, and nothing recorded)
    assert "mv-assets errors" not in str(failed.value) and "get_errors" not in str(failed.value)
    assert "The view 'v' was not created" in str(failed.value) and "with_no_data=True" in str(failed.value)
    # nothing of it left on disk (its refresh lock's file stayed: locks/v.lock)
    assert [str(p.relative_to(db.uri)) for p in Path(db.uri).rglob("*") if p.name.split(".")[0] == "v"] == []
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": sq}), with_no_data=False)
    assert v.count_rows() == 3 and v.status().last_error is None
    db.drop_table("v")
    assert [str(p.relative_to(db.uri)) for p in Path(db.uri).rglob("*") if p.name.split(".")[0] == "v"] == []


@pytest.mark.parametrize("name", ["__in__x", "__mv_assets_row_version", "__row_version", "__source_row_id", "_rowid"])
def test_internal_names_are_refused_everywhere(db, name):
    """Names that would collide with the engine's scan aliases or bookkeeping
    are refused before anything is written, as view outputs, computed columns
    and table columns."""
    t = db.create_table("raw", _rows(3))
    with pytest.raises(ValueError, match="is reserved"):
        db.create_materialized_view("v", t.search(None).select({"id": "id", name: "x"}))
    with pytest.raises(ValueError, match="is reserved"):
        db.create_materialized_view("w", t.search(None).select({"id": "id", name: sq}))
    with pytest.raises(ValueError, match="reserved"):
        t.add_columns({name: "x + 1"})
    with pytest.raises(ValueError, match="reserved"):
        db.create_table("other", [{"id": 1, name: 2}])
    assert db.table_names() == ["raw"] and t.schema.names == ["id", "x", "s"]


def test_ordering_views_unpickles_no_udf(db, monkeypatch):
    t = db.create_table("raw", _rows(4))
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": sq}))
    db.create_materialized_view("w", v.search(None).select({"id": "id", "y": "y"}))


    loads = []
    real = cloudpickle.loads
    monkeypatch.setattr(cloudpickle, "loads", lambda *a, **k: loads.append(1) or real(*a, **k))
    fresh = mv.connect(db.uri, runner=mv.InlineRunner())
    assert fresh.lineage_order() == ["v", "w"] and fresh.dependents("v") == ["w"] and fresh.upstream("w") == ["v"]
    assert loads == []
    assert [r.view for r in fresh.refresh(["w", "v"])] == ["v", "w"]


def test_describe_reads_stored_metadata_without_unpickling(db, monkeypatch):
    """The engine's description API (what orchestrators read): lineage,
    columns, visible schema, policy; no UDF is unpickled; a query is described
    (and checked) before the view exists, nothing written."""
    t = db.create_table("raw", _rows(3))
    t.add_columns({"z": "x * 2"})
    db.create_materialized_view("v", t.search(None).where("id > 0").select({"id": "id", "z": "z", "y": sq}))


    def refuse(*a, **k):
        raise AssertionError("describe unpickled a UDF")

    monkeypatch.setattr(cloudpickle, "loads", refuse)
    monkeypatch.setattr("pickle.loads", refuse)
    d = db.describe()
    assert list(d) == ["raw", "v"]
    raw, v = d["raw"], d["v"]
    assert not raw.is_view and raw.source is None and [c["name"] for c in raw.columns] == ["z"]
    assert v.is_view and (v.source, v.filter, v.limit) == ("raw", "id > 0", None)
    assert [(c["name"], c["kind"]) for c in v.columns] == [("id", "column"), ("z", "column"), ("y", "udf")]
    assert [n for n, _ in v.schema] == ["id", "z", "y"]  # internal key and marker columns hidden
    assert "__source_row_id" in v.field_names and v.reads == ["z"]
    assert v.policy == db.open_table("v").refresh_policy
    assert db.describe("v")["v"] == v
    with pytest.raises(TableNotFoundError, match="no table or view named 'nope'"):
        db.describe("nope")
    monkeypatch.undo()
    before = _snapshot(db)
    q = db.describe_query("w", t.search(None).where("x > 1").select({"id": "id", "y": sq}))
    assert q.is_view and q.version is None and q.reads == [] and [n for n, _ in q.schema] == ["id", "y"]
    with pytest.raises(ValueError, match="invalid query over 'raw'"):
        db.describe_query("w", t.search(None).where("nope > 1"))
    assert _snapshot(db) == before and "w" not in db


def test_tasks_are_sized_from_the_work_and_the_runner(tmp_path):
    """Default task size: one task per core for cheap work (inline: one task),
    a fixed max_rows_per_task still wins."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", pa.table({"id": list(range(10_000)), "x": list(range(10_000))}))
    view = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
    assert len(view.plan_refresh().tasks) == 1
    assert len(view.plan_refresh(runner=mv.SparkRunner(master="local[2]")).tasks) == 2
    assert len(view.plan_refresh(runner=mv.SparkRunner(master="local[4]")).tasks) == 4
    assert len(view.plan_refresh(max_rows_per_task=1000).tasks) == 10
    with pytest.raises(ValueError, match="max_rows_per_task must be a positive int"):
        view.plan_refresh(max_rows_per_task=0)
    r = view.refresh()  # inline: one task
    assert r.tasks == 1 and view.count_rows() == 10_000


def test_integers_beyond_64_bits_are_a_valueerror_and_nothing_is_written(db):
    t = db.create_table("t", [{"id": 1, "x": 1}], primary_key="id")
    before = t.version
    with pytest.raises(ValueError, match=r"column 'x': .*1180591620717411303424 does not fit a 64-bit integer"):
        t.merge_insert([{"id": 1, "x": 2**70}])
    with pytest.raises(ValueError, match=r"column 'id': .*does not fit a 64-bit integer"):
        t.merge_insert([{"id": -(2**70), "x": 1}])
    with pytest.raises(ValueError, match=r"column 'x': .*does not fit a 64-bit integer"):
        t.add([{"id": 2, "x": 2**70}])
    with pytest.raises(ValueError, match=r"column 'x': .*does not fit a 64-bit integer"):
        t.add({"id": [2], "x": [2**70]})
    with pytest.raises(ValueError, match=r"value 1180591620717411303424 does not fit column 'x'"):
        t.update("id = 1", values={"x": 2**70})
    with pytest.raises(ValueError, match=r"column 'x': .*does not fit a 64-bit integer"):
        db.create_table("t2", [{"id": 1, "x": 2**70}])
    assert t.version == before and t.to_arrow().to_pylist() == [{"id": 1, "x": 1}]
    assert "t2" not in db


def test_rows_given_as_dicts_fill_an_unsigned_column_above_2_63(db):
    """A uint64 column's value above 2**63 - 1 given in a list of dicts: Arrow
    infers int64 for Python integers and overflowed (the rows were refused as
    holding "a value too large for its column"); they are written. A value
    below 0 there is still refused, and nothing is written."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("u", pa.uint64())])
    t = db.create_table("t", schema=schema, primary_key="id")
    t.add([{"id": 1, "u": 2**63 + 5}, {"id": 2, "u": 2**64 - 1}, {"id": 3}])
    assert t.to_arrow().sort_by("id").column("u").to_pylist() == [2**63 + 5, 2**64 - 1, None]
    before = t.version
    with pytest.raises(ValueError):
        t.add([{"id": 4, "u": 2**63 + 5}, {"id": 5, "u": -1}])
    assert t.version == before


def test_connect_without_creating(tmp_path):
    missing = tmp_path / "no" / "catalog"
    with pytest.raises(mv.CatalogNotFoundError, match=f"no catalog at {missing}"):
        mv.connect(str(missing), create=False)
    assert not (tmp_path / "no").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(mv.CatalogNotFoundError, match="no catalog at"):
        mv.connect(str(empty), create=False)
    assert os.listdir(empty) == []
    path = tmp_path / "notes.txt"
    path.write_text("x")
    for create in (True, False):
        with pytest.raises(ValueError, match=f"{path} is a file, not a catalog directory"):
            mv.connect(str(path), create=create)
    with pytest.raises(ValueError, match="cannot create the catalog directory"):
        mv.connect(str(path / "cat"))
    db = mv.connect(str(tmp_path / "cat"))  # creating stays the default
    db.create_table("t", [{"id": 1}])
    assert mv.connect(str(tmp_path / "cat"), create=False).table_names() == ["t"]


def test_the_listing_that_found_the_catalog_serves_its_first_look_only_for_a_moment(tmp_path, monkeypatch):
    """connect(create=False) lists the root to tell a catalog is there; the
    connection's first listing of its tables reuses it (the CLI's status
    listed the root twice) within ROOT_LISTING_REUSE_S, once: later looks,
    and a first look after that, list the root again."""
    from mv_assets.api import catalog

    uri = str(tmp_path / "cat")
    mv.connect(uri).create_table("a", [{"id": 1}])
    clock = [1000.0]
    monkeypatch.setattr(catalog.time, "monotonic", lambda: clock[0])
    soon = mv.connect(uri, create=False)
    late = mv.connect(uri, create=False)
    mv.connect(uri).create_table("b", [{"id": 1}])
    assert soon.table_names() == ["a"]  # the listing connect() took, a moment ago
    assert soon.table_names() == ["a", "b"]  # once
    clock[0] += catalog.ROOT_LISTING_REUSE_S
    assert late.table_names() == ["a", "b"]  # too old: listed again


def test_a_second_connection_with_other_storage_options_says_every_connection_now_uses_them(tmp_path):
    """The storage options are the process's per catalog URI: a second
    connect() with others replaced the first connection's without a word
    (its writes went to the second endpoint); it warns now. The same
    options again, or none, say nothing."""
    import warnings

    uri = str(tmp_path / "cat")
    mv.connect(uri, storage_options={"region": "a"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mv.connect(uri, storage_options={"region": "a"})
        mv.connect(uri)
    with pytest.warns(UserWarning, match="storage options other than an earlier connection's"):
        mv.connect(uri, storage_options={"region": "b"})
