"""What the engine relies on Lance's row lineage to do, checked against the
installed pylance (pyproject pins the versions verified: see
docs/open-world.md, "Lance versions").

Incremental refresh and column currency read three things Lance keeps per row
of a dataset with stable row ids: ``_rowid`` (stable), ``_row_created_at_version``
and ``_row_last_updated_at_version``, plus the change feed
``delta(...).get_deleted_row_ids()``. Lance fixed two bugs in them in 2026
(rows inserted by ``merge_insert`` got ``_row_created_at_version = 1``; a
``rewrite_columns`` update of values did not move ``_row_last_updated_at_version``);
the fix of the second must not reach the engine's own ``rewrite_columns``
commits, which write computed values without moving row versions (offsets
given: the rows move; none given: nothing moves). Every test here is plain
pylance except the last group, which drives the engine's own writers.
"""

import lance
import pyarrow as pa
import pytest
from lance import LanceOperation

import mv_assets as mv
from mv_assets.storage.changes import NEUTRAL_OPERATIONS
from mv_assets.storage.lance_compat import take_rows

ROW = ["_rowid", "_row_created_at_version", "_row_last_updated_at_version"]


def _rows(uri: str) -> dict[int, tuple[int, int, int]]:
    """id -> (row id, created at, last updated at)."""
    t = lance.dataset(uri).to_table(columns=["id", *ROW[1:]], with_row_id=True)
    return {r["id"]: (r["_rowid"], r["_row_created_at_version"], r["_row_last_updated_at_version"]) for r in t.to_pylist()}


@pytest.fixture
def uri(tmp_path):
    """Two fragments of two rows, then an append of two: versions 1 and 2."""
    u = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [0, 1, 2, 3], "x": [0, 1, 2, 3], "z": [0] * 4}), u,
                        enable_stable_row_ids=True, max_rows_per_file=2)
    lance.write_dataset(pa.table({"id": [4, 5], "x": [4, 5], "z": [0, 0]}), u, mode="append")
    return u


def test_append_gives_new_ids_created_and_updated_at_the_commit(uri):
    assert _rows(uri) == {0: (0, 1, 1), 1: (1, 1, 1), 2: (2, 1, 1), 3: (3, 1, 1), 4: (4, 2, 2), 5: (5, 2, 2)}


@pytest.mark.parametrize("how", ["all_columns", "some_columns", "conditional", "indexed_key"])
def test_merge_insert_updates_keep_ids_and_inserts_are_created_at_the_commit(uri, how):
    data = {"id": [1, 6], "x": [11, 6]} if how == "some_columns" else {"id": [1, 6], "x": [11, 6], "z": [0, 0]}
    if how == "indexed_key":  # Lance joins through the index
        lance.dataset(uri).create_scalar_index("id", "BTREE")
    before, v = _rows(uri), lance.dataset(uri).version + 1
    merge = lance.dataset(uri).merge_insert("id")
    merge = merge.when_matched_update_all("source.x > target.x") if how == "conditional" else merge.when_matched_update_all()
    merge.when_not_matched_insert_all().execute(pa.table(data))
    after = _rows(uri)
    assert lance.dataset(uri).version == v
    assert after[1] == (1, 1, v)  # same row, created at 1, updated now
    assert after[6] == (6, v, v)  # created by this commit (Lance before the fix: created at 1)
    assert {k: r for k, r in after.items() if k not in (1, 6)} == {k: r for k, r in before.items() if k != 1}


def test_merge_insert_of_new_rows_only_creates_them_at_the_commit(uri):
    lance.dataset(uri).merge_insert("id").when_not_matched_insert_all().execute(
        pa.table({"id": [1, 7], "x": [11, 7], "z": [0, 0]}))
    after = _rows(uri)
    assert after[1] == (1, 1, 1) and after[7] == (6, 3, 3)  # the match is left alone (insert only)


