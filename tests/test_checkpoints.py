"""The one checkpoint store shared by refresh (row checkpoints) and backfill (batch checkpoints)."""

import json
import os

import numpy as np
import pyarrow as pa
import pytest

import mv_assets as mv
from mv_assets.execution.backfill_tasks import run_compute_task
from mv_assets.storage import objects
from mv_assets.storage.checkpoints import ID, INPUTS, VERSION, CheckpointIndex, CheckpointStore


def _save(store, ids, vers, ins=None, key=None, errors=()):
    ids, vers = np.asarray(ids, np.int64), np.asarray(vers, np.int64)
    values = {"y": pa.array([i * 10 for i in ids.tolist()], pa.int64())}
    return store.save(ids, vers, None if ins is None else np.asarray(ins, dtype=object), values, list(errors), key=key)


def test_rows_are_found_by_identity_across_files(tmp_path):
    store = CheckpointStore(str(tmp_path / "s"))
    k1 = _save(store, [5, 1, 9], [2, 2, 2], ["a", "a", "b"], errors=[{"row_id": 9, "error": "boom"}])
    k2 = _save(store, [3, 7], [1, 4])
    assert sorted([k1, k2]) == store.keys() and store.has(k1)
    index = store.index()
    assert len(index) == 5
    # found: same id, version and input markers; not found: other version, other inputs, unknown id
    pos = index.lookup(np.array([7, 9, 1, 1, 5, 4]), np.array([4, 2, 2, 3, 2, 1]),
                       np.array(["", "b", "a", "a", "x", ""], dtype=object))
    assert (pos >= 0).tolist() == [True, True, True, False, False, False]
    got = index.values(pos[pos >= 0], ["y"])["y"].to_pylist()
    assert got == [70, 90, 10]
    assert index.errors_for(np.array([9, 1])) == [{"row_id": 9, "error": "boom"}]


def test_keys_name_identities_and_files_are_whole(tmp_path):
    store = CheckpointStore(str(tmp_path / "s"))
    a = _save(store, [1, 2], [1, 1])
    assert a == CheckpointStore.identity_key(np.array([1, 2]), np.array([1, 1]), np.array(["", ""], dtype=object))
    assert _save(store, [1, 2], [1, 2]) != a  # another version, another key
    assert _save(store, [4], [1], key="batch-0") == "batch-0"
    data, errors = store.read("batch-0")
    assert data.column_names[:3] == [ID, VERSION, INPUTS] and errors == []
    assert not [n for n in os.listdir(store.root) if not n.endswith(".arrow")]  # no temp files left
    store.remove(["batch-0", "missing"])
    assert not store.has("batch-0")
    store.clear()
    assert store.keys() == [] and len(store.index()) == 0
    assert len(CheckpointIndex([]).lookup(np.array([1]), np.array([1]))) == 1


def test_backfill_and_refresh_leave_checkpoints_in_one_format(tmp_path):
    """A backfill killed after computing leaves batch checkpoints a row lookup
    finds by identity, in the same format as a refresh's row checkpoints."""
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())  # no JVM needed
    t = db.create_table("t", pa.table({"x": list(range(40))}))

    @mv.udf(data_type=pa.int64())
    def double(x: int) -> int:
        return 2 * x

    t.add_columns({"y": double})
    plan = t.plan_backfill("y", checkpoint_size=16)
    # the compute stage alone, as if the job were killed before its commit
    plan_path = os.path.join(plan.checkpoint_dir, "jobs", "plan-x.arrow")
    objects.write_arrow(plan_path, plan.plan_rows)
    n = plan.rows
    batches = [[k, b * 16, min(n, (b + 1) * 16)] for b, k in enumerate(plan.batch_keys)]
    shared = json.dumps({"specs": [c.to_json() for c in plan.specs], "checkpoint_dir": plan.checkpoint_dir,
                         "plan_path": plan_path, "input_uri": plan.input_uri,
                         "input_version": plan.input_version}).encode()
    out = json.loads(run_compute_task(json.dumps({"batches": batches}), shared))
    assert out["computed"] == 3
    store = CheckpointStore(plan.checkpoint_dir)
    assert store.keys() == sorted(plan.batch_keys)
    ids = plan.plan_rows.column(0).to_numpy()
    vers = plan.plan_rows.column(1).to_numpy()
    index = store.index()
    pos = index.lookup(ids, vers)
    assert (pos >= 0).all()
    x_by_id = dict(zip(ids.tolist(), index.values(pos, ["y"])["y"].to_pylist(), strict=True))
    assert sorted(x_by_id.values()) == [2 * x for x in range(40)]
    # the retry resumes every batch and the column is filled
    res = t.backfill("y", checkpoint_size=16)
    assert res.batches_resumed == 3 and res.udf_rows_computed == 0
    assert sorted(t.to_arrow().column("y").to_pylist()) == [2 * x for x in range(40)]
    assert store.keys() == []


