"""The status table: one record per view, as Teiid's MatView status table.

The durable facts (what the view reflects, load number, cardinality, when and
on which host it was loaded) live in the view's own Lance commits: a view with
no other record is LOADED (or NEVER_LOADED), read from its newest commit. A
load state record ``<catalog>/_mv_assets/status/<view>.json`` exists only while
it says what the commits cannot: LOADING (a refresh under way, with its host and
process, so a killed one reads as FAILED_LOAD) and FAILED_LOAD (the last error).
A refresh writes LOADING before it runs and removes the record after its commit
lands (a FAILED_LOAD instead when it fails); a LOADING record whose load number
the view's commits have reached (a refresh stopped between its commit and the
removal) reads as LOADED. The record is rewritten in place with a checksum, so
a reader gets one whole record: ``objects.write_record``. The status of a
whole catalog lists the status folder once and reads only the records there
(a steady catalog: no record read at all). Staleness is measured live from the
source's change feed when the status is read.

A view whose source dataset is gone (removed by another tool) shows as
SOURCE_MISSING, and one whose record cannot be read at all as UNREADABLE,
both with the reason in ``last_error`` and the facts that could not be
measured left None: one broken view never hides the others' records.
"""

import datetime as dt
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import lance
import pyarrow as pa

from mv_assets.model.definition import (
    SOURCE_ROW_ID,
    SOURCE_ROW_VERSION,
    VIEW_METADATA_KEY,
    ViewDefinition,
    computed_column_names,
    foreign_columns,
)
from mv_assets.model.join_agg_view import is_join_under
from mv_assets.model.join_view import Join, row_id_column
from mv_assets.model.policy import POLICY_METADATA_KEY, Decision, RefreshPolicy, decide
from mv_assets.model.secrets import redact
from mv_assets.storage import objects
from mv_assets.storage.changes import BACKFILL_KEY, commit_matters, commits_since, foreign_writes, pending_versions
from mv_assets.storage.identity import table_id
from mv_assets.storage.layout import Layout
from mv_assets.storage.refs import ViewRef
from mv_assets.storage.state import read_refresh_state
from mv_assets.storage.versions import listed_versions

if TYPE_CHECKING:
    from mv_assets.storage.state import RefreshState
    from mv_assets.storage.summaries import TableSummary

__all__ = [
    "ViewStatus",
    "LOADING",
    "LOADED",
    "FAILED_LOAD",
    "NEVER_LOADED",
    "SOURCE_MISSING",
    "UNREADABLE",
    "view_status",
    "unreadable_status",
    "record_load_state",
    "clear_load_state",
    "keep_failed_refresh",
    "load_record",
    "recorded_views",
    "refresh_decision",
    "pending_source_versions",
    "joined_pending",
    "source_replaced",
    "status_table",
]

LOADING = "LOADING"
LOADED = "LOADED"
FAILED_LOAD = "FAILED_LOAD"
NEVER_LOADED = "NEVER_LOADED"
SOURCE_MISSING = "SOURCE_MISSING"  # the view's source dataset is gone
UNREADABLE = "UNREADABLE"  # the view's own record could not be read

STATUS_SCHEMA = pa.schema(
    [
        ("name", pa.string()),
        ("source", pa.string()),
        ("load_state", pa.string()),
        ("valid", pa.bool_()),
        ("cardinality", pa.int64()),
        ("load_number", pa.int64()),
        ("updated", pa.timestamp("us", tz="UTC")),
        ("node", pa.string()),
        ("source_version", pa.int64()),
        ("source_latest_version", pa.int64()),
        ("versions_behind", pa.int64()),
        ("stale_count", pa.int64()),
        ("stale_pct", pa.float64()),
        ("policy", pa.string()),
        ("last_error", pa.string()),
    ]
)