def test_update_keeps_ids_and_moves_only_the_updated_rows(uri):
    before = _rows(uri)
    lance.dataset(uri).update({"x": "x + 100"}, where="id IN (0, 4)")
    after = _rows(uri)
    assert after[0] == (0, 1, 3) and after[4] == (4, 2, 3)
    assert {k: v for k, v in after.items() if k not in (0, 4)} == {k: v for k, v in before.items() if k not in (0, 4)}
    # an update is not a delete in the change feed (the view keeps the row and updates it)
    assert lance.dataset(uri).delta(begin_version=2, end_version=3).get_deleted_row_ids().read_all().num_rows == 0


def test_delete_keeps_the_other_rows_and_the_change_feed_names_the_deleted_ids(uri):
    before = _rows(uri)
    lance.dataset(uri).delete("id IN (1, 4)")
    after = _rows(uri)
    assert after == {k: v for k, v in before.items() if k not in (1, 4)}
    deleted = lance.dataset(uri).delta(begin_version=2, end_version=3).get_deleted_row_ids().read_all()
    assert sorted(deleted.column("_rowid").to_pylist()) == [1, 4]
    # across several commits, too
    lance.dataset(uri).delete("id = 0")
    deleted = lance.dataset(uri).delta(begin_version=2, end_version=4).get_deleted_row_ids().read_all()
    assert sorted(deleted.column("_rowid").to_pylist()) == [0, 1, 4]


def test_compaction_keeps_ids_and_both_versions_and_deletes_nothing(uri):
    ds = lance.dataset(uri)
    ds.update({"x": "x + 1"}, where="id = 2")
    lance.dataset(uri).delete("id = 3")
    before, v = _rows(uri), lance.dataset(uri).version
    frags = sorted(f.fragment_id for f in lance.dataset(uri).get_fragments())
    lance.dataset(uri).optimize.compact_files()
    ds = lance.dataset(uri)
    assert _rows(uri) == before
    assert sorted(f.fragment_id for f in ds.get_fragments()) != frags  # rows moved to new fragments
    assert ds.delta(begin_version=v, end_version=ds.version).get_deleted_row_ids().read_all().num_rows == 0
    kinds = [type(getattr(ds.read_transaction(n), "operation", None)).__name__ for n in range(v + 1, ds.version + 1)]
    assert "Rewrite" in kinds and set(kinds) <= NEUTRAL_OPERATIONS  # fragment reservation, then the rewrite
    # a filter on the row version reads lineage, not data, after compaction too (projected, as the engine does)
    got = ds.to_table(columns={"v": "_row_last_updated_at_version", "id": "id"}, filter="_row_last_updated_at_version > 2")
    assert got.column("id").to_pylist() == [2]


def test_a_compaction_that_rewrote_an_index_is_read_back(uri):
    """pylance 14 builds ``RewrittenIndex`` with two of the five fields its
    class requires: reading such a commit back raised TypeError, and every
    view over an indexed table took its compactions for unknown changes.
    ``storage.lance_compat`` gives the missing fields defaults."""
    lance.dataset(uri).create_scalar_index("id", "BTREE", name="primary_key")
    lance.write_dataset(pa.table({"id": [6], "x": [6], "z": [0]}), uri, mode="append")
    lance.dataset(uri).optimize.compact_files()
    ds = lance.dataset(uri)
    txn = ds.read_transaction(ds.version)
    assert type(txn.operation).__name__ == "Rewrite" and txn.operation.rewritten_indices
    assert txn.operation.rewritten_indices[0].old_id and txn.operation.rewritten_indices[0].new_id
    assert ds.get_transactions(1)[0].operation.rewritten_indices
    from mv_assets.storage.changes import commit_matters, commits_since

    assert not commit_matters(txn)
    assert commits_since(ds, 1) is not None  # the whole history reads: nothing taken for an unknown change


