"""Computed columns added after the fact: parsing and validating
``add_columns`` transforms, storing column definitions, ``alter_columns``
and ``load_columns``.

A table's computed columns are stored as JSON in its schema metadata
(``mv_assets.columns``); a view's are part of its definition (added columns
are flagged ``added`` so they do not count as a change of what the view
holds). Every computed column has a hidden marker column (see
:func:`~mv_assets.names.computed_marker`).
"""

import dataclasses
import os
import time
import uuid
import warnings
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from mv_assets.execution.spark import InlineRunner
from mv_assets.model.blobs import is_blob_field
from mv_assets.model.definition import (
    COLUMNS_METADATA_KEY,
    SOURCE_MARKER_PREFIX,
    VIEW_METADATA_KEY,
    ColumnSpec,
    ViewDefinition,
    check_sql,
    computed_column_names,
    computed_marker,
    encode_columns,
    is_marker,
    short_error,
    stored_columns,
    udf_column_type,
    udf_field,
)
from mv_assets.model.errors import SqlRowsError
from mv_assets.model.kinds import kind_of
from mv_assets.model.markers import marker_value
from mv_assets.model.names import LANCE_ROW_COLUMNS, check_column_name
from mv_assets.model.planning import column_ids as _ids
from mv_assets.model.planning import positions
from mv_assets.model.udf import UDF, UnpackedUDF, nested_type
from mv_assets.ops.backfill import (
    _driver_writer,
    backfill_column,
    commit_column_values,
    fill_sql_rows,
    rows_failing,
    sql_failure_text,
)
from mv_assets.storage import objects
from mv_assets.storage.refs import Ref, TableRef, ViewRef
from mv_assets.storage.row_ids import require_current_format

__all__ = ["parse_transforms", "add_columns", "alter_columns", "load_columns", "update_rows"]

def _single(name: str, u: UDF, input_schema: pa.Schema) -> ColumnSpec:
    if u.output_fields is not None:
        raise ValueError(
            f"column {name!r}: UDF {u.name!r} returns several columns (Columns[...]); pass it directly, "
            "add_columns(udf), or wrapped, add_columns(UnpackedUDF(udf, prefix=...)), not inside a dict"
        )
    u = u.bound_to(input_schema, struct_paths=True)
    u.validate_inputs(input_schema, name)
    return ColumnSpec(name, "udf", None, u, None, True)


