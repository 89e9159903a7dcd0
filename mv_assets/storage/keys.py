"""A table's primary key, looked up through an index the table keeps.

``add()`` refuses keys the table holds and ``merge_insert`` finds the rows it
updates: without an index each look-up filters the whole key column (a scan:
~13 ms at 1M rows, ~110 ms at 10M). A table with a primary key keeps a BTREE
index on it (``KEY_INDEX_NAME``, or any BTREE on that column another tool
made), so a look-up of a few keys reads the index (~0.5 ms warm, at 1M rows
as at 10M) plus the fragments the index does not cover yet, which Lance
scans (~0.2 ms each for small appended fragments).

* **Built** by the first write that finds the table at ``KEY_INDEX_MIN_ROWS``
  rows or more (a smaller table is scanned, as cheaply); a table made by
  another tool (pylance, lancedb) with a primary key declared gets it too.
  A build is a Lance ``CreateIndex`` commit of its own: views and sensors see
  no change (``storage.changes.commit_matters``).
* **Brought up to date lazily**: rows appended after it are scanned by every
  look-up until they are more than ``MAX_UNINDEXED_FRAGMENTS`` fragments or
  ``MAX_UNINDEXED_ROWS`` rows; then the index takes them in. Updating the
  index cost grows with the segment the new rows are merged into (~0.1 s at
  1M rows, ~0.7 s at 10M for the segment built first), so new rows go into
  the newest segment while it is small (``TAIL_SHARE`` of the indexed rows),
  else into a new one (~10 ms); ``Table.optimize()`` merges every segment
  into one (``consolidate``). A table mostly outside its index (more than
  half its rows) is indexed again from scratch.
* A failed build or update is reported (``KeyIndex`` in :func:`key_index`,
  ``Table.primary_key_index``) and look-ups stay right by scanning.

Storage: no dagster, no Spark.
"""

import warnings
from dataclasses import dataclass

import lance
import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.model.definition import sql_literals
from mv_assets.model.names import PRIMARY_KEY_METADATA_KEY
from mv_assets.storage import objects

__all__ = ["KEY_INDEX_NAME", "KEY_INDEX_MIN_ROWS", "KeyIndex", "primary_key", "index_name", "key_index",
           "existing_keys", "remember_written", "ready", "upkeep"]

KEY_INDEX_NAME = "primary_key"
# a table with fewer rows is scanned (~1 ms at this size, about what an index look-up costs)
KEY_INDEX_MIN_ROWS = 1 << 16
# rows outside the index that look-ups scan before the index takes them in
MAX_UNINDEXED_FRAGMENTS = 32
MAX_UNINDEXED_ROWS = 1 << 16
# new rows join the newest segment while it holds at most this share of the indexed rows
TAIL_SHARE = 0.1
# more segments than this are merged into one (each look-up reads every segment)
MAX_SEGMENTS = 16
# more than this share of the rows outside the index: built again from scratch
REBUILD_SHARE = 0.5
# keys per look-up (an IN list)
CHUNK = 4096

# (uri, Lance error) of builds that failed in this process: not tried again on every write
_FAILED: dict[str, str] = {}


@dataclass(frozen=True)
class KeyIndex:
    """How a table's primary key is looked up: through the BTREE ``name``
    (None: no index, every look-up scans the key column) covering
    ``indexed_rows``; ``unindexed_rows`` in ``unindexed_fragments`` fragments
    are scanned by each look-up until the index takes them in."""

    column: str
    name: str | None
    indexed_rows: int
    unindexed_rows: int
    unindexed_fragments: int
    segments: int
    why_none: str | None = None

    def __str__(self) -> str:
        if self.name is None:
            return f"primary key {self.column!r}: no index ({self.why_none}); look-ups scan the key column"
        outside = (f", {self.unindexed_rows:,} rows in {self.unindexed_fragments} fragments outside it (scanned)"
                   if self.unindexed_fragments else "")
        return (f"primary key {self.column!r}: BTREE index {self.name!r} over {self.indexed_rows:,} rows in "
                f"{self.segments} segment{'s' if self.segments != 1 else ''}{outside}")


def primary_key(ds: lance.LanceDataset) -> str | None:
    """The primary key column declared in the table's schema metadata (None: none)."""
    raw = (ds.schema.metadata or {}).get(PRIMARY_KEY_METADATA_KEY.encode())
    return raw.decode() if raw else None


