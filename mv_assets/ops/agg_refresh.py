"""Planning an aggregate view's refresh (kind ``"aggregate"``, :mod:`mv_assets.model.agg_view`).

The refresh runs through the same pipeline as every view's: this plan, the
runner's task (:mod:`mv_assets.execution.agg_tasks`, checkpointed), and one
Lance commit carrying the rows of the touched groups, their hidden state and
the refresh state (:func:`mv_assets.ops.refresh.execute_refresh`). Keys are
groups (their ids, :func:`~mv_assets.model.udtf_view.partition_id` of
:func:`~mv_assets.model.agg_view.group_key`).

* **incremental**: the source rows written since the reflected version ``v0``
  (passing the filter now) are added with weight +1, the rows updated or
  deleted since (passing it at ``v0``, their values there, by stable row id)
  with weight -1; only the groups they touch are rewritten; a group's min /
  max is recomputed from the source only when its buffer of extreme values
  runs out (:mod:`mv_assets.model.agg_view`). Cost:
  O(changed rows + touched groups + rows of the groups recomputed for min/max).
* **full**: every group from every passing row: the first refresh,
  ``mode="full"``, a new query, a recreated source, a write into the view by
  another tool, a cleaned-up change feed, a refresh to an older version.

The plan is exact: an incremental plan applies the changes (it reads only
changed rows and the touched groups) and counts the groups inserted, updated
and deleted; ``details`` adds ``groups_recomputed`` (min/max) and
``source_rows_read``. Planned for a refresh (``exact=False``), it hands the
groups' new rows to the task in an Arrow file of the plan's checkpoint
directory (the task only writes them); a full plan's task computes every
group itself. An aggregate view refreshes as a whole (a group's rows
lie in any fragment): ``fragments=`` widens to the whole source.
"""

import hashlib
import json

import numpy as np
import pyarrow as pa

from mv_assets.execution.agg_tasks import apply_changes, view_rows_of
from mv_assets.execution.tasks import TaskSpec
from mv_assets.model.agg_view import GROUP, Aggregate, group_key
from mv_assets.model.names import SOURCE_ROW_ID
from mv_assets.model.planning import KeyPlan, isin
from mv_assets.model.planning import column_ids as _ids
from mv_assets.model.udtf_view import partition_ids
from mv_assets.ops.function_plan import start_plan
from mv_assets.ops.refresh import RefreshPlan, _place, failed_on_data
from mv_assets.storage import objects
from mv_assets.storage.changes import commit_matters, written_fragments

__all__ = ["plan_agg_refresh"]


def _all_groups(src, agg: Aggregate, filter_sql: str | None) -> tuple[list[str], int]:
    """Keys of every group of the passing rows, and how many rows pass."""
    if not agg.keys:
        n = src.count_rows(filter=filter_sql)
        return ([group_key([])] if n else []), n
    rows = src.to_table(columns=list(agg.keys), filter=filter_sql)
    distinct = rows.group_by(list(agg.keys), use_threads=False).aggregate([])
    columns = [distinct.column(k).to_pylist() for k in agg.keys]
    return sorted(group_key(list(v)) for v in zip(*columns, strict=True)), rows.num_rows


def plan_agg_refresh(
    view, src_version: int | None = None, *, mode: str = "auto", fragments: list[int] | None = None,
    recompute: list[str] | None = None, max_rows_per_task: int | None = None, checkpoint_size: int | None = None,
    parallelism: int = 1, exact: bool = True,
) -> RefreshPlan:
    """Plan a refresh of aggregate view ``view`` (see the module docstring);
    arguments as :func:`mv_assets.ops.refresh.plan_refresh`'s."""
    start = start_plan(view, src_version, mode=mode, fragments=fragments, recompute=recompute,
                       max_rows_per_task=max_rows_per_task, checkpoint_size=checkpoint_size,
                       noun="aggregate view", scoped=False, sync_ok=False)
    if isinstance(start, RefreshPlan):
        return start
    try:  # (the groups are computed while planning: a failure here is the refresh's, on its data)
        return _agg_plan(view, start, max_rows_per_task, checkpoint_size, exact)
    except Exception as exc:
        failed_on_data(exc)
        raise