def parse_transforms(transforms: Any, input_schema: pa.Schema, input_ds: lance.LanceDataset) -> list[ColumnSpec]:
    """Turn every accepted ``add_columns`` form into column specs, validating
    inputs and types against ``input_schema``. Raises ValueError."""
    specs: list[ColumnSpec] = []
    if isinstance(transforms, UnpackedUDF):
        u = transforms.udf.bound_to(input_schema, struct_paths=True)
        u.validate_inputs(input_schema, u.name)
        specs = [ColumnSpec(col, "udf", None, u, f, True) for col, f in transforms.columns().items()]
    elif isinstance(transforms, UDF):
        if transforms.output_fields is None:
            raise ValueError(
                f"UDF {transforms.name!r} returns one column: name it, add_columns({{'name': udf}}); "
                "only a Columns[...] UDF is passed directly"
            )
        transforms = transforms.bound_to(input_schema, struct_paths=True)
        transforms.validate_inputs(input_schema, transforms.name)
        specs = [ColumnSpec(f, "udf", None, transforms, f, True) for f in transforms.output_fields]
    elif isinstance(transforms, dict):
        if not transforms:
            raise ValueError("add_columns() needs at least one column")
        for name, value in transforms.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"column names must be non-empty strings, got {name!r}")
            if isinstance(value, str):
                if not value.strip():
                    raise ValueError(f"column {name!r}: empty SQL expression")
                try:
                    check_sql(input_ds, columns={name: value})
                except (ValueError, OSError) as exc:
                    raise ValueError(f"column {name!r}: invalid SQL expression {value!r}: {short_error(exc)}") from exc
                specs.append(ColumnSpec(name, "sql", value, None, None, True))
            elif isinstance(value, UDF):
                specs.append(_single(name, value, input_schema))
            elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], UDF):
                cols = value[1]
                if not isinstance(cols, (list, tuple)) or not all(isinstance(c, str) for c in cols):
                    raise ValueError(f"column {name!r}: (udf, [input columns]) takes a list of column names")
                if value[0].kind == "batch":
                    raise ValueError(f"column {name!r}: a RecordBatch UDF reads every column; no input list")
                if len(cols) != len(value[0].param_names):
                    raise ValueError(
                        f"column {name!r}: UDF {value[0].name!r} has {len(value[0].param_names)} parameters "
                        f"{value[0].param_names} but {len(cols)} input columns {list(cols)} were given"
                    )
                specs.append(_single(name, value[0].with_inputs(list(cols)), input_schema))
            else:
                raise ValueError(
                    f"column {name!r}: expected a SQL expression, a UDF or (udf, [columns]), got {type(value).__name__}"
                )
    else:
        raise ValueError(
            "add_columns() takes {name: SQL | udf | (udf, [columns])}, a Columns[...] UDF or an UnpackedUDF, "
            f"got {type(transforms).__name__}"
        )
    seen: set[str] = set()
    for c in specs:
        if c.name in seen:
            raise ValueError(f"duplicate column name {c.name!r}")
        seen.add(c.name)
        check_column_name(c.name)
        if c.kind == "udf" and is_blob_field(udf_field(c)):
            raise ValueError(
                f"column {c.name!r}: UDF {c.the_udf.name!r} returns a blob column (field_metadata "
                "lance-encoding:blob), which cannot be added to rows already written: Lance stores blob data "
                "only with whole rows (pylance's own add_columns fails on it). Compute it in a materialized "
                "view's select(), whose rows are written whole, or leave out the blob field_metadata to keep "
                "the bytes in the column itself")
    return specs


def _column_type(spec: ColumnSpec, input_ds: lance.LanceDataset) -> pa.DataType:
    if spec.kind == "sql":
        return check_sql(input_ds, columns={spec.name: spec.expr or ""}).field(spec.name).type
    return udf_column_type(spec)


