"""Aggregate views (kind ``"aggregate"``): ``GROUP BY`` over the passing source
rows, one view row per group, maintained from the change feed.

``source.search(None).where(sql).group_by("k1", "k2").agg({"n": "count(*)",
"s": "sum(x)", "a": "avg(x)", "lo": "min(x)", "hi": "max(x)", "nn": "count(x)"})``.

A view row holds the group's key columns, its aggregates and hidden state in
the view's own columns (so one Lance commit carries rows and state):

* ``__source_row_id``: the group's id, a 63-bit hash of its key (the view's
  rows are keyed by it where other views key by source row);
* ``__agg__group``: the group's key, the JSON list of its key values
  (:func:`group_key`; exact, compared as text);
* ``__agg__rows``: the group's row count (the group goes when it reaches 0);
* ``__agg__cnt__<x>``: non-NULL values of ``x`` (count(x); NULL rules of
  sum/avg/min/max), ``__agg__sum__<x>`` their sum (int64 for integer
  columns: exact; float64 for floats, with ``__agg__comp__<x>``, the
  remainder of a double-double sum carried across refreshes: see
  :mod:`mv_assets.execution.agg_tasks`);
* ``__agg__nan__<x>`` / ``__agg__pinf__<x>`` / ``__agg__ninf__<x>`` (float
  columns summed): the group's rows whose ``x`` is NaN, +inf, -inf. The sum
  columns then hold the sum of the finite values only, so a non-finite value
  leaves a group as exactly as it came (a running sum cannot take an infinity
  back out); the output sum is :func:`sum_with_specials` of the four. A view
  stored before these columns existed has none: its sums hold every value, and
  a changed group whose stored sum is not finite is recomputed from the source;
* ``__agg__min__<x>`` / ``__agg__max__<x>``: the group's :data:`EXTREMES_KEPT`
  most extreme values of ``x`` (a sorted prefix of them): a deleted minimum
  is replaced by the next one; the group is recomputed from the source only
  when the buffer runs out;
* ``__agg__dist__<x>`` (``count(distinct x)``): the group's distinct non-NULL
  values of ``x``, each with its number of rows (a list of ``{v, n}``): rows
  added and removed change the counts, a value whose count reaches 0 leaves,
  the output is the number of values left. Its size grows with the distinct
  values per group (a group of a million distinct ids holds a million entries);
* ``__agg__qs__<x>`` (``approx_quantile(x, q)``, any number of q): a
  DDSketch-style sketch of the group's finite values of ``x``: the row count of
  each logarithmic bucket (:func:`quantile_bucket`, relative accuracy
  :data:`QUANTILE_ACCURACY`), kept like a count(distinct)'s values (rows
  added and removed change bucket counts), so deletes are exact and the sketch
  never drifts; its size is bounded by the values' range (about 4,000 buckets
  from 1e-9 to 1e9), not by the rows.

SQL NULL semantics: ``count(x)`` skips NULLs; sum/avg/min/max of only NULLs is
NULL; NULL keys form a group. Keys hold values compared exactly (integers,
strings, booleans, dates).

SQL's float semantics (PostgreSQL's, DuckDB's): a sum is NaN when the group
holds a NaN or both infinities, else the infinity it holds, else the finite
sum (which may overflow to an infinity); avg is that sum over ``count(x)``;
min / max order NaN above every number, infinities included (max is NaN while
a NaN is in the group; min is NaN only when every value is; pyarrow's
``min_max`` skips NaN instead); ``count(distinct x)`` counts every NaN as one
value and 0.0 and -0.0 as one; ``approx_quantile`` sketches finite values only
(a group of only non-finite values gives NULL).

Pure: definitions, schemas and Arrow computations only.
"""

import functools
import json
import re
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa

from mv_assets.model.definition import (
    READ_FIELDS_METADATA_KEY,
    VIEW_METADATA_KEY,
    ViewDefinition,
    check_sql,
    read_field_ids,
    short_error,
)
from mv_assets.model.names import AGG_PREFIX, SOURCE_ROW_ID, check_column_name
from mv_assets.model.udtf_view import exact_key_type, partition_key

__all__ = [
    "Agg", "Aggregate", "FUNCTIONS", "GROUP", "ROWS", "agg_view_schema", "check_agg_query", "group_key",
    "parse_aggs", "cnt_col", "sum_col", "comp_col", "ext_col", "dist_col", "qs_col", "agg_text", "EXTREMES_KEPT",
    "QUANTILE_ACCURACY", "quantile_bucket", "bucket_value", "SPECIALS", "special_col", "sum_with_specials",
]

