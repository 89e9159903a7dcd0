"""Which columns a SQL text reads: answered in one place, by a real SQL parser.

A view's filter and SQL columns are Lance (DataFusion) SQL expressions. What
they read decides what makes the view stale (a backfill of a column it reads),
the Dagster column lineage, and which columns an aggregate's removed rows are
taken with. A name inside a string literal (``kind = 'words'``) or a comment
is not read; a backtick-quoted name (```my col```) is; a dotted name
(``info.vals``) reads ``vals`` and ``info`` (a struct's field or a table's
column: both counted).

Parsed with sqlglot (Spark's dialect: single-quoted strings, backtick-quoted
identifiers, as Lance writes them). A text sqlglot cannot parse falls back to
matching whole identifiers outside string literals: never fewer names than
the text reads, so nothing that matters is missed.

>>> columns_read("kind = 'words' AND n_words > 3", ["kind", "words", "n_words"])
['kind', 'n_words']
>>> columns_read("length(`my col`) + x", ["my col", "x", "y"])
['my col', 'x']
>>> columns_read("videos.lang = 'en'", ["lang", "title"])
['lang']
>>> columns_read("info.vals > 1", ["info", "vals"])  # a struct's field, or a table's column: both counted
['info', 'vals']
"""

import functools
import re
from collections.abc import Iterable

__all__ = ["columns_read", "identifiers"]


@functools.lru_cache(maxsize=4096)
def identifiers(sql: str) -> frozenset[tuple[str | None, str, bool]] | None:
    """The column references of ``sql`` as (table or None, name, quoted), or
    None when sqlglot cannot parse it."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError, TokenError

    try:
        tree = sqlglot.parse_one(sql, read="spark")
    except (ParseError, TokenError, ValueError):
        return None
    if tree is None:
        return frozenset()
    out = set()
    for col in tree.find_all(exp.Column):
        ident = col.this
        if not isinstance(ident, exp.Identifier):  # a star, a placeholder
            continue
        out.add((col.table or None, ident.this, bool(ident.quoted)))
    return frozenset(out)


_STRING = re.compile(r"'(?:[^']|'')*'")


def _fallback(sql: str, names: Iterable[str]) -> list[str]:
    bare = _STRING.sub("''", sql)
    return [n for n in names if re.search(r"(?<![A-Za-z0-9_])" + re.escape(n) + r"(?![A-Za-z0-9_])", bare)]


def columns_read(sql: str | None, names: Iterable[str]) -> list[str]:
    """Which of ``names`` (in their order) the SQL expression ``sql`` reads.
    An unquoted name matches case-insensitively (DataFusion folds unquoted
    identifiers), a quoted one exactly."""
    names = list(names)
    if not sql:
        return []
    found = identifiers(sql)
    if found is None:
        return _fallback(sql, names)
    # (``a.b`` is a struct field ``b`` of column ``a`` as well as column ``b`` of table ``a``:
    # both are counted, never fewer names than are read)
    exact = {n for _, n, _ in found} | {t for t, _, _ in found if t}
    folded = {n.lower() for _, n, quoted in found if not quoted} | {t.lower() for t, _, _ in found if t}
    return [n for n in names if n in exact or n.lower() in folded]
