"""A table's primary key is looked up through the BTREE index the table keeps
(mv_assets.storage.keys): add() refuses a key the table holds wherever its
row lies (in the index, in fragments appended after it by this process or by
another tool, after deletes, compaction, updates), merge_insert of new keys is
an append, the index's commits change nothing a view or sensor sees, and a
look-up reads the index rather than every key (Lance's own scan metrics)."""

import re
import threading
import warnings

import lance
import numpy as np
import pyarrow as pa
import pytest

from mv_assets.model.names import PRIMARY_KEY_METADATA_KEY
from mv_assets.storage import keys
from mv_assets.storage.changes import commit_matters, pending_versions


@pytest.fixture
def small(monkeypatch):
    """Thresholds small enough for tests: an index from 100 rows on, updated
    once 3 fragments or 50 rows are outside it."""
    monkeypatch.setattr(keys, "KEY_INDEX_MIN_ROWS", 100)
    monkeypatch.setattr(keys, "MAX_UNINDEXED_FRAGMENTS", 3)
    monkeypatch.setattr(keys, "MAX_UNINDEXED_ROWS", 50)
    keys._WRITTEN.clear()
    keys._FAILED.clear()
    yield
    keys._WRITTEN.clear()


def _rows(a: int, b: int, x: float = 0.0) -> pa.Table:
    return pa.table({"id": np.arange(a, b, dtype=np.int64), "x": np.full(b - a, x)})


def _refused(t, key: int) -> bool:
    try:
        t.add(_rows(key, key + 1))
    except ValueError as exc:
        assert "already exist" in str(exc) and str(key) in str(exc)
        return True
    return False


class ScanSpy:
    """Every scanner made on the table at ``uri``: its filter and whether it read only indexed data."""

    def __init__(self, monkeypatch, uri: str) -> None:
        self.calls: list[dict] = []
        real = lance.LanceDataset.scanner
        name = uri.rstrip("/").rsplit("/", 1)[-1]

        def scanner(ds, *a, **k):
            if ds.uri.rstrip("/").endswith(name):
                self.calls.append({"filter": k.get("filter"), "fast_search": k.get("fast_search", False),
                                   "version": ds.version})
            return real(ds, *a, **k)

        monkeypatch.setattr(lance.LanceDataset, "scanner", scanner)


def _rows_scanned(uri: str, version: int, flt: str, fast_search: bool) -> int:
    """Rows Lance's scan read to answer ``flt`` (its analyze_plan metrics)."""
    plan = lance.dataset(uri, version=version).scanner(columns=["id"], filter=flt, fast_search=fast_search).analyze_plan()
    return sum(int(n) for n in re.findall(r"rows_scanned=(\d+)", plan))


def test_a_big_table_gets_its_key_index_at_the_first_add_and_views_see_no_change(db, small):
    t = db.create_table("t", _rows(0, 200), primary_key="id")
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
    v.refresh()
    assert keys.index_name(lance.dataset(t.uri)) is None  # nothing built by creating the table
    before = t.version
    t.add(_rows(200, 205))
    ds = lance.dataset(t.uri)
    assert keys.index_name(ds) == keys.KEY_INDEX_NAME
    kinds = [type(ds.read_transaction(n).operation).__name__ for n in range(before + 1, ds.version + 1)]
    assert "Append" in kinds and len(kinds) == 2  # the index's own commit, then the rows
    # the index's commit is nothing to a view, its status or a sensor
    index_commits = [n for n in range(before + 1, ds.version + 1) if not commit_matters(ds.read_transaction(n))]
    assert len(index_commits) == 1
    assert pending_versions(t.uri, before) == [n for n in range(before + 1, ds.version + 1) if n not in index_commits]
    plan = v.plan_refresh()
    assert (plan.rows_to_insert, plan.rows_to_update, plan.rows_to_delete) == (5, 0, 0)
    r = v.refresh()
    assert r.rows_inserted == 5 and not r.full
    # a later commit of the index alone (an update of it): the view is current, nothing is read
    for k in range(4):
        t.add(_rows(300 + 10 * k, 305 + 10 * k))
    v.refresh()
    t.optimize()  # index segments merged: commits that change no row
    assert v.plan_refresh().rows_to_insert == 0
    assert v.refresh().udf_rows_computed == {} and sorted(v.to_arrow().column("id").to_pylist()) == sorted(
        lance.dataset(t.uri).to_table(columns=["id"]).column("id").to_pylist())
    assert "BTREE index 'primary_key'" in str(t.primary_key_index)


