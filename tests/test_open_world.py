"""The open world: tables and views whose directories other tools write too
(plain pylance, lancedb, Spark). Every write made behind mv_assets' back is
noticed: computed values follow their input rows, recreated sources and
foreign writes into a view are caught, and what cannot be done is refused in
mv_assets' own words before anything is written."""

import os

import lance
import pyarrow as pa
import pytest

import mv_assets as mv


@mv.udf
def double(x: int) -> int:
    return 2 * x


def _table(db, n: int = 6):
    t = db.create_table("t", pa.table({"id": list(range(n)), "x": list(range(n)), "z": [0] * n}), primary_key="id")
    t.add_columns({"y": double, "s": "x + 1"})
    t.backfill("y")
    return t


def _status(t) -> dict[str, tuple[int, int]]:
    return {c["column"]: (c["current"], c["stale"]) for c in t.column_status()}


def _oracle(t) -> dict[int, tuple[int, int]]:
    """(y, s) expected from the table's own x, in plain Python."""
    return {r["id"]: (2 * r["x"], r["x"] + 1) for r in lance.dataset(t.uri).to_table(columns=["id", "x"]).to_pylist()}


def _values(t) -> dict[int, tuple[int, int]]:
    return {r["id"]: (r["y"], r["s"]) for r in t.to_arrow().select(["id", "y", "s"]).to_pylist()}


@pytest.mark.parametrize("writer", ["update", "merge_insert"])
def test_computed_columns_go_stale_when_another_tool_rewrites_their_input(db, writer):
    t = _table(db)
    assert _status(t) == {"y": (6, 0), "s": (6, 0)}
    ds = lance.dataset(t.uri)
    if writer == "update":
        ds.update({"x": "x + 100"}, where="id IN (1, 2)")
    else:  # a pylance merge_insert of the input column only (one new row too)
        (ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
         .execute(pa.table({"id": [1, 2, 9], "x": [101, 102, 9], "z": [0, 0, 0]})))
    new_rows = 1 if writer == "merge_insert" else 0
    # the rewritten rows (and a new one) are stale for both columns: status says so, backfill computes them
    assert _status(t) == {"y": (4, 2 + new_rows), "s": (4, 2 + new_rows)}
    assert t.plan_backfill("y").rows == 2 + new_rows
    result = t.backfill("y")
    assert result.udf_rows_computed == 2 + new_rows
    t.backfill("s")
    assert _status(t) == {"y": (6 + new_rows, 0), "s": (6 + new_rows, 0)}
    assert _values(t) == _oracle(t)
    assert t.backfill("y").udf_rows_computed == 0  # and nothing is computed twice


def test_an_update_through_mv_assets_keeps_columns_that_do_not_read_it_current(db):
    t = _table(db)
    t.update("id = 1", {"z": 5})  # neither y nor s reads z
    assert _status(t) == {"y": (6, 0), "s": (6, 0)}
    assert t.backfill("y").udf_rows_computed == 0
    t.update("id = 2", {"x": 50})  # both read x: s is filled at once, y waits for its backfill
    assert _status(t) == {"y": (5, 1), "s": (6, 0)}
    assert t.backfill("y").udf_rows_computed == 1
    assert _values(t) == _oracle(t)


def _recreate(uri: str, batches: list[dict]) -> None:
    """Drop the table the way another tool does (the directory goes) and
    create it again under the same name, one commit per batch."""
    import shutil

    shutil.rmtree(uri)
    lance.write_dataset(pa.table(batches[0]), uri, enable_stable_row_ids=True)
    for b in batches[1:]:
        lance.write_dataset(pa.table(b), uri, mode="append")


def _expected(uri: str) -> list[tuple[int, int]]:
    """The view `id, x * 10 WHERE x >= 0` computed in plain pyarrow over the source."""
    rows = lance.dataset(uri).to_table(columns=["id", "x"]).to_pylist()
    return sorted((r["id"], r["x"] * 10) for r in rows if r["x"] >= 0)


def _view_rows(view) -> list[tuple[int, int]]:
    return sorted((r["id"], r["y"]) for r in view.to_arrow().select(["id", "y"]).to_pylist())


@pytest.mark.parametrize("new_versions", [1, 3, 5])  # fewer, as many and more versions than the view reflects
def test_a_source_dropped_and_created_again_rebuilds_its_views(db, new_versions):
    t = db.create_table("src", pa.table({"id": [0, 1, 2], "x": [0, 1, 2]}))
    t.add(pa.table({"id": [3], "x": [3]}))
    t.add(pa.table({"id": [4], "x": [4]}))
    view = db.create_materialized_view("v", t.search(None).where("x >= 0").select({"id": "id", "y": "x * 10"}))
    view.refresh()
    assert view.status().source_version == 4  # created, two appends, the view's identity stamp
    # another tool drops the table and creates one of the same name: row ids restart at 0, versions at 1
    _recreate(t.uri, [{"id": [100 + i], "x": [50 + i]} for i in range(new_versions)])
    status = view.status()  # says the truth before the refresh: nothing is current
    assert not status.valid and status.versions_behind == new_versions and "created again" in status.last_error
    assert status.stale_count == 5 + new_versions
    plan = view.plan_refresh()
    assert plan.full and "created again" in plan.reason
    with pytest.raises(ValueError, match="cannot be incremental: the source 'src' was dropped and created again"):
        view.refresh(mode="incremental_strict")
    result = view.refresh()
    assert result.full
    assert _view_rows(view) == _expected(t.uri)
    # the rebuilt view records the new table: later refreshes are incremental again
    t.add(pa.table({"id": [7], "x": [7]}))
    assert not view.plan_refresh().full
    view.refresh()
    assert _view_rows(view) == _expected(t.uri)