def test_schema_config_and_index_commits_move_no_row(uri):
    before = _rows(uri)
    ds = lance.dataset(uri)
    ds.add_columns([pa.field("n", pa.int64(), nullable=True)])  # how add_columns adds a computed column: schema only
    lance.dataset(uri).update_config({"k": "v"})
    lance.dataset(uri).create_scalar_index("id", "BTREE")
    assert _rows(uri) == before
    ds = lance.dataset(uri)
    kinds = [type(getattr(ds.read_transaction(v), "operation", None)).__name__ for v in (4, 5)]
    assert kinds == ["UpdateConfig", "CreateIndex"] and set(kinds) <= NEUTRAL_OPERATIONS


def _rewrite_x(uri: str, ids: list[int], *, with_offsets: bool) -> None:
    """New values of x for ``ids`` in a rewrite_columns Update: the commit the
    engine's backfills make (without offsets) and load_columns makes (with)."""
    ds = lance.dataset(uri)
    updated, fields, offsets = [], [], {}
    for frag in ds.get_fragments():
        here = frag.to_table(columns=["id"]).column("id").to_pylist()
        mine = [i for i in ids if i in here]
        if not mine:
            continue
        data = pa.table({"id": mine, "x": [1000 + i for i in mine]})
        out = frag.update_columns(data, left_on="id", right_on="id", with_offsets=with_offsets)
        updated.append(out[0])
        fields = out[1]
        if with_offsets:
            offsets[frag.fragment_id] = out[2]  # pyright: ignore[reportGeneralTypeIssues]
    op = LanceOperation.Update(updated_fragments=updated, fields_modified=fields, update_mode="rewrite_columns",
                               updated_fragment_offsets=offsets or None)
    lance.LanceDataset.commit(uri, op, read_version=ds.version)


def test_a_rewrite_columns_update_without_offsets_keeps_row_versions(uri):
    before = _rows(uri)
    _rewrite_x(uri, [1, 4], with_offsets=False)
    assert lance.dataset(uri).to_table(columns=["x"], filter="id IN (1, 4)").column("x").to_pylist() == [1001, 1004]
    assert _rows(uri) == before  # the engine's backfills rely on this: values written, no row "changed"


def test_a_rewrite_columns_update_with_offsets_moves_exactly_those_rows(uri):
    before = _rows(uri)
    _rewrite_x(uri, [1, 4], with_offsets=True)
    after = _rows(uri)
    assert after[1] == (1, 1, 3) and after[4] == (4, 2, 3)
    assert {k: v for k, v in after.items() if k not in (1, 4)} == {k: v for k, v in before.items() if k not in (1, 4)}


def test_take_by_row_id_returns_rows_in_the_order_asked(uri):
    """A join task reads old view rows by id and lays the plan's provenance of
    the same rows beside them: the take must keep the order of the ids asked
    (across fragments, after a delete and an update moved rows)."""
    ds = lance.dataset(uri)
    ds.delete("id = 1")
    ds = lance.dataset(uri)
    ds.update({"x": "x + 10"}, where="id = 2")
    ds = lance.dataset(uri)
    ids = {r["id"]: r["_rowid"] for r in ds.to_table(columns=["id"], with_row_id=True).to_pylist()}
    for order in ([5, 0, 3, 2, 4], [2, 5, 4, 3, 0], [4, 4, 0]):
        got = take_rows(ds, pa.array([ids[i] for i in order], pa.uint64()), ["id", "_rowid"])
        assert got.column("id").to_pylist() == order


