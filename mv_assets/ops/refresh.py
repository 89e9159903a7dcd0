"""Incremental refresh of a materialized view: plan, execute, commit.

1. **Plan** (driver, no Spark): read the view's refresh state (the source
   version it reflects, stored in the properties of the view's last refresh
   commit). Ask the source what changed since then using Lance's row-version
   columns (``_row_last_updated_at_version > v0``, filter pushed down) and its
   change feed (``dataset.delta(...).get_deleted_row_ids()``). Turn that into
   inserts / updates / deletes keyed by stable row id (:mod:`.planning`), and
   cut the rows to compute into tasks per source fragment.
2. **Execute** (Spark executors): each task reads its rows, computes columns
   and UDFs, writes Lance files into the view and returns fragment metadata.
   Finished tasks are checkpointed; a re-run of the same refresh skips them.
3. **Commit** (driver): one Lance ``Update`` transaction removes the old rows
   (deletion vectors), adds the new fragments and records the source version
   in the transaction's properties. Readers see the old view or the new one.
"""

import hashlib
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import lance
import numpy as np
import pyarrow as pa
from lance import LanceOperation, Transaction
from lance.fragment import FragmentMetadata

from mv_assets.execution.resources import request_of_definition
from mv_assets.execution.tasks import TaskResult, TaskSpec, and_filters
from mv_assets.model.definition import (
    READ_FIELDS_METADATA_KEY,
    SOURCE_ROW_ID,
    SOURCE_ROW_VERSION,
    ViewDefinition,
    check_sql,
    column_reads,
    computed_marker,
    foreign_columns,
    read_field_ids,
    short_error,
    source_marker,
    stored_columns,
    tracked_source_columns,
)
from mv_assets.model.errors import ConcurrentRefreshError, UdfError
from mv_assets.model.names import SOURCE_MARKER_PREFIX, Alias
from mv_assets.model.pacing import DEFAULT_SECONDS_PER_ROW, default_target_seconds
from mv_assets.model.planning import (
    ChangeSet,
    History,
    KeyPlan,
    Membership,
    choose_how,
    fit_to_fragments,
    isin,
    pack_pieces,
    pieces_from_rows,
    plan_keys,
    positions,
    shuffle_keys,
    task_rows,
)
from mv_assets.model.planning import column_ids as _ids
from mv_assets.storage import indexes, objects
from mv_assets.storage.changes import (
    BACKFILL_KEY,
    STATE_KEY,
    ForeignWrites,
    backfill_commits,
    column_adding_merges,
    commit_matters,
    commits_since,
    deleted_since,
    foreign_writes,
    fragments_after,
    gone_rows,
    top_fragment,
    versions_before_merges,
    written_fragments,
)
from mv_assets.storage.identity import ensure_table_id, table_id, view_id
from mv_assets.storage.lance_compat import CommitConflictError, delete_offsets, field_ids, take_rows
from mv_assets.storage.refs import ViewRef
from mv_assets.storage.row_ids import require_current_format
from mv_assets.storage.state import RefreshState, read_refresh_state
from mv_assets.storage.versions import dataset_at, versions_phrase

if TYPE_CHECKING:
    from mv_assets.execution.spark import Runner


__all__ = ["RefreshPlan", "RefreshResult", "plan_refresh", "execute_refresh", "compact_if_fragmented", "refresh_job_id"]

MODES = ("auto", "full", "incremental_strict")
_FULL_OPS = ("Overwrite", "Restore", "Clone")
ROW_VERSION_ALIAS = Alias.ROW_VERSION


COMPACT_SMALL_FRAGMENTS = 32
TARGET_ROWS_PER_FRAGMENT = 1 << 20


def compact_if_fragmented(view_ds: lance.LanceDataset) -> bool:
    """Compact the view when refreshes left many small fragments (each refresh
    or Dagster partition run adds at least one). Returns whether it did."""
    if len(view_ds.fragment_ids()) <= COMPACT_SMALL_FRAGMENTS:  # (ids only: no fragment's metadata is built)
        return False
    fragments = view_ds.get_fragments()
    small = sum(1 for f in fragments if f.metadata.physical_rows < TARGET_ROWS_PER_FRAGMENT // 2)
    if small <= COMPACT_SMALL_FRAGMENTS:
        return False
    # Only the small fragments are rewritten: a target of the "small" size keeps
    # Lance from merging them into a large fragment, which rewrote that whole
    # fragment (~0.9M rows) to absorb a few hundred appended ones.
    view_ds.optimize.compact_files(target_rows_per_fragment=TARGET_ROWS_PER_FRAGMENT // 2)
    return True


@dataclass
class RefreshPlan:
    """An exact dry run of a refresh. ``udf_rows`` counts rows each UDF will compute."""

    view: str
    source: str
    from_version: int | None
    to_version: int
    view_version: int
    full: bool
    reason: str
    rows_to_insert: int
    rows_to_update: int
    rows_to_delete: int
    udf_rows: dict[str, int]
    tasks: list[TaskSpec] = field(default_factory=list, repr=False)
    keys: KeyPlan = field(default_factory=KeyPlan, repr=False)
    view_key_addrs: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    checkpoint_dir: str | None = field(default=None, repr=False)
    definition_raw: bytes = field(default=b"", repr=False)
    load_number: int = field(default=0, repr=False)
    scope: list[int] | None = None
    scoped_since_whole: bool = field(default=False, repr=False)
    # the range of source versions of the scoped refreshes since the last whole one (RefreshState)
    scoped_versions: tuple[int, int] | None = field(default=None, repr=False)
    seconds_per_row: float | None = field(default=None, repr=False)  # measured by the last refresh
    source_id: str | None = field(default=None, repr=False)  # the source's identity (storage.identity); None: unstamped
    repaired: bool = False  # another tool wrote into the view since its last refresh: this refresh repairs it
    # rows_to_insert is an upper bound (the source rows of the pieces, before the
    # filter): the refresh counts the rows its tasks write (plan_refresh(exact=False))
    counted_by_tasks: bool = field(default=False, repr=False)
    read_fields: dict[str, int] | None = field(default=None, repr=False)  # field ids of the columns it reads
    # the largest fragment id of the source at to_version: the next refresh finds the
    # fragments appended since without checking that version out again
    source_top_fragment: int | None = field(default=None, repr=False)
    # what a view kind's planner adds (aggregate views: groups, groups_recomputed, source_rows_read)
    details: dict = field(default_factory=dict)
    # called with the view as committed, in the process that commits (a join view: its arrangement brought there)
    after_commit: "Callable[[lance.LanceDataset], None] | None" = field(default=None, repr=False, compare=False)
    # the manifest of the view's version view_version as stored when planned: a view dropped and
    # made again up to the same version has another (its commit is refused: objects.version_signature)
    view_stamp: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def is_noop(self) -> bool:
        """True when the refresh would only record the new source version."""
        return not (self.rows_to_insert or self.rows_to_update or self.rows_to_delete)

    @property
    def commits_nothing(self) -> bool:
        """True when executing the plan writes nothing at all: no rows to change and
        no new state to record (a fragment-scoped refresh never records the
        whole-view source version)."""
        if not self.is_noop or self.full or self.repaired or self.details.get("sources_moved"):
            return False  # (a join view's other sources moved: their versions are recorded)
        return self.scope is not None or (self.from_version == self.to_version and not self.scoped_since_whole)

    # -- Geneva's names for a plan (RefreshPlan) ------------------------------
    @property
    def has_work(self) -> bool:
        """Whether the refresh would change rows of the view (not only record the new source version)."""
        return not self.is_noop or bool(self.tasks)

    @property
    def total_rows_pending(self) -> int:
        """Rows the refresh would insert, update or delete in the view, and
        rows it would recompute (``recompute=``)."""
        # (copied rows, and rows read again with their UDF values kept: counted as updates)
        recomputed = sum(t.rows for t in self.tasks if t.recompute and set(t.recompute) & set(self.udf_rows))
        return self.rows_to_insert + self.rows_to_update + self.rows_to_delete + recomputed

    @property
    def total_tasks(self) -> int:
        return len(self.tasks)

    def summary(self) -> dict:
        return {
            "view": self.view,
            "source": self.source,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "full": self.full,
            "reason": self.reason,
            "rows_to_insert": self.rows_to_insert,
            "rows_to_update": self.rows_to_update,
            "rows_to_delete": self.rows_to_delete,
            "udf_rows": dict(self.udf_rows),
            "tasks": len(self.tasks),
            "scope": self.scope,
        }


@dataclass
class RefreshResult:
    """What a refresh did. ``udf_rows_computed`` is counted by the executors."""

    view: str
    from_version: int | None
    to_version: int
    view_version: int
    full: bool
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    udf_rows_computed: dict[str, int]
    tasks: int
    tasks_resumed: int
    seconds: float
    runner: str
    timings: dict[str, float] = field(default_factory=dict)
    rows_by_fragment: dict[int, int] = field(default_factory=dict)  # rows computed, by source fragment
    # rows whose UDF results came from checkpoints of an interrupted earlier run
    # (finished tasks and row batches alike); computed + resumed = planned
    udf_rows_resumed: dict[str, int] = field(default_factory=dict)
    # the view's indexes brought up to date after the commit (storage.indexes):
    # {"updated": [...], "rebuilt": [...], "failed": {name: why}}; empty: none needed it
    indexes: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)  # the plan's details (RefreshPlan.details)
    job_id: str = ""  # recorded with the commit (db.list_jobs())
    # a join view's incremental refresh: the first table's fragments (its partitions) holding rows
    # whose view rows it wrote or removed, or whose rows changed; None: not known (any may have)
    first_fragments: list[int] | None = None
    first: bool = False  # the view's first refresh (it had never been refreshed, in whole or in part)

    @property
    def status(self) -> str:
        """Geneva's job status of a result: a refresh that returned is ``"DONE"``
        (rows a UDF skipped under ``on_error="skip"`` included, as in Geneva)."""
        return "DONE"

    def summary(self) -> dict:
        return dict(self.__dict__)

    def since(self) -> str:
        """Which source versions the refresh went between, in words (never "vNone")."""
        if self.from_version is not None:
            return f"source v{self.from_version} -> v{self.to_version}"
        # (a view refreshed only by fragments so far reflects no whole version yet)
        return f"first refresh, at source v{self.to_version}" if self.first else f"at source v{self.to_version}"

    def nothing_done(self) -> str | None:
        """The line saying the refresh changed nothing, or None when it did something."""
        if self.tasks or self.rows_inserted or self.rows_updated or self.rows_deleted:
            return None
        if self.from_version == self.to_version:
            return f"{self.view}: nothing to refresh: it reflects source v{self.to_version} already"
        if self.from_version is None:
            return f"{self.view}: nothing to compute at source v{self.to_version}"
        return f"{self.view}: source v{self.from_version} -> v{self.to_version} changed nothing it reads: nothing computed"

    def told(self, kind: str, seconds: float) -> str:
        """The run log's line of the refresh of a view of ``kind`` (its rows
        counted as parents, partitions or groups where they are), that took
        ``seconds``: in process and through Pipes alike."""
        nothing = self.nothing_done()
        if nothing is not None:
            return nothing
        counted = {"chunker": "parents", "udtf": "partitions", "aggregate": "groups",
                   "join_aggregate": "groups"}.get(kind, "rows")
        calls = {"chunker": "chunker calls", "udtf": "UDTF calls"}.get(kind, "UDF rows computed")
        computed = ", ".join(f"{name} {n:,}" for name, n in self.udf_rows_computed.items()) or "none"
        resumed = sum((self.udf_rows_resumed or {}).values())
        tasks = f"{self.tasks} task{'s' if self.tasks != 1 else ''}"
        if self.tasks_resumed:
            tasks += f" ({self.tasks_resumed} resumed from checkpoints)"
        return (f"{self.view}: {self.since()}: {counted} +{self.rows_inserted:,} ~{self.rows_updated:,} "
                f"-{self.rows_deleted:,}, {calls}: {computed}"
                + (f", {resumed:,} UDF rows from checkpoints" if resumed else "")
                + f"; {tasks} on {self.runner} in {seconds:.2f}s")


def _in_list(ids: np.ndarray) -> str:
    return ", ".join(str(int(i)) for i in ids)


def read_history(src: lance.LanceDataset, v0: int, v1: int, appends_need_no_base: bool = False) -> History:
    """One pass over the source's commits between the reflected version ``v0``
    and the target ``v1``: the first commit after which row ids no longer mean
    the same rows (Overwrite, Restore, Clone), and the newest version whose
    commit a history cleanup removed.

    Stable row ids and row versions survive cleanup: a removed commit only
    means the change feed cannot be read (see :func:`choose_how`).
    ``appends_need_no_base``: when every commit after ``v0`` is an Append, the
    refresh reads nothing of version ``v0`` (the view recorded the source's
    largest fragment id then), so whether ``v0`` was cleaned up is not read."""
    breaks, cleaned, appends, restores_only = None, None, v1 > v0, True
    lo, hi = min(v0, v1), max(v0, v1)
    for v in range(hi, lo, -1):  # newest first: the newest removed commit is found first
        try:
            txn = objects.read_transaction(src, v)
        except Exception:
            cleaned = cleaned or v
            appends = False
            continue
        op = type(txn.operation).__name__ if txn is not None else None
        appends = appends and op == "Append"
        if op in _FULL_OPS:
            breaks = f"source version {v} is an {op}"  # (the last assigned is the first commit)
            restores_only = restores_only and op == "Restore"
    if cleaned is None and lo >= 1 and not (appends and appends_need_no_base):
        try:
            objects.read_transaction(src, lo)
        except Exception:
            cleaned = lo
    return History(breaks_row_ids=breaks, cleaned_up_at=cleaned, restores_only=breaks is not None and restores_only)


def _scan(
    src: lance.LanceDataset,
    filter_sql: str | None,
    fragments: list | None = None,
    with_version: bool = True,
    markers: list[str] | None = None,
    in_order: bool | None = None,
) -> pa.Table:
    """Row ids, addresses (and row versions, and computed markers) of source
    rows matching a filter (``in_order``: in fragment and address order)."""
    columns: dict | list = {ROW_VERSION_ALIAS: "_row_last_updated_at_version"} if with_version else {}
    for m in markers or []:
        columns[source_marker(m)] = f"`{computed_marker(m)}`"
    return src.scanner(
        columns=columns or [], filter=filter_sql, with_row_id=True, with_row_address=True, fragments=fragments,
        scan_in_order=in_order,
    ).to_table()


def _no_rows(markers: list[str]) -> pa.Table:
    """What :func:`_scan` returns when no row matches (no scan made)."""
    fields = [pa.field(ROW_VERSION_ALIAS, pa.uint64()), *(pa.field(source_marker(m), pa.string()) for m in markers),
              pa.field("_rowid", pa.uint64()), pa.field("_rowaddr", pa.uint64())]
    return pa.schema(fields).empty_table()


def _recomputed_since(src: lance.LanceDataset, src_uri: str, v0: int, v1: int,
                      chained: list[str]) -> dict[str, np.ndarray]:
    """Per computed column computed from another (``chained``), ids of rows a
    backfill in (v0, v1] wrote its values of (:func:`_written_by_backfills`);
    none where the history cannot be read (the refresh is then full when such
    columns are read: :func:`_chained_reads`)."""
    try:
        return _written_by_backfills(src_uri, backfill_commits(src, v0, v1, chained), chained)
    except (RuntimeError, ValueError, OSError):
        return {}


def _written_by_backfills(src_uri: str, backfills: list, tracked: list[str]) -> dict[str, np.ndarray]:
    """Per ``tracked`` computed column, ids of rows one of ``backfills``
    (``(version, transaction)``) wrote its values of: its marker differs from
    the version before that backfill (set, or set again after a backfill of
    its inputs cleared it). Their values changed with no row version moved,
    whatever the markers are at both ends of the range: a marker cleared,
    set and cleared again reads the same there (z = f(y): y, z, then y again
    backfilled) while the values moved."""
    out: dict[str, list[np.ndarray]] = {}
    for version, txn in backfills:
        written = json.loads(txn.transaction_properties[BACKFILL_KEY]).get("columns") or []
        for column in (c for c in written if c in tracked):
            out.setdefault(column, []).append(_marker_changes(src_uri, version - 1, version, [column]))
    return {c: np.unique(np.concatenate(parts)) for c, parts in out.items()}


def _union(parts) -> np.ndarray:
    parts = [p for p in parts if len(p)]
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)


