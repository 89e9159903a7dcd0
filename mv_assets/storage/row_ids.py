"""Stable row ids: what the engine needs of a table, and the one-time rewrite
that brings in a table created without them.

Views match source rows by stable row id and row version, and a table's
computed values follow their rows the same way (see docs/concepts.md). A
dataset without stable row ids (what lancedb and ``lance.write_dataset``
create by default) has row ids that are physical addresses: they change when
rows move (update, compaction), and an update does not move
``_row_last_updated_at_version``. Whether a dataset has them is fixed when it
is created: no later commit adds them (tests/test_lance_contract.py), so such a
table is refused by everything that needs them (:func:`require_stable_row_ids`)
and brought in by rewriting it once (:func:`adopt`).

The rewrite writes a new dataset with stable row ids beside the catalog's
tables (``<catalog>/_mv_assets/adopt/<name>/new.lance``), checks it, then puts
it in the table's place:

* locally, by two directory renames (the old table goes to ``old.lance`` and
  is removed after): a crash leaves the table at its path, or between the two
  renames both copies under ``adopt/<name>``; :func:`recover` (run first by
  every adoption) moves the new copy in. The table is never lost; readers see
  its path empty for the instant between the renames;
* on an object store, which has no rename, by deleting the old table's objects
  and copying the new ones in (server-side, manifests last), after a marker
  object says the new copy is complete: a crash after the marker is finished
  by :func:`recover`, one before it leaves the old table untouched. Not atomic:
  from the delete until the last manifest is copied (seconds per thousand
  data files) readers find no table.

Kept: every row and value in scan order, the schema with its metadata, the
dataset's config, its data storage version (except the legacy v1 format, which
has no row versions: rewritten in the current one, also when the table has
stable row ids already), and scalar indexes of the kinds
that take no parameters (BTree, Bitmap, LabelList), rebuilt under their
names. Not kept: the version history (the table starts again at version 1),
tags, and indexes built with parameters (vector, full-text, ...): refused
unless ``drop_indexes``, then listed to be rebuilt. Row ids, row versions,
computed-column markers (every computed value becomes stale: the markers of
a table without stable row ids cannot be trusted), the table's error records
and checkpoints are new or cleared; its identity is new, so a view that read
it before rebuilds at its next refresh.
"""

import time
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa

from mv_assets.model.errors import ConcurrentWriteError
from mv_assets.model.names import COMPUTED_PREFIX
from mv_assets.storage import objects
from mv_assets.storage.error_log import drop_errors
from mv_assets.storage.identity import TABLE_ID_KEY
from mv_assets.storage.layout import Layout

__all__ = ["AdoptResult", "require_stable_row_ids", "no_stable_row_ids", "is_legacy_format", "require_current_format",
           "adopt", "recover", "finish_interrupted"]

# scalar index kinds (as list_indices names them) rebuilt as Lance's create_scalar_index types
REBUILT_INDEXES: dict[str, Any] = {"BTree": "BTREE", "Bitmap": "BITMAP", "LabelList": "LABEL_LIST"}
_SWAP_MARKER = "swap"  # object stores: the new copy is complete, the swap may start


@dataclass(frozen=True)
class AdoptResult:
    """What bringing a table in did (``rewritten`` False: it had stable row ids already)."""

    table: str
    rewritten: bool
    rows: int = 0
    version: int | None = None  # the table's version after the rewrite
    seconds: float = 0.0
    indexes_rebuilt: list[str] = field(default_factory=list)
    indexes_dropped: list[str] = field(default_factory=list)  # rebuild these yourself
    stale_columns: list[str] = field(default_factory=list)  # computed columns to backfill again


def no_stable_row_ids(name: str, doing: str) -> str:
    """The sentence every refusal uses."""
    return (
        f"{name!r} has no stable row ids (lancedb and lance.write_dataset create tables without them unless "
        f"told: enable_stable_row_ids=True); without them {doing} cannot follow its rows (they are matched by "
        "stable row id and row version). "
        f"Bring the table in once with db.enable_stable_row_ids({name!r}) or `mv-assets adopt {name}` "
        "(a full rewrite of the table; see docs/open-world.md)"
    )