def test_a_data_overlay_is_not_readable_once_the_dataset_is_opened_again(tmp_path):
    """Why a join view's dimension update rewrites its rows (delete and append)
    instead of writing only the changed cells: Lance's data overlays
    (``LanceOperation.DataOverlay``: new values for some cells of a fragment,
    layered over its files on read) would make such an update cost the cells
    it changes, but a dataset holding one cannot be opened again (reader
    feature flag 64, "cannot be read by this version of Lance") by this
    pylance nor by lancedb 0.40. When this fails, Lance reads overlays back:
    the dimension steps of bench/bench_join.py can use them (issue 47,
    docs/performance.md, eighth session)."""
    uri = str(tmp_path / "v.lance")
    lance.write_dataset(pa.table({"id": [0, 1, 2], "label": ["a", "b", "c"]}), uri, enable_stable_row_ids=True)
    ds = lance.dataset(uri)
    written = lance.fragment.write_fragments(pa.table({"label": ["B"]}), ds)
    overlay = LanceOperation.DataOverlay([LanceOperation.DataOverlayGroup(
        0, [LanceOperation.DataOverlayFile(written[0].files[0], [1])])])
    committed = lance.LanceDataset.commit(uri, overlay, read_version=ds.version)
    assert committed.to_table().column("label").to_pylist() == ["a", "B", "c"]  # (the handle the commit gave)
    with pytest.raises(Exception, match="cannot be read by this version of Lance"):
        lance.dataset(uri)


def test_stable_row_ids_are_fixed_when_a_dataset_is_created(tmp_path):
    """Why bringing a table in rewrites it (Connection.enable_stable_row_ids):
    an overwrite neither adds stable row ids nor removes them."""
    with_ids, without = str(tmp_path / "a.lance"), str(tmp_path / "b.lance")
    lance.write_dataset(pa.table({"id": [1]}), with_ids, enable_stable_row_ids=True)
    lance.write_dataset(pa.table({"id": [1]}), without)
    lance.write_dataset(pa.table({"id": [2]}), with_ids, mode="overwrite")
    lance.write_dataset(pa.table({"id": [2]}), without, mode="overwrite", enable_stable_row_ids=True)
    assert lance.dataset(with_ids).has_stable_row_ids
    assert not lance.dataset(without).has_stable_row_ids


# -- the engine's own writers ------------------------------------------------


@mv.udf
def _double(x: int) -> int:
    return 2 * x


@pytest.mark.parametrize("checkpoint_size", [None, 2], ids=["one_pass", "staged"])
def test_the_engines_backfills_write_values_without_moving_rows(db, checkpoint_size):
    t = db.create_table("t", pa.table({"id": list(range(6)), "x": list(range(6))}), primary_key="id")
    t.add([{"id": 6, "x": 6}])
    t.add_columns({"y": _double, "s": "x + 1"})  # the SQL column is filled at once, by the same commit kind
    before = _rows(t.uri)
    t.backfill("y", checkpoint_size=checkpoint_size)
    assert _rows(t.uri) == before
    assert t.to_arrow().column("y").to_pylist() == [2 * i for i in range(7)]


def test_the_engines_update_moves_the_rows_it_updates_and_restamps_without_moving_them(db):
    t = db.create_table("t", pa.table({"id": list(range(4)), "x": list(range(4)), "z": [0] * 4}), primary_key="id")
    t.add_columns({"y": _double})
    t.backfill("y")
    before, v = _rows(t.uri), t.version
    t.update("id = 1", {"z": 5})  # an update, then a rewrite_columns commit restamping y's marker
    after = _rows(t.uri)
    assert t.version == v + 2
    assert after[1] == (before[1][0], before[1][1], v + 1)  # moved by the update, not by the restamp
    assert {k: r for k, r in after.items() if k != 1} == {k: r for k, r in before.items() if k != 1}
    assert [c["stale"] for c in t.column_status()] == [0]


def test_the_engines_load_columns_moves_exactly_the_rows_it_loads(db, tmp_path):
    t = db.create_table("t", pa.table({"id": list(range(4)), "x": list(range(4))}), primary_key="id")
    before, v = _rows(t.uri), t.version
    src = str(tmp_path / "src.parquet")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [2], "x": [20]}), src)
    t.load_columns(src, pk="id", columns=["x"])
    after = _rows(t.uri)
    assert after[2] == (before[2][0], before[2][1], v + 1)
    assert {k: r for k, r in after.items() if k != 2} == {k: r for k, r in before.items() if k != 2}


