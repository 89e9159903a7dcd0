"""The query builder (``table.search(None).where(...).select(...)``) and the
stored, serialisable definition of a materialized view.

Validation happens against the source schema before anything is written:
unknown columns, bad SQL, UDF parameters naming no column, type mismatches and
duplicate output names all raise ``ValueError``.
"""

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lance
import pyarrow as pa

from .names import (
    COMPUTED_PREFIX,
    LANCE_ROW_COLUMNS,
    SOURCE_MARKER_PREFIX,
    SOURCE_ROW_ID,
    SOURCE_ROW_VERSION,
    VIEW_KEY_COLUMNS,
    Alias,
    ColumnKind,
    computed_marker,
    is_marker,
    is_reserved_name,
    source_marker,
)
from .udf import UDF

if TYPE_CHECKING:
    from .table import Table

__all__ = [
    "Query", "ColumnSpec", "ViewDefinition", "SOURCE_ROW_ID", "SOURCE_ROW_VERSION", "VIEW_METADATA_KEY",
    "computed_marker", "is_marker",
]

def tracked_source_columns(schema: pa.Schema) -> list[str]:
    """Computed source columns a view reads (it keeps copies of their markers)."""
    return [n[len(SOURCE_MARKER_PREFIX):] for n in schema.names if n.startswith(SOURCE_MARKER_PREFIX)]


def computed_column_names(schema: pa.Schema) -> list[str]:
    """Columns of a table or view that have a computed marker."""
    return [n[len(COMPUTED_PREFIX):] for n in schema.names if n.startswith(COMPUTED_PREFIX)]


VIEW_METADATA_KEY = "mv_assets.view"
FORMAT_VERSION = 1

_VIEW_COLUMNS = VIEW_KEY_COLUMNS
_SYSTEM_COLUMNS = LANCE_ROW_COLUMNS


@dataclass(frozen=True)
class ColumnSpec:
    """One output column of a view: a source column, a SQL expression or a UDF."""

    name: str
    kind: str  # a ColumnKind: "column" | "sql" | "udf"
    expr: str | None = None
    udf: UDF | None = None
    field: str | None = None  # multi-column UDF: the struct field this column holds
    added: bool = False  # added after creation (add_columns): existing rows are backfilled

    @property
    def the_udf(self) -> UDF:
        """The UDF of a UDF column (ValueError for SQL and plain columns)."""
        if self.udf is None:
            raise ValueError(f"column {self.name!r} is not a UDF column")
        return self.udf

    @property
    def fingerprint(self) -> str:
        """What computed this column's values: the UDF's code or the SQL text."""
        if self.udf is not None:
            return self.udf.fingerprint
        return hashlib.sha256(f"{self.kind}|{self.expr}".encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.expr is not None:
            out["expr"] = self.expr
        if self.udf is not None:
            out["udf"] = self.udf.to_spec()
        if self.field is not None:
            out["field"] = self.field
        if self.added:
            out["added"] = True
        return out

    @staticmethod
    def from_json(d: dict) -> "ColumnSpec":
        udf = UDF.from_spec(d["udf"]) if "udf" in d else None
        return ColumnSpec(d["name"], ColumnKind(d["kind"]), d.get("expr"), udf, d.get("field"), bool(d.get("added")))


@dataclass(frozen=True)
class ViewDefinition:
    """Everything needed to (re)compute a view, stored in the view's schema metadata."""

    source: str
    columns: tuple[ColumnSpec, ...]
    filter: str | None = None
    shuffle: bool = False
    seed: int | None = None
    limit: int | None = None

    @property
    def udf_columns(self) -> list[ColumnSpec]:
        return [c for c in self.columns if c.kind == "udf"]

    @property
    def projection(self) -> dict[str, str]:
        """Non-UDF output columns as ``{name: SQL expression}`` for Lance's scanner."""
        out = {}
        for c in self.columns:
            if c.kind == "column":
                out[c.name] = _quote_ident(c.expr or c.name)
            elif c.kind == "sql":
                out[c.name] = c.expr or ""
        return out

    def reads(self, columns: list[str], source_schema: pa.Schema) -> list[str]:
        """Which of ``columns`` (of the source) this view reads, conservatively:
        selected, fed to a UDF, or named in a SQL expression or the filter."""
        light = {
            "filter": self.filter,
            "columns": [
                {"name": c.name, "kind": c.kind, "expr": c.expr, "udf": {"input_columns": c.udf.input_columns if c.udf else None}}
                for c in self.columns
            ],
        }
        return definition_reads(light, columns, source_schema.names)

    def udf_input_columns(self, source_schema: pa.Schema) -> list[str]:
        cols: list[str] = []
        for c in self.udf_columns:
            assert c.udf is not None
            needed = c.udf.input_columns or [
                n for n in source_schema.names if n not in _VIEW_COLUMNS and not is_marker(n)
            ]
            for n in needed:
                if n not in cols:
                    cols.append(n)
        return cols

    def to_json(self) -> dict:
        return {
            "format": FORMAT_VERSION,
            "source": self.source,
            "columns": [c.to_json() for c in self.columns],
            "filter": self.filter,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "limit": self.limit,
        }

    @staticmethod
    def from_json(d: dict) -> "ViewDefinition":
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(f"unsupported view definition format {d.get('format')!r}")
        return ViewDefinition(
            source=d["source"],
            columns=tuple(ColumnSpec.from_json(c) for c in d["columns"]),
            filter=d.get("filter"),
            shuffle=bool(d.get("shuffle")),
            seed=d.get("seed"),
            limit=d.get("limit"),
        )

    def shape_fingerprint(self) -> str:
        """Hash of what decides which rows the view holds and its original columns.

        UDF columns and columns added later are left out: a changed UDF makes
        its column stale row by row (see ``computed_marker``), it does not
        make the view recompute everything.
        """
        return shape_fingerprint(self.to_json())

    def fingerprint(self) -> str:
        """Hash of the definition; UDFs count by their code fingerprint."""
        d = self.to_json()
        for c in d["columns"]:
            if "udf" in c:
                c["udf"] = {k: v for k, v in c["udf"].items() if k != "pickle"}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def encode(self) -> bytes:
        return json.dumps(self.to_json()).encode()

    @staticmethod
    def decode(raw: bytes | str) -> "ViewDefinition":
        return ViewDefinition.from_json(json.loads(raw))


def shape_fingerprint(definition: dict) -> str:
    """:meth:`ViewDefinition.shape_fingerprint` of a stored definition (its JSON)."""
    d = {**definition, "columns": [c for c in definition["columns"] if c["kind"] != "udf" and not c.get("added")]}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def definition_reads(definition: dict, columns: list[str], source_names: list[str]) -> list[str]:
    """:meth:`ViewDefinition.reads` on a stored definition (its JSON), without
    unpickling any UDF: what the Dagster wiring uses for lineage."""
    cols = definition.get("columns", [])
    texts = [definition.get("filter") or ""] + [c.get("expr") or "" for c in cols if c["kind"] == "sql"]
    direct = {c.get("expr") or c["name"] for c in cols if c["kind"] == "column"}
    for c in cols:
        if c["kind"] == "udf":
            direct.update(c["udf"].get("input_columns") or source_names)
    out = []
    for name in columns:
        pattern = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])")
        if name in direct or any(pattern.search(t) for t in texts):
            out.append(name)
    return out


