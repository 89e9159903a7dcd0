"""Join views (kind ``"join"``): equi-joins of a first table with other tables
or views, with a filter, plain, SQL and UDF columns over the joined columns.

``clips.search(None).join(videos, left_on="video_id", right_on="id")
.join(channels, left_on="videos.channel_id", right_on="id", how="left")
.where("videos.lang = 'en'").select({...})``

A view row is one row of the join: it keeps the stable row id of every source
row it came from (``__source_row_id`` for the first table's row,
``__join_row_id_<i>`` for the i-th joined table's, NULL for a LEFT row with
no match), so a change on any side evicts exactly its rows
(:mod:`mv_assets.ops.join_refresh` keeps the view by the delta rule).

Names are fixed when the view is created: every name the query uses (in
``select``, ``where``, SQL columns, UDF inputs) is resolved once to a
(source, column) pair and stored, so a column later added to another table
never changes what a stored view means. ``on=`` keys appear once, like SQL's
``USING`` (the left side's value); a name is qualified with its table's name
(``videos.title``) or left unqualified where only one table has it.

Inside a task the joined rows are a *staged relation* whose column for
(source ``i``, column ``c``) is :func:`staged_name` ``(i, c)``; the stored
filter and SQL columns are rewritten onto those names (sqlglot, Spark's
dialect as Lance reads it).

Pure: definitions, names and schemas; no I/O.
"""

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from mv_assets.model.definition import join_reads
from mv_assets.model.names import (
    JOINED_ROW_ID_PREFIX,
    RESERVED_PREFIX,
    SOURCE_ROW_ID,
    SOURCE_ROW_VERSION,
    is_marker,
)

__all__ = [
    "JOIN_KIND", "HOWS", "JoinStep", "Join", "Names", "staged_name", "joined_row_id", "rewrite_sql",
    "JOINED_ROW_ID_PREFIX", "pushed_filters",
]

JOIN_KIND = "join"
HOWS = ("inner", "left")


def joined_row_id(i: int) -> str:
    """The view column holding the stable row id of source ``i``'s row
    (``i`` >= 1; the first table's is ``__source_row_id``)."""
    return f"{JOINED_ROW_ID_PREFIX}{i}"


def row_id_column(i: int) -> str:
    """The view column keeping the row id of source ``i`` (0: the first table)."""
    return SOURCE_ROW_ID if i == 0 else joined_row_id(i)


def staged_name(i: int, column: str) -> str:
    """The staged relation's column for column ``column`` of source ``i``.

    >>> staged_name(1, "title")
    '__j1__title'
    """
    return f"__j{i}__{column}"


@dataclass(frozen=True)
class JoinStep:
    """One ``join``: source ``index`` (>= 1) matched to earlier columns."""

    index: int
    left: tuple[tuple[int, str], ...]  # (source, column) per key, each of one earlier source
    right: tuple[str, ...]  # the joined table's key columns
    how: str  # "inner" | "left"
    using: bool  # on=: the right keys are hidden (the left side's value is the key's)

    @property
    def left_source(self) -> int:
        return self.left[0][0]

    def to_json(self) -> dict:
        return {"index": self.index, "left": [list(k) for k in self.left], "right": list(self.right),
                "how": self.how, "using": self.using}

    @staticmethod
    def from_json(d: dict) -> "JoinStep":
        return JoinStep(int(d["index"]), tuple((int(i), str(c)) for i, c in d["left"]), tuple(d["right"]),
                        d["how"], bool(d["using"]))


