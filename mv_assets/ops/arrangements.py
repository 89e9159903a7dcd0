"""The arrangements a join view's refreshes keep (seed 004: Materialize's
arrangements), held in memory by the process that refreshes, between its
refreshes.

* **The view's provenance**: each view row's stable row id, address and the
  stable ids of the source rows it came from (``SOURCE_ROW_ID`` and each
  joined table's ``__join_row_id_<i>``), with the first-table row's version
  (``SOURCE_ROW_VERSION``: what a task computing the row again writes). A refresh finds the view rows of
  changed source rows by probing it, where it read those columns of the whole
  view each time.
* **The first table's join key** (an integer column; a string or binary one
  as a 64-bit hash of each value's bytes, :func:`key_codes`): the first-table
  rows a joined row's key reaches, probed where a filtered scan of the first
  table read its key column whole (a code shared by two values finds the
  rows of both: a superset, computed again the same).

An arrangement is loaded by the first refresh in the process that needs it
(one read of those columns: what that refresh read anyway). The view's is
then kept at each commit of a refresh in this process by that refresh
(:class:`Follow`: the rows its probe found marked dead, the rows it wrote
added); any other change is caught up at the next refresh from the
relation's change feed since the version it reflects (the rows written
since, the ids deleted since: O(changed rows)). Either is probed in memory (:class:`mv_assets.model.arrangement.Arrangement`).
It is loaded again when its relation changed in a way the change feed does not
describe row by row (overwritten, restored; for the view: compacted, which
moves row addresses), was dropped and created again (the commit it reflects
is gone), or when a refresh plans at a version older than the one it reflects.

Memory: about 8 bytes a row a column (the view: its row id and address, the
first-table row's id and version and one id per joined table, ~41 bytes a
row for a two-table join; a key: 2), at most ``MAX_BYTES``
in all in a process (2 GiB; least recently used dropped first; one larger
alone is not kept; ``MV_ASSETS_ARRANGEMENT_BYTES``, ``0``: none kept, every
refresh reads the columns as before). What each refresh used is in its plan's
``details["arrangements"]``, and :func:`held` lists what the process keeps.
"""

import hashlib
import json
import os
import shutil
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa

from mv_assets.model.arrangement import HASH_VERSION, HASHED, Arrangement, key_codes
from mv_assets.model.planning import column_ids, isin, without
from mv_assets.storage import objects
from mv_assets.storage.changes import commits_since, written_fragments

__all__ = ["MAX_BYTES", "Follow", "follower", "view_rows", "key_rows", "present", "held", "forget", "keep_on_disk",
           "ARRANGEABLE", "arranged_alike", "key_codes", "described"]

MAX_BYTES = int(os.environ.get("MV_ASSETS_ARRANGEMENT_BYTES", str(2 << 30)))

# Key types an arrangement holds: integers as int64, strings and binary values
# as a 64-bit hash of their bytes (mv_assets.model.arrangement.key_codes); others
# are probed by a filtered scan.
_INTEGERS = (pa.types.is_int8, pa.types.is_int16, pa.types.is_int32, pa.types.is_int64, pa.types.is_uint8,
             pa.types.is_uint16, pa.types.is_uint32)
ARRANGEABLE = _INTEGERS + HASHED
_HASH_TAG = f";hash{HASH_VERSION}"  # (in the name of an arrangement of hashed keys)


