"""The stored, serialisable definition of a materialized view (column specs,
filter, shuffle, limit) and the checks that validate it against a source
schema: the model layer. The query builder that produces it lives in
:mod:`mv_assets.query`.
"""

import datetime as _dt
import decimal
import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import lance
import pyarrow as pa

from mv_assets.model.blobs import BLOB_METADATA, BYTES, blob_sources
from mv_assets.model.chunker import from_spec as function_from_spec
from mv_assets.model.names import (
    COMPUTED_PREFIX,
    LANCE_ROW_COLUMNS,
    SOURCE_MARKER_PREFIX,
    SOURCE_ROW_ID,
    SOURCE_ROW_VERSION,
    VIEW_KEY_COLUMNS,
    Alias,
    ColumnKind,
    computed_marker,
    is_internal_column,
    is_marker,
    is_reserved_name,
    source_marker,
)
from mv_assets.model.sql_names import columns_read
from mv_assets.model.udf import UDF, field_metadata_of

__all__ = [
    "ColumnSpec", "ViewDefinition", "SOURCE_ROW_ID", "SOURCE_ROW_VERSION", "VIEW_METADATA_KEY",
    "computed_marker", "source_marker", "foreign_columns", "sql_literals", "is_marker", "is_reserved_name", "output_schema", "check_sql", "short_error",
    "read_field_ids", "READ_FIELDS_METADATA_KEY",
    "sql_literal", "tracked_source_columns", "computed_column_names", "definition_reads", "column_reads", "shape_fingerprint",
    "udf_column_type", "udf_field", "quote_ident", "COLUMNS_METADATA_KEY", "stored_columns", "encode_columns",
]


def sql_literal(value: Any) -> str:
    """Render a Python value as a SQL literal for Lance/DataFusion.

    >>> sql_literal("it's"), sql_literal(None), sql_literal(True), sql_literal(2.5)
    ("'it''s'", 'NULL', 'true', '2.5')
    >>> sql_literal(-2**63)  # (-9223372036854775808 reads as minus a number past int64: a float)
    '(-9223372036854775807 - 1)'
    >>> import numpy as np
    >>> sql_literal(np.float64(2.5)), sql_literal(np.int64(7)), sql_literal(np.array([1.0, 2.0], np.float32))
    ('2.5', '7', '[1.0, 2.0]')
    >>> sql_literal({"a": 5, "it's": [True]})  # a struct, as lancedb writes it
    "named_struct('a', 5, 'it''s', [true])"
    """
    if value is None:
        return "NULL"
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):  # a NumPy scalar or array: as Python's
        return sql_literal(value.tolist())
    if isinstance(value, pa.Scalar):
        return sql_literal(value.as_py())
    if isinstance(value, list | tuple):  # a list (a vector): DataFusion's array literal, cast to the column's type
        return "[" + ", ".join(sql_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "named_struct(" + ", ".join(f"{sql_literal(str(k))}, {sql_literal(v)}" for k, v in value.items()) + ")"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value == -(2**63):
        return "(-9223372036854775807 - 1)"
    if isinstance(value, (int, decimal.Decimal)):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return f"CAST('{value}' AS DOUBLE)"
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bytes):
        return "X'" + value.hex() + "'"
    if isinstance(value, _dt.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, _dt.date):
        return f"DATE '{value.isoformat()}'"
    raise ValueError(f"cannot use {type(value).__name__} value {value!r} as a SQL literal; use values_sql")


_TIME_UNITS = {"s": "Second", "ms": "Millisecond", "us": "Microsecond", "ns": "Nanosecond"}


