"""Planning a join view's refresh (kind ``"join"``, :mod:`mv_assets.model.join_view`).

The refresh runs through the same pipeline as every view's: this plan, the
runner's tasks (:mod:`mv_assets.execution.join_tasks`, checkpointed per task)
and one Lance commit carrying the new rows, the removed ones and the refresh
state, which records the version of *every* source the view reflects.

* **incremental** (the delta rule, Δ(F⋈D) = ΔF⋈D_new + F_old⋈ΔD): the first
  table's rows to compute again are found from each source's changes since
  the version the view reflects:

  - rows of the first table written (inserted, updated) or deleted since;
  - for a joined table, rows written or deleted since: the view rows that
    came from them (by the stable row id each view row keeps) name their
    first-table rows; and the rows written since are *probed* by key on the
    table they join to (down the chain to the first table: a channel's new
    key finds its videos, their keys find their clips), so a row that now
    finds a match (an INNER row appearing, a LEFT row losing its padding) is
    found too.

  Every view row of those first-table rows is removed and their rows
  computed again from the sources at the new versions. UDF values are kept,
  with no UDF call, where a view row comes from the same source rows as
  before and none of the rows the UDF reads changed in a column it reads
  (compared by value between the two versions): a dimension update of a
  column no UDF reads costs 0 UDF calls; one of a column a UDF reads
  recomputes exactly the matching rows.
* **full**: every first-table row: the first refresh, ``mode="full"``, a new
  query, a source recreated, restored or overwritten, a change feed cleaned
  up, a refresh to an older version, rows written into the view by another
  tool, a backfill of a computed column the view reads.

Counts: ``rows_to_delete`` is the view rows removed, ``rows_to_insert`` the
first-table rows whose join is computed (the refresh reports the rows it
wrote), ``udf_rows`` at most those rows (the refresh counts the calls made).
A join view refreshes as a whole: ``fragments=`` widens to the whole source.
"""

import hashlib
import json
import re
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa

from mv_assets.execution.join_tasks import key_filter, match_key, planned_calls
from mv_assets.execution.tasks import TaskSpec
from mv_assets.model.definition import computed_column_names, short_error
from mv_assets.model.join_view import Join, JoinStep, row_id_column
from mv_assets.model.names import JOIN_UNDER_PREFIX, JOINED_ROW_ID_PREFIX, SOURCE_ROW_ID, SOURCE_ROW_VERSION
from mv_assets.model.planning import KeyPlan, Membership, distinct, isin, values_differ, without
from mv_assets.model.planning import column_ids as _ids
from mv_assets.ops import arrangements
from mv_assets.ops.refresh import RefreshPlan, _check_args, _place, read_history
from mv_assets.storage import objects
from mv_assets.storage.changes import (
    backfill_commits,
    commit_matters,
    commits_since,
    deletions_grew,
    foreign_writes,
    written_fragments,
)
from mv_assets.storage.identity import table_id
from mv_assets.storage.lance_compat import take_rows
from mv_assets.storage.refs import ViewRef
from mv_assets.storage.row_ids import require_current_format, require_stable_row_ids
from mv_assets.storage.state import read_refresh_state

__all__ = ["plan_join_refresh", "reach", "arrangements_used"]

# First-table rows per task (a join task holds its rows and their matches in memory).
ROWS_PER_TASK = 1 << 20


def _open(view: ViewRef, name: str, uri: str) -> lance.LanceDataset:
    try:
        ds = objects.dataset(uri)
    except (ValueError, OSError) as exc:
        if objects.is_dataset(uri):
            raise ValueError(f"cannot open {name!r}, a source of join view {view.name!r}: {short_error(exc)}") from exc
        raise ValueError(f"the source {name!r} of join view {view.name!r} is missing: no Lance dataset at {uri} "
                         "(removed outside mv_assets?); create it again (the view is then rebuilt) or drop the view"
                         ) from None
    require_current_format(ds, name, f"join view {view.name!r}")
    require_stable_row_ids(ds, name, f"join view {view.name!r}")
    return ds


def _read_fields(view_name: str, join: Join, datasets: list[lance.LanceDataset]) -> dict[str, dict[str, int]]:
    """The Lance field ids of the columns the view reads of each source; a
    column one of them no longer has (another tool dropped it) is refused in
    our words before anything is written (it failed with a KeyError)."""
    out: dict[str, dict[str, int]] = {}
    shown = view_name.removeprefix(JOIN_UNDER_PREFIX)  # (a join aggregate's join: the view the user named)
    for name, ds in zip(join.sources, datasets, strict=True):
        reads = list(dict.fromkeys(c for i in join.occurrences(name) for c in join.reads(i)))
        ids = {f.name(): f.id() for f in ds.lance_schema.fields()}
        missing = [c for c in reads if c not in ids]
        if missing:
            raise ValueError(
                f"view {shown!r} reads column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} "
                f"of {name!r}, which version {ds.version} does not have (dropped outside mv_assets?); nothing was "
                "written. Add the column back, or drop the view and create it without the column")
        out[name] = {c: ids[c] for c in reads}
    return out


def _fields_replaced(state, fields: dict[str, dict[str, int]]) -> str | None:
    """Why values of columns the view reads may have changed with no row
    version moving: another tool renamed columns (a swap) or dropped one and
    added it again, so the name holds another field (None: none did, or the
    newest refresh recorded no field ids)."""
    changed = [f"{name}.{c}" for name, now in fields.items()
               for c, i in ((state.source_fields or {}).get(name) or {}).items() if c in now and now[c] != i]
    if not changed:
        return None
    return (f"column{'s' if len(changed) > 1 else ''} {', '.join(changed)} hold{'' if len(changed) > 1 else 's'} "
            "another field than at the last refresh (renamed, or dropped and added again, outside mv_assets: new "
            "values, no row versions moved): rebuilt")