def _chained_reads(definition: ViewDefinition, src: lance.LanceDataset) -> list[str]:
    """Computed columns of the source the view reads that are computed from
    other computed columns: a backfill of their input sets them stale, and
    their own backfill then writes new values with the markers they had (only
    the source's history shows it)."""
    reads = set(definition.computed_reads(src.schema))
    specs = stored_columns(src.schema) if reads else []
    computed = sorted(c.name for c in specs)
    return [c.name for c in specs
            if c.name in reads and column_reads(c, [n for n in computed if n != c.name], src.schema.names)]


def _marker_changes(src_uri: str, v0: int, v1: int, markers: list[str]) -> np.ndarray:
    """Ids of rows whose computed markers differ between source versions v0 and v1."""
    def read(v: int) -> tuple[np.ndarray, list[np.ndarray]]:
        t = objects.dataset(src_uri, version=v).scanner(
            columns={f"m{i}": f"`{computed_marker(m)}`" for i, m in enumerate(markers)}, with_row_id=True
        ).to_table()
        cols = []
        for i in range(len(markers)):
            col = t.column(f"m{i}") if f"m{i}" in t.column_names else pa.nulls(t.num_rows, pa.string())
            cols.append(np.asarray(col.fill_null("").to_pylist(), dtype=object))
        return _ids(t), cols

    ids1, m1 = read(v1)
    changed = np.zeros(len(ids1), dtype=bool)
    ids0, m0 = read(v0)
    pos = positions(ids1, ids0)
    found = pos >= 0
    for a, b in zip(m1, m0, strict=True):
        changed[found] |= a[found] != b[pos[found]]
    return ids1[changed]


def _check_args(mode: str, max_rows_per_task: int | None, checkpoint_size: int | None) -> None:
    if mode not in MODES:
        raise ValueError(f"refresh mode must be one of {MODES}, got {mode!r}")
    if max_rows_per_task is not None and (not isinstance(max_rows_per_task, int) or max_rows_per_task <= 0):
        raise ValueError("max_rows_per_task must be a positive int (or None: sized automatically)")
    if checkpoint_size is not None and (not isinstance(checkpoint_size, int) or checkpoint_size <= 0):
        raise ValueError("checkpoint_size must be a positive int (or None: checkpoints sized by time)")


def _source_at(view_name: str, definition: ViewDefinition, src_latest: lance.LanceDataset, src_version: int | None):
    """The source dataset at the target version, checked: in range, with the
    columns the view reads, with stable row ids."""
    if src_version is None:
        src_version = src_latest.version
    if isinstance(src_version, bool) or not isinstance(src_version, int) or not 1 <= src_version <= src_latest.version:
        raise ValueError(
            f"src_version must be {versions_phrase(src_latest)} (versions of {definition.source!r} that exist), "
            f"got {src_version!r}"
        )
    src = dataset_at(src_latest.uri, definition.source, src_version, src_latest)  # a cleaned-up version: said so
    if src is not src_latest:
        missing = [c for c in definition.reads(src_latest.schema.names, src_latest.schema) if c not in src.schema.names]
        if missing:
            raise ValueError(
                f"version {src_version} of {definition.source!r} has no column {', '.join(map(repr, missing))}, "
                f"which view {view_name!r} reads (added at a later version); refresh to a version that has it"
            )
    if not src.has_stable_row_ids:
        raise ValueError(f"source {definition.source!r} was not created with stable row ids")
    return src


def _scope(view_name: str, definition: ViewDefinition, src: lance.LanceDataset, fragments, recompute):
    """The fragment scope (None: the whole source) and its fragments; checks ``recompute``."""
    scope: list[int] | None = None
    scope_frags = None
    if fragments is not None:
        if definition.limit is not None:
            raise ValueError(f"view {view_name!r} has a limit: it refreshes as a whole, not by fragment")
        existing = src.fragment_ids()  # (ids only: no object made for each of thousands of fragments)
        scope = sorted({int(f) for f in fragments})
        scope_frags = [src.get_fragment(f) for f in scope if f in existing]
        if len(scope_frags) == len(existing):  # covers the whole source: a whole-view refresh
            scope, scope_frags = None, None
    udf_names = [c.name for c in definition.udf_columns]
    if recompute is not None:
        unknown = [c for c in recompute if c not in udf_names]
        if unknown or not recompute:
            raise ValueError(f"recompute takes UDF columns of {view_name!r} ({udf_names}), got {recompute!r}")
        if definition.limit is not None:
            raise ValueError(f"view {view_name!r} has a limit: recompute it with mode='full'")
    return scope, scope_frags


