"""Tables and materialized views: thin handles over Lance datasets."""

import json
import time
import uuid
from collections.abc import Collection
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import lance
import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.api.indexing import Indexed
from mv_assets.api.query import Query
from mv_assets.api.search import SearchQuery
from mv_assets.execution.spark import InlineRunner, as_runner
from mv_assets.model.definition import (
    SOURCE_ROW_ID,
    VIEW_METADATA_KEY,
    ColumnSpec,
    ViewDefinition,
    check_sql,
    computed_marker,
    is_marker,
    short_error,
    sql_literal,
)
from mv_assets.model.markers import current_sql, stale_sql
from mv_assets.model.names import PRIMARY_KEY_METADATA_KEY, Alias, is_internal_column
from mv_assets.model.policy import POLICY_METADATA_KEY, Decision, RefreshPolicy
from mv_assets.ops.backfill import BackfillJob, _group_specs, backfill_column, plan_backfill
from mv_assets.ops.checks import CheckOutcome, check_view
from mv_assets.ops.columns import add_columns, alter_columns, load_columns, update_rows
from mv_assets.ops.kinds import plan_view_refresh
from mv_assets.ops.refresh import (
    RefreshPlan,
    RefreshResult,
    compact_if_fragmented,
    execute_refresh,
    view_rows_by_fragment,
)
from mv_assets.storage import objects
from mv_assets.storage.changes import FragmentChanges, data_version, fragment_changes
from mv_assets.storage.error_log import read_errors
from mv_assets.storage.layout import Layout
from mv_assets.storage.refs import Ref, TableRef, ViewRef
from mv_assets.storage.row_ids import require_stable_row_ids
from mv_assets.storage.state import RefreshState, carry_refresh_state, read_refresh_state
from mv_assets.storage.status import (
    FAILED_LOAD,
    LOADING,
    ViewStatus,
    pending_source_versions,
    record_load_state,
    refresh_decision,
    view_status,
)
from mv_assets.storage.versions import dataset_at

if TYPE_CHECKING:
    from mv_assets.execution.spark import Runner
    from mv_assets.ops.backfill import BackfillPlan, BackfillResult
    from mv_assets.storage.error_log import ErrorRecord


class Catalog(Protocol):
    """What a handle needs of its catalog (``Connection`` is one; typed here so
    this module does not import the catalog module that imports it)."""

    layout: Layout

    @property
    def runner(self) -> "Runner": ...

    def table_uri(self, name: str) -> str: ...

    def open_table(self, name: str) -> "Table": ...

    def _refresh_lock(self, view: str, timeout: float | None) -> AbstractContextManager: ...

    def _check_source_current(self, view: "MaterializedView") -> None: ...

__all__ = ["Table", "MaterializedView", "sql_literal", "to_arrow_table"]



