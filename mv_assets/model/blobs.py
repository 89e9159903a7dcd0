"""Lance blob columns (large binary values stored out of line: videos, images,
audio) as the engine sees them.

Lance marks a blob column with ``lance-encoding:blob`` metadata on a
``large_binary`` field; a dataset written with it stores the field as
``lance.blob.v2`` (an extension type whose storage is a descriptor struct:
where the bytes are, not the bytes). The engine works with the logical form:
it reads blob columns as their bytes (``blob_handling="all_binary"``, see
:mod:`mv_assets.execution.blobs`) and writes them as ``large_binary`` with the
metadata, which Lance's dataset writer stores as blobs again.

>>> import pyarrow as pa
>>> f = pa.field("video", pa.large_binary(), metadata=BLOB_METADATA)
>>> is_blob_field(f), is_blob_field(pa.field("x", pa.int64()))
(True, False)
>>> logical_schema(pa.schema([f, pa.field("x", pa.int64())])).field("video").type
DataType(large_binary)
"""

from typing import Final, Literal

import pyarrow as pa

__all__ = ["BLOB_METADATA", "BYTES", "blob_names", "blob_sources", "is_blob_field", "logical_schema", "logical_type"]

BLOB_METADATA = {b"lance-encoding:blob": b"true"}
BYTES: Final[Literal["all_binary"]] = "all_binary"  # a scan's ``blob_handling``: blob columns as their bytes


def is_blob_field(field: pa.Field) -> bool:
    """A blob column: Lance's blob extension type, or a binary field marked for blob encoding."""
    name = getattr(field.type, "extension_name", None)
    if isinstance(name, str) and name.startswith("lance.blob"):
        return True
    metadata = field.metadata or {}
    return (metadata.get(b"lance-encoding:blob", b"").lower() == b"true"
            or metadata.get(b"lance-encoding", b"").lower() == b"blob")


def logical_type(field: pa.Field) -> pa.DataType:
    """The type a field's values have for the engine: a blob column's bytes are ``large_binary``."""
    return pa.large_binary() if is_blob_field(field) else field.type


def blob_names(schema: pa.Schema) -> list[str]:
    """The schema's top-level blob columns."""
    return [f.name for f in schema if is_blob_field(f)]


def blob_sources(columns: "dict[str, str] | list[str] | None", schema: pa.Schema) -> dict[str, str]:
    """Of a scan's projection (``{name: SQL}``, names, or None: every column),
    each output name that reads a blob column of ``schema`` as it is (the
    column's name, quoted or not), with that column.

    >>> s = pa.schema([pa.field("v", pa.large_binary(), metadata=BLOB_METADATA), pa.field("x", pa.int64())])
    >>> blob_sources({"copy": "`v`", "y": "x + 1"}, s), blob_sources(["x", "v"], s), blob_sources(None, s)
    ({'copy': 'v'}, {'v': 'v'}, {'v': 'v'})
    """
    blobs = set(blob_names(schema))
    if not blobs:
        return {}
    named = dict(columns) if isinstance(columns, dict) else {c: c for c in (columns or schema.names)}
    return {name: source for name, sql in named.items() if (source := str(sql).strip("`")) in blobs}


def logical_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each blob column as ``large_binary`` marked for blob
    encoding: what the engine reads (``all_binary``) and hands Lance's writer."""
    if not any(is_blob_field(f) for f in schema):
        return schema
    fields = [pa.field(f.name, pa.large_binary(), f.nullable, {**(f.metadata or {}), **BLOB_METADATA})
              if is_blob_field(f) else f for f in schema]
    return pa.schema(fields, metadata=schema.metadata)