def arranged_alike(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether keys of types ``a`` and ``b`` have codes that compare as the
    values do (both integers, or both strings or binary): a probe of one's
    values in the other's arrangement."""
    return any(f(a) for f in _INTEGERS) and any(f(b) for f in _INTEGERS) or \
        any(f(a) for f in HASHED) and any(f(b) for f in HASHED)


def _is_hashed(t: pa.DataType) -> bool:
    return any(f(t) for f in HASHED)


# Commits after which the rows not written since keep their addresses (and ids) ...
# (BaseOperation: what pylance reports for an operation without a Python class, none of
# which changes data: a compaction's fragment id reservation, as storage.changes reads it)
_KEEPS_ADDRESSES = frozenset({"Append", "Delete", "Update", "CreateIndex", "UpdateConfig", "ReserveFragments",
                              "Project", "BaseOperation"})
# ... and their stable ids (a compaction moves rows to new addresses, ids kept).
_KEEPS_IDS = _KEEPS_ADDRESSES | {"Rewrite"}
_ROWID, _ROWADDR, _CREATED = "_rowid", "_rowaddr", "__created"
# ... and those that may remove rows (the others' deletion vectors are those before them).
_REMOVES = frozenset({"Delete", "Update", "BaseOperation"})


@dataclass
class _Kept:
    version: int
    commit: str | None  # the uuid of the commit of ``version``: the same table, not one created again
    arrangement: Arrangement
    moved: int = 0  # rows caught up since it was last saved (or loaded)
    saved: bool = False  # a copy of it (at some version) is on disk


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
              joined: dict[str, np.ndarray]) -> "tuple[pa.Table | None, dict, Follow | None]":
    """The view's rows (``_rowid``, ``_rowaddr`` and the ``provenance``
    columns, int64, NULL as -1) of the first-table rows ``first`` or that
    came from the source rows ``joined[column]`` (by the view's provenance
    column), and every other view row of the first-table rows found so;
    ``provenance``: the view's provenance columns (``SOURCE_ROW_ID`` first).
    None when no arrangement is kept (then the caller reads the view); what
    was done to have it; and what brings it to a commit that removes those
    rows (:class:`Follow`; None: none kept)."""
    slots: list[list[np.ndarray]] = []

    def probe(arr: Arrangement) -> pa.Table:
        slots.append(arr.find({provenance[0]: first, **joined}))
        found = arr.rows(slots[-1])
        more = without(found[provenance[0]], first)
        if len(more):  # (a first-table row reached through a joined row: each of its view rows)
            slots.append(arr.find({provenance[0]: more}))
            rest = arr.rows(slots[-1])
            again = isin(rest[_ROWID], found[_ROWID])  # (a view row found both ways, once)
            found = {k: np.concatenate([found[k], rest[k][~again]]) for k in found}
        return pa.table({_ROWID: pa.array(found[_ROWID].view(np.uint64)),
                         _ROWADDR: pa.array(found[_ROWADDR].view(np.uint64)),
                         **{name: pa.array(found[name], pa.int64()) for name in provenance}})
    probed: list[Follow] = []
    held, info = _probed(view_ds, provenance, True, probe, probed)
    if probed:
        probed[0].slots = slots
        probed[0].fragments = frozenset(view_ds.fragment_ids())
    return held, info, (probed[0] if probed else None)


# What a load ahead of its probe did (:func:`ahead`) and at which version, reported by the
# probe at that version that uses it.
_AHEAD: dict[tuple[str, str], tuple[int, dict]] = {}


def ahead(view_ds: lance.LanceDataset, provenance: list[str]) -> None:
    """Have the view's arrangement at the view's version (loaded, read from
    disk or caught up) in a thread of its own, when this process does not
    keep it there: a plan that will probe it starts this before it probes the
    first table's key arrangement, so both load at once (Lance's reads and
    NumPy's copies let go of the GIL). The probe waits for it on the
    arrangement's lock and reports what it did (its ``how``, and
    ``ahead_s``: the load's seconds); a failed load is done again by the
    probe."""
    key = _key(view_ds.uri, provenance, True, False)
    with _LOCK:
        kept = _KEPT.get(key)
    if MAX_BYTES <= 0 or (kept is not None and kept.version == view_ds.version):
        return

    def run() -> None:
        try:
            _, info = _probed(view_ds, provenance, True, lambda arr: None)
        except Exception:  # (the probe loads it itself, and meets the error there)
            return
        if info.get("how") not in (None, "kept"):
            with _LOCK:
                _AHEAD[key] = (view_ds.version, info)

    threading.Thread(target=run, name="mv-assets-arrangement-ahead", daemon=True).start()