@dataclass
class ViewStatus:
    name: str
    source: str
    load_state: str
    valid: bool
    cardinality: int | None  # None: facts that could not be read (SOURCE_MISSING, UNREADABLE)
    load_number: int | None
    updated: dt.datetime | None
    node: str | None
    source_version: int | None
    source_latest_version: int | None
    versions_behind: int | None
    stale_count: int | None
    stale_pct: float | None
    policy: str | None
    last_error: str | None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["updated"] = self.updated.isoformat() if self.updated else None
        return d


def _read_file(layout: Layout, view: str) -> dict:
    raw = objects.read_record(layout.status_file(view))
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}


def recorded_views(layout: Layout) -> set[str]:
    """The views that have a load state record: one listing of the catalog's
    status folder (one LIST request on an object store, paginated). The
    others have none to read: their load state is in their commits."""
    return {n[: -len(".json")] for n in objects.listdir(layout.status_dir()) if n.endswith(".json")}


def load_record(layout: Layout, view: str) -> dict:
    """A view's load state record as stored (``load_state``, ``state_since``,
    ``job_id``, ``last_error``...; empty: none), with ``process_gone`` True
    when the process a LOADING record names is known to be gone."""
    record = _read_file(layout, view)
    if record:
        record["process_gone"] = _dead(record)
    return record


def _dead(record: dict) -> bool:
    """Whether the process a LOADING record names is known to be gone (only
    decidable for processes of this host)."""
    pid = record.get("pid")
    if not isinstance(pid, int) or record.get("node") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def record_load_state(
    layout: Layout, view: str, state: str, error: str | None = None, load_number: int | None = None,
    job_id: str | None = None,
) -> None:
    """Atomically record a view's load state (and error, for FAILED_LOAD).

    LOADING names the ``load_number`` its commit will carry: once the view's
    committed state has reached it, the load is over and the record reads as
    LOADED (see :func:`view_status`), even when the refresh stopped before
    removing it. LOADED removes the record (:func:`clear_load_state`): the
    view's commits say it."""
    if state == LOADED:
        clear_load_state(layout, view)
        return
    current = _read_file(layout, view)
    if current.get("load_state") == FAILED_LOAD and current.get("job_id") != job_id:
        keep_failed_refresh(layout, view, current)  # another job's record replaces it: its job stays as it failed
    now = time.time()
    # (when the job began: its LOADING record's time, kept by its FAILED_LOAD)
    launched = current.get("launched_at") if state == FAILED_LOAD and current.get("job_id") == job_id else None
    current.update(load_state=state, state_since=now, node=socket.gethostname(), pid=os.getpid(),
                   load_number=load_number, job_id=job_id, launched_at=launched or now)
    if state == FAILED_LOAD:
        current["last_error"] = redact(error) if error else error  # (never a credential an error repeated)
    # not fsynced: a load state describes a process (a LOADING one whose process is gone reads as failed)
    objects.write_record(layout.status_file(view), json.dumps(current))


def keep_failed_refresh(layout: Layout, view: str, record: dict) -> None:
    """A failed refresh's job as the view's FAILED_LOAD ``record`` says it
    (launched when it began, failed when it stopped, the error it stopped on),
    kept as that job's record (:meth:`Layout.job_file`, read by storage.jobs)
    before another refresh's record replaces this one or the view is current
    again: it read from its error records after (launched at their writing,
    their short message), or, without any, not at all."""
    job_id = record.get("job_id")
    if record.get("load_state") != FAILED_LOAD or not isinstance(job_id, str) or not job_id:
        return
    kept = {"job_id": job_id, "job_type": "refresh", "table": view, "launched_at": record.get("launched_at"),
            "failed_at": record.get("state_since"), "error": record.get("last_error") or "the refresh failed"}
    objects.write_text(layout.job_file(job_id), json.dumps(kept), durable=False)


def clear_load_state(layout: Layout, view: str) -> None:
    """Remove the view's load state record (after a refresh's commit landed:
    LOADED, read from the commits; a FAILED_LOAD before it is cleared). A
    local one is set aside for the next refresh to fill (objects.retire_record:
    no file created and removed per refresh)."""
    objects.retire_record(layout.status_file(view))