def plan_refresh(
    view: ViewRef,
    src_version: int | None = None,
    *,
    mode: str = "auto",
    fragments: list[int] | None = None,
    recompute: list[str] | None = None,
    max_rows_per_task: int | None = None,
    checkpoint_size: int | None = None,
    parallelism: int = 1,
    exact: bool = True,
) -> RefreshPlan:
    """Plan a refresh of ``view`` to source version ``src_version`` (default latest).

    ``fragments`` scopes the refresh to rows currently in those source
    fragments (a Dagster partition each); deletions of source rows are always
    applied in full, as they are cheap and never wrong.

    ``recompute`` names UDF columns to compute again for rows the view already
    holds at their current version (say after the UDF's code changed); their
    other columns are copied, not recomputed. Changed rows are refreshed as usual.

    ``max_rows_per_task`` None sizes tasks from the rows to compute, the
    view's measured cost per row and the runner's ``parallelism``
    (:func:`planning.task_rows`).

    ``exact=False`` (what a refresh asks; a dry run is exact): rows only
    inserted (a first refresh, rows only appended) all in one fragment that
    fits one task are planned from its metadata, without reading which pass
    the filter (the same task an exact plan makes); the task evaluates it and
    the refresh counts what it wrote (``counted_by_tasks``).
    """
    _check_args(mode, max_rows_per_task, checkpoint_size)
    definition: ViewDefinition = view.definition
    src_latest = _open_source(view)
    view_ds = view.dataset()
    state = read_refresh_state(view_ds)
    source_id = table_id(src_latest, state.source_id)
    if _unmoved(definition, src_latest, view_ds, state, source_id, src_version=src_version, mode=mode,
                fragments=fragments, recompute=recompute):
        return _already_current(view, src_latest.version, view_ds.version, state, source_id=source_id)
    read_fields = read_field_ids(definition, src_latest)
    replaced = _replacement(view, state, source_id, read_fields, mode)
    if replaced is not None:
        fragments = recompute = None  # nothing the view holds matches the new table: the whole view is rebuilt
    # rows written into the view by another tool since its last refresh: repaired over the whole view
    changed_columns = foreign_columns(definition, view_ds.schema.names)
    if changed_columns is not None:
        raise ValueError(f"cannot refresh view {view.name!r}: {changed_columns}, which its refreshes cannot write; "
                         "nothing was written. Undo it (restore the view's dataset to the version before), or drop "
                         "the view and create it again (add a column to a view with its add_columns)")
    foreign = foreign_writes(view_ds, state.view_version)
    tainted = None
    if foreign is not None:
        fragments = None
        tainted = _tainted_keys(view_ds, foreign.since) if not foreign.replaced else None
    src = _source_at(view.name, definition, src_latest, src_version)
    _check_reads(view.name, definition, src, state.read_fields or _created_reading(view_ds))
    scope, scope_frags = _scope(view.name, definition, src, fragments, recompute)
    v0 = state.source_version
    def_fp = definition.shape_fingerprint()
    how, reason = _how(view.name, definition, src, state, def_fp, mode=mode, scope=scope, recompute=recompute,
                       replaced=replaced, foreign=foreign)
    # The source's commits since v0, read once (versions only, never rows)
    commits = (commits_since(src, v0) if how == "incremental" and scope is None and recompute is None
               and v0 is not None and v0 <= src.version else None)
    reads = definition.computed_reads(src.schema)
    if commits is not None and _nothing_read_changed(commits, reads, state):
        return _already_current(view, src.version, view_ds.version, state, source_id=source_id,
                                read_fields=read_fields, source_top_fragment=top_fragment(src))
    def place(rows_to_compute: int, largest_fragment: int = 0) -> _TaskPlace:
        per_task = max_rows_per_task or fit_to_fragments(
            task_rows(rows_to_compute, state.seconds_per_row, parallelism), largest_fragment
        )
        return _place(view, src, view_ds, f"{v0}|{def_fp}|{how}|{scope}|{recompute}", per_task,
                      checkpoint_size, balanced=max_rows_per_task is None)

    appended = _appended_since(src, v0, commits, reads, state, definition) if commits is not None else None
    moved = written_fragments(src, v0, commits) if commits is not None and appended is None else None
    # Merges that only added columns (another tool's add_columns): the rows they moved are copied, not computed
    merges = (column_adding_merges(src, v0, commits if commits is not None else commits_since(src, v0) or [])
              if how in ("incremental", "sync") and appended is None and recompute is None and v0 is not None
              and v0 < src.version else [])
    work = _plan_work(place, src, view_ds, definition, how, v0, scope, scope_frags, recompute, appended, tainted,
                      moved, exact, scoped=state.scoped_since_whole,
                      only_new=appended is not None and _only_new_rows(commits), merges=merges)
    plan = _refresh_plan(view.name, definition, src, view_ds, state, how, reason, scope, work, source_id=source_id,
                         repaired=foreign is not None, read_fields=read_fields)
    if source_id is not None and table_id(src_latest) is None:  # (restored from before its stamp: stamped again)
        plan.details["source_unstamped"] = True
    return plan


def _unmoved(definition: ViewDefinition, src: lance.LanceDataset, view_ds: lance.LanceDataset, state: RefreshState,
             source_id: str | None, *, src_version: int | None, mode: str, fragments: list[int] | None,
             recompute: list[str] | None) -> bool:
    """Neither the source nor the view committed anything since the view's
    last whole refresh, which reflected the source's latest version, of the
    same table and definition: nothing can have changed (what the full plan
    finds too, after reading the history, the view's writers and the columns
    it reads: a no-change refresh skips them). Anything else, or a refresh
    that asks for more (a version, a mode, fragments, recompute), plans in full."""
    return (src_version is None and mode != "full" and fragments is None and recompute is None
            and state.source_version is not None and state.source_version == src.version
            and state.view_version == view_ds.version and not state.scoped_since_whole
            and state.source_id is not None and state.source_id == source_id
            and state.definition == definition.shape_fingerprint())


def _how(view_name: str, definition: ViewDefinition, src: lance.LanceDataset, state: RefreshState, def_fp: str, *,
         mode: str, scope: list[int] | None, recompute: list[str] | None, replaced: str | None,
         foreign: ForeignWrites | None) -> tuple[str, str]:
    """How the refresh goes (full, sync or incremental: :func:`choose_how`) and
    why, from the source's history since the reflected version; a full refresh
    where ``mode="incremental_strict"`` asks otherwise is an error."""
    v0 = state.source_version
    # (a source that has not moved has no commits to read: a no-change refresh reads none)
    history = (read_history(src, v0, src.version, appends_need_no_base=_top_fragment_known(state, definition))
               if v0 is not None and replaced is None and v0 != src.version else History())
    how, reason = choose_how(
        mode=mode, definition_changed=state.definition not in (None, def_fp), v0=v0, target=src.version,
        scope=scope, recompute=recompute, scoped_since_whole=state.scoped_since_whole, history=history,
        source_replaced=replaced, view_written=(foreign.replaced, foreign.describe()) if foreign else None,
        scoped_versions=state.scoped_versions,  # (_plan_work takes the rows they wrote into account)
    )
    if (how == "full" and history.restores_only and reason == history.breaks_row_ids and scope is None
            and recompute is None):
        # the restored rows carry the ids and row versions they had: every row is compared and only
        # those the view does not hold at their version are computed (as after a refresh back to an
        # older version), not every row again
        how, reason = "sync", f"{reason}: comparing row versions"
    if how == "sync" and history.cleaned_up_at is not None and v0 is not None:
        chained = _chained_reads(definition, src)
        if chained:  # (their recomputed values carry the markers they had: only the history showed them)
            how, reason = "full", (f"the source's history up to version {history.cleaned_up_at} was cleaned up and "
                                   f"the view reads {', '.join(map(repr, chained))}, computed from computed columns: "
                                   "rebuilt")
    if how == "full" and mode == "incremental_strict" and v0 is not None:
        raise ValueError(f"refresh of {view_name!r} cannot be incremental: {reason}")
    return how, reason


def _refresh_plan(view_name: str, definition: ViewDefinition, src: lance.LanceDataset, view_ds: lance.LanceDataset,
                  state: RefreshState, how: str, reason: str, scope: list[int] | None, work: tuple, *,
                  source_id: str | None, repaired: bool, read_fields: dict[str, int]) -> RefreshPlan:
    """The plan of the ``work`` :func:`_plan_work` found (what it returns);
    every UDF counts the rows of the tasks that compute whole rows."""
    where, tasks, keys, n_insert, udf_rows, vk, counted = work
    if len(tasks) == 1:  # (no task checkpoint when it is quick: TaskSpec.only_task)
        tasks[0].only_task = True
    for name in (c.name for c in definition.udf_columns):
        udf_rows[name] = udf_rows.get(name, 0) + int(sum(t.rows for t in tasks if t.recompute is None))
    return RefreshPlan(
        view=view_name, source=definition.source, from_version=state.source_version, to_version=src.version,
        view_version=view_ds.version, full=how == "full", reason=reason, rows_to_insert=n_insert,
        rows_to_update=int(len(keys.update)), rows_to_delete=int(len(keys.delete)), udf_rows=udf_rows,
        tasks=tasks, keys=keys, view_key_addrs=(_ids(vk, SOURCE_ROW_ID), _ids(vk, "_rowaddr")) if vk is not None else None,
        checkpoint_dir=where.checkpoint_dir, definition_raw=definition.encode(), load_number=state.load_number,
        scope=scope, scoped_since_whole=state.scoped_since_whole, scoped_versions=state.scoped_versions,
        seconds_per_row=state.seconds_per_row,
        source_id=source_id, repaired=repaired, read_fields=read_fields, counted_by_tasks=counted,
        source_top_fragment=top_fragment(src),
    )


def _plan_work(place, src: lance.LanceDataset, view_ds: lance.LanceDataset, definition: ViewDefinition,
               how: str, v0: int | None, scope, scope_frags, recompute, appended: list | None,
               tainted: np.ndarray | None = None, moved: list | None = None, exact: bool = True,
               scoped: bool = False, only_new: bool = False, merges: list[int] | None = None):
    """The tasks of a refresh and its row-level outcome: rows only appended since
    ``v0`` (in the fragments ``appended``) or a first refresh are all inserts
    (the view's keys are not read); otherwise the changes are found against the
    view's keys. ``scoped``: fragment-scoped refreshes since the last whole
    one may have written rows the change feed since ``v0`` names (see
    :func:`_changed_rows`). ``only_new``: ``appended`` holds no row older
    than ``v0`` (:func:`_only_new_rows`): their rows are not filtered by version."""
    # Computed columns of the source the view reads: their markers are compared too.
    tracked = tracked_source_columns(view_ds.schema)
    # After deletes alone (``moved == []``) no source row is compared with the view's:
    # only the keys and addresses of the rows to remove are needed.
    deletes_only = how == "incremental" and moved is not None and not moved and not tracked
    # A full refresh of the whole view replaces every row it holds: only its keys count.
    rebuild = (how == "full" and scope is None and recompute is None and definition.limit is None
               and not definition.shuffle)
    # An incremental refresh starts from a view that reflects exactly ``v0``: every row it
    # holds is at a version <= v0, so no changed row (version > v0) can be current in it and
    # the view's row versions are not read (900k view rows: their keys and versions read in
    # ~9 ms, their keys alone in ~4).
    # Computed source columns' markers are compared with versions: then they are read.
    # (After fragment-scoped refreshes a changed row may be current in the view: versions are read.)
    ids_only = deletes_only or rebuild or (how == "incremental" and not tracked and not scoped)
    key_columns = [SOURCE_ROW_ID] if ids_only else [SOURCE_ROW_ID, SOURCE_ROW_VERSION,
                                                    *(source_marker(m) for m in tracked)]
    vk: "pa.Table | ViewKeys | None" = None
    # A fragment-scoped refresh finds the view's rows deleted anywhere from the change feed
    # since the whole view's version (None: not readable; then every row id is compared).
    # (A full refresh of some fragments, after its definition changed or row ids were broken, does not.)
    feed = (deleted_since(src, v0) if scope is not None and how == "sync" and appended is None
            and definition.limit is None else None)
    if appended is None and (how == "incremental" or feed is not None) and definition.limit is None:
        # Only view rows whose source row changed (or is in scope) matter: the view's keys are
        # streamed and those are kept (memory O(changed rows), not O(view rows)): see _changed_rows.
        vk = ViewKeys(view_ds, key_columns)
    elif appended is None:
        vk = view_ds.to_table(columns=key_columns, with_row_address=True)
    counted = False  # inserts planned from fragment metadata (not exact): the tasks count them
    if appended is not None:
        # Rows only appended since v0: they are the inserts, the view's keys are not read.
        where, tasks, counted = _insert_tasks(
            place, src, appended, and_filters(None if only_new else f"_row_created_at_version > {v0}",
                                              definition.filter), exact)
        keys, n_insert, udf_rows = KeyPlan(), int(sum(t.rows for t in tasks)), {}
    elif (how != "incremental" and vk is not None and not isinstance(vk, ViewKeys) and vk.num_rows == 0
          and definition.limit is None and recompute is None):
        # Into an empty view (a first refresh): every passing row is an insert.
        frags = scope_frags if scope_frags is not None else src.get_fragments()
        where, tasks, counted = _insert_tasks(place, src, frags, definition.filter, exact)
        keys, n_insert, udf_rows = KeyPlan(), int(sum(t.rows for t in tasks)), {}
    elif rebuild and vk is not None:
        # A rebuild: every passing row computed from whole fragments (as into an empty
        # view: address ranges, not scattered ids), every row the view holds removed.
        # The key plan only counts (nothing is deleted row by row): dense-id bitmaps, no sort.
        # (the passing rows' ids and addresses in one scan: the tasks' pieces from the addresses, the counts
        # from the ids; two scans of the source with the filter before, ~15% of a full refresh at 1M)
        passing = _scan(src, definition.filter, with_version=False, in_order=True)
        where, tasks, _ = _insert_tasks(place, src, src.get_fragments(), definition.filter,
                                        addresses=passing.column("_rowaddr").to_numpy())
        held = _ids(vk, SOURCE_ROW_ID)
        pass_ids = _ids(passing)
        in_view = isin(pass_ids, held)
        gone = held[~isin(held, pass_ids)]
        keys = KeyPlan(pass_ids[~in_view], pass_ids[in_view], np.unique(gone))
        n_insert, udf_rows = int(len(keys.insert)), {}
    else:
        assert vk is not None
        keys, rows, current_rows, vk, within, reread_rows = _changed_rows(
            src, src.uri, definition, how, v0, src.version, scope, scope_frags, vk, tracked, recompute, tainted, moved,
            view_ds if scoped else None, feed, merges,
        )
        where = place(rows.num_rows + current_rows.num_rows + reread_rows.num_rows)
        tasks, udf_rows = _tasks_for(where, rows, current_rows, recompute, within)
        if reread_rows.num_rows:  # their UDF values kept, every other column read again
            tasks += where.tasks(pieces_from_rows(_ids(reread_rows, "_rowaddr"), _ids(reread_rows),
                                                  where.max_rows_per_task, within),
                                 recompute=_reread_columns(definition, view_ds.schema))
        n_insert = int(len(keys.insert))
    return where, tasks, keys, n_insert, udf_rows, vk, counted


