"""What changed in a table between two versions, by fragment.

Used by the Dagster sensors (one partition per source fragment), but plain
engine code: no dagster import. Cost is proportional to the number of
fragments (metadata) plus the rows that changed, never to the table size.
"""

import json
from collections.abc import Collection
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa

from mv_assets.model.names import COMPUTED_PREFIX
from mv_assets.model.planning import column_ids, isin, positions
from mv_assets.storage import objects
from mv_assets.storage.lance_compat import take_rows

__all__ = [
    "FragmentChanges",
    "fragment_changes",
    "deletions_grew",
    "fragment_data_versions",
    "commit_matters",
    "pending_versions",
    "data_version",
    "backfill_commits",
    "commits_since",
    "fragments_after",
    "written_fragments",
    "column_adding_merges",
    "versions_before_merges",
    "foreign_writes",
    "ForeignWrites",
    "gone_rows",
    "deleted_since",
    "STATE_KEY",
    "BACKFILL_KEY",
]

STATE_KEY = "mv_assets.refresh"  # transaction property of view refreshes (see refresh.py)
BACKFILL_KEY = "mv_assets.backfill"  # transaction property of column backfills (see backfill.py)
# Operations that never change which rows a reader sees or their values:
# compaction (row ids and versions kept), config and schema metadata, indexes,
# fragment id reservations (pylance reports ops without a Python class as
# BaseOperation; every data-changing operation has one).
NEUTRAL_OPERATIONS = frozenset({"Rewrite", "UpdateConfig", "CreateIndex", "ReserveFragments", "BaseOperation"})


def commit_matters(txn, reads: Collection[str] | None = None) -> bool:
    """Whether a commit can change what a reader of the table sees.

    ``reads``: the computed columns the reader reads (None: all of them). A
    column backfill matters only to readers of its columns; a view refresh
    that recorded state without changing rows matters to nobody.
    """
    if txn is None:
        return True
    op = txn.operation
    kind = type(op).__name__
    if kind in NEUTRAL_OPERATIONS:
        return False
    props = txn.transaction_properties or {}
    if BACKFILL_KEY in props:
        if reads is None:
            return True
        info = json.loads(props[BACKFILL_KEY])
        # (and the columns computed from them, whose markers it set NULL where it wrote: ops.backfill)
        columns = set(info.get("columns") or []) | {m.removeprefix(COMPUTED_PREFIX)
                                                     for m in info.get("invalidated") or []}
        return bool(columns & set(reads))
    if STATE_KEY in props and kind == "Update":
        return bool(op.removed_fragment_ids or op.updated_fragments or op.new_fragments)
    if kind in ("Delete", "Update") and not any(getattr(op, name, None) for name in (
            "updated_fragments", "deleted_fragment_ids", "removed_fragment_ids", "new_fragments")):
        return False  # (a delete or update whose predicate matched no row: a version, nothing changed)
    return True


def commits_since(ds: lance.LanceDataset, since: int) -> list | None:
    """The transactions of versions ``(since, ds.version]``, oldest first, or
    None when one of them cannot be read (cleaned up: what it did is unknown)."""
    out = []
    for v in range(since + 1, ds.version + 1):
        ok, txn = _read_txn(ds, v)
        if not ok or txn is None:
            return None
        out.append(txn)
    return out


def fragments_after(ds: lance.LanceDataset, version: int) -> list | None:
    """The fragments of ``ds`` written after ``version`` (fragment ids only
    grow: ids above the largest at that version), or None when that version is
    gone. Rows created after ``version`` are all in them (a compaction since
    may have moved older rows there too)."""
    try:
        before = ds.checkout_version(version)
    except Exception:
        return None
    top = top_fragment(before)
    # (by id: no object made for each of a table's fragments, thousands of them, only for the new ones)
    return [ds.get_fragment(fid) for fid in ds.fragment_ids() if fid > top]


def deletions_grew(ds: lance.LanceDataset, since: int) -> list[int] | None:
    """The fragments of ``ds`` that were there at version ``since`` and lost
    rows since (deleted, or moved out by an update: their deletion vector
    grew), from the two versions' fragment metadata alone; None when that
    version is gone."""
    try:
        then = _deletion_counts(ds.checkout_version(since))
    except (OSError, ValueError, RuntimeError):
        return None
    return sorted(f for f, n in _deletion_counts(ds).items() if f in then and n > then[f])


