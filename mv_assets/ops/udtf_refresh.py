"""Planning a table-function view's refresh (kind ``"udtf"``, :mod:`mv_assets.model.udtf_view`).

The refresh runs through the same pipeline as every view's: this plan, the
runner's tasks (:mod:`mv_assets.execution.udtf_tasks`, one or more whole
partitions each, checkpointed per task), and one Lance commit with the
refresh state (:func:`mv_assets.ops.refresh.execute_refresh`). Keys are
partitions (:func:`~mv_assets.model.udtf_view.partition_id`).

* **incremental**: the partitions touched since the reflected version ``v0``
  are recomputed, every other partition is left alone. A partition is
  touched when a row written since ``v0`` (``_row_last_updated_at_version``)
  belongs to it and passes the filter now, or when a row updated or deleted
  since ``v0`` belonged to it and passed the filter at ``v0`` (its old value,
  read from the source checked out at ``v0`` by stable row id: a row moved
  between partitions touches both). A touched partition that has no passing
  row any more loses its view rows, with no UDTF call. No commit the view
  reads since ``v0``: nothing is read but the commit list (the "already
  current" plan: at most a state-only commit); compactions likewise.
* **full**: every partition is computed and the view's rows replaced: the
  first refresh, ``mode="full"``, new UDTF code or query, a recreated source,
  a write into the view by another tool, a history cleanup of the change
  feed, a refresh to an older source version, a backfill of a source column
  the view reads.

A table-function view refreshes as a whole: a partition's rows may lie in
any fragment, so ``fragments=`` (a Dagster partition) widens to the whole
source (said in the plan's reason).

``rows_to_insert`` / ``rows_to_update`` / ``rows_to_delete`` count partitions
(new to the view, recomputed, removed); ``udf_rows[udtf name]`` the UDTF calls
(partitions computed), exactly.
"""

import hashlib
import json

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.execution.tasks import TaskSpec
from mv_assets.model.definition import sql_literal
from mv_assets.model.names import PARTITION, SOURCE_ROW_ID
from mv_assets.model.planning import KeyPlan, isin, pack_pieces, task_rows
from mv_assets.model.planning import column_ids as _ids
from mv_assets.model.udtf_view import WHOLE_SOURCE, group_partitions, partition_ids, partition_predicate
from mv_assets.ops.function_plan import start_plan
from mv_assets.ops.refresh import (
    RefreshPlan,
    _place,
    and_filters,
)
from mv_assets.storage import objects
from mv_assets.storage.changes import commit_matters, written_fragments
from mv_assets.storage.refs import ViewRef

__all__ = ["plan_udtf_refresh"]

# Partition keys per SQL ``IN`` list; beyond that many touched partitions the
# whole column is read and matched in Arrow instead.
IN_LIST_KEYS = 1000
# Row ids per ``_rowid IN`` lookup of old partition values.
ID_CHUNK = 50_000


def plan_udtf_refresh(
    view: ViewRef,
    src_version: int | None = None,
    *,
    mode: str = "auto",
    fragments: list[int] | None = None,
    recompute: list[str] | None = None,
    max_rows_per_task: int | None = None,
    checkpoint_size: int | None = None,
    parallelism: int = 1,
    exact: bool = True,  # (its counts are always exact)
) -> RefreshPlan:
    """Plan a refresh of table-function view ``view`` (see the module
    docstring); arguments as :func:`mv_assets.ops.refresh.plan_refresh`'s
    (``max_rows_per_task`` bounds a task's source rows; a partition is never
    split, so one larger partition makes a task of its own)."""
    start = start_plan(view, src_version, mode=mode, fragments=fragments, recompute=recompute,
                       max_rows_per_task=max_rows_per_task, checkpoint_size=checkpoint_size,
                       noun="table-function view", scoped=False, sync_ok=False)
    if isinstance(start, RefreshPlan):
        return start
    definition, src, view_ds, state, how, v0 = start.definition, start.src, start.view_ds, start.state, start.how, start.v0
    commits, computed = start.commits, start.computed
    udtf = definition.table_function

    if how == "full":
        counts = _partition_rows(src, udtf.partition_by, definition.filter, None)
        held = np.unique(_ids(view_ds.to_table(columns=[SOURCE_ROW_ID]), SOURCE_ROW_ID))
        vk = None  # a full refresh replaces every row the view holds
    else:
        assert v0 is not None
        # only appends since v0: no row had an old partition; rows written since lie in these fragments
        appended = commits is not None and all(
            type(t.operation).__name__ == "Append" or not commit_matters(t, computed) for t in commits)
        moved = written_fragments(src, v0, commits) if commits is not None else None
        touched = _touched(src, v0, udtf.partition_by, definition.filter, moved, appended)
        counts = _partition_rows(src, udtf.partition_by, definition.filter, touched) if touched else {}
        vk = _view_rows(view_ds, touched)
        held = np.unique(_ids(vk, SOURCE_ROW_ID))
    keys = sorted(counts)
    ids = partition_ids(keys)
    in_view = isin(ids, held)
    key_plan = KeyPlan(np.sort(ids[~in_view]), np.sort(ids[in_view]), np.sort(held[~isin(held, ids)]))

    total = sum(counts.values())
    per_task = max_rows_per_task or task_rows(total, state.seconds_per_row, parallelism)
    where = _place(view, src, view_ds, f"udtf|{v0}|{how}", per_task, checkpoint_size,
                   balanced=max_rows_per_task is None)
    tasks = []
    pieces = [[k, None, counts[k]] for k in keys]
    for group in pack_pieces(pieces, where.max_rows_per_task, where.balanced) if pieces else []:
        part_keys = [p[0] for p in group]
        task_id = hashlib.sha256(f"{where.plan_key}|{json.dumps(part_keys)}".encode()).hexdigest()[:16]
        tasks.append(TaskSpec(
            task_id=task_id, src_uri=where.src_uri, src_version=where.src_version, parts=[], view_uri=where.view_uri,
            rows=int(sum(p[2] for p in group)), checkpoint_dir=where.checkpoint_dir, partitions=part_keys,
        ))
    return RefreshPlan(
        view=view.name, source=definition.source, from_version=v0, to_version=src.version,
        view_version=view_ds.version, full=how == "full", reason=start.reason,
        rows_to_insert=int(len(key_plan.insert)),
        rows_to_update=int(len(key_plan.update)), rows_to_delete=int(len(key_plan.delete)),
        udf_rows={udtf.name: len(keys)}, tasks=tasks, keys=key_plan,
        view_key_addrs=(_ids(vk, SOURCE_ROW_ID), _ids(vk, "_rowaddr")) if vk is not None else None,
        checkpoint_dir=where.checkpoint_dir, definition_raw=definition.encode(), load_number=state.load_number,
        scope=None, scoped_since_whole=state.scoped_since_whole, seconds_per_row=state.seconds_per_row,
        source_id=start.source_id, repaired=start.foreign is not None, read_fields=start.read_fields,
    )