def test_add_refuses_keys_in_indexed_and_unindexed_fragments_after_deletes_and_compaction(db, small):
    t = db.create_table("t", _rows(0, 200), primary_key="id")
    t.add(_rows(200, 202))  # builds the index over the first 200 rows
    t.add(_rows(202, 204))  # outside it: answered from the keys this process wrote
    lance.write_dataset(_rows(204, 206), t.uri, mode="append")  # outside it, written by another tool
    info = t.primary_key_index
    assert info is not None and info.unindexed_fragments >= 2
    for key in (0, 150, 201, 203, 204, 205):
        assert _refused(t, key), key
    t.delete("id IN (150, 203, 205)")  # a row of the index, of a fragment this process wrote, of pylance's
    for key in (150, 203, 205):
        assert not _refused(t, key), key  # gone: added again
    for key in (0, 201, 204):
        assert _refused(t, key), key
    t.update("id = 7", values={"x": 1.0})  # the row moves to a fragment outside the index
    assert _refused(t, 7)
    t.optimize()  # compaction, every segment merged, every fragment covered
    assert t.primary_key_index.unindexed_fragments == 0 and t.primary_key_index.segments == 1
    for key in (0, 7, 150, 201, 203, 204, 205):
        assert _refused(t, key), key
    assert sorted(lance.dataset(t.uri).to_table().column("id").to_pylist()) == list(range(206))


def test_key_look_ups_read_the_index_not_every_key(db, small, monkeypatch):
    t = db.create_table("t", _rows(0, 1000), primary_key="id")
    t.add(_rows(1000, 1001))  # the index
    t.add(_rows(1001, 1002))  # one fragment outside it, written here
    spy = ScanSpy(monkeypatch, t.uri)
    t.add(_rows(2000, 2010))
    looked = [c for c in spy.calls if c["filter"] and "IN" in c["filter"]]
    assert looked and all(c["fast_search"] for c in looked)  # the index alone, the rest from the keys written here
    c = looked[0]
    assert _rows_scanned(t.uri, c["version"], c["filter"], True) == 0  # not one row of the table scanned
    plan = lance.dataset(t.uri, version=c["version"]).scanner(columns=["id"], filter=c["filter"]).explain_plan()
    assert "ScalarIndexQuery" in plan and keys.KEY_INDEX_NAME in plan
    # a fragment written by another tool: Lance scans it (and only it), the index answers for the rest
    lance.write_dataset(_rows(3000, 3005), t.uri, mode="append")
    spy.calls.clear()
    assert _refused(t, 3002) and _refused(t, 10)
    looked = [c for c in spy.calls if c["filter"] and "IN" in c["filter"]]
    assert looked and not any(c["fast_search"] for c in looked)
    outside = t.primary_key_index.unindexed_rows  # (+ 1: the row the index found, read for its key)
    assert 0 < _rows_scanned(t.uri, looked[-1]["version"], looked[-1]["filter"], False) <= outside + 1 < 1000


def test_small_tables_have_no_index_and_say_so(db, small):
    t = db.create_table("t", _rows(0, 20), primary_key="id")
    t.add(_rows(20, 30))
    info = t.primary_key_index
    assert info is not None and info.name is None and "no index" in str(info) and "30 rows" in str(info)
    assert _refused(t, 25)
    assert db.create_table("plain", _rows(0, 300)).primary_key_index is None
    assert keys.index_name(lance.dataset(t.uri)) is None and not lance.dataset(t.uri).describe_indices()


