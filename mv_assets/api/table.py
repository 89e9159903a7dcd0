"""Tables and materialized views: thin handles over Lance datasets."""

import inspect
import json
import time
import uuid
import warnings
from collections.abc import Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, overload

import lance
import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.api import geneva
from mv_assets.api.indexing import Indexed
from mv_assets.api.query import Query
from mv_assets.api.search import SearchQuery
from mv_assets.execution.resources import ResourceRequest, request_of_definition
from mv_assets.execution.spark import InlineRunner, as_runner
from mv_assets.model.blobs import is_blob_field, logical_schema
from mv_assets.model.compaction import (
    COMPACTION_CONFIG_KEY,
    DAGSTER_PARTITION_LIMIT,
    FRAGMENT_WARNING,
    CompactionPolicy,
)
from mv_assets.model.definition import (
    SOURCE_ROW_ID,
    SOURCE_ROW_VERSION,
    VIEW_METADATA_KEY,
    ColumnSpec,
    ViewDefinition,
    check_sql,
    computed_marker,
    is_marker,
    quote_ident,
    short_error,
    sql_literal,
    stored_columns,
)
from mv_assets.model.errors import SourceBehindError, SqlRowsError, TableNotFoundError
from mv_assets.model.join_agg_view import JOIN_AGG_KIND, is_join_under
from mv_assets.model.kinds import kind_of
from mv_assets.model.markers import current_sql, stale_sql
from mv_assets.model.names import PRIMARY_KEY_METADATA_KEY, Alias, is_internal_column
from mv_assets.model.ownership import OWNERSHIP_METADATA_KEY, Ownership
from mv_assets.model.policy import BUILD_HINT, POLICY_METADATA_KEY, Decision, RefreshPolicy
from mv_assets.model.udf import checkpoint_size_of
from mv_assets.ops.backfill import (
    _group_specs,
    backfill_column,
    fill_sql_rows,
    lacking_predicate,
    plan_backfill,
    sql_failure_text,
)
from mv_assets.ops.checks import CheckOutcome, check_computed_columns, check_view
from mv_assets.ops.columns import add_columns, alter_columns, load_columns, update_rows
from mv_assets.ops.jobs import Job
from mv_assets.ops.kinds import plan_view_refresh
from mv_assets.ops.refresh import (
    RefreshPlan,
    RefreshResult,
    compact_if_fragmented,
    execute_refresh,
    is_failed_on_data,
    is_view_replaced,
    refresh_job_id,
    view_rows_by_fragment,
)
from mv_assets.ops.schema_changes import SCHEMA_KEYS, drop_columns, rename_or_relax_columns
from mv_assets.storage import keys, objects
from mv_assets.storage.changes import FragmentChanges, data_version, fragment_changes, fragment_data_versions
from mv_assets.storage.error_log import read_errors
from mv_assets.storage.layout import Layout
from mv_assets.storage.refs import Ref, TableRef, ViewRef
from mv_assets.storage.row_ids import require_stable_row_ids
from mv_assets.storage.state import RefreshState, carry_refresh_state, read_refresh_state
from mv_assets.storage.status import (
    FAILED_LOAD,
    LOADING,
    ViewStatus,
    clear_load_state,
    keep_failed_refresh,
    load_record,
    pending_source_versions,
    record_load_state,
    refresh_decision,
    view_status,
)
from mv_assets.storage.versions import dataset_at, listed_versions

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

    def _readers_of(self, name: str) -> dict[str, str]: ...

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


def _unsigned_columns(rows: list[dict], schema: pa.Schema | None) -> pa.Table | None:
    """``rows`` column by column, each inferred but the unsigned columns of
    ``schema``, built as such: Arrow infers int64 for every Python integer
    and overflows on a uint64 value above 2**63 - 1 (None: that was not it)."""
    if schema is None:
        return None
    names = list(dict.fromkeys(k for r in rows for k in r))
    unsigned = {f.name: f.type for f in schema if pa.types.is_unsigned_integer(f.type)}
    try:
        return pa.table({n: pa.array([r.get(n) for r in rows], type=unsigned.get(n)) for n in names})
    except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return None


def to_arrow_table(data: Any, schema: pa.Schema | None = None, *, keep: Collection[str] | None = None) -> pa.Table:
    """Accept a pyarrow Table / RecordBatch / reader or a list of dicts (a
    blob column's values are its bytes: Lance's writer stores them as blobs).
    With ``schema``, columns missing from the data are NULL; with ``keep``
    too, only those of its names are added (the others are left out: a
    merge's partial update keeps the rows' values there)."""
    schema = logical_schema(schema) if schema is not None else None
    if isinstance(data, pa.Table):
        table = data
    elif isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif isinstance(data, pa.RecordBatchReader):
        table = data.read_all()
    elif type(data).__module__.startswith("pandas") and hasattr(data, "columns") and hasattr(data, "dtypes"):
        try:  # a pandas DataFrame (its index is not a column)
            table = pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise ValueError(f"the DataFrame does not convert to Arrow: {exc}") from exc
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
            table = _unsigned_columns(data, schema)  # (an unsigned column's values above 2**63 - 1)
            if table is None:
                raise _too_wide(((k, v) for r in data for k, v in r.items()), exc) from exc
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            try:
                table = pa.Table.from_pylist(data, schema=schema)
            except OverflowError as exc:
                raise _too_wide(((k, v) for r in data for k, v in r.items()), exc) from exc
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
                raise ValueError(f"rows do not match the table schema: {exc}") from exc
    elif isinstance(data, dict):
        if data and not any(isinstance(v, list | tuple | pa.Array | pa.ChunkedArray) or hasattr(v, "__array__")
                            for v in data.values()):
            raise ValueError("a single row (a dict of values) is not rows: pass a list of dicts, [row]")
        try:
            table = pa.table(data)
        except OverflowError as exc:
            raise _too_wide(((k, v) for k, col in data.items() for v in _values(col)), exc) from exc
    else:
        raise ValueError(
            f"unsupported data of type {type(data).__name__}; pass a pyarrow Table, a pandas DataFrame or a list of dicts"
        )
    if schema is not None and keep is not None:
        schema = pa.schema([f for f in schema if f.name in table.column_names or f.name in keep],
                           metadata=schema.metadata)
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


def vectors_as_lancedb_makes_them(table: pa.Table) -> pa.Table:
    """Rows given without a schema: a column whose name says vector or
    embedding, lists of floats all of one length, becomes a vector column
    (``fixed_size_list<float32>[dim]``), as lancedb's ``create_table`` makes
    it, so it can be indexed and searched. Lists of several lengths stay lists.

    >>> vectors_as_lancedb_makes_them(pa.table({"vector": [[1.0, 2.0], None]})).schema.field("vector").type
    FixedSizeListType(fixed_size_list<item: float>[2])
    >>> vectors_as_lancedb_makes_them(pa.table({"vector": [[1.0], [1.0, 2.0]]})).schema.field("vector").type
    ListType(list<item: double>)
    """
    for i, f in enumerate(table.schema):
        name = f.name.lower()
        if not (("vector" in name or "embedding" in name) and (pa.types.is_list(f.type) or pa.types.is_large_list(f.type))
                and pa.types.is_floating(f.type.value_type)):  # pyright: ignore[reportAttributeAccessIssue]
            continue
        lengths = pc.unique(pc.drop_null(pc.list_value_length(table.column(i))))  # pyright: ignore[reportAttributeAccessIssue]
        if len(lengths) != 1 or lengths[0].as_py() == 0:
            continue
        to = pa.list_(pa.float32(), lengths[0].as_py())
        table = table.set_column(i, pa.field(f.name, to, f.nullable, f.metadata), table.column(i).cast(to))
    return table


def _check_distinct_keys(table: pa.Table, on: list[str]) -> None:
    """A merge matches each new row on ``on``: two new rows with one key would
    both match the same row (Lance refuses an ambiguous merge)."""
    counts = table.group_by(on).aggregate([([], "count_all")])
    twice = counts.filter(pc.greater(counts.column("count_all"), 1))  # pyright: ignore[reportAttributeAccessIssue]
    if twice.num_rows:
        shown = twice.drop_columns(["count_all"]).slice(0, 5).to_pylist()
        raise ValueError(f"merge_insert on {on}: {twice.num_rows} keys are held by more than one new row "
                         f"(e.g. {shown}); each key may appear once")


def check_primary_key(table: pa.Table, pk: str | None) -> None:
    """New rows must have non-NULL, mutually distinct primary key values."""
    if pk is None or table.num_rows == 0:
        return
    col = table.column(pk)
    if col.null_count:
        raise ValueError(f"primary key {pk!r} cannot be NULL")
    if len(pc.unique(col)) != len(col):  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
        raise ValueError(f"duplicate values for primary key {pk!r} in the new rows")