def sql_literals(values: "pa.Array | pa.ChunkedArray") -> list[str]:
    """SQL literals of an Arrow array's values (``NULL`` for a null), typed as
    the column holding them: a timestamp as its integer cast to its own type
    (a ``TIMESTAMP '...'`` literal is microseconds without a zone to Lance:
    nanoseconds and zoned timestamps matched nothing; times and durations
    have no literal at all), a decimal cast to its own type (a plain ``1.50``
    is a float to Lance, which refuses to compare it); other values as
    :func:`sql_literal` writes them.

    >>> import decimal
    >>> print(*sql_literals(pa.array([1, None], pa.timestamp("ns", tz="UTC"))))
    arrow_cast(1, 'Timestamp(Nanosecond, Some("UTC"))') NULL
    >>> print(*sql_literals(pa.array([decimal.Decimal("1.50")], pa.decimal256(40, 2))))
    arrow_cast('1.50', 'Decimal256(40, 2)')
    """
    t = values.type
    kind = _arrow_cast_type(t)
    if kind is not None:  # (its integer storage cast to its own type)
        raw = values.cast(pa.int32() if pa.types.is_time32(t) else pa.int64()).to_pylist()
        return ["NULL" if v is None else f"arrow_cast({int(v)}, '{kind}')" for v in raw]
    if pa.types.is_decimal(t):  # (DECIMAL(p, s) is a Decimal128 to Lance: a precision above 38 is refused)
        width = 256 if pa.types.is_decimal256(t) else 128
        return ["NULL" if v is None else f"arrow_cast('{v}', 'Decimal{width}({t.precision}, {t.scale})')"  # pyright: ignore[reportAttributeAccessIssue]
                for v in values.to_pylist()]
    return [sql_literal(v) for v in values.to_pylist()]


def _arrow_cast_type(t: pa.DataType) -> str | None:
    """The type ``arrow_cast`` names for a temporal type stored as an integer
    (timestamp, time, duration), None for others."""
    if pa.types.is_timestamp(t):
        zone = "None" if t.tz is None else f'Some("{t.tz}")'  # pyright: ignore[reportAttributeAccessIssue]
        return f"Timestamp({_TIME_UNITS[t.unit]}, {zone})"  # pyright: ignore[reportAttributeAccessIssue]
    if pa.types.is_time32(t) or pa.types.is_time64(t):
        return f"Time{t.bit_width}({_TIME_UNITS[t.unit]})"  # pyright: ignore[reportAttributeAccessIssue]
    if pa.types.is_duration(t):
        return f"Duration({_TIME_UNITS[t.unit]})"  # pyright: ignore[reportAttributeAccessIssue]
    return None


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
    # A view that is not one row per source row: the JSON spec of its chunker or
    # UDTF (model.chunker); ``columns`` are then the parent columns each child
    # inherits (a chunker), none (a UDTF: the view holds its output only).
    function: str | None = None

    def __post_init__(self) -> None:
        # A filter ending in a line comment (``x > 5 -- big only``) ends in a new line: the
        # refreshes paste it into ``(...) AND (...)``, where the comment swallowed the ``)``.
        if self.filter is not None and "--" in self.filter and not self.filter.endswith("\n"):
            object.__setattr__(self, "filter", self.filter + "\n")

    @property
    def kind(self) -> str:
        """``"query"`` (one view row per passing source row) or the function's
        kind (``"chunker"``: zero or more rows per passing source row;
        ``"udtf"``: zero or more rows per partition of the passing source rows)."""
        return self._function_spec["kind"] if self.function else "query"

    @property
    def _function_spec(self) -> dict:
        """The function's stored spec (parsed once per definition object)."""
        cached = self.__dict__.get("_spec")
        if cached is None:
            cached = json.loads(self.function or "{}")
            object.__setattr__(self, "_spec", cached)
        return cached

    @property
    def table_function(self) -> Any:
        """The view's chunker or UDTF (unpickled once per definition object)."""
        if not self.function:
            raise ValueError("a query view has no table function")
        cached = self.__dict__.get("_table_function")
        if cached is None:
            cached = function_from_spec(self._function_spec)
            object.__setattr__(self, "_table_function", cached)
        return cached

    @property
    def sources(self) -> list[str]:
        """The tables (or views) the view reads, its source first: one, or a
        join view's every table (its spec's ``sources``)."""
        if not self.function:
            return [self.source]
        # (a table joined with itself is read once: one name per table)
        return list(dict.fromkeys(self._function_spec.get("sources") or [self.source]))

    @property
    def udf_columns(self) -> list[ColumnSpec]:
        return [c for c in self.columns if c.kind == "udf"]

    @property
    def projection(self) -> dict[str, str]:
        """Non-UDF output columns as ``{name: SQL expression}`` for Lance's scanner."""
        out = {}
        for c in self.columns:
            if c.kind == "column":
                out[c.name] = quote_ident(c.expr or c.name)
            elif c.kind == "sql":
                out[c.name] = c.expr or ""
        return out

    def reads(self, columns: list[str], source_schema: pa.Schema) -> list[str]:
        """Which of ``columns`` (of the source) this view reads, conservatively:
        selected, fed to a UDF, or named in a SQL expression or the filter.
        Remembered per definition and columns (a refresh asks twice; each
        answer parses the view's SQL)."""
        memo = self.__dict__.setdefault("_reads_memo", {})
        key = (tuple(columns), tuple(source_schema.names))
        known = memo.get(key)
        if known is None:
            if len(memo) > 64:
                memo.clear()
            known = memo[key] = self._reads_of(columns, source_schema)
        return list(known)

    def _reads_of(self, columns: list[str], source_schema: pa.Schema) -> list[str]:
        light = {
            "filter": self.filter,
            "function": json.loads(self.function) if self.function else None,
            "columns": [
                {"name": c.name, "kind": c.kind, "expr": c.expr, "udf": {"input_columns": c.udf.input_columns if c.udf else None}}
                for c in self.columns
            ],
        }
        return definition_reads(light, columns, source_schema.names)

    def computed_reads(self, source_schema: pa.Schema) -> list[str]:
        """The computed columns of the source this view reads: the one answer to
        "does a backfill, ``alter_columns`` or UDF code change of the source
        matter to this view?" that the planner, the status, the refresh
        policies (and so the Dagster sensor) and the Dagster lineage share,
        whatever the view's kind (a query view also keeps copies of their
        markers; aggregate, chunk and table-function views keep none)."""
        return self.reads(computed_column_names(source_schema), source_schema)

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
        out = {
            "format": FORMAT_VERSION,
            "source": self.source,
            "columns": [c.to_json() for c in self.columns],
            "filter": self.filter,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "limit": self.limit,
        }
        if self.function:
            out["function"] = json.loads(self.function)
        return out

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
            function=json.dumps(d["function"]) if d.get("function") else None,
        )

    def shape_fingerprint(self) -> str:
        """Hash of what decides which rows the view holds and its original columns.

        UDF columns and columns added later are left out: a changed UDF makes
        its column stale row by row (see ``computed_marker``), it does not
        make the view recompute everything. Computed once per definition (a
        refresh asks twice).
        """
        known = self.__dict__.get("_shape_fingerprint")
        if known is None:
            known = self.__dict__["_shape_fingerprint"] = shape_fingerprint(self.to_json())
        return known

    def fingerprint(self) -> str:
        """Hash of the definition; UDFs count by their code fingerprint."""
        d = self.to_json()
        for c in d["columns"]:
            if "udf" in c:
                c["udf"] = {k: v for k, v in c["udf"].items() if k != "pickle"}
        if "function" in d:
            d["function"] = _function_identity(d["function"])
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def encode(self) -> bytes:
        """The definition as stored and as tasks receive it. Made once per
        definition: pickling UDFs defined in this process by value costs ~4 ms
        (a 10-row refresh encoded it every time)."""
        known = self.__dict__.get("_encoded")
        if known is None:
            known = self.__dict__["_encoded"] = json.dumps(self.to_json()).encode()
        return known

    @staticmethod
    def decode(raw: bytes | str) -> "ViewDefinition":
        return ViewDefinition.from_json(json.loads(raw))