def _full_reason(view: ViewRef, join: Join, datasets: list[lance.LanceDataset], view_ds: lance.LanceDataset, state,
                 mode: str) -> str | None:
    """Why the refresh recomputes every row (None: it can be incremental)."""
    if state.source_version is None or not state.sources:
        return "first refresh"
    if mode == "full":
        return "mode='full'"
    if state.definition != view.definition.shape_fingerprint():
        return "the view's query changed"
    if foreign_writes(view_ds, state.view_version) is not None:
        return "another tool wrote into the view since its last refresh: rebuilt"
    for name, ds in zip(join.sources, datasets, strict=True):
        v = state.sources.get(name)
        if v is None:
            return f"no version of {name!r} recorded"
        recorded_id = (state.source_ids or {}).get(name)
        if recorded_id is not None and recorded_id != table_id(ds, recorded_id):
            return f"the source {name!r} was dropped and created again (its table identity changed): rebuilt"
        if ds.version < v:
            return f"{name!r} is at version {ds.version}, older than the reflected version {v}"
        if ds.version == v:
            continue
        history = read_history(ds, v, ds.version)
        if history.breaks_row_ids:
            return f"{name!r}: {history.breaks_row_ids} (row ids no longer mean the same rows)"
        if history.cleaned_up_at is not None:
            return f"{name!r}: the history of version {history.cleaned_up_at} was cleaned up (its changes are unknown)"
        computed = [c for i in join.occurrences(name) for c in join.reads(i) if c in computed_column_names(ds.schema)]
        if computed and backfill_commits(ds, v, ds.version, computed):
            return f"a backfill of {name}.{computed} (read by the view) rewrote values without moving row versions"
    return None


_CREATED = "__created"  # a written row's _row_created_at_version: above the reflected version, an insert
_VERSION = "__version"  # its _row_last_updated_at_version (the version a view row of it reflects)


def _changes(ds: lance.LanceDataset, v: int, columns: list[str]) -> tuple[pa.Table, np.ndarray]:
    """The rows written since version ``v`` (``columns``, ``_rowid`` and when
    each was created: inserted since, or updated) and the ids deleted since."""
    none = pa.table({c: pa.array([], ds.schema.field(c).type) for c in columns} | {
        _CREATED: pa.array([], pa.uint64()), _VERSION: pa.array([], pa.uint64()), "_rowid": pa.array([], pa.uint64()),
        "_rowaddr": pa.array([], pa.uint64())})
    if ds.version == v:
        return none, np.empty(0, np.int64)
    commits = commits_since(ds, v)
    if commits is not None and not any(commit_matters(t) for t in commits):
        return none, np.empty(0, np.int64)
    projection = {c: f"`{c}`" for c in columns} | {_CREATED: "_row_created_at_version",
                                                  _VERSION: "_row_last_updated_at_version"}
    # (only the fragments written since can hold rows written since, when the commits say so)
    moved = written_fragments(ds, v, commits) if commits is not None else None
    written = none if moved is not None and not moved else ds.scanner(
        columns=projection, filter=f"_row_last_updated_at_version > {v}", with_row_id=True, with_row_address=True,
        fragments=moved).to_table()
    deleted = _ids(ds.delta(begin_version=v, end_version=ds.version).get_deleted_row_ids().read_all())
    return written, deleted


