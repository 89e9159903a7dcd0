"""Chunk views (kind ``"chunker"``): each passing source row (a parent) gives
zero or more view rows (its children), made by a :class:`~mv_assets.model.chunker.Chunker`.

A child row holds its parent's stable row id and version (``__source_row_id``,
``__source_row_version``: the key is shared by the siblings), its position
among them (``__chunk_index``), the columns the query selects (inherited from
the parent), the chunker's output columns, and a digest of the parent's
chunker inputs it was made from (``__chunk_inputs``). Columns added later with
``add_columns`` are computed from the child rows themselves.

The digest lets a refresh tell an update of an inherited column (the
children are copied with the new value, no chunker call) from an update of the
chunker's inputs (the parent is chunked again). A parent yielding no rows has
no children; it is not chunked again until it changes (see
:func:`processed_without_children`).

Pure: definitions, schemas and Arrow arrays only.
"""

import hashlib
import json

import lance
import numpy as np
import pyarrow as pa

from mv_assets.model.definition import (
    READ_FIELDS_METADATA_KEY,
    VIEW_METADATA_KEY,
    ViewDefinition,
    check_sql,
    read_field_ids,
    short_error,
)
from mv_assets.model.names import CHUNK_INDEX, CHUNK_INPUTS, SOURCE_ROW_ID, SOURCE_ROW_VERSION, ColumnKind

__all__ = ["chunk_view_schema", "inherited_columns", "input_digests", "child_index", "processed_without_children",
           "check_chunk_query"]


def inherited_columns(definition: ViewDefinition) -> dict[str, str]:
    """The parent columns each child inherits, as ``{name: SQL expression}``
    (the query's selection; columns added later are computed on the children)."""
    plain = ViewDefinition(definition.source, tuple(c for c in definition.columns if not c.added), definition.filter)
    return plain.projection


def check_chunk_query(definition: ViewDefinition, name: str) -> None:
    """What a chunk view's query may hold, refused before anything is written."""
    if definition.limit is not None or definition.shuffle:
        raise ValueError(f"chunk view {name!r}: limit() and shuffle() apply to query views only")
    udfs = [c.name for c in definition.columns if c.kind == ColumnKind.UDF and not c.added]
    if udfs:
        raise ValueError(
            f"chunk view {name!r} selects UDF columns {udfs} of the parent rows; select source columns or SQL, "
            "and compute UDF columns on the chunks with add_columns() on the view"
        )


def chunk_view_schema(definition: ViewDefinition, ds: lance.LanceDataset) -> pa.Schema:
    """The chunk view's Arrow schema; validates the query and the chunker against the source."""
    chunker = definition.table_function
    chunker.validate_inputs(ds.schema, definition.source)
    inherited = inherited_columns(definition)
    try:
        projected = check_sql(ds, filter=definition.filter, columns=inherited)
    except (ValueError, OSError) as exc:
        raise ValueError(f"invalid query over {definition.source!r}: {short_error(exc)}") from exc
    out = chunker.output_schema
    clash = [n for n in out.names if n in inherited]
    if clash:
        raise ValueError(
            f"chunker {chunker.name!r} outputs columns {clash} that the query also selects; rename one of them"
        )
    fields = [
        pa.field(SOURCE_ROW_ID, pa.int64(), nullable=False),
        pa.field(SOURCE_ROW_VERSION, pa.int64(), nullable=False),
        pa.field(CHUNK_INDEX, pa.int32(), nullable=False),
        *(projected.field(n).with_nullable(True) for n in inherited),  # (a blob column's marking kept)
        *(f.with_nullable(True) for f in out),
        pa.field(CHUNK_INPUTS, pa.string(), nullable=False),
    ]
    return pa.schema(fields, metadata={
        VIEW_METADATA_KEY: definition.encode(),
        READ_FIELDS_METADATA_KEY: json.dumps(read_field_ids(definition, ds)),
    })


def input_digests(batch: pa.RecordBatch | pa.Table, columns: list[str]) -> pa.Array:
    """Per row, a digest of the values of ``columns`` (the chunker's inputs):
    equal digests, equal inputs."""
    n = batch.num_rows
    hashers = [hashlib.blake2b(digest_size=12) for _ in range(n)]
    for name in columns:
        values = batch.column(name).to_pylist()
        for h, v in zip(hashers, values, strict=True):
            if v is None:
                h.update(b"\x00")
            else:
                raw = v if isinstance(v, bytes) else (v.encode() if isinstance(v, str) else repr(v).encode())
                h.update(b"\x01" + len(raw).to_bytes(8, "little") + raw)
    return pa.array([h.hexdigest() for h in hashers], pa.string())


def child_index(parent: np.ndarray) -> np.ndarray:
    """Each child's position among its siblings, given its parent index per
    child (children grouped by parent, in order).

    >>> child_index(np.array([0, 0, 2, 2, 2, 3])).tolist()
    [0, 1, 0, 1, 2, 0]
    """
    parent = np.asarray(parent, dtype=np.int64)
    if len(parent) == 0:
        return np.empty(0, np.int32)
    starts = np.r_[True, parent[1:] != parent[:-1]]
    first = np.maximum.accumulate(np.where(starts, np.arange(len(parent)), 0))
    return (np.arange(len(parent)) - first).astype(np.int32)


def processed_without_children(versions: np.ndarray, have_children: np.ndarray, reflected: int | None,
                               fragments: np.ndarray | None = None, scoped: dict[int, int] | None = None) -> np.ndarray:
    """Parents a refresh comparing every row with the source counts as current
    although the view holds no row of theirs: those not written since the
    version the whole view reflects, or since a fragment-scoped refresh of
    their fragment (``scoped``: fragment -> source version) processed them
    (chunked then, into no rows).

    >>> processed_without_children(np.array([3, 5, 2]), np.array([False, False, True]), 4).tolist()
    [True, False, False]
    >>> processed_without_children(np.array([5, 5]), np.array([False, False]), 4, np.array([1, 2]), {2: 6}).tolist()
    [False, True]
    """
    versions = np.asarray(versions)
    done = np.zeros(len(versions), dtype=bool) if reflected is None else versions <= reflected
    if scoped and fragments is not None:
        upto = np.array([scoped.get(int(f), -1) for f in fragments], dtype=np.int64)
        done |= versions <= upto
    return (~np.asarray(have_children, dtype=bool)) & done


def view_schema(definition: ViewDefinition, datasets: list[lance.LanceDataset]) -> pa.Schema:
    """:func:`chunk_view_schema` over the view's one source (model.kinds: every kind's schema by this name)."""
    return chunk_view_schema(definition, datasets[0])