def deleted_since(src: lance.LanceDataset, reflected: int | None) -> np.ndarray | None:
    """Ids of the rows that existed at version ``reflected`` and are no longer
    in ``src`` (Lance's change feed; stable row ids are never reused), or
    None when that cannot be read: no version, one newer than ``src``, no
    stable row ids, or its manifest cleaned up."""
    if reflected is None or reflected > src.version or not src.has_stable_row_ids:
        return None
    if src.version == reflected:
        return np.empty(0, np.int64)
    try:
        return column_ids(src.delta(begin_version=reflected, end_version=src.version).get_deleted_row_ids().read_all())
    except (OSError, ValueError, RuntimeError):  # (that version's manifest cleaned up)
        return None


def gone_rows(src: lance.LanceDataset, keys: np.ndarray, versions: np.ndarray | None,
              reflected: int | None, deleted: np.ndarray | None) -> np.ndarray:
    """Mask of ``keys`` (the source row ids of a view's rows) whose source row
    is no longer in ``src``: what a fragment-scoped refresh removes wherever
    the row was.

    With each key's source row version (``versions``: what the row was computed
    from), the source version the whole view last reflected (``reflected``,
    at most ``src``'s) and the rows deleted since (``deleted``: what
    :func:`deleted_since` read), it reads no source row: a view row at a
    version up to ``reflected`` is of a row that existed then, so it is gone
    exactly when the change feed lists it deleted (stable row ids are never
    reused); a later one (a row a scoped refresh brought in since) is looked
    up by id. Without them (no versions, no whole refresh, an older ``src``,
    or ``reflected``'s manifest cleaned up), every row id of ``src`` is read:
    one scan of the whole table's ids (~0.2 s at 10,000 fragments, O(rows))."""
    keys = np.asarray(keys, dtype=np.int64)
    if versions is None or reflected is None or deleted is None:
        return ~isin(keys, column_ids(src.to_table(columns=[], with_row_id=True), "_rowid"))
    out = isin(keys, deleted)
    later = ~out & (np.asarray(versions, dtype=np.int64) > reflected)
    if later.any():
        alive = column_ids(take_rows(src, pa.array(np.unique(keys[later])), ["_rowid"]), "_rowid")
        out |= later & ~isin(keys, alive)
    return out


def top_fragment(ds: lance.LanceDataset) -> int:
    """The largest fragment id of ``ds`` (-1: none); later fragments get larger ones."""
    return max(ds.fragment_ids(), default=-1)


# Operations that rewrite a dataset so that no row can be traced to what was
# there before, and those that change rows; our own row-changing commits carry
# one of OWN_KEYS in their transaction properties.
_REPLACING_OPERATIONS = frozenset({"Overwrite", "Restore", "Clone", "DataReplacement"})
_ROW_OPERATIONS = frozenset({"Append", "Delete", "Update"})
OWN_KEYS = (STATE_KEY, BACKFILL_KEY, "mv_assets.load_columns")


@dataclass(frozen=True)
class ForeignWrites:
    """Commits to a view's dataset after ``since`` (its last refresh) that
    mv_assets did not make and that change rows: ``versions`` with their
    operations. ``replaced``: one of them (or an unreadable commit) rewrote
    the dataset so that its rows cannot be traced: only a rebuild repairs it."""

    since: int
    versions: list[int]
    operations: list[str]
    replaced: bool

    def describe(self) -> str:
        what = ", ".join(f"{op} at version {v}" for v, op in zip(self.versions, self.operations, strict=True))
        return f"another tool wrote into the view after its refresh at version {self.since} ({what})"


def foreign_writes(ds: lance.LanceDataset, since: int | None) -> ForeignWrites | None:
    """Row-changing commits after version ``since`` that mv_assets did not make
    (appends, deletes, updates, overwrites by lancedb, pylance, Spark...), or
    None when there are none. Schema, config, index and compaction commits do
    not count (they change no row). O(commits since)."""
    if since is None:
        return None
    versions, ops, replaced = [], [], False
    for v in range(since + 1, ds.version + 1):
        ok, txn = _read_txn(ds, v)
        if not ok or txn is None:  # cleaned up: what it did is unknown
            versions.append(v)
            ops.append("unknown (history cleaned up)")
            replaced = True
            continue
        kind = type(txn.operation).__name__
        if kind not in _REPLACING_OPERATIONS and kind not in _ROW_OPERATIONS:
            continue
        if any(k in (txn.transaction_properties or {}) for k in OWN_KEYS):
            continue
        versions.append(v)
        ops.append(kind)
        replaced |= kind in _REPLACING_OPERATIONS
    if not versions:
        return None
    return ForeignWrites(since, versions, ops, replaced)


def _read_txn(ds: lance.LanceDataset, version: int):
    try:
        return True, objects.read_transaction(ds, version)
    except Exception:  # cleaned up: unknown, so it may matter
        return False, None