def shape_fingerprint(definition: dict) -> str:
    """:meth:`ViewDefinition.shape_fingerprint` of a stored definition (its JSON)."""
    d = {**definition, "columns": [c for c in definition["columns"] if c["kind"] != "udf" and not c.get("added")]}
    if d.get("function"):  # its code decides the rows: a new chunker rebuilds the view
        d["function"] = _function_identity(d["function"])
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _function_identity(spec: dict) -> dict:
    """What of a function's spec decides the view's rows: a chunker's or UDTF's
    code fingerprint and schema (not its pickle or where it was defined); a
    spec holding no code (a join's sources, keys and names, an aggregate's
    keys and functions) whole."""
    if "pickle" not in spec:
        return spec
    return {k: spec.get(k) for k in ("kind", "fingerprint", "input_columns", "output_schema")}


def definition_reads(definition: dict, columns: list[str], source_names: list[str]) -> list[str]:
    """:meth:`ViewDefinition.reads` on a stored definition (its JSON), without
    unpickling any UDF: what the Dagster wiring uses for lineage. A join
    view's names were resolved once, by table: the first table's columns it
    names (qualified or not) and its keys (:func:`join_reads`)."""
    if "refs" in (definition.get("function") or {}):
        mine = set(join_reads(definition["function"], 0))
        return [name for name in columns if name in mine]
    cols = definition.get("columns", [])
    texts = [definition.get("filter") or ""] + [c.get("expr") or "" for c in cols if c["kind"] == "sql"]
    direct = {c.get("expr") or c["name"] for c in cols if c["kind"] == "column"}
    for c in cols:
        if c["kind"] == "udf":
            direct.update(c["udf"].get("input_columns") or source_names)
    if definition.get("function"):
        direct.update(definition["function"].get("input_columns") or [])
    named = {n for t in texts for n in columns_read(t, columns)}  # (sqlglot: model.sql_names)
    return [name for name in columns if name in direct or name in named]