@dataclass(frozen=True)
class Join:
    """A join view's stored spec (the definition's ``function``)."""

    sources: tuple[str, ...]  # catalog names; the first is the view's source
    steps: tuple[JoinStep, ...]
    refs: dict[str, tuple[int, str]] = field(default_factory=dict)  # every name used -> (source, column)
    filter: str | None = None  # the where clause on staged names
    exprs: dict[str, str] = field(default_factory=dict)  # SQL column -> its SQL on staged names
    udf_sources: dict[str, list[int]] = field(default_factory=dict)  # UDF column -> the sources it reads
    # the name each source goes by in the query (its alias; its table's name without one): a table
    # joined with itself appears under several names (a self-join), ``sources`` naming it each time
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Each source's name in the query: its alias, else its table's."""
        return self.aliases or self.sources

    def to_spec(self) -> dict:
        spec = {
            "kind": JOIN_KIND, "sources": list(self.sources), "steps": [s.to_json() for s in self.steps],
            "refs": {k: list(v) for k, v in self.refs.items()}, "filter": self.filter, "exprs": dict(self.exprs),
            "udf_sources": {k: list(v) for k, v in self.udf_sources.items()},
        }
        if self.aliases and self.aliases != self.sources:
            spec["aliases"] = list(self.aliases)
        return spec

    @staticmethod
    def from_spec(spec: dict) -> "Join":
        if spec.get("kind") != JOIN_KIND:
            raise ValueError(f"not a join spec: {spec.get('kind')!r}")
        return Join(
            tuple(spec["sources"]), tuple(JoinStep.from_json(s) for s in spec["steps"]),
            {k: (int(v[0]), str(v[1])) for k, v in spec.get("refs", {}).items()}, spec.get("filter"),
            dict(spec.get("exprs", {})), {k: [int(i) for i in v] for k, v in spec.get("udf_sources", {}).items()},
            tuple(spec.get("aliases") or ()),
        )

    def occurrences(self, name: str) -> list[int]:
        """The indexes at which table ``name`` is read (several: a self-join)."""
        return [i for i, s in enumerate(self.sources) if s == name]

    @staticmethod
    def of(definition: Any) -> "Join":
        """The join spec of a join view's definition (parsed once per definition object)."""
        cached = definition.__dict__.get("_join")
        if cached is None:
            cached = Join.from_spec(json.loads(definition.function or "{}"))
            object.__setattr__(definition, "_join", cached)
        return cached

    def reads(self, i: int) -> list[str]:
        """The columns of source ``i`` the view reads (keys, names used), in a stable order."""
        return join_reads(self.to_spec(), i)

    def step_of(self, i: int) -> JoinStep:
        return next(s for s in self.steps if s.index == i)


class Names:
    """Name resolution over the sources of a join: qualified ``table.column``
    or unqualified where one table has the column (``on=`` right keys hidden).

    >>> import pyarrow as pa
    >>> n = Names(["clips", "videos"], [pa.schema([("id", pa.int64()), ("video_id", pa.int64())]),
    ...                                 pa.schema([("id", pa.int64()), ("title", pa.string())])])
    >>> n.resolve("title"), n.resolve("videos.id")
    ((1, 'title'), (1, 'id'))
    >>> n.resolve("id")
    Traceback (most recent call last):
    ...
    ValueError: column 'id' is ambiguous: clips and videos both have it; qualify it (clips.id or videos.id)
    """

    def __init__(self, sources: list[str], schemas: list[pa.Schema]) -> None:
        self.sources = list(sources)
        self.schemas = list(schemas)
        self.hidden: set[tuple[int, str]] = set()  # on= right keys
        self.using_keys: dict[str, tuple[int, str]] = {}  # on= key name -> the left side's column

    def columns(self, i: int) -> list[str]:
        """The user's columns of source ``i`` (no internal, marker or Lance row columns)."""
        return [n for n in self.schemas[i].names if not n.startswith(RESERVED_PREFIX) and not is_marker(n)
                and not n.startswith("_row")]

    def field(self, i: int, column: str) -> pa.Field:
        return self.schemas[i].field(column)

    def table_index(self, table: str) -> int | None:
        return self.sources.index(table) if table in self.sources else None

    def resolve(self, ref: str, *, within: int | None = None) -> tuple[int, str]:
        """(source, column) of a name; ``within``: only sources up to that index are joined yet."""
        upto = len(self.sources) if within is None else within + 1
        if "." in ref:
            table, column = ref.split(".", 1)
            i = self.table_index(table)
            if i is None or i >= upto:
                known = ", ".join(self.sources[:upto])
                raise ValueError(f"unknown table {table!r} in {ref!r}: the query joins {known}")
            if column not in self.columns(i):
                raise ValueError(f"unknown column {column!r} of {table!r} in {ref!r} (its columns: {self.columns(i)})")
            return i, column
        if ref in self.using_keys and self.using_keys[ref][0] < upto:
            return self.using_keys[ref]
        found = [i for i in range(upto) if ref in self.columns(i) and (i, ref) not in self.hidden]
        if not found:
            raise ValueError(f"unknown column {ref!r}: none of {', '.join(self.sources[:upto])} has it")
        if len(found) > 1:
            tables = [self.sources[i] for i in found]
            both = " and ".join(tables) + (" both have it" if len(tables) == 2 else " all have it")
            qualified = " or ".join(f"{t}.{ref}" for t in tables)
            raise ValueError(f"column {ref!r} is ambiguous: {both}; qualify it ({qualified})")
        return found[0], ref

    def default_columns(self) -> list[tuple[str, tuple[int, str]]]:
        """Without ``select``: the first table's columns, then each joined
        table's other columns; a name on two sides is refused."""
        out: list[tuple[str, tuple[int, str]]] = []
        seen: dict[str, int] = {}
        for i in range(len(self.sources)):
            for c in self.columns(i):
                if (i, c) in self.hidden:
                    continue
                if c in seen:
                    raise ValueError(
                        f"column {c!r} is in both {self.sources[seen[c]]!r} and {self.sources[i]!r}: "
                        f"select() the columns of the join view (e.g. {{'{c}': '{self.sources[seen[c]]}.{c}', "
                        f"'{self.sources[i]}_{c}': '{self.sources[i]}.{c}'}})")
                seen[c] = i
                out.append((c, (i, c)))
        return out

    def user_schema(self) -> pa.Schema:
        """Every name a UDF may bind to: qualified names, and unqualified ones that resolve."""
        fields: list[pa.Field] = []
        names: set[str] = set()
        for i in range(len(self.sources)):
            for c in self.columns(i):
                for ref in (c, f"{self.sources[i]}.{c}"):
                    if ref in names:
                        continue
                    try:
                        if self.resolve(ref) != (i, c):
                            continue
                    except ValueError:
                        continue
                    names.add(ref)
                    fields.append(pa.field(ref, self.field(i, c).type))
        return pa.schema(fields)