def follower(view_ds: lance.LanceDataset, provenance: list[str]) -> "Follow | None":
    """A :class:`Follow` of the view's arrangement when this process keeps it
    at the view's version, for a refresh that removes no view row (its
    commit's new rows are added after it; None: none kept there)."""
    key = (view_ds.uri, "addr:" + ",".join(provenance))
    with _LOCK:
        kept = _KEPT.get(key)
    if kept is None or kept.version != view_ds.version or kept.commit != _commit_id(view_ds, view_ds.version):
        return None
    return Follow(key, kept, kept.arrangement.generation, kept.version, kept.commit, provenance,
                  fragments=frozenset(view_ds.fragment_ids()))


@dataclass
class Follow:
    """What a refresh that removes the view rows it probed and commits new
    ones needs to bring the view's arrangement to its commit without reading
    the view again (:meth:`after`): Materialize's arrangement maintained by
    the dataflow that writes the collection, where a later refresh would
    catch up from the change feed (a pass over the ids to remove them, the
    deletion vectors read)."""

    key: tuple[str, str]
    kept: _Kept
    generation: int
    version: int
    commit: str | None
    columns: list[str]
    slots: list[list[np.ndarray]] = field(default_factory=list)  # per find, per chunk: the slots of the rows probed
    fragments: frozenset[int] = frozenset()  # the view's fragments at ``version``

    def after(self, ds: lance.LanceDataset) -> str:
        """The view committed as ``ds`` (its version the one after ``version``,
        every row probed removed, new rows in new fragments): the arrangement
        brought there, if it is still the one probed. What was done."""
        with _LOCK:
            own = _LOCKS.setdefault(self.key, threading.Lock())
        with own:
            kept, arr = self.kept, self.kept.arrangement
            if _KEPT.get(self.key) is not kept or arr.generation != self.generation or kept.version != self.version or \
                    kept.commit != self.commit or ds.version != self.version + 1:
                return "not followed: the arrangement moved since the plan (caught up at the next refresh)"
            commits = commits_since(ds, self.version)
            if not commits or type(commits[0].operation).__name__ not in _KEEPS_ADDRESSES:
                return "not followed: the commit is not one the refresh makes (caught up at the next refresh)"
            new = [f for f in ds.fragment_ids() if f not in self.fragments]
            written = ds.scanner(columns=self.columns, with_row_id=True, with_row_address=True,
                                 fragments=[ds.get_fragment(f) for f in new]).to_table() if new else None
            out = arr.kill(self.slots)
            if written is not None and written.num_rows:
                values, valid = _columns_of(written, self.columns, True)
                arr.add(values, valid)
            rows_in = 0 if written is None else written.num_rows
            if len(arr) != ds.count_rows():  # (the manifest's counts: a commit that did other than the plan said)
                with _LOCK:
                    _KEPT.pop(self.key, None)
                return (f"dropped: it would hold {len(arr):,} rows, the view holds {ds.count_rows():,} "
                        "(loaded again when needed)")
            kept.version, kept.commit = ds.version, getattr(commits[0], "uuid", None)
            kept.moved += rows_in + out
            return f"followed the commit ({rows_in:,} rows in, {out:,} out)"


def key_rows(ds: lance.LanceDataset, column: str, values: np.ndarray) -> tuple[np.ndarray | None, dict]:
    """Stable ids of the rows of ``ds`` whose integer ``column`` holds one of
    ``values`` (None, with the reason, when its type is not one an
    arrangement holds or none is kept)."""
    field = ds.schema.field(column)
    if not any(is_type(field.type) for is_type in ARRANGEABLE):
        return None, {"how": f"not arranged: a {field.type} key is probed by a filtered scan"}
    return _probed(ds, [column], False, lambda arr: arr.rows(arr.find({column: values}))[_ROWID],
                   hashed=_is_hashed(field.type))


