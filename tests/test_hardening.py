"""Engine hardening: defects found by adversarial use (stale checkpoints,
whole-view shuffle, RecordBatch inputs, history cleanup, keys, error words,
resume counts, many small fragments). Inline runner: no JVM; the planning,
task and commit code is the one Spark runs.
"""

import os
import time
from datetime import timedelta

import lance
import pyarrow as pa
import pytest
from oracle import actual_view, changed_rows, count_calls, expected_view, record_call, shuffle_key

import mv_assets as mv


def _inline(tmp_path):
    return mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())


# -- checkpoints keyed by what they depend on -------------------------------


def test_row_checkpoints_are_not_reused_after_a_computed_input_was_backfilled(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(400)])

    @mv.udf
    def plus_one(x: int) -> int:
        return x + 1

    t.add_columns({"c": plus_one})
    t.backfill("c")
    flag = str(tmp_path / "fail")
    open(flag, "w").close()

    @mv.udf
    def g(c: int) -> int:
        if c == 301 and os.path.exists(flag):
            raise RuntimeError("worker lost")
        return c * 10

    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "c": "c", "g": g}))
    with pytest.raises(RuntimeError, match="worker lost"):
        v.refresh(checkpoint_size=100)  # three batches of g(c) checkpointed
    assert os.path.isdir(db._state_dir("checkpoints", "v", "batches"))

    @mv.udf
    def plus_thousand(x: int) -> int:
        return x + 1000

    t.alter_columns({"path": "c", "udf": plus_thousand})
    t.backfill("c")  # c changes; row versions do not
    os.remove(flag)
    v.refresh(checkpoint_size=100)
    rows = v.to_arrow().to_pylist()
    assert sorted((r["id"], r["c"], r["g"]) for r in rows) == [(i, i + 1000, (i + 1000) * 10) for i in range(400)]


def test_column_backfill_checkpoints_are_not_reused_after_its_input_column_changed(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(400)])

    @mv.udf
    def plus_one(x: int) -> int:
        return x + 1

    flag = str(tmp_path / "fail")
    open(flag, "w").close()

    @mv.udf
    def g(c: int) -> int:
        if c == 301 and os.path.exists(flag):
            raise RuntimeError("worker lost")
        return c * 10

    t.add_columns({"c": plus_one})
    t.backfill("c")
    t.add_columns({"d": g})  # d reads the computed column c
    with pytest.raises(RuntimeError, match="worker lost"):
        t.backfill("d", checkpoint_size=100)

    @mv.udf
    def plus_thousand(x: int) -> int:
        return x + 1000

    t.alter_columns({"path": "c", "udf": plus_thousand})
    t.backfill("c")
    os.remove(flag)
    t.backfill("d", checkpoint_size=100)
    rows = t.to_arrow().to_pylist()
    assert sorted((r["id"], r["c"], r["d"]) for r in rows) == [(i, i + 1000, (i + 1000) * 10) for i in range(400)]


# -- shuffle over the whole view ---------------------------------------------


def _shuffled_view(db, n_fragments=5, rows=100, seed=3):
    t = db.create_table("t", [{"id": i, "x": i} for i in range(rows)])
    for k in range(1, n_fragments):
        t.add([{"id": i, "x": i} for i in range(k * rows, (k + 1) * rows)])
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}).shuffle(seed=seed))
    return t, v


def _fragment_of(t, ids):
    tab = lance.dataset(t.uri).to_table(columns=["id"], with_row_address=True)
    frag = dict(zip(tab.column("id").to_pylist(), (a >> 32 for a in tab.column("_rowaddr").to_pylist()), strict=True))
    return {frag[i] for i in ids}


def _assert_globally_shuffled(v, seed):
    tab = v.to_arrow(with_internal=True)
    ids = tab.column("__source_row_id").to_pylist()
    keys = [shuffle_key(i, seed) for i in ids]
    assert keys == sorted(keys), "rows are not in shuffle order over the whole view"


def test_shuffle_orders_the_whole_view_not_each_fragment(tmp_path):
    db = _inline(tmp_path)
    t, v = _shuffled_view(db)
    v.refresh()
    first = v.to_arrow().column("id").to_pylist()[:100]
    assert len(_fragment_of(t, first)) >= 4  # the first 100 rows read come from all over the source
    _assert_globally_shuffled(v, 3)
    t.add([{"id": i, "x": i} for i in range(500, 600)])  # an append lands all over the order
    t.delete("id % 7 = 0")
    t.update("id = 5", {"x": 55})
    v.refresh()
    assert v.count_rows() == 600 - len([i for i in range(600) if i % 7 == 0])
    _assert_globally_shuffled(v, 3)
    assert len(lance.dataset(v.uri).get_fragments()) <= 2  # the view is rewritten in order, not appended to


# -- RecordBatch UDF inputs fixed by the definition ---------------------------


def test_recordbatch_udf_inputs_are_fixed_at_creation(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(10)])

    @mv.udf(data_type=pa.string())
    def columns_seen(batch: pa.RecordBatch) -> pa.Array:
        return pa.array([",".join(batch.schema.names)] * batch.num_rows)

    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "seen": columns_seen}))
    v.refresh()
    t.add_columns({"z": "x + 1"})  # the source gains a column after the view was created
    t.add([{"id": i, "x": i} for i in range(10, 20)])
    v.refresh()
    assert set(v.to_arrow().column("seen").to_pylist()) == {"id,x"}

    t.add_columns({"w": columns_seen})  # a computed column on a table: its inputs are fixed too
    t.backfill("w")
    t.add_columns({"q": "x * 2"})
    t.add([{"id": 99, "x": 99}])
    t.backfill("w")
    assert set(t.to_arrow().column("w").to_pylist()) == {"id,x,z"}