_STAGED = re.compile(r"`__j(\d+)__((?:[^`]|``)+)`")


def pushed_filters(join: "Join") -> dict[int, str]:
    """The conjuncts of the join's filter that each source's scan can apply
    itself (by source, on its own column names, ANDed): those reading the
    columns of one source, that source the first table or joined INNER (a row
    failing them fails the filter in every view row it is part of; a LEFT
    join's row cannot be dropped early: its absence pads the row with NULLs,
    which the filter may take). The filter itself still applies after the join.

    >>> j = Join(("l", "o", "c"), (JoinStep(1, ((0, "k"),), ("k",), "inner", False),
    ...          JoinStep(2, ((1, "ck"),), ("ck",), "left", False)),
    ...          filter="`__j1__d` < 3 AND `__j2__seg` = 'B' AND (`__j0__x` > 1 OR `__j1__d` IS NULL) AND `__j0__x` < 9")
    >>> pushed_filters(j)
    {1: '(`d` < 3)', 0: '(`x` < 9)'}
    """
    if not join.filter:
        return {}
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError

    try:
        tree = sqlglot.parse_one(join.filter, read="spark")
    except ParseError:
        return {}
    parts = list(tree.flatten()) if isinstance(tree, exp.And) else [tree]
    out: dict[int, list[str]] = {}
    for part in parts:
        text = part.sql(dialect="spark")
        sources = {int(i) for i, _ in _STAGED.findall(text)}
        if len(sources) != 1:
            continue
        i = sources.pop()
        if i and join.step_of(i).how != "inner":
            continue
        out.setdefault(i, []).append("(" + _STAGED.sub(lambda m: f"`{m.group(2)}`", text) + ")")
    return {i: " AND ".join(texts) for i, texts in out.items()}