def add_columns(table: Ref, transforms: Any) -> list[str]:
    """Validate, then add the columns (all NULL, markers NULL) and store their
    definitions. SQL columns are filled right away; UDF columns by backfill."""
    is_view = isinstance(table, ViewRef)
    kind = kind_of(table.definition) if isinstance(table, ViewRef) else None
    if kind is not None and kind.no_added_columns:  # rows that are no one source row's (model.kinds)
        raise ValueError(f"{table.name!r} is {kind.a_noun}: add_columns() is not supported on it "
                         f"({kind.no_added_columns}), or compute the column in a view over this one")
    input_ds = table.input_dataset()
    specs = parse_transforms(transforms, input_ds.schema, input_ds)
    ds = table.dataset()
    # (Lance cannot add the empty column to v1 files: "Cannot add all-null columns to legacy dataset version")
    require_current_format(ds, table.name, "a computed column")
    clash = [c.name for c in specs if c.name in ds.schema.names or computed_marker(c.name) in ds.schema.names]
    if clash:
        raise ValueError(f"columns {clash} already exist in {table.name!r}")
    # Lance's SQL reads unquoted names whatever their case: an expression naming the existing
    # column would read the new one (itself, empty), and every later reader could not tell them apart
    folded = {n.lower(): n for n in ds.schema.names}
    cased = [(c.name, folded[c.name.lower()]) for c in specs if c.name.lower() in folded]
    if cased:
        raise ValueError("column names differing from existing ones only by case are refused (Lance's SQL reads "
                         "unquoted names case-insensitively): " + ", ".join(f"{n!r} ({o!r} exists)" for n, o in cased))
    if is_view and any(c.kind == "udf" and c.udf is not None and c.udf.kind == "batch" for c in specs):
        raise ValueError("a RecordBatch UDF cannot be added to a view; name its input columns")
    if is_view:
        # A view follows backfills of its source's computed columns only for the ones
        # it read when created (it keeps copies of their markers per row).
        tracked = {n[len(SOURCE_MARKER_PREFIX):] for n in ds.schema.names if n.startswith(SOURCE_MARKER_PREFIX)}
        assert isinstance(table, ViewRef)
        probe = ViewDefinition(table.definition.source, tuple(specs))
        untracked = sorted(set(probe.reads(computed_column_names(input_ds.schema), input_ds.schema)) - tracked)
        if untracked:
            raise ValueError(
                f"the new columns read computed columns {untracked} of {table.definition.source!r} that view "
                f"{table.name!r} does not select; recreate the view with them selected so that their backfills "
                "reach it"
            )
        _check_view_sql(table, specs, input_ds)
    fields = []
    for c in specs:
        fields.append(udf_field(c) if c.kind == "udf" else pa.field(c.name, _column_type(c, input_ds), nullable=True))
        fields.append(pa.field(computed_marker(c.name), pa.string(), nullable=True))
    with table.lock():
        ds = table.dataset()
        md = {k.decode(): v.decode() for k, v in (ds.schema.metadata or {}).items()}
        ds.add_columns(fields)
        ds = table.dataset()
        if is_view:
            definition = ViewDefinition.decode(md[VIEW_METADATA_KEY])
            new = dataclasses.replace(definition, columns=definition.columns + tuple(specs))
            ds.update_schema_metadata({VIEW_METADATA_KEY: new.encode().decode()})
        else:
            existing = stored_columns(ds.schema)
            ds.update_schema_metadata({COLUMNS_METADATA_KEY: encode_columns(existing + specs)})
    filled = _reopened(table)
    for c in specs:
        if c.kind != "sql":
            continue
        try:
            backfill_column(filled, c.name, runner=_inline())
        except SqlRowsError as exc:
            if is_view:  # (its source changed since the check above)
                raise
            # the column is added (committed): rows its expression fails on stay stale, the others are filled
            warnings.warn(sql_failure_text(table.name, c, exc) + " The column was added.", stacklevel=3)
            fill_sql_rows(filled, c, exc.rows)
    return [c.name for c in specs]


def _check_view_sql(view: ViewRef, specs: list[ColumnSpec], input_ds: lance.LanceDataset) -> None:
    """Refuse, before anything is written, SQL columns added to a view whose
    expression fails on some of its source rows (a cast that does not hold
    for their values): the view's refreshes evaluate it on them (a full one
    would fail), where a table leaves such rows stale. One streamed pass over
    the rows the view selects."""
    for c in specs:
        if c.kind != "sql" or c.expr is None:
            continue
        try:
            for _ in input_ds.scanner(columns={"__v": c.expr}, filter=view.definition.filter).to_batches():
                pass
        except (ValueError, OSError, pa.ArrowException) as exc:
            bad = rows_failing(input_ds, c.expr, view.definition.filter)
            if not bad:
                raise
            raise SqlRowsError(
                f"SQL column {c.name!r} of view {view.name!r} ({c.expr}) fails on {len(bad)} row(s) of "
                f"{view.definition.source!r} (row ids {bad[:10]}{' ...' if len(bad) > 10 else ''}: "
                f"{short_error(exc)}); nothing was added. Change their values or the expression.",
                bad, short_error(exc)) from exc


def _reopened(table: Ref) -> Ref:
    """The reference again, with a view's definition as stored now."""
    if isinstance(table, ViewRef):
        raw = (table.dataset().schema.metadata or {})[VIEW_METADATA_KEY.encode()]
        return ViewRef(table.name, table.uri, ViewDefinition.decode(raw), table.source_uri, table.layout)
    return table


def _inline():
    return InlineRunner()