# -- history cleanup -------------------------------------------------------


def _counting_view(db, tmp_path):
    t = db.create_table("t", [{"id": i, "x": i} for i in range(200)])
    log = tmp_path / "calls"
    log.mkdir()

    @mv.udf
    def double(x: int) -> int:
        with open(log / f"{os.getpid()}", "a") as fh:
            fh.write("x\n")
        return 2 * x

    v = db.create_materialized_view("v", t.search(None).where("x % 2 = 0").select({"id": "id", "y": double}))
    return t, v


def test_source_cleanup_keeps_refreshes_incremental(tmp_path):
    db = _inline(tmp_path)
    t, v = _counting_view(db, tmp_path)
    v.refresh()
    for k in range(3):
        t.add([{"id": 200 + 10 * k + j, "x": 200 + 10 * k + j} for j in range(10)])
    t.delete("id < 20")
    t.optimize(cleanup_older_than=timedelta(0))  # the view's source version is gone from the history
    plan = v.plan_refresh()
    assert not plan.full, plan.reason
    assert plan.udf_rows == {"y": 15} and plan.rows_to_delete == 10
    r = v.refresh()
    assert r.udf_rows_computed == {"y": 15}
    keep = lambda r: r["x"] % 2 == 0  # noqa: E731
    assert actual_view(v) == expected_view(t.uri, r.to_version, keep, lambda r: {"id": r["id"], "y": 2 * r["x"]})


def test_view_cleanup_keeps_its_refresh_state(tmp_path):
    db = _inline(tmp_path)
    t, v = _counting_view(db, tmp_path)
    for k in range(4):
        t.add([{"id": 1000 + 10 * k + j, "x": 1000 + 10 * k + j} for j in range(10)])
        v.refresh()
    before = v.refresh_state()
    w = db.create_materialized_view("w", v.search(None).select({"id": "id", "y": "y"}))
    w.refresh()
    v.optimize(cleanup_older_than=timedelta(0))
    after = v.refresh_state()
    assert (after.source_version, after.load_number, after.definition) == (
        before.source_version, before.load_number, before.definition,
    )
    assert v.status().valid
    assert v.plan_refresh().is_noop and not v.plan_refresh().full
    w.refresh()  # a view over the compacted view still refreshes (no SourceBehindError)
    assert w.count_rows() == v.count_rows()


def test_reading_the_refresh_state_stops_at_the_newest_refresh(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(4)])
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
    v.refresh()
    for k in range(30):  # partition runs: each scoped to the fragment an append made
        t.add([{"id": 100 + k, "x": k}])
        v.refresh(fragments=[lance.dataset(t.uri).get_fragments()[-1].fragment_id])
    opened = []
    ds = lance.dataset(v.uri)
    real = ds.read_transaction

    def counting(version):
        opened.append(version)
        return real(version)

    ds.read_transaction = counting
    own = ds.get_transactions  # (the handle's own version's, read with its manifest)
    ds.get_transactions = lambda n: opened.extend(range(ds.version, ds.version - n, -1)) or own(n)
    from mv_assets.storage.state import read_refresh_state

    state = read_refresh_state(ds)
    assert state.load_number == 31 and state.scoped_since_whole
    assert len(opened) <= 1


# -- keys ----------------------------------------------------------------------


def test_adding_an_existing_primary_key_is_refused(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(5)], primary_key="id")
    version = t.version
    with pytest.raises(ValueError, match=r"primary key 'id'.*already.*\[3\].*merge_insert"):
        t.add([{"id": 9, "x": 9}, {"id": 3, "x": 30}])
    assert t.version == version and t.count_rows() == 5


def test_merge_insert_upserts_by_primary_key_and_views_follow(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(5)], primary_key="id")
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
    v.refresh()
    t.merge_insert([{"id": 3, "x": 30}, {"id": 7, "x": 70}])
    assert sorted(r["x"] for r in t.to_arrow().to_pylist()) == [0, 1, 2, 4, 30, 70]
    r = v.refresh()
    assert (r.rows_inserted, r.rows_updated, r.rows_deleted) == (1, 1, 0)
    assert sorted((x["id"], x["x"]) for x in v.to_arrow().to_pylist()) == [(0, 0), (1, 1), (2, 2), (3, 30), (4, 4), (7, 70)]
    with pytest.raises(ValueError, match="duplicate values for primary key 'id'"):
        t.merge_insert([{"id": 1, "x": 1}, {"id": 1, "x": 2}])
    free = db.create_table("free", [{"id": 1}])
    with pytest.raises(ValueError, match="merge_insert needs a primary key"):
        free.merge_insert([{"id": 1}])