def _insert_tasks(place, src: lance.LanceDataset, fragments: list, filter_sql: str | None, exact: bool = True,
                  addresses: np.ndarray | None = None):
    """Tasks computing every row of ``fragments`` passing ``filter_sql``, all
    inserts: planned while streaming the source's addresses, never holding its
    ids; and whether they were planned from metadata (not ``exact``: one
    fragment that fits one task, its count an upper bound). ``addresses``:
    those of the passing rows, already read in order (not scanned again)."""
    sizes = [f.count_rows() for f in fragments]
    where = place(sum(sizes), max(sizes, default=0))  # before the filter: an upper bound
    lazy = not exact and len(fragments) == 1 and fragments[0].metadata.physical_rows <= where.max_rows_per_task
    pieces = _pieces_into_empty_view(src, fragments, filter_sql, where.max_rows_per_task, lazy, addresses)
    return where, where.tasks(pieces), lazy


def _appended_since(src: lance.LanceDataset, v0: int | None, commits: list, reads: list[str], state,
                   definition) -> list | None:
    """When every source commit after ``v0`` (``commits``) that matters to the
    view is an Append (no row updated or deleted, no column it reads
    backfilled), the fragments that can hold the new rows; else None.

    Views with a limit or a shuffle place rows globally, and fragment-scoped
    refreshes since the last whole one may have inserted some of the rows
    already: those take the general path."""
    if v0 is None or not commits or state.scoped_since_whole or definition.limit is not None or definition.shuffle:
        return None
    if any(commit_matters(txn, reads) and type(txn.operation).__name__ != "Append" for txn in commits):
        return None
    if _top_fragment_known(state, definition):  # recorded by the last refresh
        # (by id: no object made for each of the source's fragments, only for the new ones: ~2 us
        # a fragment, 0.3 ms at 150)
        return [src.get_fragment(fid) for fid in src.fragment_ids() if fid > state.source_top_fragment]
    return fragments_after(src, v0)


# Commits that add no fragment holding rows created before them: an Append's
# fragments hold its own new rows only; the others add no fragment. (A
# compaction, Rewrite, moves older rows into new fragments; an Update too.)
_ONLY_NEW_ROWS_OPERATIONS = frozenset({"Append", "CreateIndex", "UpdateConfig"})


def _only_new_rows(commits: list | None) -> bool:
    """Whether every source commit since the view's version (``commits``) is
    one of :data:`_ONLY_NEW_ROWS_OPERATIONS`: then the fragments written since
    hold only rows created since, and their scan needs no
    ``_row_created_at_version`` filter (~0.2 ms of a 10-row refresh's scan: the
    row version metadata read and compared)."""
    return bool(commits) and all(txn is not None and type(txn.operation).__name__ in _ONLY_NEW_ROWS_OPERATIONS
                                 for txn in commits)


def _top_fragment_known(state, definition) -> bool:
    """Whether rows only appended since the last refresh are found from the
    source's largest fragment id it recorded, reading nothing of the version
    it reflects (see :func:`_appended_since`)."""
    return (state.source_top_fragment is not None and not state.scoped_since_whole and definition.limit is None
            and not definition.shuffle)


def _columns_replaced(view: ViewRef, state, read_fields: dict[str, int]) -> str | None:
    """Why the values of columns the view reads may have changed with no row
    version moving: a column dropped and added again (another tool's
    ``drop_columns`` + ``add_columns``) has a new field id."""
    if not state.read_fields:
        return None
    changed = sorted(n for n, i in state.read_fields.items() if n in read_fields and read_fields[n] != i)
    if not changed:
        return None
    return (f"column{'s' if len(changed) > 1 else ''} {', '.join(map(repr, changed))} of {view.source!r} "
            f"{'were' if len(changed) > 1 else 'was'} dropped and added again since the last refresh (new values, no row "
            "versions moved): the view is rebuilt")


def _tainted_keys(view_ds: lance.LanceDataset, since: int) -> np.ndarray:
    """Source row ids of view rows another tool appended or rewrote after the
    view's last refresh at version ``since``: every later commit of ours keeps
    row versions (backfills, compaction), so a row created or updated after it
    was written by someone else. Those keys are removed and computed again."""
    cols = {"c": "_row_created_at_version", "u": "_row_last_updated_at_version", SOURCE_ROW_ID: SOURCE_ROW_ID}
    flt = f"_row_created_at_version > {int(since)} OR _row_last_updated_at_version > {int(since)}"
    return np.unique(_ids(view_ds.to_table(columns=cols, filter=flt), SOURCE_ROW_ID))


_NO_FIELD = re.compile(r"No field named [`'\"]?([^\s.`'\"]+)")


def _created_reading(view_ds: lance.LanceDataset) -> dict[str, int] | None:
    """The source columns the view read when it was created (by field id)."""
    raw = (view_ds.schema.metadata or {}).get(READ_FIELDS_METADATA_KEY.encode())
    return json.loads(raw) if raw else None


def _check_reads(view_name: str, definition: ViewDefinition, src: lance.LanceDataset,
                 known: dict[str, int] | None) -> None:
    """The view's query runs on the source at the target version: every column
    it reads is there (another tool may have dropped one). Refused here, before
    anything is written or recorded. ``known``: the columns it read at its last
    refresh (or creation); without them (views made before they were recorded)
    Lance plans the query (no row is read)."""
    names = src.schema.names
    missing = [c for c in definition.udf_input_columns(src.schema) if c not in names]
    if known is not None:
        missing += [c for c in known if c not in names and c not in missing]
    problem = None
    if not missing and known is None:
        try:
            check_sql(src, filter=definition.filter, columns=definition.projection or None)
        except (ValueError, OSError) as exc:
            found = _NO_FIELD.search(str(exc))
            missing, problem = ([found.group(1)], None) if found else ([], short_error(exc))
    if missing:
        raise ValueError(
            f"view {view_name!r} reads column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} of "
            f"{definition.source!r}, which version {src.version} does not have (dropped outside mv_assets?); nothing "
            "was written. Add the column back, or drop the view and create it without the column"
        )
    if problem:
        raise ValueError(f"the query of view {view_name!r} no longer runs on version {src.version} of "
                         f"{definition.source!r}: {problem}; nothing was written")


def _open_source(view: ViewRef) -> lance.LanceDataset:
    """The view's source at its latest version, or a clear error when it is gone
    (or was written anew, by another tool, in Lance's legacy v1 format)."""
    try:
        src = view.source_dataset()
    except (ValueError, OSError) as exc:
        if objects.is_dataset(view.source_uri):
            raise ValueError(f"cannot open the source {view.source!r} of view {view.name!r}: {short_error(exc)}") from exc
        raise ValueError(view.source_missing()) from None
    require_current_format(src, view.source, f"view {view.name!r}")
    return src


def _replacement(view: ViewRef, state, source_id: str | None, read_fields: dict[str, int], mode: str) -> str | None:
    """Why nothing the view holds matches its source any more (a new table
    under the source's name, or columns it reads replaced), or None; refused
    (ValueError) when the refresh must be incremental."""
    replaced = _source_replaced(view, state, source_id) or _columns_replaced(view, state, read_fields)
    if replaced is not None and mode == "incremental_strict":
        raise ValueError(f"refresh of {view.name!r} cannot be incremental: {replaced}")
    return replaced


def _source_replaced(view: ViewRef, state, source_id: str | None) -> str | None:
    """Why the source is not the table the view was built from (None: it is,
    or the view never recorded which it was)."""
    if state.source_id is None or state.source_id == source_id:
        return None
    return (f"the source {view.source!r} was dropped and created again since view {view.name!r} was built from it "
            "(its table identity changed): the view is rebuilt")


def _nothing_read_changed(commits: list, reads: list[str], state) -> bool:
    """The view is at its source's version (no commit since), or every source
    commit since then changed nothing it reads (compactions, config, backfills
    of other columns, state-only refreshes of a source view)."""
    if not commits:
        return True
    if state.scoped_since_whole:  # fragment-scoped refreshes since the last whole one: rows may be missing
        return False
    return not any(commit_matters(txn, reads) for txn in commits)


def _already_current(view: ViewRef, src_version: int, view_version: int, state, *, source_id: str | None = None,
                     read_fields: dict[str, int] | None = None,
                     source_top_fragment: int | None = None) -> RefreshPlan:
    """The plan of a view with nothing to change: at most its new source version
    is recorded (a state-only commit), with the source's identity, the field
    ids it reads and its top fragment when the plan learnt them."""
    return RefreshPlan(
        view=view.name, source=view.definition.source, from_version=state.source_version, to_version=src_version,
        view_version=view_version, full=False, reason="already current", rows_to_insert=0, rows_to_update=0,
        rows_to_delete=0, udf_rows={}, definition_raw=b"", load_number=state.load_number,
        scoped_since_whole=state.scoped_since_whole, seconds_per_row=state.seconds_per_row,
        source_id=source_id, read_fields=read_fields, source_top_fragment=source_top_fragment,
    )


