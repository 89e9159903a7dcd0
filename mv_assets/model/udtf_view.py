"""Table-function views (kind ``"udtf"``): the passing source rows are grouped
into partitions (one per distinct value of the UDTF's ``partition_by``
column, NULL its own; without ``partition_by`` the whole source is one
partition), and a :class:`~mv_assets.model.chunker.UDTF` turns the rows of
one partition into zero or more view rows (N:M).

A view row holds the UDTF's output columns and two bookkeeping columns:

* ``__partition``: the partition's key, the JSON text of its value
  (``'"en"'``, ``'3'``, ``'null'`` for NULL, ``'"2024-01-31"'`` for a date;
  :data:`WHOLE_SOURCE` ``'*'`` without ``partition_by``), see :func:`partition_key`;
* ``__source_row_id``: the partition's id, a 63-bit hash of that key
  (:func:`partition_id`), shared by the partition's rows. The view's rows are
  keyed by it where the engine keys rows of other views by their source row
  (the refresh's key plan and its deletions); it names no source row. A
  refresh finds a partition's view rows by their exact ``__partition`` key,
  so two keys with the same hash (about n²/2⁶⁴ for n partitions) would only
  share an id, never lose each other's rows.

A partition's rows are replaced together: its view rows are deleted and,
when it still has rows, it is computed again (one UDTF call over all its
rows at the target version).

Partition columns hold values whose SQL equality is exact: integers,
strings, booleans and dates (:func:`check_partition_type`).

Pure: definitions, schemas and Arrow arrays only.
"""

import datetime as _dt
import hashlib
import json

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.model.chunker import UDTF
from mv_assets.model.definition import (
    READ_FIELDS_METADATA_KEY,
    VIEW_METADATA_KEY,
    ViewDefinition,
    check_sql,
    quote_ident,
    read_field_ids,
    short_error,
    sql_literal,
)
from mv_assets.model.names import PARTITION, SOURCE_ROW_ID

__all__ = [
    "WHOLE_SOURCE", "udtf_view_schema", "check_udtf_query", "bind_udtf", "check_partition_type", "exact_key_type", "partition_key", "partition_id",
    "partition_ids", "partition_predicate", "group_partitions",
]

WHOLE_SOURCE = "*"  # the key of the one partition of a UDTF without partition_by (no JSON text reads so)


def exact_key_type(dtype: pa.DataType) -> bool:
    """Whether values of ``dtype`` are compared exactly by SQL and have a SQL
    literal: not floats (``-0.0 = 0.0``, NaN), lists or structs."""
    return (pa.types.is_integer(dtype) or pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
            or pa.types.is_boolean(dtype) or pa.types.is_date(dtype))


def check_partition_type(name: str, column: str, dtype: pa.DataType) -> None:
    """Refuse a partition column whose type is not :func:`exact_key_type`."""
    if exact_key_type(dtype):
        return
    raise ValueError(
        f"UDTF {name!r} partitions by column {column!r} of type {dtype}; a partition column must hold integers, "
        "strings, booleans or dates (values compared exactly)"
    )


def check_udtf_query(definition: ViewDefinition, name: str, selects_all: bool) -> list[str]:
    """What a table-function view's query may hold, refused before anything
    is written; returns the columns the UDTF may read: those the query
    selects, by their source names, or every column of the source."""
    if definition.limit is not None or definition.shuffle:
        raise ValueError(f"table-function view {name!r}: limit() and shuffle() apply to query views only")
    if not selects_all:
        bad = [c.name for c in definition.columns if c.kind != "column" or c.expr != c.name]
        if bad:
            raise ValueError(
                f"table-function view {name!r}: its query selects {bad}, which are not source columns under their "
                "own names; a UDTF reads source columns (select them by name: source.search(None).select([...])), "
                "and its output_schema makes the view's columns"
            )
    return [c.name for c in definition.columns]


def bind_udtf(function: UDTF, readable: list[str], name: str, selects_all: bool) -> UDTF:
    """The UDTF with its inputs fixed: one declared without ``input_columns``
    reads ``readable`` (Geneva: the whole source, here the query's columns at
    the view's creation); one that names them must name columns the query
    selects."""
    if function.input_columns is None:
        if not readable:
            raise ValueError(f"table-function view {name!r}: the source query has no column for UDTF "
                             f"{function.name!r} to read")
        return function.bound_to(readable)
    if not selects_all:
        missing = [c for c in function.input_columns if c not in readable]
        if missing:
            raise ValueError(f"table-function view {name!r}: UDTF {function.name!r} reads {missing}, which its "
                             f"source query does not select ({readable})")
    return function


