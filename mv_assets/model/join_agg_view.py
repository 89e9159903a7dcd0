"""Join aggregates (kind ``"join_aggregate"``): joins and ``GROUP BY`` in one
view, as SQL users write them (TPC-H Q3: ``orders ⋈ customer ⋈ lineitem ...
GROUP BY l_orderkey, o_orderdate``, ``sum(l_extendedprice * (1 - l_discount))``).

``customer.search(None).join(orders, ...).join(lineitem, ...).where(...)
.group_by("l_orderkey", "o_orderdate").agg({"revenue": "sum(l_extendedprice *
(1 - l_discount))"})`` is one view, one asset and one status for its user.
Under it the engine keeps the join as a join view of its own
(:mod:`mv_assets.model.join_view`, maintained by the delta rule), named
:func:`join_under` of the view and never listed, holding only the columns
the keys and aggregates read (an aggregate of an expression reads a SQL column
of the join computing it); the view itself is an aggregate view over it
(:mod:`mv_assets.model.agg_view`), maintained from the join's own changes.
A refresh brings the join up to date, then the groups, and records every
table's version, so the status and the sensors see any of them move.

Pure: names and definitions; no I/O.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from mv_assets.model.agg_view import Aggregate, agg_view_schema, holds_aggregate, parse_aggs
from mv_assets.model.names import JOIN_UNDER_PREFIX

__all__ = ["JOIN_AGG_KIND", "JOIN_UNDER_PREFIX", "join_under", "is_join_under", "JoinAggregate", "split",
           "spec", "view_schema", "in_users_words"]

JOIN_AGG_KIND = "join_aggregate"

_CALL = re.compile(r"^\s*([A-Za-z_]+)\s*\(\s*(distinct\s+)?(.*?)\s*\)\s*$", re.I | re.S)
_IDENT = r"(?:`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)"
_NAME = re.compile(rf"^{_IDENT}(?:\.{_IDENT})?$")


def join_under(name: str) -> str:
    """The name of the join kept under join aggregate ``name``.

    >>> join_under("q3")
    '__mvjoin__q3'
    """
    return JOIN_UNDER_PREFIX + name


def is_join_under(name: str) -> bool:
    return name.startswith(JOIN_UNDER_PREFIX)


def hidden_join_refusal(name: str) -> str | None:
    """What a user naming the join kept under a join aggregate is told (it
    is never listed, refreshed or planned on its own); None for other names.

    >>> hidden_join_refusal("__mvjoin__q3")
    "no view named '__mvjoin__q3': it is the join the join aggregate 'q3' keeps under it; use 'q3'"
    """
    if not is_join_under(name):
        return None
    owner = name.removeprefix(JOIN_UNDER_PREFIX)
    return f"no view named {name!r}: it is the join the join aggregate {owner!r} keeps under it; use {owner!r}"


@dataclass(frozen=True)
class JoinAggregate:
    """How a join query with ``group_by().agg()`` splits: the join's columns
    (``select`` items: name -> the name or SQL it reads), and the keys and
    aggregates of the aggregate over them (naming those columns)."""

    select: list[tuple[str, str]]
    keys: tuple[str, ...]
    aggs: dict[str, str]


def _unquote(name: str) -> str:
    return ".".join(p[1:-1] if p.startswith("`") else p for p in re.findall(_IDENT, name))


def split(keys: tuple[str, ...], aggs: dict[str, str], select: list[tuple[str, Any]] | None,
          resolve: "Callable[[str], Any] | None" = None) -> JoinAggregate:
    """Split a join aggregate's ``group_by`` keys and ``agg`` calls into the
    join's columns and the aggregate over them.

    With ``select()`` the keys and aggregates name its columns. Without, the
    join keeps the columns they read: a name (``o_orderdate``,
    ``customers.name``) as its column's own name (qualified names that would
    clash: ``customers_name``), an expression argument
    (``sum(price * (1 - discount))``) as a SQL column named after the output.
    A key is a name: group by an expression by selecting it with a name
    first. ``resolve``: what a name reads (the join's name resolution:
    ``amt`` and ``orders.amt`` are one column when only orders has it); a
    name it cannot resolve is left to the join to refuse.

    >>> s = split(("c.name",), {"n": "count(*)", "rev": "sum(price * (1 - disc))"}, None)
    >>> s.select, s.keys, s.aggs
    ([('name', 'c.name'), ('rev_arg', 'price * (1 - disc)')], ('name',), {'n': 'count(*)', 'rev': 'sum(rev_arg)'})
    >>> split(("oid % 2",), {"n": "count(*)"}, None)
    Traceback (most recent call last):
    ...
    ValueError: group_by() over a join: 'oid % 2' is not a column name; select() it with a name first, then group by that name (or make the join view, then an aggregate view over it)
    """
    parse_aggs(_plain_calls(aggs))  # (functions and outputs refused in the aggregate's own words)
    for k in keys:
        if not _NAME.match(k.strip()):
            raise ValueError(f"group_by() over a join: {k!r} is not a column name; select() it with a name first, "
                             "then group by that name (or make the join view, then an aggregate view over it)")
    if select is not None:
        return JoinAggregate([(n, v) for n, v in select], tuple(keys), dict(aggs))
    out: dict[str, str] = {}  # join column -> what it reads
    names: dict[Any, str] = {}  # what a name reads (resolved, else as written) -> its join column

    def column(ref: str) -> str:
        ref = _unquote(ref.strip())
        read: Any = ref
        if resolve is not None:
            try:
                read = resolve(ref)
            except ValueError:  # (unknown or ambiguous: the join says so in its own words)
                pass
        if read in names:
            return names[read]
        bare = ref.rsplit(".", 1)[-1]
        name = bare if bare not in out else ref.replace(".", "_")
        if name in out:
            raise ValueError(f"group_by()/agg() over a join: {ref!r} and {out[name]!r} would both be column "
                             f"{name!r}; select() the join's columns first, with names of their own")
        out[name], names[read] = ref, name
        return name

    new_keys = tuple(column(k) for k in keys)
    for at, k in enumerate(new_keys):
        if k in new_keys[:at]:
            raise ValueError(f"group_by() names one column twice: {keys[new_keys.index(k)]!r} and {keys[at]!r}")
    new_aggs: dict[str, str] = {}
    for name, call in aggs.items():
        m = _CALL.match(call)
        assert m is not None  # (parse_aggs read it)
        fn, distinct, arg = m.group(1), m.group(2) or "", m.group(3)
        q = ""
        if fn.lower() == "approx_quantile":
            arg, q = arg.rsplit(",", 1)
            arg, q = arg.strip(), ", " + q.strip()
        if arg == "*":
            new_aggs[name] = call
            continue
        if _NAME.match(arg):
            inner = column(arg)
        else:  # an expression: a SQL column of the join computes it
            if holds_aggregate(arg):
                raise ValueError(f"aggregate {name!r} = {call}: an aggregate cannot hold another ({arg}); "
                                 "aggregates take a column or an expression over one row")
            inner = f"{name}_arg"
            if inner in out:
                raise ValueError(f"aggregate {name!r}: the join's column {inner!r} is taken; select() the join's "
                                 "columns first")
            out[inner] = arg
        new_aggs[name] = f"{fn}({distinct}{inner}{q})"
    return JoinAggregate(list(out.items()), new_keys, new_aggs)


def in_users_words(message: str, name: str, select: list[tuple[str, str]]) -> str:
    """A refusal of the join kept under join aggregate ``name`` (whose
    columns are ``select``) in the user's words: the view's name, and an
    aggregate's argument where the join computes it as a column.

    >>> in_users_words("view '__mvjoin__q': column 'n_arg' calls now()", "q", [("n_arg", "max(now())")])
    "view 'q': the argument of aggregate 'n' (max(now())) calls now()"
    >>> in_users_words("a = avg(c_name): 'c_name' is string", "q", [("name", "o.name"), ("c_name", "c.name")])
    "a = avg(c.name): 'c.name' is string"
    """
    message = message.replace(f"view {join_under(name)!r}", f"view {name!r}")
    for column, read in select:
        if column.endswith("_arg"):
            message = message.replace(f"column {column!r}", f"the argument of aggregate {column[:-4]!r} ({read})")
        elif column != read:  # (a name the join renamed: customers.name as customers_name)
            message = message.replace(f"({column})", f"({read})").replace(repr(column), repr(read))
    return message


def _plain_calls(aggs: dict[str, str]) -> dict[str, str]:
    """The calls with any argument as a stand-in column (an expression is
    checked as SQL by the join, the function and output names here)."""
    plain = {}
    for name, call in aggs.items():
        if not isinstance(call, str):
            plain[name] = call
            continue
        m = _CALL.match(call)
        if m is None or m.group(3) == "*" or _NAME.match(m.group(3)):
            plain[name] = call
            continue
        q = ""
        if m.group(1).lower() == "approx_quantile" and "," in m.group(3):
            q = ", " + m.group(3).rsplit(",", 1)[1].strip()
        plain[name] = f"{m.group(1)}({m.group(2) or ''}x{q})"
    return plain


def spec(join_name: str, sources: list[str], keys: tuple[str, ...], aggs: dict[str, str]) -> dict:
    """The view's stored function: its aggregate over the join named
    ``join_name`` (its source), and every table it reads (``sources``: the
    join first, then its tables)."""
    return {**Aggregate(tuple(keys), tuple(parse_aggs(aggs))).to_spec(), "kind": JOIN_AGG_KIND,
            "sources": [join_name, *dict.fromkeys(sources)]}


def view_schema(definition: Any, datasets: list) -> pa.Schema:
    """The view's schema: an aggregate view's over the join under it (``datasets[0]``)."""
    return agg_view_schema(definition, datasets[0])