def test_merge_insert_builder_as_lancedb_and_geneva_write_it(tmp_path):
    """``merge_insert("id")`` is lancedb's builder (Geneva's Table is a LanceTable): each clause
    alone or together, views following; ``merge_insert(data)`` stays the upsert."""
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(5)], primary_key="id")
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
    v.refresh()

    def rows(tbl):
        return sorted((r["id"], r["x"]) for r in tbl.to_arrow().to_pylist())

    r = t.merge_insert("id").when_not_matched_insert_all().execute([{"id": 1, "x": 10}, {"id": 5, "x": 50}])
    assert (r.num_inserted_rows, r.num_updated_rows, r.num_deleted_rows, r.num_rows) == (1, 0, 0, 2)
    assert r.version == t.version and rows(t) == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 50)]
    res = v.refresh()
    assert (res.rows_inserted, res.rows_updated, res.rows_deleted) == (1, 0, 0) and rows(v) == rows(t)

    r = t.merge_insert(["id"]).when_matched_update_all(where="target.x < source.x").execute(
        pa.table({"id": [2, 3, 9], "x": [20, -3, 90]}))
    assert (r.num_inserted_rows, r.num_updated_rows) == (0, 1)
    assert rows(t) == [(0, 0), (1, 1), (2, 20), (3, 3), (4, 4), (5, 50)]

    r = (t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
         .when_not_matched_by_source_delete("id > 3").execute([{"id": 0, "x": -1}, {"id": 6, "x": 60}]))
    assert (r.num_inserted_rows, r.num_updated_rows, r.num_deleted_rows) == (1, 1, 2)
    assert rows(t) == [(0, -1), (1, 1), (2, 20), (3, 3), (6, 60)]
    res = v.refresh()
    assert (res.rows_inserted, res.rows_updated, res.rows_deleted) == (1, 2, 2) and rows(v) == rows(t)

    before = t.version
    with pytest.raises(ValueError, match="has the primary key 'id'"):
        t.merge_insert("x").when_not_matched_insert_all().execute([{"id": 1, "x": 99}])
    with pytest.raises(ValueError, match="no when_... clause"):
        t.merge_insert("id").execute([{"id": 1, "x": 99}])
    with pytest.raises(ValueError, match=r"merge_insert on \['nope'\]"):
        t.merge_insert("nope").when_not_matched_insert_all().execute([{"id": 1, "x": 99}])
    with pytest.raises(ValueError):
        v.merge_insert("id").when_not_matched_insert_all().execute([{"id": 8, "x": 8}])
    assert t.version == before
    with pytest.warns(mv.GenevaCompatWarning, match="on_bad_vectors"):
        t.merge_insert("id").when_not_matched_insert_all().execute([{"id": 7, "x": 7}], on_bad_vectors="drop")

    free = db.create_table("free", [{"k": 1, "s": "a"}])  # no primary key: any columns to match on
    free.merge_insert("k").when_matched_update_all().when_not_matched_insert_all().execute(
        [{"k": 1, "s": "b"}, {"k": 2, "s": "c"}])
    assert sorted((r["k"], r["s"]) for r in free.to_arrow().to_pylist()) == [(1, "b"), (2, "c")]


@pytest.mark.parametrize("how", ["builder", "upsert"])
def test_a_merge_of_rows_leaving_columns_out_keeps_their_values(tmp_path, how):
    """lancedb's partial update: columns the new rows leave out keep their
    values in matched rows (they were set NULL: data lost without a word);
    inserted rows get NULL there. A computed column of matched rows reads
    stale, as after any update; a view over the table follows, equal to the
    source at its version."""
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "v": i, "s": f"keep{i}"} for i in range(4)], primary_key="id")
    t.add_columns({"w": "v * 10"})
    view = db.create_materialized_view("mv", t.search(None).select({"id": "id", "s": "s", "v": "v"}))
    view.refresh()
    rows = [{"id": 1, "v": 11}, {"id": 9, "v": 99}]
    if how == "builder":
        r = t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(rows)
        assert (r.num_updated_rows, r.num_inserted_rows) == (1, 1)
    else:
        t.merge_insert(rows)
    got = {r["id"]: (r["v"], r["s"], r["w"]) for r in t.to_arrow().to_pylist()}
    assert got == {0: (0, "keep0", 0), 1: (11, "keep1", 110), 2: (2, "keep2", 20), 3: (3, "keep3", 30),
                   9: (99, None, 990)}
    view.refresh()
    at = lance.dataset(t.uri, version=view.status().source_version).to_table(columns=["id", "s", "v"])
    assert sorted(view.to_arrow().to_pylist(), key=lambda r: r["id"]) == sorted(at.to_pylist(), key=lambda r: r["id"])
    # update only: a column that cannot be NULL may be left out; inserting needs it
    strict = db.create_table("strict", pa.table({"id": [1, 2], "s": ["a", "b"], "v": [1, 2]},
                                                schema=pa.schema([pa.field("id", pa.int64()),
                                                                  pa.field("s", pa.string(), nullable=False),
                                                                  pa.field("v", pa.int64())])))
    strict.merge_insert("id").when_matched_update_all().execute([{"id": 2, "v": 20}])
    assert sorted((r["id"], r["s"], r["v"]) for r in strict.to_arrow().to_pylist()) == [(1, "a", 1), (2, "b", 20)]
    before = strict.version
    with pytest.raises(ValueError, match=r"leave out \['s'\], which cannot be NULL"):
        strict.merge_insert("id").when_not_matched_insert_all().execute([{"id": 3, "v": 3}])
    assert strict.version == before


def test_a_merge_refuses_new_rows_sharing_a_key_and_a_bad_where_in_words(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": 1, "v": 1}, {"id": 2, "v": 2}])  # no primary key
    before = t.version
    with pytest.raises(ValueError, match=r"1 keys are held by more than one new row \(e.g. \[\{'id': 1\}\]\)"):
        t.merge_insert("id").when_matched_update_all().execute([{"id": 1, "v": 5}, {"id": 1, "v": 6}])
    with pytest.raises(ValueError, match="merge_insert into 't' failed: .*No field named source.nope") as exc:
        t.merge_insert("id").when_matched_update_all(where="source.nope > 1").execute([{"id": 1, "v": 5}])
    assert ".rs:" not in str(exc.value)
    assert t.version == before and sorted(r["v"] for r in t.to_arrow().to_pylist()) == [1, 2]


# -- our words, not Lance's ---------------------------------------------------


def test_errors_carry_no_rust_source_paths(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(3)])
    with pytest.raises(ValueError, match=r"'t' has no version 99 \(versions that exist: 1\)") as e1:
        t.to_arrow(version=99)
    with pytest.raises(ValueError, match="invalid filter 'nope > 1'.*No field named nope") as e2:
        t.count_rows("nope > 1")
    with pytest.raises(ValueError, match="invalid filter") as e3:
        t.count_rows("x >")
    for e in (e1, e2, e3):
        assert ".rs:" not in str(e.value) and "/home/" not in str(e.value)