def test_deleting_rows_by_offset_grows_the_deletion_vector(tmp_path):
    """The engine deletes view rows by their known offsets (lance_compat.delete_offsets,
    pylance's internal delete_rows): the existing deletion vector is kept and grown,
    row ids of the other rows stay, and a fragment left empty comes back as None."""
    import lance
    import pyarrow as pa
    from lance import LanceOperation

    from mv_assets.storage.lance_compat import delete_offsets

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"k": list(range(10))}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).delete("k = 2")  # an existing deletion vector
    ds = lance.dataset(uri)
    frag = ds.get_fragments()[0]
    meta = delete_offsets(frag, [0, 5, 7])
    ds = lance.LanceDataset.commit(uri, LanceOperation.Update(updated_fragments=[meta]), read_version=ds.version)
    got = ds.to_table(columns=["k"], with_row_id=True).to_pydict()
    assert got["k"] == [1, 3, 4, 6, 8, 9] and got["_rowid"] == [1, 3, 4, 6, 8, 9]
    assert delete_offsets(ds.get_fragments()[0], [1, 3, 4, 6, 8, 9]) is None


# -- the process-wide Lance session (storage.objects) -----------------------

def _ids_at(uri: str, version: int | None = None) -> list[int]:
    from mv_assets.storage import objects

    return sorted(objects.dataset(uri, version=version).to_table(columns=["id"]).column("id").to_pylist())


def test_one_session_for_every_open_still_sees_each_dataset_as_it_is(tmp_path):
    """Every dataset this process opens shares one Lance session (caches and
    object stores: an open costs ~0.02 ms instead of ~0.23). What the engine
    relies on: a version written by another process is seen at once; a table
    removed and made anew, whose versions have the same numbers and manifests
    of the same sizes, is read as the new table at every version; a version
    removed by cleanup is gone; an overwrite in place is seen."""
    import shutil
    import subprocess
    import sys
    from datetime import timedelta

    from mv_assets.storage import objects

    u = str(tmp_path / "t.lance")

    def make(base: int) -> None:
        lance.write_dataset(pa.table({"id": list(range(base, base + 10))}), u, enable_stable_row_ids=True)
        lance.write_dataset(pa.table({"id": list(range(base + 10, base + 15))}), u, mode="append")

    make(0)
    assert objects._session() is objects._session()
    assert _ids_at(u, 1) == list(range(10)) and _ids_at(u, 2) == list(range(15)) and _ids_at(u) == list(range(15))
    subprocess.run([sys.executable, "-c", "import lance, pyarrow as pa, sys; "
                    "lance.write_dataset(pa.table({'id': [99]}), sys.argv[1], mode='append')", u], check=True)
    assert _ids_at(u) == [*range(15), 99]  # another process's commit

    shutil.rmtree(u)
    make(100)  # the same version numbers, manifests of the same sizes, other rows
    assert _ids_at(u, 1) == list(range(100, 110)) and _ids_at(u, 2) == list(range(100, 115))
    assert _ids_at(u) == list(range(100, 115))
    with pytest.raises(ValueError, match="not found"):
        objects.dataset(u, version=3)  # the old table's third version is not this one's

    lance.write_dataset(pa.table({"id": [7]}), u, mode="overwrite")
    assert _ids_at(u) == [7] and _ids_at(u, 2) == list(range(100, 115))
    lance.dataset(u).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    with pytest.raises(ValueError, match="not found"):
        objects.dataset(u, version=2)
    assert _ids_at(u) == [7]