def require_stable_row_ids(ds: lance.LanceDataset, name: str, doing: str) -> None:
    """ValueError naming the remedy when ``ds`` has no stable row ids."""
    if not ds.has_stable_row_ids:
        raise ValueError(no_stable_row_ids(name, doing))


def is_legacy_format(ds: lance.LanceDataset) -> bool:
    """Whether ``ds`` is written in Lance's legacy (v1) file format
    (``data_storage_version="legacy"``, reported as ``"0.1"``)."""
    return str(ds.data_storage_version) in ("0.1", "legacy")


def require_current_format(ds: lance.LanceDataset, name: str, doing: str) -> None:
    """ValueError naming the remedy when ``ds`` is in the legacy (v1) file
    format: its rows carry no row versions (``_row_last_updated_at_version``
    and a filtered read of v1 files fail in Lance), so no refresh after an
    update or a delete could find what changed."""
    if is_legacy_format(ds):
        raise ValueError(
            f"{name!r} is written in Lance's legacy (v1) file format (data_storage_version='legacy'); its rows "
            f"carry no row versions, which {doing} needs to find the rows an update or a delete changed. "
            f"Rewrite it once in the current format with db.enable_stable_row_ids({name!r}) or "
            f"`mv-assets adopt {name}` (a full rewrite of the table; see docs/open-world.md)"
        )


def _user_indexes(ds: lance.LanceDataset) -> list[dict]:
    with warnings.catch_warnings():  # (list_indices names each index's type, as REBUILT_INDEXES does; pylance
        warnings.simplefilter("ignore", DeprecationWarning)  # warns that it is deprecated: not the user's doing)
        warnings.simplefilter("ignore", UserWarning)
        listed = ds.list_indices()
    return [dict(i) for i in listed if not str(i["name"]).startswith("__")]


def _without_markers(reader: pa.RecordBatchReader) -> pa.RecordBatchReader:
    """The rows with every computed marker NULL (stale: computed again by the next backfill)."""
    schema = reader.schema
    marked = [i for i, f in enumerate(schema) if f.name.startswith(COMPUTED_PREFIX)]
    if not marked:
        return reader

    def batches():
        for batch in reader:
            cols = list(batch.columns)
            for i in marked:
                cols[i] = pa.nulls(batch.num_rows, schema.field(i).type)
            yield pa.RecordBatch.from_arrays(cols, schema=schema)

    return pa.RecordBatchReader.from_batches(schema, batches())


def recover(layout: Layout, name: str) -> bool:
    """Finish or undo an adoption of ``name`` that was interrupted; True when
    it put a new copy in place."""
    work = layout.adoption(name)
    new, old, table = objects.join(work, "new.lance"), objects.join(work, "old.lance"), layout.table_uri(name)
    if not objects.exists(work):
        return False
    done = False
    if objects.is_local(table):
        if not objects.is_dataset(table) and objects.is_dataset(new) and objects.is_dataset(old):
            objects.remove_tree(table)  # an empty directory, if anything
            objects.rename_tree(new, table)  # crashed between the two renames
            done = True
    elif objects.exists(objects.join(work, _SWAP_MARKER)):
        objects.remove_tree(table)  # the swap had started: finish it
        objects.copy_tree(new, table)
        done = True
    if not objects.is_dataset(table):
        return False  # the table is gone, not by us: its copies stay where they are
    objects.remove_tree(work)  # before the swap: a copy never put in place; after: the old table
    return done


def _adopted(layout: Layout, name: str, start: float, rebuilt: list[str], dropped: list[str]) -> AdoptResult:
    """After the new copy is in place: clear what named the old row ids."""
    objects.remove_tree(layout.checkpoints(name))
    drop_errors(layout, name)
    ds = objects.dataset(layout.table_uri(name))
    stale = sorted(f.name[len(COMPUTED_PREFIX):] for f in ds.schema if f.name.startswith(COMPUTED_PREFIX))
    return AdoptResult(name, True, rows=ds.count_rows(), version=ds.version, seconds=time.perf_counter() - start,
                       indexes_rebuilt=rebuilt, indexes_dropped=dropped, stale_columns=stale)