def rewrite_sql(sql: str, resolve) -> tuple[str, dict[str, tuple[int, str]]]:
    """``sql`` with every column reference replaced by its staged name, and
    the references it made (name as written -> (source, column)).
    ``resolve(name)`` resolves one name (raising ValueError). The text is
    kept as written around the names (sqlglot finds the column references
    and their places; nothing is regenerated in another dialect).

    >>> rewrite_sql("videos.lang = 'en' AND n > 2 AND lower(`t`) = 'n'",
    ...             lambda r: {"videos.lang": (1, "lang"), "n": (0, "n"), "t": (1, "t")}[r])[0]
    "`__j1__lang` = 'en' AND `__j0__n` > 2 AND lower(`__j1__t`) = 'n'"
    """
    from sqlglot.dialects.spark import Spark
    from sqlglot.errors import TokenError
    from sqlglot.tokenizer_core import TokenType

    from mv_assets.model.sql_names import identifiers

    found = identifiers(sql)
    if found is None:
        raise ValueError(f"cannot parse the SQL {sql!r}")
    columns = {(t, n) for t, n, _ in found}
    try:
        tokens = Spark().tokenize(sql)
    except TokenError as exc:
        raise ValueError(f"cannot parse the SQL {sql!r}: {exc}") from None
    names = (TokenType.VAR, TokenType.IDENTIFIER)

    def kind(j: int):
        return tokens[j].token_type if j < len(tokens) else None

    refs: dict[str, tuple[int, str]] = {}
    out, last, j = [], 0, 0
    while j < len(tokens):
        t = tokens[j]
        if t.token_type in names and kind(j + 1) != TokenType.L_PAREN and (j == 0 or kind(j - 1) != TokenType.DOT):
            qualified = kind(j + 1) == TokenType.DOT and kind(j + 2) in names and kind(j + 3) != TokenType.L_PAREN
            if qualified and (t.text, tokens[j + 2].text) in columns:
                written, end, step = f"{t.text}.{tokens[j + 2].text}", tokens[j + 2].end, 3
            elif (None, t.text) in columns:
                written, end, step = t.text, t.end, 1
            else:
                j += 1
                continue
            refs[written] = where = resolve(written)
            out.append(sql[last:t.start] + "`" + staged_name(*where) + "`")
            last, j = end + 1, j + step
            continue
        j += 1
    out.append(sql[last:])
    return "".join(out), refs


def build_join(sources: list[str], schemas: list[pa.Schema], joins: list[dict], select: list[tuple[str, Any]] | None,
               where: str | None, keys_only: bool = False) -> tuple[Join, list[tuple[str, str, Any]]]:
    """Resolve a join query's names (see the module docstring): its :class:`Join`
    and its output columns as ``(name, kind, value)`` (kind ``"column"``: the
    name as written; ``"sql"``: the SQL as written; ``"udf"``: the UDF bound
    to its inputs). A join's ``alias`` names its table in the query (a table
    joined with itself: each occurrence its own name). Raises ValueError, in
    the user's terms, on any unknown, ambiguous or mistyped name."""
    from mv_assets.model.udf import UDF

    aliases, names, steps = _names(sources, schemas, joins)
    keep = tuple(aliases) if aliases != list(sources) else ()
    if keys_only:  # (join() checks its keys; the outputs once the query is complete)
        return Join(tuple(sources), tuple(steps), aliases=keep), []
    refs: dict[str, tuple[int, str]] = {}
    out: list[tuple[str, str, Any]] = []
    exprs: dict[str, str] = {}
    udf_sources: dict[str, list[int]] = {}
    items = [(name, ref) for name, (i, c) in names.default_columns()
             for ref in [c if names.resolve(c) == (i, c) else f"{sources[i]}.{c}"]] if select is None else select
    seen: set[str] = set()
    for name, value in items:
        if name == value and isinstance(value, str) and "." in value and _NAME.match(value):
            name = value.split(".", 1)[1]  # a qualified name selected: the column's own name
        if not isinstance(name, str) or not name:
            raise ValueError(f"output column names must be non-empty strings, got {name!r}")
        if name in seen:
            raise ValueError(f"duplicate output column name {name!r}")
        seen.add(name)
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], UDF):
            value = value[0].with_inputs([str(v) for v in value[1]])
        if isinstance(value, UDF):
            schema = names.user_schema()
            value = value.bound_to(schema)
            value.validate_inputs(schema, name)
            for ref in value.input_columns:
                refs[ref] = names.resolve(ref)
            udf_sources[name] = sorted({refs[r][0] for r in value.input_columns})
            out.append((name, "udf", value))
        elif isinstance(value, str) and _NAME.match(value):
            refs[value] = names.resolve(value)
            out.append((name, "column", value))
        elif isinstance(value, str):
            exprs[name], used = rewrite_sql(value, names.resolve)
            refs.update(used)
            out.append((name, "sql", value))
        else:
            raise ValueError(f"column {name!r}: select() values must be a column name, a SQL expression or a UDF, "
                             f"got {type(value).__name__}")
    staged_filter = None
    if where is not None:
        staged_filter, used = rewrite_sql(where, names.resolve)
        refs.update(used)
    return Join(tuple(sources), tuple(steps), refs, staged_filter, exprs, udf_sources, keep), out


