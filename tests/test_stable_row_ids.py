"""Tables without stable row ids (lancedb's and lance.write_dataset's default)
are refused by everything that matches rows by id, before anything is
written; ``Connection.enable_stable_row_ids`` (``mv-assets adopt``) brings
them in. And writers that give rewritten rows new stable row ids (a Spark
``MERGE INTO`` through lance-spark) leave views equal to their oracle."""

import os
import shutil
import warnings

import lance
import pyarrow as pa
import pytest
from click.testing import CliRunner
from oracle import actual_view, expected_view, record_call

import mv_assets as mv
from mv_assets.api.declare import apply
from mv_assets.cli import main
from mv_assets.storage import objects


@mv.udf
def double(x: int) -> int:
    return 2 * x


def _foreign(db, name: str = "t", n: int = 6, **kwargs) -> str:
    """A table another tool wrote into the catalog directory, without stable row ids."""
    uri = db.table_uri(name)
    lance.write_dataset(pa.table({"id": list(range(n)), "x": list(range(n))}), uri, **kwargs)
    return uri


def _values(uri: str) -> list[dict]:
    return lance.dataset(uri).to_table(columns=["id", "x"]).to_pylist()


# -- refused before anything is written ---------------------------------------------


def test_a_view_over_a_table_without_stable_row_ids_is_refused_before_anything_is_written(db):
    """Before: the view was created (and the table stamped) and its first refresh failed."""
    uri = _foreign(db)
    t = db.open_table("t")
    for with_no_data in (True, False):
        with pytest.raises(ValueError, match=r"'t' has no stable row ids .*db\.enable_stable_row_ids\('t'\)"):
            db.create_materialized_view("v", t.search(None).select({"id": "id", "y": double}), with_no_data=with_no_data)
    assert db.table_names() == ["t"]
    assert lance.dataset(uri).version == 1 and lance.dataset(uri).config() == {}  # not even its identity stamped


def test_a_view_declared_in_code_over_it_is_refused_by_describe_query_and_apply(db):
    """Before: describe_query described it and apply created it."""
    _foreign(db)
    q = db.open_table("t").search(None).select({"id": "id", "y": double})
    with pytest.raises(ValueError, match=r"without them a materialized view \('v'\) cannot follow its rows"):
        db.describe_query("v", q)
    with pytest.raises(ValueError, match=r"'t' has no stable row ids"):
        apply(db, "v", q)
    assert db.table_names() == ["t"]


def test_computed_columns_are_refused_on_it(db):
    """Before: add_columns and backfill ran, and a plain pylance update of x
    then left y reported current with the old value (without stable row ids an
    update moves no row version, so a value cannot follow its row)."""
    uri = _foreign(db)
    t = db.open_table("t")
    with pytest.raises(ValueError, match=r"without them computed columns \(add_columns\) cannot follow its rows"):
        t.add_columns({"y": double})
    assert t.schema.names == ["id", "x"] and lance.dataset(uri).version == 1


def _legacy(db, columns=None):
    """A table with computed columns (y), written again without stable row ids
    (recreated by another tool; or given its columns before that was refused)."""
    t = db.create_table("t", pa.table({"id": list(range(6)), "x": list(range(6))}), primary_key="id")
    for name, udf in (columns or {"y": double}).items():
        t.add_columns({name: udf})
        t.backfill(name)
    whole = lance.dataset(t.uri).to_table()
    shutil.rmtree(t.uri)
    lance.write_dataset(whole, t.uri)  # the schema (and the column's definition in it) is kept
    return db.open_table("t")


def test_a_backfill_of_a_table_that_lost_its_stable_row_ids_is_refused(db):
    """Before: it planned and ran."""
    t = _legacy(db)
    assert [c.name for c in t.computed_columns()] == ["y"]
    with pytest.raises(ValueError, match=r"without them a backfill cannot follow its rows"):
        t.plan_backfill("y")
    with pytest.raises(ValueError, match=r"without them a backfill cannot follow its rows"):
        t.backfill("y", where="id > 2")


# -- bringing a table in --------------------------------------------------------------