def test_a_source_overwritten_with_its_history_cleaned_is_refreshed_exactly(db):
    """An Overwrite keeps the table's identity; once cleanup removed the
    Overwrite commit, row versions (which only grow) still tell every new row."""
    import datetime

    t = db.create_table("src", pa.table({"id": [0, 1, 2], "x": [0, 1, 2]}))
    view = db.create_materialized_view("v", t.search(None).where("x >= 0").select({"id": "id", "y": "x * 10"}))
    view.refresh()
    lance.write_dataset(pa.table({"id": [9, 8], "x": [90, 80]}), t.uri, mode="overwrite")
    lance.dataset(t.uri).cleanup_old_versions(older_than=datetime.timedelta(0))
    view.refresh()
    assert _view_rows(view) == _expected(t.uri)


def test_a_view_whose_source_is_gone_says_so_in_plan_and_refresh(db):
    import shutil

    t = db.create_table("src", pa.table({"id": [0, 1], "x": [0, 1]}))
    view = db.create_materialized_view("v", t.search(None).select({"id": "id"}))
    view.refresh()
    shutil.rmtree(t.uri)
    for call in (view.plan_refresh, view.refresh):
        with pytest.raises(ValueError, match="the source 'src' of view 'v' is missing: no Lance dataset at"):
            call()
    assert view.count_rows() == 2  # nothing written


def _udf_view(db, call_log):
    from oracle import record_call

    @mv.udf
    def tenfold(x: int) -> int:
        record_call(call_log, "tenfold", x)
        return 10 * x

    t = db.create_table("src", pa.table({"id": list(range(8)), "x": list(range(8))}))
    view = db.create_materialized_view("v", t.search(None).where("x >= 0").select({"id": "id", "y": tenfold}))
    view.refresh()
    _calls(call_log)
    return t, view


def _calls(call_log) -> list[int]:
    """The values the UDF was called with since the last look (the log is emptied)."""
    import os

    out = []
    for name in os.listdir(call_log):
        path = os.path.join(call_log, name)
        with open(path) as fh:
            out += [int(line) for line in fh]
        os.remove(path)
    return sorted(out)


def _foreign_write(view, how: str) -> None:
    """Write into the view's own dataset the way another tool would."""
    ds = lance.dataset(view.uri)
    if how == "append":  # a row with a made-up key and a second copy of key 3, wrong values
        rows = ds.to_table(filter="id = 3").to_pylist()
        rows[0]["y"] = -1
        bogus = {**rows[0], "__source_row_id": 999, "id": 999}
        lance.write_dataset(pa.Table.from_pylist([rows[0], bogus], schema=ds.schema), view.uri, mode="append")
    elif how == "delete":
        ds.delete("id IN (1, 2)")
    elif how == "update":
        ds.update({"y": "y + 1"}, where="id = 4")
    elif how == "overwrite":
        lance.write_dataset(ds.to_table(filter="id < 2"), view.uri, mode="overwrite")


@pytest.mark.parametrize("how,recomputed", [("append", [3]), ("delete", [1, 2]), ("update", [4]), ("overwrite", None)])
def test_rows_another_tool_wrote_into_a_view_are_repaired_by_the_next_refresh(db, call_log, how, recomputed):
    t, view = _udf_view(db, call_log)
    _foreign_write(view, how)
    outcome = {c.name: c for c in view.check()}
    assert not all(c.passed for c in outcome.values())  # check() sees it before any refresh
    status = view.status()
    assert not status.valid and "another tool wrote into the view" in status.last_error
    plan = view.plan_refresh()
    assert "another tool wrote into the view" in plan.reason and plan.full == (how == "overwrite")
    view.refresh()
    assert view.status().valid
    assert _view_rows_y(view) == sorted((i, 10 * i) for i in range(8))
    # only the rows the other tool touched were computed again (all of them after an overwrite)
    assert _calls(call_log) == (recomputed if recomputed is not None else list(range(8)))
    assert all(c.passed for c in view.check())
    view.refresh()  # repaired once: the next refresh is a no-op again
    assert _calls(call_log) == [] and view.plan_refresh().is_noop


def _view_rows_y(view) -> list[tuple[int, int]]:
    return sorted((r["id"], r["y"]) for r in view.to_arrow().select(["id", "y"]).to_pylist())