def present(ds: lance.LanceDataset, column: str, values: np.ndarray) -> tuple[np.ndarray | None, dict]:
    """Which of ``values`` some row of ``ds`` holds in its integer ``column``
    (distinct; None, with the reason, when its type is not one an arrangement
    holds or none is kept)."""
    field = ds.schema.field(column)
    if not any(is_type(field.type) for is_type in ARRANGEABLE):
        return None, {"how": f"not arranged: a {field.type} key"}
    return _probed(ds, [column], False, lambda arr: np.unique(arr.rows(arr.find({column: values}))[column]),
                   hashed=_is_hashed(field.type))


def _key(uri: str, columns: list[str], addresses: bool, hashed: bool) -> tuple[str, str]:
    """An arrangement's name: its relation and columns (with row addresses; of hashed keys)."""
    return uri, ("addr:" if addresses else "") + ",".join(columns) + (_HASH_TAG if hashed else "")


def described(uri: str, columns: list[str], addresses: bool, rows: int, directory: str | None = None) -> dict:
    """What is known of the arrangement of ``columns`` of the relation at
    ``uri`` holding ``rows`` rows: its size in memory once loaded (an
    estimate: 8 bytes a value and one a row), whether this process holds it
    (its version, rows and bytes), and its copy on disk under ``directory``
    (default: where this process keeps copies, else the default place Dagster
    runs keep them): version and bytes (None: none)."""
    hashed = False
    if not addresses and len(columns) == 1:  # (a key: hashed when it is text or binary)
        try:
            hashed = _is_hashed(objects.dataset(uri).schema.field(columns[0]).type)
        except (KeyError, ValueError, OSError):
            pass
    key = _key(uri, columns, addresses, hashed)
    with _LOCK:
        kept = _KEPT.get(key)
        held_now = None if kept is None else {"version": kept.version, "rows": len(kept.arrangement),
                                              "bytes": kept.arrangement.nbytes}
    out = {"rows": rows, "bytes": rows * 9 * (len(columns) + 1 + addresses), "hashed": hashed, "held": held_now,
           "on_disk": None}
    place = _place(key, directory or _save_dir() or _default_dir())
    assert place is not None
    try:
        with open(os.path.join(place, "current.json")) as f:
            meta = json.load(f)
        copy = os.path.join(place, meta["dir"])
        size = sum(os.path.getsize(os.path.join(copy, n)) for n in os.listdir(copy))
        out["on_disk"] = {"version": meta["version"], "bytes": size, "path": copy}
    except (OSError, ValueError, KeyError):
        pass
    return out


def _probed(ds: lance.LanceDataset, columns: list[str], addresses: bool, probe, follow: "list[Follow] | None" = None,
            hashed: bool = False):
    """``probe(arrangement)`` of ``columns`` of ``ds`` at its version, under
    the lock (kept, read from disk, caught up or loaded first), and what was
    done; ``follow``: a :class:`Follow` of the arrangement probed is added to
    it; ``hashed``: a column holds hashed keys (named apart: a copy on disk
    of another hash is not read)."""
    start = time.perf_counter()
    key = _key(ds.uri, columns, addresses, hashed)
    if MAX_BYTES <= 0:
        return None, {"how": "none kept (MV_ASSETS_ARRANGEMENT_BYTES=0)"}
    with _LOCK:
        own = _LOCKS.setdefault(key, threading.Lock())
    with own:  # (one table's arrangement loaded or caught up at a time; other tables' meanwhile)
        kept = _KEPT.get(key)
        commit = _commit_id(ds, ds.version)
        read = _read(key, ds) if kept is None else None  # (another process's, or an earlier one's)
        read_at = read.version if read is not None else None
        if read is not None:
            kept = read
        how, early = None, None
        if kept is not None and commit is not None and kept.version == ds.version and kept.commit == commit:
            how = "kept"
            with _LOCK:
                at, early = _AHEAD.pop(key, (None, None))
            if at != ds.version:
                early = None
            if early is not None:  # (what was done to have it, as the load ahead did it)
                how = early["how"]
        elif kept is not None and kept.commit is not None and kept.version > ds.version and \
                _commit_id(ds, kept.version) == kept.commit:
            return None, {"how": f"not used: it reflects version {kept.version}, the plan reads {ds.version}"}
        elif kept is not None and kept.commit is not None and kept.version < ds.version and \
                _commit_id(ds, kept.version) == kept.commit:
            moved = _catch_up(kept.arrangement, ds, kept.version, columns, addresses)
            if moved is not None:
                how = f"caught up from version {kept.version} ({moved[0]:,} rows in, {moved[1]:,} out)"
                kept.moved += moved[0] + moved[1]
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
        if read_at is not None:
            how = (f"read from disk (version {read_at}); {how}" if how != "loaded" else
                   f"loaded (the copy on disk, version {read_at}, could not be caught up)")
        saved = _save(key, kept) if not kept.saved or kept.moved > RESAVE_SHARE * len(kept.arrangement) else None
        with _LOCK:
            _KEPT[key] = kept
            _KEPT.move_to_end(key)
            _evict(keep=key)
        result = probe(kept.arrangement)
        if follow is not None:
            follow.append(Follow(key, kept, kept.arrangement.generation, kept.version, kept.commit, columns))
        info = {"how": how, "rows": len(kept.arrangement), "bytes": kept.arrangement.nbytes,
                "seconds": round(time.perf_counter() - start, 4)}
        if early is not None:  # (done ahead of the probe, in a thread of its own, in these seconds)
            info["ahead_s"] = early["seconds"]
        if saved is not None:
            info["saved_s"] = saved
        elif early is not None and "saved_s" in early:  # (saved by the load ahead)
            info["saved_s"] = early["saved_s"]
        return result, info


