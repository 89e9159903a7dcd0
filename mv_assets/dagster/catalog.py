"""What the wiring knows of a catalog, read from stored metadata only: no UDF is
unpickled and no JVM starts."""

import json
from dataclasses import dataclass, field
from typing import Any

import lance

from mv_assets.api.catalog import Connection
from mv_assets.api.declare import reconcile
from mv_assets.model.definition import (
    COLUMNS_METADATA_KEY,
    VIEW_METADATA_KEY,
    definition_reads,
    is_marker,
    output_schema,
    tracked_source_columns,
)
from mv_assets.model.names import VIEW_KEY_COLUMNS
from mv_assets.model.policy import POLICY_METADATA_KEY, RefreshPolicy

__all__ = ["TableInfo", "catalog_tables"]

HIDDEN = tuple(sorted(VIEW_KEY_COLUMNS))


@dataclass
class TableInfo:
    """A table or view as the Dagster wiring sees it."""

    name: str
    uri: str
    is_view: bool
    source: str | None = None
    filter: str | None = None
    limit: int | None = None
    columns: list[dict] = field(default_factory=list)
    policy: RefreshPolicy = field(default_factory=RefreshPolicy)
    schema: list[tuple[str, str]] = field(default_factory=list)  # visible (name, type) pairs
    reads: list[str] = field(default_factory=list)  # computed / UDF columns of the source it reads
    root: str = ""  # the base table at the start of the lineage
    over_view: bool = False  # the source is itself a view
    definition: dict = field(default_factory=dict, repr=False)  # the stored view definition (JSON)
    declared: Any = field(default=None, repr=False)  # the query declaring it in code (code-first views)
    declared_definition: Any = field(default=None, repr=False)  # its ViewDefinition, derived once at load
    code_changes: Any = field(default=None, repr=False)  # how the catalog differs from that code

    @property
    def source_name(self) -> str:
        """The source of a view (ValueError for a base table)."""
        if self.source is None:
            raise ValueError(f"{self.name!r} is a table: it has no source")
        return self.source

    @property
    def udf_columns(self) -> list[dict]:
        return [c for c in self.columns if c["kind"] == "udf"]

    @property
    def scoped(self) -> bool:
        """Whether a partition (source fragment) can be refreshed on its own:
        views over a base table without a limit. Others refresh as a whole
        whatever partitions a run names."""
        return self.is_view and self.limit is None and not self.over_view

    @property
    def computed(self) -> list[str]:
        """Columns other views can depend on as assets of their own."""
        return [c["name"] for c in (self.udf_columns if self.is_view else self.columns)]


def _visible(schema) -> list[tuple[str, str]]:
    return [(f.name, str(f.type)) for f in schema if f.name not in HIDDEN and not is_marker(f.name)]


def _declare(out: dict[str, "TableInfo"], names: dict[str, list[str]], db: Connection, declared: dict) -> None:
    """Overlay views declared in code: their UDF columns (and so code versions)
    come from the code; views not created yet are described from the query."""
    for name, query in declared.items():
        definition = query.to_definition()
        diff = reconcile(db, name, definition)
        d = definition.to_json()
        if diff.create:
            if definition.source not in out:
                raise ValueError(f"view {name!r} is declared over {definition.source!r}, which is not in {db.uri}")
            src_ds = lance.dataset(db.table_uri(definition.source))
            schema = output_schema(definition, src_ds)
            info = TableInfo(
                name, db.table_uri(name), True, definition.source, definition.filter, definition.limit,
                d["columns"], RefreshPolicy.eager(), _visible(schema), definition=d,
            )
            if not out[definition.source].is_view:
                info.reads = definition.reads(out[definition.source].computed, src_ds.schema)
            out[name] = info
            names[name] = schema.names
        else:
            info = out[name]
            code = {c["name"]: c for c in d["columns"]}
            info.columns = [code.get(c["name"], c) if c["kind"] == "udf" else c for c in info.columns]
            info.columns += [code[c] for c in diff.added]
        info.declared, info.declared_definition, info.code_changes = query, definition, diff


def catalog_tables(db: Connection, declared: dict | None = None) -> dict[str, TableInfo]:
    """Every table and view of ``db`` with its lineage; ``declared`` (name ->
    query) overlays views declared in code (see :mod:`mv_assets.declare`)."""
    out: dict[str, TableInfo] = {}
    names: dict[str, list[str]] = {}
    for name in db.table_names():
        uri = db.table_uri(name)
        schema = lance.dataset(uri).schema
        md = schema.metadata or {}
        names[name] = schema.names
        raw = md.get(VIEW_METADATA_KEY.encode())
        if raw is None:
            cols = json.loads(md.get(COLUMNS_METADATA_KEY.encode(), b"[]"))
            out[name] = TableInfo(name, uri, False, columns=cols, schema=_visible(schema), root=name)
            continue
        d = json.loads(raw)
        info = TableInfo(
            name, uri, True, d["source"], d.get("filter"), d.get("limit"), d["columns"],
            RefreshPolicy.from_json(md.get(POLICY_METADATA_KEY.encode())), _visible(schema),
        )
        info.reads = tracked_source_columns(schema)
        info.definition = d
        out[name] = info
    if declared:
        _declare(out, names, db, declared)
    for info in out.values():
        if not info.is_view or info.source not in out:
            continue
        src = out[info.source]
        info.over_view = src.is_view
        if src.is_view:  # which UDF columns of the upstream view it reads
            info.reads = definition_reads(info.definition, src.computed, names[src.name])
        root, seen = src, {info.name}
        while root.is_view and root.source in out and root.name not in seen:
            seen.add(root.name)
            root = out[root.source]
        info.root = root.name
    return out