# -- results held by time-sized checkpoints (execution.tasks.PacedRowStore) -------------


def _paced(tmp_path, target_s):
    from types import SimpleNamespace

    from mv_assets.execution.tasks import PacedRowStore

    spec = SimpleNamespace(name="y", fingerprint="f", field=None)
    return PacedRowStore(str(tmp_path / "rows"), [spec], False, target_s)  # pyright: ignore[reportArgumentType]


def _slice(store, first, rows=10):
    """One slice as a task gives it to the store: its results saved, then its UDF time recorded."""
    ids = np.arange(first, first + rows, dtype=np.int64)
    store.save(ids, np.ones(rows, np.int64), lambda: np.full(rows, "", dtype=object),
               {"y": pa.array(ids * 10), "__computed__y": pa.array(["f"] * rows)}, [])


def _saved_ids(store):
    index = store.store.index()
    return sorted(index.ids.tolist()) if len(index) else []


def test_a_paced_store_lets_go_of_a_cheap_udfs_results_past_its_bound(tmp_path, monkeypatch):
    """A cheap UDF's results would never be saved (its task ends long before a
    checkpoint's worth of UDF time): past HOLD_BYTES the oldest are let go, not
    held to the task's end (which kept a task's whole output in memory)."""
    from mv_assets.execution import tasks

    monkeypatch.setattr(tasks, "HOLD_BYTES", 1000)
    store = _paced(tmp_path, target_s=10.0)
    held = []
    for b in range(50):
        _slice(store, 10 * b)
        assert not store.computed(10, 0.001)
        held.append(store._held_bytes)
    assert max(held) <= 1000 and len(store._held) <= 3
    assert abs(store.released_seconds - 0.001 * (50 - len(store._held))) < 1e-9
    assert _saved_ids(store) == []  # nothing saved, as before


def test_results_let_go_of_bring_the_next_save_sooner(tmp_path, monkeypatch):
    """Results are let go of only while their UDF time fits in RELEASE_SHARE of
    the target; that time stays counted as unsaved, so the UDF time not in a
    checkpoint never exceeds the target (what a crash may lose, as before)."""
    from mv_assets.execution import tasks

    monkeypatch.setattr(tasks, "HOLD_BYTES", 0)
    monkeypatch.setattr(tasks, "RELEASE_SHARE", 0.25)
    store = _paced(tmp_path, target_s=1.0)
    saves, unsaved = [], []
    for b in range(20):  # 0.125 s a slice (exact in binary)
        _slice(store, 10 * b)
        if store.computed(10, 0.125):
            store.flush()
            saves.append(b)
        unsaved.append(store.released_seconds + sum(h[6] for h in store._held))
    # slices 0 and 1 let go of (0.25 s), the save after slice 7 holds slices 2-7; the 0.25 s
    # let go of stay unsaved, so the next save comes after 6 more slices (13), not 8 (15)
    assert saves == [7, 13, 19]
    assert _saved_ids(store) == list(range(20, 200))
    assert max(unsaved) <= 1.0
    assert store.released_seconds == 0.25