def test_check_catches_values_another_tool_changed(db, call_log):
    t, view = _udf_view(db, call_log)
    assert all(c.passed for c in view.check())
    lance.dataset(view.uri).update({"y": "y + 1"}, where="id = 4")
    failed = [c for c in view.check() if not c.passed]
    assert [c.name for c in failed] == ["values_match_source"]
    assert failed[0].metadata["rows_written_outside_refreshes"] == 1


@pytest.mark.parametrize("dropped", ["x", "w", "k"])  # read by a SQL column, by a UDF, by the filter
def test_a_column_the_view_reads_dropped_by_another_tool_is_refused_at_plan_time(db, dropped):
    @mv.udf
    def shout(w: str) -> str:
        return w.upper()

    t = db.create_table("src", pa.table({"id": [1, 2], "x": [1, 2], "w": ["a", "b"], "k": [1, 1]}))
    view = db.create_materialized_view(
        "v", t.search(None).where("k > 0").select({"id": "id", "y": "x * 2", "z": shout}))
    view.refresh()
    before = (view.version, view.status().source_version)
    lance.dataset(t.uri).drop_columns([dropped])
    message = f"view 'v' reads column '{dropped}' of 'src', which version 3 does not have"
    for call in (view.plan_refresh, lambda: view.plan_refresh(mode="full"), view.refresh,
                 lambda: view.refresh(mode="full")):
        with pytest.raises(ValueError, match=message):
            call()
    assert (view.version, view.status().source_version) == before  # nothing recorded


def test_a_column_dropped_and_added_again_by_another_tool_rebuilds_the_view(db):
    t = db.create_table("src", pa.table({"id": [0, 1, 2], "x": [0, 1, 2]}))
    view = db.create_materialized_view("v", t.search(None).where("x >= 0").select({"id": "id", "y": "x * 10"}))
    view.refresh()
    ds = lance.dataset(t.uri)
    ds.drop_columns(["x"])
    lance.dataset(t.uri).add_columns({"x": "id + 5"})  # new values, and no row version moves
    plan = view.plan_refresh()
    assert plan.full and "dropped and added again" in plan.reason
    view.refresh()
    assert _view_rows(view) == _expected(t.uri)


# --- property test: random histories mixing mv_assets' writes with other tools' ---

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