def _quote_ident(name: str) -> str:
    if name.isidentifier() and name.lower() == name:
        return name
    return "`" + name.replace("`", "``") + "`"


class Query:
    """A lazy query over a table: filter, projection (with UDFs), shuffle, limit.

    Builder methods return new queries; nothing is read until the query is
    materialized (:meth:`Connection.create_materialized_view`) or executed
    (:meth:`to_arrow`).
    """

    def __init__(self, table: "Table") -> None:
        self._table = table
        self._filter: str | None = None
        self._select: list[tuple[str, Any]] | None = None
        self._shuffle = False
        self._seed: int | None = None
        self._limit: int | None = None

    def _copy(self, **changes: Any) -> "Query":
        q = Query(self._table)
        q.__dict__.update(self.__dict__)
        q.__dict__.update(changes)
        return q

    def where(self, sql: str | None) -> "Query":
        """Keep source rows for which the SQL predicate is true."""
        if sql is not None and (not isinstance(sql, str) or not sql.strip()):
            raise ValueError("where() takes a non-empty SQL predicate string")
        return self._copy(_filter=sql)

    def select(self, columns: dict[str, Any] | list[Any]) -> "Query":
        """Output columns: a list of names (or UDFs), or ``{name: column | SQL | UDF}``."""
        items: list[tuple[str, Any]] = []
        if isinstance(columns, dict):
            items = list(columns.items())
        elif isinstance(columns, (list, tuple)):
            for c in columns:
                if isinstance(c, str):
                    items.append((c, c))
                elif isinstance(c, UDF):
                    items.append((c.name, c))
                else:
                    raise ValueError(f"select() list entries must be column names or UDFs, got {c!r}")
        else:
            raise ValueError("select() takes a dict or a list")
        if not items:
            raise ValueError("select() needs at least one column")
        return self._copy(_select=items)

    def shuffle(self, seed: int | None = None) -> "Query":
        """Order rows by a seeded hash of their stable source row id (see docs)."""
        if seed is not None and not isinstance(seed, int):
            raise ValueError("shuffle seed must be an int")
        return self._copy(_shuffle=True, _seed=0 if seed is None else seed)

    def limit(self, n: int) -> "Query":
        """Keep at most ``n`` rows: the first ``n`` by (shuffled) order."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError("limit must be a non-negative int")
        return self._copy(_limit=n)

    @property
    def table(self) -> "Table":
        return self._table

    def to_definition(self) -> ViewDefinition:
        """Validate against the source schema and return the view definition."""
        source_schema = self._table.schema
        ds = self._table._dataset()
        columns: list[ColumnSpec] = []
        if self._select is None:
            for name in source_schema.names:
                if name not in _VIEW_COLUMNS and not is_marker(name):
                    columns.append(ColumnSpec(name, "column", name))
        else:
            seen: set[str] = set()
            for name, value in self._select:
                if not isinstance(name, str) or not name:
                    raise ValueError(f"output column names must be non-empty strings, got {name!r}")
                if name in seen:
                    raise ValueError(f"duplicate output column name {name!r}")
                seen.add(name)
                if isinstance(value, UDF):
                    value = value.bound_to(source_schema)
                    value.validate_inputs(source_schema, name)
                    columns.append(ColumnSpec(name, "udf", None, value))
                elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], UDF):
                    u = value[0].with_inputs(list(value[1]))
                    u.validate_inputs(source_schema, name)
                    columns.append(ColumnSpec(name, "udf", None, u))
                elif isinstance(value, str):
                    if value in source_schema.names:
                        columns.append(ColumnSpec(name, "column", value))
                    else:
                        columns.append(ColumnSpec(name, "sql", value))
                else:
                    raise ValueError(
                        f"column {name!r}: select() values must be a column name, a SQL "
                        f"expression or a UDF, got {type(value).__name__}"
                    )
        for c in columns:
            if is_reserved_name(c.name):
                raise ValueError(
                    f"output column name {c.name!r} is reserved (names starting with '__' and Lance's row columns)"
                )
        definition = ViewDefinition(
            source=self._table.name,
            columns=tuple(columns),
            filter=self._filter,
            shuffle=self._shuffle,
            seed=self._seed,
            limit=self._limit,
        )
        output_schema(definition, ds)  # raises ValueError on bad SQL / columns
        return definition

    def to_arrow(self) -> pa.Table:
        """Evaluate the query in this process (no Spark) and return the rows."""
        from .tasks import compute_rows

        definition = self.to_definition()
        ds = self._table._dataset()
        rows = compute_rows(ds, definition, output_schema(definition, ds), filter_sql=definition.filter)
        return rows.select([n for n in rows.column_names if not is_marker(n)])

    def __repr__(self) -> str:
        return (
            f"Query(table={self._table.name!r}, where={self._filter!r}, "
            f"select={[n for n, _ in self._select] if self._select else '*'}, "
            f"shuffle={self._seed if self._shuffle else None}, limit={self._limit})"
        )


def output_schema(definition: ViewDefinition, ds: lance.LanceDataset) -> pa.Schema:
    """The view's Arrow schema; validates filter and SQL against the source."""
    projection = definition.projection
    try:
        projected = check_sql(ds, filter=definition.filter, columns=projection)
    except (ValueError, OSError) as exc:
        raise ValueError(f"invalid view query over {definition.source!r}: {short_error(exc)}") from exc
    fields = [
        pa.field(SOURCE_ROW_ID, pa.int64(), nullable=False),
        pa.field(SOURCE_ROW_VERSION, pa.int64(), nullable=False),
    ]
    for c in definition.columns:
        if c.kind == "udf":
            assert c.udf is not None
            fields.append(pa.field(c.name, udf_column_type(c), nullable=True))
        else:
            f = projected.field(c.name)
            fields.append(pa.field(c.name, f.type, nullable=True))
    for c in definition.columns:
        if c.kind == "udf":
            fields.append(pa.field(computed_marker(c.name), pa.string(), nullable=True))
    # Computed columns of the source this view reads: keep a copy of their markers,
    # so a backfill of the source (which moves no row versions) is seen as a change.
    for name in definition.reads(computed_column_names(ds.schema), ds.schema):
        fields.append(pa.field(source_marker(name), pa.string(), nullable=True))
    return pa.schema(fields, metadata={VIEW_METADATA_KEY: definition.encode()})


def udf_column_type(c: ColumnSpec) -> pa.DataType:
    """The Arrow type of a UDF column (a struct field for multi-column UDFs)."""
    assert c.udf is not None
    if c.field is not None:
        return c.udf.data_type.field(c.field).type
    return c.udf.data_type


def check_sql(ds: lance.LanceDataset, *, filter: str | None = None, columns: dict[str, str] | None = None) -> pa.Schema:
    """Plan (without running) a scan so bad SQL fails here; return its schema."""
    if columns:  # a real column keeps Lance from refusing literal-only projections
        columns = {**columns, Alias.PROBE: _quote_ident(ds.schema.names[0])}
    scanner = ds.scanner(columns=columns or None, filter=filter)
    scanner.explain_plan()
    return scanner.projected_schema


_RUST_LOCATION = re.compile(r",?\s*(?:/[^\s,]*)?/?[\w./-]*\.rs:\d+:\d+")


def short_error(exc: Exception | str) -> str:
    """Lance's error message without the Rust source locations."""
    msg = str(exc).replace("Invalid user input: ", "")
    return _RUST_LOCATION.sub("", msg).strip()