# -- kept on disk between processes -------------------------------------------------
#
# A Dagster run is a process of its own: without a copy on disk each run's
# first refresh of a join view would load its arrangements again (one read of
# those columns: 0.6-1.4 s at 10M rows; a copy mapped and caught up: 0.1-0.2
# s). Where copies are kept is set by :func:`keep_on_disk` (Dagster runs and
# the Pipes process do) or ``MV_ASSETS_ARRANGEMENT_DIR`` (empty: none); a
# process that refreshes again and again (Python, a service) keeps its
# arrangements in memory and writes none unless told to. A copy is written
# when an arrangement is loaded, and again once the rows it was caught up by
# since reach ``RESAVE_SHARE`` of its rows (a copy costs ~0.4-0.7 s a 10M-row
# arrangement to write; a later process catches up from a recent version,
# O(changes since)); it is read by a process that keeps none,
# and used only when the commit of the version it reflects is still the
# table's (the table not created again, that version not cleaned up). Each
# copy is a directory of ``.npy`` files (one an array, mapped when read: a
# probe reads the pages it touches) under a pointer file replaced once the
# copy is whole: a reader sees a whole copy or none. Local files, a directory
# per table and columns.

RESAVE_SHARE = 0.1
_DIR: str | None = None  # (keep_on_disk's)


def keep_on_disk(directory: str | None = None) -> str | None:
    """Keep copies of this process's arrangements on disk, under
    ``directory`` (default ``~/.cache/mv_assets/arrangements``), for the
    processes after it; ``MV_ASSETS_ARRANGEMENT_DIR``, when set, wins (empty:
    none). Returns where they are kept (None: nowhere)."""
    global _DIR
    _DIR = directory or _default_dir()
    return _save_dir()


def _default_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "mv_assets", "arrangements")


def _save_dir() -> str | None:
    where = os.environ.get("MV_ASSETS_ARRANGEMENT_DIR")
    return (where if where is not None else _DIR) or None


def _place(key: tuple[str, str], where: str | None = None) -> str | None:
    """The directory of this arrangement's copies under ``where`` (default:
    where this process keeps them; None: none kept on disk)."""
    where = where or _save_dir()
    if where is None:
        return None
    table = hashlib.sha256(key[0].encode()).hexdigest()[:24]
    return os.path.join(where, table, hashlib.sha256(key[1].encode()).hexdigest()[:16])