def finish_interrupted(layout: Layout, name: str, *, lock_timeout: float | None = 60) -> AdoptResult | None:
    """The result of an adoption of ``name`` that was interrupted after its new
    copy was complete, now finished; None when there was none to finish (an
    unfinished copy is removed)."""
    start = time.perf_counter()
    if not objects.exists(layout.adoption(name)):  # (none under way: no lock taken, no lock file made)
        return None
    with layout.lock(name, lock_timeout):
        return _adopted(layout, name, start, [], []) if recover(layout, name) else None


def adopt(layout: Layout, name: str, *, drop_indexes: bool = False, lock_timeout: float | None = 60) -> AdoptResult:
    """Rewrite table ``name`` with stable row ids (see the module docstring)."""
    start = time.perf_counter()
    table = layout.table_uri(name)
    with layout.lock(name, lock_timeout):  # no backfill of ours commits meanwhile
        if recover(layout, name):
            return _adopted(layout, name, start, [], [])
        ds = objects.dataset(table)
        legacy = is_legacy_format(ds)  # rewritten in the current format too
        if ds.has_stable_row_ids and not legacy:
            return AdoptResult(name, False, rows=ds.count_rows(), version=ds.version)
        indexes = _user_indexes(ds)
        rebuilt = [i for i in indexes if i["type"] in REBUILT_INDEXES and len(i["fields"]) == 1]
        dropped = [i for i in indexes if i not in rebuilt]
        if dropped and not drop_indexes:
            shown = ", ".join(f"{i['name']!r} ({i['type']} on {', '.join(i['fields'])})" for i in dropped)
            raise ValueError(
                f"{name!r} has indexes that cannot be rebuilt without their parameters: {shown}; pass "
                "drop_indexes=True (`mv-assets adopt --drop-indexes`) and create them again after"
            )
        work = layout.adoption(name)
        new = objects.join(work, "new.lance")
        objects.remove_tree(work)
        schema = ds.schema
        reader = _without_markers(ds.scanner(scan_in_order=True).to_reader())
        objects.write_dataset(
            reader, new, schema=schema, mode="create", enable_stable_row_ids=True,
            data_storage_version="stable" if legacy else ds.data_storage_version,  # pyright: ignore[reportArgumentType]
        )
        fresh = objects.dataset(new)
        config = {k: v for k, v in ds.config().items() if k != TABLE_ID_KEY}
        fresh.update_config({**config, TABLE_ID_KEY: uuid.uuid4().hex})  # new row ids: a new table to its views
        for i in rebuilt:
            objects.dataset(new).create_scalar_index(i["fields"][0], REBUILT_INDEXES[i["type"]], name=i["name"])
        rows, latest = objects.dataset(new).count_rows(), objects.dataset(table)
        if rows != ds.count_rows():  # the copy is not the table: never replace it
            objects.remove_tree(work)
            raise RuntimeError(f"rewriting {name!r}: the copy holds {rows} rows, the table {ds.count_rows()}")
        if latest.version != ds.version:
            objects.remove_tree(work)
            raise ConcurrentWriteError(
                f"{name!r} changed while it was being rewritten (version {ds.version} -> {latest.version}); "
                "nothing was replaced: stop its writers and run it again"
            )
        if objects.is_local(table):
            objects.rename_tree(table, objects.join(work, "old.lance"))
            objects.rename_tree(new, table)
        else:
            objects.put_bytes(objects.join(work, _SWAP_MARKER), b"new.lance is complete")
            objects.remove_tree(table)
            objects.copy_tree(new, table)
        objects.remove_tree(work)
        return _adopted(layout, name, start, [i["name"] for i in rebuilt], [i["name"] for i in dropped])