def test_a_version_removed_by_history_cleanup_is_said_so_with_the_versions_that_exist(tmp_path):
    """refresh(src_version=N) and to_arrow(version=N) of a version history
    cleanup removed: our words and the versions that exist, not Lance's error
    nor a range that includes removed versions."""
    db = _inline(tmp_path)
    src = db.create_table("src", [{"id": 0, "x": 0}], primary_key="id")
    v = db.create_materialized_view("v", src.search(None).select({"id": "id", "x": "x"}))
    for i in (1, 2, 3):
        src.add([{"id": i, "x": i}])
    ds = lance.dataset(src.uri)
    assert ds.version == 5  # 1 created, 2 stamped with its identity by the view, 3-5 added
    for kept in (1, 2, 3):  # tagged: kept by the cleanup, as is the latest
        ds.tags.create(f"v{kept}", kept)
    ds.cleanup_old_versions(older_than=timedelta(0), error_if_tagged_old_versions=False)
    removed = "version 4 of 'src' was removed by history cleanup; versions that exist: 1-3, 5"
    with pytest.raises(ValueError, match=removed) as e1:
        v.refresh(src_version=4)
    with pytest.raises(ValueError, match=removed) as e2:
        src.to_arrow(version=4)
    with pytest.raises(ValueError, match=r"src_version must be one of 1-3, 5 \(versions of 'src' that exist\), got 7"):
        v.refresh(src_version=7)
    with pytest.raises(ValueError, match=r"'src' has no version 7 \(versions that exist: 1-3, 5\)"):
        src.to_arrow(version=7)
    for e in (e1, e2):
        assert ".rs:" not in str(e.value) and "manifest" not in str(e.value)
    assert v.source_version is None  # nothing was written
    v.refresh(src_version=3)
    assert v.count_rows() == 2 == src.to_arrow(version=3).num_rows


def test_refreshing_to_a_version_before_a_read_column_existed_says_so(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(3)])
    old = t.version
    t.add_columns({"z": "x + 1"})
    v = db.create_materialized_view("v", t.search(None).where("z > 0").select({"id": "id", "z": "z"}))
    with pytest.raises(ValueError, match=rf"version {old} of 't' has no column 'z'.*view 'v' reads") as e:
        v.refresh(src_version=old)
    assert "No field named" not in str(e.value)
    assert v.count_rows() == 0


# -- resume counts -----------------------------------------------------------


def _refreshed_after_dying_at(tmp_path, db, t, at: int, **refresh_args):
    """A view ``y = 2 * x`` of ``t`` whose refresh dies on the row ``x == at``
    (``refresh_args``: its checkpoints and tasks), refreshed again: the result."""
    flag = str(tmp_path / "fail")
    open(flag, "w").close()

    @mv.udf
    def fragile(x: int) -> int:
        if x == at and os.path.exists(flag):
            raise RuntimeError("worker lost")
        return x * 2

    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": fragile}))
    with pytest.raises(RuntimeError, match="worker lost"):
        v.refresh(**refresh_args)
    os.remove(flag)
    return v.refresh(**refresh_args)


def test_udf_rows_resumed_counts_task_and_batch_checkpoints_alike(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(300)])
    # tasks of 100 rows: two finish (task checkpoints), the third dies after two batches of 20
    r = _refreshed_after_dying_at(tmp_path, db, t, 250, checkpoint_size=20, max_rows_per_task=100)
    assert r.udf_rows_computed == {"y": 60}  # computed in this call
    assert r.udf_rows_resumed == {"y": 240}  # 200 from finished tasks + 40 from row checkpoints
    assert r.tasks_resumed == 2


def test_rows_resumed_from_checkpoints_leave_out_rows_given_null_without_a_call(tmp_path):
    """udf_rows_computed counts calls (a row with a NULL input is NULL without
    one); rows read back from row checkpoints counted those rows too, so
    computed + resumed came to more rows than the UDF is ever called on."""
    db = _inline(tmp_path)
    t = db.create_table("t", pa.table({"id": pa.array(range(200), pa.int64()),
                                       "x": pa.array([None if i % 5 == 0 else i for i in range(200)], pa.int64())}))
    # one task: its row batches of 20 checkpointed, then it dies
    r = _refreshed_after_dying_at(tmp_path, db, t, 171, checkpoint_size=20)
    assert r.udf_rows_resumed["y"] > 0
    assert r.udf_rows_computed["y"] + r.udf_rows_resumed["y"] == 160  # (the 40 NULL inputs are not calls)


# -- many small fragments ------------------------------------------------------