def _huge_int(value: Any) -> int | None:
    """An integer in ``value`` (nested lists and dicts included) that no Arrow
    integer type holds, if any."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if not -(2**63) <= value < 2**64 else None
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for v in value:
            found = _huge_int(v)
            if found is not None:
                return found
    return None


def _values(column: Any) -> list:
    return list(column) if isinstance(column, (list, tuple)) else [column]


def _too_wide(items: Any, exc: OverflowError) -> ValueError:
    """The ValueError for rows holding an integer beyond 64 bits (Arrow raises
    OverflowError), naming the column and the value."""
    for name, value in items:
        found = _huge_int(value)
        if found is not None:
            return ValueError(f"column {name!r}: the value {found} does not fit a 64-bit integer; nothing was written")
    return ValueError(f"the rows hold a value too large for its column: {exc}; nothing was written")


def to_arrow_table(data: Any, schema: pa.Schema | None = None) -> pa.Table:
    """Accept a pyarrow Table / RecordBatch / reader or a list of dicts."""
    if isinstance(data, pa.Table):
        table = data
    elif isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif isinstance(data, pa.RecordBatchReader):
        table = data.read_all()
    elif isinstance(data, list):
        if data and not all(isinstance(r, dict) for r in data):
            raise ValueError("a list of rows must hold dicts")
        if schema is not None:
            extra = sorted({k for r in data for k in r} - set(schema.names))
            if extra:
                raise ValueError(f"columns {extra} are not in the table schema {schema.names}")
        try:
            # Infer first, then cast safely below: building with the schema would
            # truncate silently (1.5 into an int column becomes 1)
            table = pa.Table.from_struct_array(pa.array(data)) if data else pa.Table.from_pylist(data, schema=schema)
        except OverflowError as exc:
            raise _too_wide(((k, v) for r in data for k, v in r.items()), exc) from exc
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            try:
                table = pa.Table.from_pylist(data, schema=schema)
            except OverflowError as exc:
                raise _too_wide(((k, v) for r in data for k, v in r.items()), exc) from exc
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
                raise ValueError(f"rows do not match the table schema: {exc}") from exc
    elif isinstance(data, dict):
        try:
            table = pa.table(data)
        except OverflowError as exc:
            raise _too_wide(((k, v) for k, col in data.items() for v in _values(col)), exc) from exc
    else:
        raise ValueError(f"unsupported data of type {type(data).__name__}; pass a pyarrow Table or a list of dicts")
    if schema is not None:
        missing = [f.name for f in schema if f.name not in table.column_names and not f.nullable]
        extra = [n for n in table.column_names if n not in schema.names]
        if extra:
            raise ValueError(f"columns {extra} are not in the table schema {schema.names}")
        if missing:
            raise ValueError(f"required columns {missing} are missing")
        arrays = []
        for f in schema:
            if f.name in table.column_names:
                col = table.column(f.name)
                if not f.nullable and col.null_count:
                    raise ValueError(f"column {f.name!r} is not nullable but has {col.null_count} nulls")
                try:
                    arrays.append(col.cast(f.type))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ValueError(f"column {f.name!r}: cannot convert {col.type} to {f.type}: {exc}") from exc
            else:
                arrays.append(pa.nulls(table.num_rows, f.type))
        table = pa.Table.from_arrays(arrays, schema=schema)
    return table


def check_primary_key(table: pa.Table, pk: str | None) -> None:
    """New rows must have non-NULL, mutually distinct primary key values."""
    if pk is None or table.num_rows == 0:
        return
    col = table.column(pk)
    if col.null_count:
        raise ValueError(f"primary key {pk!r} cannot be NULL")
    if len(pc.unique(col)) != len(col):  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
        raise ValueError(f"duplicate values for primary key {pk!r} in the new rows")


def existing_keys(ds: lance.LanceDataset, pk: str, keys: pa.Array, chunk: int = 4096) -> list:
    """Which of ``keys`` the dataset already holds in its primary key column
    (filters pushed down to Lance a chunk of keys at a time)."""
    found: list = []
    values = keys.to_pylist()
    col = _quote(pk)
    for lo in range(0, len(values), chunk):
        literals = ", ".join(sql_literal(v) for v in values[lo : lo + chunk])
        hit = ds.to_table(columns=[pk], filter=f"{col} IN ({literals})").column(pk).to_pylist()
        found.extend(hit)
    return sorted(set(found), key=lambda v: (str(type(v)), v))


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class Table(Indexed):
    """A Lance dataset in a catalog. Plain ``lance.dataset(table.uri)`` opens it too."""

    def __init__(self, connection: Catalog, name: str) -> None:
        self.connection = connection
        self.name = name
        self.uri = connection.table_uri(name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, version={self.version})"

    def _dataset(self, version: int | None = None) -> lance.LanceDataset:
        if version is None:
            return objects.dataset(self.uri)
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"a version is an int, got {version!r}")
        return dataset_at(self.uri, self.name, version)  # a cleaned-up or unknown version: said so

    # -- reading ---------------------------------------------------------
    @property
    def version(self) -> int:
        return self._dataset().version

    @property
    def schema(self) -> pa.Schema:
        return self._dataset().schema

    @property
    def primary_key(self) -> str | None:
        md = self.schema.metadata or {}
        raw = md.get(PRIMARY_KEY_METADATA_KEY.encode())
        return raw.decode() if raw else None

    def to_spark(self, spark: Any, *, columns: list[str] | None = None, version: int | None = None,
                 with_internal: bool = False) -> Any:
        """This table or view as a Spark DataFrame read on the executors, one
        partition per Lance fragment (nothing passes through the driver).

        ``columns`` defaults to the visible columns: a view's internal key and
        marker columns (``__source_row_id``, ``__source_row_version``,
        ``__computed__*``) are left out unless ``with_internal``. ``spark`` is
        any SparkSession (classic or Spark Connect); the catalog's storage
        options go with the job."""
        from mv_assets.api.runners import lance_dataframe

        ds = self._dataset(version)
        if columns is None:
            columns = [n for n in ds.schema.names if with_internal or not is_internal_column(n)]
        missing = [c for c in columns if c not in ds.schema.names]
        if missing:
            raise ValueError(f"{self.name!r} has no columns {missing}; it has {ds.schema.names}")
        return lance_dataframe(spark, self.uri, ds.version, columns)

    def fragment_ids(self) -> list[int]:
        """Ids of the fragments of the latest version (the partitions of views over it)."""
        return [f.fragment_id for f in self._dataset().get_fragments()]

    def data_version(self, reads: Collection[str] | None = ()) -> int:
        """The newest version whose commit changed rows (or, with ``reads``,
        backfilled one of those computed columns; None: any column): what a
        reader of the table would notice. Compactions do not move it."""
        return data_version(self.uri, reads=reads)

    def fragment_changes(self, since: int | None, known: set[int] | list[int]) -> FragmentChanges:
        """Fragments added and retired since version ``since``, given the ``known`` ones."""
        return fragment_changes(self.uri, since, known)

    def count_rows(self, filter: str | None = None) -> int:
        ds = self._dataset()
        if filter is not None:
            try:
                check_sql(ds, filter=filter)
            except (ValueError, OSError) as exc:
                raise ValueError(f"invalid filter {filter!r}: {short_error(exc)}") from exc
        return ds.count_rows(filter=filter)

    def to_arrow(self, version: int | None = None, *, with_markers: bool = False) -> pa.Table:
        """The rows; the hidden per-row computed markers only with ``with_markers``."""
        ds = self._dataset(version)
        if with_markers:
            return ds.to_table()
        return ds.to_table(columns=[n for n in ds.schema.names if not is_marker(n)])

    def search(
        self, query: Any = None, vector_column_name: str | None = None, query_type: str = "auto",
        ordering_field_name: str | None = None, fts_columns: str | list[str] | None = None,
    ) -> Any:
        """``search(None)``: a query builder over this table (what views are
        declared with). A vector, a text string or ``query_type="hybrid"``: a
        search (:class:`~mv_assets.api.search.SearchQuery`), with Geneva's
        parameters."""
        if query is None and str(query_type).lower() in ("auto", "vector"):
            return Query(self)
        if ordering_field_name is not None:
            raise ValueError("ordering_field_name belongs to the tantivy full-text index; Lance's orders by score")
        return SearchQuery(self, query, vector_column_name=vector_column_name, query_type=query_type,
                           fts_columns=fts_columns)

    def list_versions(self) -> list[dict]:
        return [dict(v) for v in self._dataset().versions()]

    # -- computed columns ------------------------------------------------
    def _input_dataset(self) -> lance.LanceDataset:
        """Where computed columns read their inputs (a view: its source)."""
        return self._dataset()

    def input_schema(self) -> pa.Schema:
        return self._input_dataset().schema

    def computed_columns(self) -> list[ColumnSpec]:
        """Columns computed by a UDF or SQL expression (see :meth:`add_columns`)."""
        return self.column_ref().computed_columns()

    def ref(self) -> "Ref":
        """The frozen reference the work code is given (see mv_assets.refs)."""
        return TableRef(self.name, self.uri, self.connection.layout)

    def column_ref(self) -> "Ref":
        """The reference computed-column operations work on (add, alter, backfill, status)."""
        return self.ref()

    def _runner(self, runner: "Runner | None") -> "Runner":
        """``runner``, else the connection's, as the whole runner protocol (:func:`as_runner`)."""
        return as_runner(runner or self.connection.runner)

    def _changed(self) -> None:
        """The stored definition changed (columns added or altered): drop cached copies."""

    def _require_stable_row_ids(self, doing: str) -> None:
        """A table's computed values follow its rows by stable row id and row
        version: refused, before anything is written, on a table without them
        (addresses as ids, updates that move no row version)."""
        require_stable_row_ids(self._dataset(), self.name, doing)

    def add_columns(self, transforms: Any) -> list[str]:
        """Add computed columns; returns their names.

        Forms (as in Geneva): ``{"name": "<SQL expression>"}``, ``{"name": udf}``
        (inputs from the UDF's parameter names), ``{"name": (udf, ["col_a",
        "col_b"])}``, a ``Columns[NamedTuple]`` UDF passed directly (one
        sibling column per field), ``UnpackedUDF(udf, prefix="img_")``.
        Everything is validated before anything is written (``ValueError``).
        SQL columns are filled right away; UDF columns start NULL and are
        filled by :meth:`backfill`. On a view, the column belongs to the view:
        later refreshes compute it for new and changed rows.
        """
        self._require_stable_row_ids("computed columns (add_columns)")
        try:
            return add_columns(self.column_ref(), transforms)
        finally:
            self._changed()

    def alter_columns(self, *alterations: dict) -> None:
        """Swap computed columns' UDFs: ``alter_columns({"path": "col", "udf": new_udf})``.

        Values are not touched: every row computed by the old code becomes
        stale and the next :meth:`backfill` recomputes it.
        """
        try:
            alter_columns(self.column_ref(), alterations)
        finally:
            self._changed()

    def plan_backfill(
        self, column: str, *, udf: Any = None, where: str | None = None, row_ids: list[int] | None = None,
        checkpoint_size: int | None = None, max_rows_per_task: int = 65_536, runner: "Runner | None" = None,
    ) -> "BackfillPlan":
        """An exact dry run of :meth:`backfill` with the same arguments: rows,
        tasks, rows whose results an interrupted run already checkpointed (the
        backfill resumes them) and rows to compute."""
        self._require_stable_row_ids("a backfill")
        parallelism = self._runner(runner).parallelism()
        return plan_backfill(self.column_ref(), column, udf=udf, where=where, row_ids=row_ids,
                             checkpoint_size=checkpoint_size, max_rows_per_task=max_rows_per_task,
                             parallelism=parallelism)

    def backfill(
        self,
        column: str | list[str],
        *,
        udf: Any = None,
        where: str | None = None,
        row_ids: list[int] | None = None,
        runner: "Runner | None" = None,
        checkpoint_size: int | None = None,
        max_rows_per_task: int = 65_536,
        job_id: str | None = None,
    ) -> "BackfillResult":
        """Compute ``column`` for the rows that need it, checkpointed and resumable.

        By default only rows whose value was never computed by the column's
        current UDF (tracked per row: a UDF that returns NULL is not computed
        again; after :meth:`alter_columns` every old row is). ``where`` (SQL)
        picks rows to (re)compute instead; ``row_ids`` limits to stable row
        ids. ``udf`` computes with another UDF of the same type (recorded as
        such per row). UDF columns are computed and written in one
        pass, results checkpointed by time (every ``$MV_ASSETS_CHECKPOINT_SECONDS``,
        default 10 s, of UDF work; keyed by row id, row version and input
        markers): a killed backfill run again redoes at most that much per
        task; a view computes the rows whose source row is unchanged since its
        last refresh (the refresh recomputes the others). With
        ``checkpoint_size`` (and for SQL columns: 65,536) results are
        checkpointed in batches of that many rows and written after: a killed
        backfill redoes at most one batch per task.
        All results are committed in one Lance transaction at the end. Rows a UDF fails on under
        ``on_error="skip"`` stay NULL and are recorded (:meth:`get_errors`).
        """
        self._require_stable_row_ids("a backfill")
        return backfill_column(
            self.column_ref(), column, udf=udf, where=where, row_ids=row_ids, runner=self._runner(runner),
            checkpoint_size=checkpoint_size, max_rows_per_task=max_rows_per_task, job_id=job_id,
        )

    def backfill_async(self, column: str | list[str], **kwargs: Any) -> "BackfillJob":
        """Start :meth:`backfill` in a background thread; returns a job handle
        whose ``result(timeout)`` blocks. Validation errors raise here."""
        col = column[0] if isinstance(column, list) and len(column) == 1 else column
        plan_kwargs = {k: kwargs[k] for k in ("udf", "where", "row_ids") if k in kwargs}
        plan_backfill(self.column_ref(), col if isinstance(col, str) else col[0], **plan_kwargs)  # bad input raises now
        job_id = kwargs.pop("job_id", None) or uuid.uuid4().hex[:12]
        return BackfillJob(job_id, self.backfill, (column,), {**kwargs, "job_id": job_id})

    def load_columns(
        self,
        source: str | list[str],
        pk: str,
        columns: list[str],
        *,
        source_format: str | None = None,
        on_missing: str = "carry",
    ) -> int | None:
        """Load columns from Parquet, Lance or Arrow IPC joined by primary key.

        ``on_missing``: ``"carry"`` keeps the value of rows with no match
        (NULL for a new column), ``"null"`` sets it NULL, ``"error"`` raises
        before writing. New columns are added. One commit; returns the version.
        """
        return load_columns(self.ref(), source, pk, columns, source_format=source_format, on_missing=on_missing)

    def get_errors(
        self, job_id: str | None = None, column_name: str | None = None, error_type: str | None = None
    ) -> list["ErrorRecord"]:
        """Error records of this table's UDF rows, filtered by job, column, exception type."""
        return read_errors(self.connection.layout, self.name, job_id=job_id, column=column_name, error_type=error_type)

    def get_failed_row_ids(self, column: str, job_id: str | None = None) -> list[int]:
        """Stable row ids whose ``column`` failed and is still not computed.

        Ids stay valid across compaction (for a view: its source row ids).
        """
        spec = _group_specs(self.column_ref(), column)[0]
        ids = sorted({e.row_id for e in self.get_errors(job_id=job_id, column_name=column)})
        if not ids:
            return []
        is_view = isinstance(self.column_ref(), ViewRef)  # a view's values follow its source rows
        id_col = SOURCE_ROW_ID if is_view else "_rowid"
        still = self._dataset().scanner(
            # (a filter on the row version needs it projected: Lance 14 errs after compaction otherwise)
            columns={Alias.KEY: id_col} if is_view else {Alias.ROW_VERSION: "_row_last_updated_at_version"},
            filter=f"({id_col} IN ({', '.join(map(str, ids))})) AND {stale_sql(column, spec.fingerprint, versioned=not is_view)}",
            with_row_id=id_col == "_rowid",
        ).to_table()
        return sorted(int(i) for i in still.column(Alias.KEY if id_col != "_rowid" else "_rowid").to_pylist())

    def column_status(self) -> list[dict]:
        """One record per computed column: kind, UDF, fingerprint, rows computed by
        the current code, rows stale (never computed, failed or older code), rows
        whose last attempt failed."""
        out = []
        total = self.count_rows()
        versioned = not isinstance(self.column_ref(), ViewRef)  # see mv_assets.model.markers
        for c in self.computed_columns():
            current = self.count_rows(current_sql(c.name, c.fingerprint, versioned=versioned))
            out.append({
                "column": c.name,
                "kind": c.kind,
                "udf": c.udf.name if c.udf is not None else None,
                "expression": c.expr,
                "fingerprint": c.fingerprint,
                "rows": total,
                "current": current,
                "stale": total - current,
                "failed": len(self.get_failed_row_ids(c.name)) if c.kind == "udf" else 0,
            })
        return out

    def retry_errors(self, column: str, job_id: str | None = None, **kwargs: Any) -> "BackfillResult":
        """Backfill just the rows whose ``column`` failed (one call; works after compaction)."""
        return self.backfill(column, row_ids=self.get_failed_row_ids(column, job_id), **kwargs)

    # -- writing ---------------------------------------------------------
    def _check_writable(self) -> None:
        pass

    def _new_rows(self, data: Any) -> tuple[lance.LanceDataset, pa.Table]:
        """The dataset and ``data`` as rows of it, checked: no values for markers,
        primary key present and distinct among the new rows."""
        ds = self._dataset()
        table = to_arrow_table(data, ds.schema)
        given = [n for n in table.column_names if is_marker(n) and table.column(n).null_count < table.num_rows]
        if given:
            raise ValueError(f"columns {given} are maintained by mv_assets; leave them out")
        check_primary_key(table, self.primary_key)
        return ds, table

    def add(self, data: Any) -> int:
        """Append rows; returns the new version."""
        self._check_writable()
        ds, table = self._new_rows(data)
        if table.num_rows == 0:
            return ds.version
        pk = self.primary_key
        if pk is not None:
            taken = existing_keys(ds, pk, table.column(pk).combine_chunks())
            if taken:
                shown = taken[:10]
                raise ValueError(
                    f"primary key {pk!r}: {len(taken)} of the new rows already exist in {self.name!r} "
                    f"(keys {shown}{' ...' if len(taken) > 10 else ''}); nothing was added. "
                    "Use merge_insert() to insert or update by key"
                )
        version = objects.write_dataset(table, self.uri, mode="append").version
        return self._fill_sql_columns() or version

    def merge_insert(self, data: Any) -> int:
        """Upsert by primary key: rows whose key exists replace that row's
        values (the row keeps its stable row id, so views see an update),
        the others are added. Computed columns of replaced rows become stale
        and are recomputed by the next backfill. Returns the new version.
        """
        self._check_writable()
        pk = self.primary_key
        if pk is None:
            raise ValueError(f"merge_insert needs a primary key; {self.name!r} was created without one")
        ds, table = self._new_rows(data)
        if table.num_rows == 0:
            return ds.version
        ds.merge_insert(pk).when_matched_update_all().when_not_matched_insert_all().execute(table)
        return self._fill_sql_columns() or self.version

    def _fill_sql_columns(self) -> int | None:
        """Compute SQL computed columns for rows that lack them (after add/update)."""
        version = None
        for c in self.computed_columns():
            if c.kind == "sql":
                result = self.backfill(c.name, runner=InlineRunner())
                version = result.version or version
        return version

    def _stale_markers(self, updated: set[str]) -> dict[str, str]:
        """Markers to clear when ``updated`` columns change: computed columns reading them."""
        out = {}
        for c in self.computed_columns():
            if c.name in updated:
                continue
            reads = set(c.udf.input_columns) if c.udf is not None and c.udf.input_columns else None
            if reads is None or reads & updated:  # SQL and RecordBatch UDFs: any change
                out[computed_marker(c.name)] = "CAST(NULL AS STRING)"
        return out

    def delete(self, where: str) -> int:
        """Delete rows matching the SQL predicate; returns the new version."""
        self._check_writable()
        if not isinstance(where, str) or not where.strip():
            raise ValueError("delete() needs a SQL predicate; use delete('true') to delete every row")
        ds = self._dataset()
        try:
            check_sql(ds, filter=where)
        except (ValueError, OSError) as exc:
            raise ValueError(f"invalid delete predicate {where!r}: {short_error(exc)}") from exc
        ds.delete(where)
        return self.version

    def update(
        self,
        where: str | None = None,
        values: dict[str, Any] | None = None,
        *,
        values_sql: dict[str, str] | None = None,
    ) -> int:
        """Update rows matching ``where``; ``values`` are Python literals,
        ``values_sql`` SQL expressions. Returns the new version."""
        self._check_writable()
        if values is not None and values_sql is not None:
            raise ValueError("pass values or values_sql, not both")
        updates: dict[str, str]
        if values is not None:
            updates = {k: sql_literal(v) for k, v in values.items()}
        elif values_sql is not None:
            updates = dict(values_sql)
        else:
            raise ValueError("update() needs values or values_sql")
        if not updates:
            raise ValueError("update() needs at least one column")
        ds = self._dataset()
        unknown = [k for k in updates if k not in ds.schema.names]
        if unknown:
            raise ValueError(f"unknown columns {unknown}; table columns are {ds.schema.names}")
        for name, value in (values or {}).items():  # a lossy conversion is refused, not stored
            if value is None:
                continue
            try:
                pa.array([value]).cast(ds.schema.field(name).type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError) as exc:
                raise ValueError(f"value {value!r} does not fit column {name!r} ({ds.schema.field(name).type}): {exc}") from exc
        pk = self.primary_key
        if pk in updates:
            raise ValueError(f"the primary key {pk!r} cannot be updated")
        if any(is_marker(k) for k in updates):
            raise ValueError("computed markers are maintained by mv_assets and cannot be updated")
        try:
            check_sql(ds, filter=where, columns=updates)
        except (ValueError, OSError) as exc:
            raise ValueError(f"invalid update: {short_error(exc)}") from exc
        ref = self.ref()
        assert isinstance(ref, TableRef)  # views refuse writes (_check_writable)
        update_rows(ref, updates, self._stale_markers(set(updates)), where)
        return self._fill_sql_columns() or self.version

    def optimize(self, *, cleanup_older_than: timedelta | None = None, target_rows_per_fragment: int | None = None) -> int:
        """Compact small fragments (row ids and row versions are kept). Returns the new version."""
        ds = self._dataset()
        kwargs = {}
        if target_rows_per_fragment:
            kwargs["target_rows_per_fragment"] = target_rows_per_fragment
        ds.optimize.compact_files(**kwargs)
        self._catch_up_indexes()
        if cleanup_older_than is not None:
            self._dataset().cleanup_old_versions(older_than=cleanup_older_than)
        return self.version

    def _catch_up_indexes(self) -> None:
        from mv_assets.storage.indexes import catch_up

        with objects.reusing_handles():
            catch_up(self.uri)