def _agg_plan(view, start, max_rows_per_task: int | None, checkpoint_size: int | None, exact: bool) -> RefreshPlan:
    """:func:`plan_agg_refresh` once its arguments and the view's state are read (``start``)."""
    definition, src, view_ds, state, how, v0 = start.definition, start.src, start.view_ds, start.state, start.how, start.v0
    agg = Aggregate.from_definition(definition)
    details: dict = {}
    if how == "full":
        keys, rows = _all_groups(src, agg, definition.filter)
        held = np.unique(_ids(view_ds.to_table(columns=[SOURCE_ROW_ID]), SOURCE_ROW_ID))
        ids = partition_ids(keys)
        in_view = isin(ids, held)
        key_plan = KeyPlan(np.sort(ids[~in_view]), np.sort(ids[in_view]), np.sort(held[~isin(held, ids)]))
        addrs = None
        new_rows = None
        details.update(groups=len(keys), source_rows_read=rows, groups_recomputed=0)
    else:
        assert v0 is not None and start.commits is not None
        appended = all(type(t.operation).__name__ == "Append" or not commit_matters(t, start.computed)
                       for t in start.commits)
        moved = written_fragments(src, v0, start.commits)
        moved_ids = None if moved is None else [int(f.fragment_id) for f in moved]
        old = objects.dataset(src.uri, version=v0)
        held_rows = view_rows_of(view_ds)
        changes = apply_changes(src, old, held_rows.drop_columns(["_rowaddr"]), definition.filter, agg,
                                view_ds.schema, moved_ids, appended)
        ins, upd, dele = (partition_ids(changes.inserted), partition_ids(changes.updated),
                          partition_ids(changes.deleted))
        key_plan = KeyPlan(np.sort(ins), np.sort(upd), np.sort(dele))
        gone = set(changes.updated) | set(changes.deleted)
        mask = pa.array([k in gone for k in held_rows.column(GROUP).to_pylist()], pa.bool_())
        touched_rows = held_rows.filter(mask)
        addrs = (_ids(touched_rows, SOURCE_ROW_ID), _ids(touched_rows, "_rowaddr"))
        rows = changes.source_rows
        new_rows = changes.rows
        details.update(groups=len(changes.inserted) + len(gone), source_rows_read=changes.source_rows,
                       groups_recomputed=len(changes.recomputed))
    where = _place(view, src, view_ds, f"aggregate|{v0}|{how}", max_rows_per_task or max(rows, 1),
                   checkpoint_size, balanced=False)
    tasks = []
    kind_args = None
    if new_rows is not None and new_rows.num_rows and not exact:
        # planned for a refresh: the groups' new rows go to the task, which writes them (a dry run writes nothing)
        assert where.checkpoint_dir is not None
        kind_args = {"rows": objects.join(where.checkpoint_dir, "groups.arrow")}
        objects.write_arrow(kind_args["rows"], new_rows)
    if how == "full" or kind_args is not None:
        task_id = hashlib.sha256(f"{where.plan_key}|{json.dumps(kind_args, sort_keys=True)}".encode()).hexdigest()[:16]
        tasks.append(TaskSpec(task_id=task_id, src_uri=where.src_uri, src_version=where.src_version, parts=[],
                              view_uri=where.view_uri, rows=int(rows), checkpoint_dir=where.checkpoint_dir,
                              partitions=[], kind_args=kind_args))
    elif new_rows is not None and new_rows.num_rows:  # a dry run: the task a refresh would run
        tasks.append(TaskSpec(task_id="dry-run", src_uri=where.src_uri, src_version=where.src_version, parts=[],
                              view_uri=where.view_uri, rows=int(rows), partitions=[]))
    return RefreshPlan(
        view=view.name, source=definition.source, from_version=v0, to_version=src.version,
        view_version=view_ds.version, full=how == "full", reason=start.reason,
        rows_to_insert=int(len(key_plan.insert)), rows_to_update=int(len(key_plan.update)),
        rows_to_delete=int(len(key_plan.delete)), udf_rows={}, tasks=tasks, keys=key_plan,
        view_key_addrs=addrs, checkpoint_dir=where.checkpoint_dir, definition_raw=definition.encode(),
        load_number=state.load_number, scope=None, scoped_since_whole=state.scoped_since_whole,
        seconds_per_row=state.seconds_per_row, source_id=start.source_id, repaired=start.foreign is not None,
        read_fields=start.read_fields, details=details,
    )