def test_small_fragments_are_packed_into_few_tasks_and_view_fragments(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(10)])
    for k in range(1, 200):
        t.add([{"id": 10 * k + j, "x": 10 * k + j} for j in range(10)])
    assert len(lance.dataset(t.uri).get_fragments()) == 200
    v = db.create_materialized_view("v", t.search(None).where("x % 3 = 0").select({"id": "id", "x": "x"}))
    plan = v.plan_refresh(max_rows_per_task=1000)
    assert len(plan.tasks) == 1
    r = v.refresh(max_rows_per_task=1000)
    assert r.rows_inserted == len([i for i in range(2000) if i % 3 == 0])
    assert len(lance.dataset(v.uri).get_fragments()) == 1
    t.add([{"id": 5000 + j, "x": 3 * j} for j in range(5)])
    t.update("id < 30", {"x": 3})
    r = v.refresh(max_rows_per_task=1000)
    assert actual_view(v) == expected_view(t.uri, r.to_version, lambda r: r["x"] % 3 == 0, lambda r: {"id": r["id"], "x": r["x"]})
    plan = v.plan_refresh(max_rows_per_task=600)
    assert plan.is_noop
    by_frag = r.rows_by_fragment
    assert sum(by_frag.values()) == r.rows_inserted + r.rows_updated


def test_sql_failing_on_the_rows_is_a_valueerror_and_leaves_no_view(tmp_path):
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "s": "a"} for i in range(3)])
    with pytest.raises(ValueError, match="SQL of the view over 't' failed.*Cannot cast string 'a'") as e:
        db.create_materialized_view("v", t.search(None).select({"id": "id", "n": "cast(s as int)"}), with_no_data=False)
    assert ".rs:" not in str(e.value)
    assert "v" not in db.table_names()


def test_many_refreshes_keep_the_view_fragments_few(tmp_path):
    from mv_assets.ops.refresh import COMPACT_SMALL_FRAGMENTS

    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": 0, "x": 0}])
    v = db.create_materialized_view("v", t.search(None).where("x % 2 = 0").select({"id": "id", "x": "x"}))
    w = db.create_materialized_view("w", v.search(None).select({"id": "id"}))
    v.refresh()
    for k in range(1, 2 * COMPACT_SMALL_FRAGMENTS + 5):
        t.add([{"id": k, "x": k}, {"id": 1000 + k, "x": 2 * k}])
        v.refresh()
        assert len(lance.dataset(v.uri).get_fragments()) <= COMPACT_SMALL_FRAGMENTS + 1
    r = v.refresh()
    assert r.rows_inserted == 0 and v.refresh_state().source_version == t.version
    assert actual_view(v) == expected_view(t.uri, t.version, lambda r: r["x"] % 2 == 0, lambda r: {"id": r["id"], "x": r["x"]})
    w.refresh()  # compaction is no change to readers of the view
    assert w.count_rows() == v.count_rows()
    assert w.plan_refresh().is_noop


def _record_scans(monkeypatch) -> list:
    """Every Lance scan (``to_table`` or ``scanner``) from now on, as (method, dataset uri)."""
    import lance

    scans = []
    for method in ("to_table", "scanner"):
        real = getattr(lance.LanceDataset, method)

        def spy(self, *a, _real=real, _method=method, **k):
            scans.append((_method, self.uri))
            return _real(self, *a, **k)

        monkeypatch.setattr(lance.LanceDataset, method, spy)
    return scans


def test_a_no_op_refresh_reads_nothing_of_the_view_or_source_rows(tmp_path, monkeypatch):
    """A refresh of a view already at its source's version is O(1): it reads
    neither the view's keys nor the source's rows (only versions and state)."""

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(1000)])
    view = db.create_materialized_view("v", t.search(None).where("x > 3").select({"id": "id", "x": "x"}))
    view.refresh()
    scans = _record_scans(monkeypatch)
    r = db.open_table("v").refresh()
    assert r.rows_inserted == r.rows_deleted == 0 and r.runner == "none"
    assert scans == []
    t.add([{"id": 5000, "x": 5000}])  # a real change is still found: planned from fragment metadata, counted by its task
    r = db.open_table("v").refresh()
    assert r.rows_inserted == 1 and 5000 in db.open_table("v").to_arrow().column("id").to_pylist()
    t.add([{"id": 6000, "x": 1}])  # appended rows the filter drops: nothing inserted, counted exactly
    r = db.open_table("v").refresh()
    assert r.rows_inserted == 0 and 6000 not in db.open_table("v").to_arrow().column("id").to_pylist()


def test_a_refresh_after_only_compactions_reads_no_rows(tmp_path, monkeypatch):
    """Source commits that change no row (compactions, an index) are recorded
    without reading the view's keys or the source's rows: O(commits), not O(rows)."""
    import lance

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(1000)])
    for start in range(1000, 1200, 50):
        t.add([{"id": i, "x": i} for i in range(start, start + 50)])
    view = db.create_materialized_view("v", t.search(None).where("x > 3").select({"id": "id", "x": "x"}))
    view.refresh()
    t.optimize()
    lance.dataset(t.uri).create_scalar_index("id", "BTREE")  # an index: no row changes either
    t.optimize()
    scans = _record_scans(monkeypatch)
    r = view.refresh()
    assert scans == []
    assert (r.rows_inserted, r.rows_updated, r.rows_deleted, r.udf_rows_computed) == (0, 0, 0, {})
    assert view.refresh_state().source_version == t.version  # the new version is recorded
    monkeypatch.undo()
    assert actual_view(view) == expected_view(t.uri, t.version, lambda r: r["x"] > 3, lambda r: {"id": r["id"], "x": r["x"]})
    t.add([{"id": 5000, "x": 5000}])  # a real change is still found
    assert view.refresh().rows_inserted == 1