def test_enable_stable_row_ids_keeps_rows_schema_config_and_scalar_indexes(db):
    uri = _foreign(db, n=1000, max_rows_per_file=300)
    ds = lance.dataset(uri)
    ds.update_config({"owner": "ingest"})
    ds.create_scalar_index("id", "BTREE")
    ds.create_scalar_index("x", "BITMAP", name="x_bitmap")
    lance.dataset(uri).delete("id < 10")
    lance.dataset(uri).replace_schema_metadata({"mv_assets.primary_key": "id", "owner.note": "kept"})
    md = {b"mv_assets.primary_key": b"id", b"owner.note": b"kept"}
    before = _values(uri)

    with warnings.catch_warnings(record=True) as caught:  # (pylance's deprecation of list_indices was shown)
        warnings.simplefilter("always")
        result = db.enable_stable_row_ids("t")
    assert [str(w.message) for w in caught if "list_indices" in str(w.message)] == []

    ds = lance.dataset(uri)
    assert ds.has_stable_row_ids
    assert result.rewritten and result.rows == 990 and result.version == ds.version
    assert _values(uri) == before  # every row, in scan order
    assert ds.schema.metadata == md and db.open_table("t").primary_key == "id"
    assert ds.config()["owner"] == "ingest" and "mv_assets.table_id" in ds.config()
    assert sorted(i["name"] for i in ds.list_indices()) == ["id_idx", "x_bitmap"] == sorted(result.indexes_rebuilt)
    assert ds.to_table(columns=["id"], filter="id = 500").num_rows == 1
    assert objects.listdir(db.layout.state("adopt")) == []  # nothing left beside it
    # and now it is a source like any other
    view = db.create_materialized_view("v", db.open_table("t").search(None).where("x % 2 = 0").select({"id": "id", "y": double}))
    view.refresh()
    assert actual_view(view) == expected_view(uri, ds.version, lambda r: r["x"] % 2 == 0,
                                              lambda r: {"id": r["id"], "y": 2 * r["x"]})
    again = db.enable_stable_row_ids("t")
    assert not again.rewritten and lance.dataset(uri).version == ds.version  # (its identity was stamped by the rewrite)


def test_indexes_with_parameters_are_refused_unless_dropped(db):
    uri = _foreign(db)
    lance.dataset(uri).create_scalar_index("id", "BTREE")
    lance.write_dataset(pa.table({"id": [9], "x": [9]}), uri, mode="append")
    ds = lance.dataset(uri)
    ds.add_columns({"s": "CAST(x AS STRING)"})
    lance.dataset(uri).create_scalar_index("s", "INVERTED", name="s_text")
    v = lance.dataset(uri).version
    with pytest.raises(ValueError, match=r"indexes that cannot be rebuilt without their parameters: 's_text' \(Inverted on s\)"):
        db.enable_stable_row_ids("t")
    assert lance.dataset(uri).version == v and not lance.dataset(uri).has_stable_row_ids
    result = db.enable_stable_row_ids("t", drop_indexes=True)
    assert (result.indexes_rebuilt, result.indexes_dropped) == (["id_idx"], ["s_text"])
    assert [i["name"] for i in lance.dataset(uri).list_indices()] == ["id_idx"]


@mv.udf(on_error="skip")
def fragile(x: int) -> int:
    if x == 3:
        raise ValueError("no value for 3")
    return 2 * x


def test_computed_columns_of_an_adopted_table_are_stale_and_its_error_records_cleared(db):
    t = _legacy(db, {"y": double, "f": fragile})
    assert [e.row_id for e in t.get_errors(column_name="f")] == [3]  # a row id of the old table
    objects.put_bytes(objects.join(db.layout.column_checkpoints("t", "abc"), "batch.arrow"), b"keyed by old row ids")
    result = db.enable_stable_row_ids("t")
    assert result.stale_columns == ["f", "y"]
    t = db.open_table("t")
    assert [(c["column"], c["current"], c["stale"]) for c in t.column_status()] == [("y", 0, 6), ("f", 0, 6)]
    assert t.to_arrow().column("y").to_pylist() == [2 * i for i in range(6)]  # values stay until recomputed
    assert t.get_errors(column_name="f") == [] and not objects.exists(db.layout.checkpoints("t"))
    assert t.backfill("y").udf_rows_computed == 6
    assert [(c["column"], c["current"], c["stale"]) for c in t.column_status()] == [("y", 6, 0), ("f", 0, 6)]


def _crash_on_call(monkeypatch, name: str, call: int) -> None:
    """``objects.<name>`` raises at its ``call``-th call, as if the process died there."""
    real, seen = getattr(objects, name), []

    def dying(*args, **kwargs):
        seen.append(1)
        if len(seen) == call:
            raise KeyboardInterrupt(f"killed in {name}")
        return real(*args, **kwargs)

    monkeypatch.setattr(objects, name, dying)