FUNCTIONS = ("count", "sum", "avg", "min", "max", "approx_quantile")
# approx_quantile(x, q): the relative error of the value returned, and the buckets it implies
QUANTILE_ACCURACY = 0.01
_GAMMA = (1 + QUANTILE_ACCURACY) / (1 - QUANTILE_ACCURACY)
_BUCKET_OFFSET = 40_000  # |log_gamma(x)| of a finite double is below 36,000: keys of nonzero values are nonzero
_QUANTILE = re.compile(r"^\s*approx_quantile\s*\(\s*(`[^`]+`|[A-Za-z_][A-Za-z0-9_.]*)\s*,\s*([0-9.eE+-]+)\s*\)\s*$",
                       re.I)
GROUP = AGG_PREFIX + "group"
ROWS = AGG_PREFIX + "rows"
_CALL = re.compile(r"^\s*([A-Za-z_]+)\s*\(\s*(distinct\s+)?(\*|1|`[^`]+`|[A-Za-z_][A-Za-z0-9_.]*)\s*\)\s*$", re.I)


def cnt_col(column: str) -> str:
    return f"{AGG_PREFIX}cnt__{column}"


def sum_col(column: str) -> str:
    return f"{AGG_PREFIX}sum__{column}"


def comp_col(column: str) -> str:
    return f"{AGG_PREFIX}comp__{column}"


# a float sum's non-finite values, counted per group apart from its finite sum
SPECIALS = ("nan", "pinf", "ninf")


def special_col(kind: str, column: str) -> str:
    """A float sum's count of NaN (``kind`` "nan"), +inf ("pinf") or -inf ("ninf") values."""
    assert kind in SPECIALS, kind
    return f"{AGG_PREFIX}{kind}__{column}"


def sum_with_specials(finite: "np.ndarray", nan: "np.ndarray", pinf: "np.ndarray",
                      ninf: "np.ndarray") -> "np.ndarray":
    """A float sum as SQL gives it, from the sum of the finite values and the
    counts of NaN, +inf and -inf values: NaN with a NaN or both infinities,
    else the infinity there, else the finite sum.

    >>> sum_with_specials(np.array([1.5, 1.5, 1.5, 1.5]), np.array([0, 1, 0, 0]), np.array([0, 0, 2, 1]),
    ...                   np.array([0, 0, 0, 1])).tolist()
    [1.5, nan, inf, nan]
    """
    finite = np.asarray(finite, np.float64)
    nan, pinf, ninf = (np.asarray(a) > 0 for a in (nan, pinf, ninf))
    # a finite sum that overflowed is one more infinity (and a NaN one, a NaN)
    nan, pinf, ninf = nan | np.isnan(finite), pinf | (finite == np.inf), ninf | (finite == -np.inf)
    out = np.where(pinf, np.inf, np.where(ninf, -np.inf, finite))
    return np.where(nan | (pinf & ninf), np.nan, out)


def dist_col(column: str) -> str:
    """A count(distinct)'s state: the group's distinct values of ``column`` with their row counts."""
    return f"{AGG_PREFIX}dist__{column}"


def qs_col(column: str) -> str:
    """An approx_quantile's state: the sketch of the group's values of ``column``."""
    return f"{AGG_PREFIX}qs__{column}"


def agg_text(fn: str, column: str | None, q: float | None = None) -> str:
    """An aggregate as written: ``count(*)``, ``sum(x)``, ``count(distinct x)``,
    ``approx_quantile(x, 0.9)``."""
    if fn == "count_distinct":
        return f"count(distinct {column})"
    if fn == "approx_quantile":
        return f"approx_quantile({column}, {q})"
    return f"{fn}({column or '*'})"


def quantile_bucket(values: "np.ndarray") -> "np.ndarray":
    """The sketch bucket of each value (int64, ordered as the values are):
    0 for 0, +-(ceil(log_gamma |x|) + offset) otherwise. Every value of a
    bucket is within :data:`QUANTILE_ACCURACY` (relative) of the bucket's
    :func:`bucket_value`.

    >>> quantile_bucket(np.array([-2.0, 0.0, 1.0, 1.015, 100.0])).tolist()
    [-40035, 0, 40000, 40001, 40231]
    """
    x = np.asarray(values, np.float64)
    mag = np.abs(x)
    with np.errstate(divide="ignore"):
        idx = np.ceil(np.log(np.where(mag > 0, mag, 1.0)) / np.log(_GAMMA)).astype(np.int64)
    return np.where(mag > 0, np.sign(x).astype(np.int64) * (idx + _BUCKET_OFFSET), 0)


