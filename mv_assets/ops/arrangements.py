"""The arrangements a join view's refreshes keep (seed 004: Materialize's
arrangements), held in memory by the process that refreshes, between its
refreshes.

* **The view's provenance**: each view row's stable row id, address and the
  stable ids of the source rows it came from (``SOURCE_ROW_ID`` and each
  joined table's ``__join_row_id_<i>``). A refresh finds the view rows of
  changed source rows by probing it, where it read those columns of the whole
  view each time.
* **The first table's join key** (an integer column): the first-table rows
  a joined row's key reaches, probed where a filtered scan of the first table
  read its key column whole.

An arrangement is loaded by the first refresh in the process that needs it
(one read of those columns: what that refresh read anyway), then brought up
to date at each later refresh from the relation's change feed since the
version it reflects (the rows written since, the ids deleted since:
O(changed rows)), and probed in memory (:class:`mv_assets.model.arrangement.Arrangement`).
It is loaded again when its relation changed in a way the change feed does not
describe row by row (overwritten, restored; for the view: compacted, which
moves row addresses), was dropped and created again (the commit it reflects
is gone), or when a refresh plans at a version older than the one it reflects.

Memory: about 8 bytes a row a column (the view: 3 columns and one per joined
table, ~32 bytes a row for a two-table join; a key: 2), at most ``MAX_BYTES``
in all in a process (2 GiB; least recently used dropped first; one larger
alone is not kept; ``MV_ASSETS_ARRANGEMENT_BYTES``, ``0``: none kept, every
refresh reads the columns as before). What each refresh used is in its plan's
``details["arrangements"]``, and :func:`held` lists what the process keeps.
"""

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa

from mv_assets.model.arrangement import Arrangement
from mv_assets.model.planning import column_ids, isin, without
from mv_assets.storage import objects
from mv_assets.storage.changes import commits_since, written_fragments

__all__ = ["MAX_BYTES", "view_rows", "key_rows", "held", "forget", "ARRANGEABLE"]

MAX_BYTES = int(os.environ.get("MV_ASSETS_ARRANGEMENT_BYTES", str(2 << 30)))

# Key types an arrangement holds (as int64): others are probed by a filtered scan.
ARRANGEABLE = (pa.types.is_int8, pa.types.is_int16, pa.types.is_int32, pa.types.is_int64, pa.types.is_uint8,
               pa.types.is_uint16, pa.types.is_uint32)

# Commits after which the rows not written since keep their addresses (and ids) ...
# (BaseOperation: what pylance reports for an operation without a Python class, none of
# which changes data: a compaction's fragment id reservation, as storage.changes reads it)
_KEEPS_ADDRESSES = frozenset({"Append", "Delete", "Update", "CreateIndex", "UpdateConfig", "ReserveFragments",
                              "Project", "BaseOperation"})
# ... and their stable ids (a compaction moves rows to new addresses, ids kept).
_KEEPS_IDS = _KEEPS_ADDRESSES | {"Rewrite"}
_ROWID, _ROWADDR = "_rowid", "_rowaddr"


@dataclass
class _Kept:
    version: int
    commit: str | None  # the uuid of the commit of ``version``: the same table, not one created again
    arrangement: Arrangement


_KEPT: "OrderedDict[tuple[str, str], _Kept]" = OrderedDict()
_LOCK = threading.Lock()  # (the registry; each arrangement has a lock of its own)
_LOCKS: dict[tuple[str, str], threading.Lock] = {}


def _commit_id(ds: lance.LanceDataset, version: int) -> str | None:
    """The uuid of the commit of ``version`` (None: unknown, its record cleaned up: loaded again)."""
    try:
        txn = objects.read_transaction(ds, version)
    except Exception:  # (a version cleaned up: Lance's own error, whatever its type)
        return None
    return getattr(txn, "uuid", None) if txn is not None else None


def view_rows(view_ds: lance.LanceDataset, provenance: list[str], first: np.ndarray,
              joined: dict[str, np.ndarray]) -> tuple[pa.Table | None, dict]:
    """The view's rows (``_rowid``, ``_rowaddr`` and the ``provenance``
    columns, int64, NULL as -1) of the first-table rows ``first`` or that
    came from the source rows ``joined[column]`` (by the view's provenance
    column), and every other view row of the first-table rows found so;
    ``provenance``: the view's provenance columns (``SOURCE_ROW_ID`` first).
    None when no arrangement is kept (then the caller reads the view); and
    what was done to have it."""
    def probe(arr: Arrangement) -> pa.Table:
        found = arr.rows(arr.find({provenance[0]: first, **joined}))
        more = without(found[provenance[0]], first)
        if len(more):  # (a first-table row reached through a joined row: each of its view rows)
            rest = arr.rows(arr.find({provenance[0]: more}))
            again = isin(rest[_ROWID], found[_ROWID])  # (a view row found both ways, once)
            found = {k: np.concatenate([found[k], rest[k][~again]]) for k in found}
        return pa.table({_ROWID: pa.array(found[_ROWID].view(np.uint64)),
                         _ROWADDR: pa.array(found[_ROWADDR].view(np.uint64)),
                         **{name: pa.array(found[name], pa.int64()) for name in provenance}})
    return _probed(view_ds, provenance, True, probe)


def key_rows(ds: lance.LanceDataset, column: str, values: np.ndarray) -> tuple[np.ndarray | None, dict]:
    """Stable ids of the rows of ``ds`` whose integer ``column`` holds one of
    ``values`` (None, with the reason, when its type is not one an
    arrangement holds or none is kept)."""
    field = ds.schema.field(column)
    if not any(is_type(field.type) for is_type in ARRANGEABLE):
        return None, {"how": f"not arranged: a {field.type} key is probed by a filtered scan"}
    return _probed(ds, [column], False, lambda arr: arr.rows(arr.find({column: values}))[_ROWID])