OPEN_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 5)),  # through mv_assets
        st.tuples(st.just("update"), st.integers(0, 4)),
        st.tuples(st.just("pl_append"), st.integers(1, 5)),  # plain pylance from here on
        st.tuples(st.just("pl_delete"), st.integers(0, 4)),
        st.tuples(st.just("pl_update"), st.integers(0, 4)),
        st.tuples(st.just("pl_merge_insert"), st.integers(0, 4)),
        st.tuples(st.just("pl_drop_unread"), st.just(0)),  # drop (then re-add) a column no view reads
        st.tuples(st.just("pl_overwrite"), st.integers(1, 6)),
        st.tuples(st.just("pl_compact"), st.just(0)),
        st.tuples(st.just("pl_write_view"), st.integers(0, 2)),  # into the view's own dataset
        st.tuples(st.just("recreate"), st.integers(1, 3)),  # dropped and created again, n commits
        st.tuples(st.just("ldb_add"), st.integers(1, 4)),  # lancedb from here on
        st.tuples(st.just("ldb_delete"), st.integers(0, 4)),
        st.tuples(st.just("ldb_update"), st.integers(0, 4)),
        st.tuples(st.just("ldb_merge_insert"), st.integers(0, 4)),
        st.tuples(st.just("ldb_recreate"), st.integers(1, 4)),  # drop_table + create_table
        st.tuples(st.just("refresh"), st.integers(0, 3)),  # tasks of at most that many rows (0: sized automatically)
        st.tuples(st.just("backfill"), st.just(0)),
    ),
    min_size=1,
    max_size=12,
)
OPEN_EXAMPLES = int(os.environ.get("MV_ASSETS_HYPOTHESIS_EXAMPLES", "12"))


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "overlapped"])
@settings(max_examples=OPEN_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(ops=OPEN_OPS)
def test_random_open_world_histories_match_the_oracle(overlap, ops, tmp_path_factory):
    """Views (one with a UDF) and a table's computed column through histories
    where plain pylance and lancedb write the source (and pylance the view
    too), and the source is dropped and created again. After every refresh the view equals the oracle
    (plain pyarrow over the source at the same version); after every backfill
    the table's computed column equals its function of the row as it is.
    "overlapped": every refresh task reads, computes and writes at once
    (execution.pipeline), as large tasks do; "sequential": one step after
    the other, as small tasks do."""
    from mv_assets.execution import tasks

    before = tasks.OVERLAP_MIN_ROWS
    tasks.OVERLAP_MIN_ROWS = 0 if overlap else 2**62
    try:
        _open_world_history(ops, tmp_path_factory)
    finally:
        tasks.OVERLAP_MIN_ROWS = before


def _open_world_history(ops, tmp_path_factory):
    from oracle import actual_view, expected_view

    root = tmp_path_factory.mktemp("open")
    db = mv.connect(str(root / "cat"), runner=mv.InlineRunner())
    schema = pa.schema([("id", pa.int64()), ("x", pa.int64()), ("note", pa.string())])

    def rows(ids):
        return pa.table({"id": ids, "x": [i * 7 % 11 for i in ids], "note": [f"n{i}" for i in ids]}, schema=schema)

    t = db.create_table("src", rows(list(range(6))), primary_key="id")
    t.add_columns({"dx": double})
    t.backfill("dx")
    next_id = [6]

    def fresh(n):
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return ids

    @mv.udf
    def score(x: int) -> int:
        return 3 * x + 1

    view = db.create_materialized_view(
        "v", t.search(None).where("x % 3 != 0").select({"id": "id", "x": "x", "s": score, "lbl": "x + 100"}))

    def keep(r):
        return r["x"] % 3 != 0

    def project(r):
        return {"id": r["id"], "x": r["x"], "s": 3 * r["x"] + 1, "lbl": r["x"] + 100}

    for op, arg in list(ops) + [("refresh", 0), ("backfill", 0)]:
        _catalog_reads_agree(db)  # (after the previous step, whoever wrote it)
        ds = lance.dataset(t.uri)
        if op == "add":
            t.add(rows(fresh(arg)))
        elif op == "update":
            t.update(f"id % 5 = {arg}", values_sql={"x": "x + 1"})
        elif op == "pl_append":
            lance.write_dataset(rows(fresh(arg)), t.uri, mode="append")
        elif op == "pl_delete":
            ds.delete(f"id % 5 = {arg}")
        elif op == "pl_update":
            ds.update({"x": "x + 2"}, where=f"id % 5 = {arg}")
        elif op == "pl_merge_insert":
            have = ds.to_table(columns=["id"], filter=f"id % 5 = {arg}").column("id").to_pylist()[:2]
            batch = rows(have + fresh(1))
            batch = batch.set_column(1, "x", pa.array([v + 5 for v in batch.column("x").to_pylist()]))
            ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(batch)
        elif op == "pl_drop_unread":
            ds.drop_columns(["note"])
            lance.dataset(t.uri).add_columns({"note": "CAST(id AS STRING)"})
        elif op == "pl_overwrite":
            lance.write_dataset(rows(fresh(arg)), t.uri, mode="overwrite")
        elif op == "pl_compact":
            ds.optimize.compact_files()
        elif op == "pl_write_view":
            vds = lance.dataset(view.uri)
            if vds.count_rows() == 0:
                continue
            if arg == 0:
                vds.delete("id % 2 = 0")
            elif arg == 1:
                vds.update({"s": "s + 1000"})
            else:
                lance.write_dataset(vds.to_table(), view.uri, mode="append")  # every row twice
        elif op == "recreate":
            import shutil

            shutil.rmtree(t.uri)  # what lancedb's drop_table does; then another tool creates it
            lance.write_dataset(rows(fresh(2)), t.uri, enable_stable_row_ids=True)
            for _ in range(arg - 1):
                lance.write_dataset(rows(fresh(1)), t.uri, mode="append")
        elif op.startswith("ldb_"):
            import lancedb

            ldb = lancedb.connect(db.uri)
            if op == "ldb_recreate":
                ldb.drop_table("src")
                ldb.create_table("src", rows(fresh(arg)), storage_options={"new_table_enable_stable_row_ids": "true"})
                continue
            tbl = ldb.open_table("src")
            if op == "ldb_add":
                tbl.add(rows(fresh(arg)))
            elif op == "ldb_delete":
                tbl.delete(f"id % 5 = {arg}")
            elif op == "ldb_update":
                tbl.update(where=f"id % 5 = {arg}", values_sql={"x": "x + 3"})
            else:
                have = ds.to_table(columns=["id"], filter=f"id % 5 = {arg}").column("id").to_pylist()[:2]
                batch = rows(have + fresh(1))
                batch = batch.set_column(1, "x", pa.array([v + 4 for v in batch.column("x").to_pylist()]))
                tbl.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(batch)
        elif op == "refresh":
            view.refresh(max_rows_per_task=arg or None)
            assert actual_view(view) == expected_view(t.uri, view.source_version, keep, project)
            assert all(c.passed for c in view.check()), [c for c in view.check() if not c.passed]
        elif op == "backfill":
            if "dx" not in lance.dataset(t.uri).schema.names:  # recreated by another tool: no computed column
                continue
            t.backfill("dx")
            got = {r["id"]: (r["x"], r["dx"]) for r in t.to_arrow().select(["id", "x", "dx"]).to_pylist()}
            assert all(dx == 2 * x for x, dx in got.values()), got
            status = {c["column"]: c for c in t.column_status()}["dx"]
            assert status["stale"] == 0 and status["current"] == len(got)


def _catalog_reads_agree(db) -> None:
    """What the catalog-wide reads say, served in part from the catalog's
    summaries (a table unchanged since last looked at is listed, not opened),
    equals what the same reads say from the datasets alone: the view's own
    status, and every dataset described with the summaries removed."""
    from mv_assets.api.describe import describe_dataset
    from mv_assets.storage import objects

    fields = ("load_state", "valid", "cardinality", "source_version", "source_latest_version", "versions_behind",
              "stale_count", "last_error")
    whole = {r["name"]: {f: r[f] for f in fields} for r in db.status().to_pylist()}
    alone = {n: {f: r[f] for f in fields} for n in whole for r in db.status(n).to_pylist()}
    assert whole == alone
    described = db.describe()
    assert described == {n: describe_dataset(n, db.table_uri(n)) for n in db.table_names()}
    objects.remove(db.layout.summaries())
    assert db.describe() == described


def test_a_table_lancedb_created_is_refused_until_it_is_brought_in(db):
    """lancedb creates tables without stable row ids by default: a view over
    one is refused before anything is written; enable_stable_row_ids brings
    the table in (same rows), and the view then refreshes exactly; lancedb
    keeps writing it."""
    import lancedb

    ldb = lancedb.connect(db.uri)
    ldb.create_table("events", pa.table({"id": [1, 2, 3], "x": [10, 20, 30]}))
    events = db.open_table("events")
    with pytest.raises(ValueError, match="'events' has no stable row ids"):
        db.create_materialized_view("ev", events.search(None).select({"id": "id", "y": "x + 1"}))
    assert "ev" not in db
    db.enable_stable_row_ids("events")
    view = db.create_materialized_view("ev", events.search(None).select({"id": "id", "y": "x + 1"}))
    view.refresh()
    tbl = ldb.open_table("events")
    tbl.add(pa.table({"id": [4], "x": [40]}))
    tbl.update(where="id = 1", values={"x": 11})
    tbl.delete("id = 2")
    view.refresh()
    assert sorted((r["id"], r["y"]) for r in view.to_arrow().to_pylist()) == [(1, 12), (3, 31), (4, 41)]


def test_the_catalog_lists_the_tables_lancedb_lists(db):
    """The catalog's tables are the folders lancedb lists at the root, found in
    one listing: tables lancedb wrote among ours, and one deregistered through
    Lance's directory namespace (a marker beside the files it keeps; lancedb 0.40
    lists and opens it). A folder that is no dataset (a creation that never
    committed), which lancedb lists too, and the catalog's own state are not tables."""
    import lancedb
    from lance.namespace import DirectoryNamespace
    from lance_namespace_urllib3_client.models.deregister_table_request import DeregisterTableRequest

    ldb = lancedb.connect(db.uri)
    db.create_table("ours", pa.table({"id": [1, 2]}))
    ldb.create_table("theirs", pa.table({"id": [3]}))
    db.create_table("kept", pa.table({"id": [4]}))
    db.create_materialized_view("v", db.open_table("ours").search(None).select({"id": "id"})).refresh()
    DirectoryNamespace(root=db.uri, manifest_enabled="false", dir_listing_enabled="true").deregister_table(
        DeregisterTableRequest(id=["kept"]))
    os.makedirs(os.path.join(db.uri, "half.lance", "data"))  # a creation that never committed
    assert db.table_names() == ["kept", "ours", "theirs", "v"]
    assert sorted(ldb.table_names()) == ["half", "kept", "ours", "theirs", "v"]  # lancedb lists any folder
    assert db.open_table("kept").to_arrow().column("id").to_pylist() == ldb.open_table("kept").to_arrow()[
        "id"].to_pylist() == [4]
    assert [r["name"] for r in db.status().to_pylist()] == ["v"]


def test_a_column_added_with_values_by_another_tool_keeps_the_view_exact(db):
    """Lance's add_columns with values (a Merge) moves the versions of the rows
    it rewrites in place: the refresh must look at every fragment, not only the
    fragments written since (the view's row versions would lag behind)."""
    t = db.create_table("src", pa.table({"id": [0, 1, 2], "x": [1, 2, 3]}))
    view = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": "x * 10"}))
    view.refresh()
    lance.dataset(t.uri).add_columns({"note": "CAST(id AS STRING)"})
    view.refresh()
    assert _view_rows(view) == [(0, 10), (1, 20), (2, 30)]
    assert all(c.passed for c in view.check()), [c for c in view.check() if not c.passed]


def test_reused_dataset_handles_still_see_versions_written_meanwhile(tmp_path):
    """Within one refresh (objects.reusing_handles) a dataset is opened once; a
    version another tool writes meanwhile is still seen as the latest, and a
    handle a Lance call moved to a new version is not served as its old one."""
    from mv_assets.storage import objects

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2, 3]}), uri)
    with objects.reusing_handles():
        first = objects.dataset(uri)
        lance.write_dataset(pa.table({"id": [4]}), uri, mode="append")  # another writer
        latest = objects.dataset(uri)
        assert (latest.version, latest.count_rows()) == (2, 4)
        first.delete("id = 1")  # moves this handle to version 3
        assert objects.dataset(uri, version=1).count_rows() == 3
        assert objects.dataset(uri).count_rows() == 3 and objects.dataset(uri).version == 3
        with pytest.raises(ValueError, match="not found"):
            objects.dataset(uri, version=9)