def bucket_value(keys: "np.ndarray") -> "np.ndarray":
    """The value a bucket stands for: ``2 gamma^i / (gamma + 1)`` (its values'
    relative error is at most :data:`QUANTILE_ACCURACY`), signed; 0 for 0.

    >>> [round(float(v), 4) for v in bucket_value(np.array([0, 40000, -40035]))]
    [0.0, 0.99, -1.9937]
    """
    k = np.asarray(keys, np.int64)
    i = np.abs(k) - _BUCKET_OFFSET
    return np.where(k == 0, 0.0, np.sign(k) * 2.0 * np.power(_GAMMA, i.astype(np.float64)) / (_GAMMA + 1))


def ext_col(fn: str, column: str) -> str:
    """A min's / max's buffer: the group's most extreme values of ``column``."""
    return f"{AGG_PREFIX}{fn}__{column}"


# values kept per group and min / max: deleting the extreme recomputes the
# group from the source only once this many of its most extreme values are gone
EXTREMES_KEPT = 16


@dataclass(frozen=True)
class Agg:
    """One output: ``name`` = ``fn(column)`` (``column`` None: ``count(*)``)."""

    name: str
    fn: str
    column: str | None
    q: float | None = None  # approx_quantile's quantile

    def __str__(self) -> str:
        return agg_text(self.fn, self.column, self.q)


def parse_aggs(aggs: object) -> list[Agg]:
    """``{"n": "count(*)", "s": "sum(x)", ...}`` as :class:`Agg` s; ValueError in our words."""
    if not isinstance(aggs, dict) or not aggs:
        raise ValueError('agg() takes {output name: "function(column)"}, e.g. {"n": "count(*)", "s": "sum(x)"}')
    out = []
    for name, call in aggs.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"aggregate output names are non-empty strings, got {name!r}")
        check_column_name(name, "output column name")
        if not isinstance(call, str):
            raise ValueError(f"aggregate {name!r}: give it as text, e.g. \"sum(x)\", got {type(call).__name__}")
        quantile = _QUANTILE.match(call)
        if quantile:
            try:
                q = float(quantile.group(2))
            except ValueError:
                q = -1.0
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"aggregate {name!r}: approx_quantile(column, q) takes q between 0 and 1, got "
                                 f"{quantile.group(2)!r}")
            out.append(Agg(name, "approx_quantile", quantile.group(1).strip("`"), q))
            continue
        m = _CALL.match(call)
        if not m:
            raise ValueError(f"aggregate {name!r}: cannot read {call!r}; write function(column), e.g. \"avg(price)\"")
        fn, distinct, arg = m.group(1).lower(), m.group(2), m.group(3)
        if fn == "approx_quantile":
            raise ValueError(f"aggregate {name!r}: approx_quantile takes a column and a quantile between 0 and 1, "
                             "e.g. \"approx_quantile(latency, 0.9)\"")
        if fn not in FUNCTIONS:
            raise ValueError(f"aggregate {name!r}: unknown function {m.group(1)!r}; use one of {list(FUNCTIONS)}")
        if distinct and fn != "count":
            raise ValueError(f"aggregate {name!r}: {fn}(distinct ...) is not supported; of the distinct "
                             "aggregates only count(distinct column) is")
        if arg == "1" and fn == "count" and not distinct:  # (SQL's count(1): every row, as count(*))
            arg = "*"
        if arg in ("*", "1") and (fn != "count" or distinct):
            raise ValueError(f"aggregate {name!r}: only count takes * (or 1); {m.group(0).strip()} needs a column")
        column = None if arg == "*" else arg.strip("`")
        out.append(Agg(name, "count_distinct" if distinct else fn, column))
    return out


_AGGREGATE_CALL = re.compile(r"\b(count|sum|avg|min|max|approx_quantile)\s*\(", re.I)


def holds_aggregate(sql: str | None) -> bool:
    """Whether row-level SQL calls an aggregate (Lance's engine fails on it
    with its own plan error).

    >>> holds_aggregate("max(amt) * 2"), holds_aggregate("amt * 2")
    (True, False)
    """
    return bool(sql) and _AGGREGATE_CALL.search(sql or "") is not None


