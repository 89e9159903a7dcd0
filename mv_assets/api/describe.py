"""What a catalog holds, described from stored metadata only: no UDF is
unpickled and no JVM starts. The Dagster wiring (and any other orchestrator)
reads tables and views through these descriptions instead of parsing the
engine's metadata itself."""

import json
from dataclasses import dataclass, field

import pyarrow as pa

from mv_assets.model.blobs import is_blob_field
from mv_assets.model.definition import (
    COLUMNS_METADATA_KEY,
    VIEW_METADATA_KEY,
    ViewDefinition,
    tracked_source_columns,
)
from mv_assets.model.kinds import kind_of
from mv_assets.model.names import is_internal_column
from mv_assets.model.ownership import OWNERSHIP_METADATA_KEY, Ownership
from mv_assets.model.policy import POLICY_METADATA_KEY, RefreshPolicy
from mv_assets.storage import objects

__all__ = ["TableDescription", "describe_dataset", "describe_definition"]

@dataclass(frozen=True)
class TableDescription:
    """A table or view: its place in the lineage, columns and policy.

    ``columns`` are the stored column specs as JSON dicts (``name``, ``kind``
    and, for computed columns, the code version in ``fingerprint``); UDFs are
    not unpickled. ``schema`` lists the visible ``(name, type)`` pairs (no
    internal key or marker columns); ``field_names`` every stored field."""

    name: str
    uri: str
    is_view: bool
    version: int | None
    source: str | None = None
    filter: str | None = None
    limit: int | None = None
    columns: list[dict] = field(default_factory=list)
    policy: RefreshPolicy = field(default_factory=RefreshPolicy)
    schema: list[tuple[str, str]] = field(default_factory=list)
    field_names: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)  # computed source columns the view reads
    definition: dict = field(default_factory=dict, repr=False)  # a view's stored definition (JSON)
    # a chunk view's added columns: computed from its own rows by backfill, as a table's
    row_columns: list[dict] = field(default_factory=list)
    ownership: Ownership = field(default_factory=Ownership)  # a view's owners and tags


def _visible(schema: pa.Schema) -> list[tuple[str, str]]:
    """(name, type) of the user's columns; a blob column is its bytes, stored as a blob."""
    return [(f.name, "large_binary (blob)" if is_blob_field(f) else str(f.type))
            for f in schema if not is_internal_column(f.name)]


def describe_dataset(name: str, uri: str) -> TableDescription:
    """The description of the table or view stored at ``uri``."""
    ds = objects.dataset(uri)
    schema = ds.schema
    md = schema.metadata or {}
    raw = md.get(VIEW_METADATA_KEY.encode())
    if raw is None:
        cols = json.loads(md.get(COLUMNS_METADATA_KEY.encode(), b"[]"))
        return TableDescription(name, uri, False, ds.version, columns=cols, schema=_visible(schema),
                                field_names=schema.names)
    d = json.loads(raw)
    return TableDescription(
        name, uri, True, ds.version, d["source"], d.get("filter"), d.get("limit"), d["columns"],
        RefreshPolicy.from_json(md.get(POLICY_METADATA_KEY.encode())), _visible(schema), schema.names,
        tracked_source_columns(schema), d, json.loads(md.get(COLUMNS_METADATA_KEY.encode(), b"[]")),
        Ownership.from_json(md.get(OWNERSHIP_METADATA_KEY.encode())),
    )


def describe_definition(
    name: str, uri: str, definition: ViewDefinition, datasets: list, source_computed: list[str] | None
) -> TableDescription:
    """A view not created yet, described from its definition over its sources'
    ``datasets`` (validated against them; the first is its source, a join's
    others follow). ``source_computed`` lists the computed columns of a
    base-table source (None for a view source)."""
    src = datasets[0]
    schema = kind_of(definition).schema(definition, datasets)
    d = definition.to_json()
    reads = definition.reads(source_computed, src.schema) if source_computed is not None else []
    return TableDescription(
        name, uri, True, None, definition.source, definition.filter, definition.limit, d["columns"],
        RefreshPolicy.eager(), _visible(schema), schema.names, reads, d,
    )