def column_reads(spec: "ColumnSpec", columns: list[str], source_names: list[str]) -> list[str]:
    """Which of ``columns`` the computed column ``spec`` reads (its UDF's
    inputs, every column for a UDF taking the whole row, the names its SQL
    uses), as :func:`definition_reads` answers for a view of that one column."""
    light = {"columns": [{"name": spec.name, "kind": spec.kind, "expr": spec.expr,
                          "udf": {"input_columns": spec.udf.input_columns if spec.udf is not None else None}}]}
    return definition_reads(light, columns, source_names)


def join_reads(spec: dict, i: int) -> list[str]:
    """The columns of source ``i`` a join's stored spec (model.join_view) reads:
    its keys and every name it uses, in a stable order.

    >>> join_reads({"steps": [{"index": 1, "left": [[0, "vid"]], "right": ["id"]}],
    ...             "refs": {"videos.title": [1, "title"], "dur": [0, "dur"]}}, 0)
    ['vid', 'dur']
    """
    out: list[str] = []
    for step in spec["steps"]:
        if step["index"] == i:
            out.extend(step["right"])
        out.extend(c for s, c in step["left"] if s == i)
    out.extend(c for s, c in spec.get("refs", {}).values() if s == i)
    return list(dict.fromkeys(out))


def quote_ident(name: str) -> str:
    """``name`` as a SQL identifier: bare when it is a plain lowercase name
    that is no SQL keyword, else quoted (a column named ``null``, ``true`` or
    ``select`` read bare is a literal, or SQL that does not parse).

    >>> quote_ident("x"), quote_ident("null"), quote_ident("Order"), quote_ident("a`b")
    ('x', '`null`', '`Order`', '`a``b`')
    """
    if name.isidentifier() and name.lower() == name and name.upper() not in _sql_keywords():
        return name
    return "`" + name.replace("`", "``") + "`"


@functools.cache
def _sql_keywords() -> frozenset[str]:
    """sqlglot's SQL keywords, each word of those of several (quoting one more name is harmless)."""
    from sqlglot.tokens import Tokenizer

    return frozenset(w for k in Tokenizer.KEYWORDS for w in k.split())


READ_FIELDS_METADATA_KEY = "mv_assets.read_fields"  # the source columns a view read when created, by field id


def foreign_columns(definition: ViewDefinition, names: list[str]) -> str | None:
    """Of a query view (one row per source row, no function), columns of its
    own dataset (``names``) that its definition does not have, or that it
    has and the dataset lacks: another tool's ``add_columns`` /
    ``drop_columns`` / ``merge`` on the view (None: none). Its refreshes write
    the definition's columns: an extra one failed every refresh with a
    KeyError, a dropped one was silently no longer written."""
    if definition.function:
        return None
    mine = {c.name for c in definition.columns}
    extra = [n for n in names if n not in mine and not is_internal_column(n) and not n.startswith("_")]
    gone = [n for n in mine if n not in names]
    if not extra and not gone:
        return None
    parts = ([f"added {', '.join(map(repr, extra))}"] if extra else []) + (
        [f"dropped {', '.join(map(repr, gone))}"] if gone else [])
    return f"another tool changed the columns of the view's dataset ({'; '.join(parts)})"