def refuse_aggregates_in_where(sql: str | None) -> None:
    """Refuse a ``where()`` of an aggregate query that calls an aggregate."""
    if holds_aggregate(sql):
        raise ValueError(f"where() filters rows before they are grouped: it cannot hold an aggregate ({sql}); "
                         "filter the view's groups when reading it")


def group_key(values: list) -> str:
    """The key of a group: the JSON list of its key values (dates as ISO text).

    >>> group_key(["en", 3, None])
    '["en", 3, null]'
    """
    return "[" + ", ".join(partition_key(v) for v in values) + "]"


@dataclass(frozen=True)
class Aggregate:
    """An aggregate view's ``GROUP BY`` keys and aggregates (its stored spec)."""

    keys: tuple[str, ...]
    aggs: tuple[Agg, ...]

    def to_spec(self) -> dict:
        cols = [a.column for a in self.aggs if a.column is not None]
        inputs = list(dict.fromkeys([*self.keys, *cols]))
        return {"kind": "aggregate", "keys": list(self.keys),
                "aggs": [[a.name, a.fn, a.column] + ([a.q] if a.q is not None else []) for a in self.aggs],
                "input_columns": inputs}

    @classmethod
    def from_definition(cls, definition: ViewDefinition) -> "Aggregate":
        spec = json.loads(definition.function or "{}")
        if spec.get("kind") not in ("aggregate", "join_aggregate"):  # (a join aggregate: over the join under it)
            raise ValueError("not an aggregate view")
        return cls(tuple(spec["keys"]), tuple(Agg(*entry) for entry in spec["aggs"]))

    @functools.cached_property
    def value_columns(self) -> list[str]:
        """Source columns the aggregates read (each once)."""
        return list(dict.fromkeys(a.column for a in self.aggs if a.column is not None))

    @functools.cached_property
    def input_columns(self) -> list[str]:
        return list(dict.fromkeys([*self.keys, *self.value_columns]))

    @functools.cached_property
    def summed(self) -> list[str]:
        """Columns whose sum is kept (sum and avg read them)."""
        return list(dict.fromkeys(a.column for a in self.aggs if a.fn in ("sum", "avg") and a.column))

    @functools.cached_property
    def distincts(self) -> list[str]:
        """Columns whose distinct values are counted (count(distinct)), once each."""
        return list(dict.fromkeys(a.column for a in self.aggs if a.fn == "count_distinct" and a.column))

    @functools.cached_property
    def sketched(self) -> list[str]:
        """Columns whose values are sketched (approx_quantile), once each."""
        return list(dict.fromkeys(a.column for a in self.aggs if a.fn == "approx_quantile" and a.column))

    @functools.cached_property
    def extremes(self) -> list[tuple[str, str]]:
        """(function, column) of each min / max, once each."""
        return list(dict.fromkeys((a.fn, a.column) for a in self.aggs if a.fn in ("min", "max") and a.column))


def _orderable(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_date(t) or pa.types.is_timestamp(t)
            or pa.types.is_boolean(t) or pa.types.is_decimal(t))


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def check_agg_query(definition: ViewDefinition, name: str, selects_all: bool) -> None:
    """What an aggregate view's query may hold, refused before anything is written."""
    if not selects_all:
        raise ValueError(f"aggregate view {name!r}: the query cannot select() columns; the group_by keys and the "
                         "agg() outputs are the view's columns")
    if definition.shuffle:
        raise ValueError(f"aggregate view {name!r}: group_by cannot be combined with shuffle()")
    if definition.limit is not None:
        raise ValueError(f"aggregate view {name!r}: group_by cannot be combined with limit()")


def distinct_type(t: pa.DataType) -> pa.DataType:
    """A count(distinct)'s state type: each distinct value ``v`` with its row count ``n``."""
    return pa.list_(pa.struct([pa.field("v", t), pa.field("n", pa.int64())]))


def sum_type(t: pa.DataType) -> pa.DataType:
    return pa.int64() if pa.types.is_integer(t) else pa.float64()