def _standing(record: dict, state: "RefreshState") -> dict:
    """What of a load state record still stands against the view's commits
    ({}: nothing, the commits say LOADED or NEVER_LOADED): a FAILED_LOAD, and a
    LOADING whose load has not committed. A LOADING whose load number the
    commits reached is over (its refresh stopped between the commit and the
    record's removal); a LOADED record (written by earlier versions, which kept
    one per view) says nothing the commits do not."""
    if record.get("load_state") == FAILED_LOAD:
        return record
    if record.get("load_state") == LOADING:
        announced = record.get("load_number")
        return {} if isinstance(announced, int) and state.load_number >= announced else record
    return {}


def stale_count(src_uri: str, since: int | None, latest: int, ds: lance.LanceDataset | None = None,
                held: "lance.LanceDataset | None" = None, held_ids: str = "",
                reads: "list[str] | None" = None) -> int:
    """Source rows inserted, updated or deleted after version ``since`` (``ds``:
    the source at ``latest``, already open). Where the history since ``since``
    was cleaned up (its deletions cannot be read), the rows deleted are those
    the view ``held`` (its dataset) holds (its column ``held_ids``: their source row ids)
    that the source no longer has: the deletions its next refresh applies.

    Rows changed with no row version moving count too: after a restore, the
    rows whose (id, version) the two versions do not share; the rows written
    by backfills of the computed columns ``reads`` (a view's reads; None:
    none counted)."""
    ds = ds if ds is not None and ds.version == latest else objects.dataset(src_uri, version=latest)
    if since is None:
        return ds.count_rows()
    if since >= latest:
        return 0
    commits = commits_since(ds, since)
    if commits is not None and any(type(t.operation).__name__ == "Restore" for t in commits):
        return _restored_difference(ds, since)
    changed = ds.count_rows(filter=f"_row_last_updated_at_version > {int(since)}")
    try:
        deleted = _deleted_since(ds, since)
    except (RuntimeError, ValueError, OSError):
        if held is None or _has_version(ds, since):
            raise
        deleted = _held_gone(held, held_ids, ds)
    if reads and commits:  # (values a backfill wrote: each commit says how many rows)
        backfilled = sum(int(json.loads(t.transaction_properties[BACKFILL_KEY]).get("rows") or 0) for t in commits
                         if BACKFILL_KEY in (t.transaction_properties or {}) and commit_matters(t, reads))
        changed = min(changed + backfilled, ds.count_rows())
    return changed + deleted


def _restored_difference(ds: lance.LanceDataset, since: int) -> int:
    """Rows of ``ds`` (at its version) and of version ``since`` whose (row id,
    row version) the other lacks: the rows a refresh after a restore inserts,
    updates or deletes (one read of two columns of each version, anti-joined)."""
    def pairs(d: lance.LanceDataset) -> pa.Table:
        t = d.to_table(columns={"v": "_row_last_updated_at_version"}, with_row_id=True)
        return pa.table({"i": t.column("_rowid"), "v": t.column("v")})

    now, then = pairs(ds), pairs(objects.dataset(ds.uri, version=since))
    changed = now.join(then, keys=["i", "v"], join_type="left anti").num_rows
    gone = then.select(["i"]).join(now.select(["i"]), keys="i", join_type="left anti").num_rows
    return changed + gone


def _deleted_since(ds: lance.LanceDataset, since: int) -> int:
    """Rows of ``ds`` deleted after version ``since`` (read from its history: it raises once that was cleaned up)."""
    return ds.delta(begin_version=since, end_version=ds.version).get_deleted_row_ids().read_all().num_rows