def alter_columns(table: Ref, alterations: tuple[dict, ...]) -> None:
    """Swap the UDF of computed columns; their rows become stale (marker
    fingerprint differs) until a backfill recomputes them."""
    if not alterations:
        raise ValueError("alter_columns() needs at least one {'path': column, 'udf': new_udf}")
    input_schema = table.input_dataset().schema
    current = {c.name: c for c in table.computed_columns()}
    replaced: dict[str, ColumnSpec] = {}
    for alt in alterations:
        if not isinstance(alt, dict) or set(alt) - {"path", "udf"} or "path" not in alt or "udf" not in alt:
            raise ValueError(f"an alteration is {{'path': column, 'udf': new_udf}}, got {alt!r}")
        name, new = alt["path"], alt["udf"]
        if name not in current:
            raise ValueError(f"{name!r} is not a computed column of {table.name!r} (computed: {sorted(current)})")
        old = current[name]
        if not isinstance(new, UDF):
            raise ValueError(f"alter_columns: 'udf' for {name!r} must be a UDF, got {type(new).__name__}")
        if old.kind != "udf" or old.field is not None:
            raise ValueError(f"alter_columns: {name!r} is not a single-output UDF column")
        if new.kind == "batch":
            keep = old.the_udf.kind == "batch" and old.the_udf.input_columns
            new = new.bound_to(list(old.the_udf.input_columns) if keep else input_schema)
        elif not all(nested_type(input_schema, c) is not None for c in new.input_paths):
            if len(new.param_names) == len(old.the_udf.input_paths):
                new = new.with_inputs(list(old.the_udf.input_paths))  # keep the column's input mapping
        new = new.bound_to(input_schema, struct_paths=True)
        if new.output_fields is not None or new.data_type != udf_column_type(old):
            raise ValueError(f"the new UDF for {name!r} returns {new.data_type}; the column holds {udf_column_type(old)}")
        new.validate_inputs(input_schema, name)
        replaced[name] = ColumnSpec(name, "udf", None, new, None, old.added)
    with table.lock():
        ds = table.dataset()
        if isinstance(table, ViewRef):
            d = table.definition
            cols = tuple(replaced.get(c.name, c) for c in d.columns)
            new_def = dataclasses.replace(d, columns=cols)
            ds.update_schema_metadata({VIEW_METADATA_KEY: new_def.encode().decode()})
        else:
            specs = [replaced.get(c.name, c) for c in stored_columns(ds.schema)]
            ds.update_schema_metadata({COLUMNS_METADATA_KEY: encode_columns(specs)})


# -- load_columns -----------------------------------------------------------

_FORMATS = ("parquet", "lance", "ipc")


def _detect_format(source: str | list[str], source_format: str | None) -> str:
    """The format of ``source`` (its first file when a list): by suffix, a local Lance
    dataset by its ``_versions``; a folder, local or a URI (``s3://bucket/embeddings/``,
    ``file:///data/emb``: a trailing ``/`` or a last segment without a suffix), is one of
    Parquet files, as Geneva takes it. Another suffix (``.csv``) is refused."""
    if source_format is not None:
        if source_format not in _FORMATS:
            raise ValueError(f"source_format must be one of {_FORMATS}, got {source_format!r}")
        return source_format
    first = source[0] if isinstance(source, list) else source
    folder = first.endswith("/")
    first = first.rstrip("/")
    if first.endswith(".lance") or os.path.isdir(os.path.join(first, "_versions")):
        return "lance"
    if first.endswith((".arrow", ".ipc", ".feather", ".arrows")):
        return "ipc"
    if first.endswith((".parquet", ".pq")) or os.path.isdir(first) or folder or "." not in first.rsplit("/", 1)[-1]:
        return "parquet"
    raise ValueError(f"cannot tell the format of {first!r}; pass source_format='parquet' | 'lance' | 'ipc'")