def _matching(ds: lance.LanceDataset, keys: list[str], values: pa.Table, columns: list[str]) -> pa.Table:
    """Rows of ``ds`` whose ``keys`` equal one of the rows of ``values`` (NULLs never match)."""
    values = values.drop_null()
    if not values.num_rows:
        return ds.scanner(columns=columns, with_row_id=True, limit=0).to_table()
    wanted = list(dict.fromkeys(keys + columns))
    filter_sql = key_filter(keys, [values.column(0)])
    rows = ds.to_table(columns=wanted, filter=filter_sql, with_row_id=True)
    probe = pa.table({f"__k{n}": match_key(c) for n, c in enumerate(values.columns)}).group_by(
        [f"__k{n}" for n in range(len(keys))]).aggregate([])
    keyed = rows.append_column("__pos", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    keyed = keyed.rename_columns([f"__k{keys.index(n)}" if n in keys else n for n in keyed.column_names])
    for n in range(len(keys)):
        at = keyed.schema.get_field_index(f"__k{n}")
        keyed = keyed.set_column(at, f"__k{n}", match_key(keyed.column(at)))
    hit = keyed.select([*(f"__k{n}" for n in range(len(keys))), "__pos"]).join(
        probe, keys=[f"__k{n}" for n in range(len(keys))], join_type="inner", use_threads=False)
    return rows.take(hit.column("__pos"))


@dataclass
class _Reads:
    """What a plan read to find its rows: each arrangement probed (what was
    done to have it: kept, caught up, loaded) and the rows of tables scanned."""

    arranged: dict | None  # (None: probe by scans only)
    scanned: int = 0
    follow: "arrangements.Follow | None" = None  # (the view's arrangement probed: brought to the commit after it)


def _first_key_arranged(step: JoinStep, first: pa.Schema, joined: pa.Schema) -> bool:
    """Whether the first table's key of ``step`` (a table joined to the first
    by one column) is probed in an arrangement: both sides' keys alike."""
    return step.left_source == 0 and len(step.left) == 1 and arrangements.arranged_alike(
        joined.field(step.right[0]).type, first.field(step.left[0][1]).type)


def _joined_key_arranged(step: JoinStep, joined: pa.Schema) -> bool:
    """Whether the key of ``step``'s table (inner-joined to the first table by
    one column) is probed in an arrangement of its own (:func:`_unmatched`)."""
    return step.how == "inner" and step.left_source == 0 and len(step.right) == 1 and any(
        is_type(joined.field(step.right[0]).type) for is_type in arrangements.ARRANGEABLE)


def _probe(join: Join, datasets: list[lance.LanceDataset], i: int, rows: pa.Table, reads: _Reads) -> np.ndarray:
    """Ids of the first table's rows that reach, down the chain, the rows of
    source ``i`` given (with its key columns): those that may match them now.
    A one-column integer, string or binary key of the first table is probed
    in its arrangement (both sides' keys alike: integers, or text and binary),
    other keys by a filtered scan (counted in ``reads``)."""
    step = join.step_of(i)
    values = rows.select(list(step.right))
    s = step.left_source
    left_keys = [c for _, c in step.left]
    below = join.step_of(s).right if s != 0 else []
    if reads.arranged is not None and _first_key_arranged(step, datasets[0].schema, values.schema):
        wanted = distinct(arrangements.key_codes(values.column(0).drop_null()))
        ids, reads.arranged[f"{join.names[0]}.{left_keys[0]}"] = arrangements.key_rows(datasets[0], left_keys[0],
                                                                                        wanted)
        if ids is not None:
            return ids
    found = _matching(datasets[s], left_keys, values, list(below))
    reads.scanned += datasets[s].count_rows()
    if s == 0:
        return _ids(found)
    return _probe(join, datasets, s, found, reads)


def arrangements_used(join: Join, view_uri: str, schemas: list[pa.Schema]) -> list[dict]:
    """The arrangements a join view's refreshes probe, as its plans choose
    them (``schemas``: each source's, in the join's order): the view's
    provenance (:func:`_view_rows`), the first table's key of each table
    joined to it by one column of a type arranged alike on both sides
    (:func:`_probe`), and the key of each table inner-joined to it by one
    column (:func:`_unmatched`). Each: its name in a plan's
    ``details["arrangements"]``, what it is, its table and columns."""
    out = [{"name": "view", "kind": "the view's provenance", "uri": view_uri, "table": None,
            "columns": _view_columns(len(join.sources)), "addresses": True}]
    for step in join.steps:
        if _first_key_arranged(step, schemas[0], schemas[step.index]):
            left = step.left[0][1]
            out.append({"name": f"{join.names[0]}.{left}", "kind": "the first table's join key",
                        "table": join.sources[0], "columns": [left], "addresses": False})
        if _joined_key_arranged(step, schemas[step.index]):
            right = step.right[0]
            out.append({"name": f"{join.names[step.index]}.{right}", "kind": "an inner-joined table's key",
                        "table": join.sources[step.index], "columns": [right], "addresses": False})
    unique: dict[tuple, dict] = {}
    for use in out:  # (a table joined twice by the same key: one arrangement)
        unique.setdefault((use["table"], tuple(use["columns"])), use)
    return list(unique.values())


def reach(join: Join, datasets: list[lance.LanceDataset], i: int, rows: pa.Table) -> np.ndarray:
    """Ids of the first table's rows that the rows of source ``i`` (with its
    key columns) reach down the chain, found by filtered scans alone (no
    arrangement: the last-refresh checks find them apart from the plan)."""
    return _probe(join, datasets, i, rows, _Reads(None))


def _found(join: Join, datasets: list[lance.LanceDataset], deltas: dict[int, "_Delta"],
           view_ds: lance.LanceDataset, old_too: bool, reads: "_Reads"
           ) -> tuple[list[np.ndarray], pa.Table, int, np.ndarray]:
    """The delta rule's rows: the first-table rows each joined table's probes
    reach (every joined row written since, by its key now; with ``old_too``,
    every joined row updated or deleted since, by its key then too, whatever
    the view holds now), the view rows of the first-table rows changed or
    reached and of the joined rows changed (and the passes over the view that
    took), and every first-table row to compute again."""
    first_new = _ids(deltas[0].inserted) if 0 in deltas else np.empty(0, np.int64)  # (no view row yet)
    first_gone = deltas[0].gone if 0 in deltas else np.empty(0, np.int64)
    if reads.arranged is not None and any(i and len(d.gone) and d.arrived.num_rows for i, d in deltas.items()):
        # (rows of a joined table updated: the view's arrangement is probed for them after the first
        # table's key is probed for their keys now; both load at once)
        arrangements.ahead(view_ds, _view_columns(len(join.sources)))
    probed = [_probe(join, datasets, i, d.arrived, reads) for i, d in deltas.items() if i and d.arrived.num_rows]
    if old_too:
        probed += [_probe(join, datasets, i, gone, reads) for i, d in deltas.items() if i
                   for gone in [d.departed(list(join.step_of(i).right))] if gone.num_rows]
    known = distinct(np.concatenate([first_gone, *probed]))
    assert reads.arranged is not None
    held, passes = _view_rows(view_ds, known, {i: d.gone for i, d in deltas.items() if i}, len(join.sources),
                              reads)
    return probed, held, passes, distinct(np.concatenate([first_new, known, _ids(held, SOURCE_ROW_ID)]))


def _rows_differ(a: pa.Table, b: pa.Table) -> np.ndarray:
    """Mask of the rows of two aligned tables (same columns) whose values differ."""
    differ = np.zeros(a.num_rows, dtype=bool)
    for name in a.column_names:
        differ |= values_differ(a.column(name), b.column(name))
    return differ


@dataclass
class _Delta:
    """One source's changes since the version the view reflects, as the view
    sees them: an update that changed no column the view reads is no change."""

    inserted: pa.Table  # rows created since (the columns the view reads, _rowid)
    updated: pa.Table  # rows updated since in a column the view reads: their values now
    before: pa.Table  # ... and at the reflected version (aligned with ``updated``)
    deleted: np.ndarray
    was_deleted: pa.Table | None = None  # the deleted rows' values at the reflected version (read when asked)
    written_in: tuple[int, ...] = ()  # the fragments holding rows written since (in any column)

    @property
    def gone(self) -> np.ndarray:
        """Ids of the rows whose view rows go (updated or deleted)."""
        return np.concatenate([_ids(self.updated), self.deleted])

    @property
    def arrived(self) -> pa.Table:
        """The rows as they are now that may match rows of the other sources (inserted or updated)."""
        return pa.concat_tables([self.inserted, self.updated])

    def departed(self, keys: list[str]) -> pa.Table:
        """The ``keys`` of the rows as they were at the reflected version that
        no longer are (updated or deleted): the rows they matched then."""
        parts = [self.before.select(keys)]
        if self.was_deleted is not None:
            parts.append(self.was_deleted.select(keys))
        return pa.concat_tables(parts)


def _delta(ds: lance.LanceDataset, reflected: int, reads: list[str], *, old_keys: list[str] | None = None) -> _Delta:
    """One source's changes; ``old_keys``: also read the deleted rows' values
    of these columns at the reflected version (see :func:`_departed_probes`)."""
    written, deleted = _changes(ds, reflected, reads)
    created = np.asarray(written.column(_CREATED).to_numpy(), np.int64)
    written = written.drop_columns([_CREATED])  # (the version stays: rows written since, their versions)
    where = tuple(int(f) for f in np.unique(np.asarray(written.column("_rowaddr").to_numpy(), np.uint64) >> 32))
    inserted = written.filter(pa.array(created > reflected))
    updated = written.filter(pa.array(created <= reflected))
    was_deleted = None
    if old_keys is not None:
        then = ds.checkout_version(reflected)
        was_deleted = take_rows(then, pa.array(deleted, pa.uint64()), old_keys) if len(deleted) else \
            then.scanner(columns=old_keys, limit=0).to_table()
    if not updated.num_rows:
        return _Delta(inserted, updated, updated.select(reads), deleted, was_deleted, where)
    # (updated rows existed at the reflected version: read there by stable row id, in the same order)
    before = take_rows(ds.checkout_version(reflected), updated.column("_rowid"), reads)
    differ = pa.array(_rows_differ(before, updated.select(reads)))
    return _Delta(inserted, updated.filter(differ), before.filter(differ), deleted, was_deleted, where)


_STAGED_SOURCE = re.compile(r"__j(\d+)__")


def _departed_probes(join: Join) -> bool:
    """Whether a joined row's *old* key must be probed to the first table too.

    Every first-table row keeps the stable ids of the joined rows of its view
    rows, so a change to a joined row finds the view rows it made. A
    first-table row that has no view row is found only by probing: the new
    key of a row written finds the rows that match it now. Its old key is
    needed when losing a match can make a row *enter* the view: a LEFT join
    (the row becomes NULL-padded) whose filter reads a joined table's columns
    (``customers.name IS NULL``, the anti-join that finds orphans). An inner
    join is monotone (losing a joined row only removes view rows, found by
    their ids), and so is a filter on the first table's columns alone."""
    if not join.filter or not any(s.how == "left" for s in join.steps):
        return False
    return any(int(i) > 0 for i in _STAGED_SOURCE.findall(join.filter))


def _input_changes(join: Join, definition, deltas: dict[int, _Delta]) -> dict[str, dict]:
    """For each UDF column, per source it reads: the ids of rows updated since
    the reflected version in a column the UDF reads (its value there is
    computed again; every other view row keeps its value)."""
    out: dict[str, dict] = {}
    for c in definition.udf_columns:
        per: dict[str, list[int]] = {}
        for i in join.udf_sources.get(c.name, []):
            d = deltas.get(i)
            if d is None or not d.updated.num_rows:
                continue
            cols = list(dict.fromkeys(col for ref, (s, col) in join.refs.items()
                                      if s == i and ref in c.the_udf.input_columns))
            differ = _ids(d.updated)[_rows_differ(d.before.select(cols), d.updated.select(cols))]
            if len(differ):
                per[str(i)] = differ.tolist()
        out[c.name] = per
    return out


def _view_columns(sources: int) -> list[str]:
    """The view's columns its arrangement holds: each source row's id (the
    first table's first) and the first-table row's version (what a task
    computing that row again writes: carried, so no task reads it by id)."""
    return [*(row_id_column(i) for i in range(sources)), SOURCE_ROW_VERSION]


def _view_rows(view_ds: lance.LanceDataset, first: np.ndarray, joined: dict[int, np.ndarray], sources: int,
               reads: _Reads) -> tuple[pa.Table, int]:
    """The view's rows (first-table id, view row id and address) of every
    first-table row in ``first`` or that came from a row of source ``i`` in
    ``joined[i]``, and then every other view row of the first-table rows
    found so (a row may have several). Probed in the view's arrangement (its
    provenance columns, kept in memory: :mod:`mv_assets.ops.arrangements`;
    what was done to have it goes in ``reads.arranged["view"]``, and what
    brings it to the refresh's commit in ``reads.follow``), else read by
    streaming the view's key columns (memory: the rows kept), once, or twice
    when rows were found through a joined table; and the passes made (0:
    nothing to look for, or probed)."""
    provenance = _view_columns(sources)
    if not len(first) and not any(len(ids) for ids in joined.values()):
        reads.follow = arrangements.follower(view_ds, provenance)  # (the rows the commit adds: added after it)
        return _stream_keys(view_ds, first, {}, provenance), 0
    assert reads.arranged is not None
    held, reads.arranged["view"], reads.follow = arrangements.view_rows(
        view_ds, provenance, first, {row_id_column(i): ids for i, ids in joined.items() if len(ids)})
    if held is not None:
        return held, 0
    found = _stream_keys(view_ds, first, joined, provenance)
    passes = int(bool(len(first) or any(len(ids) for ids in joined.values())))
    more = without(_ids(found, SOURCE_ROW_ID), first)
    if len(more):  # first-table rows reached through a joined row: each of their view rows
        rest = _stream_keys(view_ds, more, {}, provenance)
        passes += 1
        found = pa.concat_tables([found, rest])
        _, once = np.unique(_ids(found, "_rowid"), return_index=True)  # (a view row found both ways, once)
        found = found.take(pa.array(once))
    return found, passes


def _stream_keys(view_ds: lance.LanceDataset, first: np.ndarray, joined: dict[int, np.ndarray],
                 provenance: list[str]) -> pa.Table:
    """The view rows, as :func:`mv_assets.ops.arrangements.view_rows` gives
    them, read by streaming the view's provenance columns."""
    joined = {i: ids for i, ids in joined.items() if len(ids)}
    names = list(provenance)
    schema = pa.schema([("_rowid", pa.uint64()), ("_rowaddr", pa.uint64()), *((n, pa.int64()) for n in names)])
    if not len(first) and not joined:
        return schema.empty_table()
    wanted = Membership(first) if len(first) else None
    by_source = {i: Membership(ids) for i, ids in joined.items()}
    kept = []
    for batch in view_ds.to_batches(columns=names, with_row_id=True, with_row_address=True, batch_size=1 << 16,
                                    batch_readahead=2, fragment_readahead=2):
        mask = wanted.mask(_ids(batch, SOURCE_ROW_ID)) if wanted is not None else np.zeros(batch.num_rows, bool)
        for i, m in by_source.items():
            mask |= m.mask(np.asarray(batch.column(row_id_column(i)).fill_null(-1).to_numpy(
                zero_copy_only=False), np.int64))
        if mask.any():
            rows = batch.filter(pa.array(mask))
            kept.append(pa.record_batch([rows.column("_rowid"), rows.column("_rowaddr"),
                                         *(rows.column(n).cast(pa.int64()).fill_null(-1) for n in names)],
                                        schema=schema))
    return pa.Table.from_batches(kept, schema=schema) if kept else schema.empty_table()


def plan_join_refresh(
    view: ViewRef, src_version: int | None = None, *, mode: str = "auto", fragments: list[int] | None = None,
    recompute: list[str] | None = None, max_rows_per_task: int | None = None, checkpoint_size: int | None = None,
    parallelism: int = 1, exact: bool = True,
) -> RefreshPlan:
    """Plan a refresh of join view ``view`` (see the module docstring);
    arguments as :func:`mv_assets.ops.refresh.plan_refresh`'s."""
    _check_args(mode, max_rows_per_task, checkpoint_size)
    if recompute:
        raise ValueError(f"recompute applies to UDF columns of query views; join view {view.name!r} is computed "
                         "again with mode='full'")
    definition = view.definition
    join = Join.of(definition)
    uris = [view.source_uri, *(view.layout.table_uri(n) for n in join.sources[1:])]
    datasets = [_open(view, n, u) for n, u in zip(join.sources, uris, strict=True)]
    if src_version is not None:
        datasets[0] = datasets[0].checkout_version(src_version)
    view_ds = view.dataset()
    state = read_refresh_state(view_ds)
    fields = _read_fields(view.name, join, datasets)
    versions = {n: ds.version for n, ds in zip(join.sources, datasets, strict=True)}
    ids = {n: table_id(ds, (state.source_ids or {}).get(n)) for n, ds in zip(join.sources, datasets, strict=True)}
    why_full = _full_reason(view, join, datasets, view_ds, state, mode) or _fields_replaced(state, fields)
    if why_full is not None and mode == "incremental_strict" and state.source_version is not None:
        raise ValueError(f"refresh of {view.name!r} cannot be incremental: {why_full}")
    recorded = state.sources or {}
    # each source's versions (reflected -> now) where they differ: what the refresh brings in
    details: dict = {"sources": versions, "source_ids": ids, "source_fields": fields,
                     "moved": {n: [recorded.get(n), v] for n, v in versions.items() if recorded.get(n) != v}}
    per_task = max_rows_per_task or ROWS_PER_TASK
    if why_full is not None:
        return _full_plan(view, definition, datasets, view_ds, state, why_full, per_task, checkpoint_size, details,
                          exact)
    assert state.sources is not None  # (an incremental refresh follows one that recorded them)
    reflected: dict[str, int] = state.sources
    moved = {n: v for n, v in versions.items() if reflected.get(n) != v}
    details["sources_moved"] = bool(moved)
    old_too = _departed_probes(join)
    deltas = {i: _delta(ds, reflected[name], join.reads(i),
                        old_keys=list(join.step_of(i).right) if i and old_too else None)
              for i, (name, ds) in enumerate(zip(join.sources, datasets, strict=True)) if name in moved}
    reads = _Reads({})
    probed, held, passes, touched = _found(join, datasets, deltas, view_ds, old_too, reads)
    details["arrangements"] = reads.arranged
    changed = _input_changes(join, definition, deltas) if len(touched) else {}
    reason = ("incremental (" + ", ".join(f"{n} {reflected[n]} -> {v}" for n, v in moved.items()) + ")"
              if moved else "incremental (no source moved)")
    where = _place(view, datasets[0], view_ds, f"join|{json.dumps(versions, sort_keys=True)}|incremental",
                   per_task, checkpoint_size)
    # (first-table rows deleted since: their view rows go, nothing is computed for them; nor for those an
    # inner join's row deleted left with no match: _unmatched)
    alive = touched[~isin(touched, deltas[0].deleted)] if 0 in deltas else touched
    unmatched = _unmatched(join, datasets, reflected, deltas, held, reads)
    alive = alive[~isin(alive, unmatched)]
    details["work"] = _work(join, deltas, probed, passes * view_ds.count_rows(), len(alive), held.num_rows,
                            reads.scanned)
    details["adaptive"] = adaptive = _adaptive(definition, len(alive), datasets[0].count_rows(), mode)
    if adaptive["chosen"] == "full":
        return _full_plan(view, definition, datasets, view_ds, state, adaptive["why"], per_task, checkpoint_size,
                          details, exact)
    appended, by_id = _appended(datasets[0], reflected[join.sources[0]], deltas.get(0), alive, per_task)
    reusable = _reusable(definition, join, held, changed, deltas)
    at = [d.version for d in datasets]
    tasks = where.checkpointed(
        [_task(where, {"uris": uris, "versions": at, "fragments": group}, rows) for group, rows in appended]
        + [_task(where, _task_args(uris, datasets, view, view_ds, chunk, changed, held, reusable, deltas.get(0)),
                 len(chunk)) for chunk in (by_id[k:k + per_task] for k in range(0, len(by_id), per_task))])
    details["work"]["first_rows_scanned"] = int(sum(rows for _, rows in appended))
    details["work"]["first_rows_only_removed"] = len(unmatched)
    details["first_fragments"] = _first_fragments(datasets[0], reflected[join.sources[0]], deltas.get(0), unmatched)
    rows_out, udf_rows, replaced = _counted(definition, tasks, exact, len(alive))
    return RefreshPlan(
        view=view.name, source=definition.source, from_version=state.source_version, to_version=datasets[0].version,
        view_version=view_ds.version, full=False, reason=reason, rows_to_insert=rows_out - replaced,
        rows_to_update=replaced, rows_to_delete=held.num_rows - replaced, udf_rows=udf_rows, tasks=tasks,
        keys=KeyPlan(delete=touched), view_key_addrs=(_ids(held, SOURCE_ROW_ID), _ids(held, "_rowaddr")),
        checkpoint_dir=where.checkpoint_dir, definition_raw=definition.encode(), load_number=state.load_number,
        scope=None, seconds_per_row=state.seconds_per_row, source_id=ids[join.sources[0]],
        counted_by_tasks=bool(tasks) and not exact, details=details,
        after_commit=_follow(reads.follow, details),
    )


def _follow(follow: "arrangements.Follow | None", details: dict):
    """What the refresh calls with the view committed: its arrangement
    brought to the commit (what was done in ``details["arrangements"]["view"]["after"]``)."""
    if follow is None:
        return None
    # kept and followed: said before the commit, whose record names the arrangements used (an
    # append-only refresh's said none: `mv-assets arrangements` showed no last refresh)
    if details.get("sources_moved"):  # (nothing moved: nothing probed, nothing to follow but the commit)
        details.setdefault("arrangements", {}).setdefault("view", {"how": "kept"})

    def after(ds: lance.LanceDataset) -> None:
        try:
            done = follow.after(ds)
        except Exception as exc:  # (committed already: the arrangement is dropped, loaded again when needed)
            arrangements.forget(ds.uri, disk=False)
            done = f"dropped: {type(exc).__name__}: {exc}"
        details["arrangements"].setdefault("view", {"how": "kept"})["after"] = done
    return after


def _first_fragments(ds: lance.LanceDataset, reflected: int, first: "_Delta | None",
                     unmatched: np.ndarray) -> list[int] | None:
    """The first table's fragments whose rows changed since the reflected
    version (written, or losing rows: deleted or moved by an update), and
    those of the rows whose view rows only go (``unmatched``: their addresses
    taken, no data read): the partitions whose view rows the plan touches;
    the tasks add those of rows reached through joined tables that they read
    (``TaskResult.first_fragments``). None: not known (that version cleaned up)."""
    gone = set()
    if len(unmatched):
        addresses = take_rows(ds, pa.array(unmatched.view(np.uint64)), ["_rowaddr"]).column("_rowaddr")
        gone = set((np.unique(np.asarray(addresses.to_numpy(), np.uint64) >> np.uint64(32))).tolist())
    if first is None:
        return sorted(gone)
    grew = deletions_grew(ds, reflected)
    return None if grew is None else sorted(set(first.written_in) | set(grew) | gone)


def _unmatched(join: Join, datasets: list[lance.LanceDataset], reflected: dict[str, int],
               deltas: dict[int, "_Delta"], held: pa.Table, reads: "_Reads") -> np.ndarray:
    """First-table rows not changed since whose view rows came from a row of
    an inner-joined table (joined to the first table by one integer, string or binary column)
    that was deleted or moved to another key since, when no row of that table
    holds that key now: they join nothing, so their view rows only go, and no
    task reads them to compute nothing (a dimension deleted under an inner
    join). The key's rows now are probed in the joined table's arrangement."""
    out = []
    for i, d in deltas.items() if held.num_rows else ():  # (no view row went: none only goes)
        step = join.step_of(i) if i else None
        if step is None or not _joined_key_arranged(step, datasets[i].schema):
            continue
        key = step.right[0]
        field = datasets[i].schema.field(key)
        ids, old = [], []
        if len(d.deleted):
            try:  # (the deleted rows' keys then; a row created and deleted since has none: not this way)
                then = d.was_deleted if d.was_deleted is not None else take_rows(
                    datasets[i].checkout_version(reflected[join.sources[i]]), pa.array(d.deleted.view(np.uint64)),
                    [key])
            except Exception:  # (Lance's own error for a row id it does not hold, whatever its type)
                continue
            if then.num_rows != len(d.deleted):
                continue
            ids.append(d.deleted)
            old.append(then.column(key).combine_chunks())
        if d.updated.num_rows:
            moved = values_differ(d.before.column(key), d.updated.column(key))
            ids.append(_ids(d.updated)[moved])
            old.append(d.before.column(key).combine_chunks().filter(pa.array(moved)))
        gone_ids = np.concatenate(ids) if ids else np.empty(0, np.int64)
        if not len(gone_ids):
            continue
        keys = pa.chunked_array(old, type=field.type)
        valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False), bool)
        gone_ids = gone_ids[valid]
        gone_keys = arrangements.key_codes(keys.drop_null())
        if not len(gone_ids):
            continue
        assert reads.arranged is not None
        present, reads.arranged[f"{join.names[i]}.{key}"] = arrangements.present(datasets[i], key,
                                                                                 distinct(gone_keys))
        if present is None:
            continue
        dead = ~isin(gone_keys, present)
        order = np.argsort(gone_ids)
        gone_ids, dead = gone_ids[order], dead[order]
        came_from = _ids(held, row_id_column(i))
        at = np.minimum(np.searchsorted(gone_ids, came_from), len(gone_ids) - 1)
        out.append(_ids(held, SOURCE_ROW_ID)[(gone_ids[at] == came_from) & dead[at]])
    if not out:
        return np.empty(0, np.int64)
    found = distinct(np.concatenate(out))
    if 0 in deltas:  # (a first-table row written since may hold another key now: computed)
        found = found[~isin(found, _ids(deltas[0].arrived))]
    return found