def _scoped_staleness(view_ds: lance.LanceDataset, src: lance.LanceDataset, state: "RefreshState",
                      pending: list[int]) -> tuple[int, int]:
    """(stale rows, versions behind) of a view refreshed fragment by fragment
    since its last whole refresh (what each Dagster partition run does): a row
    changed since that refresh is current when a scoped refresh covered its
    fragment at its version or later; deletions are applied in full by every
    refresh, so only those after the newest scoped one are pending. A version
    is behind while a row it wrote is not current, or when it came after the
    newest scoped refresh."""
    import numpy as np

    from mv_assets.storage.state import scoped_since_whole

    covered = scoped_since_whole(view_ds)
    v0 = int(state.source_version or 0)
    newest = max(covered.values(), default=v0)
    rows = src.to_table(columns={"u": "_row_last_updated_at_version"}, with_row_address=True, with_row_id=True,
                        filter=f"_row_last_updated_at_version > {v0}")
    fragment = np.asarray(rows.column("_rowaddr").to_numpy(), np.uint64) >> np.uint64(32)
    row_version = np.asarray(rows.column("u").to_numpy(), np.int64)
    reached = np.array([covered.get(int(f), -1) for f in fragment.tolist()], np.int64)
    behind_rows = row_version > reached
    # rows written before the newest scoped refresh yet in a fragment it did not reach: moved
    # since (a compaction keeps row versions), or never refreshed; those the view holds at
    # their version are current
    moved = np.flatnonzero(behind_rows & (row_version <= newest))
    if len(moved):
        ids = np.asarray(rows.column("_rowid").to_numpy(), np.int64)[moved]
        held = _held_at(view_ds, ids)
        behind_rows[moved[np.array([held.get(int(i)) == int(v) for i, v in zip(ids, row_version[moved], strict=True)],
                                   dtype=bool)]] = False
    deleted = 0
    if newest < src.version:
        try:
            deleted = _deleted_since(src, newest)
        except (RuntimeError, ValueError, OSError):
            deleted = 0  # (the history since was cleaned up: the rows written are what is known)
    versions = set(row_version[behind_rows].tolist())
    return int(behind_rows.sum()) + deleted, len([u for u in pending if u in versions or u > newest])


def _held_at(view_ds: lance.LanceDataset, ids) -> dict[int, int]:
    """Source row id -> the source row version the view holds it at, for ``ids``."""
    out: dict[int, int] = {}
    for start in range(0, len(ids), 50_000):
        chunk = ", ".join(str(int(i)) for i in ids[start:start + 50_000])
        t = view_ds.to_table(columns=[SOURCE_ROW_ID, SOURCE_ROW_VERSION], filter=f"{SOURCE_ROW_ID} IN ({chunk})")
        out.update(zip(t.column(SOURCE_ROW_ID).to_pylist(), t.column(SOURCE_ROW_VERSION).to_pylist(), strict=True))
    return out


def _has_version(ds: lance.LanceDataset, version: int) -> bool:
    return any(v["version"] == version for v in listed_versions(ds))


def _held_gone(view_ds: lance.LanceDataset, column: str, src: lance.LanceDataset) -> int:
    """Source rows (ids in ``column`` of the view ``view_ds``) ``src`` no longer has."""
    import numpy as np

    held = view_ds.to_table(columns=[column]).column(column).drop_null()
    if len(held) == 0:
        return 0
    alive = src.to_table(columns=[], with_row_id=True).column("_rowid").cast(pa.int64())
    present = np.isin(held.to_numpy(), alive.to_numpy())
    return int(np.unique(held.to_numpy()[~present]).size)


def source_replaced(view: ViewRef, state: "RefreshState", src: lance.LanceDataset | None = None) -> bool:
    """Whether the view's source was dropped and created again since the view
    recorded it (storage.identity): every version of the new table is pending.
    ``src``: the source, already open."""
    return state.source_id is not None and table_id(src if src is not None else view.source_dataset(),
                                                    state.source_id) != state.source_id