def test_a_refresh_holding_little_equals_the_oracle(tmp_path, monkeypatch):
    """A refresh under time-sized checkpoints (the default) with wide results
    and a small hold bound: the held results stay bounded and the view equals
    the oracle."""
    from mv_assets.execution import tasks

    monkeypatch.setattr(tasks, "HOLD_BYTES", 64 * 1024)
    held: list[int] = []
    real = tasks.PacedRowStore.computed

    def computed(self, rows, seconds):
        out = real(self, rows, seconds)
        held.append(self._held_bytes)
        return out

    monkeypatch.setattr(tasks.PacedRowStore, "computed", computed)
    n, dim = 20_000, 16
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    src = db.create_table("src", pa.table({"id": pa.array(np.arange(n)),
                                           "x": pa.array(np.arange(n, dtype=np.float32))}))

    def wide(x: pa.Array) -> pa.Array:
        v = np.repeat(x.to_numpy()[:, None], dim, axis=1) + np.arange(dim, dtype=np.float32)
        return pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), dim)

    udf = mv.udf(wide, data_type=pa.list_(pa.float32(), dim), input_columns=["x"], batch_size=1024)
    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "e": udf}))
    assert view.refresh().udf_rows_computed == {"e": n}
    one = 1024 * (dim * 4 + 8 * 3 + 64 + 4)  # a slice's results: about one UDF batch
    assert held and max(held) <= 64 * 1024 + 2 * one
    got = view.to_arrow().sort_by("id")
    want = np.repeat(np.arange(n, dtype=np.float32)[:, None], dim, axis=1) + np.arange(dim, dtype=np.float32)
    assert got.column("id").to_pylist() == list(range(n))
    assert np.array_equal(got.column("e").combine_chunks().flatten().to_numpy().reshape(n, dim), want)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan"])
def test_a_bad_checkpoint_seconds_is_refused_naming_the_variable_before_anything_is_written(tmp_path, monkeypatch,
                                                                                         value):
    """$MV_ASSETS_CHECKPOINT_SECONDS of 0 (or not a number of seconds) failed
    every refresh with "checkpoint pacing needs target_seconds > 0 and ..."
    (no word of the variable) and recorded the view FAILED_LOAD: it is now
    refused at the plan, saying which variable and what it takes."""
    db = mv.connect(str(tmp_path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(5)], primary_key="id")

    @mv.udf
    def plus(x: int) -> int:
        return x + 1

    view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": plus}))
    monkeypatch.setenv("MV_ASSETS_CHECKPOINT_SECONDS", value)
    with pytest.raises(ValueError, match=r"\$MV_ASSETS_CHECKPOINT_SECONDS must be a number of seconds above 0"):
        view.refresh()
    assert view.count_rows() == 0 and view.status().load_state != "FAILED_LOAD"
    monkeypatch.delenv("MV_ASSETS_CHECKPOINT_SECONDS")
    view.refresh()
    assert view.count_rows() == 5


def test_a_source_removed_and_made_again_takes_none_of_the_results_saved_for_its_predecessor(tmp_path):
    """A refresh saving row checkpoints fails; the source is removed outside
    mv_assets and made again with other values (row ids and versions start
    again at 0 and 1): the next refresh computes every row from the new
    values. It took the 25 rows saved before as the new rows' results (the
    view held x*10 of the old x, with 5 UDF calls)."""
    import shutil

    db = mv.connect(str(tmp_path / "c"), runner=mv.InlineRunner())
    @mv.udf
    def f(x: int) -> int:
        if x == 25:
            raise RuntimeError("x is 25")
        return x * 10

    def make(xs):
        return db.create_table("t", pa.table({"id": pa.array(range(30), pa.int64()), "x": pa.array(xs, pa.int64())}))

    t = make(list(range(30)))
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": f}))
    with pytest.raises(mv.UdfError):
        v.refresh(checkpoint_size=5)
    shutil.rmtree(t.uri)
    make(list(range(100, 130)))
    result = db.open_table("v").refresh(checkpoint_size=5)
    rows = db.open_table("v").to_arrow().to_pylist()
    assert sorted((r["id"], r["y"]) for r in rows) == [(i, (100 + i) * 10) for i in range(30)]
    assert result.udf_rows_computed == {"y": 30} and not result.udf_rows_resumed.get("y")