def test_a_refresh_after_deletes_and_updates_scans_only_the_fragments_written_since(tmp_path, monkeypatch):
    """Deletes write no row version, and updates and merge_inserts (ours or
    another tool's) move the rows they write into new fragments: the refresh
    reads the change feed's rows from the fragments written since its last
    version only (none after deletes alone), never the whole source."""
    import lance

    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(2000)], primary_key="id")
    view = db.create_materialized_view("v", t.search(None).where("x % 3 != 0").select({"id": "id", "y": "x * 2"}))
    view.refresh()
    old = {f.fragment_id for f in lance.dataset(t.uri).get_fragments()}
    seen: list = []
    real = lance.LanceDataset.scanner

    def scanner(self, *args, **kwargs):
        if self.uri == t.uri:
            seen.append(kwargs.get("fragments"))
        return real(self, *args, **kwargs)

    lance.dataset(t.uri).delete("id % 10 = 1")  # another tool's delete
    t.delete("id % 10 = 2")
    monkeypatch.setattr(lance.LanceDataset, "scanner", scanner)
    r = view.refresh()
    assert seen == [] and r.rows_deleted == 267  # ids % 10 in (1, 2) passing x % 3 != 0
    monkeypatch.undo()
    lance.dataset(t.uri).update({"x": "x + 1"}, where="id % 10 = 4")
    t.merge_insert([{"id": 5, "x": 7}])
    monkeypatch.setattr(lance.LanceDataset, "scanner", scanner)
    view.refresh()
    assert seen and all(fr is not None and not {f.fragment_id for f in fr} & old for fr in seen)
    monkeypatch.undo()
    expect = sorted((r["id"], 2 * r["x"]) for r in lance.dataset(t.uri).to_table().to_pylist() if r["x"] % 3 != 0)
    assert sorted((r["id"], r["y"]) for r in view.to_arrow().to_pylist()) == expect


def test_a_released_lease_is_not_written_back_by_a_renewal_in_flight(tmp_path, monkeypatch):
    """Releasing a lease waits for its heartbeat: a renewal that was writing
    while the holder released wrote the record back after its removal, and the
    next refresher waited for a lease nobody held (seen under load on S3)."""
    import threading
    import time

    from mv_assets.storage import objects
    from mv_assets.storage.layout import Lease

    uri = str(tmp_path / "x.lease")
    real = objects.put_tagged
    renewing = threading.Event()

    def slow_renewal(path, data, **kw):
        if threading.current_thread().name.startswith("lease-"):
            renewing.set()
            time.sleep(0.3)  # the renewal is in flight when the holder releases
        return real(path, data, **kw)

    monkeypatch.setattr(objects, "put_tagged", slow_renewal)
    lease = Lease(uri, "x", timeout=1, ttl=0.15)
    with lease.held():
        assert renewing.wait(2)
    assert objects.read_text(uri) is None  # released, and stays so
    time.sleep(0.4)
    assert objects.read_text(uri) is None
    Lease(uri, "x", timeout=0.2, ttl=5).acquire()  # free for the next one


@pytest.mark.parametrize("kind", ["query", "aggregate"])
def test_a_filter_ending_in_a_line_comment_keeps_incremental_refreshes_working(tmp_path, kind):
    """A view filter ending in a SQL line comment (``x > 5 -- big only``):
    incremental refreshes paste it into ``(...) AND (...)``, where the
    comment swallowed the closing parenthesis and every refresh after a
    change failed to parse."""
    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    t = db.create_table("src", pa.table({"id": list(range(20)), "k": ["ab"[i % 2] for i in range(20)],
                                         "x": [float(i) for i in range(20)]}), primary_key="id")
    q = t.search(None).where("x > 5 -- big only")
    q = q.group_by("k").agg({"n": "count(*)"}) if kind == "aggregate" else q.select(["id", "x"])
    v = db.create_materialized_view("v", q)
    db.refresh("v")
    t.update(where="id = 7", values_sql={"x": "1"})
    t.delete("id = 19")
    db.refresh("v")
    if kind == "aggregate":
        assert sorted(v.to_arrow().to_pylist(), key=lambda r: r["k"]) == [{"k": "a", "n": 7}, {"k": "b", "n": 5}]
    else:
        assert sorted(v.to_arrow().column("id").to_pylist()) == [i for i in range(6, 19) if i != 7]


def _gated() -> None:
    """In a UDF: once, say it started (``started`` in ``$MV_TEST_GATE``), then
    wait for the test's ``go`` (no gate set: nothing): the test acts while the
    job is surely computing, whatever the machine's load."""
    import os as _os
    import time as _time

    gate = _os.environ.get("MV_TEST_GATE")
    if not gate:
        return
    open(_os.path.join(gate, "started"), "a").close()
    deadline = _time.monotonic() + 120
    while not _os.path.exists(_os.path.join(gate, "go")) and _time.monotonic() < deadline:
        _time.sleep(0.01)


def _hold(gate) -> None:
    """Wait until a gated UDF started (the job is computing)."""
    deadline = time.monotonic() + 120
    while not (gate / "started").exists():
        assert time.monotonic() < deadline, "the job never started computing"
        time.sleep(0.01)


@mv.udf
def _gated_copy(x: int) -> int:
    _gated()
    return x