def pending_source_versions(
    view: ViewRef, latest: int | None = None, state: "RefreshState | None" = None,
    src: lance.LanceDataset | None = None,
) -> list[int]:
    """Source versions after the one the view reflects whose commits matter to
    it: data changes, and backfills of computed columns it reads. Compactions,
    backfills of other columns and state-only refreshes of an upstream view do
    not make a view stale. ``src``: the source at its latest version, already
    open (each dataset is listed once). A join view: then each joined table's
    pending versions (:func:`joined_pending`; numbers of other tables, so
    counted, not compared)."""
    state = state or read_refresh_state(view.dataset())
    src = src if src is not None else view.source_dataset()
    latest = src.version if latest is None else latest
    if state.source_version is None or source_replaced(view, state, src):
        return list(range(1, latest + 1))
    return _own_pending(view, latest, state, src) + [v for vs in joined_pending(view, state).values() for v in vs]


def _joined_stale(view: ViewRef, state: "RefreshState") -> int:
    """A join view's joined tables: their rows changed since the versions it reflects (0: one source)."""
    total = 0
    under = is_join_under(view.source)  # a join aggregate: its tables' row ids are the join's under it
    held = view.source_dataset() if under else view.dataset()
    for i, name in enumerate(view.definition.sources[1:], start=1):
        uri = view.layout.table_uri(name)
        ds = objects.dataset(uri)
        total += stale_count(uri, (state.sources or {}).get(name), ds.version, ds, held,
                             row_id_column(i - 1 if under else i))
    return total


def _own_pending(view: ViewRef, latest: int, state: "RefreshState", src: lance.LanceDataset) -> list[int]:
    """:func:`pending_source_versions` of the view's (first) source only."""
    if state.source_version is None or source_replaced(view, state, src):
        return list(range(1, latest + 1))
    if state.source_version >= latest:
        return []
    return pending_versions(view.source_uri, state.source_version, view.definition.computed_reads(src.schema), latest,
                            ds=src)


def joined_pending(view: ViewRef, state: "RefreshState") -> dict[str, list[int]]:
    """A join view's other sources (its joined tables), each with its
    versions after the one the view reflects whose commits matter to it
    (every version of a source recreated since); {} for a view of one source."""
    if len(view.definition.sources) == 1:
        return {}
    join, first = Join.of(view.definition if view.definition.kind == "join" else _join_under(view)), 1
    if view.definition.kind != "join":  # a join aggregate: every table of the join under it (model.join_agg_view)
        first = 0
    out: dict[str, list[int]] = {}
    for i, name in enumerate(join.sources[first:], start=first):
        if name in out:  # (a table joined with itself)
            continue
        uri = view.layout.table_uri(name)
        ds = objects.dataset(uri)
        reflected = (state.sources or {}).get(name)
        recorded_id = (state.source_ids or {}).get(name)
        if reflected is None or (recorded_id is not None and recorded_id != table_id(ds, recorded_id)):
            out[name] = list(range(1, ds.version + 1))
            continue
        computed = [c for c in join.reads(i) if c in computed_column_names(ds.schema)]
        out[name] = pending_versions(uri, reflected, computed, ds.version, ds=ds)
    return out


def _join_under(view: ViewRef):
    """The definition of the join kept under a join aggregate (its source)."""
    raw = (view.source_dataset().schema.metadata or {}).get(VIEW_METADATA_KEY.encode())
    if raw is None:
        raise ValueError(f"the join under {view.name!r} ({view.source!r}) is not a join view")
    return ViewDefinition.decode(raw)


def _shown_source(view: ViewRef) -> str:
    """The source a view's status names: a join aggregate's first table, not
    the join the engine keeps under it (never listed)."""
    sources = view.definition.sources
    return sources[1] if is_join_under(view.source) and len(sources) > 1 else view.source