def _place(
    view: ViewRef, src: lance.LanceDataset, view_ds: lance.LanceDataset, how: str, per_task: int,
    checkpoint_size: int | None, balanced: bool = False,
) -> "_TaskPlace":
    """Where the tasks of a plan (named by everything that shapes them, the
    view's identity too) read, write and checkpoint."""
    view_version = view_ds.version
    # The source's identity names its row checkpoints' folder: a source removed and made again
    # (row ids and versions start again at 0 and 1) finds none of the results its predecessor's
    # failed refresh saved (they were taken as its rows' results: the view held old values).
    source = table_id(src) or "unstamped"
    plan_key = hashlib.sha256(
        f"{view.uri}|{view_id(view_ds)}|{view_version}|{src.version}|{source}|{how}|{per_task}|{checkpoint_size}|"
        f"{balanced}".encode()
    ).hexdigest()[:16]
    checkpoints = view.layout.checkpoints(view.name)
    return _TaskPlace(
        src.uri, src.version, view.uri, view_version, objects.join(checkpoints, plan_key),
        objects.join(checkpoints, "batches", source), plan_key, per_task, checkpoint_size, balanced,
    )


@dataclass(frozen=True)
class _TaskPlace:
    """Where a plan's tasks read, write and checkpoint, and how big they are."""

    src_uri: str
    src_version: int
    view_uri: str
    view_version: int
    checkpoint_dir: str
    batch_dir: str
    plan_key: str
    max_rows_per_task: int
    checkpoint_size: int | None
    balanced: bool = False  # tasks sized automatically: as many as the rows need, of equal size

    def tasks(self, pieces: list[list], recompute: list[str] | None = None) -> list[TaskSpec]:
        tasks = _pack_tasks(
            pieces, self.src_version, self.src_uri, self.view_uri, self.checkpoint_dir, self.max_rows_per_task,
            self.plan_key, recompute, self.view_version, self.balanced,
        )
        return self.checkpointed(tasks)

    def checkpointed(self, tasks: list[TaskSpec]) -> list[TaskSpec]:
        """``tasks`` set to checkpoint their UDF results by row (every
        ``checkpoint_size`` rows, else paced by time) in the plan's row
        checkpoints, looked up only when an earlier run left some (a resume)."""
        resume = bool(objects.listdir(self.batch_dir))
        for t in tasks:
            t.batch_size, t.batch_checkpoint_dir, t.batch_resume = self.checkpoint_size or 8192, self.batch_dir, resume
            if self.checkpoint_size is None:  # sized by time (model.pacing)
                t.checkpoint_seconds = default_target_seconds()
        return tasks


def _tasks_for(where: _TaskPlace, rows: pa.Table, current_rows: pa.Table, recompute: list[str] | None,
               within: "tuple[np.ndarray, str | None] | None" = None):
    """Tasks computing the changed ``rows``, plus tasks recomputing only the
    ``recompute`` columns of ``current_rows``; and those columns' UDF rows.
    ``within``: the candidates the rows were chosen from (see :func:`pieces_from_rows`)."""
    tasks = []
    if rows.num_rows:
        tasks = where.tasks(pieces_from_rows(_ids(rows, "_rowaddr"), _ids(rows), where.max_rows_per_task, within))
    udf_rows: dict[str, int] = {}
    if current_rows.num_rows:
        pieces = pieces_from_rows(_ids(current_rows, "_rowaddr"), _ids(current_rows), where.max_rows_per_task,
                                  within)
        rewrite = where.tasks(pieces, recompute=list(recompute or []))
        tasks += rewrite
        for name in recompute or []:
            udf_rows[name] = int(sum(t.rows for t in rewrite))
    return tasks, udf_rows


class ViewKeys:
    """A view's keys (``columns`` and row addresses), read only when the
    source rows that changed are known, keeping only the rows of those: a
    1% delete plans in memory O(changed rows), whatever the view's size (the
    keys are streamed in batches of ``batch_rows``, fragment by fragment in
    ranges of ``range_rows``; each batch is dropped once its rows of interest
    are taken)."""

    def __init__(self, view_ds: lance.LanceDataset, columns: list[str], batch_rows: int = 1 << 16,
                 range_rows: int = 1 << 18, *, with_row_id: bool = False) -> None:
        self.view_ds, self.columns, self.batch_rows, self.range_rows = view_ds, columns, batch_rows, range_rows
        self.with_row_id = with_row_id  # (the view rows' own ids too, before their addresses)
        self.rows_read = 0  # what was streamed (all of the view's keys, once)
        self.rows_kept = 0  # what was held

    def touching(self, ids: np.ndarray) -> pa.Table:
        """The view's key rows whose source row id is one of ``ids``."""
        if not len(ids):  # nothing changed: no key of the view is read
            return self._empty()
        wanted = Membership(ids)  # (built once for every batch)
        kept = []
        for batch in self._batches():
            self.rows_read += batch.num_rows
            mask = wanted.mask(_ids(batch, SOURCE_ROW_ID))
            if mask.any():
                kept.append(batch.filter(pa.array(mask)))
        # one chunk: the plan's id and address arrays are views of it, not copies of many pieces
        out = pa.Table.from_batches(kept).combine_chunks() if kept else self._empty()
        self.rows_kept = out.num_rows
        return out

    def _batches(self) -> Iterator[pa.RecordBatch]:
        """Every key row, in small batches with one ahead, read in ranges of a
        fragment's rows: a scan of a whole fragment reads each column's page at
        once (2.5 MB of ids a 1M-row fragment) on one of Lance's I/O threads,
        and what a thread frees stays in its allocator's arena (glibc): ~3 MB a
        thread, 7-15 MB at 10M keys. A range of 256k rows reads ~0.6 MB at once
        (~0.8 MB a thread kept; bench/bench_delete_plan.py: the plan's memory
        at 10M over 1M keys 1.13-1.24x with whole fragments, 1.07-1.12x so).
        Lance reads only the range's chunks; ``offset`` and ``limit`` count
        rows not deleted. Batches of 64k rows (1 MB of ids and addresses): each
        batch costs a round trip through Lance's reader, and 16k-row ones made
        the stream of 900k keys ~1.6x slower (a 1% delete's plan at 1M: ~30 ms
        of keys read against ~18), for ~0.75 MB less held."""
        for fragment in self.view_ds.get_fragments():
            rows = fragment.count_rows()
            for offset in range(0, rows, self.range_rows):
                yield from fragment.to_batches(columns=self.columns, with_row_id=self.with_row_id,
                                               with_row_address=True, batch_size=self.batch_rows,
                                               batch_readahead=1, offset=offset, limit=self.range_rows)

    def _empty(self) -> pa.Table:
        fields = ([self.view_ds.schema.field(c) for c in self.columns]
                  + ([pa.field("_rowid", pa.uint64())] if self.with_row_id else []) + [pa.field("_rowaddr", pa.uint64())])
        return pa.schema(fields).empty_table()


def _changed_rows(
    src: lance.LanceDataset,
    src_uri: str,
    definition: ViewDefinition,
    how: str,
    v0: int | None,
    src_version: int,
    scope: list[int] | None,
    scope_frags: list | None,
    vk: "pa.Table | ViewKeys",
    tracked: list[str],
    recompute: list[str] | None,
    tainted: np.ndarray | None = None,
    moved: list | None = None,
    scoped_view: lance.LanceDataset | None = None,
    feed: np.ndarray | None = None,
    merges: list[int] | None = None,
) -> "tuple[KeyPlan, pa.Table, pa.Table, pa.Table, tuple[np.ndarray, str | None] | None, pa.Table]":
    """The key plan, the source rows to compute, (``recompute``) the rows the
    view holds current whose UDF columns are computed again, the view's keys
    the plan touches (an incremental refresh: only those of changed rows), the
    candidates the rows were chosen from (see ``pieces_from_rows``), and the
    rows read again with their UDF values kept (:func:`_read_by_no_udf`).
    ``vk``: the view's keys, or (an incremental refresh without a limit) a
    :class:`ViewKeys` read once the changed source rows are known, keeping
    only theirs. ``scoped_view``: the view, when fragment-scoped refreshes
    since ``v0`` wrote into it (an incremental refresh then also removes the
    rows they brought in whose source row is gone: the change feed since
    ``v0`` does not name rows created after it). ``feed``: a
    fragment-scoped refresh's source rows deleted since ``v0`` (its view keys
    are then a :class:`ViewKeys`, read once the rows in scope are known).
    ``merges``: versions of Merge commits since ``v0`` that only added columns
    (:func:`column_adding_merges`): the view's rows whose source rows only
    they moved are copied (``current_rows``, with no column to compute again:
    their values are the view's, their row versions new), in an incremental
    refresh and a fragment-scoped one (a Dagster partition's) alike."""
    if isinstance(vk, ViewKeys):  # read below, once the changed ids are known
        view_keys, view_vers = np.empty(0, np.int64), np.empty(0, np.int64)
    else:
        view_keys, view_vers = _key_versions(vk)
    base_filter = definition.filter
    candidates = None
    # per tracked computed column computed from another, rows a backfill wrote since v0 (their markers
    # may read as the view holds them: cleared by a backfill of their inputs, set, and cleared again)
    chained = _chained_reads(definition, src) if tracked else []
    forced: dict[str, np.ndarray] = {}
    if how == "incremental":
        assert v0 is not None  # an incremental refresh starts from a reflected version
        passing, within, fail, deleted, forced = _changes_since(src, src_uri, base_filter, v0, src_version, tracked,
                                                                moved, chained)
        if scoped_view is not None:
            deleted = np.union1d(deleted, _gone_since(scoped_view, src, v0, deleted))
        if definition.limit is None:
            # Only view rows whose source row changed matter from here on: one pass
            # over the view's keys, then every step works on that small subset.
            vk, view_keys, view_vers = _keys_touching(vk, view_keys, view_vers,
                                                      np.concatenate([_ids(passing), fail, deleted]))
    elif isinstance(vk, ViewKeys):
        # fragment-scoped, with the change feed: the rows in scope, the view's rows gone anywhere
        # (deleted since v0, or brought in by scoped refreshes since and gone), then only their keys
        assert feed is not None and v0 is not None and scope_frags is not None
        passing, within, fail = _in_scope(src, base_filter, scope_frags, tracked)
        deleted = np.union1d(feed, _gone_since(vk.view_ds, src, v0, feed))
        if chained and src_version > v0:
            forced = _recomputed_since(src, src_uri, v0, src_version, chained)
        vk, view_keys, view_vers = _keys_touching(vk, view_keys, view_vers,
                                                  np.concatenate([_ids(passing), fail, deleted]))
    else:
        passing, within, fail, deleted = _whole_changes(src, base_filter, scope, scope_frags, tracked, view_keys)
        if how == "sync" and v0 is not None and chained and src_version > v0:
            forced = _recomputed_since(src, src_uri, v0, src_version, chained)
    assert not isinstance(vk, ViewKeys)  # (streamed keys were read above: an incremental refresh without a limit)
    current_rows = reread_rows = passing.slice(0, 0)
    if how != "full":
        current = _current(passing, view_keys, view_vers, vk, tracked)
        if tainted is not None and len(tainted):  # rows another tool wrote into the view: computed again
            current &= ~isin(_ids(passing), tainted)
        plain = _read_by_no_udf(definition, src.schema, tracked)
        if forced:  # rows whose tracked columns a backfill wrote since (their markers may read the same)
            current &= ~isin(_ids(passing), _union(forced.values()))
        if recompute is None and plain and definition.limit is None:
            # Rows the view holds at their version whose only change is a computed column no UDF of
            # the view reads (a backfill of it: new markers, no version moved): read again, UDF values kept.
            reread = _current(passing, view_keys, view_vers, vk, [c for c in tracked if c not in plain]) & ~current
            if tainted is not None and len(tainted):
                reread &= ~isin(_ids(passing), tainted)
            by_udf = _union(ids for c, ids in forced.items() if c not in plain)  # (a UDF's input written: computed)
            if len(by_udf):
                reread &= ~isin(_ids(passing), by_udf)
            reread_rows = passing.filter(pa.array(reread))
            current |= reread
        if recompute is not None:
            current_rows = passing.filter(pa.array(current))
        elif merges and v0 is not None and not tracked and definition.limit is None:
            copied = _moved_by_merges_only(src, passing, view_keys, view_vers if how == "sync" else None, v0,
                                           merges) & ~current
            if tainted is not None and len(tainted):
                copied &= ~isin(_ids(passing), tainted)
            current_rows = passing.filter(pa.array(copied))
            current |= copied
        passing = passing.filter(pa.array(~current))
    if definition.limit is not None:
        candidates = _ids(src.to_table(columns=[], filter=base_filter, with_row_id=True))
    keys = plan_keys(view_keys, ChangeSet(_ids(passing), fail, deleted, candidates), definition.limit, definition.seed)
    if current_rows.num_rows or reread_rows.num_rows:  # rewritten in place: the old rows go, rewritten rows come
        keys = KeyPlan(keys.insert, np.sort(np.concatenate([keys.update, _ids(current_rows), _ids(reread_rows)])),
                       keys.delete)

    if definition.limit is not None:
        compute = keys.compute
        rows = (
            _scan(src, f"_rowid IN ({_in_list(compute)})", with_version=False) if len(compute) else passing.slice(0, 0)
        )
        within = None
    else:
        rows = passing

    return keys, rows, current_rows, vk, within, reread_rows