def udtf_view_schema(definition: ViewDefinition, ds: lance.LanceDataset) -> pa.Schema:
    """The table-function view's Arrow schema; validates the filter and the UDTF against the source."""
    f = definition.table_function
    f.validate_inputs(ds.schema, definition.source)
    if f.partition_by is not None:
        check_partition_type(f.name, f.partition_by, ds.schema.field(f.partition_by).type)
    try:
        check_sql(ds, filter=definition.filter)
    except (ValueError, OSError) as exc:
        raise ValueError(f"invalid query over {definition.source!r}: {short_error(exc)}") from exc
    fields = [
        pa.field(SOURCE_ROW_ID, pa.int64(), nullable=False),
        pa.field(PARTITION, pa.string(), nullable=False),
        *(fld.with_nullable(True) for fld in f.output_schema),
    ]
    return pa.schema(fields, metadata={
        VIEW_METADATA_KEY: definition.encode(),
        READ_FIELDS_METADATA_KEY: json.dumps(read_field_ids(definition, ds)),
    })


def partition_key(value) -> str:
    """The key of the partition of ``value`` (a Python value of the partition
    column): the JSON text of the value, a date's ISO text quoted.

    >>> partition_key("en"), partition_key(3), partition_key(None), partition_key(True)
    ('"en"', '3', 'null', 'true')
    >>> partition_key(_dt.date(2024, 1, 31))
    '"2024-01-31"'
    """
    if isinstance(value, _dt.date):
        return json.dumps(value.isoformat())
    return json.dumps(value)


def partition_id(key: str) -> int:
    """The id of the partition with key ``key``: a 63-bit hash (non-negative int64)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


def partition_ids(keys: list[str]) -> np.ndarray:
    return np.array([partition_id(k) for k in keys], dtype=np.int64)


def _value(key: str, dtype: pa.DataType):
    value = json.loads(key)
    if value is not None and pa.types.is_date(dtype):
        return _dt.date.fromisoformat(value)
    return value


def partition_predicate(column: str | None, dtype: pa.DataType | None, keys: list[str]) -> str | None:
    """SQL selecting the source rows of the partitions ``keys`` (None: the whole source).

    >>> partition_predicate("lang", pa.string(), ['"en"', 'null', '"it\\'s"'])
    "(lang IN ('en', 'it''s') OR lang IS NULL)"
    """
    if column is None:
        return None
    assert dtype is not None
    values = [_value(k, dtype) for k in keys]
    col = quote_ident(column)
    parts = []
    literals = [sql_literal(v) for v in values if v is not None]
    if literals:
        parts.append(f"{col} IN ({', '.join(literals)})")
    if any(v is None for v in values):
        parts.append(f"{col} IS NULL")
    if not parts:
        return "false"
    return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"


def group_partitions(values: "pa.Array | pa.ChunkedArray | None", n: int) -> dict[str, np.ndarray]:
    """The positions of each partition's rows among ``n`` rows whose partition
    column holds ``values`` (None: no ``partition_by``, one partition), by
    partition key; positions ascend within a partition.

    >>> {k: v.tolist() for k, v in group_partitions(pa.array(["a", None, "a"]), 3).items()}
    {'"a"': [0, 2], 'null': [1]}
    """
    if values is None:
        return {WHOLE_SOURCE: np.arange(n)} if n else {}
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if len(array) == 0:
        return {}
    encoded = pc.dictionary_encode(array, null_encoding="encode")  # pyright: ignore[reportAttributeAccessIssue]
    keys = [partition_key(v) for v in encoded.dictionary.to_pylist()]
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.r_[True, np.diff(codes[order]) != 0, True])
    return {keys[int(codes[order[lo]])]: order[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)}


def view_schema(definition: ViewDefinition, datasets: list[lance.LanceDataset]) -> pa.Schema:
    """:func:`udtf_view_schema` over the view's one source (model.kinds: every kind's schema by this name)."""
    return udtf_view_schema(definition, datasets[0])