def _source_missing(view: ViewRef, ds, state: "RefreshState", record: dict, name: str | None = None) -> ViewStatus:
    """The record of a view whose source dataset (or a join's table ``name``)
    is gone: what the view itself holds, nothing measured against the source."""
    updated = state.refreshed_at
    return ViewStatus(
        name=view.name,
        source=_shown_source(view),
        load_state=SOURCE_MISSING,
        valid=False,
        cardinality=ds.count_rows(),
        load_number=state.load_number,
        updated=dt.datetime.fromtimestamp(updated, tz=dt.timezone.utc) if updated else None,
        node=_node(record, state),
        source_version=state.source_version,
        source_latest_version=None,
        versions_behind=None,
        stale_count=None,
        stale_pct=None,
        policy=RefreshPolicy.from_json((ds.schema.metadata or {}).get(POLICY_METADATA_KEY.encode())).kind,
        last_error=view.source_missing(name),
    )


def _node(record: dict, state: "RefreshState") -> str | None:
    """The host of the refresh the status describes: the one loading or that
    failed (a standing record), else the one that committed the newest load."""
    standing = _standing(record, state)
    return standing.get("node") or state.node or record.get("node")


def unreadable_status(name: str, source: str | None, error: str) -> ViewStatus:
    """The record of a view whose status could not be read at all (``error``
    says why): listed as UNREADABLE rather than hiding the other views."""
    return ViewStatus(
        name=name, source=source or "", load_state=UNREADABLE, valid=False, cardinality=None, load_number=None,
        updated=None, node=None, source_version=None, source_latest_version=None, versions_behind=None,
        stale_count=None, stale_pct=None, policy=None, last_error=error,
    )


def view_status(view: ViewRef, record: dict | None = None, source: "TableSummary | None" = None) -> ViewStatus:
    """The view's record of the status table (SOURCE_MISSING when its source
    dataset is gone). ``record``: its load state record (:func:`load_record`)
    when the caller read it already, {} when it has none (the status of a
    catalog lists them once: :func:`recorded_views`); None: read here.
    ``source``: what the source table's newest manifest says, when the caller
    listed it (storage.summaries): a source still at the version and identity
    the view reflects is not opened."""
    ds = view.dataset()
    state = read_refresh_state(ds)
    file = load_record(view.layout, view.name) if record is None else record
    if len(view.definition.sources) > 1:  # a join's other tables (its first is looked at below)
        gone = [n for n in view.definition.sources[1:] if not objects.is_dataset(view.layout.table_uri(n))]
        if gone:  # (it read as UNREADABLE, Lance's "not found" as its error)
            return _source_missing(view, ds, state, file, gone[0])
    if source is not None and state.source_version is not None and source.version == state.source_version and (
            state.source_id is None or source.table_id == state.source_id):
        # nothing of the source is pending: only a join's other tables can be
        cardinality = ds.count_rows()
        latest, replaced = source.version, False
        stale = _joined_stale(view, state)
        behind = sum(len(vs) for vs in joined_pending(view, state).values())
    else:
        try:
            src = view.source_dataset()
        except (ValueError, OSError):
            if objects.is_dataset(view.source_uri):
                raise
            return _source_missing(view, ds, state, file)
        cardinality = ds.count_rows()
        latest = src.version
        replaced = source_replaced(view, state, src)
        pending = pending_source_versions(view, latest, state, src)
        if state.scoped_since_whole and not replaced and len(view.definition.sources) == 1 and pending:
            stale, behind = _scoped_staleness(ds, src, state, pending)
        else:
            # a recreated source: every row of the view and of the new table is stale
            stale = stale_count(view.source_uri, None, latest, src) + cardinality if replaced else (
                stale_count(view.source_uri, state.source_version, latest, src,
                            None if is_join_under(view.source) else ds, SOURCE_ROW_ID, _computed_reads(view, src))
                + _joined_stale(view, state))
            behind = len(pending)
    standing = _standing(file, state)  # {}: the commits say it all
    load_state = standing.get("load_state") or (LOADED if state.load_number else NEVER_LOADED)
    last_error = standing.get("last_error")
    if replaced:
        last_error = (f"the source {view.source!r} was dropped and created again since the last refresh: "
                      "the view holds the old table's rows until its next refresh rebuilds it")
    foreign = foreign_writes(ds, state.view_version)
    if foreign is not None:
        last_error = f"{foreign.describe()}: the next refresh repairs it"
    changed_columns = foreign_columns(view.definition, ds.schema.names)
    if changed_columns is not None:  # (its refreshes are refused until it is undone)
        last_error = f"{changed_columns}: refreshes are refused until it is undone or the view is made again"
    if load_state == LOADING and _dead(standing):
        # the process that was loading it is gone (killed): not loading any more
        load_state = FAILED_LOAD
        last_error = f"the refresh in process {standing['pid']} on {standing['node']} ended without finishing (killed?)"
    updated = state.refreshed_at
    policy = RefreshPolicy.from_json((ds.schema.metadata or {}).get(POLICY_METADATA_KEY.encode()))
    reflected = state.source_version
    if is_join_under(view.source):  # a join aggregate: the versions of the table it names, not of the join under it
        shown = _shown_source(view)
        reflected, latest = (state.sources or {}).get(shown), objects.dataset(view.layout.table_uri(shown)).version
    return ViewStatus(
        name=view.name,
        source=_shown_source(view),
        load_state=load_state,
        valid=state.source_version is not None and not replaced and foreign is None and changed_columns is None,
        cardinality=cardinality,
        load_number=state.load_number,
        updated=dt.datetime.fromtimestamp(updated, tz=dt.timezone.utc) if updated else None,
        node=_node(file, state),
        source_version=reflected,
        source_latest_version=latest,
        versions_behind=behind,
        stale_count=stale,
        # a view never loaded is entirely stale: 100 %, not rows / 1 (one that fragment-scoped refreshes
        # loaded, never whole: the rows left, as stale_count says)
        stale_pct=(100.0 if (state.source_version is None and not state.scoped_since_whole) or replaced
                   else round(100.0 * stale / max(cardinality, 1), 3)),
        policy=policy.kind,
        last_error=last_error,
    )


