"""Backfill: compute a computed column for chosen rows of a table or view.

A computed column (``add_columns``) has a hidden marker column recording, per
row, the fingerprint of the UDF (or SQL text) that computed the value: NULL
when it was never computed or the UDF failed on the row. So the default
backfill computes exactly the rows whose marker is not the current
fingerprint — a UDF that legitimately returns NULL is not computed again, and
after ``alter_columns`` every row computed by the old code is.

This module plans and commits (the driver); what the runner's tasks do, in
both paths, is in :mod:`mv_assets.execution.backfill_tasks`. A backfill runs
the plan :func:`plan_backfill` returns (its dry run): which path is the plan's
``one_pass``, and the tasks are the plan's.

UDF columns take one pass by default (``run_fused_task``): tasks compute
and write per fragment, UDF results checkpointed by time and row identity, one
``rewrite_columns`` commit pinned to the version read (a conflict plans again
and runs that pass, finding the checkpointed results). A view's rows are those whose
source row still has the version the view holds (planned as in step 1
below), their inputs read from the source. SQL columns and a given
``checkpoint_size`` take the staged path:

1. **Plan** (driver, no Spark): scan the target for the rows to compute, with
   their *input identity*: the stable id and row version of the row the inputs
   come from (the table's own ``_rowid`` / ``_row_last_updated_at_version``;
   for a view, ``__source_row_id`` / ``__source_row_version``). Sorted by id
   and cut into checkpoint batches; a batch's key hashes the fingerprint and
   the identities, so it does not depend on physical addresses: a compaction
   between a crash and the retry keeps every checkpoint valid.
2. **Compute** (Spark tasks, a run of batches each): batches whose checkpoint
   file exists are skipped; the inputs of the others are read in one pass
   (range scans of dense address runs, else takes by stable id), the UDF runs
   batch by batch (with its error policy) and each batch's results go to one
   checkpoint file, written atomically. A killed task redoes at most the batch
   it was in.
3. **Write and commit**: the driver matches the results' identities against
   the target's latest version; one task per touched fragment writes a new
   data file holding the column (and its marker) for every physical row, from
   the checkpoint batches it needs; the driver commits ONE Lance ``Update`` in
   ``rewrite_columns`` mode: row ids, row versions and other columns stay.
   Views that read the column notice the new values through its markers
   (they keep copies); views that do not read it see no change. Rows whose
   identity changed since the plan (updated, deleted) are left for the next
   backfill. A commit conflict redoes the write against the new version (no
   UDF runs again).
"""

import hashlib
import json
import time
import uuid
import warnings
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import lance
import numpy as np
import pyarrow as pa
from lance import LanceOperation, Transaction
from lance.fragment import FragmentMetadata

from mv_assets.execution.backfill_tasks import (
    COMPUTE_TASK,
    FUSED_TASK,
    WRITE_TASK,
    column_field_ids,
    input_columns,
    write_fragment_file,
)
from mv_assets.execution.resources import ResourceRequest, request_of
from mv_assets.execution.tasks import RowStore
from mv_assets.model.definition import (
    SOURCE_ROW_ID,
    SOURCE_ROW_VERSION,
    ColumnSpec,
    check_sql,
    column_reads,
    computed_marker,
    short_error,
    udf_column_type,
)
from mv_assets.model.errors import ConcurrentWriteError, SqlRowsError, UdfError
from mv_assets.model.markers import marker_value, stale_sql
from mv_assets.model.names import Alias, nth_marker_alias
from mv_assets.model.pacing import DEFAULT_SECONDS_PER_ROW, default_target_seconds
from mv_assets.model.planning import column_ids as _ids
from mv_assets.model.planning import fragment_tasks, positions, split_ranges
from mv_assets.model.udf import UDF, checkpoint_size_of, resource_hints, task_size_of
from mv_assets.ops.jobs import Job
from mv_assets.storage import checkpoints as ckpt
from mv_assets.storage import objects
from mv_assets.storage.changes import BACKFILL_KEY, NEUTRAL_OPERATIONS, fragments_after
from mv_assets.storage.checkpoints import CheckpointIndex, CheckpointStore
from mv_assets.storage.commits import commit_latest
from mv_assets.storage.error_log import append_errors, record_failure
from mv_assets.storage.jobs import backfill_under_way
from mv_assets.storage.lance_compat import roaring_bitmap_bytes
from mv_assets.storage.refs import Ref, ViewRef

if TYPE_CHECKING:
    from mv_assets.execution.spark import Runner

__all__ = [
    "BackfillPlan", "BackfillResult", "BackfillJob", "plan_backfill", "execute_backfill", "commit_column_values",
    "lacking_predicate",
]

BackfillJob = Job  # (its name before refresh and load jobs had one)

_IN_ID, _IN_VER, _TARGET_ID = Alias.INPUT_ID, Alias.INPUT_VERSION, Alias.TARGET_ID
_IN_ADDR = Alias.INPUT_ADDRESS  # address of the input row at the input version (to read it fast)
_TARGET_ADDR = Alias.TARGET_ADDRESS


@dataclass
class BackfillPlan:
    """An exact dry run of a backfill: the rows it computes and how."""

    table: str
    columns: list[str]
    udf: str | None
    fingerprint: str
    read_version: int
    where: str | None
    rows: int
    batches: int
    batches_checkpointed: int
    rows_checkpointed: int  # rows whose results checkpoints already hold: the backfill resumes them
    tasks: int
    checkpoint_size: int | None  # None: one pass, checkpoints sized by time (``batches`` are its tasks)
    one_pass: bool = False
    # rows by fragment of their input: a view's source fragment (what a Dagster
    # partition is), a table's own fragment
    rows_by_fragment: dict[int, int] = field(default_factory=dict)
    # internals
    specs: list[ColumnSpec] = field(default_factory=list, repr=False)
    # the manifest of read_version as stored when planned (objects.version_signature): a table
    # dropped and made again up to that version has another, and the backfill commits nothing
    read_stamp: tuple | None = field(default=None, repr=False)
    plan_rows: pa.Table | None = field(default=None, repr=False)
    batch_keys: list[str] = field(default_factory=list, repr=False)
    task_ranges: list[tuple[int, int]] = field(default_factory=list, repr=False)
    checkpoint_dir: str = field(default="", repr=False)
    input_uri: str = field(default="", repr=False)
    input_version: int = field(default=0, repr=False)
    is_view: bool = field(default=False, repr=False)
    targeted: bool = field(default=False, repr=False)  # where= or row_ids= picked the rows
    predicate: str = field(default="", repr=False)  # SQL selecting the rows (a one-pass table's tasks scan with it)
    one_pass_tasks: list[dict] = field(default_factory=list, repr=False)  # the one pass's task payloads
    request: dict = field(default_factory=dict, repr=False)  # plan_backfill's arguments: planned again after a conflict

    @property
    def rows_to_compute(self) -> int:
        return self.rows - self.rows_checkpointed

    # -- Geneva's names for a plan (BackfillPlan) -----------------------------
    @property
    def has_work(self) -> bool:
        """Whether the backfill would write any row."""
        return self.rows > 0

    @property
    def total_rows_pending(self) -> int:
        """Rows the backfill would write (those checkpointed by an interrupted run included)."""
        return self.rows

    @property
    def total_tasks(self) -> int:
        return self.tasks

    def summary(self) -> dict:
        return {
            "table": self.table,
            "columns": self.columns,
            "udf": self.udf,
            "fingerprint": self.fingerprint,
            "read_version": self.read_version,
            "where": self.where,
            "rows": self.rows,
            "rows_checkpointed": self.rows_checkpointed,
            "rows_to_compute": self.rows_to_compute,
            "one_pass": self.one_pass,
            "batches": self.batches,
            "batches_checkpointed": self.batches_checkpointed,
            "tasks": self.tasks,
            "checkpoint_size": self.checkpoint_size,
        }


