"""Dropping, renaming and relaxing columns (``drop_columns``, ``alter_columns``
with ``rename`` / ``nullable``), without breaking what reads them.

Everything is checked before anything is written (``ValueError``):

* a column that a view over the table reads (selects, feeds to a UDF, names
  in SQL or its filter), or that another computed column reads, is neither
  dropped nor renamed: the reader would break (drop or change the reader
  first, or drop both in one call);
* the engine's own columns (``__*``) and the primary key are not dropped;
* a computed column goes with its marker and its stored definition;
* a view's rows and columns are its query's: only columns added with
  ``add_columns`` can be dropped from a view (its definition forgets them, as
  if never added); renaming a view's column or changing its nullability is
  refused (recreate the view with ``select({"new": "old"})``).

A drop or rename is one Lance commit of the columns, then one commit of the
stored definitions (under the table's lock). Between the two, a computed
column whose data column is gone is ignored (``stored_columns``), so a crash
leaves at worst a stale entry, never a definition naming a missing column
that the engine would use.
"""

import dataclasses
import json
from typing import Any

from mv_assets.model.definition import (
    COLUMNS_METADATA_KEY,
    VIEW_METADATA_KEY,
    ColumnSpec,
    ViewDefinition,
    computed_marker,
    definition_reads,
    encode_columns,
    is_reserved_name,
    stored_columns,
)
from mv_assets.model.names import PRIMARY_KEY_METADATA_KEY
from mv_assets.storage.refs import Ref, TableRef, ViewRef

__all__ = ["drop_columns", "rename_or_relax_columns", "column_readers", "SCHEMA_KEYS"]

SCHEMA_KEYS = frozenset({"path", "rename", "nullable", "data_type"})


def _light(specs: list[ColumnSpec]) -> dict:
    """A definition-like dict of computed columns, for :func:`definition_reads` (no UDF unpickled twice)."""
    return {"columns": [
        {"name": c.name, "kind": c.kind, "expr": c.expr,
         "udf": {"input_columns": c.udf.input_columns if c.udf is not None else None}}
        for c in specs
    ]}


def column_readers(table: Ref, columns: list[str], views: dict[str, str],
                   skip: "set[str] | frozenset[str]" = frozenset()) -> list[str]:
    """Who reads any of ``columns`` of ``table``: ``"view 'v'"`` for views over
    it (``views``: name -> stored definition JSON), ``"computed column 'c'"``
    for its computed columns (except those in ``skip``)."""
    names = table.dataset().schema.names
    out = []
    for view, raw in sorted(views.items()):
        if definition_reads(json.loads(raw), columns, names):
            out.append(f"view {view!r}")
    if isinstance(table, TableRef):
        for c in stored_columns(table.dataset().schema):
            if c.name not in skip and c.name not in columns and definition_reads(_light([c]), columns, names):
                out.append(f"computed column {c.name!r}")
    return out


def _check_names(columns: Any, what: str) -> list[str]:
    if isinstance(columns, str):
        columns = [columns]
    if not isinstance(columns, (list, tuple)) or not columns or not all(isinstance(c, str) for c in columns):
        raise ValueError(f"{what} takes a column name or a non-empty list of them, got {columns!r}")
    return list(dict.fromkeys(columns))


def drop_columns(table: Ref, columns: Any, views: dict[str, str], *, computed_only: bool = False) -> int:
    """Drop ``columns`` (with their markers and stored definitions). ``views``:
    the views over the table (name -> stored definition JSON).
    ``computed_only``: the table is a chunk view, whose other columns are its
    query's. Returns the new version."""
    cols = _check_names(columns, "drop_columns()")
    ds = table.dataset()
    names = ds.schema.names
    missing = [c for c in cols if c not in names]
    if missing:
        raise ValueError(f"{table.name!r} has no columns {missing}; its columns are "
                         f"{[n for n in names if not is_reserved_name(n)]}")
    internal = [c for c in cols if is_reserved_name(c)]
    if internal:
        raise ValueError(f"columns {internal} are maintained by mv_assets and cannot be dropped")
    pk = (ds.schema.metadata or {}).get(PRIMARY_KEY_METADATA_KEY.encode())
    if pk is not None and pk.decode() in cols:
        raise ValueError(f"{pk.decode()!r} is the primary key of {table.name!r}; it cannot be dropped")
    computed = {c.name for c in table.computed_columns()}
    if isinstance(table, ViewRef) or computed_only:
        fixed = [c for c in cols if c not in computed or (isinstance(table, ViewRef) and not _added(table, c))]
        if fixed:
            raise ValueError(
                f"columns {fixed} are part of view {table.name!r}'s query (its rows are maintained by refresh()): only "
                "columns added with add_columns() can be dropped; recreate the view without them"
            )
    if len(cols) == len([n for n in names if not is_reserved_name(n)]):
        raise ValueError(f"drop_columns() would drop every column of {table.name!r}; drop the table instead")
    readers = column_readers(table, cols, views)
    if readers:
        raise ValueError(f"cannot drop {cols} from {table.name!r}: {', '.join(readers)} read(s) them; "
                         "drop or change those first (or drop them in the same call)")
    dropped = cols + [computed_marker(c) for c in cols if computed_marker(c) in names]
    with table.lock():
        table.dataset().drop_columns(dropped)
        _forget(table, set(cols) & computed)
    return table.dataset().version