def _read_by_no_udf(definition: ViewDefinition, source_schema: pa.Schema, tracked: list[str]) -> list[str]:
    """The computed source columns the view reads (``tracked``) that none of
    its UDFs takes as input: a change of theirs alone leaves its UDF values as
    they are (a UDF without ``input_columns`` takes every column)."""
    if not tracked or not definition.udf_columns:
        return []
    inputs = set(definition.udf_input_columns(source_schema))
    return [c for c in tracked if c not in inputs]


def _reread_columns(definition: ViewDefinition, view_schema: pa.Schema) -> list[str]:
    """The columns a task reads again for rows whose UDF values it keeps
    (``TaskSpec.recompute``): every column but the UDF columns and their
    markers, the computed source columns' markers among them."""
    udfs = {c.name for c in definition.udf_columns}
    return [*(c.name for c in definition.columns if c.name not in udfs),
            *(n for n in view_schema.names if n.startswith(SOURCE_MARKER_PREFIX))]


def _moved_by_merges_only(src: lance.LanceDataset, rows: pa.Table, view_keys: np.ndarray,
                          view_vers: np.ndarray | None, v0: int, merges: list[int]) -> np.ndarray:
    """Mask of ``rows`` the view holds whose version only column-adding Merges
    moved since the view computed them: before those Merges the row was at the
    version the view holds (``view_vers``; None: an incremental refresh, whose
    view reflects ``v0``: at ``v0`` or older), so every value the view read
    from it is as it was."""
    if rows.num_rows == 0 or len(view_keys) == 0:
        return np.zeros(rows.num_rows, dtype=bool)
    ids = _ids(rows)
    pos = positions(ids, view_keys)
    held = pos >= 0
    before = versions_before_merges(src, ids, _ids(rows, ROW_VERSION_ALIAS), merges)
    if view_vers is None:
        return held & (before <= v0)
    return held & (before == view_vers[np.where(held, pos, 0)])


def _gone_since(view_ds: lance.LanceDataset, src: lance.LanceDataset, v0: int, feed: np.ndarray) -> np.ndarray:
    """Source row ids of the view's rows computed from source rows newer than
    ``v0`` (what fragment-scoped refreshes brought in since) whose row is no
    longer in ``src``: one filtered read of the view's keys, then lookups by id
    (``feed``: the source rows deleted since ``v0``)."""
    later = view_ds.to_table(columns=[SOURCE_ROW_ID, SOURCE_ROW_VERSION], filter=f"{SOURCE_ROW_VERSION} > {int(v0)}")
    keys = _ids(later, SOURCE_ROW_ID)
    if not len(keys):
        return keys
    return np.unique(keys[gone_rows(src, keys, _ids(later, SOURCE_ROW_VERSION), v0, feed)])