@dataclass
class BackfillResult:
    """What a backfill did. ``udf_rows_computed`` is counted by the executors."""

    job_id: str
    table: str
    columns: list[str]
    rows_planned: int
    rows_written: int
    rows_failed: int
    rows_skipped: int  # changed or deleted since the plan: left for the next backfill
    udf_rows_computed: int
    batches: int
    batches_resumed: int
    version: int | None
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    rows_resumed: int = 0  # rows whose results came from checkpoints of an earlier, interrupted run
    # rows planned (written, failed or left for later), by fragment of their input (BackfillPlan.rows_by_fragment)
    rows_by_fragment: dict[int, int] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """Geneva's job status of a result: a backfill that returned is ``"DONE"``
        (rows a UDF skipped under ``on_error="skip"`` included, as in Geneva)."""
        return "DONE"

    def summary(self) -> dict:
        return asdict(self)


# -- planning -------------------------------------------------------------


def _group_specs(table: Ref, column: str) -> list[ColumnSpec]:
    """The computed column ``column`` and its siblings (a multi-column UDF's)."""
    specs = table.computed_columns()
    by_name = {c.name: c for c in specs}
    if column not in by_name:
        names = sorted(by_name)
        raise ValueError(f"{column!r} is not a computed column of {table.name!r} (computed columns: {names})")
    spec = by_name[column]
    if spec.field is None:
        return [spec]
    u = spec.the_udf
    return [c for c in specs if c.udf is not None and c.field is not None and c.udf.fingerprint == u.fingerprint
            and c.udf.input_paths == u.input_paths]


def _backfill_specs(table: Ref, column: str, udf: Any) -> list[ColumnSpec]:
    """The column and its siblings, or the single column computed with ``udf`` instead."""
    specs = _group_specs(table, column)
    if udf is None:
        return specs
    if not isinstance(udf, UDF):
        raise ValueError(f"backfill(udf=...) takes a UDF, got {type(udf).__name__}")
    if len(specs) > 1 or specs[0].kind != "udf":
        raise ValueError("backfill(udf=...) overrides a single UDF column; use alter_columns for others")
    if udf.kind != "batch":
        udf = udf.with_inputs(specs[0].the_udf.input_paths).bound_to(table.input_dataset().schema, struct_paths=True)
    else:  # the column's fixed batch columns
        old = specs[0].the_udf
        keep = old.kind == "batch" and old.input_columns
        udf = udf.bound_to(list(old.input_columns) if keep else table.input_dataset().schema)
    _check_replacement(table, specs[0], udf)
    return [ColumnSpec(specs[0].name, "udf", None, udf, None, specs[0].added)]


def _rows_predicate(
    table: Ref, ds: lance.LanceDataset, specs: list[ColumnSpec], where: str | None, row_ids: list[int] | None
) -> str:
    """SQL selecting the rows to backfill: stale ones (or ``where``), limited to ``row_ids``."""
    stale = " OR ".join(stale_sql(c.name, c.fingerprint, versioned=not isinstance(table, ViewRef)) for c in specs)
    parts = []
    if where is not None:
        if not isinstance(where, str) or not where.strip():
            raise ValueError("backfill where= takes a non-empty SQL predicate")
        try:
            check_sql(ds, filter=where)
        except (ValueError, OSError) as exc:
            raise ValueError(f"invalid backfill predicate {where!r}: {short_error(exc)}") from exc
        parts.append(f"({where})")
    else:
        parts.append(f"({stale})")
    if row_ids is not None:
        id_col = SOURCE_ROW_ID if isinstance(table, ViewRef) else "_rowid"
        parts.append(f"{id_col} IN ({', '.join(str(int(i)) for i in row_ids)})" if row_ids else "false")
    return " AND ".join(parts)


def lacking_predicate(table: Ref, column: str) -> str:
    """SQL selecting the rows of ``table`` whose ``column`` (or a sibling of a
    multi-column UDF) lacks a current value: what a backfill computes."""
    return _rows_predicate(table, table.dataset(), _group_specs(table, column), None, None)


def _joined_markers(scanned: pa.Table, n: int) -> np.ndarray:
    """Per row, the ``nth_marker_alias(i)`` marker columns of a scan joined by '|' ('' without any)."""
    if not n:
        return np.full(scanned.num_rows, "", dtype=object)
    cols = [scanned.column(nth_marker_alias(i)).fill_null("").to_pylist() for i in range(n)]
    return np.asarray(["|".join(r) for r in zip(*cols, strict=True)], dtype=object)


def _plan_rows(table: Ref, ds: lance.LanceDataset, specs: list[ColumnSpec], predicate: str, candidates=None):
    """The rows to compute, sorted by input row id (input id, version, target id,
    input address), the markers of their computed inputs, and where the inputs are read."""
    is_view = isinstance(table, ViewRef)
    if isinstance(table, ViewRef):
        cols = {_IN_ID: SOURCE_ROW_ID, _IN_VER: SOURCE_ROW_VERSION}
        input_uri, input_version = table.source_uri, table.source_dataset().version
    else:
        cols = {_IN_VER: "_row_last_updated_at_version"}
        input_uri, input_version = table.uri, ds.version
    # Markers of the computed columns the UDFs read (of the table, or of a
    # view's source): a backfill of such an input moves no row version, so
    # they are part of what a checkpointed batch depends on.
    input_schema = objects.dataset(input_uri, version=input_version).schema
    input_markers = [computed_marker(c) for c in input_columns(specs, input_schema) if computed_marker(c) in input_schema.names]
    marker_cols = {nth_marker_alias(i): f"`{m}`" for i, m in enumerate(input_markers)}
    scanned = ds.scanner(
        columns={**cols, **({} if is_view else marker_cols)}, filter=predicate, with_row_id=True, with_row_address=True,
        fragments=candidates,
    ).to_table()
    in_markers = _joined_markers(scanned, 0 if is_view else len(input_markers))
    target_ids = _ids(scanned)
    in_ids = _ids(scanned, _IN_ID) if is_view else target_ids
    in_vers = _ids(scanned, _IN_VER)
    in_addrs = target_addrs = _ids(scanned, "_rowaddr")  # a view's own addresses: replaced by its source's below
    if is_view and len(in_ids):
        # Only rows whose source row still has the version the view holds: the
        # others changed in the source and the next refresh recomputes them.
        src = objects.dataset(input_uri, version=input_version).scanner(
            columns={Alias.ROW_VERSION: "_row_last_updated_at_version", **marker_cols}, with_row_id=True,
            with_row_address=True,
        ).to_table()
        s_ids, s_vers, s_addrs = _ids(src), _ids(src, Alias.ROW_VERSION), _ids(src, "_rowaddr")
        pos = positions(in_ids, s_ids)
        keep = pos >= 0
        keep[keep] = s_vers[pos[keep]] == in_vers[keep]
        in_markers = _joined_markers(src, len(input_markers))[pos[keep]]
        target_ids, in_ids, in_vers, target_addrs = target_ids[keep], in_ids[keep], in_vers[keep], target_addrs[keep]
        in_addrs = s_addrs[pos[keep]]
    order = np.argsort(in_ids, kind="stable")
    markers = in_markers[order] if input_markers else None
    plan_rows = pa.table({
        _IN_ID: in_ids[order], _IN_VER: in_vers[order], _TARGET_ID: target_ids[order], _IN_ADDR: in_addrs[order],
        _TARGET_ADDR: target_addrs[order],
        ckpt.INPUTS: pa.array((markers if markers is not None else np.full(len(order), "", dtype=object)).tolist(),
                              pa.string()),
    })
    return plan_rows, markers, input_uri, input_version


