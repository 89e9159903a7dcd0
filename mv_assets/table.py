"""Tables and materialized views: thin handles over Lance datasets."""

import datetime as _dt
import decimal
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import lance
import pyarrow as pa
import pyarrow.compute as pc

from .query import VIEW_METADATA_KEY, Query, ViewDefinition, check_sql, short_error
from .policy import POLICY_METADATA_KEY, RefreshPolicy
from .refresh import RefreshPlan, RefreshResult, RefreshState, execute_refresh, plan_refresh, read_refresh_state
from .status import FAILED_LOAD, LOADED, LOADING, ViewStatus, record_load_state, view_status

if TYPE_CHECKING:
    from .catalog import Connection
    from .spark import Runner

__all__ = ["Table", "MaterializedView", "sql_literal", "to_arrow_table"]

PRIMARY_KEY_METADATA_KEY = "mv_assets.primary_key"


def sql_literal(value: Any) -> str:
    """Render a Python value as a SQL literal for Lance/DataFusion.

    >>> sql_literal("it's"), sql_literal(None), sql_literal(True), sql_literal(2.5)
    ("'it''s'", 'NULL', 'true', '2.5')
    """
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
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
            table = pa.Table.from_pylist(data, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise ValueError(f"rows do not match the table schema: {exc}") from exc
    elif isinstance(data, dict):
        table = pa.table(data)
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
    if len(pc.unique(col)) != len(col):
        raise ValueError(f"duplicate values for primary key {pk!r} in the new rows")


class Table:
    """A Lance dataset in a catalog. Plain ``lance.dataset(table.uri)`` opens it too."""

    def __init__(self, connection: "Connection", name: str) -> None:
        self.connection = connection
        self.name = name
        self.uri = connection._table_uri(name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, version={self.version})"

    def _dataset(self, version: int | None = None) -> lance.LanceDataset:
        return lance.dataset(self.uri, version=version)

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

    def count_rows(self, filter: str | None = None) -> int:
        return self._dataset().count_rows(filter=filter)

    def to_arrow(self, version: int | None = None) -> pa.Table:
        return self._dataset(version).to_table()

    def search(self, query: Any = None) -> Query:
        """A query builder over this table (``None``: no vector / text query)."""
        if query is not None:
            raise ValueError("only search(None) is supported: vector and full-text search are not part of views")
        return Query(self)

    def list_versions(self) -> list[dict]:
        return self._dataset().versions()

    # -- writing ---------------------------------------------------------
    def _check_writable(self) -> None:
        pass

    def add(self, data: Any) -> int:
        """Append rows; returns the new version."""
        self._check_writable()
        ds = self._dataset()
        table = to_arrow_table(data, ds.schema)
        if table.num_rows == 0:
            return ds.version
        check_primary_key(table, self.primary_key)
        return lance.write_dataset(table, self.uri, mode="append").version

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
        pk = self.primary_key
        if pk in updates:
            raise ValueError(f"the primary key {pk!r} cannot be updated")
        try:
            check_sql(ds, filter=where, columns=updates)
        except (ValueError, OSError) as exc:
            raise ValueError(f"invalid update: {short_error(exc)}") from exc
        ds.update(updates, where=where)
        return self.version

    def optimize(self, *, cleanup_older_than: timedelta | None = None, target_rows_per_fragment: int | None = None) -> int:
        """Compact small fragments (row ids and row versions are kept). Returns the new version."""
        ds = self._dataset()
        kwargs = {}
        if target_rows_per_fragment:
            kwargs["target_rows_per_fragment"] = target_rows_per_fragment
        ds.optimize.compact_files(**kwargs)
        if cleanup_older_than is not None:
            self._dataset().cleanup_old_versions(older_than=cleanup_older_than)
        return self.version


class MaterializedView(Table):
    """A view kept up to date by :meth:`refresh`. It is a Table you can read."""

    def __init__(self, connection: "Connection", name: str, definition: ViewDefinition | None = None) -> None:
        super().__init__(connection, name)
        self._definition = definition

    @property
    def definition(self) -> ViewDefinition:
        if self._definition is None:
            raw = (self.schema.metadata or {}).get(VIEW_METADATA_KEY.encode())
            if raw is None:
                raise ValueError(f"{self.name!r} is not a materialized view")
            self._definition = ViewDefinition.decode(raw)
        return self._definition

    @property
    def source(self) -> str:
        return self.definition.source

    def _check_writable(self) -> None:
        raise ValueError(
            f"{self.name!r} is a materialized view: its rows are maintained by refresh(); "
            "change the source table instead"
        )

    def refresh_state(self) -> RefreshState:
        return read_refresh_state(self._dataset())

    @property
    def source_version(self) -> int | None:
        """The source version the view reflects (None before the first refresh)."""
        return self.refresh_state().source_version

    def plan_refresh(
        self, *, src_version: int | None = None, mode: str = "auto", fragments: list[int] | None = None
    ) -> RefreshPlan:
        """An exact dry run: rows to insert, update and delete, UDF rows to compute."""
        return plan_refresh(self, src_version, mode=mode, fragments=fragments)

    @property
    def refresh_policy(self) -> RefreshPolicy:
        return RefreshPolicy.from_json((self.schema.metadata or {}).get(POLICY_METADATA_KEY.encode()))

    def set_refresh_policy(self, policy: RefreshPolicy) -> None:
        """Change how the view is kept fresh (shown and acted on by Dagster)."""
        if not isinstance(policy, RefreshPolicy):
            raise ValueError("set_refresh_policy() takes a RefreshPolicy")
        self._dataset().update_schema_metadata({POLICY_METADATA_KEY: policy.to_json()})

    def status(self) -> ViewStatus:
        """This view's record of the status table (load state, staleness, ...)."""
        return view_status(self)

    def refresh(
        self,
        *,
        src_version: int | None = None,
        mode: str = "auto",
        runner: "Runner | None" = None,
        fragments: list[int] | None = None,
        recompute: list[str] | None = None,
        max_rows_per_task: int = 131_072,
        lock_timeout: float | None = 600.0,
    ) -> RefreshResult:
        """Bring the view up to ``src_version`` of its source (default: latest).

        ``mode``: ``"auto"`` (incremental when the change feed allows, else full),
        ``"full"`` (recompute everything) or ``"incremental_strict"`` (fail rather
        than recompute everything). ``fragments`` limits the work to rows in
        those source fragments (deletions are always applied in full).
        ``recompute`` names UDF columns to compute again for rows that are
        otherwise current; their other values are copied, not recomputed.

        Two refreshes of one view never run at once: the second waits for the
        first (up to ``lock_timeout`` seconds, then ConcurrentRefreshError).
        Every refresh updates the view's status record (LOADING, then LOADED
        or FAILED_LOAD with the error).
        """
        self.connection._check_source_current(self)
        with self.connection._refresh_lock(self.name, lock_timeout):
            plan = plan_refresh(
                self, src_version, mode=mode, fragments=fragments, recompute=recompute,
                max_rows_per_task=max_rows_per_task,
            )
            if plan.is_noop and not plan.full and plan.from_version == plan.to_version:
                return execute_refresh(self, plan, runner or self.connection.runner)
            record_load_state(self.connection, self.name, LOADING)
            try:
                result = execute_refresh(self, plan, runner or self.connection.runner)
            except BaseException as exc:
                record_load_state(self.connection, self.name, FAILED_LOAD, f"{type(exc).__name__}: {exc}")
                raise
            record_load_state(self.connection, self.name, LOADED)
            return result