class Table(Indexed):
    """A Lance dataset in a catalog. Plain ``lance.dataset(table.uri)`` opens it too."""

    def __init__(self, connection: Catalog, name: str) -> None:
        self.connection = connection
        self.name = name
        self.uri = connection.table_uri(name)
        self._checked_out: int | None = None  # checkout(version): this handle reads that version, read-only

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, version={self.version})"

    def __len__(self) -> int:
        return self.count_rows()

    def __bool__(self) -> bool:  # a handle is a handle, however many rows it has (len() counts them)
        return True

    def _dataset(self, version: int | None = None) -> lance.LanceDataset:
        if version is None:
            version = self._checked_out
            if version is None:
                try:
                    return objects.dataset(self.uri)
                except (ValueError, OSError):
                    if objects.is_dataset(self.uri):
                        raise
                    raise TableNotFoundError(f"no table or view named {self.name!r} in {self.connection.uri} "
                                             "(dropped since this handle was opened?)") from None
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"a version is an int, got {version!r}")
        return dataset_at(self.uri, self.name, version)  # a cleaned-up or unknown version: said so

    def to_lance(self) -> lance.LanceDataset:
        """lancedb's: the table's Lance dataset, at the version this handle reads
        (read it freely; write through the handle, which keeps views and
        computed columns in step)."""
        return self._dataset()

    def take_blobs(self, indices: "list[int] | pa.Array", column: str) -> list:
        """Geneva's: the values of blob column ``column`` at row positions
        ``indices`` (in the order the table is read), as ``lance.blob.BlobFile``
        file objects, at the version this handle reads (None for a NULL)."""
        ds = self._dataset()
        if column not in ds.schema.names or not is_blob_field(ds.schema.field(column)):
            blobs = [f.name for f in ds.schema if is_blob_field(f)]
            raise ValueError(f"{column!r} is not a blob column of {self.name!r} (blob columns: {blobs})")
        return ds.take_blobs(column, indices=indices)

    # -- versions (Geneva's / lancedb's checkout) --------------------------
    def checkout(self, version: int) -> None:
        """Read ``version`` through this handle from now on (as lancedb's
        ``checkout``): reads (``to_arrow``, ``count_rows``, ``search``,
        ``schema``, ``version``...) see that version, and every write is
        refused until :meth:`checkout_latest` (or :meth:`restore`, which makes
        that version the latest)."""
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"checkout() takes a version number (int), got {version!r}")
        dataset_at(self.uri, self.name, version)  # an unknown or cleaned-up version: said so, nothing changed
        self._checked_out = version
        self._changed()

    def checkout_latest(self) -> None:
        """Follow the latest version again (writes allowed)."""
        self._checked_out = None
        self._changed()

    @property
    def checked_out(self) -> int | None:
        """The version :meth:`checkout` pinned this handle to (None: it follows the latest)."""
        return self._checked_out

    def _index_lock(self):
        """Index changes (create_index, drop_index...) are writes: refused on a checked-out handle."""
        self._require_latest("an index change")
        return super()._index_lock()

    def _require_latest(self, doing: str) -> None:
        """Writes go to the latest version: refused on a checked-out handle."""
        if self._checked_out is not None:
            raise ValueError(
                f"{self.name!r} is checked out at version {self._checked_out} and read-only: {doing} needs the "
                f"latest version; call checkout_latest() first (or restore() to make version {self._checked_out} "
                "the latest)"
            )

    # -- reading ---------------------------------------------------------
    @property
    def version(self) -> int:
        return self._dataset().version

    @property
    def schema(self) -> pa.Schema:
        """The columns a reader sees (with the schema metadata): a view's key
        columns (``__source_row_id``, ``__source_row_version``) and every
        computed column's marker (``__computed__*``) are left out, as Geneva
        shows none; :attr:`stored_schema` has them."""
        full = self._dataset().schema
        return pa.schema([f for f in full if not is_internal_column(f.name)], metadata=full.metadata)

    @property
    def stored_schema(self) -> pa.Schema:
        """The schema as Lance stores it, the engine's internal columns included."""
        return self._dataset().schema

    @property
    def primary_key(self) -> str | None:
        md = self._dataset().schema.metadata or {}
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
        return list(self._dataset().fragment_ids())

    def fragment_count(self) -> int:
        """How many fragments the latest version has (from the manifest, no
        fragment object made: cheaper than ``len(fragment_ids())``)."""
        return int(self._dataset().stats.dataset_stats()["num_fragments"])

    def data_version(self, reads: Collection[str] | None = ()) -> int:
        """The newest version whose commit changed rows (or, with ``reads``,
        backfilled one of those computed columns; None: any column): what a
        reader of the table would notice. Compactions do not move it."""
        return data_version(self.uri, reads=reads)

    def fragment_changes(self, since: int | None, known: set[int] | list[int]) -> FragmentChanges:
        """Fragments added and retired since version ``since``, given the ``known`` ones."""
        return fragment_changes(self.uri, since, known)

    def fragment_data_versions(self, fragments: Collection[int] | None = None, version: int | None = None
                               ) -> dict[int, str]:
        """Each fragment's data version (``fragments``: only these; at
        ``version``, default the latest): it moves when a row of the fragment
        is inserted, updated or deleted, never otherwise (see
        :func:`~mv_assets.storage.changes.fragment_data_versions`)."""
        return fragment_data_versions(self.uri, fragments, version)

    def count_rows(self, filter: str | None = None) -> int:
        ds = self._dataset()
        if filter is not None:
            try:
                check_sql(ds, filter=filter)
            except (ValueError, OSError) as exc:
                raise ValueError(f"invalid filter {filter!r}: {short_error(exc)}") from exc
        return ds.count_rows(filter=filter)

    def to_arrow(self, version: int | None = None, *, with_internal: bool = False,
                 with_markers: bool = False) -> pa.Table:
        """The rows, in the columns of :attr:`schema`; ``with_internal`` (or
        its older name ``with_markers``) adds the engine's columns: a view's
        ``__source_row_id`` / ``__source_row_version`` and the computed
        markers."""
        ds = self._dataset(version)
        if with_internal or with_markers:
            return ds.to_table()
        return ds.to_table(columns=[n for n in ds.schema.names if not is_internal_column(n)])

    def to_pandas(self) -> Any:
        """:meth:`to_arrow` as a pandas DataFrame."""
        return self.to_arrow().to_pandas()

    def head(self, n: int = 5) -> pa.Table:
        """The first ``n`` rows (in the columns of :attr:`schema`)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"head() takes a number of rows >= 0, got {n!r}")
        ds = self._dataset()
        return ds.head(n, columns=[c for c in ds.schema.names if not is_internal_column(c)])

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
        return [dict(v) for v in listed_versions(self._dataset())]

    # -- computed columns ------------------------------------------------
    def _input_dataset(self) -> lance.LanceDataset:
        """Where computed columns read their inputs (a view: its source)."""
        return self._dataset()

    def input_schema(self) -> pa.Schema:
        return self._input_dataset().schema

    def computed_columns(self) -> list[ColumnSpec]:
        """Columns computed by a UDF or SQL expression (see :meth:`add_columns`);
        on a handle checked out at a version, those of that version."""
        ref = self.column_ref()
        if self._checked_out is not None and isinstance(ref, TableRef):
            return stored_columns(self._dataset().schema)  # (its schema's metadata at that version)
        return ref.computed_columns()

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
        self._require_latest("add_columns()")
        self._require_stable_row_ids("computed columns (add_columns)")
        try:
            return add_columns(self.column_ref(), transforms)
        finally:
            self._changed()

    def alter_columns(self, *alterations: dict) -> None:
        """Alter columns, with Geneva's and lancedb's alterations:

        * ``{"path": "col", "udf": new_udf}`` swaps a computed column's UDF.
          Values are not touched: every row computed by the old code becomes
          stale and the next :meth:`backfill` recomputes it;
        * ``{"path": "col", "rename": "new"}`` renames a column of a table (a
          computed column keeps its values, marker and definition);
        * ``{"path": "col", "nullable": True}`` makes a column nullable
          (``False``: not nullable, refused while it holds NULLs).

        All alterations are checked before anything is written: a column a
        view or another computed column reads is not renamed, a view's
        columns are its query's (only its UDFs can be swapped), a type change
        (``data_type``) is refused.
        """
        self._require_latest("alter_columns()")
        udfs = [a for a in alterations if isinstance(a, dict) and "udf" in a]
        schema = [a for a in alterations if isinstance(a, dict) and "udf" not in a]
        for a in schema:
            if "path" not in a or set(a) - SCHEMA_KEYS:
                raise ValueError(
                    f"an alteration is {{'path': column, 'udf': new_udf}} or {{'path': column, 'rename': new_name, "
                    f"'nullable': bool}}, got {a!r}"
                )
        if len(udfs) + len(schema) != len(alterations):
            bad = [a for a in alterations if not isinstance(a, dict)]
            raise ValueError(f"an alteration is {{'path': column, 'udf': new_udf}}, got {bad[0]!r}")
        if udfs and schema:
            raise ValueError("alter_columns(): swap UDFs and rename or relax columns in two calls (nothing was changed)")
        try:
            if schema:
                computed = {c.name for c in self.computed_columns()}
                rename_or_relax_columns(self.column_ref(), schema, self.connection._readers_of(self.name),
                                        computed_only=self._holds_a_query())
                # their error records follow them (a column added again under the old name starts clean)
                from mv_assets.storage.error_log import rename_errors

                rename_errors(self.connection.layout, self.name,
                              {a["path"]: a["rename"] for a in schema if "rename" in a and a["path"] in computed})
            else:
                alter_columns(self.column_ref(), tuple(udfs))  # (none: its error says what an alteration is)
        finally:
            self._changed()

    def _holds_a_query(self) -> bool:
        """Whether the handle's rows are a view's (its columns are its query's)."""
        return False

    def drop_columns(self, columns: str | list[str]) -> int:
        """Drop columns (a computed column goes with its marker and definition);
        returns the new version. Refused, before anything is written, for a
        column a view over the table or another computed column reads (drop
        them in the same call, or first), the primary key, the engine's
        columns, and on a view any column but those added with
        :meth:`add_columns`."""
        self._require_latest("drop_columns()")
        computed = {c.name for c in self.computed_columns()}
        try:
            version = drop_columns(self.column_ref(), columns, self.connection._readers_of(self.name),
                                   computed_only=self._holds_a_query())
        finally:
            self._changed()
        # their error records go with them: a column added again under the name starts clean
        from mv_assets.storage.error_log import drop_errors

        dropped = [columns] if isinstance(columns, str) else list(columns)
        drop_errors(self.connection.layout, self.name, [c for c in dropped if c in computed])
        return version

    def _backfill_options(self, api: str, checkpoint_size: Any, stacklevel: int, **geneva_args: Any
                          ) -> geneva.BackfillOptions:
        """Geneva's backfill parameters as this backfill's options (see
        :func:`geneva.backfill_options`; the column's ``@udf(checkpoint_size=)``
        is its default checkpoint size: :func:`~mv_assets.ops.backfill.plan_backfill`)."""
        return geneva.backfill_options(api, self._dataset, checkpoint_size=checkpoint_size, stacklevel=stacklevel,
                                       **geneva_args)

    def plan_backfill(
        self, col_name: str, *, udf: Any = None, where: str | None = None, read_version: int | None = None,
        num_frags: int | None = None, skip_frags: int = 0, task_size: int | None = None,
        row_ids: list[int] | None = None, checkpoint_size: int | None = None, max_rows_per_task: int = 65_536,
        concurrency: int | None = None, runner: "Runner | None" = None,
    ) -> "BackfillPlan":
        """An exact dry run of :meth:`backfill` with the same arguments: rows,
        tasks, rows whose results an interrupted run already checkpointed (the
        backfill resumes them) and rows to compute. As Geneva's, it also
        answers ``has_work``, ``total_rows_pending`` and ``total_tasks``."""
        self._require_latest("plan_backfill()")
        self._require_stable_row_ids("a backfill")
        opts = self._backfill_options("plan_backfill", checkpoint_size, 5, concurrency=concurrency,
                                      task_size=task_size, num_frags=num_frags, skip_frags=skip_frags,
                                      read_version=read_version)
        return plan_backfill(self.column_ref(), col_name, udf=udf, where=where, row_ids=row_ids,
                             checkpoint_size=opts.checkpoint_size, max_rows_per_task=max_rows_per_task,
                             parallelism=opts.parallelism or self._runner(runner).parallelism(),
                             fragments=opts.fragments, task_size=opts.task_size)

    def backfill(
        self,
        columns: str | list[str],
        *,
        udf: Any = None,
        where: str | None = None,
        concurrency: int | None = None,
        timeout: Any = None,
        min_checkpoint_size: int | None = None,
        max_checkpoint_size: int | None = None,
        batch_checkpoint_flush_interval_seconds: float | None = None,
        job_id: str | None = None,
        commit_granularity: int | None = None,
        read_version: int | None = None,
        batch_size: int | None = None,
        checkpoint_size: int | None = None,
        task_size: int | None = None,
        num_frags: int | None = None,
        skip_frags: int = 0,
        row_ids: list[int] | None = None,
        runner: "Runner | None" = None,
        max_rows_per_task: int = 65_536,
        **geneva_only: Any,
    ) -> "BackfillResult":
        """Compute ``columns`` (one column, or a one-element list) for the rows
        that need it, checkpointed and resumable.

        By default only rows whose value was never computed by the column's
        current UDF (tracked per row: a UDF that returns NULL is not computed
        again; after :meth:`alter_columns` every old row is). ``where`` (SQL)
        picks rows to (re)compute instead; ``row_ids`` limits to stable row
        ids. ``udf`` computes with another UDF of the same type (recorded as
        such per row). UDF columns are computed and written in one
        pass, results checkpointed by time (every ``$MV_ASSETS_CHECKPOINT_SECONDS``,
        default 10 s, of UDF work, or ``batch_checkpoint_flush_interval_seconds``;
        keyed by row id, row version and input markers): a killed backfill run
        again redoes at most that much per task; a view computes the rows whose
        source row is unchanged since its last refresh (the refresh recomputes
        the others). With ``checkpoint_size`` (default: the UDF's
        ``@udf(checkpoint_size=)``; for SQL columns: 65,536) results are
        checkpointed in batches of that many rows and written after: a killed
        backfill redoes at most one batch per task.
        All results are committed in one Lance transaction at the end, or with
        ``commit_granularity`` N once every N fragments. Rows a UDF fails on under
        ``on_error="skip"`` stay NULL and are recorded (:meth:`get_errors`).

        Geneva's parameters: ``concurrency`` is the number of tasks the job is
        cut into; ``task_size`` rows per task; ``num_frags`` / ``skip_frags``
        pick fragments; ``timeout`` (seconds or a timedelta) raises
        ``TimeoutError`` when the job is not over by then (it goes on);
        ``read_version``, ``min_`` / ``max_checkpoint_size`` and the others are
        explained in docs/geneva.md (those that do not apply warn).
        """
        if timeout is not None:  # (a job of its own, waited for: the backfill records itself under its id)
            job_id = job_id or uuid.uuid4().hex[:12]
        run, wait = self._prepare_backfill("backfill", geneva.BACKFILL_IGNORED, columns, geneva_only, dict(
            udf=udf, where=where, concurrency=concurrency, timeout=timeout, min_checkpoint_size=min_checkpoint_size,
            max_checkpoint_size=max_checkpoint_size, job_id=job_id, commit_granularity=commit_granularity,
            batch_checkpoint_flush_interval_seconds=batch_checkpoint_flush_interval_seconds, batch_size=batch_size,
            read_version=read_version, checkpoint_size=checkpoint_size, task_size=task_size, num_frags=num_frags,
            skip_frags=skip_frags, row_ids=row_ids, runner=runner, max_rows_per_task=max_rows_per_task,
        ))
        if wait is None:
            return run()
        job = Job(job_id or uuid.uuid4().hex[:12], run, job_type="backfill", table=self.name,
                  catalog=self.connection.layout.root, column=columns if isinstance(columns, str) else ",".join(columns))
        return job.result(timeout=wait)

    def _prepare_backfill(self, api: str, ignored: dict, columns: Any, geneva_only: dict, a: dict):
        """Check a backfill's arguments (Geneva's mapped, or warned about) and
        return it as a call, with the seconds to wait for it (``timeout``)."""
        self._require_latest(f"{api}()")
        self._require_stable_row_ids("a backfill")
        geneva.accept(api, geneva_only, ignored, stacklevel=4)
        opts = self._backfill_options(
            api, a["checkpoint_size"], 6, concurrency=a["concurrency"], batch_size=a["batch_size"],
            min_checkpoint_size=a["min_checkpoint_size"], max_checkpoint_size=a["max_checkpoint_size"],
            task_size=a["task_size"], num_frags=a["num_frags"], skip_frags=a["skip_frags"],
            read_version=a["read_version"], commit_granularity=a["commit_granularity"],
            batch_checkpoint_flush_interval_seconds=a["batch_checkpoint_flush_interval_seconds"],
        )
        wait = geneva.seconds("timeout", a["timeout"])
        ref, chosen = self.column_ref(), self._runner(a["runner"])
        col = columns[0] if isinstance(columns, list) and len(columns) == 1 else columns
        if not isinstance(col, str):
            raise ValueError("backfill one column at a time (siblings of a multi-column UDF come along)")
        if api == "backfill_async":  # bad input (an unknown column, bad SQL...) raises now, before the job starts
            plan_backfill(ref, col, udf=a["udf"], where=a["where"], row_ids=a["row_ids"],
                          checkpoint_size=opts.checkpoint_size, max_rows_per_task=a["max_rows_per_task"],
                          parallelism=opts.parallelism or chosen.parallelism(), fragments=opts.fragments,
                          task_size=opts.task_size)

        def run() -> "BackfillResult":
            return backfill_column(
                ref, col, udf=a["udf"], where=a["where"], row_ids=a["row_ids"], runner=chosen,
                checkpoint_size=opts.checkpoint_size, max_rows_per_task=a["max_rows_per_task"], job_id=a["job_id"],
                parallelism=opts.parallelism, fragments=opts.fragments, task_size=opts.task_size,
                commit_granularity=opts.commit_granularity, checkpoint_seconds=opts.checkpoint_seconds,
            )

        return run, wait

    def backfill_async(
        self,
        columns: str | list[str],
        *,
        udf: Any = None,
        where: str | None = None,
        concurrency: int | None = None,
        min_checkpoint_size: int | None = None,
        max_checkpoint_size: int | None = None,
        batch_checkpoint_flush_interval_seconds: float | None = None,
        job_id: str | None = None,
        commit_granularity: int | None = None,
        read_version: int | None = None,
        batch_size: int | None = None,
        checkpoint_size: int | None = None,
        task_size: int | None = None,
        num_frags: int | None = None,
        skip_frags: int = 0,
        row_ids: list[int] | None = None,
        runner: "Runner | None" = None,
        max_rows_per_task: int = 65_536,
        **geneva_only: Any,
    ) -> Job:
        """Start :meth:`backfill` (same parameters, Geneva's included) in a
        background thread; returns a :class:`~mv_assets.ops.jobs.Job`:
        ``job_id``, ``status``, ``done(timeout=)``, ``result(timeout=)`` (the
        :class:`BackfillResult`). Bad input raises here, before the job starts
        (the backfill is planned first)."""
        job_id = job_id or uuid.uuid4().hex[:12]
        run, _ = self._prepare_backfill("backfill_async", geneva.BACKFILL_ASYNC_IGNORED, columns, geneva_only, dict(
            udf=udf, where=where, concurrency=concurrency, timeout=None, min_checkpoint_size=min_checkpoint_size,
            max_checkpoint_size=max_checkpoint_size, job_id=job_id, commit_granularity=commit_granularity,
            batch_checkpoint_flush_interval_seconds=batch_checkpoint_flush_interval_seconds, batch_size=batch_size,
            read_version=read_version, checkpoint_size=checkpoint_size, task_size=task_size, num_frags=num_frags,
            skip_frags=skip_frags, row_ids=row_ids, runner=runner, max_rows_per_task=max_rows_per_task,
        ))
        return Job(job_id, run, job_type="backfill", table=self.name, catalog=self.connection.layout.root,
                   column=columns if isinstance(columns, str) else ",".join(columns))

    def refresh_column(self, column: str, *, where: str | None = None, **kwargs: Any) -> "BackfillResult":
        """Bring a computed column up to date (LanceDB's ``refresh_column``):
        without ``where``, the rows never computed or whose inputs or UDF
        changed; with it, every matching row again. It is :meth:`backfill`
        (same parameters)."""
        return self.backfill(column, where=where, **kwargs)

    def refresh_column_async(self, column: str, *, where: str | None = None, **kwargs: Any) -> Job:
        """:meth:`refresh_column` in a background thread (see :meth:`backfill_async`)."""
        return self.backfill_async(column, where=where, **kwargs)

    def load_columns(
        self,
        source: "str | list[str] | pa.Table | pa.RecordBatch | Any",
        pk: str,
        columns: list[str],
        *,
        source_format: str | None = None,
        on_missing: str = "carry",
        job_id: str | None = None,
        **geneva_only: Any,
    ) -> int | None:
        """Load columns from Parquet, Lance or Arrow IPC (a path or URI, or a
        list of them), or from data in memory (a pyarrow Table or RecordBatch,
        a pandas DataFrame), joined by primary key.

        ``on_missing``: ``"carry"`` keeps the value of rows with no match
        (NULL for a new column), ``"null"`` sets it NULL, ``"error"`` raises
        before writing. New columns are added. One commit (recorded as job
        ``job_id``: ``db.list_jobs()``); returns the new version (Geneva
        returns the job id: it is ``job_id``). Geneva's task, checkpoint and
        loader parameters do not apply (it runs here in one pass) and warn.
        """
        self._require_latest("load_columns()")
        geneva.accept("load_columns", geneva_only, geneva.LOAD_IGNORED)
        return self._load_columns(self.ref(), source, pk, columns, source_format=source_format,
                                  on_missing=on_missing, job_id=job_id)

    def _load_columns(self, ref: Ref, *args: Any, **kwargs: Any) -> int | None:
        """Load the columns, then fill the SQL computed columns of the rows
        loaded (as after an update: a SQL column reading a loaded column kept
        its old value, stale, until the next write). The latest version, None
        when nothing changed."""
        version = load_columns(ref, *args, **kwargs)
        if version is not None and any(c.kind == "sql" for c in self.computed_columns()):
            return self._fill_sql_columns(written=version) or version
        return version

    def load_columns_async(
        self, source: "str | list[str] | pa.Table | pa.RecordBatch | Any", pk: str, columns: list[str], *,
        source_format: str | None = None, on_missing: str = "carry", job_id: str | None = None, **geneva_only: Any,
    ) -> Job:
        """:meth:`load_columns` in a background thread; returns a job whose
        ``result()`` is the new version. Geneva's parameters as there."""
        self._require_latest("load_columns_async()")
        geneva.accept("load_columns_async", geneva_only, geneva.LOAD_ASYNC_IGNORED)
        job_id = job_id or uuid.uuid4().hex[:12]
        ref = self.ref()
        return Job(job_id, self._load_columns, (ref, source, pk, columns),
                   {"source_format": source_format, "on_missing": on_missing, "job_id": job_id},
                   job_type="load_columns", table=self.name, catalog=self.connection.layout.root, column=",".join(columns) if isinstance(columns, list)
                   else None)

    def get_errors(
        self, job_id: str | None = None, column_name: str | None = None, error_type: str | None = None
    ) -> list["ErrorRecord"]:
        """Error records of this table's UDF rows, filtered by job, column, exception type."""
        return read_errors(self.connection.layout, self.name, job_id=job_id, column=column_name, error_type=error_type)

    def get_failed_row_ids(self, column: str, job_id: str | None = None) -> list[int]:
        """Stable row ids whose ``column`` failed and is still not computed.

        Ids stay valid across compaction (for a view: its source row ids).
        A ``column`` that is no computed column is refused (the arguments
        given as :meth:`get_failed_row_addresses` takes them, job id first,
        read as "nothing failed").
        """
        known = [c.name for c in self.computed_columns()] + [n for n in [self._function_name()] if n]
        if column not in known:
            raise ValueError(f"{self.name!r} has no computed column {column!r} (its computed columns: {known}); "
                             "get_failed_row_ids takes (column, job_id=None)")
        if self._function_name() == column:  # a chunk or table-function view's function
            return self._function_failing(sorted({e.row_id for e in self.get_errors(job_id=job_id,
                                                                                    column_name=column)}))
        errors = self.get_errors(job_id=job_id, column_name=column)
        failed_at: dict[int, int] = {}
        for e in errors:
            if e.row_version is not None:
                failed_at[e.row_id] = max(failed_at.get(e.row_id, 0), int(e.row_version))
        return self._still_failing(column, sorted({e.row_id for e in errors}), failed_at)

    def _still_failing(self, column: str, ids: list[int], failed_at: dict[int, int] | None = None) -> list[int]:
        """Of the stable row ids ``column`` failed on, those still not computed.
        ``failed_at``: the newest row version each failed at (a view still
        holding a value of an older version of that row, its source row at
        the version that failed, is still failing)."""
        if not ids:
            return []
        spec = _group_specs(self.column_ref(), column)[0]
        is_view = isinstance(self.column_ref(), ViewRef)  # a view's values follow its source rows
        id_col = SOURCE_ROW_ID if is_view else "_rowid"
        still = self._dataset().scanner(
            # (a filter on the row version needs it projected: Lance 14 errs after compaction otherwise)
            columns={Alias.KEY: id_col} if is_view else {Alias.ROW_VERSION: "_row_last_updated_at_version"},
            filter=f"({id_col} IN ({', '.join(map(str, ids))})) AND {stale_sql(column, spec.fingerprint, versioned=not is_view)}",
            with_row_id=id_col == "_rowid",
        ).to_table()
        failing = {int(i) for i in still.column(Alias.KEY if id_col != "_rowid" else "_rowid").to_pylist()}
        if is_view:
            failing |= self._never_computed(ids)
            failing |= self._held_behind_failure(failed_at or {})
        return sorted(failing)

    def _held_behind_failure(self, failed_at: dict[int, int]) -> set[int]:
        """Of source row ids a view's UDF failed on at the row versions
        ``failed_at``, those the view holds at an older version while the
        source row is still at the version that failed: the refresh that
        failed committed nothing, so the view kept the value of the row as
        it was (they read as fixed). Views of one row per source row of one table."""
        if not failed_at or not isinstance(self, MaterializedView):
            return set()
        definition = self.definition
        if len(definition.sources) != 1 or not kind_of(definition).row_per_source_row:
            return set()
        listed = ", ".join(map(str, failed_at))
        held = self._dataset().to_table(columns=[SOURCE_ROW_ID, SOURCE_ROW_VERSION],
                                        filter=f"{SOURCE_ROW_ID} IN ({listed})")
        behind = [int(i) for i, v in zip(held.column(SOURCE_ROW_ID).to_pylist(),
                                         held.column(SOURCE_ROW_VERSION).to_pylist(), strict=True)
                  if v is not None and int(v) < failed_at[int(i)]]
        if not behind:
            return set()
        now = self.ref().source_dataset().to_table(
            columns={Alias.ROW_VERSION: "_row_last_updated_at_version"}, with_row_id=True,
            filter=f"_rowid IN ({', '.join(map(str, behind))})")
        return {int(i) for i, v in zip(now.column("_rowid").to_pylist(), now.column(Alias.ROW_VERSION).to_pylist(),
                                       strict=True) if v is not None and int(v) == failed_at[int(i)]}

    def recompute_where(self, column: str) -> str | None:
        """The rows a recompute of ``column`` after its code changed takes
        (what Dagster runs of its asset compute), as a ``where`` for
        :meth:`plan_backfill` / :meth:`backfill`: every row not computed by
        its current code, but those whose last attempt under that code failed
        (``on_error="skip"``: they are retried by :meth:`retry_errors`, not by
        every run); None when there are none (the default rows). A row whose
        value another code computed keeps it through a failure (a job the
        failure stopped): it is taken."""
        spec = _group_specs(self.column_ref(), column)[0]
        policy = getattr(spec.udf, "on_error", None)
        if policy is None or not policy.may_skip:
            return None
        ids = self._still_failing(column, sorted({e.row_id for e in self.get_errors(column_name=column)
                                                  if e.udf_fingerprint == spec.fingerprint}))
        if not ids:
            return None
        is_view = isinstance(self.column_ref(), ViewRef)
        id_col = SOURCE_ROW_ID if is_view else "_rowid"
        marker = quote_ident(computed_marker(column))
        return (f"{stale_sql(column, spec.fingerprint, versioned=not is_view)} "
                f"AND NOT ({marker} IS NULL AND {id_col} IN ({', '.join(map(str, ids))}))")

    def rows_never_computed(self, column: str, where: str | None = None) -> int:
        """Of the rows ``where`` selects (None: every row), those whose
        ``column`` no code has computed (its marker NULL: rows there before the
        column was added, or whose every attempt failed)."""
        marker = quote_ident(computed_marker(column))
        return self.count_rows(f"{marker} IS NULL" if where is None else f"({where}) AND {marker} IS NULL")

    def _function_name(self) -> str | None:
        """The name of a chunk or table-function view's function (its errors are recorded under it)."""
        if not isinstance(self, MaterializedView) or not self.definition.function:
            return None
        return self.definition._function_spec.get("name")

    def _function_failing(self, ids: list[int]) -> list[int]:
        """Of source row ids the view's function failed on, those still failing.
        A chunk view's parent: its source row still there (passing the filter)
        and no chunk of it held. A table-function view's (no row of its own per
        source row): all of them while its last refresh failed."""
        if not ids or not isinstance(self, MaterializedView):
            return []
        if not kind_of(self.definition).children:
            return ids if self.status().load_state == "FAILED_LOAD" else []
        return sorted(self._unheld_but_passing(ids))

    def _never_computed(self, ids: list[int]) -> set[int]:
        """Of source row ids a view's UDF failed on, those the view does not hold
        though its source still has them, passing its filter: a refresh that
        failed on them (``on_error="fail"``) committed nothing, so they are not
        in the view, which is not their being fixed (a row deleted or no longer
        passing the filter is). Views of one row per source row of one table."""
        if not isinstance(self, MaterializedView):
            return set()
        definition = self.definition
        if len(definition.sources) != 1 or not kind_of(definition).row_per_source_row:
            return set()
        return self._unheld_but_passing(ids)

    def _unheld_but_passing(self, ids: list[int]) -> set[int]:
        """Of source row ids, those the view holds no row of while its source
        still has them, passing its filter."""
        assert isinstance(self, MaterializedView)
        listed = ", ".join(map(str, ids))
        held = self._dataset().to_table(columns=[SOURCE_ROW_ID], filter=f"{SOURCE_ROW_ID} IN ({listed})")
        missing = sorted(set(ids) - {int(i) for i in held.column(SOURCE_ROW_ID).to_pylist()})
        if not missing:
            return set()
        where, flt = f"_rowid IN ({', '.join(map(str, missing))})", self.definition.filter
        alive = self.ref().source_dataset().to_table(columns=[], with_row_id=True,
                                                      filter=f"({where}) AND ({flt})" if flt else where)
        return {int(i) for i in alive.column("_rowid").to_pylist()}

    def get_failed_row_addresses(self, job_id: str | None, column_name: str) -> list[int]:
        """Row addresses (``_rowaddr``) of the rows whose ``column_name`` the
        job ``job_id`` (None: any job) failed on and that are still not
        computed, as Geneva answers it: retry with
        ``backfill(column, where=f"_rowaddr IN ({','.join(map(str, addrs))})")``.

        Answered from the errors' stable row ids (:meth:`get_failed_row_ids`),
        looked up at the latest version: the ids survive compaction, addresses
        do not, so use these addresses at once (or keep the ids)."""
        ids = self.get_failed_row_ids(column_name, job_id)
        if not ids:
            return []
        id_col = SOURCE_ROW_ID if isinstance(self.column_ref(), ViewRef) else "_rowid"
        rows = self._dataset().scanner(
            columns={Alias.KEY: id_col} if id_col != "_rowid" else [], with_row_id=id_col == "_rowid",
            with_row_address=True, filter=f"{id_col} IN ({', '.join(map(str, ids))})",
        ).to_table()
        return sorted(int(a) for a in rows.column("_rowaddr").to_pylist())

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

    def check_columns(self, columns: list[str] | None = None) -> dict[str, list[CheckOutcome]]:
        """The checks of this table's computed columns (a chunk view's columns
        computed from its rows too), per column: ``values_current`` (no stale
        row: never computed, failed, computed by older code, or whose inputs
        were written since, by any tool) and, for UDF columns,
        ``no_failed_rows`` (see :func:`mv_assets.ops.checks.check_computed_columns`).
        A query view's UDF columns follow its source rows: :meth:`check` covers them."""
        ref = self.column_ref()
        if not isinstance(ref, TableRef):
            raise ValueError(f"{self.name!r} is a view whose columns follow its source rows: use check()")
        return check_computed_columns(ref, columns)

    def retry_errors(self, column: str, job_id: str | None = None, **kwargs: Any) -> "BackfillResult":
        """Backfill just the rows whose ``column`` failed (one call; works after compaction)."""
        return self.backfill(column, row_ids=self.get_failed_row_ids(column, job_id), **kwargs)

    # -- writing ---------------------------------------------------------
    def _check_writable(self) -> None:
        pass

    def _new_rows(self, data: Any, keep: Collection[str] | None = None) -> tuple[lance.LanceDataset, pa.Table]:
        """The dataset and ``data`` as rows of it, checked: no values for markers,
        primary key present and distinct among the new rows. ``keep``: see
        :func:`to_arrow_table` (columns the data leaves out are left out but these)."""
        ds = self._dataset()
        table = to_arrow_table(data, ds.schema, keep=keep)
        given = [n for n in table.column_names if is_marker(n) and table.column(n).null_count < table.num_rows]
        if given:
            raise ValueError(f"columns {given} are maintained by mv_assets; leave them out")
        check_primary_key(table, self.primary_key)
        return ds, table

    @objects.reusing_handles()
    def add(self, data: Any, mode: str = "append", **geneva_only: Any) -> int:
        """Append rows (a pyarrow Table or batches, a pandas DataFrame, a list
        of dicts); returns the new version. ``mode="overwrite"`` replaces every
        row with ``data`` instead (views over the table then rebuild on their
        next refresh: row ids do not carry over an overwrite; computed columns
        are computed again by the next backfill)."""
        self._require_latest("add()")
        self._check_writable()
        geneva.accept("add", geneva_only, geneva.ADD_IGNORED)
        if mode not in ("append", "overwrite"):
            raise ValueError(f"add() mode is 'append' or 'overwrite', got {mode!r}")
        ds, table = self._new_rows(data)
        if mode == "overwrite":
            version = objects.write_dataset(table, self.uri, schema=ds.schema, mode="overwrite").version
            return self._fill_sql_columns() or version
        if table.num_rows == 0:
            return ds.version
        pk = keys.primary_key(ds)
        if pk is not None:
            taken = self._existing_keys(ds, pk, table)
            if taken:
                shown = taken[:10]
                raise ValueError(
                    f"primary key {pk!r}: {len(taken)} of the new rows already exist in {self.name!r} "
                    f"(keys {shown}{' ...' if len(taken) > 10 else ''}); nothing was added. "
                    "Use merge_insert() to insert or update by key"
                )
        return self._after_write(objects.write_dataset(table, self.uri, mode="append"), table)

    def _existing_keys(self, ds: lance.LanceDataset, pk: str, table: pa.Table) -> list:
        """Which primary keys of the new rows ``table`` already has, looked up
        through the key index (built first when the table is big enough and
        has none: storage.keys), O(rows added), not O(table)."""
        ds = keys.ready(self.uri, ds, pk)
        return keys.existing_keys(self.uri, ds, pk, table.column(pk).combine_chunks())

    def _after_write(self, written: lance.LanceDataset, appended: pa.Table | None = None) -> int:
        """After rows were written (``written``: the version that made;
        ``appended``: the rows, when it was an append): their keys kept for
        the next look-ups while their fragment is outside the key index, SQL
        computed columns filled in for them, the primary key index brought up
        to date when the rows outside it grew past what a look-up should scan
        (storage.keys, lazily; a commit of its own then). The latest version."""
        pk = keys.primary_key(written)
        if appended is not None and pk is not None:  # (the version the append made: nothing opened again)
            keys.remember_written(self.uri, written, pk, appended.column(pk).combine_chunks())
        # (its commits bring the key index up to date themselves; the schema the write left says whether any)
        filled = (self._fill_sql_columns(written=written.version)
                  if any(c.kind == "sql" for c in stored_columns(written.schema)) else None)
        if filled is not None:
            return filled
        return written.version if keys.upkeep(self.uri, written) is None else self.version

    @property
    def primary_key_index(self) -> "keys.KeyIndex | None":
        """How the primary key is looked up (None: no primary key): through
        its BTREE index (the rows it covers, the rows outside it that each
        look-up scans until the index takes them in) or, with none yet (a
        table under ``storage.keys.KEY_INDEX_MIN_ROWS`` rows), by a scan of the
        key column. ``str()`` of it is one line of status."""
        return keys.key_index(self._dataset(), self.uri)

    @overload
    def merge_insert(  # pyright: ignore[reportOverlappingOverload]  (a name or names: the builder)
        self, data: "str | list[str] | tuple[str, ...]") -> "MergeInsertBuilder": ...

    @overload
    def merge_insert(self, *, on: "str | list[str] | tuple[str, ...]") -> "MergeInsertBuilder": ...

    @overload
    def merge_insert(self, data: Any) -> int: ...

    def merge_insert(self, data: Any = None, *, on: Any = None) -> "int | MergeInsertBuilder":
        """Upsert by primary key: rows whose key exists replace that row's
        values (the row keeps its stable row id, so views see an update),
        the others are added. Computed columns of replaced rows become stale
        and are recomputed by the next backfill. Returns the new version.

        ``merge_insert("id")`` (a column name, or a list of them) is lancedb's
        (and so Geneva's) builder instead: ``.when_matched_update_all(where=)``,
        ``.when_not_matched_insert_all()``, ``.when_not_matched_by_source_delete()``,
        then ``.execute(new_data)`` (see :class:`MergeInsertBuilder`); ``on=`` names them as lancedb's keyword.
        """
        if on is not None:
            if data is not None:
                raise ValueError("merge_insert: give the rows, or on= (the columns to match, for the builder), not both")
            if not (isinstance(on, str) or (isinstance(on, list | tuple) and on and all(isinstance(c, str) for c in on))):
                raise ValueError(f"merge_insert(on=...) takes a column name or a list of them, got {on!r}")
            data = on
        if data is None:
            raise ValueError("merge_insert needs rows (an upsert by primary key) or the columns to match on (the builder)")
        if isinstance(data, str) or (isinstance(data, list | tuple) and data
                                     and all(isinstance(c, str) for c in data)):
            return MergeInsertBuilder(self, [data] if isinstance(data, str) else list(data))
        pk = self.primary_key
        if pk is None:
            self._require_latest("merge_insert()")
            self._check_writable()
            raise ValueError(f"merge_insert needs a primary key; {self.name!r} was created without one")
        return self._merge([pk], data, update=True, update_where=None, insert=True, delete=False,
                           delete_where=None).version

    @objects.reusing_handles()
    def _merge(self, on: list[str], data: Any, *, update: bool, update_where: str | None, insert: bool,
               delete: bool, delete_where: str | None) -> "MergeInsertResult":
        """One Lance merge_insert of ``data`` on ``on`` with the clauses asked for."""
        self._require_latest("merge_insert()")
        self._check_writable()
        if not (update or insert or delete):
            raise ValueError("merge_insert: no when_... clause was given, so there is nothing to do")
        # columns the new rows leave out keep their values in matched rows (lancedb's partial
        # update): only computed columns and their markers are set NULL there (stale, as updated)
        computed = {c.name for c in self.computed_columns()}
        ds, table = self._new_rows(data, keep={n for n in self._dataset().schema.names
                                               if is_marker(n) or n in computed})
        unknown = [c for c in on if c not in ds.schema.names or c not in table.column_names]
        if unknown:
            raise ValueError(f"merge_insert on {unknown}: not columns of both {self.name!r} and the new rows")
        pk = self.primary_key
        if pk is not None and on != [pk]:
            raise ValueError(f"merge_insert on {on}: {self.name!r} has the primary key {pk!r}; rows are matched "
                             "by it (a match on other columns could give two rows one key)")
        if table.num_rows == 0 and not delete:
            return MergeInsertResult(ds.version, 0, 0, 0, 0)
        absent = [f.name for f in ds.schema if f.name not in table.column_names and not f.nullable]
        if insert and absent:
            raise ValueError(f"merge_insert: the new rows leave out {absent}, which cannot be NULL: rows inserted "
                             "need them (give them, or update only: when_matched_update_all() alone)")
        if pk is None and table.num_rows > 1:
            _check_distinct_keys(table, on)
        if pk is not None and not delete:
            ds = keys.ready(self.uri, ds, pk)  # (Lance's merge_insert reads the key index too)
            if insert and not self._existing_keys(ds, pk, table):
                # no key matches a row: every row is inserted, an append (O(rows), where Lance's
                # merge_insert of a table with deletions costs O(table): docs/performance.md)
                table = to_arrow_table(table, ds.schema)  # (the columns left out: NULL)
                version = self._after_write(objects.write_dataset(table, self.uri, mode="append"), table)
                return MergeInsertResult(version, 0, table.num_rows, 0, table.num_rows)
        builder = ds.merge_insert(on[0] if len(on) == 1 else on)
        if update:
            builder = builder.when_matched_update_all(update_where)
        if insert:
            builder = builder.when_not_matched_insert_all()
        if delete:
            builder = builder.when_not_matched_by_source_delete(delete_where)
        try:
            stats = builder.execute(table)
        except OSError as exc:  # (Lance's words for a where naming no column, say)
            raise ValueError(f"merge_insert into {self.name!r} failed: {short_error(exc)}") from exc
        version = self._after_write(self._dataset())
        return MergeInsertResult(version, int(stats.get("num_updated_rows", 0)), int(stats.get("num_inserted_rows", 0)),
                                 int(stats.get("num_deleted_rows", 0)), table.num_rows)

    def _fill_sql_columns(self, written: int | None = None) -> int | None:
        """Compute SQL computed columns for rows that lack them (after add/update,
        committed already). Rows the expression fails on (a cast that does not
        hold for their values) are left out, stale, with a warning naming
        them: the write is not reported failed after its commit (a retry would
        add the rows twice), and the rows written next are filled still.
        ``written``: the version the write made; the warning names only rows
        it wrote (a row that failed before is tried again, and stays stale
        without a word: it was not this write's)."""
        version = None
        for c in self.computed_columns():
            if c.kind != "sql":
                continue
            try:
                result = self.backfill(c.name, runner=InlineRunner())
            except SqlRowsError as exc:
                mine = exc.rows if written is None else self._rows_written_since(exc.rows, written)
                if mine:
                    warnings.warn(sql_failure_text(self.name, c, SqlRowsError(str(exc), mine, exc.error))
                                  + " The write itself was committed.", stacklevel=3)
                with self.column_ref().lock():
                    version = fill_sql_rows(self.column_ref(), c, exc.rows) or version
                continue
            version = result.version or version
        return version

    def _rows_written_since(self, row_ids: list[int], version: int) -> list[int]:
        """Those of ``row_ids`` written (added or updated) at ``version`` or later."""
        got = self._dataset().to_table(columns=["_row_last_updated_at_version"], with_row_id=True,
                                       filter=f"_rowid IN ({', '.join(str(int(i)) for i in row_ids)})")
        at = got.column("_row_last_updated_at_version").to_numpy()
        return sorted(int(i) for i, v in zip(got.column("_rowid").to_pylist(), at, strict=True) if v >= version)

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
        self._require_latest("delete()")
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
        self._require_latest("update()")
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
                if not ds.schema.field(name).nullable:
                    raise ValueError(f"column {name!r} is not nullable: it cannot be set to NULL")
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
        if values_sql is not None:
            _check_sql_values_fit(ds, updates, where)
        ref = self.ref()
        assert isinstance(ref, TableRef)  # views refuse writes (_check_writable)
        updated = update_rows(ref, updates, self._stale_markers(set(updates)), where)
        return self._fill_sql_columns(written=updated) or self.version

    def optimize(self, *, cleanup_older_than: timedelta | None = None, delete_unverified: bool = False,
                 target_rows_per_fragment: int | None = None) -> int:
        """Compact small fragments (row ids and row versions are kept), then,
        given ``cleanup_older_than``, remove versions older than that
        (``delete_unverified``: also files that no version references and
        that are younger than 7 days, which a writer still running may be
        about to commit: only when nothing else writes). Returns the new version."""
        self._require_latest("optimize()")
        if delete_unverified and cleanup_older_than is None:
            geneva.warn("optimize", "delete_unverified", delete_unverified, "it applies to the cleanup of old "
                        "versions, which optimize() runs only when given cleanup_older_than")
        self._compact(**({"target_rows_per_fragment": target_rows_per_fragment} if target_rows_per_fragment else {}))
        if cleanup_older_than is not None:
            self._cleanup(cleanup_older_than, delete_unverified)
        return self.version

    def compact_files(self, **options: Any) -> Any:
        """Compact small fragments (Lance's ``compact_files`` options:
        ``target_rows_per_fragment``, ``materialize_deletions``...); row ids
        and row versions are kept, views see no change. Returns Lance's
        compaction metrics."""
        self._require_latest("compact_files()")
        return self._compact(**options)

    @property
    def compaction_policy(self) -> CompactionPolicy | None:
        """When the runs of the table's lineage compact it (None: never; see
        :meth:`set_compaction_policy`)."""
        return CompactionPolicy.from_json(self._dataset().config().get(COMPACTION_CONFIG_KEY))

    def set_compaction_policy(self, max_fragments: int | None, *, target_rows_per_fragment: int = 1 << 20) -> None:
        """Compact the table once it has more than ``max_fragments``
        fragments (``None``: never, the default): the Dagster runs of its
        lineage do it after their refreshes (:meth:`compact_if_due`), and the
        sensor then retires the partitions of the fragments merged. For a
        table that grows by many small appends: Dagster allows 100,000
        dynamic partitions per asset (docs/dagster.md). A config-only commit:
        no view sees a change."""
        self._require_latest("set_compaction_policy()")
        ds = self._dataset()
        if max_fragments is None:
            if COMPACTION_CONFIG_KEY in ds.config():
                ds.delete_config_keys([COMPACTION_CONFIG_KEY])
            return
        policy = CompactionPolicy(max_fragments, target_rows_per_fragment)  # validated before anything is written
        ds.update_config({COMPACTION_CONFIG_KEY: policy.to_json()})

    def fragments_warning(self, fragments: int | None = None) -> str | None:
        """What to say when the table has more than half Dagster's 100,000
        dynamic partitions per asset in fragments (``fragments``: its count,
        when known); None below that."""
        n = self.fragment_count() if fragments is None else fragments
        if n <= FRAGMENT_WARNING:
            return None
        policy = self.compaction_policy
        said = (f"{self.name!r} has {n:,} fragments, each a partition of the views over it (Dagster allows "
                f"{DAGSTER_PARTITION_LIMIT:,} dynamic partitions per asset): ")
        if policy is not None and policy.due(n):
            return said + (f"its compaction policy (over {policy.max_fragments:,} fragments) compacts it in the next "
                           "run of its lineage, and the sensor then retires the partitions of the fragments merged")
        return said + ("compact it (table.optimize()) or set a compaction policy "
                       "(table.set_compaction_policy(max_fragments=...)); see docs/dagster.md")

    def compact_if_due(self) -> bool:
        """Compact the table if its compaction policy says so (more fragments
        than its ``max_fragments``). Returns whether it did."""
        policy = self.compaction_policy
        if policy is None or not policy.due(self.fragment_count()):
            return False
        self._require_latest("compact_if_due()")
        self._compact(target_rows_per_fragment=policy.target_rows_per_fragment)
        return True

    def cleanup_old_versions(self, older_than: timedelta | None = None, *, delete_unverified: bool = False) -> Any:
        """Remove versions older than ``older_than`` (Lance's default: 2
        weeks) and the files only they use; returns Lance's cleanup stats.
        Views over the table then recompute what they can no longer read from
        its history (a view that reflects a removed version refreshes fully)."""
        self._require_latest("cleanup_old_versions()")
        return self._cleanup(older_than, delete_unverified)

    def restore(self, version: int | None = None) -> int:
        """Make ``version`` (default: the version this handle is checked out
        at) the latest, as a new version: its rows, schema and computed
        columns' definitions come back. The handle follows the latest again.
        Views over a table notice the restore and rebuild on their next
        refresh. Returns the new version."""
        self._check_restorable()  # (a view refuses it whatever it is given)
        target = version if version is not None else self._checked_out
        if target is None:
            raise ValueError("restore() needs a version, or a handle checked out at one (checkout(version))")
        dataset_at(self.uri, self.name, target).restore()  # an unknown or cleaned-up version: said so
        self._checked_out = None
        self._changed()
        return self.version

    def _check_restorable(self) -> None:
        pass

    def _compact(self, **options: Any) -> Any:
        ds = self._dataset()
        metrics = ds.optimize.compact_files(**options)
        objects.committed_in_place(self.uri, ds)  # (what a refresh over the table reads next: not read again)
        self._catch_up_indexes(consolidate=True)
        return metrics

    def _cleanup(self, older_than: timedelta | None, delete_unverified: bool) -> Any:
        return self._dataset().cleanup_old_versions(older_than=older_than, delete_unverified=delete_unverified)

    def _catch_up_indexes(self, consolidate: bool = False) -> None:
        from mv_assets.storage.indexes import catch_up

        with objects.reusing_handles():
            catch_up(self.uri, consolidate=consolidate)


@dataclass(frozen=True)
class MergeInsertResult:
    """What :meth:`MergeInsertBuilder.execute` did (lancedb's ``MergeResult`` fields)."""

    version: int
    num_updated_rows: int
    num_inserted_rows: int
    num_deleted_rows: int
    num_rows: int  # rows given


class MergeInsertBuilder:
    """lancedb's ``table.merge_insert(on)`` builder, as Geneva programs use it::

        tbl.merge_insert("id").when_not_matched_insert_all().execute(new_rows)  # insert only
        tbl.merge_insert("id").when_matched_update_all().execute(rows)          # update only
        tbl.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(rows)

    ``on`` is the table's primary key where it has one (any columns where it
    has none). Updated rows keep their stable row ids (views see updates) and
    their computed columns read as stale until the next backfill, as with
    ``merge_insert(data)``. ``execute``'s ``on_bad_vectors`` / ``fill_value``
    are ``add()``'s: accepted, with a warning when not the default.
    """

    def __init__(self, table: Table, on: list[str]) -> None:
        self._table, self._on = table, on
        self._update, self._update_where = False, None
        self._insert = False
        self._delete, self._delete_where = False, None

    def when_matched_update_all(self, *, where: str | None = None) -> "MergeInsertBuilder":
        """Rows whose key matches take the new row's values (``where``: only those
        matching it, ``target.`` / ``source.`` prefixed columns)."""
        self._update, self._update_where = True, where
        return self

    def when_not_matched_insert_all(self) -> "MergeInsertBuilder":
        """New rows whose key matches no row are inserted."""
        self._insert = True
        return self

    def when_not_matched_by_source_delete(self, condition: str | None = None) -> "MergeInsertBuilder":
        """Rows of the table that no new row matches are deleted (``condition``: only those matching it)."""
        self._delete, self._delete_where = True, condition
        return self

    def execute(self, new_data: Any, on_bad_vectors: str = "error", fill_value: float = 0.0,
                timeout: timedelta | None = None) -> MergeInsertResult:
        """Run the merge: one commit; returns its :class:`MergeInsertResult`."""
        geneva.accept("merge_insert().execute", {"on_bad_vectors": on_bad_vectors, "fill_value": fill_value},
                      geneva.ADD_IGNORED)
        if timeout is not None:
            geneva.warn("merge_insert().execute", "timeout", timeout, "the merge is one Lance commit, not cancelled")
        return self._table._merge(self._on, new_data, update=self._update, update_where=self._update_where,
                                  insert=self._insert, delete=self._delete, delete_where=self._delete_where)


def _check_sql_values_fit(ds: lance.LanceDataset, updates: dict[str, str], where: str | None) -> None:
    """``update(values_sql=)``: an expression whose values do not fit its
    column exactly (``7.9`` into an integer column) is refused, as a Python
    value is, before anything is written (Lance casts it: 7 was stored). Only
    expressions whose type is not the column's are read, over the rows
    ``where`` matches."""
    exprs = {f"v{i}": (name, expr) for i, (name, expr) in enumerate(updates.items())}
    # (Lance refuses a scan of literals alone: the row id is read beside them)
    typed = ds.scanner(columns={k: e for k, (_, e) in exprs.items()}, filter=where,
                       with_row_id=True).projected_schema
    other = {k: v for k, v in exprs.items() if typed.field(k).type != ds.schema.field(v[0]).type}
    if not other:
        return
    got = ds.scanner(columns={k: e for k, (_, e) in other.items()}, filter=where, with_row_id=True).to_table()
    for k, (name, expr) in other.items():
        try:
            got.column(k).cast(ds.schema.field(name).type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError) as exc:
            raise ValueError(f"values_sql {name!r}: {expr!r} gives values that do not fit column {name!r} "
                             f"({ds.schema.field(name).type}) exactly: {exc}") from exc


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
            raw = self._raw_definition or (self._dataset().schema.metadata or {}).get(VIEW_METADATA_KEY.encode())
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
        raw = (self._dataset().schema.metadata or {}).get(VIEW_METADATA_KEY.encode())
        if raw is None:
            raise ValueError(f"{self.name!r} is not a materialized view")
        return json.loads(raw)["source"]

    def column_ref(self) -> "Ref":
        """A chunk view's added columns are computed from its own rows, as a
        table's are (markers follow the rows' versions, stored in the schema
        metadata): a refresh adds children stale, a backfill computes them.
        A query view's columns follow its source rows (its ``ref()``)."""
        if kind_of(self.definition).children:
            return TableRef(self.name, self.uri, self.connection.layout)
        return self.ref()

    def _input_dataset(self) -> lance.LanceDataset:
        if kind_of(self.definition).children:
            return self._dataset()
        return self.connection.open_table(self.definition.source)._dataset()

    def _changed(self) -> None:
        self._definition = self._raw_definition = None

    def _check_writable(self) -> None:
        raise ValueError(
            f"{self.name!r} is a materialized view: its rows are maintained by refresh(); "
            "change the source table instead"
        )

    def _check_restorable(self) -> None:
        raise ValueError(
            f"{self.name!r} is a materialized view: its rows are maintained by refresh() and restore() is refused "
            "(the next refresh would rebuild it from its source anyway); checkout(version) reads an older version, "
            "or restore the source table"
        )

    def _holds_a_query(self) -> bool:
        return True

    def refresh_state(self) -> RefreshState:
        return read_refresh_state(self._dataset())

    # Compaction and cleanup (optimize, compact_files, cleanup_old_versions):
    # the refresh state (source version, load number, definition) lives in the
    # view's refresh commits; before anything can remove them, it is carried
    # to the newest commit (a config-only commit that changes no rows), so it
    # survives compaction and cleanup. Both hold the view's refresh lock.
    def _compact(self, **options: Any) -> Any:
        with self.connection._refresh_lock(self.name, 600.0):
            metrics = super()._compact(**options)
            carry_refresh_state(self._dataset())
            return metrics

    def _cleanup(self, older_than: timedelta | None, delete_unverified: bool) -> Any:
        with self.connection._refresh_lock(self.name, 600.0):
            carry_refresh_state(self._dataset())
            return super()._cleanup(older_than, delete_unverified)

    @property
    def source_version(self) -> int | None:
        """The source version the view reflects (None before the first refresh)."""
        return self.refresh_state().source_version

    @property
    def sources(self) -> list[str]:
        """Every table or view the view reads, its source first (a join view's
        every table); read from the stored JSON, no UDF unpickled."""
        if self._definition is not None:
            return self._definition.sources
        raw = (self._dataset().schema.metadata or {}).get(VIEW_METADATA_KEY.encode())
        if raw is None:
            raise ValueError(f"{self.name!r} is not a materialized view")
        return kind_of(json.loads(raw)).sources_of(json.loads(raw))

    @property
    def source_versions(self) -> dict[str, int]:
        """The version of every source the view reflects, by name ({} before
        the first refresh): a join view's sources, else its one source."""
        state = self.refresh_state()
        if state.sources:  # (a join aggregate's: its tables, not the join kept under it)
            return {n: v for n, v in state.sources.items() if not is_join_under(n)}
        return {} if state.source_version is None else {self.source: state.source_version}

    @objects.reusing_handles()
    def plan_refresh(
        self, *, src_version: int | None = None, mode: str = "auto", fragments: list[int] | None = None,
        recompute: list[str] | None = None, max_rows_per_task: int | None = None, checkpoint_size: int | None = None,
        runner: "Runner | None" = None, concurrency: int | None = None, max_rows_per_fragment: int | None = None,
    ) -> RefreshPlan:
        """An exact dry run of :meth:`refresh` with the same arguments: rows to
        insert, update and delete, UDF rows to compute, the tasks. As Geneva's,
        it also answers ``has_work``, ``total_rows_pending`` and ``total_tasks``."""
        self._require_latest("plan_refresh()")
        plan = plan_view_refresh(
            self.ref(), src_version, mode=mode, fragments=fragments, recompute=recompute,
            max_rows_per_task=max_rows_per_task, checkpoint_size=self._refresh_checkpoint_size(checkpoint_size),
            parallelism=self._refresh_parallelism(runner, concurrency),
        )
        return _with_fragment_size(plan, max_rows_per_fragment)

    def source_behind(self) -> str | None:
        """Why :meth:`refresh` would refuse to start now (a view it reads is
        behind its own source: refresh that first, or ``upstream=True``), or
        None. :meth:`plan_refresh` plans against the source as it is."""
        try:
            self.connection._check_source_current(self)
        except SourceBehindError as exc:
            return str(exc)
        return None

    def _refresh_checkpoint_size(self, given: int | None) -> int | None:
        """``given``, else the smallest ``@udf(checkpoint_size=)`` of the view's UDFs (None: sized by time)."""
        if given is not None:
            return given
        sizes = [n for c in self.definition.udf_columns if (n := checkpoint_size_of(c.the_udf)) is not None]
        return min(sizes) if sizes else None

    def _refresh_parallelism(self, runner: "Runner | None", concurrency: Any) -> int:
        """Geneva's ``concurrency`` (how many tasks the refresh is cut into), else the runner's cores."""
        if concurrency is None:
            return self._runner(runner).parallelism()
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1 (tasks at once), got {concurrency!r}")
        return concurrency

    def resource_request(self) -> "ResourceRequest | None":
        """What each of the view's refresh tasks asks for (the most any of its UDF
        columns or its function asks: ``@udf(num_cpus=, num_gpus=, memory=)``),
        None without hints. Scheduled by Spark on a cluster (docs/deploy.md)."""
        return request_of_definition(f"view {self.name!r}", self.definition.encode())

    @property
    def refresh_policy(self) -> RefreshPolicy:
        return RefreshPolicy.from_json((self._dataset().schema.metadata or {}).get(POLICY_METADATA_KEY.encode()))

    def set_refresh_policy(self, policy: RefreshPolicy) -> None:
        """Change how the view is kept fresh (shown and acted on by Dagster)."""
        self._require_latest("set_refresh_policy()")
        if not isinstance(policy, RefreshPolicy):
            raise ValueError(f"set_refresh_policy() takes a RefreshPolicy, got {policy!r}: {BUILD_HINT}")
        self._dataset().update_schema_metadata({POLICY_METADATA_KEY: policy.to_json()})

    @property
    def ownership(self) -> Ownership:
        """The view's owners and tags (its Dagster asset's)."""
        return Ownership.from_json((self._dataset().schema.metadata or {}).get(OWNERSHIP_METADATA_KEY.encode()))

    @property
    def owners(self) -> list[str]:
        return list(self.ownership.owners)

    @property
    def tags(self) -> dict[str, str]:
        return dict(self.ownership.tags)

    def set_owners(self, owners: list[str]) -> None:
        """Change who owns the view (``["team:ml", "alice@example.com"]``; ``[]``
        for nobody): its Dagster asset's owners after the next definitions load.
        Validated before anything is written (``ValueError``)."""
        self._set_ownership(Ownership.of(owners, self.tags))

    def set_tags(self, tags: dict[str, str]) -> None:
        """Replace the view's tags (``{}`` for none): its Dagster asset's tags
        after the next definitions load. Validated before anything is written."""
        self._set_ownership(Ownership.of(list(self.ownership.owners), tags))

    def _set_ownership(self, ownership: Ownership) -> None:
        self._require_latest("set_owners() / set_tags()")
        self._dataset().update_schema_metadata({OWNERSHIP_METADATA_KEY: ownership.to_json()})

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

    def check(self, scope: str = "full", *, since_version: int | None = None) -> list[CheckOutcome]:
        """Integrity checks of the view against its source (see :mod:`mv_assets.ops.checks`).

        ``scope="full"`` (default): every row of the view against the whole
        source at the version the view reflects (reads the whole view).
        ``scope="last_refresh"``: only what the newest refresh changed (the
        view rows it wrote or removed, the source rows written or deleted
        between the source versions it moved, and any write to the view since
        by another tool), each outcome's description and ``metadata`` saying
        what was covered; memory and reads grow with those rows, not with the
        view. Where there is no such window (the first refresh, history
        cleaned up, an overwrite in between) it checks in full and says so.
        ``since_version`` (with ``"last_refresh"``): from this view version
        on instead (what several refreshes since changed)."""
        return list(check_view(self.ref(), scope, since_version))

    def rows_by_fragment(self, src_version: int, fragments: list[int], *, lacking: str | None = None
                         ) -> dict[int, int]:
        """Rows the view holds from each of these source fragments (at
        ``src_version``); with ``lacking``, only those whose added column
        ``lacking`` has no current value (what its backfill computes: a chunk
        view's children by their parent's source fragment)."""
        where = lacking_predicate(self.column_ref(), lacking) if lacking is not None else None
        return view_rows_by_fragment(self.uri, self.ref().source_uri, src_version, fragments, where)

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
        concurrency: int | None = None,
        max_rows_per_fragment: int | None = None,
        job_id: str | None = None,
        source_task_size: int | None = None,
        **geneva_only: Any,
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
        Every refresh updates the view's status (LOADING while it runs, then
        LOADED once its commit lands, read from the commit, or FAILED_LOAD with
        the error), and is recorded as job ``job_id`` (``db.list_jobs()``).

        Geneva's parameters: ``concurrency`` is the number of tasks the refresh
        is cut into, ``max_rows_per_fragment`` bounds the rows of each view
        fragment a task writes, ``source_task_size`` is ``max_rows_per_task``
        (source rows per task; Geneva: of chunker views, here of any view;
        an explicit ``max_rows_per_task`` wins); ``checkpoint_size`` defaults to the smallest
        ``@udf(checkpoint_size=)`` of the view's UDFs. ``where``,
        ``intra_applier_concurrency`` and the admission checks do not apply
        here and warn (docs/geneva.md).
        """
        self._require_latest("refresh()")
        geneva.accept("refresh", geneva_only, geneva.REFRESH_IGNORED)
        if source_task_size is not None:
            if isinstance(source_task_size, bool) or not isinstance(source_task_size, int) or source_task_size < 1:
                raise ValueError(f"source_task_size must be an int >= 1 (source rows per task), got {source_task_size!r}")
            max_rows_per_task = max_rows_per_task or source_task_size
        joined = self.definition.kind == JOIN_AGG_KIND
        if not joined:
            self.connection._check_source_current(self)
        with self.connection._refresh_lock(self.name, lock_timeout):
            join_job = f"refresh-{self.refresh_state().load_number + 1}-join" if joined else None
            try:
                if joined:  # joins and GROUP BY: the join kept under it first (its lock taken after this one's)
                    self._refresh_join_under(src_version, mode, runner, checkpoint_size, lock_timeout, join_job)
                    src_version = None
                    self.connection._check_source_current(self)
                ref = self.ref()
                plan = plan_view_refresh(
                    ref, src_version, mode=mode, fragments=fragments, recompute=recompute,
                    max_rows_per_task=max_rows_per_task,
                    checkpoint_size=self._refresh_checkpoint_size(checkpoint_size),
                    parallelism=self._refresh_parallelism(runner, concurrency), exact=False,  # the tasks count inserts
                )
                plan = _with_fragment_size(plan, max_rows_per_fragment)
            except BaseException as exc:
                if joined or is_failed_on_data(exc):  # (a join's status says LOADING since the join began;
                    # an aggregate fails on its data while planning): it says why the refresh stopped
                    record_load_state(self.connection.layout, self.name, FAILED_LOAD, f"{type(exc).__name__}: {exc}",
                                      job_id=join_job or f"refresh-{self.refresh_state().load_number + 1}-plan")
                raise
            return self._execute_refresh(ref, plan, runner, job_id)

    def _refresh_join_under(self, src_version: int | None, mode: str, runner: "Runner | None",
                            checkpoint_size: int | None, lock_timeout: float | None, job_id: str | None) -> None:
        """A join aggregate's join (model.join_agg_view), brought up to date by
        the delta rule: a view of its own, refreshed under its own lock. The
        aggregate's own status says it: LOADING (as job ``job_id``) while its
        join is refreshed, a process killed meanwhile reading as failed; a
        failure is recorded by :meth:`refresh` (the join is never listed: its
        own record is not what anyone reads)."""
        under = self.connection.open_table(self.definition.source)
        assert isinstance(under, MaterializedView)
        record_load_state(self.connection.layout, self.name, LOADING, load_number=self.refresh_state().load_number + 1,
                          job_id=job_id)
        under.refresh(src_version=src_version, mode=mode, runner=runner, checkpoint_size=checkpoint_size,
                      lock_timeout=lock_timeout)

    def _execute_refresh(self, ref: ViewRef, plan: RefreshPlan, runner: "Runner | None",
                         job_id: str | None) -> RefreshResult:
        """Run ``plan`` (under the view's refresh lock), its status recorded
        (LOADING unless it only records a new source version, FAILED_LOAD with
        the error) unless it commits nothing, and compact the view when
        refreshes left it fragmented."""
        if plan.commits_nothing:
            result = execute_refresh(ref, plan, self._runner(runner))
            result.job_id = job_id or ""
            # nothing to do: the view is current, so a FAILED_LOAD (or a LOADING left by a refresh
            # killed mid-way) no longer stands; a local record is renamed aside (none: one failed rename)
            self._keep_failed_refresh()
            clear_load_state(self.connection.layout, self.name)
            return result
        job_id = job_id or self._new_job_id(plan)
        # LOADING until the commit carrying this load number lands (then LOADED, read from the
        # commit: the record is removed; a LOADING left by a stop in between reads LOADED too).
        # Not for a plan that only records the new source version (after a compaction, say): its
        # one commit is the whole refresh, and a stop before it leaves the view as right as it was
        # (no failed load to show; the next refresh records it). A FAILED_LOAD is still cleared.
        layout = self.connection.layout
        if plan.has_work or plan.full or plan.repaired:
            # (a failed refresh's record it replaces is kept as that job's: storage.status.keep_failed_refresh)
            record_load_state(layout, self.name, LOADING, load_number=plan.load_number + 1, job_id=job_id)
        else:
            self._keep_failed_refresh()
        try:
            result = execute_refresh(ref, plan, self._runner(runner), job_id)
        except BaseException as exc:
            if is_view_replaced(exc):  # (a view made again under the name: its status is its own)
                if load_record(layout, self.name).get("job_id") == job_id:  # (this refresh's LOADING, if any)
                    clear_load_state(layout, self.name)
            else:
                record_load_state(layout, self.name, FAILED_LOAD, f"{type(exc).__name__}: {exc}", job_id=job_id)
            raise
        clear_load_state(layout, self.name)
        start = time.perf_counter()
        # (the version it committed, unless index upkeep committed after it)
        if compact_if_fragmented(objects.dataset(self.uri, version=None if result.indexes else result.view_version)):
            result.timings["compact_s"] = time.perf_counter() - start
        return result

    def _keep_failed_refresh(self) -> None:
        """A failed refresh's job stays as it failed once a refresh that
        records no LOADING (it has nothing to compute) clears its record."""
        keep_failed_refresh(self.connection.layout, self.name, load_record(self.connection.layout, self.name))

    def _new_job_id(self, plan: RefreshPlan) -> str:
        """The refresh's job id: its plan's (a refresh killed and run again is the
        same job, its skipped rows recorded once), unless a refresh of that id
        failed (FAILED_LOAD: its record stays that job's, and this run is another)."""
        job_id = refresh_job_id(plan)
        failed = load_record(self.connection.layout, self.name)
        if failed.get("load_state") == FAILED_LOAD and str(failed.get("job_id") or "").startswith(job_id):
            job_id = f"{job_id}-{uuid.uuid4().hex[:6]}"
        return job_id

    def refresh_async(self, **kwargs: Any) -> Job:
        """:meth:`refresh` (same parameters, Geneva's included) in a background
        (non-daemon) thread; returns a :class:`~mv_assets.ops.jobs.Job`
        whose ``result(timeout=)`` is the :class:`RefreshResult`. Geneva's
        parameters are checked (and warned about) here."""
        self._require_latest("refresh_async()")
        given = {k: kwargs.pop(k) for k in list(kwargs) if k in geneva.REFRESH_IGNORED}
        geneva.accept("refresh_async", given, geneva.REFRESH_IGNORED)
        known = {n for n, p in inspect.signature(MaterializedView.refresh).parameters.items() if p.kind == p.KEYWORD_ONLY}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"refresh_async() got an unexpected keyword argument {unknown[0]!r}")
        job_id = kwargs.pop("job_id", None) or uuid.uuid4().hex[:12]
        return Job(job_id, self.refresh, (), {**kwargs, "job_id": job_id}, job_type="refresh", table=self.name,
                   catalog=self.connection.layout.root)


def _with_fragment_size(plan: RefreshPlan, max_rows_per_fragment: Any) -> RefreshPlan:
    """Geneva's ``max_rows_per_fragment``: each task writes view fragments of at most that many rows."""
    if max_rows_per_fragment is None:
        return plan
    if isinstance(max_rows_per_fragment, bool) or not isinstance(max_rows_per_fragment, int) or max_rows_per_fragment < 1:
        raise ValueError(f"max_rows_per_fragment must be an int >= 1, got {max_rows_per_fragment!r}")
    for t in plan.tasks:
        t.max_rows_per_file = max_rows_per_fragment
    return plan