def test_a_commit_read_again_is_the_same_commit_and_a_table_made_anew_is_read_anew(tmp_path):
    """A version's transaction is kept once read (a view's status and its next
    refresh read its last refresh's commit first), keyed by the dataset, the
    version and the commit's time: the same version number of a table removed
    and made again, with the same operation and properties of the same size,
    is read from the new table."""
    import shutil

    from mv_assets.storage import objects

    u = str(tmp_path / "t.lance")

    def make(tag: str) -> None:
        lance.write_dataset(pa.table({"id": [1, 2]}), u, enable_stable_row_ids=True)
        ds = lance.dataset(u)
        fragments = lance.fragment.write_fragments(pa.table({"id": [3]}), ds)
        lance.LanceDataset.commit(ds, lance.Transaction(read_version=1, operation=LanceOperation.Append(fragments),
                                                        transaction_properties={"who": tag}))

    def props() -> dict:
        ds = objects.dataset(u)
        return dict(objects.read_transaction(ds, ds.version).transaction_properties or {})

    make("first")
    assert props() == {"who": "first"} and props() == {"who": "first"}
    shutil.rmtree(u)
    make("other")  # the same version, operation and property sizes
    assert props() == {"who": "other"}


def test_a_commit_remembered_as_committed_is_the_one_lance_reads_back(tmp_path):
    """The engine's appends are remembered as committed (the next refresh reads
    its state from the last one): what it remembers equals what Lance stored. An
    Update is read back (Lance stores it with its update mode filled in)."""
    from mv_assets.storage import objects

    u = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2, 3]}), u, enable_stable_row_ids=True)
    ds = lance.dataset(u)
    appended = lance.fragment.write_fragments(pa.table({"id": [4]}), ds)
    done = objects.commit(u, lance.Transaction(read_version=1, operation=LanceOperation.Append(appended),
                                               transaction_properties={"k": "v"}), max_retries=0)
    fragment = done.get_fragments()[0]
    deleted = fragment.delete("id = 2")
    assert deleted is not None
    done = objects.commit(u, lance.Transaction(read_version=done.version, operation=LanceOperation.Update(
        updated_fragments=[deleted], new_fragments=lance.fragment.write_fragments(pa.table({"id": [9]}), done)),
        transaction_properties={"k": "w"}), max_retries=0)
    assert objects._commit_key(objects.dataset(u, version=2)) in objects._COMMITTED
    assert objects._commit_key(done) not in objects._COMMITTED
    assert objects.read_transaction(objects.dataset(u, version=2), 2) == lance.dataset(u).read_transaction(2)
    update = objects.read_transaction(done, 3)
    assert update is not None and isinstance(update.operation, LanceOperation.Update)
    assert (update.operation.update_mode, update.transaction_properties) == ("rewrite_rows", {"k": "w"})
    assert objects.dataset(u).to_table().column("id").to_pylist() == [1, 3, 4, 9]


def test_a_handles_own_commit_comes_with_its_manifest(tmp_path):
    """``get_transactions(1)[0]`` of a handle is the transaction of the
    handle's version, as ``read_transaction(version)`` reads it (properties,
    operation, an Update's mode filled in), at the latest version and at one
    checked out; the engine reads a handle's own commit that way (the status
    and a refresh read their view's newest commit first): Lance keeps it from
    the manifest the handle read, where read_transaction reads the manifest
    again (one more GET on an object store: tests/test_catalog_scale.py)."""
    from mv_assets.storage import objects

    u = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2, 3]}), u, enable_stable_row_ids=True)
    ds = lance.dataset(u)
    ds = lance.LanceDataset.commit(ds, lance.Transaction(
        read_version=1, operation=LanceOperation.Append(lance.fragment.write_fragments(pa.table({"id": [4]}), ds)),
        transaction_properties={"k": "appended"}))
    deleted = ds.get_fragments()[0].delete("id = 2")
    assert deleted is not None
    ds = lance.LanceDataset.commit(ds, lance.Transaction(read_version=2, operation=LanceOperation.Update(
        updated_fragments=[deleted], new_fragments=lance.fragment.write_fragments(pa.table({"id": [9]}), ds)),
        transaction_properties={"k": "updated"}))
    for v in (1, 2, 3):
        handle = lance.dataset(u, version=v) if v % 2 else lance.dataset(u).checkout_version(v)
        own = handle.get_transactions(1)[0]
        assert own is not None and own == lance.dataset(u).read_transaction(v)
        assert objects.read_transaction(objects.dataset(u, version=v), v) == own
    latest = lance.dataset(u).get_transactions(1)[0]
    assert latest is not None and latest.transaction_properties == {"k": "updated"}
    assert latest.operation.update_mode == "rewrite_rows"  # (as stored, not as given)