def _column(src: lance.LanceDataset, column: str | None, filter_sql: str | None, fragments: list | None = None
            ) -> pa.Table:
    """The partition column (or no column) of the rows of ``src`` (``fragments``:
    of those only) passing ``filter_sql``."""
    return src.scanner(columns=[column] if column is not None else [], filter=filter_sql,
                       with_row_id=column is None, fragments=fragments).to_table()


def _keys_of(rows: pa.Table, column: str | None) -> dict[str, np.ndarray]:
    return group_partitions(rows.column(column) if column is not None else None, rows.num_rows)


def _touched(src: lance.LanceDataset, v0: int, column: str | None, filter_sql: str | None, moved: list | None,
             appended: bool) -> set[str]:
    """Keys of the partitions whose rows changed since ``v0``: the new values of
    rows written since and passing now, the old values of rows updated or
    deleted since that passed at ``v0`` (none when every commit since only
    appended). ``moved``: the fragments that can hold rows written since (None: any)."""
    since = f"_row_last_updated_at_version > {int(v0)}"
    if moved is not None and not moved:  # no row written since (deletes only)
        touched: set[str] = set()
        written = np.empty(0, np.int64)
    else:
        touched = set(_keys_of(_column(src, column, and_filters(since, filter_sql), moved), column))
        written = (np.empty(0, np.int64) if appended
                   else _ids(src.scanner(columns=[], filter=since, with_row_id=True, fragments=moved).to_table()))
    deleted = (_ids(src.delta(begin_version=v0, end_version=src.version).get_deleted_row_ids().read_all())
               if src.version > v0 and not appended else np.empty(0, np.int64))
    old_ids = np.unique(np.concatenate([written, deleted]))  # rows new since v0 are simply not found there
    if len(old_ids) == 0 or (column is None and touched):
        return touched
    old = objects.dataset(src.uri, version=v0)
    for lo in range(0, len(old_ids), ID_CHUNK):
        chunk = ", ".join(str(int(i)) for i in old_ids[lo:lo + ID_CHUNK])
        rows = _column(old, column, and_filters(f"_rowid IN ({chunk})", filter_sql))
        touched.update(_keys_of(rows, column))
    return touched


def _partition_rows(src: lance.LanceDataset, column: str | None, filter_sql: str | None,
                    only: set[str] | None) -> dict[str, int]:
    """Passing rows per partition of ``src`` (``only``: of those partitions), for partitions that have some."""
    if column is None:
        n = src.count_rows(filter=filter_sql)
        return {WHOLE_SOURCE: n} if n else {}
    if only is None or len(only) > IN_LIST_KEYS:
        rows = _column(src, column, filter_sql)
    else:
        dtype = src.schema.field(column).type
        rows = _column(src, column, and_filters(partition_predicate(column, dtype, sorted(only)), filter_sql))
    counts = {k: len(at) for k, at in _keys_of(rows, column).items()}
    return counts if only is None else {k: n for k, n in counts.items() if k in only}


def _view_rows(view_ds: lance.LanceDataset, keys: set[str]) -> pa.Table:
    """The view's rows of the partitions ``keys``: their ids and addresses."""
    if not keys:
        return pa.schema([pa.field(SOURCE_ROW_ID, pa.int64()), pa.field("_rowaddr", pa.uint64())]).empty_table()
    if len(keys) > IN_LIST_KEYS:
        rows = view_ds.to_table(columns=[SOURCE_ROW_ID, PARTITION], with_row_address=True)
        mask = pc.is_in(rows.column(PARTITION), value_set=pa.array(sorted(keys), pa.string()))  # pyright: ignore[reportAttributeAccessIssue]
        return rows.filter(mask).select([SOURCE_ROW_ID, "_rowaddr"])
    flt = f"{PARTITION} IN ({', '.join(sql_literal(k) for k in sorted(keys))})"
    return view_ds.to_table(columns=[SOURCE_ROW_ID], filter=flt, with_row_address=True)