def agg_view_schema(definition: ViewDefinition, ds: lance.LanceDataset) -> pa.Schema:
    """The aggregate view's Arrow schema; validates keys, aggregates and filter against the source."""
    agg = Aggregate.from_definition(definition)
    src = ds.schema
    visible = [f.name for f in src if not f.name.startswith("__")]
    for k in agg.keys:
        if k not in src.names:
            raise ValueError(f"group_by: {definition.source!r} has no column {k!r}; its columns are {visible}")
        if not exact_key_type(src.field(k).type):
            raise ValueError(f"group_by key {k!r} is {src.field(k).type}: a group key must hold integers, strings, "
                             "booleans or dates (values compared exactly, which floats are not: -0.0 and 0.0, NaN); "
                             f"group by it cast, e.g. CAST({k} AS BIGINT) selected in a view")
    outputs = {a.name for a in agg.aggs}
    clash = sorted(outputs & set(agg.keys))
    if clash:
        raise ValueError(f"aggregate outputs {clash} have the names of group_by keys")
    for a in agg.aggs:
        if a.column is None:
            continue
        if a.column not in src.names:
            raise ValueError(f"aggregate {a.name!r} = {a}: {definition.source!r} has no column {a.column!r}; "
                             f"its columns are {visible}")
        t = src.field(a.column).type
        if a.fn in ("sum", "avg", "approx_quantile") and pa.types.is_decimal(t):
            raise ValueError(f"aggregate {a.name!r} = {a}: {a.fn} of a decimal column is not supported (its "
                             f"running state is integer or float); {a.column!r} is {t}: aggregate a view of it "
                             f"cast to double or to a scaled integer (count, min and max take decimals)")
        if a.fn in ("sum", "avg", "approx_quantile") and not _numeric(t):
            raise ValueError(f"aggregate {a.name!r} = {a}: {a.fn} needs a numeric column; {a.column!r} is {t}")
        if a.fn in ("min", "max") and not _orderable(t):
            raise ValueError(f"aggregate {a.name!r} = {a}: {a.fn} needs an ordered column; {a.column!r} is {t}")
        if a.fn == "count_distinct" and not _orderable(t):
            raise ValueError(f"aggregate {a.name!r} = {a}: count(distinct) needs a column of numbers, text, dates "
                             f"or booleans; {a.column!r} is {t}")
    try:
        check_sql(ds, filter=definition.filter)
    except (ValueError, OSError) as exc:
        raise ValueError(f"invalid query over {definition.source!r}: {short_error(exc)}") from exc
    fields = [pa.field(SOURCE_ROW_ID, pa.int64(), nullable=False), pa.field(GROUP, pa.string(), nullable=False)]
    fields += [src.field(k).with_nullable(True) for k in agg.keys]
    for a in agg.aggs:
        t = src.field(a.column).type if a.column else None
        if a.fn in ("count", "count_distinct"):
            fields.append(pa.field(a.name, pa.int64(), nullable=False))
        elif a.fn == "sum":
            assert t is not None
            fields.append(pa.field(a.name, sum_type(t)))
        elif a.fn in ("avg", "approx_quantile"):
            fields.append(pa.field(a.name, pa.float64()))
        else:
            assert t is not None
            fields.append(pa.field(a.name, t))
    fields.append(pa.field(ROWS, pa.int64(), nullable=False))
    for c in agg.value_columns:
        fields.append(pa.field(cnt_col(c), pa.int64(), nullable=False))
    for fn, c in agg.extremes:
        fields.append(pa.field(ext_col(fn, c), pa.list_(src.field(c).type)))
    for c in agg.distincts:
        fields.append(pa.field(dist_col(c), distinct_type(src.field(c).type)))
    for c in agg.sketched:
        fields.append(pa.field(qs_col(c), distinct_type(pa.int64())))
    for c in agg.summed:
        t = src.field(c).type
        fields.append(pa.field(sum_col(c), sum_type(t), nullable=False))
        if pa.types.is_floating(t):
            fields.append(pa.field(comp_col(c), pa.float64(), nullable=False))
            fields += [pa.field(special_col(kind, c), pa.int64(), nullable=False) for kind in SPECIALS]
    return pa.schema(fields, metadata={
        VIEW_METADATA_KEY: definition.encode(),
        READ_FIELDS_METADATA_KEY: json.dumps(read_field_ids(definition, ds)),
    })


def view_schema(definition: ViewDefinition, datasets: list[lance.LanceDataset]) -> pa.Schema:
    """:func:`agg_view_schema` over the view's one source (model.kinds: every kind's schema by this name)."""
    return agg_view_schema(definition, datasets[0])