# An incremental refresh recomputing at least this share of the first table's
# rows (a view without UDF columns: with them, the rows an incremental refresh
# copies cost no call, a full one calls every row) is planned full instead:
# reading rows by id costs more per row than a scan (Snowflake's ADAPTIVE, Enzyme's
# cost model: the choice and its reason are in the plan's details["adaptive"]).
ADAPTIVE_FULL_SHARE = 0.5


def _adaptive(definition, rows: int, first_rows: int, mode: str) -> dict:
    """Whether recomputing ``rows`` of the first table's ``first_rows`` costs
    more incrementally than in full: the estimate, the threshold and the choice."""
    share = rows / first_rows if first_rows else 0.0
    out = {"rows": rows, "first_table_rows": first_rows, "share": round(share, 4), "threshold": ADAPTIVE_FULL_SHARE,
           "chosen": "incremental"}
    if mode == "auto" and not definition.udf_columns and share >= ADAPTIVE_FULL_SHARE and rows > 1000:
        out["chosen"] = "full"
        out["why"] = (f"adaptive: the change touches {rows:,} of {first_rows:,} first-table rows ({share:.0%}, "
                      f"at least {ADAPTIVE_FULL_SHARE:.0%}): recomputing the view in full is cheaper")
    return out


def _work(join: Join, deltas: dict[int, "_Delta"], probed: list[np.ndarray], view_keys_read: int,
          first_rows: int, view_rows_removed: int, key_rows_scanned: int = 0) -> dict:
    """What the plan read and will rewrite: each source's changed rows, the
    first-table rows its probes found, the view's key values it read (0:
    probed in its arrangement), the source rows its key probes scanned (0:
    probed in an arrangement), the first-table rows to compute and the view
    rows to remove."""
    out = {"changed_rows": {join.names[i]: int(d.inserted.num_rows + d.updated.num_rows + len(d.deleted))
                            for i, d in deltas.items()},
           "probe_matches": int(sum(len(p) for p in probed)), "view_key_rows_read": int(view_keys_read),
           "first_rows_computed": int(first_rows), "view_rows_removed": int(view_rows_removed)}
    if key_rows_scanned:
        out["key_rows_scanned"] = int(key_rows_scanned)
    return out