def _probed(ds: lance.LanceDataset, columns: list[str], addresses: bool, probe):
    """``probe(arrangement)`` of ``columns`` of ``ds`` at its version, under
    the lock (kept, caught up or loaded first), and what was done."""
    start = time.perf_counter()
    key = (ds.uri, ("addr:" if addresses else "") + ",".join(columns))
    if MAX_BYTES <= 0:
        return None, {"how": "none kept (MV_ASSETS_ARRANGEMENT_BYTES=0)"}
    with _LOCK:
        own = _LOCKS.setdefault(key, threading.Lock())
    with own:  # (one table's arrangement loaded or caught up at a time; other tables' meanwhile)
        kept = _KEPT.get(key)
        commit = _commit_id(ds, ds.version)
        how = None
        if kept is not None and commit is not None and kept.version == ds.version and kept.commit == commit:
            how = "kept"
        elif kept is not None and kept.commit is not None and kept.version > ds.version and \
                _commit_id(ds, kept.version) == kept.commit:
            return None, {"how": f"not used: it reflects version {kept.version}, the plan reads {ds.version}"}
        elif kept is not None and kept.commit is not None and kept.version < ds.version and \
                _commit_id(ds, kept.version) == kept.commit:
            moved = _catch_up(kept.arrangement, ds, kept.version, columns, addresses)
            if moved is not None:
                how = f"caught up from version {kept.version} ({moved[0]:,} rows in, {moved[1]:,} out)"
        if how is None:
            size = ds.count_rows() * 9 * (len(columns) + 1 + addresses)  # (8 bytes a value, 1 a row alive)
            if size > MAX_BYTES:
                with _LOCK:
                    _KEPT.pop(key, None)
                return None, {"how": f"not kept: about {size:,} bytes, more than MV_ASSETS_ARRANGEMENT_BYTES "
                                     f"({MAX_BYTES:,})"}
            kept = _Kept(ds.version, commit, _load(ds, columns, addresses))
            how = "loaded"
        assert kept is not None
        kept.version, kept.commit = ds.version, commit
        with _LOCK:
            _KEPT[key] = kept
            _KEPT.move_to_end(key)
            _evict(keep=key)
        result = probe(kept.arrangement)
        info = {"how": how, "rows": len(kept.arrangement), "bytes": kept.arrangement.nbytes,
                "seconds": round(time.perf_counter() - start, 4)}
        return result, info


def held() -> list[dict]:
    """What this process keeps: each arrangement's table, columns, version, rows and bytes."""
    with _LOCK:
        return [{"uri": uri, "columns": cols.removeprefix("addr:").split(","), "version": k.version,
                 "rows": len(k.arrangement), "bytes": k.arrangement.nbytes} for (uri, cols), k in _KEPT.items()]


def forget(uri: str | None = None) -> None:
    """Drop the arrangements of the table at ``uri`` (None: all)."""
    with _LOCK:
        for key in [k for k in _KEPT if uri is None or k[0] == uri]:
            del _KEPT[key]


def _evict(keep: tuple[str, str]) -> None:
    total = sum(k.arrangement.nbytes for k in _KEPT.values())
    for key in list(_KEPT):
        if total <= MAX_BYTES:
            break
        if key != keep:
            total -= _KEPT.pop(key).arrangement.nbytes


def _columns_of(batch: pa.Table, columns: list[str], addresses: bool
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    values: dict[str, np.ndarray] = {_ROWID: column_ids(batch)}
    valid: dict[str, np.ndarray] = {}
    for name in columns:
        col = batch.column(name)
        if col.null_count:
            valid[name] = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool)
            col = col.fill_null(0)
        values[name] = np.asarray(col.to_numpy(zero_copy_only=False)).astype(np.int64, copy=False)
    if addresses:
        values[_ROWADDR] = column_ids(batch, _ROWADDR)
    return values, valid


def _load(ds: lance.LanceDataset, columns: list[str], addresses: bool) -> Arrangement:
    """The arrangement read from ``ds`` (one read of its columns)."""
    table = ds.to_table(columns=columns, with_row_id=True, with_row_address=addresses,
                        batch_size=1 << 16, batch_readahead=2, fragment_readahead=2)
    values, valid = _columns_of(table, columns, addresses)
    return Arrangement(_ROWID, values, valid)


def _catch_up(arr: Arrangement, ds: lance.LanceDataset, since: int, columns: list[str], addresses: bool
              ) -> tuple[int, int] | None:
    """Apply the changes of ``ds`` since version ``since`` to ``arr``: (rows
    in, rows out), or None when its commits do not say row by row what changed."""
    commits = commits_since(ds, since)
    if commits is None:
        return None
    allowed = _KEEPS_ADDRESSES if addresses else _KEEPS_IDS
    if any(type(t.operation).__name__ not in allowed for t in commits):
        return None
    moved = written_fragments(ds, since, commits)
    if moved is not None and not moved:
        written = None
    else:
        written = ds.scanner(columns=columns, filter=f"_row_last_updated_at_version > {since}", with_row_id=True,
                             with_row_address=addresses, fragments=moved).to_table()
    deleted = column_ids(ds.delta(begin_version=since, end_version=ds.version).get_deleted_row_ids().read_all())
    out = np.concatenate([deleted, column_ids(written)]) if written is not None else deleted
    arr.remove(out)  # (a row written since: its old slot goes, its new one comes)
    if written is not None and written.num_rows:
        values, valid = _columns_of(written, columns, addresses)
        arr.add(values, valid)
    return (0 if written is None else written.num_rows), len(deleted)