def _index_of(ds: lance.LanceDataset, column: str):
    """The BTREE index on ``column`` alone (ours by preference), or None."""
    found = [ix for ix in ds.describe_indices()
             if list(ix.field_names) == [column] and "btree" in (ix.index_type or ix.type_url or "").lower()]
    return next((ix for ix in found if ix.name == KEY_INDEX_NAME), found[0] if found else None)


def index_name(ds: lance.LanceDataset) -> str | None:
    """The name of the index a look-up of the table's primary key reads (None: none)."""
    column = primary_key(ds)
    ix = _index_of(ds, column) if column is not None else None
    return ix.name if ix is not None else None


def _coverage(ds: lance.LanceDataset, name: str) -> tuple[int, int, int, list[int]]:
    """(indexed rows, rows outside, fragments outside, indexed rows per
    segment, oldest first) of the index ``name``, as Lance counts them
    (~0.1 ms at 20 fragments, ~1.6 ms at 2,000: no fragment metadata is built
    in Python)."""
    st = ds.stats.index_stats(name)
    indexed = int(st.get("num_indexed_rows") or 0)
    per_segment = [int(n) for n in st.get("num_indexed_rows_per_delta") or [indexed]]
    return indexed, int(st.get("num_unindexed_rows") or 0), int(st.get("num_unindexed_fragments") or 0), per_segment


def key_index(ds: lance.LanceDataset, uri: str | None = None) -> KeyIndex | None:
    """How the primary key of ``ds`` (the table at ``uri``) is looked up;
    None without a primary key. Metadata only."""
    column = primary_key(ds)
    if column is None:
        return None
    ix = _index_of(ds, column)
    if ix is None:
        total = ds.count_rows()
        failed = _FAILED.get(uri) if uri is not None else None
        why = (f"not built: {failed}" if failed is not None
               else f"{total:,} rows, built from {KEY_INDEX_MIN_ROWS:,} on" if total < KEY_INDEX_MIN_ROWS
               else "built by the next add() or merge_insert()")
        return KeyIndex(column, None, 0, total, len(ds.get_fragments()), 0, why)
    indexed, outside_rows, outside_frags, per_segment = _coverage(ds, ix.name)
    return KeyIndex(column, ix.name, indexed, outside_rows, outside_frags, len(per_segment))


def existing_keys(uri: str, ds: lance.LanceDataset, column: str, keys: pa.Array) -> list:
    """Which of ``keys`` the table at ``uri`` (``ds``: the version to look
    in) holds in ``column``, sorted.

    Lance reads the key index for the fragments it covers and scans the
    others (~1.1 ms more as soon as there is one, ~0.1 ms more for each). The
    fragments outside the index that this process appended itself
    (:func:`remember_written`), unchanged since (no row deleted, the same data
    files), are answered from the keys it wrote instead, and Lance reads the
    index alone (``fast_search``); when any fragment outside the index is
    not one of those, Lance answers for every fragment."""
    literals = sql_literals(keys)
    col = "`" + column.replace("`", "``") + "`"
    ix = _index_of(ds, column)
    written = _written_outside(uri, ds, column, ix) if ix is not None else None
    found: set = set()
    for lo in range(0, len(literals), CHUNK):
        flt = f"{col} IN ({', '.join(literals[lo : lo + CHUNK])})"
        scan = ds.scanner(columns=[column], filter=flt, fast_search=written is not None)
        if scan.count_rows():  # (no row is read when none is there, the common case)
            found.update(ds.scanner(columns=[column], filter=flt, fast_search=written is not None)
                         .to_table().column(column).to_pylist())
    if written:
        held = pa.concat_arrays([k if k.type == keys.type else k.cast(keys.type) for k in written])
        hit = pc.is_in(keys, value_set=held)  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
        found.update(keys.filter(hit).to_pylist())
    return sorted(found, key=lambda v: (str(type(v)), v))


# Keys this process appended, by table uri: the fragments (id -> data files, key
# column, keys) kept while they are outside the key index, and the version up to
# which nothing else can have changed them.
@dataclass
class _Written:
    checked: int
    fragments: dict[int, tuple[tuple[str, ...], str, pa.Array]]


_WRITTEN: dict[str, _Written] = {}
_WRITTEN_MAX = 4 * MAX_UNINDEXED_FRAGMENTS  # fragments per table; beyond, the oldest are forgotten
# commits that change no fragment already there (a fragment added, an index)
_KEEPS_FRAGMENTS = frozenset({"Append", "CreateIndex", "UpdateConfig", "ReserveFragments"})


def _files(md) -> tuple[str, ...]:
    return tuple(f.path for f in md.files)