def _source_table(source: Any, source_format: str | None, columns: list[str], catalog: str) -> pa.Table:
    """``columns`` of what load_columns was given: files (a path or URI, or a
    list of them) or data in memory (a pyarrow Table or RecordBatch, a pandas
    DataFrame)."""
    data = source
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    elif type(data).__name__ == "DataFrame" and type(data).__module__.startswith("pandas"):
        frame = data[[c for c in columns if c in data.columns]]
        try:
            data = pa.Table.from_pandas(frame, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            # (a column of mixed Python types has no Arrow type: which one, found only then)
            bad = next((c for c in frame.columns if not _converts(frame[c])), None)
            raise ValueError(f"load_columns: column {bad!r} of the DataFrame cannot be read as one Arrow type "
                             f"({exc})") from exc
    if isinstance(data, pa.Table):
        if source_format is not None:
            raise ValueError(f"load_columns: source_format={source_format!r} is for files; data in memory has none")
        missing = [c for c in columns if c not in data.schema.names]
        if missing:
            raise ValueError(f"load_columns: columns {missing} are not in the source (columns: {data.schema.names})")
        return data.select(columns)
    if not (isinstance(source, str) or (isinstance(source, list) and all(isinstance(u, str) for u in source))):
        raise ValueError("load_columns: the source is a path or URI (Parquet, Lance or Arrow IPC), a list of them, "
                         f"or data in memory (a pyarrow Table or RecordBatch, a pandas DataFrame), got "
                         f"{type(source).__name__}")
    return _read_source(source, _detect_format(source, source_format), columns, catalog)


def _converts(series: Any) -> bool:
    try:
        pa.array(series, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return False
    return True


def _read_source(source: str | list[str], fmt: str, columns: list[str], catalog: str | None = None) -> pa.Table:
    if isinstance(source, list) and not source:
        raise ValueError("load_columns: empty list of source files")
    remote = [u for u in (source if isinstance(source, list) else [source]) if not objects.is_local(u)]
    for u in remote:  # (a source outside the catalog's root, on its store: the catalog's options, credentials too)
        if objects.options_for(u) is None and catalog is not None and objects.options_for(catalog):
            objects.register(u.rstrip("/"), objects.options_for(catalog))
    if fmt != "lance" and remote:
        return _read_remote_files(source if isinstance(source, list) else [source], fmt, columns)
    if fmt == "lance":
        if isinstance(source, list):
            raise ValueError("a Lance source is a single dataset URI, not a list")
        ds = objects.dataset(source)
        missing = [c for c in columns if c not in ds.schema.names]
        if missing:
            raise ValueError(f"load_columns: columns {missing} are not in {source!r} (columns: {ds.schema.names})")
        return ds.to_table(columns=columns)
    dataset = pads.dataset(source, format="ipc" if fmt == "ipc" else "parquet")
    missing = [c for c in columns if c not in dataset.schema.names]
    if missing:
        raise ValueError(f"load_columns: columns {missing} are not in the source (columns: {dataset.schema.names})")
    return dataset.to_table(columns=columns)


def _read_remote_files(sources: list[str], fmt: str, columns: list[str]) -> pa.Table:
    """Parquet or Arrow IPC files on an object store (a folder: the files
    under it), read through the engine's own store client with the catalog's
    options (pyarrow's S3 client knows none of them: it went to AWS)."""
    import io

    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    files: list[str] = []
    for uri in sources:
        if uri.endswith("/") or "." not in uri.rstrip("/").rsplit("/", 1)[-1]:
            files += [objects.join(uri.rstrip("/"), n) for n in objects.listdir(uri) if "." in n]
        else:
            files.append(uri)
    if not files:
        raise ValueError(f"load_columns: no files under {sources!r}")
    parts = []
    for f in files:
        data = objects.get_bytes(f)
        if data is None:
            raise ValueError(f"load_columns: {f!r} does not exist")
        table = (pq.read_table(io.BytesIO(data)) if fmt == "parquet"
                 else ipc.open_file(io.BytesIO(data)).read_all() if not f.endswith(".arrows")
                 else ipc.open_stream(io.BytesIO(data)).read_all())
        missing = [c for c in columns if c not in table.schema.names]
        if missing:
            raise ValueError(f"load_columns: columns {missing} are not in {f!r} (columns: {table.schema.names})")
        parts.append(table.select(columns))
    return pa.concat_tables(parts, promote_options="permissive")


def load_columns(
    table: Ref,
    source: Any,
    pk: str,
    columns: list[str],
    *,
    source_format: str | None = None,
    on_missing: str = "carry",
    job_id: str | None = None,
) -> int | None:
    """Join ``columns`` from an external Parquet / Lance / Arrow IPC dataset
    (or data in memory: :func:`_source_table`) into ``table`` by primary key
    ``pk``; one commit (recorded as job ``job_id``). Returns the new version (None when nothing changed). All
    checks run before anything is written."""
    started_at = time.time()
    if isinstance(table, ViewRef):
        raise ValueError(f"{table.name!r} is a materialized view: load columns into its source table instead")
    if on_missing not in ("carry", "null", "error"):
        raise ValueError(f"on_missing must be 'carry', 'null' or 'error', got {on_missing!r}")
    if isinstance(columns, str) or not columns or not all(isinstance(c, str) for c in columns):
        raise ValueError("load_columns: columns is a non-empty list of column names")
    if pk in columns:
        raise ValueError(f"the primary key {pk!r} cannot be loaded into itself")
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:
        raise ValueError(f"load_columns: columns {twice} are named more than once")
    ds = table.dataset()
    require_current_format(ds, table.name, "load_columns")
    for c in columns:
        if "." in c and c not in ds.schema.names:  # (a new column: Lance's writer refuses the name)
            check_column_name(c, "load_columns: column name")
    if pk not in ds.schema.names:
        raise ValueError(f"primary key {pk!r} is not a column of {table.name!r}")
    computed = {c.name for c in table.computed_columns()}
    bad = [c for c in columns if c in computed or is_marker(c) or c in LANCE_ROW_COLUMNS]
    if bad:
        raise ValueError(f"columns {bad} are computed or reserved; they cannot be loaded")
    src = _source_table(source, source_format, [pk, *columns], table.layout.root)
    if src.column(pk).null_count:
        raise ValueError(f"the source has NULL primary keys in {pk!r}")
    if len(pc.unique(src.column(pk))) != src.num_rows:  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
        raise ValueError(f"the source has duplicate primary keys in {pk!r}")
    blobs = [c for c in columns if is_blob_field(src.schema.field(c))
             or (c in ds.schema.names and is_blob_field(ds.schema.field(c)))]
    if blobs:  # (the column was added as plain large_binary, its blob encoding dropped without a word)
        raise ValueError(f"load_columns: {blobs} are blob columns (lance-encoding:blob), which cannot be written "
                         "into rows already stored: Lance stores blob data only with whole rows. Add the rows with "
                         "their blobs (add, merge_insert), or compute the column in a materialized view")
    new_fields = []
    for c in columns:
        st = src.schema.field(c).type
        if c in ds.schema.names:
            tt = ds.schema.field(c).type
            try:
                src = src.set_column(src.schema.get_field_index(c), c, src.column(c).cast(tt))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(f"column {c!r}: source type {st} does not convert to the table's {tt}") from exc
        else:
            new_fields.append(pa.field(c, st, nullable=True))
    target = ds.to_table(columns=[pk, "_row_last_updated_at_version"], with_row_id=True)
    tk = target.column(pk)
    try:
        sk = src.column(pk).cast(tk.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"primary key types differ: source {src.schema.field(pk).type}, table {tk.type}") from exc
    idx_arr = pc.index_in(tk, value_set=sk)  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
    matched = idx_arr.is_valid().to_numpy(zero_copy_only=False)
    if on_missing == "error" and not matched.all():
        missing = tk.filter(pa.array(~matched)).slice(0, 5).to_pylist()
        raise ValueError(f"{int((~matched).sum())} rows of {table.name!r} have no match in the source (e.g. {pk} = {missing})")
    if on_missing == "carry":
        rows = target.filter(pa.array(matched))
        take = idx_arr.filter(pa.array(matched))
    else:
        rows = target
        take = idx_arr
    values = {c: src.column(c).take(take) for c in columns}
    res = pa.table({c: values[c] for c in columns})
    added = None
    if new_fields:
        # (a commit of its own: Lance adds a column without writing its NULLs; the values follow)
        with table.lock():
            ds.add_columns(new_fields)
            added = ds.version
    if res.num_rows == 0:
        return added  # the new columns, all NULL: no row matched
    version, _, _ = commit_column_values(
        table, list(columns), _ids(rows), _ids(rows, "_row_last_updated_at_version"),
        _driver_writer(res, list(columns)), is_view=False, bump_versions=True, props={
        "job_id": job_id or uuid.uuid4().hex[:12], "started_at": started_at, "load_columns": {
        "source": (source if isinstance(source, str) else f"{len(source)} files" if isinstance(source, list)
                   else f"{type(source).__name__} in memory, {src.num_rows} rows"), "pk": pk, "columns": columns,
        "on_missing": on_missing, "rows": res.num_rows}})
    return version


def update_rows(table: TableRef, updates: dict[str, str], stale: dict[str, str], where: str | None) -> int:
    """Update rows of a base table (``updates``: SQL per column; ``stale``:
    markers to clear, of computed columns reading an updated column) and keep
    the other computed columns of those rows current. Returns the new version.

    A table's markers name the row version the value was computed at (see
    :mod:`mv_assets.model.markers`), and every update moves the versions of the
    rows it writes: a computed column reading none of the updated columns would
    read as stale. Its markers are stamped with the new version in a second
    commit that keeps row versions (``rewrite_columns``), for the rows whose
    value was current before the update and that nobody changed since. Between
    the two commits (or if the second never happens) those values read as
    stale: recomputed for nothing, never trusted wrongly."""
    ds = table.dataset()
    kept = [c for c in table.computed_columns() if computed_marker(c.name) not in stale and c.name not in updates]
    before = None
    if kept:
        before = ds.scanner(
            columns={**{f"k{i}": f"`{computed_marker(c.name)}`" for i, c in enumerate(kept)},
                     "v": "_row_last_updated_at_version"},
            filter=where, with_row_id=True,
        ).to_table()
    ds.update({**updates, **stale}, where=where)
    version = table.dataset().version
    if before is None or before.num_rows == 0:
        return version
    vers = before.column("v").to_numpy().astype(np.int64)
    current = [
        np.asarray(before.column(f"k{i}").fill_null("").to_pylist(), dtype=object)
        == np.asarray([marker_value(c.fingerprint, v) for v in vers.tolist()], dtype=object)
        for i, c in enumerate(kept)
    ]
    keep = np.logical_or.reduce(current)
    if not keep.any():
        return version
    ids = _ids(before)[keep]
    now = table.dataset(version).scanner(
        columns=[computed_marker(c.name) for c in kept], filter=f"_rowid IN ({', '.join(map(str, ids.tolist()))})",
        with_row_id=True,
    ).to_table()
    now = now.take(pa.array(positions(ids, _ids(now))))  # in the order of ``ids`` (every id is there at ``version``)
    names = [computed_marker(c.name) for c in kept]
    res = pa.table({
        name: pc.if_else(pa.array(cur[keep]), pa.scalar(marker_value(c.fingerprint, version)), now.column(name))  # pyright: ignore[reportAttributeAccessIssue]
        for name, cur, c in zip(names, current, kept, strict=True)
    })
    commit_column_values(
        table, names, ids, np.full(len(ids), version, dtype=np.int64), _driver_writer(res, names), is_view=False,
        props={"columns": [c.name for c in kept], "restamped_after_update": version},
    )
    return version