def _counted(definition, tasks: list[TaskSpec], exact: bool, first_rows: int
             ) -> tuple[int, dict[str, int], int]:
    """The view rows the tasks will write, each UDF column's calls and the rows
    replacing a view row of the same provenance (updates): exact for a dry run
    (the join computed, no UDF called), else at most the first-table rows and
    no update known (the refresh counts what its tasks did)."""
    if not exact:
        return first_rows, ({c.name: first_rows for c in definition.udf_columns} if first_rows else {}), 0
    rows, calls, replaced = 0, {c.name: 0 for c in definition.udf_columns}, 0
    for t in tasks:
        n, per, same = planned_calls(definition, t.kind_args or {})
        rows, replaced = rows + n, replaced + same
        for k, v in per.items():
            calls[k] += v
    return rows, calls, replaced


def _task_args(uris: list[str], datasets: list[lance.LanceDataset], view: ViewRef, view_ds: lance.LanceDataset,
               chunk: np.ndarray, changed: dict, held: pa.Table, reusable: np.ndarray, first: "_Delta | None"
               ) -> dict:
    """An incremental task's arguments: the first-table rows ``chunk`` to
    compute; of the view rows the refresh removes (``held``) that came from
    them, the provenance of each (what a row computed again from the same
    source rows replaces: an update), the ids of those it may copy UDF values
    from (``reusable``: read whole); and the versions of the other first-table
    rows (a row read by id has none: Lance's take cannot read it): of those
    not written since, their view rows' (the view's arrangement holds it), of
    those written since, the change feed's."""
    held_first = _ids(held, SOURCE_ROW_ID)
    mine = isin(held_first, chunk)
    provenance = [n for n in held.column_names if n.startswith(JOINED_ROW_ID_PREFIX)]
    written_first = first.arrived if first is not None else None  # (their versions: read with them)
    written = _ids(written_first)[isin(_ids(written_first), chunk)] if written_first is not None else held_first[:0]
    # (a first-table row of no reusable view row and not written since: its version is its view rows')
    rest = mine & ~reusable & ~isin(held_first, np.concatenate([written, held_first[mine & reusable]]))
    _, one = np.unique(held_first[rest], return_index=True)
    args = {"uris": uris, "versions": [d.version for d in datasets], "ids": chunk.tolist(), "view_uri": view.uri,
            "reuse": {"view_version": view_ds.version, "changed": changed,
                      "rows": _ids(held, "_rowid")[mine & reusable].tolist(),
                      # (what the view's arrangement holds of those rows: the task reads only their UDF values)
                      "held": {n: _ids(held, n)[mine & reusable].tolist()
                               for n in [SOURCE_ROW_ID, *provenance, SOURCE_ROW_VERSION]},
                      "provenance": {n: _ids(held, n)[mine].tolist() for n in [SOURCE_ROW_ID, *provenance]}}}
    known = [held_first[rest][one], _ids(held, SOURCE_ROW_VERSION)[rest][one]]  # (the view holds it: no read)
    if written_first is not None and written_first.num_rows:
        new = isin(_ids(written_first), chunk)
        known = [np.concatenate([known[0], _ids(written_first)[new]]),
                 np.concatenate([known[1], _ids(written_first, _VERSION)[new]])]
    if len(known[0]):
        args["known_versions"] = [known[0].tolist(), known[1].tolist()]
    return args