def _names(sources: list[str], schemas: list[pa.Schema], joins: list[dict]
           ) -> tuple[list[str], "Names", list[JoinStep]]:
    """A join's names of its tables (a self-join's aliases), its name
    resolution (the ``on=`` right keys hidden) and its steps."""
    aliases = [sources[0], *(_alias(j.get("alias"), t) for j, t in zip(joins, sources[1:], strict=True))]
    if len(set(aliases)) != len(aliases):
        twice = next(s for s in aliases if aliases.count(s) > 1)
        given = [t for j, t in zip(joins, sources[1:], strict=True) if j.get("alias") == twice]
        if given:  # (an alias the user gave names something else of the query already)
            other = "the query's first table" if aliases[0] == twice else "another table of the join"
            raise ValueError(f"alias {twice!r} (of {given[-1]!r}) is already the name of {other}; "
                             f"give {given[-1]!r} an alias of its own, e.g. alias='{given[-1]}2'")
        raise ValueError(f"{twice!r} is joined twice; give each occurrence of a table its own name: "
                         f".join({twice}, alias='{twice}2', ...) (a self-join), then qualify its columns "
                         f"('{twice}2.column')")
    names = Names(aliases, schemas)
    return aliases, names, [_step(names, k, j) for k, j in enumerate(joins, start=1)]


def join_resolver(sources: list[str], schemas: list[pa.Schema], joins: list[dict]):
    """What a name in a join query reads, as ``(table index, column)``
    (:meth:`Names.resolve`; ValueError for an unknown or ambiguous name)."""
    return _names(sources, schemas, joins)[1].resolve