@pytest.mark.parametrize("call", [1, 2], ids=["before_the_swap", "between_the_renames"])
def test_an_interrupted_adoption_never_loses_the_table_and_running_it_again_finishes(db, monkeypatch, call):
    uri = _foreign(db)
    before = _values(uri)
    with monkeypatch.context() as m:
        _crash_on_call(m, "rename_tree", call)
        with pytest.raises(KeyboardInterrupt, match="killed in rename_tree"):
            db.enable_stable_row_ids("t")
    if call == 1:  # the old table is in place, untouched
        assert _values(uri) == before and not lance.dataset(uri).has_stable_row_ids
    else:  # both copies wait under _mv_assets/adopt/t
        assert "t" not in db
        assert objects.is_dataset(db.layout.adoption("t") + "/new.lance")
    result = db.enable_stable_row_ids("t")
    assert result.rewritten and lance.dataset(uri).has_stable_row_ids and _values(uri) == before
    assert not objects.exists(db.layout.adoption("t"))


def test_a_write_during_the_rewrite_aborts_it(db, monkeypatch):
    from mv_assets.storage import row_ids

    uri = _foreign(db)
    real = row_ids._without_markers

    def with_a_concurrent_append(reader):
        lance.write_dataset(pa.table({"id": [100], "x": [100]}), uri, mode="append")
        return real(reader)

    monkeypatch.setattr(row_ids, "_without_markers", with_a_concurrent_append)
    with pytest.raises(mv.ConcurrentWriteError, match=r"'t' changed while it was being rewritten \(version 1 -> 2\)"):
        db.enable_stable_row_ids("t")
    assert len(_values(uri)) == 7 and not lance.dataset(uri).has_stable_row_ids
    assert not objects.exists(db.layout.adoption("t"))


def _recreated_without_stable_row_ids(db, refresh: bool):
    """A view over t, then t removed and written again by another tool without stable row ids."""
    t = db.create_table("t", pa.table({"id": list(range(6)), "x": list(range(6))}))
    view = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": double}))
    if refresh:
        view.refresh()
    shutil.rmtree(t.uri)
    lance.write_dataset(pa.table({"id": list(range(4)), "x": [10, 11, 12, 13]}), t.uri)
    return view


def test_a_view_holding_rows_of_the_old_row_ids_refuses_the_adoption(db):
    _recreated_without_stable_row_ids(db, refresh=True)
    with pytest.raises(ValueError, match=r"views \['v'\] over it hold rows matched by its old row ids; drop them first"):
        db.enable_stable_row_ids("t")
    assert not lance.dataset(db.table_uri("t")).has_stable_row_ids


def test_a_view_that_never_refreshed_is_kept_and_computes_every_row_after_the_adoption(db):
    view = _recreated_without_stable_row_ids(db, refresh=False)
    with pytest.raises(ValueError, match="stable row ids"):  # (the refresh's own check)
        view.refresh()
    db.enable_stable_row_ids("t")
    assert view.refresh().udf_rows_computed == {"y": 4}
    uri = db.table_uri("t")
    assert actual_view(view) == expected_view(uri, lance.dataset(uri).version, lambda r: True,
                                              lambda r: {"id": r["id"], "y": 2 * r["x"]})