def read_field_ids(definition: ViewDefinition, ds: lance.LanceDataset) -> dict[str, int]:
    """Lance field ids of the source columns the view reads (those present in ``ds``).
    A column dropped and added again gets a new id."""
    ids = {f.name(): f.id() for f in ds.lance_schema.fields()}
    return {n: ids[n] for n in definition.reads(ds.schema.names, ds.schema) if n in ids}


def output_schema(definition: ViewDefinition, ds: lance.LanceDataset) -> pa.Schema:
    """The view's Arrow schema; validates filter and SQL against the source."""
    projection = definition.projection
    try:
        projected = check_sql(ds, filter=definition.filter, columns=projection)
    except (ValueError, OSError) as exc:
        raise ValueError(f"invalid query over {definition.source!r}: {short_error(exc)}") from exc
    fields = [
        pa.field(SOURCE_ROW_ID, pa.int64(), nullable=False),
        pa.field(SOURCE_ROW_VERSION, pa.int64(), nullable=False),
    ]
    for c in definition.columns:
        if c.kind == "udf":
            fields.append(udf_field(c))
        else:
            f = projected.field(c.name)
            fields.append(pa.field(c.name, f.type, nullable=True, metadata=f.metadata))  # (a blob's marking)
    for c in definition.columns:
        if c.kind == "udf":
            fields.append(pa.field(computed_marker(c.name), pa.string(), nullable=True))
    # Computed columns of the source this view reads: keep a copy of their markers,
    # so a backfill of the source (which moves no row versions) is seen as a change.
    for name in definition.reads(computed_column_names(ds.schema), ds.schema):
        fields.append(pa.field(source_marker(name), pa.string(), nullable=True))
    return pa.schema(fields, metadata={
        VIEW_METADATA_KEY: definition.encode(),
        READ_FIELDS_METADATA_KEY: json.dumps(read_field_ids(definition, ds)),
    })


def view_schema(definition: ViewDefinition, datasets: list[lance.LanceDataset]) -> pa.Schema:
    """A query view's schema over its source (model.kinds: every kind's schema by this name)."""
    return output_schema(definition, datasets[0])


def udf_column_type(c: ColumnSpec) -> pa.DataType:
    """The Arrow type of a UDF column (a struct field for multi-column UDFs)."""
    assert c.udf is not None
    if c.field is not None:
        return c.udf.data_type.field(c.field).type
    return c.udf.data_type


def udf_field(c: ColumnSpec) -> pa.Field:
    """The Arrow field of a UDF column: nullable, with the UDF's ``field_metadata``."""
    return pa.field(c.name, udf_column_type(c), nullable=True, metadata=field_metadata_of(c.the_udf))


def check_sql(ds: lance.LanceDataset, *, filter: str | None = None, columns: dict[str, str] | None = None) -> pa.Schema:
    """Plan (without running) a scan so bad SQL fails here; return its schema
    (a blob column as its bytes; a column copying one marked for blob encoding,
    so the copy is stored as a blob too: model.blobs)."""
    if columns:  # a real column keeps Lance from refusing literal-only projections
        columns = {**columns, Alias.PROBE: quote_ident(ds.schema.names[0])}
    scanner = ds.scanner(columns=columns or None, filter=filter, blob_handling=BYTES)
    scanner.explain_plan()
    schema = scanner.projected_schema
    copies = blob_sources(columns, ds.schema)
    if copies:
        schema = pa.schema([f.with_metadata({**(f.metadata or {}), **BLOB_METADATA}) if f.name in copies else f
                            for f in schema], schema.metadata)
    return schema


_RUST_LOCATION = re.compile(r",?\s*(?:/[^\s,]*)?/?[\w./-]*\.rs:\d+:\d+")


def short_error(exc: Exception | str) -> str:
    """Lance's error message without the Rust source locations."""
    msg = str(exc).replace("Invalid user input: ", "")
    return _RUST_LOCATION.sub("", msg).strip()


COLUMNS_METADATA_KEY = "mv_assets.columns"


def stored_columns(schema: pa.Schema) -> list[ColumnSpec]:
    """A table's computed columns (those whose data column exists)."""
    raw = (schema.metadata or {}).get(COLUMNS_METADATA_KEY.encode())
    if not raw:
        return []
    return [c for c in (ColumnSpec.from_json(d) for d in json.loads(raw)) if c.name in schema.names]


def encode_columns(specs: list[ColumnSpec]) -> str:
    return json.dumps([c.to_json() for c in specs])