def test_an_adopted_pylance_table_gets_the_index_and_refuses_its_keys(db, small, tmp_path):
    uri = db.table_uri("events")
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())], metadata={PRIMARY_KEY_METADATA_KEY: "id"})
    lance.write_dataset(_rows(0, 300).cast(schema), uri, enable_stable_row_ids=True)
    for k in range(3):  # appended by pylance: many fragments, none indexed
        lance.write_dataset(_rows(300 + k, 301 + k).cast(schema), uri, mode="append")
    t = db.open_table("events")
    assert t.primary_key == "id"
    t.add(_rows(400, 401))
    assert keys.index_name(lance.dataset(uri)) == keys.KEY_INDEX_NAME
    for key in (0, 299, 301, 400):
        assert _refused(t, key), key
    # its own BTREE on the key, made by another tool, is used instead of a second one
    uri2 = db.table_uri("other")
    lance.write_dataset(_rows(0, 300).cast(schema), uri2, enable_stable_row_ids=True)
    lance.dataset(uri2).create_scalar_index("id", index_type="BTREE", name="theirs")
    o = db.open_table("other")
    o.add(_rows(300, 301))
    assert [i.name for i in lance.dataset(uri2).describe_indices()] == ["theirs"]
    assert _refused(o, 5)


def test_merge_insert_of_new_keys_is_an_append_and_of_existing_keys_an_update(db, small):
    t = db.create_table("t", _rows(0, 200), primary_key="id")
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "x": "x"}))
    v.refresh()
    version = t.merge_insert(_rows(200, 210, 1.0))
    ds = lance.dataset(t.uri)
    assert version == ds.version and type(ds.read_transaction(ds.version).operation).__name__ == "Append"
    before = lance.dataset(t.uri).to_table(columns=["id"], with_row_id=True).to_pydict()
    row_id_of_5 = before["_rowid"][before["id"].index(5)]
    r = t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
        pa.table({"id": [5, 999], "x": [2.0, 2.0]}))
    assert (r.num_updated_rows, r.num_inserted_rows) == (1, 1)
    after = lance.dataset(t.uri).to_table(columns=["id", "x"], with_row_id=True).to_pydict()
    row = after["id"].index(5)
    assert after["x"][row] == 2.0 and after["_rowid"][row] == row_id_of_5  # updated in place: a view sees an update
    r = v.refresh()
    assert (r.rows_inserted, r.rows_updated) == (11, 1)
    assert sorted(v.to_arrow().column("id").to_pylist()) == sorted(after["id"])
    # find-or-create of keys that exist: nothing inserted
    r = t.merge_insert("id").when_not_matched_insert_all().execute(pa.table({"id": [1, 2], "x": [9.0, 9.0]}))
    assert (r.num_inserted_rows, r.num_updated_rows) == (0, 0)


def test_index_upkeep_merges_new_rows_into_a_small_newest_segment(db, small):
    t = db.create_table("t", _rows(0, 1000), primary_key="id")
    t.add(_rows(1000, 1001))
    start = 2000
    for _ in range(12):
        t.add(_rows(start, start + 5))
        start += 5
    info = t.primary_key_index
    # never more than the bound outside it, and the first segment left alone (one small one after it)
    assert info.unindexed_fragments <= keys.MAX_UNINDEXED_FRAGMENTS
    assert info.segments == 2
    per_segment = lance.dataset(t.uri).stats.index_stats(keys.KEY_INDEX_NAME)["num_indexed_rows_per_delta"]
    assert per_segment[0] == 1000


def test_a_concurrent_writer_is_not_broken_by_index_upkeep(db, small):
    t = db.create_table("t", _rows(0, 300), primary_key="id")
    errors: list[BaseException] = []
    stop = threading.Event()

    def other() -> None:  # another tool appending and deleting its own keys
        k = 100_000
        try:
            while not stop.is_set():
                lance.write_dataset(_rows(k, k + 2), t.uri, mode="append")
                lance.dataset(t.uri).delete(f"id = {k}")
                k += 2
        except BaseException as exc:  # pragma: no cover (the failure is reported)
            errors.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (an index update losing a race is said so, and retried later)
            for k in range(300, 340):
                t.add(_rows(k, k + 1))
    finally:
        stop.set()
        thread.join()
    assert not errors
    ids = lance.dataset(t.uri).to_table(columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids))
    assert set(range(340)) <= set(ids)
    for key in (0, 310, 339):
        assert _refused(t, key)