def _columns_only_added(ds: lance.LanceDataset, version: int, txn, reads: Collection[str] | None) -> bool:
    """Whether commit ``version`` (``txn``) of ``ds`` is a ``Merge`` that only
    added columns none of ``reads`` names (None: a reader of every column,
    which a new column changes): every fragment of the version before is
    there with the same data files, deletions, row ids and row versions, no
    fragment came or went, and each data file it added holds only fields the
    version before had not (this engine's ``add_columns``; pylance's moves
    every row's version, which a refresh reads as updated rows, so it
    matters). Anything else a Merge can do (rewrite a column's files, change
    rows) is not this."""
    if reads is None or txn is None or type(txn.operation).__name__ != "Merge" or version < 2:
        return False
    try:
        before = ds.checkout_version(version - 1)
        after = ds.checkout_version(version)
    except Exception:
        return False
    added = set(after.schema.names) - set(before.schema.names)
    if not added or added & set(reads) or not set(before.schema.names) <= set(after.schema.names):
        return False
    old = {f.metadata.id: f.metadata for f in before.get_fragments()}
    new = {f.metadata.id: f.metadata for f in after.get_fragments()}  # (as committed: row versions included)
    if set(old) != set(new):
        return False
    known = {i for m in old.values() for d in m.data_files() for i in d.fields}
    known |= {f.id() for f in before.lance_schema.fields()}
    same = ("physical_rows", "deletion_file", "row_id_meta", "last_updated_at_version_meta", "overlays")
    for fid, m in new.items():
        prev = old[fid]
        a, b = prev.to_json(), m.to_json()
        if any(a.get(k) != b.get(k) for k in same):  # (rows, deletions, row ids and row versions as they were)
            return False
        had = {(d.path, tuple(d.fields)) for d in prev.data_files()}
        has = {(d.path, tuple(d.fields)) for d in m.data_files()}
        if not had <= has or any(set(fields) & known for _, fields in has - had):
            return False
    return True


def _version_matters(ds: lance.LanceDataset, version: int, reads: Collection[str] | None) -> bool:
    """Whether commit ``version`` of ``ds`` can change what a reader of ``reads``
    sees (:func:`commit_matters`, less columns only added); unreadable: it may."""
    ok, txn = _read_txn(ds, version)
    return not ok or (commit_matters(txn, reads) and not _columns_only_added(ds, version, txn, reads))


def pending_versions(
    uri: str, since: int | None, reads: Collection[str] | None = None, latest: int | None = None,
    ds: lance.LanceDataset | None = None,
) -> list[int]:
    """Versions in ``(since, latest]`` of the table at ``uri`` whose commits
    matter to a reader of ``reads`` (see :func:`commit_matters`). ``ds``: the
    table, already open."""
    ds = ds if ds is not None else objects.dataset(uri)
    latest = ds.version if latest is None else latest
    start = 0 if since is None else since
    return [v for v in range(start + 1, latest + 1) if _version_matters(ds, v, reads)]


def data_version(uri: str, reads: Collection[str] | None = None) -> int:
    """The newest version of the table whose commit matters to a reader of
    ``reads``: what a reader's data version is (compactions, backfills of
    other columns and state-only view commits do not move it)."""
    ds = objects.dataset(uri)
    v = ds.version
    while v > 1 and not _version_matters(ds, v, reads):
        v -= 1
    return v


def backfill_commits(ds: lance.LanceDataset, v0: int, v1: int, columns: Collection[str] | None = None) -> list:
    """Column backfills among versions (v0, v1] of ``ds``: they move no row
    versions. ``columns``: only backfills of one of these (None: of any)."""
    out = []
    for v in range(v0 + 1, v1 + 1):
        ok, txn = _read_txn(ds, v)
        if ok and txn is not None and BACKFILL_KEY in (txn.transaction_properties or {}) and (
                columns is None or commit_matters(txn, columns)):
            out.append((v, txn))
    return out


@dataclass
class FragmentChanges:
    """Fragment-level changes of a table since a version.

    * ``fragments``: every fragment id at ``version``.
    * ``added``: fragment ids that are not yet known partitions.
    * ``retired``: known partitions whose fragment is gone (compaction, or all
      rows moved by updates); their rows live on in other fragments.
    * ``changed``: fragments holding rows inserted or updated since the
      cursor, or whose deletion vector grew.
    """

    version: int
    since: int | None
    fragments: list[int] = field(default_factory=list)
    added: list[int] = field(default_factory=list)
    retired: list[int] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)

    @property
    def to_refresh(self) -> list[int]:
        """Partitions a refresh should cover: added or changed, still existing."""
        present = set(self.fragments)
        return sorted((set(self.added) | set(self.changed)) & present)