def remember_written(uri: str, written: lance.LanceDataset, column: str, keys: pa.Array) -> None:
    """Keep the keys of rows this process just appended to the table at
    ``uri`` (``written``: the version the append made), while their fragment
    is outside the key index: its look-ups answer for that fragment from them.
    Only an append that made one fragment, found by its data files (another
    writer's commit in between: nothing is kept)."""
    if _index_of(written, column) is None:
        return
    txn = objects.read_transaction(written, written.version)
    added = getattr(txn.operation, "fragments", None) if txn is not None else None
    if type(getattr(txn, "operation", None)).__name__ != "Append" or added is None or len(added) != 1:
        return
    new = written.get_fragment(max(written.fragment_ids(), default=-1))
    files = _files(added[0])
    if new is None or _files(new.metadata) != files:
        return
    known = _held_for(uri, written)
    if known is None or not _files_there(uri, [f[0] for f in known.fragments.values()][-1:]):
        known = _WRITTEN[uri] = _Written(written.version, {})
    while len(known.fragments) >= _WRITTEN_MAX:
        known.fragments.pop(min(known.fragments))
    known.fragments[new.fragment_id] = (files, column, keys)
    if known.checked == written.version - 1:  # (nothing else landed since the last check)
        known.checked = written.version


def _written_outside(uri: str, ds: lance.LanceDataset, column: str, ix) -> list[pa.Array] | None:
    """The keys of every fragment of ``ds`` outside the index ``ix``, when
    each is one this process appended and nothing changed it since; else
    None (Lance must scan them). Forgets fragments no longer outside it."""
    known = _held_for(uri, ds)
    covered = {int(f) for seg in ix.segments for f in seg.fragment_ids}
    outside = [f for f in ds.fragment_ids() if f not in covered]
    if known is None:
        return None if outside else []
    for fid in [f for f in known.fragments if f in covered]:
        del known.fragments[fid]
    if any(known.fragments.get(fid, ("", ""))[1] != column for fid in outside):
        return None
    if not _files_there(uri, [known.fragments[fid][0] for fid in outside]):
        forget(uri)  # not the table those keys were written to (dropped and made again): Lance answers
        return None
    if ds.version != known.checked and not _untouched(ds, known, outside):
        return None
    return [known.fragments[fid][2] for fid in outside]


def forget(uri: str) -> None:
    """Forget the keys this process appended to the table at ``uri`` (dropped)."""
    _WRITTEN.pop(uri, None)


def _held_for(uri: str, ds: lance.LanceDataset) -> "_Written | None":
    """The keys kept for ``uri`` unless ``ds`` is older than the version they
    were checked at: not the table they were written to (made again)."""
    known = _WRITTEN.get(uri)
    if known is not None and ds.version < known.checked:
        forget(uri)
        return None
    return known


def _files_there(uri: str, files: list[tuple[str, ...]]) -> bool:
    """Whether the data files of these fragments (as this process wrote them)
    are still in the local table at ``uri``: a table dropped and made again
    (by any tool) under the same name, up to the same fragment ids, has none
    of them. Fragment ids are not reused within a table's history (restore,
    overwrite and compaction give new ones), so a fragment whose files are
    there is the one written. One ``stat`` a fragment; object stores: not
    looked at (their tables are forgotten when dropped through a catalog)."""
    if not objects.is_local(uri):
        return True
    data = objects.join(uri, "data")
    return all(objects.exists(objects.join(data, f)) for paths in files for f in paths[:1])


def _rows_of(uri: str, ds: lance.LanceDataset, fragments: list[int]) -> int:
    """Rows in ``fragments`` (physical: deleted ones count), the ones this process wrote from their keys."""
    known = _WRITTEN.get(uri)
    held = known.fragments if known is not None else {}
    return sum(len(held[f][2]) if f in held else _physical_rows(ds, f) for f in fragments)


def _physical_rows(ds: lance.LanceDataset, fragment_id: int) -> int:
    fragment = ds.get_fragment(fragment_id)
    return fragment.metadata.physical_rows if fragment is not None else 0


def _untouched(ds: lance.LanceDataset, known: _Written, outside: list[int]) -> bool:
    """Whether the fragments ``outside`` still hold what this process wrote at
    version ``ds.version``: every commit since the last check added fragments
    or indexes only, or else each has no deleted row and the same data files."""
    since = known.checked
    try:
        kept = 0 <= since < ds.version and all(
            type(getattr(objects.read_transaction(ds, v), "operation", None)).__name__ in _KEEPS_FRAGMENTS
            for v in range(since + 1, ds.version + 1))
    except Exception:  # (a commit cleaned up: each fragment is looked at)
        kept = False
    if kept:
        known.checked = ds.version
        return True
    for fid in outside:
        fragment = ds.get_fragment(fid)
        md = fragment.metadata if fragment is not None else None
        if md is None or md.deletion_file is not None or _files(md) != known.fragments[fid][0]:  # deleted, rewritten
            return False
    known.checked = ds.version
    return True


