"""The one checkpoint store shared by refresh (row checkpoints) and backfill (batch checkpoints)."""

import json
import os

import numpy as np
import pyarrow as pa

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
