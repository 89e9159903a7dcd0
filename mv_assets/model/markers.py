"""What a computed column's hidden marker holds, and when a row's value is current.

Every computed column ``c`` has a hidden string column ``__computed__c`` (see
:func:`~mv_assets.model.names.computed_marker`). NULL means the row's value was
never computed, or its UDF failed on the row.

* **In a table** the marker is ``"<fingerprint>@<row version>"``: the code that
  computed the value and the row's ``_row_last_updated_at_version`` when its
  inputs were read. The value is current while both still hold. Any later write
  of the row, whoever makes it (mv_assets, plain pylance ``update`` or
  ``merge_insert``, lancedb, Spark), moves the row's version, so the row reads as
  stale until it is computed again: currency follows the input rows' versions.
  Backfills write values with Lance's ``rewrite_columns`` updates, which keep row
  versions, so a freshly computed value stays current.
* **In a view** the marker is the bare fingerprint: a view row's inputs are the
  source row it was computed from (``__source_row_id`` / ``__source_row_version``),
  kept current by the view's refresh.

Pure: strings and Arrow arrays only.

>>> marker_value("ab12", 7)
'ab12@7'
>>> current_sql("y", "ab12", versioned=True)
"`__computed__y` = concat('ab12@', CAST(_row_last_updated_at_version AS STRING))"
>>> stale_sql("y", "ab12", versioned=False)
"(`__computed__y` IS NULL OR `__computed__y` != 'ab12')"
"""

import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.model.names import computed_marker

__all__ = ["marker_value", "stamp", "current_sql", "stale_sql", "ROW_VERSION_COLUMN"]

ROW_VERSION_COLUMN = "_row_last_updated_at_version"


def marker_value(fingerprint: str, row_version: int | None) -> str:
    """The marker of a value computed by ``fingerprint`` (at ``row_version`` in a table)."""
    return fingerprint if row_version is None else f"{fingerprint}@{int(row_version)}"


def stamp(markers: pa.Array, row_versions: pa.Array) -> pa.Array:
    """Table markers from bare ones: ``fingerprint@version`` where a marker is
    set (NULL stays NULL: never computed or failed)."""
    versions = pc.cast(row_versions, pa.string())  # pyright: ignore[reportAttributeAccessIssue]
    return pc.binary_join_element_wise(markers, versions, "@")  # pyright: ignore[reportAttributeAccessIssue]


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def current_sql(column: str, fingerprint: str, *, versioned: bool) -> str:
    """SQL true for rows whose ``column`` value was computed by ``fingerprint``
    (and, ``versioned``, for the row as it is now)."""
    m = _quote(computed_marker(column))
    if versioned:
        return f"{m} = concat('{fingerprint}@', CAST({ROW_VERSION_COLUMN} AS STRING))"
    return f"{m} = '{fingerprint}'"


def stale_sql(column: str, fingerprint: str, *, versioned: bool) -> str:
    """SQL true for rows whose ``column`` value is missing, failed or stale."""
    m = _quote(computed_marker(column))
    if versioned:
        return f"({m} IS NULL OR {m} != concat('{fingerprint}@', CAST({ROW_VERSION_COLUMN} AS STRING)))"
    return f"({m} IS NULL OR {m} != '{fingerprint}')"


def recompute_words(rows: int, never: int) -> tuple[str, str]:
    """How a run that recomputes a UDF column's stale rows names them: (what
    it does, with its reason, and the rows), e.g. ``("recomputing (UDF code
    changed)", "10 rows computed by other code")``. ``never``: how many of the
    ``rows`` no code has computed (``Table.rows_never_computed``): all of them,
    a column just added."""
    if rows and never >= rows:
        return "computing (a new UDF column)", f"{rows:,} rows never computed"
    other = f"{rows - never:,} rows computed by other code"
    return "recomputing (UDF code changed)", other + (f", {never:,} never computed" if never else "")