def _alias(alias: Any, table: str) -> str:
    if alias is None:
        return table
    if not isinstance(alias, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", alias):
        raise ValueError(f"alias= names the joined table in the query: a plain identifier, got {alias!r}")
    return alias


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


def _keys(value: Any, what: str) -> list[str]:
    """The key names given: a name or a list; a name may be quoted in
    backticks (```Cust Id```), which are removed (a name with spaces may be
    given either way)."""
    keys = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if not keys or not all(isinstance(k, str) and k.strip("`") for k in keys):
        raise ValueError(f"{what} takes a column name or a list of column names, got {value!r}")
    return [k[1:-1] if len(k) > 2 and k[0] == k[-1] == "`" else k for k in keys]


def _not_a_key(ref: str, what: str, exc: ValueError) -> ValueError:
    """The error for a key name that resolves to no column: an expression is
    said to be one (join views are equi-joins), else the resolution's own."""
    if _NAME.match(ref) or not re.search(r"[^\w. ]", ref):
        return exc
    return ValueError(f"{what} names columns: {ref!r} is not a column name (join views are equi-joins: "
                      "on=, left_on= and right_on= name the columns whose values must be equal)")


def _resolve_key(names: "Names", ref: str, within: int, what: str) -> tuple[int, str]:
    """A left key's (source, column): a column of an earlier source, named as
    it is (spaces too), or qualified ``table.column``."""
    try:
        return names.resolve(ref, within=within)
    except ValueError as exc:
        raise _not_a_key(ref, what, exc) from None


def _check_key_type(table: str, column: str, t: pa.DataType) -> None:
    """Keys are compared by hashing: a nested value (list, struct, map) cannot
    be one (refused when the view is created, not at its first refresh)."""
    if pa.types.is_nested(t) or pa.types.is_dictionary(t) or pa.types.is_null(t):
        raise ValueError(f"{table}.{column} is of type {t}, which cannot be a join key (keys are scalar values: "
                         "numbers, strings, binary, dates, timestamps, booleans, decimals)")


def _step(names: Names, k: int, j: dict) -> JoinStep:
    """The k-th join (source ``k``), its keys resolved against the sources before it."""
    table = names.sources[k]
    how = j.get("how", "inner")
    if how not in HOWS:
        raise ValueError(f"how={how!r} is not supported: join views are 'inner' or 'left' joins")
    if j.get("on") is not None:
        if j.get("left_on") is not None or j.get("right_on") is not None:
            raise ValueError("join() takes on= or left_on=/right_on=, not both")
        keys = _keys(j["on"], "on=")
        left_refs, right = keys, keys
    else:
        if j.get("left_on") is None or j.get("right_on") is None:
            raise ValueError(f"join({table!r}) needs on= (a column both sides have) or left_on= and right_on=")
        left_refs, right = _keys(j["left_on"], "left_on="), _keys(j["right_on"], "right_on=")
        if len(left_refs) != len(right):
            raise ValueError(f"left_on= names {len(left_refs)} columns and right_on= {len(right)}: one per key")
        right = [r.split(".", 1)[1] if r.startswith(table + ".") else r for r in right]
    what = "on=" if j.get("on") is not None else "left_on="
    left = [_resolve_key(names, r, k - 1, what) for r in left_refs]
    for r in right:
        if r not in names.columns(k):
            unknown = ValueError(f"unknown column {r!r} of {table!r} in the join's keys (its columns: "
                                 f"{names.columns(k)})")
            raise _not_a_key(r, "on=" if j.get("on") is not None else "right_on=", unknown)
    if len({i for i, _ in left}) > 1:
        raise ValueError(f"the keys of join({table!r}) come from several tables ({left}); a join's left keys are "
                         "columns of one table")
    for (i, c), r in zip(left, right, strict=True):
        lt, rt = names.field(i, c).type, names.field(k, r).type
        _check_key_type(names.sources[i], c, lt)
        _check_key_type(table, r, rt)
        if lt != rt:
            raise ValueError(f"join key types differ: {names.sources[i]}.{c} is {lt} and {table}.{r} is {rt}; "
                             "join columns of one type (select a CAST in a view of one side)")
    using = j.get("on") is not None
    if using:
        for key, where in zip(right, left, strict=True):
            names.hidden.add((k, key))
            names.using_keys.setdefault(key, where)
    return JoinStep(k, tuple(left), tuple(right), how, using)


def join_view_schema(definition: Any, datasets: list) -> pa.Schema:
    """The Arrow schema of a join view (its row keys, columns and markers);
    plans the filter and SQL columns over the staged columns so bad SQL fails here."""
    import tempfile

    import lance

    from mv_assets.model.definition import (
        READ_FIELDS_METADATA_KEY,
        VIEW_METADATA_KEY,
        check_sql,
        computed_marker,
        short_error,
        udf_field,
    )

    join = Join.of(definition)
    staged_fields = {staged_name(i, c): datasets[i].schema.field(c).type for i, c in join.refs.values()}
    for s in join.steps:
        staged_fields.update({staged_name(i, c): datasets[i].schema.field(c).type for i, c in s.left})
    staged = pa.schema([pa.field(n, t) for n, t in staged_fields.items()] or [pa.field("__none", pa.int8())])
    projected = None
    if join.filter or join.exprs:
        with tempfile.TemporaryDirectory(prefix="mv-join-check-") as scratch:
            ds = lance.write_dataset(staged.empty_table(), scratch)
            try:
                projected = check_sql(ds, filter=join.filter, columns=dict(join.exprs))
            except (ValueError, OSError) as exc:
                said = short_error(exc)
                for i, c in join.refs.values():  # in the user's names
                    said = said.replace(staged_name(i, c), f"{join.sources[i]}.{c}")
                raise ValueError(f"invalid join view query: {said}") from exc
    fields = [pa.field(SOURCE_ROW_ID, pa.int64(), nullable=False), pa.field(SOURCE_ROW_VERSION, pa.int64(),
                                                                           nullable=False)]
    fields += [pa.field(joined_row_id(s.index), pa.int64(), nullable=True) for s in join.steps]
    for c in definition.columns:
        if c.kind == "udf":
            fields.append(udf_field(c))
        elif c.kind == "sql":
            assert projected is not None
            fields.append(pa.field(c.name, projected.field(c.name).type, nullable=True))
        else:
            i, col = join.refs[c.expr or c.name]
            fields.append(pa.field(c.name, datasets[i].schema.field(col).type, nullable=True))
    fields += [pa.field(computed_marker(c.name), pa.string(), nullable=True) for c in definition.columns
               if c.kind == "udf"]
    return pa.schema(fields, metadata={VIEW_METADATA_KEY: definition.encode(), READ_FIELDS_METADATA_KEY: "{}"})


def view_schema(definition: Any, datasets: list) -> pa.Schema:
    """:func:`join_view_schema` (model.kinds: every kind's schema by this name)."""
    return join_view_schema(definition, datasets)