def test_the_newest_handle_kept_across_refreshes_is_served_only_while_it_is_the_newest(tmp_path):
    """The newest version of a dataset this process opened or committed is kept
    across reusing_handles blocks (the next refresh opens its view and source
    without reading their manifests again). It is served only while it is
    still the newest and its manifest is the one kept: another writer's
    commit, a table removed and made again up to the same version (same
    numbers, same sizes), and a handle a Lance call moved are all seen."""
    import shutil

    from mv_assets.storage import objects

    uri = str(tmp_path / "t.lance")

    def make(base: int) -> None:
        lance.write_dataset(pa.table({"id": [base, base + 1]}), uri)
        lance.write_dataset(pa.table({"id": [base + 2]}), uri, mode="append")

    def ids() -> list[int]:
        with objects.reusing_handles():
            return sorted(objects.dataset(uri).to_table().column("id").to_pylist())

    make(0)
    assert ids() == [0, 1, 2] and ids() == [0, 1, 2]  # (the second served from the kept handle)
    with objects.reusing_handles():
        served = objects.dataset(uri)
        served.delete("id = 0")  # a Lance call moves the handle served: the kept one stays at its version
    lance.write_dataset(pa.table({"id": [9]}), uri, mode="append")  # another writer
    assert ids() == [1, 2, 9]
    shutil.rmtree(uri)
    make(100)  # versions 1 and 2 again, manifests of the same sizes
    assert ids() == [100, 101, 102]
    with objects.reusing_handles():
        assert objects.dataset(uri).version == 2
    # a commit of ours is kept as committed, and seen
    ds = objects.dataset(uri)
    fragments = objects.write_fragments(pa.table({"id": [103]}), uri)
    objects.commit(uri, lance.LanceOperation.Append(fragments), read_version=ds.version)
    assert ids() == [100, 101, 102, 103]