def test_a_refresh_never_commits_into_a_view_made_again_under_its_name(tmp_path, monkeypatch):
    """A view dropped and created again (another definition, up to the same
    Lance version) while a refresh of the old one computes: that refresh's
    commit is refused (it landed in the new view, which then held the old
    view's rows and columns, read as LOADED and valid)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("MV_TEST_GATE", str(gate))
    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(60)])
    old = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": _gated_copy}), with_no_data=True)
    job = old.refresh_async()
    _hold(gate)  # (computing, held until go)
    db.drop_table("v")
    db.create_materialized_view("v", t.search(None).where("x < 5").select({"id": "id", "x": "x"}), with_no_data=True)
    (gate / "go").touch()
    with pytest.raises(mv.ConcurrentRefreshError, match="dropped and made again"):
        job.result(timeout=120)
    new = db.open_table("v")
    assert new.to_arrow().column_names == ["id", "x"] and new.count_rows() == 0
    assert new.status().load_state == "NEVER_LOADED"  # (not the dead refresh's FAILED_LOAD)
    new.refresh()
    assert sorted(r["id"] for r in new.to_arrow().to_pylist()) == list(range(5))


@mv.udf
def _gated_five(x: int) -> int:
    _gated()
    return x * 5


def test_a_backfill_never_commits_into_a_table_made_again_under_its_name(tmp_path, monkeypatch):
    """A table dropped and created again (other rows, the same computed
    column: up to the same Lance version) while a backfill of the old one
    computes: that backfill commits nothing (its commit landed on the new
    table, pointing at the old table's removed files: the new table could no
    longer be read, by mv_assets or by plain pylance)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("MV_TEST_GATE", str(gate))
    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(60)], primary_key="id")
    t.add_columns({"z": _gated_five})
    job = t.backfill_async("z")
    _hold(gate)  # (computing, held until go)
    db.drop_table("t")
    t = db.create_table("t", [{"id": i, "x": 1000 + i} for i in range(60)], primary_key="id")
    t.add_columns({"z": _gated_five})
    (gate / "go").touch()
    with pytest.raises(mv.ConcurrentWriteError, match="dropped and made again"):
        job.result(timeout=120)
    rows = lance.dataset(t.uri).to_table().to_pylist()
    assert len(rows) == 60 and all(r["z"] is None for r in rows)
    t.backfill("z")
    assert sorted(r["z"] for r in t.to_arrow().to_pylist()) == [5 * (1000 + i) for i in range(60)]


def test_a_view_made_under_a_dropped_views_name_starts_never_loaded(tmp_path):
    """A refresh of a view dropped meanwhile fails after the drop removed its
    status record, and records FAILED_LOAD under the name: a view created
    there later started FAILED_LOAD with the dead refresh's error."""
    from mv_assets.storage.status import FAILED_LOAD, record_load_state

    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": 1, "x": 1}])
    db.create_materialized_view("v", t.search(None).select({"id": "id"}), with_no_data=True)
    db.drop_table("v")
    record_load_state(db.layout, "v", FAILED_LOAD, "ConcurrentRefreshError: view 'v' moved")  # (the dead refresh's)
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}), with_no_data=True)
    assert v.status().load_state == "NEVER_LOADED" and v.status().last_error is None


def test_a_lease_renewal_that_fails_once_is_tried_again(tmp_path, monkeypatch):
    """The store unreachable at one renewal: the heartbeat thread died of the
    error and the lease expired under its holder (another refresh could take
    it over while this one still ran)."""
    import json
    import threading

    from mv_assets.storage import objects
    from mv_assets.storage.layout import Lease

    uri = str(tmp_path / "x.lease")
    real = objects.put_tagged
    failed = threading.Event()

    def flaky(path, data, **kw):
        if threading.current_thread().name.startswith("lease-") and not failed.is_set():
            failed.set()
            raise OSError("connection reset by peer")
        return real(path, data, **kw)

    monkeypatch.setattr(objects, "put_tagged", flaky)
    lease = Lease(uri, "x", timeout=1, ttl=0.3)
    with lease.held():
        assert failed.wait(5)
        first = json.loads(objects.read_text(uri))["expires"]
        deadline = time.monotonic() + 5
        while json.loads(objects.read_text(uri))["expires"] == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads(objects.read_text(uri))["expires"] > first  # renewed after the failure


def test_update_takes_the_values_lancedb_takes(tmp_path):
    """NumPy scalars and arrays, lists (a vector), structs: update(values=)
    refused them ('cannot use list value ... as a SQL literal'), and a NumPy
    float became the SQL text np.float64(2.5). NULL into a column that cannot
    hold it is refused in words before anything is written."""
    import numpy as np

    db = _inline(tmp_path)
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("vector", pa.list_(pa.float32(), 2)),
                        pa.field("tags", pa.list_(pa.string())), pa.field("f", pa.float64()),
                        pa.field("st", pa.struct([("a", pa.int64()), ("b", pa.string())])),
                        pa.field("n", pa.int32()), pa.field("req", pa.string(), nullable=False)])
    t = db.create_table("t", pa.table({"id": [1, 2], "vector": [[1.0, 2.0], [0.0, 0.0]], "tags": [["x"], []],
                                       "f": [1.0, 0.0], "st": [{"a": 1, "b": "p"}, None], "n": [1, 0],
                                       "req": ["r", "s"]}, schema=schema))
    t.update(where="id = 1", values={"vector": np.array([3.0, 4.0], np.float32), "tags": ["a", "it's"],
                                     "f": np.float64(2.5), "st": {"a": 5, "b": "q"}, "n": np.int32(7)})
    t.update(where="id = 2", values={"vector": [5.0, 6.0]})
    got = {r["id"]: r for r in t.to_arrow().to_pylist()}
    assert got[1] == {"id": 1, "vector": [3.0, 4.0], "tags": ["a", "it's"], "f": 2.5, "st": {"a": 5, "b": "q"},
                      "n": 7, "req": "r"}
    assert got[2]["vector"] == [5.0, 6.0] and got[2]["f"] == 0.0
    before = t.version
    with pytest.raises(ValueError, match="column 'req' is not nullable: it cannot be set to NULL"):
        t.update(where="id = 1", values={"req": None})
    with pytest.raises(ValueError, match="does not fit column 'vector'"):
        t.update(where="id = 1", values={"vector": [1.0, 2.0, 3.0]})
    assert t.version == before