def _reusable(definition, join: Join, held: pa.Table, changed: dict, deltas: dict[int, "_Delta"]) -> np.ndarray:
    """Which of the view rows removed (``held``) a row computed again from the
    same source rows may copy a UDF value from: for some UDF column, none of
    the source rows it reads changed in a column it reads (``changed``) or
    was deleted. The others are computed again whatever the task finds, so no
    task reads them."""
    out = np.zeros(held.num_rows, dtype=bool)
    for c in definition.udf_columns:
        ok = np.ones(held.num_rows, dtype=bool)
        for i in join.udf_sources.get(c.name, []):
            ids = _ids(held, row_id_column(i))
            gone = [np.asarray(changed.get(c.name, {}).get(str(i), []), np.int64)]
            if i in deltas:
                gone.append(np.asarray(deltas[i].deleted, np.int64))
            ok &= ~isin(ids, distinct(np.concatenate(gone)))
        out |= ok
    return out


def _appended(ds: lance.LanceDataset, reflected: int, delta: "_Delta | None", alive: np.ndarray,
              per_task: int = ROWS_PER_TASK) -> tuple[list[tuple[list[int], int]], np.ndarray]:
    """The first table's fragments written since the reflected version whose
    every row was inserted since (an append's), in groups of about
    ``per_task`` rows: their tasks scan them, as a full refresh's do, where
    reading their rows by id costs a random read each (~1.5-2.5 us a row);
    and the other rows of ``alive``, read by id."""
    if delta is None or not delta.inserted.num_rows:
        return [], alive
    try:
        top = max(ds.checkout_version(reflected).fragment_ids(), default=-1)
    except Exception:  # (the reflected version cleaned up: every row read by id, as before)
        return [], alive
    where = np.asarray(delta.inserted.column("_rowaddr").to_numpy(), np.uint64) >> np.uint64(32)
    fids, counts = np.unique(where[where > top], return_counts=True)
    whole = [(int(f), int(n)) for f, n in zip(fids.tolist(), counts.tolist(), strict=True)
             if (frag := ds.get_fragment(int(f))) is not None and frag.count_rows() == n]
    if not whole:
        return [], alive
    scanned = isin(where.astype(np.int64), np.array([f for f, _ in whole], np.int64))
    groups: list[tuple[list[int], int]] = []
    for fid, n in whole:
        if groups and groups[-1][1] + n <= per_task:
            groups[-1] = (groups[-1][0] + [fid], groups[-1][1] + n)
        else:
            groups.append(([fid], n))
    return groups, alive[~isin(alive, _ids(delta.inserted)[scanned])]