def _batch_keys(key_base: str, plan_rows: pa.Table, markers, checkpoint_size: int, store: CheckpointStore):
    """The checkpoint key of each batch (UDFs, rows, versions, input markers) and how many are done."""
    keys: list[str] = []
    done_batches = done_rows = 0
    n = plan_rows.num_rows
    ids_np, vers_np = plan_rows.column(_IN_ID).to_numpy(), plan_rows.column(_IN_VER).to_numpy()
    for lo in range(0, n, checkpoint_size):
        hi = min(n, lo + checkpoint_size)
        h = hashlib.sha256(key_base.encode())
        h.update(ids_np[lo:hi].tobytes())
        h.update(vers_np[lo:hi].tobytes())
        if markers is not None:
            h.update("|".join(markers[lo:hi].tolist()).encode())
        key = h.hexdigest()[:24]
        keys.append(key)
        if store.has(key):
            done_batches += 1
            done_rows += hi - lo
    return keys, done_batches, done_rows


def plan_backfill(
    table: Ref,
    column: str,
    *,
    udf: Any = None,
    where: str | None = None,
    row_ids: list[int] | None = None,
    checkpoint_size: int | None = None,
    max_rows_per_task: int = 65_536,
    parallelism: int = 1,
    fragments: list[int] | None = None,
    task_size: int | None = None,
) -> BackfillPlan:
    """Plan a backfill of ``column`` (see :meth:`Table.backfill`): the plan
    :func:`backfill_column` runs with the same arguments (``parallelism``: the
    runner's). ``checkpoint_size`` None: UDF columns in one pass, a task per
    group of fragments (``one_pass_tasks``), rows already checkpointed by an
    interrupted run found by identity as its tasks find them; SQL columns, and
    any column given ``checkpoint_size`` (default: its UDF's
    ``@udf(checkpoint_size=)``), staged (batches of ``SQL_BATCH_ROWS`` by
    default). Untargeted, after a whole one-pass backfill, only the
    fragments written since are scanned (:func:`stale_fragments`).

    ``fragments`` limits the backfill to rows in those fragments (of the
    table or view; a targeted backfill, like ``where``). ``task_size``: rows
    per task (a one-pass task holds whole fragments: at least one; default:
    sized by the rows and ``parallelism``)."""
    _check_backfill_args(checkpoint_size, max_rows_per_task, task_size, parallelism)
    request = {"column": column, "udf": udf, "where": where, "row_ids": row_ids, "checkpoint_size": checkpoint_size,
               "max_rows_per_task": max_rows_per_task, "parallelism": parallelism, "fragments": fragments,
               "task_size": task_size}
    specs = _backfill_specs(table, column, udf)
    if checkpoint_size is None and specs[0].udf is not None:  # @udf(checkpoint_size=): the column's default
        checkpoint_size = checkpoint_size_of(specs[0].udf)
    left = _interrupted_batch_size(table, specs)
    if left is not None and left != checkpoint_size:
        # an interrupted staged run's results are kept by batches of its size: resumed only in those
        if checkpoint_size is not None:
            warnings.warn(f"backfill of {column!r}: an interrupted backfill left results in batches of {left} rows; "
                          f"resuming them with checkpoint_size={left}, not {checkpoint_size}", stacklevel=3)
        checkpoint_size = left
    elif left is None and checkpoint_size is not None and _fused(table, specs) and _row_checkpoints_left(table, specs):
        # an interrupted one-pass run's results are kept by row identity: its tasks find them, batches do not
        warnings.warn(f"backfill of {column!r}: an interrupted backfill left results checkpointed by row; resuming "
                      f"them in one pass, not in batches of checkpoint_size={checkpoint_size}", stacklevel=3)
        checkpoint_size = None
    if task_size is None and specs[0].udf is not None:  # @udf(task_size=): the column's default
        task_size = task_size_of(specs[0].udf)
    one_pass = checkpoint_size is None and _fused(table, specs)
    ds = table.dataset()
    fingerprint = specs[0].fingerprint
    is_view = isinstance(table, ViewRef)
    targeted = where is not None or row_ids is not None or fragments is not None
    predicate = _rows_predicate(table, ds, specs, where, row_ids)
    candidates = _given_fragments(ds, table.name, fragments) if fragments is not None else (
        None if targeted else stale_fragments(ds, specs))
    plan = BackfillPlan(
        table=table.name, columns=[c.name for c in specs], udf=specs[0].udf.name if specs[0].udf is not None else None,
        fingerprint=fingerprint, read_version=ds.version, where=where, rows=0, batches=0, batches_checkpointed=0,
        rows_checkpointed=0, tasks=0, checkpoint_size=None, one_pass=one_pass, specs=specs,
        checkpoint_dir=table.layout.column_checkpoints(table.name, fingerprint), input_uri=table.uri,
        input_version=ds.version, is_view=is_view, targeted=targeted, predicate=predicate, request=request,
        read_stamp=objects.version_signature(table.uri, ds.version),
    )
    if one_pass and not is_view:  # the tasks scan their fragments: only addresses here
        return _one_pass_table_plan(plan, table, ds, specs, predicate, candidates, parallelism, task_size)
    plan_rows, markers, plan.input_uri, plan.input_version = _plan_rows(table, ds, specs, predicate, candidates)
    plan.rows = plan_rows.num_rows
    in_fids, in_counts = np.unique(_ids(plan_rows, _IN_ADDR) >> 32, return_counts=True)
    plan.rows_by_fragment = {int(f): int(n) for f, n in zip(in_fids, in_counts, strict=True)}
    if one_pass:  # a view's: its rows sorted by view address, a task per group of view fragments
        return _one_pass_view_plan(plan, table, specs, plan_rows, parallelism, task_size)
    return _staged_plan(plan, table, specs, plan_rows, markers, checkpoint_size, max_rows_per_task, task_size)


_STAGED = "staged.json"  # beside a staged run's batch checkpoints: their batch size


def _interrupted_batch_size(table: Ref, specs: list) -> int | None:
    """The batch size of an interrupted staged backfill of these columns (its
    results are kept by batches of that size), None without one."""
    raw = objects.read_text(objects.join(table.layout.column_checkpoints(table.name, specs[0].fingerprint), _STAGED))
    try:
        size = json.loads(raw)["checkpoint_size"] if raw else None
    except (ValueError, KeyError, TypeError):
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _check_backfill_args(checkpoint_size: int | None, max_rows_per_task: int, task_size: int | None,
                         parallelism: int) -> None:
    if checkpoint_size is not None and (
        isinstance(checkpoint_size, bool) or not isinstance(checkpoint_size, int) or checkpoint_size <= 0
    ):
        raise ValueError("checkpoint_size must be a positive int (or None: one pass, checkpoints sized by time)")
    if not isinstance(max_rows_per_task, int) or max_rows_per_task <= 0:
        raise ValueError("max_rows_per_task must be a positive int")
    if task_size is not None and (isinstance(task_size, bool) or not isinstance(task_size, int) or task_size <= 0):
        raise ValueError(f"task_size must be a positive int (rows per task), got {task_size!r}")
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism <= 0:
        raise ValueError(f"concurrency must be a positive int (tasks at once), got {parallelism!r}")


def _one_pass_table_plan(plan: BackfillPlan, table: Ref, ds: lance.LanceDataset, specs: list, predicate,
                         candidates: list | None, parallelism: int, task_size: int | None) -> BackfillPlan:
    """``plan`` as a one-pass backfill of a table: a task per group of its
    fragments, from their row addresses only (the tasks scan them)."""
    groups, plan.rows, plan.rows_by_fragment = _fragment_groups(ds, predicate, parallelism, candidates, task_size)
    plan.one_pass_tasks = [{"fragments": g} for g in groups]
    files = _row_checkpoints(table, specs) if plan.rows else []
    if files:  # an interrupted run's results: the rows they hold, by identity
        plan_rows = _plan_rows(table, ds, specs, predicate, candidates)[0]
        plan.rows_checkpointed = _rows_checkpointed_by_identity(files, plan_rows)
    plan.tasks = plan.batches = len(groups)
    return plan