def test_keys_written_here_are_not_trusted_once_another_writer_changed_their_fragment(db, small):
    t = db.create_table("t", _rows(0, 200), primary_key="id")
    t.add(_rows(200, 201))
    t.add(_rows(201, 203))  # kept in memory while outside the index
    lance.dataset(t.uri).delete("id = 201")  # by another tool: the fragment changed
    assert not _refused(t, 201)
    assert _refused(t, 202)
    # an overwrite by another tool: nothing of the old keys stands
    lance.write_dataset(_rows(500, 700).replace_schema_metadata({PRIMARY_KEY_METADATA_KEY: "id"}), t.uri,
                        mode="overwrite")
    assert not _refused(t, 202)
    assert _refused(t, 600)


def test_keys_kept_for_a_table_dropped_and_made_again_are_not_its_keys(db, small):
    """The keys this process appended were kept by table path: a table dropped
    and made again under the same name (through the catalog, or removed and
    written by another tool) inherited them. A key the new table held was
    accepted a second time (another writer's fragment got the id of one of the
    old table's), a key it never held was refused."""
    import shutil

    t = db.create_table("t", _rows(0, 200), primary_key="id")
    for k in (1_000_001, 1_000_002, 1_000_003):
        t.add(_rows(k, k + 1))  # (fragments outside the index, their keys kept)
    db.drop_table("t")
    t = db.create_table("t", _rows(0, 200), primary_key="id")
    t.add(_rows(2_000_001, 2_000_002))
    lance.write_dataset(_rows(2_000_002, 2_000_003), t.uri, mode="append")  # another writer
    assert _refused(t, 2_000_002)
    assert not _refused(t, 1_000_002)
    ids = lance.dataset(t.uri).to_table(columns=["id"]).column("id").to_numpy()
    assert len(ids) == len(set(ids.tolist()))

    # the same, the table removed and written again by another tool (no catalog call)
    for k in (3_000_001, 3_000_002):
        t.add(_rows(k, k + 1))
    shutil.rmtree(t.uri)
    table = _rows(0, 200).replace_schema_metadata({PRIMARY_KEY_METADATA_KEY: "id"})  # (as pylance makes it)
    lance.write_dataset(table, t.uri)
    t = db.open_table("t")
    t.add(_rows(4_000_001, 4_000_002))
    lance.write_dataset(_rows(4_000_002, 4_000_003).replace_schema_metadata(table.schema.metadata), t.uri, mode="append")
    assert _refused(t, 4_000_002)
    assert not _refused(t, 3_000_002)


def test_a_key_of_a_timestamp_or_decimal_type_is_found(db):
    """Keys were written into the look-up as SQL literals: TIMESTAMP '...' is
    microseconds without a zone to Lance, so a nanosecond or zoned timestamp key
    matched nothing (add() accepted it again, merge_insert() appended a
    duplicate), and a decimal key was a float Lance refused to compare."""
    import datetime as dt
    import decimal

    cases = {
        "ns": pa.array([1_600_000_000_000_000_001, 7], pa.timestamp("ns")),
        "zoned": pa.array([dt.datetime(2020, 1, 1, 12, tzinfo=dt.timezone.utc), dt.datetime(2021, 1, 1)],
                          pa.timestamp("ms", tz="America/New_York")),
        "dec": pa.array([decimal.Decimal("1.50"), decimal.Decimal("2.00")], pa.decimal128(10, 2)),
        "dec256": pa.array([decimal.Decimal("1.50"), decimal.Decimal("2.00")], pa.decimal256(40, 2)),  # (> 38 digits)
        "time": pa.array([dt.time(1, 2, 3, 4), dt.time(5)], pa.time64("us")),  # (no SQL literal: every add failed)
        "time32": pa.array([dt.time(1, 2, 3), dt.time(5)], pa.time32("s")),
        "duration": pa.array([1500, 7], pa.duration("ms")),
    }
    for name, k in cases.items():
        t = db.create_table(name, pa.table({"k": k, "x": [1, 1]}), primary_key="k")
        with pytest.raises(ValueError, match="already exist"):
            t.add(pa.table({"k": k.slice(0, 1), "x": [2]}))
        t.merge_insert(pa.table({"k": k.slice(1, 1), "x": [3]}))
        got = lance.dataset(t.uri).to_table().sort_by("x").to_pylist()
        assert [r["x"] for r in got] == [1, 3] and len(got) == 2, (name, got)