def _deletion_counts(ds: lance.LanceDataset) -> dict[int, int]:
    out = {}
    for frag in ds.get_fragments():
        deletion = frag.metadata.deletion_file
        out[frag.fragment_id] = deletion.num_deleted_rows if deletion is not None else 0
    return out


def fragment_changes(uri: str, since: int | None, known: set[int] | list[int], version: int | None = None) -> FragmentChanges:
    """Compare the table at ``version`` (default latest) with version ``since``."""
    ds = objects.dataset(uri, version=version)
    known_set = {int(k) for k in known}
    now_dels = _deletion_counts(ds)
    fragments = sorted(now_dels)
    result = FragmentChanges(version=ds.version, since=since, fragments=fragments)
    result.added = [f for f in fragments if f not in known_set]
    result.retired = sorted(known_set - set(fragments))
    if since is None:
        result.changed = list(fragments)
        return result
    if since >= ds.version:
        return result
    rows = ds.to_table(columns=[], filter=f"_row_last_updated_at_version > {int(since)}", with_row_address=True)
    changed = set()
    if rows.num_rows:
        changed |= {int(f) for f in np.unique(rows.column("_rowaddr").to_numpy() >> 32)}
    try:
        old_dels = _deletion_counts(objects.dataset(uri, version=since))
    except (ValueError, OSError):  # the old version was cleaned up: treat everything as changed
        old_dels = {}
        changed |= set(fragments)
    changed |= {f for f, n in now_dels.items() if n > old_dels.get(f, 0) and f in old_dels}
    changed |= _backfilled_fragments(ds, since) & set(fragments)
    result.changed = sorted(changed)
    return result


def fragment_data_versions(uri: str, fragments: Collection[int] | None = None, version: int | None = None
                           ) -> dict[int, str]:
    """Each fragment's data version: what a reader of its rows would notice,
    as text: ``"v7"`` (its rows were last inserted or updated at version 7)
    or ``"v7-3"`` (and 3 of them are deleted since). It moves when a row of
    the fragment is inserted, updated or deleted, never otherwise (column
    backfills, compactions elsewhere and other fragments' changes leave it),
    and never comes back to an earlier value: a fragment's deletions only
    grow, and for a given count its newest row version only grows.
    ``fragments``: only these (ids not in the table are left out); cost: one
    scan of the row versions of their rows (metadata, no data column), none
    of the other fragments read."""
    ds = objects.dataset(uri, version=version)
    if fragments is None:
        present = {f.fragment_id: f for f in ds.get_fragments()}
    else:  # only these: looked up by id, whatever the table's fragment count
        present = {fid: frag for fid in {int(f) for f in fragments} if (frag := ds.get_fragment(fid)) is not None}
    wanted = sorted(present)
    if not wanted:
        return {}
    # (the row version is projected under another name: Lance 14 errs on reading it after compaction otherwise)
    rows = ds.scanner(columns={"v": "_row_last_updated_at_version"}, with_row_address=True,
                      fragments=[present[f] for f in wanted]).to_table()
    newest: dict[int, int] = {}
    if rows.num_rows:
        fids = rows.column("_rowaddr").to_numpy() >> 32
        vers = rows.column("v").to_numpy().astype(np.int64)
        order = np.lexsort((vers, fids))
        last = np.r_[fids[order][1:] != fids[order][:-1], True]
        newest = {int(f): int(v) for f, v in zip(fids[order][last], vers[order][last], strict=True)}
    out = {}
    for fid in wanted:
        deletion = present[fid].metadata.deletion_file
        deleted = deletion.num_deleted_rows if deletion is not None else 0
        out[fid] = f"v{newest.get(fid, 0)}" + (f"-{deleted}" if deleted else "")
    return out


def _backfilled_fragments(ds: lance.LanceDataset, since: int) -> set[int]:
    """Fragments whose computed columns a backfill rewrote after ``since``: it
    moves no row versions, but views reading those columns must look."""
    return {
        int(f.id) for _, txn in backfill_commits(ds, since, ds.version)
        for f in getattr(txn.operation, "updated_fragments", [])
    }