def _digest(h, value) -> None:
    """Feed ``value`` (JSON-like: a task's arguments) to the hash ``h``: a
    list of ints as its int64 bytes (a task's row ids: 100,000 of them
    through ``json.dumps`` cost ~0.08 s), a dict by sorted key, the rest as JSON."""
    if isinstance(value, dict):
        h.update(b"{")
        for k in sorted(value):
            h.update(json.dumps(k).encode() + b":")
            _digest(h, value[k])
        h.update(b"}")
    elif isinstance(value, list) and value and type(value[0]) is int and \
            (ints := np.asarray(value)).dtype == np.int64 and ints.ndim == 1:
        h.update(b"i%d:" % len(value))
        h.update(ints.tobytes())
    elif isinstance(value, list):
        h.update(b"[")
        for v in value:
            _digest(h, v)
            h.update(b",")
        h.update(b"]")
    else:
        h.update(json.dumps(value).encode())


def _task(where, args: dict, rows: int) -> TaskSpec:
    h = hashlib.sha256(f"{where.plan_key}|".encode())
    _digest(h, args)
    task_id = h.hexdigest()[:16]
    return TaskSpec(task_id=task_id, src_uri=where.src_uri, src_version=where.src_version, parts=[],
                    view_uri=where.view_uri, rows=int(rows), checkpoint_dir=where.checkpoint_dir,
                    view_version=where.view_version, partitions=[], kind_args=args)