class MaterializedView(Table):
    """A view kept up to date by :meth:`refresh`. It is a Table you can read."""

    def __init__(
        self, connection: Catalog, name: str, definition: ViewDefinition | None = None, *,
        raw_definition: bytes | None = None,
    ) -> None:
        super().__init__(connection, name)
        self._definition = definition
        self._raw_definition = raw_definition  # as stored, when the opener read it already

    @property
    def definition(self) -> ViewDefinition:
        if self._definition is None:
            raw = self._raw_definition or (self.schema.metadata or {}).get(VIEW_METADATA_KEY.encode())
            if raw is None:
                raise ValueError(f"{self.name!r} is not a materialized view")
            self._definition = ViewDefinition.decode(raw)
        return self._definition

    def ref(self) -> ViewRef:
        """The frozen reference the work code is given (see mv_assets.refs)."""
        d = self.definition
        return ViewRef(self.name, self.uri, d, self.connection.table_uri(d.source), self.connection.layout)

    @property
    def source(self) -> str:
        """The name of the table or view this view reads (its stored JSON is
        read; no UDF is unpickled, so ordering views never runs user code)."""
        if self._definition is not None:
            return self._definition.source
        raw = (self.schema.metadata or {}).get(VIEW_METADATA_KEY.encode())
        if raw is None:
            raise ValueError(f"{self.name!r} is not a materialized view")
        return json.loads(raw)["source"]

    def column_ref(self) -> "Ref":
        """A chunk view's added columns are computed from its own rows, as a
        table's are (markers follow the rows' versions, stored in the schema
        metadata): a refresh adds children stale, a backfill computes them.
        A query view's columns follow its source rows (its ``ref()``)."""
        if self.definition.kind == "chunker":
            return TableRef(self.name, self.uri, self.connection.layout)
        return self.ref()

    def _input_dataset(self) -> lance.LanceDataset:
        if self.definition.kind == "chunker":
            return self._dataset()
        return self.connection.open_table(self.definition.source)._dataset()

    def _changed(self) -> None:
        self._definition = self._raw_definition = None

    def _check_writable(self) -> None:
        raise ValueError(
            f"{self.name!r} is a materialized view: its rows are maintained by refresh(); "
            "change the source table instead"
        )

    def refresh_state(self) -> RefreshState:
        return read_refresh_state(self._dataset())

    def optimize(self, *, cleanup_older_than: timedelta | None = None, target_rows_per_fragment: int | None = None) -> int:
        """Compact the view's files and optionally clean up its history.

        The refresh state (source version, load number, definition) lives in
        the view's refresh commits; before anything can remove them, it is
        carried to the newest commit (a config-only commit that changes no
        rows), so it survives compaction and cleanup.
        """
        with self.connection._refresh_lock(self.name, 600.0):
            ds = self._dataset()
            if target_rows_per_fragment:
                ds.optimize.compact_files(target_rows_per_fragment=target_rows_per_fragment)
            else:
                ds.optimize.compact_files()
            self._catch_up_indexes()
            carry_refresh_state(self._dataset())
            if cleanup_older_than is not None:
                self._dataset().cleanup_old_versions(older_than=cleanup_older_than)
            return self.version

    @property
    def source_version(self) -> int | None:
        """The source version the view reflects (None before the first refresh)."""
        return self.refresh_state().source_version

    @objects.reusing_handles()
    def plan_refresh(
        self, *, src_version: int | None = None, mode: str = "auto", fragments: list[int] | None = None,
        recompute: list[str] | None = None, max_rows_per_task: int | None = None, checkpoint_size: int | None = None,
        runner: "Runner | None" = None,
    ) -> RefreshPlan:
        """An exact dry run of :meth:`refresh` with the same arguments: rows to
        insert, update and delete, UDF rows to compute, the tasks."""
        return plan_view_refresh(
            self.ref(), src_version, mode=mode, fragments=fragments, recompute=recompute,
            max_rows_per_task=max_rows_per_task, checkpoint_size=checkpoint_size,
            parallelism=self._runner(runner).parallelism(),
        )

    @property
    def refresh_policy(self) -> RefreshPolicy:
        return RefreshPolicy.from_json((self.schema.metadata or {}).get(POLICY_METADATA_KEY.encode()))

    def set_refresh_policy(self, policy: RefreshPolicy) -> None:
        """Change how the view is kept fresh (shown and acted on by Dagster)."""
        if not isinstance(policy, RefreshPolicy):
            raise ValueError("set_refresh_policy() takes a RefreshPolicy")
        self._dataset().update_schema_metadata({POLICY_METADATA_KEY: policy.to_json()})

    @objects.reusing_handles()
    def status(self) -> ViewStatus:
        """This view's record of the status table (load state, staleness, ...)."""
        return view_status(self.ref())

    @objects.reusing_handles()
    def refresh_decision(self, *, now: float | None = None, scheduled: bool = False) -> Decision:
        """Whether the view's refresh policy says to refresh now, and why."""
        return refresh_decision(self.ref(), now=now, scheduled=scheduled)

    def pending_source_versions(self) -> list[int]:
        """Source versions after the one the view reflects that change what it reads."""
        return pending_source_versions(self.ref())

    def check(self) -> list[CheckOutcome]:
        """Integrity checks of the view against its source (see :mod:`mv_assets.ops.checks`)."""
        return list(check_view(self.ref()))

    def rows_by_fragment(self, src_version: int, fragments: list[int]) -> dict[int, int]:
        """Rows the view holds from each of these source fragments (at ``src_version``)."""
        return view_rows_by_fragment(self.uri, self.ref().source_uri, src_version, fragments)

    @objects.reusing_handles()
    def refresh(
        self,
        *,
        src_version: int | None = None,
        mode: str = "auto",
        runner: "Runner | None" = None,
        fragments: list[int] | None = None,
        recompute: list[str] | None = None,
        max_rows_per_task: int | None = None,
        checkpoint_size: int | None = None,
        lock_timeout: float | None = 600.0,
    ) -> RefreshResult:
        """Bring the view up to ``src_version`` of its source (default: latest).

        ``mode``: ``"auto"`` (incremental when the change feed allows, else full),
        ``"full"`` (recompute everything) or ``"incremental_strict"`` (fail rather
        than recompute everything). ``fragments`` limits the work to rows in
        those source fragments (deletions are always applied in full).
        ``recompute`` names UDF columns to compute again for rows that are
        otherwise current; their other values are copied, not recomputed.

        UDF results are checkpointed by time (default): saved once they took
        ``$MV_ASSETS_CHECKPOINT_SECONDS`` (10 s) to compute, so cheap UDFs pay
        almost nothing and a refresh killed and run again redoes at most about
        that much UDF work per task. ``checkpoint_size=N`` checkpoints every N
        rows instead. Checkpoints are keyed by UDF fingerprints and the rows'
        stable ids and versions.

        Two refreshes of one view never run at once: the second waits for the
        first (up to ``lock_timeout`` seconds, then ConcurrentRefreshError).
        Every refresh updates the view's status record (LOADING, then LOADED
        once its commit lands, or FAILED_LOAD with the error).
        """
        self.connection._check_source_current(self)
        with self.connection._refresh_lock(self.name, lock_timeout):
            ref = self.ref()
            plan = plan_view_refresh(
                ref, src_version, mode=mode, fragments=fragments, recompute=recompute,
                max_rows_per_task=max_rows_per_task, checkpoint_size=checkpoint_size,
                parallelism=self._runner(runner).parallelism(), exact=False,  # the tasks count its inserts
            )
            if plan.commits_nothing:
                return execute_refresh(ref, plan, self._runner(runner))
            # LOADING until the commit carrying this load number lands (then LOADED: storage.status)
            record_load_state(self.connection.layout, self.name, LOADING, load_number=plan.load_number + 1)
            try:
                result = execute_refresh(ref, plan, self._runner(runner))
            except BaseException as exc:
                record_load_state(self.connection.layout, self.name, FAILED_LOAD, f"{type(exc).__name__}: {exc}")
                raise
            start = time.perf_counter()
            if compact_if_fragmented(self._dataset()):
                result.timings["compact_s"] = time.perf_counter() - start
            return result