def test_a_gap_in_the_versions_another_tool_left_is_seen(db):
    """A kept handle was served while the manifest of its next version was
    missing: a history cleanup that keeps a tagged version (or removes the
    versions it is given) leaves a gap, and later versions were not seen. A
    view refreshed to nothing new and said it was current, and add() looked
    its keys up in an old version (a duplicate key accepted)."""
    import datetime

    def gap(uri: str, row: int) -> None:  # another tool: tag the latest, append twice, clean the history up
        ds = lance.dataset(uri)
        ds.tags.create(f"keep{ds.version}", ds.version)
        lance.write_dataset(pa.table({"id": [row], "x": [row]}).cast(ds.schema), uri, mode="append")
        lance.write_dataset(pa.table({"id": [row + 1], "x": [row + 1]}).cast(ds.schema), uri, mode="append")
        lance.dataset(uri).cleanup_old_versions(older_than=datetime.timedelta(0), error_if_tagged_old_versions=False)

    t = db.create_table("t", pa.table({"id": list(range(10)), "x": list(range(10))}), primary_key="id")
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": "x + 1"}))
    v.refresh()
    gap(t.uri, 100)
    versions = sorted(x["version"] for x in lance.dataset(t.uri).versions())
    assert versions[-2] + 1 < versions[-1]  # (the gap)
    r = v.refresh()
    assert r.rows_inserted == 2 and v.count_rows() == 12
    s = v.status()
    assert (s.source_version, s.versions_behind) == (versions[-1], 0)
    t.add(pa.table({"id": [200], "x": [200]}))
    gap(t.uri, 300)
    with pytest.raises(ValueError, match="already exist"):
        t.add(pa.table({"id": [301], "x": [0]}))
    ids = lance.dataset(t.uri).to_table(columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 15


def test_a_source_restored_to_a_version_from_before_its_stamp_is_the_same_table(db):
    """A table's identity (storage.identity) lives in its Lance config: a
    restore to a version from before a view stamped it took the stamp away,
    and the table read as dropped and made again (the status said so, every
    version behind, and the next refresh rebuilt the view). The version the
    restore left still carries it: the same table, stamped again with it."""
    from mv_assets.storage.identity import table_id

    t = db.create_table("raw", [{"id": i, "x": i} for i in range(10)], primary_key="id")
    t.add([{"id": 10, "x": 10}])
    before = lance.dataset(t.uri).version  # (no view yet: no stamp)
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
    j = db.create_materialized_view("j", db.open_table("raw").search(None).join(
        db.create_table("dims", [{"x": i, "w": i * 2} for i in range(11)]), on="x").select({"id": "id", "w": "w"}))
    v.refresh()
    j.refresh()
    stamp = table_id(lance.dataset(t.uri))
    assert stamp is not None
    lance.dataset(t.uri, version=before).restore()
    assert table_id(lance.dataset(t.uri)) is None
    for view in (v, j):
        s = view.status()
        assert (s.valid, s.last_error, s.stale_count) == (True, None, 0), (view.name, s)
    lance.write_dataset(pa.table({"id": [20], "x": [3]}), t.uri, mode="append")
    for view in (v, j):
        assert "dropped" not in view.plan_refresh().reason
        view.refresh()
    assert table_id(lance.dataset(t.uri)) == stamp  # (stamped again with the identity it had)
    assert sorted(v.to_arrow().column("id").to_pylist()) == list(range(11)) + [20]
    assert v.status().versions_behind == 0 and j.status().versions_behind == 0


def _merge_view(db, call_log, n: int = 12):
    """A source with stable row ids (mv_assets' own tables), a view with a
    filter, a SQL column and a UDF, refreshed once (its calls read away)."""
    from oracle import record_call

    @mv.udf
    def tenfold(x: int) -> int:
        record_call(call_log, "tenfold", x)
        return 10 * x

    t = db.create_table("src", pa.table({"id": list(range(n)), "x": list(range(n))}))
    view = db.create_materialized_view("v", t.search(None).where("x % 3 != 0").select(
        {"id": "id", "x": "x", "s": "x + 1", "y": tenfold}))
    view.refresh()
    _calls(call_log)
    return t, view


def _merge_view_oracle(t, view) -> None:
    """The view's rows equal pyarrow's over the source at the version it
    reflects, each at the source row's version there."""
    src = lance.dataset(t.uri, version=view.source_version).to_table(
        columns={"id": "id", "x": "x", "v": "_row_last_updated_at_version"}, with_row_id=True)
    want = sorted((r["_rowid"], r["v"], r["id"], r["x"], r["x"] + 1, 10 * r["x"]) for r in src.to_pylist()
                  if r["x"] % 3 != 0)
    got = sorted((r["__source_row_id"], r["__source_row_version"], r["id"], r["x"], r["s"], r["y"])
                 for r in lance.dataset(view.uri).to_table().to_pylist())
    assert got == want


@pytest.mark.parametrize("how", ["sql", "null", "merge", "lancedb"])
def test_a_column_another_tool_adds_moves_rows_but_computes_nothing(db, call_log, how):
    """pylance's and lancedb's add_columns and merge on a table with stable
    row ids move every row's version (a Merge commit) while no value changes:
    the next refresh copies the view's rows (their new versions recorded),
    calling no UDF; it used to compute every row again."""
    t, view = _merge_view(db, call_log)
    ds = lance.dataset(t.uri)
    if how == "sql":
        ds.add_columns({"note": "CAST(id AS STRING)"})
    elif how == "null":
        ds.add_columns(pa.field("note", pa.string()))
    elif how == "merge":
        ds.merge(pa.table({"id": list(range(12)), "note": [str(i) for i in range(12)]}), left_on="id")
    else:
        lancedb = pytest.importorskip("lancedb")
        lancedb.connect(db.layout.root).open_table("src").add_columns({"note": "CAST(id AS STRING)"})
    moved = lance.dataset(t.uri).to_table(columns={"v": "_row_last_updated_at_version"})
    plan = view.plan_refresh()
    result = view.refresh()
    assert _calls(call_log) == []
    assert not any(result.udf_rows_computed.values())
    if set(moved.column("v").to_pylist()) != {1}:  # (the Merge moved the rows: they are copied)
        assert result.rows_updated == 8 and plan.rows_to_update == 8 and plan.udf_rows == {"y": 0}
    _merge_view_oracle(t, view)
    assert all(c.passed for c in view.check())
    assert view.plan_refresh().is_noop and view.status().stale_count == 0


def test_rows_changed_around_a_column_added_by_another_tool_are_computed(db, call_log):
    """Rows updated before or after the Merge, appended before it, and deleted
    are computed (or removed) as ever; only the rows the Merge alone moved are
    copied."""
    t, view = _merge_view(db, call_log)
    t.update(where="id IN (1, 2)", values_sql={"x": "x + 100"})  # through mv_assets
    lance.dataset(t.uri).update({"x": "x + 200"}, where="id = 4")  # another tool, before the Merge
    lance.write_dataset(pa.table({"id": [20, 21], "x": [20, 22]}), t.uri, mode="append")
    lance.dataset(t.uri).delete("id = 5")
    lance.dataset(t.uri).add_columns({"note": "CAST(id AS STRING)"})
    lance.dataset(t.uri).update({"x": "x + 300"}, where="id = 7")  # after it
    view.refresh()
    assert _calls(call_log) == [20, 22, 101, 307]  # (102 and 204 fail the filter: removed from the view)
    _merge_view_oracle(t, view)
    lance.dataset(t.uri).add_columns({"note2": "CAST(x AS STRING)"})  # twice in a row
    lance.dataset(t.uri).add_columns({"note3": "CAST(x AS STRING)"})
    view.refresh()
    assert _calls(call_log) == []
    _merge_view_oracle(t, view)
    assert all(c.passed for c in view.check())


def test_columns_added_to_a_view_stay_current_when_its_rows_are_copied(db, call_log):
    """A column added to the view (its values stored with the view row's
    version) keeps its values when a column-adding Merge of the source makes
    the refresh copy the view's rows, and reads as current."""
    t, view = _merge_view(db, call_log)

    @mv.udf
    def plus_one(x: int) -> int:
        return x + 1

    view.add_columns({"z": plus_one})
    view.backfill("z")
    before = view.column_status()
    lance.dataset(t.uri).add_columns({"note": "CAST(id AS STRING)"})
    view.refresh()
    assert _calls(call_log) == []
    rows = {r["id"]: r["z"] for r in view.to_arrow().select(["id", "z"]).to_pylist()}
    assert rows == {i: i + 1 for i in range(12) if i % 3 != 0}
    assert view.column_status() == before and before[-1]["column"] == "z", before


def test_partitions_refreshed_after_another_tool_adds_a_column_compute_nothing(db, call_log):
    """A fragment-scoped refresh (a Dagster partition's run) after a
    column-adding Merge copies its fragment's rows too, then the whole
    refresh copies the rest; the view ends equal to the oracle."""
    t, view = _merge_view(db, call_log)
    t.add(pa.table({"id": list(range(12, 24)), "x": list(range(12, 24))}))
    view.refresh()
    _calls(call_log)
    lance.dataset(t.uri).add_columns({"note": "CAST(id AS STRING)"})
    first = min(f.fragment_id for f in lance.dataset(t.uri).get_fragments())
    plan = view.plan_refresh(fragments=[first])
    assert plan.udf_rows == {"y": 0} and plan.rows_to_update == 8
    view.refresh(fragments=[first])
    assert _calls(call_log) == []
    view.refresh()
    assert _calls(call_log) == []
    _merge_view_oracle(t, view)
    assert all(c.passed for c in view.check())


def test_a_delete_or_update_that_matches_no_row_leaves_the_view_current(db):
    """pylance's delete and update whose predicate matches nothing still
    commit a version (no fragment touched): the view is not behind, nothing
    is pending (a staleness policy or the sensor would refresh for nothing);
    it read 2 versions behind that "change what it reads"."""
    t = db.create_table("src", pa.table({"id": list(range(10)), "x": list(range(10))}), primary_key="id")
    view = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
    view.refresh()
    lance.dataset(t.uri).delete("x > 1000")
    lance.dataset(t.uri).update({"x": "x + 1"}, where="x > 1000")
    status = view.status()
    assert (status.versions_behind, status.stale_count, view.pending_source_versions()) == (0, 0, [])
    assert not view.plan_refresh().has_work
    lance.dataset(t.uri).delete("x = 3")  # one that matches
    assert view.status().versions_behind == 1 and view.pending_source_versions() == [lance.dataset(t.uri).version]


def test_check_says_in_words_when_the_source_version_the_view_reflects_was_cleaned_up(db):
    """Another tool cleans up the source's history past the version the view
    reflects: check() (full or last_refresh) says so and what to do (Lance's
    "not found" of that manifest came out); after a refresh the checks pass."""
    import datetime

    t = db.create_table("t", pa.table({"id": [1, 2, 3], "x": [5, 6, 7]}), primary_key="id")
    q = db.create_materialized_view("q", t.search(None).where("x > 5").select({"id": "id", "x": "x"}))
    q.refresh()
    t.add(pa.table({"id": [4], "x": [9]}))
    lance.dataset(t.uri).cleanup_old_versions(older_than=datetime.timedelta(0), delete_unverified=True)
    for scope in ("full", "last_refresh"):
        with pytest.raises(ValueError, match=r"cannot check view 'q': version \d+ of 't', which the view reflects, "
                                             "is no longer in its history"):
            q.check(scope)
    q.refresh()
    assert all(c.passed for c in q.check())


@pytest.mark.parametrize("change", ["add", "drop", "drop_udf"])
def test_columns_another_tool_adds_to_or_drops_from_a_views_dataset_are_said_and_refused(db, change):
    """Another tool adds a column to a view's own dataset (every refresh then
    failed with a KeyError) or drops one (refreshes went on without it):
    status says the view is not valid and why, a refresh is refused in our
    words with nothing written; restoring the view's dataset undoes it."""
    @mv.udf
    def f(x: int) -> int:
        return x * 3 + 1

    t = db.create_table("t", pa.table({"id": [1, 2, 3], "x": [15, 25, 35]}), primary_key="id")
    q = db.create_materialized_view("q", t.search(None).select({"id": "id", "x": "x", "u": f}))
    q.refresh()
    before = lance.dataset(q.uri).version
    ds = lance.dataset(q.uri)
    if change == "add":
        ds.add_columns({"extra": "x + 1"})
    else:
        ds.drop_columns(["x" if change == "drop" else "u"])
    t.add(pa.table({"id": [4], "x": [45]}))
    status = q.status()
    assert not status.valid and "another tool changed the columns of the view's dataset" in status.last_error
    changed = lance.dataset(q.uri).version
    with pytest.raises(ValueError, match="cannot refresh view 'q': another tool changed the columns"):
        q.refresh()
    assert lance.dataset(q.uri).version == changed
    lance.dataset(q.uri).checkout_version(before).restore()
    q.refresh()
    assert sorted((r["id"], r["x"], r["u"]) for r in q.to_arrow().to_pylist()) == [
        (i, x, x * 3 + 1) for i, x in ((1, 15), (2, 25), (3, 35), (4, 45))]
    assert q.status().valid