def _full_plan(view: ViewRef, definition, datasets, view_ds, state, reason: str, per_task: int,
               checkpoint_size: int | None, details: dict, exact: bool) -> RefreshPlan:
    """Every first-table row, by fragment groups of about ``per_task`` rows (a
    larger fragment in slices of ``per_task`` rows)."""
    where = _place(view, datasets[0], view_ds, f"join|full|{json.dumps(details['sources'], sort_keys=True)}",
                   per_task, checkpoint_size)
    uris = [d.uri for d in datasets]
    tasks, group, rows, total = [], [], 0, 0
    by_fragment: dict[int, int] = {}
    at = [d.version for d in datasets]
    for f in datasets[0].get_fragments():
        n = by_fragment[f.fragment_id] = f.count_rows()
        total += n
        if n > per_task:  # (read by offset and limit within the fragment)
            tasks += [_task(where, {"uris": uris, "versions": at, "slice": [f.fragment_id, k, min(per_task, n - k)]},
                            min(per_task, n - k)) for k in range(0, n, per_task)]
            continue
        if group and rows + n > per_task:
            tasks.append(_task(where, {"uris": uris, "versions": [d.version for d in datasets], "fragments": group},
                               rows))
            group, rows = [], 0
        group.append(f.fragment_id)
        rows += n
    if group:
        tasks.append(_task(where, {"uris": uris, "versions": [d.version for d in datasets], "fragments": group}, rows))
    held = view_ds.count_rows()
    where.checkpointed(tasks)
    rows_out, udf_rows, _ = _counted(definition, tasks, exact, total)  # (a full refresh replaces every row)
    return RefreshPlan(
        view=view.name, source=definition.source, from_version=state.source_version, to_version=datasets[0].version,
        view_version=view_ds.version, full=True, reason=reason, rows_to_insert=rows_out, rows_to_update=0,
        rows_to_delete=held, udf_rows=udf_rows, tasks=tasks,
        checkpoint_dir=where.checkpoint_dir, definition_raw=definition.encode(), load_number=state.load_number,
        scope=None, seconds_per_row=state.seconds_per_row, source_id=details["source_ids"][definition.source],
        counted_by_tasks=bool(tasks) and not exact,
        details={**details, "sources_moved": True, "rows_by_fragment": by_fragment},
    )