def _computed_reads(view: ViewRef, src: lance.LanceDataset) -> list[str]:
    """The source's computed columns the view reads (their backfills change its rows)."""
    return view.definition.computed_reads(src.schema)


def refresh_decision(view: ViewRef, now: float | None = None, scheduled: bool = False) -> Decision:
    """What the view's refresh policy says right now (reads the status, then decides)."""
    ds = view.dataset()
    policy = RefreshPolicy.from_json((ds.schema.metadata or {}).get(POLICY_METADATA_KEY.encode()))
    state = read_refresh_state(ds)
    src = view.source_dataset()
    latest = src.version
    pending = _own_pending(view, latest, state, src) if state.source_version is not None else []
    # the source "moved" for this view only through commits that matter to it, or
    # when fragment-scoped refreshes left it holding rows of several versions (a
    # join view: or when one of its joined tables moved so)
    moved = bool(pending) or state.scoped_since_whole or (
        state.source_version is not None and any(joined_pending(view, state).values()))
    if moved or state.source_version is None:
        effective = pending[-1] if pending else latest
    else:
        effective = state.source_version
    needs_rows = policy.kind == "staleness" and state.source_version is not None and moved
    return decide(
        policy,
        source_version=effective,
        reflected_version=state.source_version,
        last_refreshed_at=state.refreshed_at,
        now=time.time() if now is None else now,
        rows_changed=stale_count(view.source_uri, state.source_version, latest, src,
                                 reads=_computed_reads(view, src)) if needs_rows else 0,
        cardinality=ds.count_rows() if needs_rows else 0,
        scheduled=scheduled,
        moved=moved,
    )


def status_table(statuses: list[ViewStatus]) -> pa.Table:
    rows = [asdict(s) for s in statuses]
    return pa.Table.from_pylist(rows, schema=STATUS_SCHEMA)