def _key_versions(keys: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The source row ids and row versions of the view's key rows ``keys``."""
    view_keys = _ids(keys, SOURCE_ROW_ID)
    view_vers = (_ids(keys, SOURCE_ROW_VERSION) if SOURCE_ROW_VERSION in keys.column_names  # not read when nothing
                 else np.broadcast_to(np.int64(0), len(view_keys)))  # can be current (_plan_work): zeros, no memory
    return view_keys, view_vers


def _keys_touching(vk: "pa.Table | ViewKeys", view_keys: np.ndarray, view_vers: np.ndarray,
                   wanted: np.ndarray) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """The view's key rows of the source rows ``wanted``, with their ids and
    versions: streamed from a :class:`ViewKeys` now, or kept of those read
    (``view_keys`` and ``view_vers`` are ``vk``'s)."""
    if isinstance(vk, ViewKeys):
        kept = vk.touching(wanted)
        return (kept, *_key_versions(kept))
    touched = isin(view_keys, wanted)
    return vk.filter(pa.array(touched)), view_keys[touched], view_vers[touched]


def _changes_since(src: lance.LanceDataset, src_uri: str, base_filter: str | None, v0: int, src_version: int,
                   tracked: list[str], moved: list | None, chained: list[str]
                   ) -> "tuple[pa.Table, tuple[np.ndarray, str | None] | None, np.ndarray, np.ndarray, dict]":
    """An incremental refresh's source changes since ``v0``: the rows written
    since that pass the filter, the candidates they were chosen from (see
    ``pieces_from_rows``), the ids of changed rows that fail it, of the rows
    deleted, and per tracked computed column computed from another
    (``chained``) the ids of rows a backfill wrote its values of
    (:func:`_written_by_backfills`: the view may hold their markers as they
    are now, with the old values; another column's markers at both ends say
    whether its values moved)."""
    version_filter = f"_row_last_updated_at_version > {v0}"
    # rows written since v0 (``moved``: only in these fragments; [] none at all: deletes only)
    if moved is not None and not moved:
        passing = _no_rows(tracked)
    else:
        passing = _scan(src, and_filters(version_filter, base_filter), moved, markers=tracked)
    within = (_ids(passing, "_rowaddr"), and_filters(version_filter, base_filter))
    if base_filter and (moved is None or moved):
        changed_all = _ids(_scan(src, version_filter, moved, with_version=False))
        fail = changed_all[~isin(changed_all, _ids(passing))]
    else:
        fail = np.empty(0, np.int64)
    forced: dict[str, np.ndarray] = {}
    backfills = backfill_commits(src, v0, src_version, tracked) if tracked and src_version > v0 else []
    if backfills:
        # A backfill of a column the view reads rewrote values without moving
        # row versions: rows whose markers changed are changed rows too, and
        # so are those a backfill wrote between (their markers may read the same).
        forced = _written_by_backfills(src_uri, backfills, chained)
        remarked = _union([_marker_changes(src_uri, v0, src_version, tracked), *forced.values()])
        remarked = remarked[~isin(remarked, _ids(passing))]
        if len(remarked):
            every = _scan(src, base_filter, markers=tracked)
            extra = every.filter(pa.array(isin(_ids(every), remarked)))
            passing = pa.concat_tables([passing, extra])
            within = None  # rows the version filter does not select: chosen by id
            if base_filter:
                fail = np.concatenate([fail, remarked[~isin(remarked, _ids(extra))]])
    deleted = (
        _ids(src.delta(begin_version=v0, end_version=src_version).get_deleted_row_ids().read_all())
        if src_version > v0
        else np.empty(0, np.int64)
    )
    return passing, within, fail, deleted, forced


def _whole_changes(src: lance.LanceDataset, base_filter: str | None, scope: list[int] | None,
                   scope_frags: list | None, tracked: list[str], view_keys: np.ndarray
                   ) -> "tuple[pa.Table, tuple[np.ndarray, str | None], np.ndarray, np.ndarray]":
    """A full or sync refresh's source rows: every row passing the filter (in
    the scope's fragments), the candidates they were chosen from, the ids of
    the scope's rows that fail it, and of the view's rows whose source row is
    gone (the whole view: or no longer passes). A scoped refresh here could
    not read the change feed (see :func:`_changed_rows`): every row id of the
    source is read to find the view's rows gone anywhere."""
    if scope is not None:
        passing, within, fail = _in_scope(src, base_filter, scope_frags, tracked)
        return passing, within, fail, view_keys[gone_rows(src, view_keys, None, None, None)]
    passing = _scan(src, base_filter, markers=tracked)
    deleted = view_keys[~isin(view_keys, _ids(passing))]  # gone or no longer passing
    return passing, (_ids(passing, "_rowaddr"), base_filter), np.empty(0, np.int64), deleted


def _in_scope(src: lance.LanceDataset, base_filter: str | None, scope_frags: list | None, tracked: list[str]
              ) -> "tuple[pa.Table, tuple[np.ndarray, str | None], np.ndarray]":
    """The rows of the scope's fragments passing the filter, the candidates
    they were chosen from, and the ids of the scope's rows that fail it."""
    passing = _scan(src, base_filter, scope_frags, markers=tracked)
    pass_ids = _ids(passing)
    in_scope = _ids(_scan(src, None, scope_frags, with_version=False)) if base_filter else pass_ids
    return passing, (_ids(passing, "_rowaddr"), base_filter), in_scope[~isin(in_scope, pass_ids)]


def _current(
    rows: pa.Table, view_keys: np.ndarray, view_vers: np.ndarray, vk: pa.Table | None = None,
    tracked: list[str] | None = None,
) -> np.ndarray:
    """Mask of source rows the view already holds at their current row version
    (and, for computed source columns the view reads, their current markers)."""
    if rows.num_rows == 0 or len(view_keys) == 0:
        return np.zeros(rows.num_rows, dtype=bool)
    pos = positions(_ids(rows), view_keys)
    found = pos >= 0
    safe = np.where(found, pos, 0)
    current = found & (view_vers[safe] == _ids(rows, ROW_VERSION_ALIAS))
    for m in tracked or []:
        assert vk is not None  # tracked markers come with the view's keys
        have = np.asarray(vk.column(source_marker(m)).fill_null("").to_pylist(), dtype=object)
        now = np.asarray(rows.column(source_marker(m)).fill_null("").to_pylist(), dtype=object)
        current &= have[safe] == now
    return current


def _pack_tasks(
    pieces: list[list],
    src_version: int,
    src_uri: str,
    view_uri: str,
    checkpoint_dir: str,
    max_rows_per_task: int,
    plan_key: str,
    recompute: list[str] | None = None,
    view_version: int | None = None,
    balanced: bool = False,
) -> list[TaskSpec]:
    tasks = []
    for parts in pack_pieces(pieces, max_rows_per_task, balanced):
        task_id = hashlib.sha256(f"{plan_key}|{json.dumps(parts)}|{recompute}".encode()).hexdigest()[:16]
        tasks.append(
            TaskSpec(
                task_id=task_id,
                src_uri=src_uri,
                src_version=src_version,
                parts=parts,
                view_uri=view_uri,
                rows=int(sum(p[2] for p in parts)),
                checkpoint_dir=checkpoint_dir,
                recompute=recompute,
                view_version=view_version,
            )
        )
    return tasks


def _pieces_into_empty_view(src: lance.LanceDataset, fragments: list, filter_sql: str | None, max_rows: int,
                            from_metadata: bool = False, addresses: np.ndarray | None = None) -> list[list]:
    """Pieces covering every row of ``fragments`` passing the view's filter,
    planned while streaming their row addresses in one ordered scan (driver
    memory: one scanner batch, whatever the source's size). Without a filter,
    a fragment without deletions is planned from its metadata (no scan: 1M
    rows' addresses took ~15 ms to stream, 10M ~70 ms); ``from_metadata``,
    every fragment is (counts are upper bounds).

    A piece is an address range of one fragment plus the filter, which the
    task evaluates again at the same pinned version: exact, and small however
    scattered the passing rows are. ``addresses``: the passing rows' addresses
    in scan order, read already (the scan is not made again).
    """
    runs: dict[int, list[tuple[int, int, int]]] = {}  # fragment -> (first address, last address, rows)
    # Every row of a fragment without deletions, no filter: its runs follow from its size
    # (``from_metadata``: every fragment so, each count an upper bound; no scan).
    whole = [f for f in fragments if from_metadata or (filter_sql is None and f.metadata.deletion_file is None)]
    for f in whole:
        n, base = f.metadata.physical_rows, f.fragment_id << 32
        runs[f.fragment_id] = [(base + lo, base + min(n, lo + max_rows) - 1, min(n, lo + max_rows) - lo)
                               for lo in range(0, n, max_rows)]
    scanned = [f for f in fragments if f.fragment_id not in runs]
    first = last = count = 0
    frag_id = -1
    if scanned:
        for addrs in _scanned_addresses(src, scanned, filter_sql, addresses, every=len(scanned) == len(fragments)):
            i = 0
            while i < len(addrs):
                fid = int(addrs[i]) >> 32
                if fid != frag_id:  # a new fragment: close the open run
                    if count:
                        runs.setdefault(frag_id, []).append((first, last, count))
                    frag_id, count = fid, 0
                if count == 0:
                    first = int(addrs[i])
                # rows of this fragment left in the batch (addresses ascend within a fragment)
                end = i + int(np.searchsorted(addrs[i:] >> np.uint64(32), np.uint64(fid), side="right"))
                take = min(max_rows - count, end - i)
                count, i = count + take, i + take
                last = int(addrs[i - 1])
                if count == max_rows:
                    runs.setdefault(frag_id, []).append((first, last, count))
                    count = 0
        if count:
            runs.setdefault(frag_id, []).append((first, last, count))
    pieces: list[list] = []
    for fid in (f.fragment_id for f in fragments):  # in the fragments' order
        frag_runs = runs.get(fid, [])
        for lo, hi, n in frag_runs:
            bounds = None if len(frag_runs) == 1 else f"_rowaddr >= {lo} AND _rowaddr <= {hi}"
            pieces.append([fid, and_filters(bounds, filter_sql), n])
    return pieces


def _scanned_addresses(src: lance.LanceDataset, fragments: list, filter_sql: str | None,
                       addresses: np.ndarray | None, every: bool = False) -> Iterator[np.ndarray]:
    """The addresses of the rows of ``fragments`` passing ``filter_sql``, in
    order, batch by batch: of ``addresses`` (read already, ``every``: all of
    them are of ``fragments``) when given, else streamed from a scan."""
    if addresses is not None:
        addresses = np.asarray(addresses, dtype=np.uint64)
        if not every:
            wanted = np.array(sorted(f.fragment_id for f in fragments), dtype=np.uint64)
            addresses = addresses[np.isin(addresses >> np.uint64(32), wanted)]
        yield addresses
        return
    scanner = src.scanner(columns=[], filter=filter_sql, with_row_address=True, fragments=fragments,
                          scan_in_order=True)
    for batch in scanner.to_batches():
        yield batch.column("_rowaddr").to_numpy()


def _deletions(view_ds: lance.LanceDataset, keys: np.ndarray, addrs: np.ndarray, remove: np.ndarray):
    """Deletion vectors for view rows whose key is in ``remove`` (no data rewritten)."""
    removed_ids: list[int] = []
    updated: list[FragmentMetadata] = []
    if len(remove) == 0 or len(keys) == 0:
        return removed_ids, updated
    mask = isin(keys, remove)
    hit_addrs = addrs[mask]
    hit_frags = hit_addrs >> 32
    for fid in np.unique(hit_frags):
        frag = view_ds.get_fragment(int(fid))
        if frag is None:
            raise RuntimeError(f"view fragment {fid} disappeared during the refresh")
        sel = hit_frags == fid
        if int(sel.sum()) >= frag.count_rows():
            removed_ids.append(int(fid))
            continue
        # the rows' addresses are known: their offsets go to the deletion vector, nothing is scanned
        meta = delete_offsets(frag, np.sort(hit_addrs[sel] & 0xFFFFFFFF).tolist())
        if meta is None:
            removed_ids.append(int(fid))
        else:
            updated.append(meta)
    return removed_ids, updated


def shuffled_fragments(
    view_ds: lance.LanceDataset,
    remove: np.ndarray,
    results: list[TaskResult],
    seed: int | None,
    chunk_rows: int = 65_536,
) -> list[FragmentMetadata]:
    """The whole view written anew in shuffle order: kept rows are copied (by
    row id, a chunk at a time), new rows come from the tasks; nothing is
    recomputed. Memory: the ids of the view and the new rows, plus one chunk.

    A shuffled view's order is one order over the whole view, the seeded
    pseudo-random key of each row's stable source row id (planning.shuffle_keys),
    on every refresh: new rows land all over the order, not at its end.
    """
    held = view_ds.to_table(columns=[SOURCE_ROW_ID], with_row_id=True)
    keys = _ids(held, SOURCE_ROW_ID)
    keep = ~isin(keys, remove)
    old_ids, old_rows = keys[keep], _ids(held)[keep]  # Lance row ids of the view (addresses without stable ids)
    new = pa.concat_tables([objects.read_arrow(r.rows_path) for r in results if r.rows_path]).cast(view_ds.schema)
    ids = np.concatenate([old_ids, _ids(new, SOURCE_ROW_ID)])
    order = np.lexsort((ids, shuffle_keys(ids, seed)))
    n_old = len(old_ids)
    schema = view_ds.schema

    def batches():
        for lo in range(0, len(order), chunk_rows):
            sel = order[lo : lo + chunk_rows]
            from_old = sel < n_old
            parts = []
            if from_old.any():
                parts.append(take_rows(view_ds, old_rows[sel[from_old]].tolist(), schema.names).cast(schema))
            if (~from_old).any():
                parts.append(new.take(pa.array(sel[~from_old] - n_old)))
            chunk = pa.concat_tables(parts)
            where = np.empty(len(sel), dtype=np.int64)  # old rows first in `chunk`, then new ones
            where[np.flatnonzero(from_old)] = np.arange(int(from_old.sum()))
            where[np.flatnonzero(~from_old)] = int(from_old.sum()) + np.arange(int((~from_old).sum()))
            yield from chunk.take(pa.array(where)).to_batches()

    if len(order) == 0:
        return []
    reader = pa.RecordBatchReader.from_batches(schema, batches())
    return objects.write_fragments(reader, view_ds.uri, schema=schema, max_rows_per_file=1 << 20)


def _rows_by_fragment(tasks: list[TaskSpec]) -> dict[int, int]:
    out: dict[int, int] = {}
    for t in tasks:
        for fid, _, rows in t.parts:
            out[int(fid)] = out.get(int(fid), 0) + int(rows)
    return out


def view_rows_by_fragment(view_uri: str, src_uri: str, src_version: int, fragments: list[int],
                          where: str | None = None) -> dict[int, int]:
    """How many rows of the view (those matching ``where``, SQL over the
    view) come from each of ``fragments`` of the source at ``src_version``
    (ids only are read: no data columns; O(view keys) per fragment)."""
    src = objects.dataset(src_uri, version=src_version)
    keys = _ids(objects.dataset(view_uri).to_table(columns=[SOURCE_ROW_ID], filter=where), SOURCE_ROW_ID)
    out = {}
    for fid in fragments:
        frag = src.get_fragment(int(fid))  # (by id: none made for the table's other fragments)
        if frag is None:
            out[int(fid)] = 0
            continue
        ids = _ids(frag.to_table(columns=[], with_row_id=True))
        out[int(fid)] = int(isin(keys, ids).sum())  # view rows (a chunk view: every chunk of the fragment's parents)
    return out


def _sum_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def _state_record(
    view: ViewRef, plan: RefreshPlan, udf_rows: dict[str, int], errors: int, results: list[TaskResult],
    job_id: str = "", started_at: float | None = None,
) -> dict:
    """The refresh state committed with the data (see :func:`read_refresh_state`)."""
    return {
        "job_id": job_id,
        "started_at": started_at,
        "source_version": plan.to_version,
        "from_version": plan.from_version,
        "definition": view.definition.shape_fingerprint(),
        "load_number": plan.load_number + 1,
        "refreshed_at": time.time(),
        "node": socket.gethostname(),
        "full": plan.full,
        "scope": plan.scope,
        "whole_source_version": plan.to_version if plan.scope is None else plan.from_version,
        "scoped_versions": _scoped_range(plan),
        "rows_inserted": plan.rows_to_insert,
        "rows_updated": plan.rows_to_update,
        "rows_deleted": plan.rows_to_delete,
        "udf_rows_computed": udf_rows,
        "udf_errors": errors,
        "seconds_per_row": _seconds_per_row(plan, results),
        # which table the source is: stamped now if another tool made it (storage.identity)
        "source_id": (ensure_table_id(view.source_uri) if plan.source_id is None or plan.details.get("source_unstamped")
                      else plan.source_id),
        "read_fields": plan.read_fields,
        "source_top_fragment": plan.source_top_fragment,
        # a view of several sources: every source's version and identity (ops.join_refresh)
        **{k: plan.details[k] for k in ("sources", "source_ids", "source_fields") if k in plan.details},
        # a join view's refresh: each arrangement its plan probed, what was done to have it and its seconds
        # (mv-assets arrangements reads the newest)
        **({"arrangements": {name: {k: a[k] for k in ("how", "seconds") if k in a}
                             for name, a in plan.details["arrangements"].items()}}
           if plan.details.get("arrangements") else {}),
    }


def _scoped_range(plan: RefreshPlan) -> list[int] | None:
    """The source versions of the scoped refreshes since the last whole one,
    this one's included (None: a whole refresh, or one of them did not
    record it: the next whole refresh then compares every row)."""
    if plan.scope is None:
        return None
    if not plan.scoped_since_whole:
        return [plan.to_version, plan.to_version]
    if plan.scoped_versions is None:
        return None
    return [min(plan.scoped_versions[0], plan.to_version), max(plan.scoped_versions[1], plan.to_version)]


def _seconds_per_row(plan: RefreshPlan, results: list[TaskResult]) -> float | None:
    """Task seconds per row computed, measured now (or carried from the last refresh)."""
    rows = sum(t.rows for t in plan.tasks)
    fresh = [r for r in results if not r.resumed]
    if rows >= 1000 and fresh and len(fresh) == len(results):
        return sum(r.seconds for r in results) / rows
    return plan.seconds_per_row


def _view_changes(view: ViewRef, plan: RefreshPlan, results: list[TaskResult]):
    """The commit's removed fragment ids, updated fragments and new fragments."""
    view_ds = objects.dataset(view.uri)
    if view_ds.version != plan.view_version:
        raise ConcurrentRefreshError(
            f"view {view.name!r} moved from version {plan.view_version} to {view_ds.version} during the "
            "refresh; nothing was committed. Refresh again."
        )
    if plan.view_stamp is not None and objects.version_signature(view.uri, plan.view_version) != plan.view_stamp:
        replaced = ConcurrentRefreshError(
            f"view {view.name!r} was dropped and made again during the refresh (its version {plan.view_version} is "
            "another commit); nothing was committed")
        setattr(replaced, _REPLACED, True)  # (the view it failed for is gone: the new one's status is not its)
        raise replaced
    keys, addrs = plan.view_key_addrs or (np.empty(0, np.int64), np.empty(0, np.int64))
    if view.definition.shuffle and any(r.rows_path for r in results):
        removed = [f.fragment_id for f in view_ds.get_fragments()]
        return removed, [], shuffled_fragments(view_ds, plan.keys.remove_from_view, results, view.definition.seed)
    if plan.full and plan.scope is None:  # a full refresh of the whole view replaces every row it holds
        removed, updated = [f.fragment_id for f in view_ds.get_fragments()], []
    else:
        removed, updated = _deletions(view_ds, keys, addrs, plan.keys.remove_from_view)
    return removed, updated, [m for r in results for m in r.fragment_metadata()]


_ON_DATA = "_mv_assets_failed_on_data"
_REPLACED = "_mv_assets_view_replaced"


def is_view_replaced(exc: BaseException) -> bool:
    """Whether ``exc`` stopped a refresh whose view was dropped and made again
    meanwhile (its status is the new view's: the failure is not recorded there)."""
    return bool(getattr(exc, _REPLACED, False))


def failed_on_data(exc: BaseException) -> None:
    """Mark ``exc`` as a refresh's failure on its data met while planning (a
    view kind that computes its changes then: an aggregate's groups), not bad
    input: the view's status records it (FAILED_LOAD) as a task's."""
    setattr(exc, _ON_DATA, True)


def is_failed_on_data(exc: BaseException) -> bool:
    """Whether :func:`failed_on_data` marked ``exc``."""
    return bool(getattr(exc, _ON_DATA, False))


def refresh_job_id(plan: RefreshPlan) -> str:
    """The job id a refresh of ``plan`` is recorded under when it was given none."""
    return f"refresh-{plan.load_number + 1}-{plan.checkpoint_dir[-8:] if plan.checkpoint_dir else ''}"


def _nothing_done(view: ViewRef, plan: RefreshPlan, seconds: float) -> RefreshResult:
    # an index a refresh committed before could not update (a crash between the
    # two commits, a failed build) catches up here (no index: two metadata reads)
    upkeep = _index_upkeep(view.uri)
    return RefreshResult(
        view=view.name, from_version=plan.from_version, to_version=plan.to_version,
        view_version=plan.view_version, full=False,
        rows_inserted=0, rows_updated=0, rows_deleted=0, udf_rows_computed={}, tasks=0, tasks_resumed=0,
        seconds=seconds, runner="none", indexes=upkeep, first_fragments=_first_fragments(plan, []),
    )


def _index_upkeep(uri: str, rebuild: "list[indexes.IndexSpec] | None" = None,
                  committed: lance.LanceDataset | None = None) -> dict:
    """Bring the view's indexes up to date after its commit (``committed``; storage.indexes.catch_up)."""
    done = indexes.catch_up(uri, rebuild, committed.version if committed is not None else None, ds=committed)
    if not done.did_anything:
        return {}
    return {"updated": done.updated, "rebuilt": done.rebuilt, "failed": done.failed}


def estimated_seconds(plan: RefreshPlan) -> float:
    """The work of the plan's tasks: rows times the last measured cost per row."""
    return sum(t.rows for t in plan.tasks) * (plan.seconds_per_row or DEFAULT_SECONDS_PER_ROW)


def _run_tasks(plan: RefreshPlan, runner: "Runner") -> list[TaskResult]:
    """The plan's tasks on the runner, asking for the view's resource hints (the
    most any UDF column, or its chunker's / UDTF's function, asks: each task
    computes them all); the runner schedules them or says why not."""
    if not plan.tasks:
        return []
    request = request_of_definition(f"view {plan.view!r}", plan.definition_raw)
    return runner.run(plan.tasks, plan.definition_raw, estimated_seconds=estimated_seconds(plan), resources=request)


def _operation(removed: list[int], updated: list, new_fragments: list):
    """The commit's Lance operation. Rows only added: an Append (same row ids and
    version columns; on a view with stable row ids an Update derives each new
    row's version metadata in the commit, ~0.12 s per 1M rows). Lance checks an
    Update that only adds fragments against concurrent commits no more than an
    Append: the refresh lock keeps refreshes of a view apart."""
    if new_fragments and not removed and not updated:
        return LanceOperation.Append(new_fragments)
    return LanceOperation.Update(removed_fragment_ids=removed, updated_fragments=updated, new_fragments=new_fragments)


def _rebuild(view: ViewRef, plan: RefreshPlan, new_fragments: list):
    """A full refresh of the whole view replaces every row: an ``Overwrite``
    with the view's schema (row ids continue from the last one; an ``Update``
    removing every fragment derives each new row's version metadata, 1.4 s per
    10M rows, the Overwrite 2 ms). Only while the view's Lance field ids are
    0..n-1 in schema order, so the schema given anew numbers its fields as the
    new fragments' files do; else None (an Update)."""
    if not (plan.full and plan.scope is None):
        return None
    view_ds = objects.dataset(view.uri, version=plan.view_version)
    ids = [i for i, _ in field_ids(view_ds)]
    if ids != list(range(len(ids))):
        return None
    return LanceOperation.Overwrite(view_ds.schema, new_fragments)


def _stage_totals(results: list[TaskResult]) -> dict[str, float]:
    """The tasks' stage timings summed (``stage_read_s`` ...), when they were
    asked for (execution.stages); task-seconds, as ``task_s_total``."""
    totals: dict[str, float] = {}
    for r in results:
        for stage, seconds in (getattr(r, "stages", None) or {}).items():
            totals[f"stage_{stage}"] = totals.get(f"stage_{stage}", 0.0) + seconds
    return totals


def execute_refresh(view: ViewRef, plan: RefreshPlan, runner: "Runner", job_id: str | None = None) -> RefreshResult:
    """Run the plan's tasks and commit the result as one Lance transaction
    (recorded as job ``job_id``, default :func:`refresh_job_id`)."""
    start = time.perf_counter()
    started_at = time.time()
    if plan.commits_nothing:
        return _nothing_done(view, plan, time.perf_counter() - start)
    view.layout.clear_stale_checkpoints(view.name, keep=plan.checkpoint_dir)
    job = job_id or refresh_job_id(plan)
    try:
        results: list[TaskResult] = _run_tasks(plan, runner)
    except UdfError as exc:  # on_error="fail": the failed row is named and recorded, nothing is committed
        from mv_assets.storage.error_log import record_failure

        task = plan.tasks[0]
        record_failure(view.layout, view.name, job, exc, objects.dataset(task.src_uri, version=task.src_version),
                       view.source)
        raise
    executed = time.perf_counter()
    removed, updated, new_fragments = _view_changes(view, plan, results)
    errors = [e for r in results for e in r.errors]
    if errors:  # rows a UDF skipped (on_error="skip"): NULL values, recorded before the commit
        from mv_assets.storage.error_log import append_errors

        append_errors(view.layout, view.name, job, errors)
    udf_rows = _sum_counts([r.udf_rows for r in results])
    if plan.counted_by_tasks:  # inserts planned from metadata: what the tasks wrote is exact
        plan.rows_to_insert = sum(r.rows_written for r in results)
    replaced = sum(r.rows_replaced for r in results)
    if replaced and not plan.full:  # (a join view's rows computed again from the same source rows: updates)
        plan.rows_to_update += replaced
        plan.rows_to_insert -= replaced
        plan.rows_to_delete -= replaced
    operation = _rebuild(view, plan, new_fragments) or _operation(removed, updated, new_fragments)
    # an Overwrite drops the view's indexes: they are built again after it, as they were declared
    rebuild = (indexes.specs_to_rebuild(objects.dataset(view.uri, version=plan.view_version))
               if isinstance(operation, LanceOperation.Overwrite) else None)
    txn = Transaction(
        read_version=plan.view_version,
        operation=operation,
        transaction_properties={STATE_KEY: json.dumps(_state_record(view, plan, udf_rows, len(errors), results, job,
                                                                    started_at))},
    )
    try:
        committed = objects.commit(view.uri, txn, read_version=plan.view_version, max_retries=0)
    except CommitConflictError as exc:
        raise ConcurrentRefreshError(
            f"view {view.name!r} was changed by another writer during the refresh; nothing was committed"
        ) from exc
    if plan.checkpoint_dir:
        objects.remove_tree(plan.checkpoint_dir)
        # committed: the batch checkpoints are spent (refreshes of a view never overlap)
        objects.remove_tree(objects.join(plan.checkpoint_dir.rsplit("/", 1)[0], "batches"))
    if plan.after_commit is not None:
        plan.after_commit(committed)
    done = time.perf_counter()
    upkeep = _index_upkeep(view.uri, rebuild, committed)
    indexed = time.perf_counter()
    return RefreshResult(
        view=view.name, from_version=plan.from_version, to_version=plan.to_version, view_version=committed.version,
        full=plan.full, rows_inserted=plan.rows_to_insert, rows_updated=plan.rows_to_update,
        rows_deleted=plan.rows_to_delete, udf_rows_computed=udf_rows,
        udf_rows_resumed=_sum_counts([r.udf_rows_resumed for r in results]), tasks=len(plan.tasks),
        tasks_resumed=sum(1 for r in results if r.resumed), seconds=indexed - start,
        runner=runner.describe_last_run(),
        # (counted by its one task: its one fragment's rows are the rows it wrote)
        rows_by_fragment=({t.fragment_ids[0]: plan.rows_to_insert for t in plan.tasks}
                          if plan.counted_by_tasks and all(t.parts for t in plan.tasks)
                          else plan.details.get("rows_by_fragment") or _rows_by_fragment(plan.tasks)),
        timings={
            "execute_s": executed - start, "commit_s": done - executed,
            "task_s_total": sum(r.seconds for r in results),
            **({"index_s": indexed - done} if upkeep else {}),
            **_stage_totals(results),
        },
        indexes=upkeep, job_id=job, details=dict(plan.details),
        first_fragments=_first_fragments(plan, results), first=plan.load_number == 0,
    )


def _first_fragments(plan: RefreshPlan, results: list[TaskResult]) -> list[int] | None:
    """A join view's incremental refresh: the first table's fragments its
    changes touched (the plan's) and those of rows its tasks read by id whose
    view rows changed (RefreshResult.first_fragments)."""
    planned = plan.details.get("first_fragments")
    if plan.full or planned is None:
        return None
    return sorted({*planned, *(f for r in results for f in r.first_fragments)})
