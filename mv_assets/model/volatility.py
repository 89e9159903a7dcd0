"""SQL a materialized view may not hold: functions whose value is not fixed by
the row they read.

A view is refreshed incrementally: each row is computed at the refresh that
first saw it and kept until its source row changes. ``now()`` in a view's
projection or filter would then hold one timestamp per refresh, a mix that no
single evaluation of the query gives (and ``random()`` a mix of draws). So,
as in lancedb and pg_ivm, a view's SQL is refused at creation when it calls a
function DataFusion evaluates anew each time (volatile: ``random()``,
``uuid()``), one fixed only per statement (``now()``, ``current_date``...) or
one whose value depends on something other than the row (``version()``, the
engine's; ``arrow_metadata()``, the schema's metadata, which changes with no
row write; ``arrow_typeof()``, as lancedb refuses it).

The check reads SQL tokens, not substrings: a function is a name followed by
``(`` outside string literals, quoted identifiers and comments (``'now()'``
is a string; a column named ``now`` or `` `random` `` is a column); the SQL
keywords that need no parentheses (``current_date``, ``current_timestamp``,
``current_time``) count bare too. Strings are tokenized as Lance's SQL does:
``'...'`` with ``''`` for a quote and no backslash escapes (``'a\'`` is a
whole string).

>>> volatile_functions("x > 1 AND ts < now()")
['now']
>>> volatile_functions("note = 'now() or random()' -- random()")
[]
>>> volatile_functions('CURRENT_DATE - "random"(x) + `uuid`')
['current_date', 'random']
"""

import re

__all__ = ["VOLATILE_FUNCTIONS", "volatile_functions", "check_deterministic"]

# name -> why its value is not the row's
VOLATILE_FUNCTIONS: dict[str, str] = {
    "now": "the time of the evaluation",
    "current_timestamp": "the time of the evaluation",
    "current_date": "the date of the evaluation",
    "current_time": "the time of the evaluation",
    "localtime": "the time of the evaluation",
    "localtimestamp": "the time of the evaluation",
    "today": "the date of the evaluation",
    "random": "a new draw at each evaluation",
    "rand": "a new draw at each evaluation",
    "uuid": "a new value at each evaluation",
    "gen_random_uuid": "a new value at each evaluation",
    "version": "the engine's version, not the row",
    "arrow_metadata": "the schema's metadata, which changes with no row write",
    "arrow_typeof": "the engine's type names, not the row's values",
}
_BARE_KEYWORDS = {"current_date", "current_timestamp", "current_time"}  # (Lance's SQL has no bare localtime)

_TOKEN = re.compile(
    r"""
      (?P<space>\s+)
    | (?P<line_comment>--[^\n]*)
    | (?P<block_comment>/\*.*?(?:\*/|\Z))
    | (?P<string>'(?:[^']|'')*(?:'|\Z))
    | (?P<quoted>"(?:[^"]|"")*(?:"|\Z)|`(?:[^`]|``)*(?:`|\Z))
    | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
    | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)


def _unquote(token: str) -> str:
    if token[0] == '"':
        return token[1:-1].replace('""', '"')
    return token[1:-1].replace("``", "`")


def volatile_functions(sql: str | None) -> list[str]:
    """The functions of :data:`VOLATILE_FUNCTIONS` that ``sql`` calls, in order
    of first call, lower case."""
    if not sql:
        return []
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(sql)
              if m.lastgroup not in ("space", "line_comment", "block_comment")]
    found: list[str] = []
    for i, (kind, text) in enumerate(tokens):
        if kind == "word":
            name, bare_ok = text.lower(), True
        elif kind == "quoted":  # a quoted name is a function only when called
            name, bare_ok = _unquote(text).lower(), False
        else:
            continue
        if name not in VOLATILE_FUNCTIONS:
            continue
        if i > 0 and tokens[i - 1][1] == ".":  # a.now: a struct field, not a function
            continue
        called = i + 1 < len(tokens) and tokens[i + 1][1] == "("
        if (called or (bare_ok and name in _BARE_KEYWORDS)) and name not in found:
            found.append(name)
    return found


def check_deterministic(view: str, texts: dict[str, str | None]) -> None:
    """ValueError naming the first volatile function among ``texts``
    (``{"the filter": sql, "column 'x'": sql}``) of view ``view``."""
    for where, sql in texts.items():
        names = volatile_functions(sql)
        if names:
            name = names[0]
            raise ValueError(
                f"view {view!r}: {where} calls {name}(), which is not deterministic ({VOLATILE_FUNCTIONS[name]}): "
                f"a view is refreshed incrementally, so rows computed at different refreshes would hold different "
                f"values, which no single evaluation of the query gives. Write the value into the source table "
                f"instead (e.g. an ingestion-time column), or compute it in a @udf column (computed once per row, "
                f"when the row is first seen); see docs/concepts.md"
            )