def _one_pass_view_plan(plan: BackfillPlan, table: Ref, specs: list, plan_rows: pa.Table, parallelism: int,
                        task_size: int | None) -> BackfillPlan:
    """``plan`` as a one-pass backfill of a view: its rows (``plan_rows``)
    sorted by view address, a task per group of view fragments."""
    plan.plan_rows = plan_rows.take(pa.array(np.argsort(_ids(plan_rows, _TARGET_ADDR), kind="stable")))
    fids, firsts, counts = np.unique(_ids(plan.plan_rows, _TARGET_ADDR) >> 32, return_index=True,
                                     return_counts=True)
    plan.one_pass_tasks = [
        {"fragments": [int(fids[i]) for i in g], "lo": int(firsts[g[0]]), "hi": int(firsts[g[-1]] + counts[g[-1]])}
        for g in (fragment_tasks(counts.tolist(), parallelism, task_size) if plan.rows else [])
    ]
    files = _row_checkpoints(table, specs) if plan.rows else []
    plan.rows_checkpointed = _rows_checkpointed_by_identity(files, plan_rows) if files else 0
    plan.tasks = plan.batches = len(plan.one_pass_tasks)
    return plan


def _staged_plan(plan: BackfillPlan, table: Ref, specs: list, plan_rows: pa.Table, markers,
                 checkpoint_size: int | None, max_rows_per_task: int, task_size: int | None) -> BackfillPlan:
    """``plan`` as a staged backfill: ``plan_rows`` in batches of
    ``checkpoint_size`` rows (default ``SQL_BATCH_ROWS``), those already
    checkpointed found by key, and tasks of whole batches."""
    plan.plan_rows = plan_rows
    plan.checkpoint_size = checkpoint_size or SQL_BATCH_ROWS
    plan.batch_keys, plan.batches_checkpointed, plan.rows_checkpointed = _batch_keys(
        f"{table.uri}|{[c.name for c in specs]}|{plan.fingerprint}", plan_rows, markers, plan.checkpoint_size,
        CheckpointStore(plan.checkpoint_dir),
    )
    plan.batches = len(plan.batch_keys)
    per_task = max(1, (task_size or max_rows_per_task) // plan.checkpoint_size)
    plan.task_ranges = [(lo, hi) for lo, hi in split_ranges(plan.batches, per_task)]
    plan.tasks = len(plan.task_ranges)
    return plan


def _given_fragments(ds: lance.LanceDataset, name: str, ids: list[int]) -> list:
    """The fragments of ``ds`` with these ids (ValueError naming those it lacks)."""
    if isinstance(ids, (str, bytes)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"fragments is a list of fragment ids (ints), got {ids!r}")
    by_id = {f.fragment_id: f for f in ds.get_fragments()}
    missing = sorted(set(ids) - set(by_id))
    if missing:
        raise ValueError(f"{name!r} has no fragments {missing} at version {ds.version} (it has {sorted(by_id)})")
    return [by_id[i] for i in sorted(set(ids))]


def plan_fragments(plan: BackfillPlan) -> list[int]:
    """Ids of the fragments (of the table or view) holding the plan's rows, ascending."""
    if plan.one_pass_tasks:
        return sorted({int(f) for t in plan.one_pass_tasks for f in t["fragments"]})
    if plan.plan_rows is None or not plan.plan_rows.num_rows:
        return []
    return sorted(int(f) for f in np.unique(_ids(plan.plan_rows, _TARGET_ADDR) >> 32))


def _row_checkpoints(table: Ref, specs: list[ColumnSpec]) -> list:
    """The one-pass path's row checkpoints of these columns (an interrupted
    run's), as its tasks' store reads them; files removed meanwhile (a running
    backfill committed) are left out."""
    store = RowStore(_one_pass_rows_dir(table, specs), specs).store
    files = []
    for key in store.keys():
        try:
            files.append(store.read(key))
        except FileNotFoundError:
            continue
    return files


def _row_checkpoints_left(table: Ref, specs: list[ColumnSpec]) -> bool:
    """Whether an interrupted one-pass backfill of these columns left row checkpoints (one listing)."""
    return bool(RowStore(_one_pass_rows_dir(table, specs), specs).store.keys())


def _rows_checkpointed_by_identity(files: list, plan_rows: pa.Table) -> int:
    """Rows of the plan whose results ``files`` (row checkpoints) hold, looked
    up by identity (input row id, row version, input markers) as the one-pass
    tasks look them up: what the backfill resumes."""
    if not plan_rows.num_rows:
        return 0
    pos = CheckpointIndex(files).lookup(_ids(plan_rows, _IN_ID), _ids(plan_rows, _IN_VER),
                                        np.asarray(plan_rows.column(ckpt.INPUTS).to_pylist(), dtype=object))
    return int((pos >= 0).sum())


def _one_pass_rows_dir(table: Ref, specs: list[ColumnSpec]) -> str:
    """Where the one-pass path checkpoints its results by row identity."""
    return objects.join(table.layout.column_checkpoints(table.name, specs[0].fingerprint), "rows")


def _check_replacement(table: Ref, spec: ColumnSpec, udf: Any) -> None:
    if spec.kind != "udf" or spec.field is not None:
        raise ValueError(f"column {spec.name!r} is not a single-output UDF column")
    old_type = udf_column_type(spec)
    if udf.output_fields is not None or udf.data_type != old_type:
        raise ValueError(
            f"the new UDF for {spec.name!r} returns {udf.data_type}; the column holds {old_type}"
        )
    schema = table.input_dataset().schema
    udf.validate_inputs(schema, spec.name)


# -- write stage (driver; the tasks: execution.backfill_tasks) --------------


def _job_file(ckpt_dir: str, name: str) -> str:
    """A job's own files (its plan rows, write assignments) beside its checkpoints."""
    return objects.join(ckpt_dir, "jobs", name)


def dependent_markers(table: Ref, specs: list[ColumnSpec], ds: lance.LanceDataset | None = None) -> list[str]:
    """The markers of the computed columns of ``table`` that read a column of
    ``specs`` (and are not among them). A backfill writes new values without
    moving row versions, so a column computed from the old ones would read as
    current for good: the backfill sets its marker NULL for the rows it writes
    (stale: its next backfill computes them from the new values, and does the
    same for the columns reading it in turn)."""
    written = sorted({c.name for c in specs})
    names = (ds or table.dataset()).schema.names
    out = []
    for c in table.computed_columns():
        if c.name in written or computed_marker(c.name) not in names:
            continue
        if column_reads(c, written, [n for n in names if n != c.name]):
            out.append(computed_marker(c.name))
    return out


def _commit_results(
    table: Ref, plan: BackfillPlan, job_id: str, stats: dict, runner: "Runner"
) -> tuple[int | None, int, int]:
    """Write every checkpointed result into the latest version; one commit.

    The driver reads only the identities of the results; the column files are
    written by tasks on the runner (one per touched fragment), each reading
    the checkpoint batches it needs."""
    names = [n for c in plan.specs for n in (c.name, computed_marker(c.name))]
    store = CheckpointStore(plan.checkpoint_dir)
    ids, vers, sizes, ins = [], [], [], []
    for key in plan.batch_keys:
        data, _ = store.read(key)
        ids.append(_ids(data, ckpt.ID))
        vers.append(_ids(data, ckpt.VERSION))
        ins.append(np.asarray(data.column(ckpt.INPUTS).to_pylist(), dtype=object))
        sizes.append(data.num_rows)
    if not sizes or sum(sizes) == 0:
        return None, 0, 0
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    nulls = dependent_markers(table, plan.specs)

    def write(ds: lance.LanceDataset, groups: list) -> list[FragmentMetadata]:
        payloads, assigns = [], []
        for fid, offsets, pos in groups:
            batch = np.searchsorted(starts, pos, side="right") - 1
            path = _job_file(plan.checkpoint_dir, f"write-{job_id}-{fid}.arrow")
            objects.write_arrow(path, pa.table({"offset": offsets, "batch": batch, "row": pos - starts[batch]}))
            assigns.append(path)
            payloads.append(json.dumps({"fragment_id": int(fid), "assign": path}))
        shared_w = json.dumps({
            "uri": table.uri, "version": ds.version, "names": names, "nulls": nulls,
            "checkpoint_dir": plan.checkpoint_dir, "keys": plan.batch_keys,
        }).encode()
        try:
            rows = sum(len(g[1]) for g in groups)
            outs = runner.map(WRITE_TASK, payloads, shared_w, rows, estimated_seconds=_estimate(rows))
        finally:
            for path in assigns:
                objects.remove(path)
        return [FragmentMetadata.from_json(o) for o in outs]

    props = {"job_id": job_id, "columns": plan.columns, "fingerprint": plan.fingerprint, "invalidated": nulls,
             **stats}
    # (a table's rows are written only where the computed columns they were read from are as they were)
    schema = table.dataset().schema
    read = ([] if plan.is_view else
            [computed_marker(c) for c in input_columns(plan.specs, schema) if computed_marker(c) in schema.names])
    return commit_column_values(
        table, names, np.concatenate(ids), np.concatenate(vers), write, is_view=plan.is_view, props=props,
        nulls=nulls, inputs=(read, np.concatenate(ins)) if read else None,
        planned_on=(plan.read_version, plan.read_stamp) if plan.read_stamp is not None else None,
    )


def _driver_writer(res: pa.Table, names: list[str], nulls: list[str] | None = None):
    """Write fragment files in this process from in-memory values (load_columns);
    ``nulls``: marker columns set NULL for the rows written."""

    def write(ds: lance.LanceDataset, groups: list) -> list[FragmentMetadata]:
        return [write_fragment_file(ds, int(fid), names, offsets, res.take(pa.array(pos)), nulls)
                for fid, offsets, pos in groups]

    return write


def sql_rows_failing(table: Ref, column: str, expr: str) -> list[int]:
    """Row ids of the rows of ``table`` lacking the SQL column ``column`` its
    expression fails on (a cast that does not hold for their values), found
    by evaluating halves of them; none when it fails on no row at all (a
    column it reads is gone: not the rows' fault)."""
    return rows_failing(table.dataset(), expr, lacking_predicate(table, column))


def rows_failing(ds: lance.LanceDataset, expr: str, where: str | None) -> list[int]:
    """Row ids of the rows of ``ds`` matching ``where`` that the SQL ``expr``
    fails on, found by evaluating halves of them (none when it fails on no
    row at all: a column it reads is gone, say)."""
    try:
        ds.to_table(columns={"v": expr}, filter="false")
    except (ValueError, OSError, pa.ArrowException):
        return []
    ids = ds.to_table(columns=[], with_row_id=True, filter=where).column("_rowid").to_pylist()

    def fails(part: list[int]) -> bool:
        try:
            ds.to_table(columns={"v": expr}, filter=f"_rowid IN ({', '.join(map(str, part))})")
        except (ValueError, OSError, pa.ArrowException):
            return True
        return False

    bad: list[int] = []
    todo = [ids] if ids and fails(ids) else []
    while todo:
        part = todo.pop()
        if len(part) == 1:
            bad.append(part[0])
            continue
        half = len(part) // 2
        todo += [p for p in (part[:half], part[half:]) if fails(p)]
    return sorted(bad)


def sql_failure_text(table: str, spec: ColumnSpec, failed: SqlRowsError) -> str:
    """What a warning says of the rows a SQL column's expression fails on."""
    bad = failed.rows
    return (f"SQL column {spec.name!r} of {table!r} ({spec.expr}) fails on {len(bad)} row(s) "
            f"(row ids {bad[:10]}{' ...' if len(bad) > 10 else ''}: {failed.error}); they stay stale "
            "(table.column_status()) until their values or the expression change.")


def fill_sql_rows(table: Ref, spec: ColumnSpec, exclude: list[int]) -> int | None:
    """Compute the SQL column ``spec`` of a table for its rows lacking it but
    those of ``exclude`` (row ids: rows its expression fails on), in this
    process, and write them in one commit (:func:`commit_column_values`). The
    expression is evaluated on the selected rows only (a backfill reads
    ranges of rows: a failing row amid them failed it). Returns the new
    version (None: nothing written)."""
    assert spec.kind == "sql" and spec.expr is not None and not isinstance(table, ViewRef)
    ds = table.dataset()
    keep = lacking_predicate(table, spec.name)
    if exclude:
        keep = f"({keep}) AND NOT (_rowid IN ({', '.join(str(int(i)) for i in exclude)}))"
    rows = ds.to_table(columns={"__v": spec.expr, "__ver": "_row_last_updated_at_version"}, filter=keep,
                       with_row_id=True)
    if rows.num_rows == 0:
        return None
    ids, vers = _ids(rows), _ids(rows, "__ver")
    marker = computed_marker(spec.name)
    res = pa.table({spec.name: rows.column("__v").cast(ds.schema.field(spec.name).type),
                    marker: pa.array([marker_value(spec.fingerprint, int(v)) for v in vers], pa.string())})
    names = [spec.name, marker]
    nulls = dependent_markers(table, [spec], ds)
    props = {"job_id": f"fill-{uuid.uuid4().hex[:8]}", "columns": [spec.name], "fingerprint": spec.fingerprint,
             "invalidated": nulls, "targeted": True, "errors": 0}
    version, _, _ = commit_column_values(table, names, ids, vers, _driver_writer(res, names, nulls), is_view=False,
                                         props=props, nulls=nulls)
    return version


def _same_table(table: Ref, ds: lance.LanceDataset, version: int, stamp: tuple | None) -> None:
    """Raise ConcurrentWriteError when ``table`` (``ds``: its latest) is no
    longer the dataset whose ``version`` was ``stamp`` as stored (dropped and
    made again: its rows' ids and versions start again, its files are other
    files); a version removed since by a cleanup is not that."""
    if stamp is None:
        return
    now = objects.version_signature(table.uri, version)
    if (now is not None and now != stamp) or (now is None and ds.latest_version < version):
        raise ConcurrentWriteError(
            f"{table.name!r} was dropped and made again while values were computed for it (its version {version} "
            "is another commit, or not there yet); nothing was committed")


def commit_column_values(
    table: Ref,
    names: list[str],
    res_ids: np.ndarray,
    res_vers: np.ndarray,
    write,
    *,
    is_view: bool,
    props: dict,
    bump_versions: bool = False,
    nulls: list[str] | None = None,
    inputs: "tuple[list[str], np.ndarray] | None" = None,
    planned_on: "tuple[int, tuple] | None" = None,
) -> tuple[int | None, int, int]:
    """Write ``names`` for the rows identified by ``res_ids`` / ``res_vers``
    (stable id and row version of the row the values were computed for) into
    the latest version of ``table``: ``write(ds, groups)`` makes one new data
    file per touched fragment (groups are ``(fragment id, offsets, positions
    in res)``, offsets ascending); then ONE ``rewrite_columns`` commit. Rows
    whose identity no longer matches (changed or deleted meanwhile) are
    skipped. A commit conflict redoes the write against the newer version.

    Computed columns are written without moving row versions (``bump_versions``
    False): views that read them see the change through the markers, views
    that do not read them see no change at all. Loaded data columns move the
    versions of the rows written, like any update. ``nulls``: marker columns
    ``write`` sets NULL for the rows it writes (:func:`dependent_markers`).
    ``inputs``: the markers of the computed columns the values were computed
    from, and their values then per row ('|'-joined): rows where they moved
    since (a backfill of an input committed meanwhile: it set these columns'
    markers NULL) are skipped, stale, as rows whose versions moved are.
    ``planned_on``: the version the values were planned on and its manifest
    as stored then (:func:`objects.version_signature`): a table dropped and
    made again since (its rows' ids and versions start again) gets nothing.

    Returns (new version or None, rows written, rows skipped)."""

    def build() -> tuple[Transaction | None, tuple[int, int]]:
        ds = table.dataset()
        if planned_on is not None:
            _same_table(table, ds, *planned_on)
        cols: dict[str, str] = {Alias.ROW_VERSION: SOURCE_ROW_VERSION if is_view else "_row_last_updated_at_version"}
        if is_view:
            cols[Alias.KEY] = SOURCE_ROW_ID
        if inputs is not None:
            cols.update({nth_marker_alias(i): f"`{m}`" for i, m in enumerate(inputs[0])})
        cur = ds.scanner(columns=cols, with_row_id=True, with_row_address=True).to_table()
        cur_keys = _ids(cur, Alias.KEY) if is_view else _ids(cur)
        cur_vers = _ids(cur, Alias.ROW_VERSION)
        cur_addrs = _ids(cur, "_rowaddr")
        pos = positions(res_ids, cur_keys)
        ok = pos >= 0
        ok[ok] = cur_vers[pos[ok]] == res_vers[ok]
        if inputs is not None and ok.any():
            ok[ok] = _joined_markers(cur, len(inputs[0]))[pos[ok]] == inputs[1][ok]
        skipped = int(len(res_ids) - ok.sum())
        if not ok.any():
            return None, (0, skipped)
        where = np.flatnonzero(ok)
        addrs = cur_addrs[pos[ok]]
        if len(addrs) > 1 and not (np.diff(addrs) > 0).all():  # group by fragment, offsets ascending
            by_addr = np.argsort(addrs, kind="stable")
            addrs, where = addrs[by_addr], where[by_addr]
        frag_ids = addrs >> 32
        offsets = (addrs & 0xFFFFFFFF).astype(np.int64)
        starts = np.concatenate([[0], np.flatnonzero(np.diff(frag_ids)) + 1])
        ends = np.concatenate([starts[1:], [len(addrs)]])
        groups = [(int(frag_ids[a]), offsets[a:b], where[a:b]) for a, b in zip(starts, ends, strict=True)]
        updated = write(ds, groups)
        offset_maps = {}
        if bump_versions:  # the rows whose versions move: portable RoaringBitmap bytes
            offset_maps = {fid: roaring_bitmap_bytes(o.tolist()) for fid, o, _ in groups}
        _, every = column_field_ids(ds, names + [n for n in nulls or [] if n not in names])
        txn = Transaction(
            read_version=ds.version,
            operation=LanceOperation.Update(
                updated_fragments=updated,
                fields_modified=sorted(every),
                update_mode="rewrite_columns",
                updated_fragment_offsets=offset_maps if bump_versions else None,
            ),
            transaction_properties={
                (BACKFILL_KEY if not bump_versions else "mv_assets.load_columns"): json.dumps(
                    {**props, "rows": int(ok.sum())}
                )
            },
        )
        return txn, (int(ok.sum()), skipped)

    version, (written, skipped) = commit_latest(table.uri, build, what=f"{names} into {table.name!r}")
    return version, written, skipped


# -- one pass: compute and write per fragment (the tasks: execution.backfill_tasks) --


def _fused(table: Ref, specs: list[ColumnSpec]) -> bool:
    """UDF columns backfill in one pass (see :func:`~mv_assets.execution.backfill_tasks.run_fused_task`)."""
    return all(c.kind == "udf" for c in specs)


STALE_LOOKBACK = 1000  # versions searched for the last whole backfill (each a read, a GET on object stores)


def stale_fragments(ds: lance.LanceDataset, specs: list[ColumnSpec]) -> list | None:
    """The only fragments that can hold rows the columns ``specs`` lack, or
    None (any fragment may).

    After a whole one-pass backfill with the current UDF that left no failed
    row, every row then stale was computed: rows stale now were appended since
    the version it read, so they sit in fragments created after it (ids above
    the largest then; a compaction since may have moved computed rows there
    too). Holds while every later commit either appends or changes nothing
    these columns' markers depend on (compactions, indexes, other columns'
    backfills); anything else (an update, a delete, a schema change, another
    backfill of these columns or of a column they read, a cleaned-up version,
    or no such backfill in the last ``STALE_LOOKBACK`` versions) answers None.
    O(commits)."""
    names = [c.name for c in specs]
    for v in range(ds.version, max(0, ds.version - STALE_LOOKBACK), -1):  # a read per version
        try:
            txn = ds.read_transaction(v)
        except Exception:  # cleaned up: unknown
            return None
        if txn is None:
            return None
        props = txn.transaction_properties or {}
        if BACKFILL_KEY in props:
            info = json.loads(props[BACKFILL_KEY])
            if {computed_marker(n) for n in names} & set(info.get("invalidated") or []):
                return None  # a backfill of a column these read: it set their markers NULL where it wrote
            if not set(names) & set(info.get("columns") or []):
                continue  # another column's backfill: these markers untouched
            read = info.get("read_version")
            if (read is None or info.get("targeted") is not False or info.get("errors") != 0
                    or info.get("fingerprint") != specs[0].fingerprint):
                return None
            return fragments_after(ds, int(read))
        if type(txn.operation).__name__ not in ("Append", *NEUTRAL_OPERATIONS):
            return None
    return None


def _fragment_groups(
    ds: lance.LanceDataset, predicate: str, parallelism: int, candidates: list | None = None,
    task_size: int | None = None,
) -> tuple[list[list[int]], int, dict[int, int]]:
    """Fragments holding rows to compute (among ``candidates``, None: all),
    packed into tasks (as many rows per task as keep every core busy), the
    rows to compute, and those rows by fragment."""
    if candidates is not None and not candidates:
        return [], 0, {}
    # (the row version is projected: Lance 14 errs on filters reading it after compaction otherwise)
    scanner = ds.scanner(columns={Alias.ROW_VERSION: "_row_last_updated_at_version"}, filter=predicate,
                         with_row_address=True, fragments=candidates)
    addrs = _ids(scanner.to_table(), "_rowaddr")
    if not len(addrs):
        return [], 0, {}
    fids, counts = np.unique(addrs >> 32, return_counts=True)
    groups = [[int(fids[i]) for i in g] for g in fragment_tasks(counts.tolist(), parallelism, task_size)]
    return groups, len(addrs), {int(f): int(n) for f, n in zip(fids, counts, strict=True)}


def _record_failure(table: Ref, job_id: str, exc: UdfError, input_uri: str, input_version: int | None) -> None:
    """Name the failed row after the table and its primary key, and record it."""
    rows_of = table.source if isinstance(table, ViewRef) else table.name
    record_failure(table.layout, table.name, job_id, exc, objects.dataset(input_uri, version=input_version), rows_of)


def _execute_one_pass(table: Ref, plan: BackfillPlan, runner: "Runner", job_id: str,
                      checkpoint_seconds: float | None = None) -> BackfillResult:
    """Run a one-pass plan's tasks (compute and write per fragment), commit once.
    A commit conflict (a writer changed those fragments meanwhile) plans again
    with the same arguments and runs that plan on the new version, finding the
    results checkpointed so far."""
    start, started_at = time.perf_counter(), time.time()
    specs, names = plan.specs, [n for c in plan.specs for n in (c.name, computed_marker(c.name))]
    pace = default_target_seconds() if checkpoint_seconds is None else max(float(checkpoint_seconds), 1e-6)
    rows_dir = _one_pass_rows_dir(table, specs)
    computed = resumed = 0
    computed_at = start
    plans = iter([plan])

    def build() -> tuple[Transaction | None, tuple[BackfillPlan, list[dict], list[dict]]]:
        nonlocal computed, resumed, computed_at
        p = next(plans, None) or plan_backfill(table, **plan.request)
        if not p.rows:
            return None, (p, [], [])
        extra = {}
        if p.is_view:  # the tasks' rows, with their source rows' identities, in one file
            assert p.plan_rows is not None
            extra = {"plan_path": _job_file(p.checkpoint_dir, f"one-pass-{job_id}.arrow"), "input_uri": p.input_uri,
                     "input_version": p.input_version}
            objects.write_arrow(extra["plan_path"], p.plan_rows)
        nulls = dependent_markers(table, specs, table.dataset(p.read_version))
        shared = json.dumps({
            "specs": [c.to_json() for c in specs], "names": names, "uri": table.uri, "version": p.read_version,
            "predicate": p.predicate, "rows_dir": rows_dir, "checkpoint_seconds": pace, "nulls": nulls, **extra,
        }).encode()
        try:
            outs = [json.loads(o) for o in runner.map(FUSED_TASK, [json.dumps(t) for t in p.one_pass_tasks], shared,
                                                      p.rows, resources=_request(table, specs),
                                                      estimated_seconds=_estimate(p.rows))]
        except UdfError as exc:  # on_error="fail": the failed row is named and recorded, nothing is committed
            _record_failure(table, job_id, exc, p.input_uri, p.input_version)
            raise
        finally:
            if extra:
                objects.remove(extra["plan_path"])
        _same_table(table, table.dataset(), p.read_version, p.read_stamp)
        computed_at = time.perf_counter()
        computed += sum(o["udf_rows"] for o in outs)
        resumed += sum(o["resumed"] for o in outs)
        errors = [e for o in outs for e in o["errors"]]
        _, every = column_field_ids(table.dataset(p.read_version), names + nulls)
        txn = Transaction(
            read_version=p.read_version,
            operation=LanceOperation.Update(
                updated_fragments=[FragmentMetadata.from_json(json.dumps(m)) for o in outs for m in o["fragments"]],
                fields_modified=sorted(every), update_mode="rewrite_columns",
            ),
            transaction_properties={BACKFILL_KEY: json.dumps({
                "job_id": job_id, "columns": plan.columns, "fingerprint": plan.fingerprint,
                "udf_rows_computed": computed, "errors": len(errors), "rows": p.rows,
                "read_version": p.read_version, "targeted": p.targeted, "started_at": started_at,
                "invalidated": nulls,
            })},
        )
        return txn, (p, outs, errors)

    version, (done_plan, outs, errors) = commit_latest(
        table.uri, build, what=f"the backfill of {plan.columns} into {table.name!r}",
        guard=lambda: table.lock(None),  # never between a view refresh's plan and its commit
    )
    if version is None:
        return BackfillResult(job_id, table.name, plan.columns, 0, 0, 0, 0, computed, 0, 0, None,
                              time.perf_counter() - start)
    append_errors(table.layout, table.name, job_id, errors)
    if not plan.targeted:
        objects.remove_tree(rows_dir)  # committed: the checkpointed results are spent
    rows, failed = done_plan.rows, len({e["row_id"] for e in errors})
    done = time.perf_counter()
    return BackfillResult(
        job_id=job_id, table=table.name, columns=plan.columns, rows_planned=rows,
        rows_written=rows - failed, rows_failed=failed, rows_skipped=0, udf_rows_computed=computed,
        batches=len(outs), batches_resumed=0, version=version, seconds=done - start,
        timings={"compute_s": computed_at - start, "commit_s": done - computed_at,
                 "task_s_total": sum(o["seconds"] for o in outs), "tasks": len(outs),
                 "udf_rows_resumed": resumed},
        rows_resumed=resumed,
    )


SQL_BATCH_ROWS = 65_536  # a SQL column's staged batches given no checkpoint_size (DataFusion's work: cheap)


def backfill_column(
    table: Ref,
    column: str | list[str],
    *,
    udf: Any = None,
    where: str | None = None,
    row_ids: list[int] | None = None,
    runner: "Runner",
    checkpoint_size: int | None = None,
    max_rows_per_task: int = 65_536,
    job_id: str | None = None,
    parallelism: int | None = None,
    fragments: list[int] | None = None,
    task_size: int | None = None,
    commit_granularity: int | None = None,
    checkpoint_seconds: float | None = None,
) -> BackfillResult:
    """Plan a backfill of ``column`` (see ``Table.backfill``) with
    :func:`plan_backfill`, the dry run's function, and run that plan
    (:func:`execute_backfill`): one pass or staged, as the plan says. One
    backfill of a column at a time; a second one waits, then finds only what
    is left.

    ``parallelism`` (default: the runner's) sizes the tasks. With
    ``commit_granularity`` N, the fragments holding rows to compute are
    backfilled N at a time, each group committed as it is done (readers see
    the values of finished groups; a backfill killed part way keeps them):
    one job, several commits. ``checkpoint_seconds`` replaces
    ``$MV_ASSETS_CHECKPOINT_SECONDS`` for the one pass."""
    if isinstance(column, list):
        if len(column) != 1:
            raise ValueError("backfill one column at a time (siblings of a multi-column UDF come along)")
        column = column[0]
    if commit_granularity is not None and (
        isinstance(commit_granularity, bool) or not isinstance(commit_granularity, int) or commit_granularity <= 0
    ):
        raise ValueError(f"commit_granularity must be a positive int (fragments per commit), got {commit_granularity!r}")
    if checkpoint_seconds is not None and (
        isinstance(checkpoint_seconds, bool) or not isinstance(checkpoint_seconds, (int, float)) or checkpoint_seconds < 0
    ):
        raise ValueError(f"checkpoint seconds must be a number >= 0, got {checkpoint_seconds!r}")
    group = [] if isinstance(udf, UDF) else _group_specs(table, column)
    key = udf.fingerprint if isinstance(udf, UDF) else group[0].fingerprint
    job_id = job_id or uuid.uuid4().hex[:12]
    args = {"udf": udf, "where": where, "row_ids": row_ids, "checkpoint_size": checkpoint_size,
            "max_rows_per_task": max_rows_per_task, "parallelism": parallelism or runner.parallelism(),
            "task_size": task_size}
    sql = None if udf is not None else next((s for s in group if s.kind == "sql"), None)
    before = table.dataset().version if sql is not None else None
    try:
        with backfill_under_way(table.layout, job_id, table.name, column, _lock_name(table, key)):
            return _backfill_locked(table, column, key, args, runner, job_id, fragments, commit_granularity,
                                    checkpoint_seconds)
    except Exception as exc:  # (as Lance raised it, or wrapped by a Spark task)
        if sql is None or before is None or isinstance(exc, SqlRowsError):
            raise
        named = _sql_rows_error(table, sql, exc, before)
        if named is None:
            raise
        raise named from exc


def _sql_rows_error(table: Ref, spec: ColumnSpec, exc: Exception, before: int) -> SqlRowsError | None:
    """The error of a SQL column's backfill its expression failed on some rows
    (a cast that does not hold for their values): those rows named, and what
    was committed (None: it failed on no row of its own, say a column it reads
    is gone, and Lance's error stands)."""
    bad = sql_rows_failing(table, spec.name, str(spec.expr))
    if not bad:
        return None
    now = table.dataset().version
    written = ("nothing was written" if now == before
               else f"the groups committed before it stand (version {before} -> {now})")
    return SqlRowsError(
        f"SQL column {spec.name!r} of {table.name!r} ({spec.expr}) fails on {len(bad)} row(s) "
        f"(row ids {bad[:10]}{' ...' if len(bad) > 10 else ''}: {short_error(exc)}); {written}. "
        "Change their values or the expression, or leave them out (row_ids= or where=).",
        bad, short_error(exc))


def _lock_name(table: Ref, key: str) -> str:
    """The lock of the backfills of one group of columns (``key``: their UDF's fingerprint)."""
    return f"{table.name}.backfill.{key}"


def _backfill_locked(table: Ref, column: str, key: str, args: dict, runner: "Runner", job_id: str,
                     fragments: list[int] | None, commit_granularity: int | None,
                     checkpoint_seconds: float | None) -> BackfillResult:
    """:func:`backfill_column`'s plan and run, under the column's backfill lock."""
    with table.layout.lock(_lock_name(table, key), None):
        plan = plan_backfill(table, column, fragments=fragments, **args)
        groups = plan_fragments(plan) if commit_granularity is not None else []
        if len(groups) <= (commit_granularity or 0) or commit_granularity is None:
            return _by_fragment(execute_backfill(table, plan, runner, job_id, checkpoint_seconds), plan)
        results = []
        for lo in range(0, len(groups), commit_granularity):
            present = {f.fragment_id for f in table.dataset().get_fragments()}  # (a compaction meanwhile: its
            group = [f for f in groups[lo:lo + commit_granularity] if f in present]  # rows wait for the next one)
            if group:
                part = plan_backfill(table, column, fragments=group, **args)
                try:
                    done = execute_backfill(table, part, runner, job_id, checkpoint_seconds)
                except UdfError as exc:
                    versions = [r.version for r in results if r.version is not None]
                    if versions:  # (the groups before it stand: say so, not "nothing was committed")
                        exc.committed = (f"The {len(versions)} commit(s) of this backfill before it stand (version "
                                         f"{versions[-1]}: {sum(r.rows_written for r in results):,} rows of "
                                         f"{len(groups[:lo])} of its {len(groups)} fragments); the rest was not "
                                         "committed")
                    raise
                results.append(_by_fragment(done, part))
        if plan.one_pass and not plan.targeted:
            objects.remove_tree(_one_pass_rows_dir(table, plan.specs))  # committed: the checkpointed results are spent
        return _combined(results, plan)


def _by_fragment(result: BackfillResult, plan: BackfillPlan) -> BackfillResult:
    """The result with the rows its plan planned by input fragment (none when it committed nothing)."""
    if result.version is not None:
        result.rows_by_fragment = dict(plan.rows_by_fragment)
    return result


def _combined(results: list[BackfillResult], plan: BackfillPlan) -> BackfillResult:
    """One result of a backfill committed in several groups."""
    first = results[0]
    versions = [r.version for r in results if r.version is not None]
    timings: dict[str, float] = {}
    for r in results:
        for k, v in r.timings.items():
            timings[k] = timings.get(k, 0) + v
    timings["commits"] = len(versions)
    return BackfillResult(
        job_id=first.job_id, table=first.table, columns=plan.columns,
        rows_planned=sum(r.rows_planned for r in results), rows_written=sum(r.rows_written for r in results),
        rows_failed=sum(r.rows_failed for r in results), rows_skipped=sum(r.rows_skipped for r in results),
        udf_rows_computed=sum(r.udf_rows_computed for r in results), batches=sum(r.batches for r in results),
        batches_resumed=sum(r.batches_resumed for r in results), version=versions[-1] if versions else None,
        seconds=sum(r.seconds for r in results), timings=timings, rows_resumed=sum(r.rows_resumed for r in results),
        rows_by_fragment={f: n for r in results for f, n in r.rows_by_fragment.items()},
    )


def _request(table: Ref, specs: list) -> ResourceRequest | None:
    """What the compute tasks ask of the runner: the most the columns' UDFs' resource hints ask."""
    return request_of(f"backfill of {table.name!r}",
                      {c.name: resource_hints(c.udf) for c in specs if c.udf is not None})


def _estimate(rows: int) -> float:
    """A backfill's work, as a refresh's before its cost is measured: a runner
    running small work on the driver (SparkRunner.local_below_seconds) starts
    no Spark job for a few rows."""
    return rows * DEFAULT_SECONDS_PER_ROW


def execute_backfill(table: Ref, plan: BackfillPlan, runner: "Runner", job_id: str,
                     checkpoint_seconds: float | None = None) -> BackfillResult:
    """Run the plan: in one pass, or staged (the compute tasks, then errors
    recorded, the results written and committed)."""
    if plan.one_pass:
        return _execute_one_pass(table, plan, runner, job_id, checkpoint_seconds)
    start, started_at = time.perf_counter(), time.time()
    if plan.rows == 0:
        if not plan.targeted:
            CheckpointStore(plan.checkpoint_dir).clear()  # left by a job killed after its commit
        return BackfillResult(job_id, table.name, plan.columns, 0, 0, 0, 0, 0, 0, 0, None,
                              time.perf_counter() - start)
    plan_path = _job_file(plan.checkpoint_dir, f"plan-{job_id}.arrow")
    assert plan.plan_rows is not None  # a plan with rows has its row table
    assert plan.checkpoint_size is not None  # a staged plan has its batch size
    objects.write_arrow(plan_path, plan.plan_rows)
    staged = objects.join(plan.checkpoint_dir, _STAGED)  # a rerun with other arguments resumes these batches
    if not plan.targeted:
        objects.write_text(staged, json.dumps({"checkpoint_size": plan.checkpoint_size}))
    shared = json.dumps({
        "specs": [c.to_json() for c in plan.specs],
        "checkpoint_dir": plan.checkpoint_dir,
        "plan_path": plan_path,
        "input_uri": plan.input_uri,
        "input_version": plan.input_version,
        "is_view": plan.is_view,
    }).encode()
    payloads = []
    n = plan.plan_rows.num_rows
    for lo, hi in plan.task_ranges:
        batches = [
            [plan.batch_keys[b], b * plan.checkpoint_size, min(n, (b + 1) * plan.checkpoint_size)]
            for b in range(lo, hi)
        ]
        payloads.append(json.dumps({"batches": batches}))
    try:
        try:
            outs = [json.loads(o) for o in runner.map(COMPUTE_TASK, payloads, shared,
                                                      plan.rows_to_compute, resources=_request(table, plan.specs),
                                                      estimated_seconds=_estimate(plan.rows_to_compute))]
        except UdfError as exc:  # on_error="fail": the failed row is named and recorded, nothing is committed
            _record_failure(table, job_id, exc, plan.input_uri, plan.input_version)
            raise
        computed_at = time.perf_counter()
        errors = [e for o in outs for e in o["errors"]]
        for e in errors:  # a view's rows are keyed by source row id, a table's by its own
            e["column"] = e.get("column") or plan.columns[0]
        append_errors(table.layout, table.name, job_id, errors)
        stats = {"udf_rows_computed": sum(o["udf_rows"] for o in outs), "errors": len(errors), "started_at": started_at}
        with table.lock(None):  # never between a view refresh's plan and its commit
            version, written, skipped = _commit_results(table, plan, job_id, stats, runner)
    finally:
        objects.remove(plan_path)
    CheckpointStore(plan.checkpoint_dir).remove(plan.batch_keys)  # committed: the checkpoints are spent
    if not plan.targeted:
        objects.remove(staged)
    done = time.perf_counter()
    failed_ids = {e["row_id"] for e in errors}
    return BackfillResult(
        job_id=job_id,
        table=table.name,
        columns=plan.columns,
        rows_planned=plan.rows,
        rows_written=written - len(failed_ids),
        rows_failed=len(failed_ids),
        rows_skipped=skipped,
        udf_rows_computed=stats["udf_rows_computed"],
        batches=plan.batches,
        batches_resumed=sum(o["resumed"] for o in outs),
        version=version,
        seconds=done - start,
        timings={"compute_s": computed_at - start, "commit_s": done - computed_at,
                 "task_s_total": sum(o["seconds"] for o in outs), "tasks": len(outs)},
        rows_resumed=sum(o["rows_resumed"] for o in outs),
    )