def written_fragments(src: lance.LanceDataset, v0: int | None, commits: list) -> list | None:
    """The fragments that can hold rows written after ``v0`` (their
    ``_row_last_updated_at_version`` above it), or None (any fragment may).

    Lance writes appended rows, and rows an update or merge_insert rewrites,
    into new fragments (ids above every id at ``v0``); deletes and compactions
    write no row version, nor do column drops; backfills of computed columns
    keep row versions. An update of columns in place (``rewrite_columns``: a
    load of columns, another tool's in-place update) moves the versions of
    rows of the fragments it names, and only of those. So while every commit
    since ``v0`` is one of those, the change feed's rows are all in the
    fragments written since and those updated in place (still there: a
    compaction since moved their rows into fragments written since), and a
    refresh after deletes and updates scans only them (O(changed rows'
    fragments), not O(source)). Any other commit (a Merge adding a column
    with values, a data replacement, one whose record was cleaned up) answers
    None. Cost: the commits (read already) and one fragment listing."""
    if v0 is None:
        return None
    in_place: set[int] = set()
    for txn in commits:
        op = txn.operation
        kind = type(op).__name__
        props = txn.transaction_properties or {}
        # (a Merge, adding a column with values, moves the versions of rows in place)
        if kind in NEUTRAL_OPERATIONS or kind in ("Append", "Delete", "Project") or BACKFILL_KEY in props:
            continue
        mode = getattr(op, "update_mode", None)
        if kind == "Update" and mode in (None, "rewrite_rows") and not getattr(op, "updated_fragment_offsets", None):
            continue
        if kind == "Update" and mode == "rewrite_columns":
            in_place |= {int(f.id) for f in getattr(op, "updated_fragments", None) or []}
            continue
        return None
    written = fragments_after(src, v0)
    if written is None or not in_place:
        return written
    new = {f.fragment_id for f in written}
    return written + [f for i in sorted(in_place - new) if (f := src.get_fragment(i)) is not None]


def column_adding_merges(ds: lance.LanceDataset, since: int, commits: list) -> list[int]:
    """The versions in ``(since, ds.version]`` whose commit (``commits``, oldest
    first) is a Merge that only added columns: pylance's and lancedb's
    ``add_columns`` and ``merge`` on a table with stable row ids move the
    version of every row of the fragments they write to, though no value a
    row held changed. Such a Merge keeps every fragment, its rows, its
    deletions and its data files as they were, and only adds files of field
    ids the table did not have; a Merge doing anything else (or whose
    versions cannot be read) is not listed. Cost: two manifests per Merge."""
    out = []
    for version, txn in zip(range(since + 1, since + 1 + len(commits)), commits, strict=True):
        if txn is None or type(txn.operation).__name__ != "Merge":
            continue
        try:
            before, after = ds.checkout_version(version - 1), ds.checkout_version(version)
        except (ValueError, OSError):
            continue
        if _only_adds_columns(before, after):
            out.append(version)
    return out


def _only_adds_columns(before: lance.LanceDataset, after: lance.LanceDataset) -> bool:
    old = {f.fragment_id: f.metadata for f in before.get_fragments()}
    new = {f.fragment_id: f.metadata for f in after.get_fragments()}
    if old.keys() != new.keys():
        return False
    old_ids = {int(f.id()) for f in before.lance_schema.fields()}
    for m in old.values():
        for df in m.files:
            old_ids.update(int(i) for i in df.fields)
    top = max(old_ids, default=-1)
    for fid, m in old.items():
        n = new[fid]
        if n.physical_rows != m.physical_rows or _deletion(n) != _deletion(m):
            return False
        was = {(df.path, tuple(df.fields)) for df in m.files}
        now = {(df.path, tuple(df.fields)) for df in n.files}
        if not was <= now or any(i <= top for _, fields in now - was for i in fields if i >= 0):
            return False
    return True


def _deletion(meta) -> tuple | None:
    d = meta.deletion_file
    return None if d is None else (getattr(d, "id", None), getattr(d, "read_version", None),
                                   getattr(d, "num_deleted_rows", None))


def versions_before_merges(ds: lance.LanceDataset, ids: np.ndarray, versions: np.ndarray,
                           merges: Collection[int]) -> np.ndarray:
    """The row versions ``versions`` of rows ``ids`` with the moves of the
    column-adding ``merges`` (:func:`column_adding_merges`) undone: a row at
    a Merge's version gets the version it had just before it (newest Merge
    first, so a row moved by two gets the one before both). A row not found
    before a Merge keeps the Merge's version (counted as changed)."""
    out = np.asarray(versions, dtype=np.int64).copy()
    for m in sorted(merges, reverse=True):
        hit = np.flatnonzero(out == m)
        if not len(hit):
            continue
        before = ds.checkout_version(m - 1).to_table(columns={"v": "_row_last_updated_at_version"}, with_row_id=True)
        pos = positions(np.asarray(ids, dtype=np.int64)[hit], column_ids(before, "_rowid"))
        found = pos >= 0
        was = column_ids(before, "v")
        out[hit[found]] = was[pos[found]]
    return out