def _added(view: ViewRef, column: str) -> bool:
    return any(c.name == column and c.added for c in view.definition.columns)


def _forget(table: Ref, gone: set[str], renamed: dict[str, str] | None = None) -> None:
    """Store the computed columns' definitions without ``gone`` (and with ``renamed`` ones' new names)."""
    renamed = renamed or {}
    if not gone and not renamed:
        return
    ds = table.dataset()
    md = ds.schema.metadata or {}
    if isinstance(table, ViewRef):
        definition = ViewDefinition.decode(md[VIEW_METADATA_KEY.encode()])
        cols = tuple(c for c in definition.columns if c.name not in gone)
        ds.update_schema_metadata({VIEW_METADATA_KEY: dataclasses.replace(definition, columns=cols).encode().decode()})
        return
    raw = md.get(COLUMNS_METADATA_KEY.encode())
    if raw is None:
        return
    specs = [ColumnSpec.from_json(d) for d in json.loads(raw)]
    kept = [dataclasses.replace(c, name=renamed.get(c.name, c.name)) for c in specs if c.name not in gone]
    ds.update_schema_metadata({COLUMNS_METADATA_KEY: encode_columns(kept)})


def rename_or_relax_columns(table: Ref, alterations: list[dict], views: dict[str, str],
                            *, computed_only: bool = False) -> int:
    """Lance's ``alter_columns`` alterations ``{"path", "rename", "nullable"}``
    (lancedb's names), checked first. Returns the new version."""
    if isinstance(table, ViewRef) or computed_only:
        raise ValueError(
            f"{table.name!r} is a materialized view: its columns are its query's; renaming a column or changing its "
            "nullability is not supported on a view (recreate it, e.g. select({'new_name': 'old_name'})); "
            "alter_columns({'path': col, 'udf': new_udf}) swaps a UDF"
        )
    ds = table.dataset()
    names = ds.schema.names
    computed = {c.name for c in table.computed_columns()}
    lance_alts: list[dict] = []
    renamed: dict[str, str] = {}
    for alt in alterations:
        path = alt.get("path")
        if not isinstance(path, str) or path not in names or is_reserved_name(path):
            raise ValueError(f"alter_columns: {table.name!r} has no column {path!r}")
        if "data_type" in alt:
            raise ValueError(f"alter_columns: changing the type of {path!r} is not supported; add a computed column "
                             f"of the new type instead, e.g. add_columns({{'new': 'CAST({path} AS ...)'}})")
        out: dict[str, Any] = {"path": path}
        if "rename" in alt:
            new = alt["rename"]
            if not isinstance(new, str) or not new or is_reserved_name(new):
                raise ValueError(f"alter_columns: {new!r} is not a valid new name for {path!r} "
                                 "(names starting with '__' are reserved)")
            if "." in new:
                raise ValueError(f"alter_columns: {new!r} is not a valid new name for {path!r}: a '.' is read by "
                                 "Lance as the path of a nested field")
            if new in names or new in renamed.values():
                raise ValueError(f"alter_columns: {table.name!r} already has a column {new!r}")
            cased = [n for n in names if n.lower() == new.lower() and n != path]
            if cased:  # (Lance's SQL reads unquoted names whatever their case: readers of one would read the other)
                raise ValueError(f"alter_columns: {new!r} differs from the column {cased[0]!r} of {table.name!r} "
                                 "only by case, which Lance's SQL does not tell apart; pick another name")
            readers = column_readers(table, [path], views, skip={path})
            if readers:
                raise ValueError(f"cannot rename {path!r} of {table.name!r}: {', '.join(readers)} read(s) it; "
                                 "drop or change those first")
            out["name"] = renamed[path] = new
        if "nullable" in alt:
            nullable = alt["nullable"]
            if not isinstance(nullable, bool):
                raise ValueError(f"alter_columns: nullable is True or False, got {nullable!r}")
            if not nullable and path in computed:
                raise ValueError(f"alter_columns: {path!r} is a computed column: it is NULL until computed, so it "
                                 "stays nullable")
            if not nullable and ds.count_rows(filter=f"`{path}` IS NULL"):
                raise ValueError(f"alter_columns: {path!r} holds NULLs; it cannot be made non-nullable")
            out["nullable"] = nullable
        if len(out) == 1:
            raise ValueError(f"alter_columns: nothing to change for {path!r}; give 'rename', 'nullable' or 'udf'")
        lance_alts.append(out)
        if path in renamed and path in computed:
            lance_alts.append({"path": computed_marker(path), "name": computed_marker(renamed[path])})
    with table.lock():
        ds = table.dataset()
        ds.alter_columns(*lance_alts)
        pk = (ds.schema.metadata or {}).get(PRIMARY_KEY_METADATA_KEY.encode())
        if pk is not None and pk.decode() in renamed:
            table.dataset().update_schema_metadata({PRIMARY_KEY_METADATA_KEY: renamed[pk.decode()]})
        _forget(table, set(), {k: v for k, v in renamed.items() if k in computed})
    return table.dataset().version