def _build(uri: str, ds: lance.LanceDataset, column: str, name: str) -> bool:
    try:
        ds.create_scalar_index(column, index_type="BTREE", name=name, replace=True)
    except Exception as exc:  # (a key type Lance cannot index): look-ups scan, said by key_index
        why = _lance_error(exc)
        _FAILED[uri] = why
        warnings.warn(f"no index on the primary key {column!r} of {uri} ({why}); key look-ups scan the column",
                      stacklevel=3)
        return False
    _FAILED.pop(uri, None)
    return True


def _lance_error(exc: Exception) -> str:
    return str(exc).split(", /")[0].strip() or type(exc).__name__


def ready(uri: str, ds: lance.LanceDataset, column: str) -> lance.LanceDataset:
    """The table at ``uri`` (``ds``: its latest version, open) with an index
    on its primary key ``column`` when it has ``KEY_INDEX_MIN_ROWS`` rows or
    more (built now, a commit of its own, when missing): the dataset to look
    keys up in."""
    if uri in _FAILED or _index_of(ds, column) is not None:
        return ds
    if ds.count_rows() < KEY_INDEX_MIN_ROWS:  # (from the manifest: no row is read)
        return ds
    taken = {ix.name for ix in ds.describe_indices()}
    name = KEY_INDEX_NAME if KEY_INDEX_NAME not in taken else f"{KEY_INDEX_NAME}_{column}"
    return objects.dataset(uri) if _build(uri, ds, column, name) else ds


def upkeep(uri: str, ds: lance.LanceDataset | None = None, *, consolidate: bool = False,
           version: int | None = None) -> tuple[str, str] | None:
    """Bring the primary key index of the table at ``uri`` up to date when
    the rows outside it cost look-ups more than ``MAX_UNINDEXED_*`` allow (or,
    ``consolidate``, whenever any are outside it or it has several segments:
    ``optimize()``); build it when missing and the table is big enough. Returns
    the index and what was done to it (``"built"``, ``"updated"``,
    ``"merged"``, ``"rebuilt"``), or None. A failure is warned about; look-ups
    stay right (by scanning). ``ds``: the table, open at the version a write
    just made (else ``version``, default the latest, is opened)."""
    ds = ds if ds is not None else objects.dataset(uri, version=version)
    column = primary_key(ds)
    if column is None:
        return None
    ix = _index_of(ds, column)
    if ix is None:
        if ds.version != ds.latest_version:
            ds = objects.dataset(uri)
        built = ready(uri, ds, column)
        return (index_name(built) or KEY_INDEX_NAME, "built") if built is not ds else None
    covered = {int(f) for seg in ix.segments for f in seg.fragment_ids}
    outside = [f for f in ds.fragment_ids() if f not in covered]
    if not consolidate and len(outside) <= MAX_UNINDEXED_FRAGMENTS and _rows_of(uri, ds, outside) <= MAX_UNINDEXED_ROWS:
        return None  # (decided from the manifest: Lance's index statistics are read only when there is work)
    if consolidate and not outside and len(ix.segments) <= 1:
        return None
    indexed, outside_rows, _, per_segment = _coverage(ds, ix.name)
    total = indexed + outside_rows
    if consolidate or len(per_segment) >= MAX_SEGMENTS:
        merge, what = len(per_segment), "merged"
    else:
        # new rows join a small newest segment (cost: that segment), else make one of their own
        merge = 1 if len(per_segment) > 1 and per_segment[-1] <= TAIL_SHARE * indexed else 0
        what = "updated"
    try:
        if outside_rows > REBUILD_SHARE * total:
            ds.create_scalar_index(column, index_type="BTREE", name=ix.name, replace=True)
            objects.committed_in_place(uri, ds)
            return ix.name, "rebuilt"
        ds.optimize.optimize_indices(index_names=[ix.name], num_indices_to_merge=merge)
        objects.committed_in_place(uri, ds)  # (its commit and the handle it moved: a refresh reads them next)
    except Exception as exc:
        why = _lance_error(exc)
        warnings.warn(f"the primary key index {ix.name!r} of {uri} was not brought up to date ({why}); key look-ups "
                      "stay right (rows outside it are scanned) and the next write tries again", stacklevel=2)
        return None
    return ix.name, what
