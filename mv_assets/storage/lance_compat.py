"""The one place that touches pylance internals or version-specific details.

Everything else calls these helpers, so a pylance upgrade that renames an
internal is one edit here (see ../shared/notes/stack-facts.md for the
facts behind each).
"""

import dataclasses

import lance
import pyarrow as pa
from lance.commit import CommitConflictError  # a concurrent writer won (``.retryable``)
from lance.fragment import Bitmap  # pyright: ignore[reportPrivateImportUsage]

from mv_assets.model.blobs import blob_sources

__all__ = ["CommitConflictError", "take_rows", "roaring_bitmap_bytes", "delete_offsets", "field_ids",
           "with_filter_columns"]


def _readable_rewritten_indexes() -> None:
    """pylance 14 cannot read back the transaction of a compaction that
    rewrote an index: its Rust side builds ``LanceOperation.RewrittenIndex``
    from two of the five fields the Python class requires (TypeError), so a
    table with any index (its primary key's: storage.keys) had its compaction
    commits unreadable, and views over it took them for unknown changes
    (history unreadable: rows scanned). The class is looked up by name when a
    transaction is read: the same class with defaults for the three missing
    fields reads them (``tests/test_lance_contract.py``)."""
    cls = lance.LanceOperation.RewrittenIndex
    fields = getattr(cls, "__dataclass_fields__", {})
    missing = [n for n in ("new_details_type_url", "new_details_value", "new_index_version") if n in fields]
    if not missing or getattr(cls, "_mv_assets_defaults", False):
        return

    @dataclasses.dataclass
    class RewrittenIndex(cls):  # pyright: ignore[reportGeneralTypeIssues]  (a dataclass of pylance's)
        new_details_type_url: str = ""
        new_details_value: bytes = b""
        new_index_version: int = 0
        _mv_assets_defaults = True

    RewrittenIndex.__qualname__ = cls.__qualname__
    lance.LanceOperation.RewrittenIndex = RewrittenIndex  # pyright: ignore[reportAttributeAccessIssue]


_readable_rewritten_indexes()

_ROW_VERSION_COLUMNS = ("_row_created_at_version", "_row_last_updated_at_version")


def take_rows(ds: lance.LanceDataset, row_ids: "list[int] | pa.Array", columns) -> pa.Table:
    """Rows by Lance row id (stable ids; addresses for datasets without them),
    in the order given. pylance offers this only as ``_take_rows``, which
    returns a blob column's descriptors (where its bytes are): a blob column
    (named as itself or as a quoted identifier) comes as its bytes, read with
    ``take_blobs``, as the scans of tasks read it (``blob_handling``)."""
    table = ds._take_rows(row_ids, columns=columns)
    copies = blob_sources(columns, ds.schema)
    if not copies:
        return table
    ids = list(row_ids) if isinstance(row_ids, list) else row_ids.to_pylist()
    for i, name in enumerate(table.column_names):
        if name in copies:
            files = ds.take_blobs(copies[name], ids=ids)
            values = pa.array([None if f is None else f.readall() for f in files], pa.large_binary())
            table = table.set_column(i, pa.field(name, pa.large_binary()), values)
    return table


def roaring_bitmap_bytes(offsets: list[int]) -> bytes:
    """Portable RoaringBitmap serialization of row offsets (what
    ``Update(updated_fragment_offsets=...)`` takes); pylance exposes it only
    through the Bitmap's pickle support."""
    raw = Bitmap(offsets).__reduce__()[1][0]
    assert isinstance(raw, bytes)
    return raw


def delete_offsets(fragment: lance.LanceFragment, offsets: "list[int]"):
    """The fragment with the rows at these physical offsets deleted (its
    deletion vector grown; None when no row is left), uncommitted. Nothing is
    scanned: pylance's ``delete(predicate)`` reads the fragment to evaluate the
    predicate, ``delete_rows`` (marked internal) takes the offsets; its
    wrapper copies each offset through ``int()`` (~0.5 ms a 10,000), the
    list given is one of ints already, handed to Lance as it is."""
    raw = getattr(fragment, "_fragment", None)
    if raw is None or not hasattr(raw, "delete_rows"):
        return fragment.delete_rows(offsets)
    deleted = raw.delete_rows(offsets if isinstance(offsets, list) else [int(o) for o in offsets])
    return None if deleted is None else deleted.metadata()


def field_ids(ds: lance.LanceDataset, names: "list[str] | None" = None) -> list[tuple[int, bool]]:
    """Lance field ids of the columns ``names`` (default: every column), depth
    first in schema order, each with whether it is a leaf (what data files list)."""
    out: list[tuple[int, bool]] = []

    def walk(f) -> None:
        children = f.children()
        out.append((f.id(), not children))
        for c in children:
            walk(c)

    by_name = {f.name(): f for f in ds.lance_schema.fields()}
    for n in names if names is not None else list(by_name):
        walk(by_name[n])
    return out


def with_filter_columns(projection: dict, predicate: str | None) -> dict:
    """``projection`` plus Lance's row-version columns ``predicate`` names, read
    under aliases of their own. Lance 14 fails to evaluate a filter on them
    over some scans unless they are read too: a one-row address range
    (``_rowaddr >= a AND _rowaddr <= a``: "Invalid argument error: number of
    columns..." or "No field named _row_created_at_version"), a fragment
    rewritten by compaction."""
    if not predicate:
        return projection
    extra = {f"__mv_assets_filter{name}": name for name in _ROW_VERSION_COLUMNS
             if name in predicate and name not in projection.values()}
    return {**projection, **extra} if extra else projection