def _read(key: tuple[str, str], ds: lance.LanceDataset) -> "_Kept | None":
    """The copy on disk of this arrangement, if it is one of this table at a
    version the plan may catch up from (None: none, or not usable). Its
    arrays are mapped, not read: the pages a probe touches are read then."""
    place = _place(key)
    if place is None:
        return None
    try:
        with open(os.path.join(place, "current.json")) as f:
            meta = json.load(f)
        if meta["uri"] != key[0] or meta["columns"] != key[1] or meta["version"] > ds.version:
            return None
        arrays = {name: np.load(os.path.join(place, meta["dir"], f"{n}.npy"), mmap_mode="r")
                  for n, name in enumerate(meta["arrays"])}
    except (OSError, ValueError, KeyError):  # (none, another release's, damaged, or replaced meanwhile)
        return None
    if meta["commit"] is None or _commit_id(ds, meta["version"]) != meta["commit"]:
        return None  # (the table was created again, or that version is cleaned up)
    return _Kept(meta["version"], meta["commit"], Arrangement.restore(_ROWID, arrays), saved=True)


def _save(key: tuple[str, str], kept: _Kept) -> float | None:
    """Write ``kept`` to disk: its arrays in a directory of their own, then
    the pointer to it replaced (a reader finds the whole copy or the one
    before), then older copies removed. The seconds it took (None: not written)."""
    place = _place(key)
    if place is None or kept.commit is None:
        return None
    start = time.perf_counter()
    arrays = kept.arrangement.state()
    name = f"v{kept.version}-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
    meta = {"uri": key[0], "columns": key[1], "version": kept.version, "commit": kept.commit, "dir": name,
            "arrays": list(arrays)}
    pointer = os.path.join(place, "current.json")
    try:
        os.makedirs(os.path.join(place, name))
        for n, values in enumerate(arrays.values()):
            np.save(os.path.join(place, name, f"{n}.npy"), np.ascontiguousarray(values))
        with open(f"{pointer}.{name}.tmp", "w") as f:
            json.dump(meta, f)
        os.replace(f"{pointer}.{name}.tmp", pointer)
    except OSError:  # (a full or read-only disk: the arrangement is still kept in memory)
        shutil.rmtree(os.path.join(place, name), ignore_errors=True)
        return None
    for old in os.listdir(place):  # (a process still mapping an old copy keeps its pages: POSIX)
        if old != name and old.startswith("v"):
            shutil.rmtree(os.path.join(place, old), ignore_errors=True)
    kept.saved, kept.moved = True, 0
    return round(time.perf_counter() - start, 4)


def held() -> list[dict]:
    """What this process keeps: each arrangement's table, columns, version, rows and bytes."""
    with _LOCK:
        return [{"uri": uri, "columns": cols.removeprefix("addr:").removesuffix(_HASH_TAG).split(","),
                 "version": k.version,
                 "rows": len(k.arrangement), "bytes": k.arrangement.nbytes} for (uri, cols), k in _KEPT.items()]


def forget(uri: str | None = None, *, disk: bool = True) -> None:
    """Drop the arrangements of the table at ``uri`` (None: all) from memory,
    and with ``disk`` their copies on disk (of ``uri``: every copy of that
    table; None: those this process keeps)."""
    with _LOCK:
        keys = [k for k in _KEPT if uri is None or k[0] == uri]
        for key in keys:
            del _KEPT[key]
    if not disk:
        return
    paths = {os.path.dirname(p) for k in keys if (p := _place(k)) is not None}
    if uri is not None and (one := _place((uri, ""))) is not None:
        paths.add(os.path.dirname(one))
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _evict(keep: tuple[str, str]) -> None:
    total = sum(k.arrangement.nbytes for k in _KEPT.values())
    for key in list(_KEPT):
        if total <= MAX_BYTES:
            break
        if key != keep:
            total -= _KEPT.pop(key).arrangement.nbytes