def test_a_commit_of_any_version_is_remembered_by_its_manifest_and_a_table_made_anew_is_read_anew(
        tmp_path, monkeypatch):
    """A local dataset's commits are remembered by their manifest file (name,
    inode, size, times), whatever version the handle reading them is at: a
    commit read once, or made by a compaction of the engine's, is not read
    from Lance again; the same version of a table removed and made again,
    with properties of the same size, is read from the new table."""
    import shutil

    from mv_assets.storage import objects

    u = str(tmp_path / "t.lance")

    def make(tag: str) -> None:
        lance.write_dataset(pa.table({"id": [1, 2]}), u, enable_stable_row_ids=True)
        ds = lance.dataset(u)
        lance.LanceDataset.commit(ds, lance.Transaction(read_version=1, operation=LanceOperation.Append(
            lance.fragment.write_fragments(pa.table({"id": [3]}), ds)), transaction_properties={"who": tag}))
        lance.write_dataset(pa.table({"id": [4]}), u, mode="append")

    reads: list[int] = []
    real = lance.LanceDataset.read_transaction
    monkeypatch.setattr(lance.LanceDataset, "read_transaction",
                        lambda self, version, *a, **k: (reads.append(version), real(self, version, *a, **k))[1])

    def props(v: int) -> dict:
        txn = objects.read_transaction(lance.dataset(u), v)  # (a handle at version 3)
        return dict(txn.transaction_properties or {}) if txn is not None else {}

    make("first")
    assert props(2) == {"who": "first"} and reads == [2]
    assert props(2) == {"who": "first"} and reads == [2]  # remembered
    shutil.rmtree(u)
    make("other")  # the same versions, properties of the same size
    assert props(2) == {"who": "other"} and reads == [2, 2]

    db = mv.connect(str(tmp_path / "cat"))
    t = db.create_table("t", pa.table({"id": list(range(100))}), primary_key="id")
    for k in range(3):
        t.add(pa.table({"id": [100 + k]}))
    before = t.version
    t.compact_files()
    made = {v: type(objects.read_transaction(lance.dataset(t.uri), v).operation).__name__
            for v in range(before + 1, t.version + 1)}
    assert "Rewrite" in made.values()
    read_again = {made[v] for v in reads if v in made}
    assert "Rewrite" not in read_again  # (the compaction's commit, remembered as it was made)


def test_the_session_cache_bounds_come_from_the_environment_in_megabytes(monkeypatch):
    from mv_assets.storage import objects

    monkeypatch.setenv("MV_ASSETS_LANCE_INDEX_CACHE_MB", "64")
    assert objects._megabytes("MV_ASSETS_LANCE_INDEX_CACHE_MB", 2048) == 64 * 1024 * 1024
    monkeypatch.delenv("MV_ASSETS_LANCE_INDEX_CACHE_MB")
    assert objects._megabytes("MV_ASSETS_LANCE_INDEX_CACHE_MB", 2048) == 2048 * 1024 * 1024
    for bad in ("1GB", "-5"):
        monkeypatch.setenv("MV_ASSETS_LANCE_METADATA_CACHE_MB", bad)
        with pytest.raises(ValueError, match=r"MV_ASSETS_LANCE_METADATA_CACHE_MB is a number of megabytes"):
            objects._megabytes("MV_ASSETS_LANCE_METADATA_CACHE_MB", 512)
