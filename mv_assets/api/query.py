"""The query builder: ``table.search(None).where(...).select(...)``.

Validation happens against the source schema before anything is written:
unknown columns, bad SQL, UDF parameters naming no column, type mismatches and
duplicate output names all raise ``ValueError``. The definition it produces
lives in :mod:`mv_assets.definition` (re-exported here).
"""

import dataclasses
import json
import re
from typing import Any, Protocol

import lance
import pyarrow as pa

from mv_assets.model.definition import (
    _VIEW_COLUMNS,
    ColumnSpec,
    ViewDefinition,
    is_marker,
    is_reserved_name,
    output_schema,
)
from mv_assets.model.kinds import kind_of
from mv_assets.model.names import check_column_name, is_internal_column
from mv_assets.model.udf import UDF

__all__ = ["Query", "QuerySource", "rows_in_process", "function_view_definition"]


class QuerySource(Protocol):
    """What a query reads from: a table or view handle (name, schema, dataset)."""

    name: str

    @property
    def schema(self) -> pa.Schema: ...

    def _dataset(self, version: int | None = None) -> lance.LanceDataset: ...


_MAX_LIMIT = 2**63 - 1


class Query:
    """A lazy query over a table: filter, projection (with UDFs), shuffle, limit.

    Builder methods return new queries; nothing is read until the query is
    materialized (:meth:`Connection.create_materialized_view`) or executed
    (:meth:`to_arrow`).
    """

    def __init__(self, table: QuerySource) -> None:
        self._table = table
        self._filter: str | None = None
        self._select: list[tuple[str, Any]] | None = None
        self._shuffle = False
        self._seed: int | None = None
        self._limit: int | None = None
        self._offset = 0  # rows a read skips (reads only: a view has none)
        self._group_by: tuple[str, ...] | None = None
        self._aggs: dict[str, str] | None = None
        self._joins: tuple[tuple[QuerySource, dict], ...] = ()

    def _copy(self, **changes: Any) -> "Query":
        q = Query(self._table)
        q.__dict__.update(self.__dict__)
        q.__dict__.update(changes)
        return q

    def where(self, sql: str | None, prefilter: bool | None = None) -> "Query":
        """Keep source rows for which the SQL predicate is true. (``prefilter``
        orders a filter against a vector or text search; a query without one
        filters every row either way, so it changes nothing here.)"""
        if sql is not None and (not isinstance(sql, str) or not sql.strip()):
            raise ValueError("where() takes a non-empty SQL predicate string")
        if prefilter is not None and not isinstance(prefilter, bool):
            raise ValueError(f"prefilter is True or False, got {prefilter!r}")
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

    def join(self, other: QuerySource, on: str | list[str] | None = None, *, left_on: str | list[str] | None = None,
             right_on: str | list[str] | None = None, how: str = "inner", alias: str | None = None) -> "Query":
        """Join another table or view (PySpark's and polars' names): ``on``, a
        column (or list) both sides have, kept once like SQL's ``USING``; or
        ``left_on``/``right_on``, a name or list each (``left_on`` may be
        qualified, ``"videos.channel_id"``, to join on a table joined before).
        ``how``: ``"inner"`` or ``"left"``. Equi-joins; NULL keys never match.
        Materialized, it is a join view kept by the delta rule
        (:mod:`mv_assets.ops.join_refresh`); names are qualified with their
        table's name (``"videos.title"``) where more than one table has them.
        ``alias``: the joined table's name in the query (SQL's ``AS``): a
        table joined with itself (a self-join) gives the second occurrence its
        own name, ``employees.join(employees, alias="mgr",
        left_on="manager_id", right_on="mgr.id")``."""
        if not hasattr(other, "schema") or not hasattr(other, "_dataset") or not isinstance(
                getattr(other, "name", None), str):
            named = getattr(other, "name", None)
            what = f"{type(other).__name__} {named!r}" if isinstance(named, str) else type(other).__name__
            hint = (" (a view that is not materialized is computed when read and has no row ids to keep: "
                    "create it with create_materialized_view to join it)" if type(other).__name__ == "View" else "")
            raise ValueError(f"join() takes a table or materialized view of this catalog (db.open_table(name)), "
                             f"got {what}{hint}")
        if self._group_by is not None or self._aggs is not None:
            raise ValueError("join() comes before group_by()")
        spec = {"on": on, "left_on": left_on, "right_on": right_on, "how": how, "alias": alias}
        q = self._copy(_joins=(*self._joins, (other, spec)))
        q._join_parts(keys_only=True)  # tables and keys checked now, in the user's words
        return q

    def _join_resolver(self):
        """What a name of this join query reads (model.join_view.join_resolver)."""
        from mv_assets.model.join_view import join_resolver

        tables = [self._table, *(t for t, _ in self._joins)]
        return join_resolver([t.name for t in tables], [t.schema for t in tables], [j for _, j in self._joins])

    def _join_parts(self, keys_only: bool = False):
        """The join's spec and output columns (model.join_view.build_join)."""
        from mv_assets.model.join_view import build_join

        tables = [self._table, *(t for t, _ in self._joins)]
        return build_join([t.name for t in tables], [t.schema for t in tables], [j for _, j in self._joins],
                          self._select, self._filter, keys_only)

    @property
    def joined(self) -> list[QuerySource]:
        """The tables and views joined to the query's table (in order)."""
        return [t for t, _ in self._joins]

    def group_by(self, *keys: str) -> "Query":
        """Group the passing rows by these columns (none: one group of every
        row); give the outputs with :meth:`agg`. Materialized, it is an
        aggregate view, maintained from the change feed
        (:mod:`mv_assets.ops.agg_refresh`)."""
        if not all(isinstance(k, str) and k for k in keys):
            raise ValueError(f"group_by() takes column names, got {keys!r}")
        if len(set(keys)) != len(keys):
            raise ValueError(f"group_by() names a column twice: {list(keys)}")
        return self._copy(_group_by=tuple(keys))

    def agg(self, aggregates: dict[str, str]) -> "Query":
        """The outputs of a :meth:`group_by` query: ``{name: "count(*)" |
        "count(x)" | "count(distinct x)" | "sum(x)" | "avg(x)" | "min(x)" | "max(x)" |
        "approx_quantile(x, q)"}`` (see docs/concepts.md)."""
        from mv_assets.model.agg_view import parse_aggs
        from mv_assets.model.join_agg_view import split

        if self._joins:  # (over a join, an aggregate may take an expression: a column of the join computes it)
            split(self._group_by or (), aggregates, self._select, self._join_resolver()) \
                if isinstance(aggregates, dict) else parse_aggs(aggregates)
        else:
            parse_aggs(aggregates)  # refused now, in our words
        return self._copy(_aggs=dict(aggregates))

    def shuffle(self, seed: int | None = None) -> "Query":
        """Order rows by a seeded hash of their stable source row id (see docs)."""
        if seed is not None and not isinstance(seed, int):
            raise ValueError("shuffle seed must be an int")
        return self._copy(_shuffle=True, _seed=0 if seed is None else seed)

    def limit(self, n: int | None) -> "Query":
        """Keep at most ``n`` rows: the first ``n`` by (shuffled) order (None: every row)."""
        if n is None:
            return self._copy(_limit=None)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError("limit must be a non-negative int (or None: every row)")
        if n > _MAX_LIMIT:  # a Lance scan takes it as an i64: refused here, not at the refresh that cannot run it
            raise ValueError(f"limit {n} exceeds the maximum, {_MAX_LIMIT} (2**63 - 1)")
        return self._copy(_limit=n)

    def offset(self, n: int) -> "Query":
        """Skip the first ``n`` rows of what a read returns (lancedb's
        ``offset``; with :meth:`limit`, rows ``n`` to ``n + limit``). Reads
        only: a materialized view keeps every row its query gives."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError("offset must be a non-negative int")
        return self._copy(_offset=n)

    @property
    def table(self) -> QuerySource:
        return self._table

    @property
    def selected(self) -> list[tuple[str, Any]]:
        """The ``select()`` items as given (name, what it reads): none without one."""
        return list(self._select or [])

    @property
    def selects_all(self) -> bool:
        """No ``select``: every source column."""
        return self._select is None

    def to_definition(self) -> ViewDefinition:
        """Validate against the source schema and return the view definition."""
        if self._offset:
            raise ValueError(f"offset({self._offset}) applies to reads (to_arrow(), to_list()...): a materialized "
                             "view keeps every row its query gives (use limit(), or a filter)")
        if self._joins:
            return self._join_definition()
        if self._group_by is not None or self._aggs is not None:
            return self._aggregate_definition()
        source_schema = self._table.schema
        ds = self._table._dataset()
        columns: list[ColumnSpec] = []
        if self._select is None:
            # every column a user could select under its own name: not a view's bookkeeping
            # (keys, markers, a chunk view's __chunk_index: a view over a chunk view has its own)
            for name in source_schema.names:
                if name not in _VIEW_COLUMNS and not is_marker(name) and not is_reserved_name(name):
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
                    value = value.bound_to(source_schema, struct_paths=True)
                    value.validate_inputs(source_schema, name)
                    columns.append(ColumnSpec(name, "udf", None, value))
                elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], UDF):
                    u = value[0].with_inputs(list(value[1])).bound_to(source_schema, struct_paths=True)
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
            check_column_name(c.name, "output column name")
        definition = ViewDefinition(
            source=self._table.name,
            columns=tuple(columns),
            filter=self._filter,
            shuffle=self._shuffle,
            seed=self._seed,
            limit=self._limit,
        )
        try:
            output_schema(definition, ds)  # raises ValueError on bad SQL / columns
        except ValueError as exc:
            if "No field named" not in str(exc):
                raise
            # (DataFusion lists the fields of the projection it planned: the table's own, said in full)
            # (and its list dropped: "Valid fields are doc_id." named one column of six)
            shown = [n for n in source_schema.names if not is_marker(n) and not is_reserved_name(n)]
            said = re.sub(r"\s*Valid fields are [^()]*?\.(?=\s|$)", "", str(exc))
            raise ValueError(f"{said} ({self._table.name!r} has the columns {', '.join(shown)})") from None
        return definition

    @property
    def is_join_aggregate(self) -> bool:
        """A join with ``group_by().agg()``: one view, a join aggregate (model.join_agg_view)."""
        return bool(self._joins) and (self._group_by is not None or self._aggs is not None)

    def join_aggregate(self) -> "tuple[Query, ViewDefinition]":
        """A join aggregate's two parts, validated: the join kept under it (a
        query: its joins, filter and the columns the aggregate reads) and the
        aggregate's definition over it (its ``source`` a stand-in, named by
        the catalog; see :func:`mv_assets.model.join_agg_view.split`)."""
        import tempfile

        import lance

        from mv_assets.model import join_agg_view
        from mv_assets.model.agg_view import refuse_aggregates_in_where
        from mv_assets.model.join_view import join_view_schema

        if self._group_by is None:
            raise ValueError("agg() needs group_by() first (group_by() with no columns: one group of every row)")
        if self._aggs is None:
            raise ValueError("group_by() needs agg({...}): the outputs of each group")
        if self._shuffle or self._limit is not None:
            raise ValueError("group_by() cannot be combined with shuffle() or limit()")
        refuse_aggregates_in_where(self._filter)
        parts = join_agg_view.split(self._group_by, self._aggs, self._select, self._join_resolver())
        inner = self._copy(_group_by=None, _aggs=None, _select=list(parts.select))
        joined = inner.to_definition()
        spec = join_agg_view.spec("join", [t.name for t in [self._table, *self.joined]], parts.keys, parts.aggs)
        definition = ViewDefinition(source="join", columns=(), function=json.dumps(spec))
        datasets = [self._table._dataset(), *(t._dataset() for t, _ in self._joins)]
        with tempfile.TemporaryDirectory(prefix="mv-join-agg-") as scratch:  # (the join's schema, no rows)
            ds = lance.write_dataset(join_view_schema(joined, datasets).empty_table(), scratch)
            try:
                join_agg_view.view_schema(definition, [ds])  # raises ValueError on bad keys / aggregates
            except ValueError as exc:  # (in the user's names, not the join's columns)
                raise ValueError(join_agg_view.in_users_words(str(exc), "", parts.select)) from None
        return inner, definition

    def _join_definition(self) -> ViewDefinition:
        from mv_assets.model.join_view import join_view_schema

        if self._group_by is not None or self._aggs is not None:
            raise ValueError("a join with group_by() is a join aggregate: create it with "
                             "db.create_materialized_view(name, query) (to_arrow() computes it now)")
        if self._shuffle or self._limit is not None:
            raise ValueError("shuffle() and limit() do not apply to join views")
        join, outputs = self._join_parts()
        columns = []
        for name, kind, value in outputs:
            check_column_name(name, "output column name")
            columns.append(ColumnSpec(name, "udf", None, value) if kind == "udf" else ColumnSpec(name, kind, value))
        definition = ViewDefinition(source=self._table.name, columns=tuple(columns), filter=self._filter,
                                    function=json.dumps(join.to_spec()))
        join_view_schema(definition, [self._table._dataset(), *(t._dataset() for t, _ in self._joins)])
        return definition

    def _aggregate_definition(self) -> ViewDefinition:
        from mv_assets.model.agg_view import Aggregate, agg_view_schema, parse_aggs, refuse_aggregates_in_where

        if self._group_by is None:
            raise ValueError("agg() needs group_by() first (group_by() with no columns: one group of every row)")
        if self._aggs is None:
            raise ValueError("group_by() needs agg({...}): the outputs of each group")
        if self._select is not None:
            raise ValueError("group_by() cannot be combined with select(): the keys and the agg() outputs are the "
                             "view's columns")
        if self._shuffle:
            raise ValueError("group_by() cannot be combined with shuffle()")
        if self._limit is not None:
            raise ValueError("group_by() cannot be combined with limit()")
        refuse_aggregates_in_where(self._filter)
        spec = Aggregate(self._group_by, tuple(parse_aggs(self._aggs))).to_spec()
        definition = ViewDefinition(source=self._table.name, columns=(), filter=self._filter,
                                    function=json.dumps(spec))
        agg_view_schema(definition, self._table._dataset())  # raises ValueError on bad keys / columns / SQL
        return definition

    def to_arrow(self) -> pa.Table:
        """Evaluate the query in this process (no Spark) and return the rows
        (the user's columns: no row keys or markers, as a view's reader sees)."""
        if self._offset:  # the first offset + limit rows, less the first offset
            skip = self._offset
            limit = None if self._limit is None else min(self._limit + skip, _MAX_LIMIT)
            return self._copy(_offset=0, _limit=limit).to_arrow().slice(skip)
        if self.is_join_aggregate:
            return self._join_aggregate_rows()
        return rows_in_process(self.to_definition(), [self._table._dataset(), *(t._dataset() for t, _ in self._joins)])

    def _join_aggregate_rows(self) -> pa.Table:
        """A join aggregate's groups now: the join's rows, then their groups."""
        import tempfile

        import lance

        inner, definition = self.join_aggregate()
        with tempfile.TemporaryDirectory(prefix="mv-join-agg-") as scratch:
            ds = lance.write_dataset(inner.to_arrow(), scratch)
            return rows_in_process(definition, [ds])

    def to_pandas(self):
        """:meth:`to_arrow` as a pandas DataFrame."""
        return self.to_arrow().to_pandas()

    def to_list(self) -> list[dict]:
        """:meth:`to_arrow` as a list of row dicts."""
        return self.to_arrow().to_pylist()

    def to_batches(self, batch_size: int | None = None) -> list[pa.RecordBatch]:
        """:meth:`to_arrow` as record batches of at most ``batch_size`` rows."""
        return self.to_arrow().to_batches(max_chunksize=batch_size)

    def __repr__(self) -> str:
        return (
            f"Query(table={self._table.name!r}, where={self._filter!r}, "
            f"select={[n for n, _ in self._select] if self._select else '*'}, "
            f"shuffle={self._seed if self._shuffle else None}, limit={self._limit}"
            + (f", offset={self._offset})" if self._offset else ")")
        )


def _query_rows(definition: ViewDefinition, schema: pa.Schema, datasets: list) -> pa.Table:
    from mv_assets.execution.tasks import compute_rows

    return compute_rows(datasets[0], definition, schema, filter_sql=definition.filter)


def _join_rows(definition: ViewDefinition, schema: pa.Schema, datasets: list) -> pa.Table:
    from mv_assets.execution.join_tasks import computed_join
    from mv_assets.execution.tasks import compute_udf_columns

    return computed_join(definition, schema, datasets, compute_udf_columns)


def _agg_rows(definition: ViewDefinition, schema: pa.Schema, datasets: list) -> pa.Table:
    from mv_assets.execution.agg_tasks import groups_from_rows
    from mv_assets.model.agg_view import GROUP, Aggregate

    agg = Aggregate.from_definition(definition)
    rows = groups_from_rows(datasets[0].to_table(columns=agg.input_columns, filter=definition.filter), agg, schema)
    return rows.drop_columns([GROUP])


# How a kind's rows are computed in this process (model.kinds: one registry per layer); others as a query view's
_IN_PROCESS = {"join": _join_rows, "aggregate": _agg_rows, "join_aggregate": _agg_rows}


def rows_in_process(definition: ViewDefinition, datasets: list) -> pa.Table:
    """A view's rows computed now, in this process, over its sources'
    ``datasets`` (at their versions): the user's columns, as a reader of the
    materialized view sees them. ``Query.to_arrow`` and views that are not
    materialized (``create_view``) read through it."""
    schema = kind_of(definition).schema(definition, datasets)
    rows = _IN_PROCESS.get(definition.kind, _query_rows)(definition, schema, datasets)
    return rows.select([n for n in rows.column_names if not is_internal_column(n)])


def function_view_definition(query: Query, function: Any, name: str) -> ViewDefinition:
    """The definition of a view whose rows a ``@chunker`` or ``@udtf`` makes
    from ``query``'s rows (``create_udtf_view``; a view declared in code with
    a function). A chunker: the selected columns are the parent columns each
    child inherits, its input columns left out unless ``inherit_input_columns``
    (big inputs stay out of every child row, as in Geneva); a UDTF: its
    output only, the query's columns (all, or those it selects by name) what
    the UDTF may read. Refused in words first."""
    from mv_assets.model.chunk_view import check_chunk_query
    from mv_assets.model.chunker import UDTF
    from mv_assets.model.udtf_view import bind_udtf, check_udtf_query

    definition = query.to_definition()
    if isinstance(function, UDTF):
        readable = check_udtf_query(definition, name, query.selects_all)
        function = bind_udtf(function, readable, name, query.selects_all)
        return dataclasses.replace(definition, columns=(), function=json.dumps(function.to_spec()))
    if not function.inherit_input_columns:
        definition = dataclasses.replace(
            definition, columns=tuple(c for c in definition.columns if c.name not in function.input_columns))
    definition = dataclasses.replace(definition, function=json.dumps(function.to_spec()))
    check_chunk_query(definition, name)
    return definition