def _columns_of(batch: pa.Table, columns: list[str], addresses: bool
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The arrangement's arrays of rows read (``_rowid``, ``columns``, with
    ``addresses`` ``_rowaddr``: int64, NULL as 0) and, per column holding a
    NULL, which rows hold a value."""
    return _Filling(batch.num_rows, columns, addresses).add(batch).done()


class _Filling:
    """The arrays of an arrangement filled batch by batch as a scan yields
    them: each batch's values copied once into int64 arrays made for every
    row, keys as their codes (:func:`key_codes`): a 9M-row view's provenance
    loaded in 0.70-0.78 s against 0.81-1.07 s through one Arrow table, each
    column made NumPy whole and cast after (and that table is not held)."""

    def __init__(self, rows: int, columns: list[str], addresses: bool) -> None:
        self.columns = columns
        self.names = [_ROWID, *columns, *([_ROWADDR] if addresses else [])]
        self.values = {n: np.empty(rows, np.int64) for n in self.names}
        self.valid: dict[str, np.ndarray] = {}
        self.at = 0

    def add(self, batch: "pa.Table | pa.RecordBatch") -> "_Filling":
        m = batch.num_rows
        if self.at + m > len(self.values[_ROWID]):  # (more rows than counted: grown, never cut)
            grow = max(m, len(self.values[_ROWID]) // 2)
            self.values = {n: np.concatenate([v, np.empty(grow, np.int64)]) for n, v in self.values.items()}
            self.valid = {n: np.concatenate([v, np.ones(grow, bool)]) for n, v in self.valid.items()}
        part = slice(self.at, self.at + m)
        for name in self.names:
            col = batch.column(name)
            if col.null_count:
                if name not in self.valid:
                    self.valid[name] = np.ones(len(self.values[_ROWID]), bool)
                self.valid[name][part] = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool)
            if col.null_count or _is_hashed(col.type):
                self.values[name][part] = key_codes(col)  # (a NULL: a placeholder; text: its code)
            else:  # ids, addresses, integer keys: copied once, straight from Arrow's buffer
                at = self.at
                for chunk in col.chunks if isinstance(col, pa.ChunkedArray) else [col]:
                    self.values[name][at:at + len(chunk)] = chunk.to_numpy()
                    at += len(chunk)
        self.at += m
        return self

    def done(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        if self.at < len(self.values[_ROWID]):
            self.values = {n: v[:self.at] for n, v in self.values.items()}
            self.valid = {n: v[:self.at] for n, v in self.valid.items()}
        return self.values, self.valid


def _load(ds: lance.LanceDataset, columns: list[str], addresses: bool) -> Arrangement:
    """The arrangement read from ``ds`` (one read of its columns, each batch
    copied into the arrangement's arrays as it comes)."""
    filling = _Filling(ds.count_rows(), columns, addresses)
    for batch in ds.to_batches(columns=columns, with_row_id=True, with_row_address=addresses,
                               batch_size=1 << 16, batch_readahead=2, fragment_readahead=2):
        filling.add(batch)
    values, valid = filling.done()
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
        written = ds.scanner(columns={**{c: f"`{c}`" for c in columns}, _CREATED: "_row_created_at_version"},
                             filter=f"_row_last_updated_at_version > {since}", with_row_id=True,
                             with_row_address=addresses, fragments=moved).to_table()
    # (only a delete or an update removes rows: the deletion vectors are read only after one)
    deleted = column_ids(ds.delta(begin_version=since, end_version=ds.version).get_deleted_row_ids().read_all()) \
        if any(type(t.operation).__name__ in _REMOVES for t in commits) else np.empty(0, np.int64)
    out = deleted
    if written is not None and written.num_rows:  # (a row updated since: its old slot goes, its new one comes;
        created = np.asarray(written.column(_CREATED).to_numpy(), np.int64)  # one created since had none)
        out = np.concatenate([deleted, column_ids(written)[created <= since]])
    arr.remove(out)
    if written is not None and written.num_rows:
        values, valid = _columns_of(written, columns, addresses)
        arr.add(values, valid)
    return (0 if written is None else written.num_rows), len(deleted)