def test_table_api_inputs_as_lancedb_takes_them(tmp_path):
    """create_table([]) made a table with no columns that no row fits (lancedb
    refuses it); a LanceModel as the schema failed ('ModelMetaclass' object is
    not iterable); add() of one dict failed with 'int' object is not
    iterable; search().offset() did not exist and limit(None) was refused."""
    from lancedb.pydantic import LanceModel

    class Item(LanceModel):
        id: int
        name: str

    db = _inline(tmp_path)
    with pytest.raises(ValueError, match="create_table\\(\\) of an empty list needs a schema"):
        db.create_table("empty", [])
    assert "empty" not in db.table_names()
    t = db.create_table("items", schema=Item)
    assert t.schema.names == ["id", "name"]
    t.add([{"id": i, "name": f"n{i}"} for i in range(10)])
    with pytest.raises(ValueError, match="a single row .* pass a list of dicts"):
        t.add({"id": 99, "name": "x"})
    assert t.count_rows() == 10
    q = t.search().select(["id"])
    assert [r["id"] for r in q.offset(7).to_list()] == [7, 8, 9]
    assert [r["id"] for r in q.offset(2).limit(3).to_list()] == [2, 3, 4]
    assert len(q.limit(3).limit(None).to_list()) == 10
    with pytest.raises(ValueError, match=r"offset\(2\) applies to reads"):
        db.create_materialized_view("v", q.offset(2))
    assert "v" not in db.table_names()
    # a vector column given as lists of floats is a vector column, as lancedb makes it: searchable
    vec = db.create_table("vec", [{"id": i, "vector": [float(i), 0.0], "ragged_embedding": [1.0] * (i + 1)}
                                  for i in range(5)])
    assert vec.schema.field("vector").type == pa.list_(pa.float32(), 2)
    assert vec.schema.field("ragged_embedding").type == pa.list_(pa.float64())  # lengths differ: a list
    assert [r["id"] for r in vec.search([0.0, 0.0]).limit(2).to_list()] == [0, 1]
    with pytest.raises(ValueError, match=r"No field named nope.*\('items' has the columns id, name\)"):
        t.search().select(["id", "nope"]).to_list()
    # a view's query too, without DataFusion's list of the fields it planned ("Valid fields are id." of two)
    with pytest.raises(ValueError, match=r"No field named nope\. \('items' has the columns id, name\)$"):
        db.create_materialized_view("bad", t.search(None).select(["nope"]))
    assert t.search().select({"n": "NAME", "t": "true"}).limit(1).to_list() == [{"n": "n0", "t": True}]
    # lancedb's keyword for the builder's columns
    vec.merge_insert(on="id").when_matched_update_all().execute([{"id": 1, "vector": [9.0, 9.0]}])
    assert [r["vector"] for r in vec.search().where("id = 1").to_list()] == [[9.0, 9.0]]


@mv.udf
def _restored_calls(x: int) -> int:
    record_call(os.environ["MV_TEST_CALLS"], "restored", x)
    return 3 * x


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_refresh_after_a_restore_computes_only_what_differs(tmp_path, monkeypatch, seed):
    """A restore brings back rows with the ids and row versions they had: the
    refresh after it compared them with the view and computed only rows the
    view did not hold at their version (it rebuilt the view, every UDF row
    again: a restore undoing a bad append recomputed the whole table). Random
    histories of appends, updates, deletes, compactions and restores (ours and
    plain pylance's), the view equal to pyarrow over the source at its version
    after every refresh, UDF calls those of the rows whose values differ."""
    import random

    calls = tmp_path / "calls"
    calls.mkdir()
    monkeypatch.setenv("MV_TEST_CALLS", str(calls))
    rng = random.Random(seed)
    db = _inline(tmp_path)
    t = db.create_table("t", [{"id": i, "x": i} for i in range(40)], primary_key="id")
    view = db.create_materialized_view("v", t.search(None).where("x % 5 != 1").select({"id": "id", "y": _restored_calls}))

    def keep(r):
        return r["x"] % 5 != 1

    view.refresh()
    next_id, restores = 40, 0
    for _ in range(14):
        step = rng.choice(["add", "update", "delete", "compact", "restore", "restore", "lance_restore", "refresh"])
        if step == "add":
            t.add([{"id": next_id + i, "x": rng.randrange(100)} for i in range(rng.randrange(1, 6))])
            next_id += 6
        elif step == "update":
            t.update(where=f"id % 7 = {rng.randrange(7)}", values_sql={"x": "x + 1"})
        elif step == "delete":
            t.delete(f"id % 9 = {rng.randrange(9)}")
        elif step == "compact":
            t.compact_files()
        elif step in ("restore", "lance_restore") and t.version > 2:
            back = rng.randrange(1, t.version)
            if step == "restore":
                t.restore(back)
            else:
                lance.dataset(t.uri, version=back).restore()
            restores += 1
        v0 = view.status().source_version
        before = count_calls(str(calls), "restored")
        view.refresh()
        v1 = view.status().source_version
        want = expected_view(t.uri, v1, keep, lambda r: {"id": r["id"], "y": 3 * r["x"]})
        assert actual_view(view) == want, (seed, step)
        assert count_calls(str(calls), "restored") - before == len(changed_rows(t.uri, v0, v1, keep)), (seed, step)
    assert restores