def test_mv_assets_adopt(db):
    _foreign(db)
    cli = CliRunner()
    r = cli.invoke(main, ["--db", db.uri, "--runner", "inline", "adopt", "t"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.output.startswith("t: rewritten with stable row ids: 6 rows in ")
    r = cli.invoke(main, ["--db", db.uri, "--runner", "inline", "adopt", "t", "--json"], catch_exceptions=False)
    assert r.exit_code == 0 and '"rewritten": false' in r.output
    r = cli.invoke(main, ["--db", db.uri, "--runner", "inline", "adopt", "nope"], catch_exceptions=False)
    assert r.exit_code == 2 and "no table or view named 'nope'" in r.output


def test_adoption_on_an_object_store_survives_a_crash_during_the_copy(s3_server, monkeypatch):
    opts = s3_server.options
    uri = f"s3://{s3_server.new_bucket()}/catalog"
    db = mv.connect(uri, storage_options=opts, runner=mv.InlineRunner())
    t_uri = db.table_uri("t")
    lance.write_dataset(pa.table({"id": list(range(6)), "x": list(range(6))}), t_uri, storage_options=opts)
    lance.dataset(t_uri, storage_options=opts).create_scalar_index("id", "BTREE")
    with monkeypatch.context() as m:
        _crash_on_call(m, "copy_tree", 1)  # the old table is deleted, the new copy complete, not copied yet
        with pytest.raises(KeyboardInterrupt, match="killed in copy_tree"):
            db.enable_stable_row_ids("t")
    assert "t" not in db
    result = db.enable_stable_row_ids("t")
    ds = lance.dataset(t_uri, storage_options=opts)
    assert result.rewritten and ds.has_stable_row_ids
    assert ds.to_table(columns=["id", "x"]).to_pylist() == [{"id": i, "x": i} for i in range(6)]
    assert [i["name"] for i in ds.list_indices()] == ["id_idx"]
    assert not objects.exists(db.layout.adoption("t"))


# -- writers that give rewritten rows new stable row ids ----------------------------------


def _merge_into(uri: str, rows: pa.Table, how: str) -> None:
    """What lance-spark's MERGE INTO does to matched rows: delete them and insert
    their new versions (new stable row ids), with the unmatched rows; as two
    commits, or as one Update commit (deletion vectors and a new fragment)."""
    ds = lance.dataset(uri)
    keys = ", ".join(str(k) for k in rows.column("id").to_pylist())
    if how == "delete_then_append":
        ds.delete(f"id IN ({keys})")
        lance.write_dataset(rows, uri, mode="append")
        return
    updated, removed = [], []
    for frag in ds.get_fragments():
        meta = frag.delete(f"id IN ({keys})")
        if meta is None:
            removed.append(frag.fragment_id)
        elif meta.deletion_file != frag.metadata.deletion_file:
            updated.append(meta)
    new = lance.fragment.write_fragments(rows, uri, schema=ds.schema)
    op = lance.LanceOperation.Update(removed_fragment_ids=removed, updated_fragments=updated, new_fragments=new)
    lance.LanceDataset.commit(uri, op, read_version=ds.version)


@pytest.mark.parametrize("how", ["delete_then_append", "one_update_commit"])
def test_a_merge_into_that_gives_rows_new_ids_recomputes_them_and_ends_where_merge_insert_does(tmp_path, call_log, how):
    def view_over(name: str):
        db = mv.connect(str(tmp_path / name), runner=mv.InlineRunner())
        t = db.create_table("t", pa.table({"id": list(range(10)), "x": [10 * i for i in range(10)]}), primary_key="id")

        @mv.udf
        def y(id: int, x: int) -> int:
            record_call(call_log, name, id)
            return 2 * x

        view = db.create_materialized_view("v", t.search(None).where("x % 20 = 0").select({"id": "id", "y": y}))
        view.refresh()
        for f in os.listdir(call_log):
            os.remove(os.path.join(call_log, f))
        return t, view

    def calls(name: str) -> list[int]:
        path = [f for f in os.listdir(call_log) if f.startswith(name + ".")]
        return sorted(int(line) for p in path for line in open(os.path.join(call_log, p)))

    # matched: 2 changes and stays in, 4 leaves the filter, 5 enters it, 6 is rewritten unchanged;
    # not matched: 11 (filtered out) and 12 (in)
    rows = pa.table({"id": [2, 4, 5, 6, 11, 12], "x": [40, 50, 60, 60, 110, 120]})
    keep, project = (lambda r: r["x"] % 20 == 0), (lambda r: {"id": r["id"], "y": 2 * r["x"]})

    spark_t, spark_view = view_over("spark")
    ids_before = dict(zip(*lance.dataset(spark_t.uri).to_table(columns=["id"], with_row_id=True).to_pydict().values(),
                          strict=True))
    _merge_into(spark_t.uri, rows, how)
    ids_after = dict(zip(*lance.dataset(spark_t.uri).to_table(columns=["id"], with_row_id=True).to_pydict().values(),
                         strict=True))
    assert all(ids_after[k] != ids_before[k] for k in (2, 4, 5, 6))  # rewritten rows have new stable row ids
    spark_view.refresh()
    src = lance.dataset(spark_t.uri)
    assert actual_view(spark_view) == expected_view(spark_t.uri, src.version, keep, project)
    # the view dropped the old rows and computed the re-inserted ones that pass, the unchanged 6 included
    assert calls("spark") == [2, 5, 6, 12]

    mi_t, mi_view = view_over("merge_insert")
    mi_t.merge_insert(rows)  # rows keep their ids: the view sees updates
    mi_view.refresh()
    assert actual_view(mi_view) == expected_view(mi_t.uri, lance.dataset(mi_t.uri).version, keep, project)
    assert calls("merge_insert") == [2, 5, 6, 12]  # merge_insert rewrites 6 too: its version moves

    def content(view):
        return sorted((r["id"], r["y"]) for r in view.to_arrow().to_pylist())

    assert content(spark_view) == content(mi_view)
