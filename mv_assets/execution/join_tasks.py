"""A join view's task (kind ``"join"``, :mod:`mv_assets.model.join_view`):
the view rows of some of the first table's rows.

The first table's rows (by fragment, or by stable row id for an incremental
refresh) are joined with each joined table at the version the plan chose,
one step after the other, as pyarrow hash joins of the keys and row
positions only (any column type travels; only the keys are hashed); a joined
table is read whole, or only its rows whose key is among the left side's
keys when those are few. NULL keys never match; a LEFT row without a match
is kept with NULLs. The filter and SQL columns are then evaluated by Lance
over the staged rows (the same SQL dialect as every view's), and UDF columns
computed, except where the view already holds a value computed from the same
input rows: a row whose UDF reads no source row that changed (by stable row
id, for each source the UDF reads) keeps its value with no UDF call.
"""

import functools
import shutil
import tempfile
from collections.abc import Callable, Iterator

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.execution import blobs, progress
from mv_assets.model.definition import ColumnSpec, ViewDefinition, computed_marker, sql_literals
from mv_assets.model.join_view import Join, joined_row_id, pushed_filters, row_id_column, staged_name
from mv_assets.model.names import JOINED_ROW_ID_PREFIX, SOURCE_ROW_ID, SOURCE_ROW_VERSION
from mv_assets.model.planning import direct_positions, distinct, isin, positions
from mv_assets.storage import objects
from mv_assets.storage.lance_compat import take_rows

__all__ = ["join_batches", "match_key", "row_identities", "joined_version", "UdfCall", "computed_join", "joined_rows", "evaluated", "planned_calls", "key_filter", "read_first", "ID_CHUNK", "KEY_FILTER_MAX"]

# Row ids per ``_rowid IN`` list when rows are read by id.
ID_CHUNK = 20_000
# At most this many distinct left keys: a joined table is read through an ``IN``
# filter on its key; beyond, whole (a hash join of every row is cheaper than the filter).
KEY_FILTER_MAX = 5_000
# Left rows whose distinct keys are counted first: more than KEY_FILTER_MAX among them and
# the right side is read whole without the distinct keys of every left row (a 1M-row task
# of a first refresh: 0.05 s each, 5% of a 10M-row join's first refresh).
_HEAD_ROWS = 4 * KEY_FILTER_MAX
# Rows per batch of the view's rows (UDF calls, progress).
OUT_BATCH = 1 << 16
_LI, _RI = "__li", "__ri"
_POS = "__pos"  # a staged row's position, through the SQL's evaluation


def _id_array(t: pa.Table, name: str) -> np.ndarray:
    return np.asarray(t.column(name).to_numpy(), dtype=np.int64)


def row_versions(ds: lance.LanceDataset, ids: np.ndarray) -> pa.Array:
    """The ``_row_last_updated_at_version`` of rows by stable id (in the order
    given; every id must exist): an ``IN`` filter for a few, else one scan of
    the row id and version columns (cheap: Lance keeps them as metadata)."""
    if len(ids) <= ID_CHUNK:
        t = ds.to_table(columns=["_row_last_updated_at_version"], with_row_id=True,
                        filter="_rowid IN (" + ", ".join(map(str, ids.tolist())) + ")") if len(ids) else None
    else:
        t = ds.to_table(columns=["_row_last_updated_at_version"], with_row_id=True)
    if t is None:
        return pa.array([], pa.int64())
    pos = positions(ids, _id_array(t, "_rowid"))  # (each id's row among those scanned: the ids are hashed)
    if (pos < 0).any():
        raise RuntimeError(f"{int((pos < 0).sum())} rows of {ds.uri} at version {ds.version} were not found by id")
    return pa.array(np.asarray(t.column("_row_last_updated_at_version").to_numpy(), np.int64)[pos], pa.int64())


def _versions(ds: lance.LanceDataset, ids: np.ndarray, known: tuple[np.ndarray, np.ndarray] | None) -> pa.Array:
    """Row versions of ``ids``: from ``known`` (ids, versions) where there, the others read."""
    out = np.zeros(len(ids), dtype=np.int64)
    todo = np.ones(len(ids), dtype=bool)
    if known is not None and len(known[0]):
        pos = positions(ids, known[0])
        hit = pos >= 0
        out[hit] = known[1][pos[hit]]
        todo = ~hit
    if todo.any():
        out[todo] = np.asarray(row_versions(ds, ids[todo]).to_numpy(), np.int64)
    return pa.array(out, pa.int64())


def read_first(ds: lance.LanceDataset, columns: list[str], *, fragments: list[int] | None = None,
               ids: np.ndarray | None = None, part: list[int] | None = None,
               known: tuple[np.ndarray, np.ndarray] | None = None, pushed: str | None = None,
               addresses: list | None = None) -> pa.Table:
    """The first table's rows (its staged columns, row id and version): of
    these ``fragments``, with these stable row ``ids`` (those still there), or
    the ``part`` [fragment, offset, limit] of one fragment. ``known``: row
    versions by id already known (read by ``ids`` only for the others).
    ``pushed``: the filter's conjuncts on the first table alone, applied by
    the scan of whole fragments (the rows failing them make no view row).
    ``addresses``: rows read by ``ids`` append their row addresses there (in
    the table's order; where each row is now: its fragment is its partition)."""
    projection = {staged_name(0, c): f"`{c}`" for c in columns}
    projection[SOURCE_ROW_VERSION] = "_row_last_updated_at_version"
    if ids is not None:  # by stable row id (the ids of rows deleted since are skipped)
        ids = distinct(np.asarray(ids, np.int64))
        if len(ids):  # (Lance's take by row id cannot read row versions of updated rows: read apart)
            taken = take_rows(ds, pa.array(ids, pa.uint64()), [*columns, "_rowid", "_rowaddr"])
            if addresses is not None:
                addresses.append(np.asarray(taken.column("_rowaddr").to_numpy(), np.uint64))
            taken = taken.drop_columns(["_rowaddr"])
            table = taken.rename_columns([staged_name(0, c) for c in columns] + ["_rowid"])
            table = table.append_column(SOURCE_ROW_VERSION, _versions(ds, _id_array(table, "_rowid"), known))
        else:
            table = ds.scanner(columns=projection, with_row_id=True, limit=0, blob_handling=blobs.BYTES).to_table()
    elif part is not None:
        fragment = ds.get_fragment(int(part[0]))
        if fragment is None:
            raise RuntimeError(f"fragment {part[0]} does not exist at version {ds.version} of {ds.uri}")
        table = fragment.scanner(columns=projection, with_row_id=True, offset=int(part[1]),
                                 limit=int(part[2]), blob_handling=blobs.BYTES).to_table()
    else:
        frags = None if fragments is None else [ds.get_fragment(int(f)) for f in fragments]
        if frags is not None and any(f is None for f in frags):
            raise RuntimeError(f"a fragment of {fragments} does not exist at version {ds.version} of {ds.uri}")
        table = _scan(ds, dict(columns=projection, with_row_id=True, fragments=frags, scan_in_order=True,
                               blob_handling=blobs.BYTES), None, pushed)
    table = table.rename_columns([SOURCE_ROW_ID if n == "_rowid" else n for n in table.column_names])
    return table.set_column(table.schema.get_field_index(SOURCE_ROW_ID), SOURCE_ROW_ID,
                            table.column(SOURCE_ROW_ID).cast(pa.int64())).set_column(
        table.schema.get_field_index(SOURCE_ROW_VERSION), SOURCE_ROW_VERSION,
        table.column(SOURCE_ROW_VERSION).cast(pa.int64()))


def key_filter(keys: list[str], values: "list[pa.ChunkedArray | pa.Array]") -> str | None:
    """An ``IN`` filter on a one-column key for the distinct non-NULL ``values``
    (``false`` for none), or None (read every row) for a composite key, more
    than :data:`KEY_FILTER_MAX` values or a type without SQL literals."""
    if len(keys) != 1:
        return None
    head = values[0].slice(0, _HEAD_ROWS)  # (a first look: most tasks of a big join bail out here)
    if len(values[0]) > _HEAD_ROWS and pc.count_distinct(head).as_py() > KEY_FILTER_MAX:  # pyright: ignore[reportAttributeAccessIssue]
        return None
    distinct = pc.unique(values[0].drop_null())  # pyright: ignore[reportAttributeAccessIssue]
    if len(distinct) > KEY_FILTER_MAX:
        return None
    if len(distinct) == 0:
        return "false"
    try:
        return f"`{keys[0]}` IN (" + ", ".join(sql_literals(distinct)) + ")"
    except ValueError:  # a key type without a SQL literal: read whole
        return None


def joined_version(i: int) -> str:
    """The staged column holding the version of source ``i``'s row (what a
    checkpointed UDF value of the joined row depends on, with its id)."""
    return f"__jv{i}"


def _read_joined(ds: lance.LanceDataset, i: int, columns: list[str], keys: list[str],
                 left_values: list[pa.ChunkedArray], pushed: str | None = None) -> pa.Table:
    """Source ``i``'s rows (staged columns, row id and version) that can match the
    left side's key values: through an ``IN`` filter when the keys are few, else
    all; and that pass ``pushed``, the filter's conjuncts on this source alone."""
    projection = {staged_name(i, c): f"`{c}`" for c in columns}
    projection[joined_version(i)] = "_row_last_updated_at_version"
    table = _scan(ds, dict(columns=projection, with_row_id=True, blob_handling=blobs.BYTES),
                  key_filter(keys, left_values), pushed)
    return table.rename_columns([joined_row_id(i) if n == "_rowid" else n for n in table.column_names])


def _scan(scannable, kwargs: dict, filter_sql: str | None, pushed: str | None) -> pa.Table:
    """``scannable.to_table`` (a dataset) or ``.scanner().to_table()`` (a fragment)
    with ``filter_sql`` and the pushed conjuncts ANDed; the conjuncts are an
    optimization only (the filter applies after the join): a scan that cannot
    take them (a function Lance reads otherwise once regenerated) goes without."""
    def run(f: str | None) -> pa.Table:
        return scannable.scanner(filter=f, **kwargs).to_table()

    if pushed:
        try:
            return run(pushed if filter_sql is None else f"({filter_sql}) AND {pushed}")
        except (ValueError, OSError, pa.ArrowInvalid):
            pass
    return run(filter_sql)


def joined_rows(first: pa.Table, datasets: list[lance.LanceDataset], join: Join) -> pa.Table:
    """``first`` (see :func:`read_first`) joined, step by step, with the other sources
    (each read with the filter's conjuncts on it alone: :func:`pushed_filters`)."""
    rel = first
    pushed = pushed_filters(join)
    for step in join.steps:
        i = step.index
        left_cols = [staged_name(s, c) for s, c in step.left]
        right = _read_joined(datasets[i], i, join.reads(i), list(step.right), [rel.column(c) for c in left_cols],
                             pushed.get(i))
        li, ri = _matches(rel, left_cols, right, [staged_name(i, c) for c in step.right], step.how)
        taken = right.take(ri)
        if li is not None:
            rel = rel.filter(li) if li.type == pa.bool_() else rel.take(li)
        for name in taken.column_names:
            rel = rel.append_column(name, taken.column(name).cast(pa.int64()) if name == joined_row_id(i)
                                    else taken.column(name))
    return rel


def match_key(values: "pa.ChunkedArray | pa.Array") -> "pa.ChunkedArray | pa.Array":
    """A key column as joins compare it: SQL's float equality, where -0.0
    equals 0.0 (Arrow's hashing tells them apart; adding +0.0 turns -0.0 into
    0.0 and changes no other value; NaN matches NaN, as it does in Arrow)."""
    if pa.types.is_floating(values.type):
        return pc.add(values, pa.scalar(0, values.type))  # pyright: ignore[reportAttributeAccessIssue]
    return values


def _int64(values: "pa.ChunkedArray | pa.Array") -> "tuple[np.ndarray, np.ndarray | None] | None":
    """An integer column as int64 values and its validity (None: no NULL), or
    None when it is not integers or a value does not fit in an int64."""
    if not pa.types.is_integer(values.type):
        return None
    try:
        as64 = values.cast(pa.int64())  # (a safe cast: a uint64 past int64's range raises)
    except (pa.ArrowInvalid, OverflowError):
        return None
    if isinstance(as64, pa.ChunkedArray):
        as64 = as64.combine_chunks()
    if not as64.null_count:
        return np.asarray(as64.to_numpy()), None
    return np.asarray(as64.fill_null(0).to_numpy()), np.asarray(as64.is_valid().to_numpy(zero_copy_only=False))


def _looked_up(left: "pa.ChunkedArray | pa.Array", right_key: "pa.ChunkedArray | pa.Array") -> pa.Array | None:
    """For each left value, the position of the right row with that key (NULL:
    none; NULLs match nothing), when both are integers and the right key's
    values are distinct and dense enough for a table of their span
    (:func:`direct_positions`, a gather a value); else None."""
    r, lv = _int64(right_key), _int64(left)
    if r is None or lv is None:
        return None
    keys, valid = r
    where = None if valid is None else np.flatnonzero(valid)
    pos = direct_positions(lv[0], keys if where is None else keys[where])
    if pos is None:
        return None
    if where is not None and len(where):  # (positions among the non-NULL keys -> positions in the table)
        pos = np.where(pos >= 0, where[np.maximum(pos, 0)], -1)
    missing = pos < 0
    if lv[1] is not None:
        missing |= ~lv[1]
    return pa.array(pos, mask=missing) if missing.any() else pa.array(pos)


def _matches(rel: pa.Table, left: list[str], right: pa.Table, right_keys: list[str], how: str):
    """Which left rows the joined rows come from (None: every row, in order; a
    mask: those rows, in order; else positions) and the right row each takes
    (NULL: a LEFT row without match). A right side whose key is one column of
    distinct values (a dimension) is looked up by hash, keeping the left rows'
    order, and only the right side is gathered; otherwise a hash join of the
    keys and row positions."""
    if len(left) == 1:
        ri = _looked_up(rel.column(left[0]), right.column(right_keys[0]))
        if ri is not None:
            if how == "left":
                return None, ri
            found = ri.is_valid()
            return found, ri.filter(found)
        key = match_key(right.column(right_keys[0]))
        non_null = key.drop_null()
        if pc.count_distinct(non_null).as_py() == len(non_null):  # pyright: ignore[reportAttributeAccessIssue]
            ri = pc.index_in(match_key(rel.column(left[0])), value_set=non_null.combine_chunks())  # pyright: ignore[reportAttributeAccessIssue]
            if key.null_count:  # positions among the non-NULL keys -> positions in the table
                where = np.flatnonzero(np.asarray(key.is_valid().to_numpy(zero_copy_only=False)))
                ri = pc.take(pa.array(where), ri)  # pyright: ignore[reportAttributeAccessIssue]
            if how == "left":
                return None, ri
            found = ri.is_valid()
            return found, ri.filter(found)
    keys = [f"__k{n}" for n in range(len(left))]
    lhs = pa.table({**{k: match_key(rel.column(c)) for k, c in zip(keys, left, strict=True)},
                    _LI: pa.array(np.arange(rel.num_rows, dtype=np.int64))})
    rhs = pa.table({**{k: match_key(right.column(c)) for k, c in zip(keys, right_keys, strict=True)},
                    _RI: pa.array(np.arange(right.num_rows, dtype=np.int64))})
    matched = lhs.join(rhs, keys=keys, join_type="inner" if how == "inner" else "left outer",
                       use_threads=True, coalesce_keys=True)
    return matched.column(_LI), matched.column(_RI)


def evaluated(rel: pa.Table, join: Join) -> pa.Table:
    """The staged rows passing the filter, with the SQL columns (``__x__<name>``)
    evaluated by Lance over them (a scratch dataset on local disk)."""
    if not join.filter and not join.exprs:
        return rel
    # only the columns the SQL reads go to Lance (with each row's position): the rows passing
    # are then taken from ``rel`` (a wide join wrote every column it carried: half a first refresh)
    text = " ".join([join.filter or "", *join.exprs.values()])
    used = [n for n in rel.column_names if f"`{n}`" in text]
    scratch = tempfile.mkdtemp(prefix="mv-join-")
    try:
        ds = lance.write_dataset(rel.select(used).append_column(_POS, pa.array(np.arange(rel.num_rows,
                                                                                          dtype=np.int64))), scratch)
        columns = {_POS: _POS, **{f"__x__{name}": sql for name, sql in join.exprs.items()}}
        out = ds.to_table(columns=columns, filter=join.filter, scan_in_order=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    kept = rel.take(out.column(_POS)) if join.filter else rel  # (no filter: every row, in order)
    for name in join.exprs:
        kept = kept.append_column(f"__x__{name}", out.column(f"__x__{name}"))
    return kept


def _reuse(new: pa.Table, old: pa.Table, c: ColumnSpec, sources: list[int], changed: dict[int, np.ndarray],
           fingerprint: str) -> np.ndarray:
    """For each new row, the position in ``old`` of a view row whose value of
    UDF column ``c`` was computed from the same input rows (same stable ids of
    every source the UDF reads, none of them changed in what it reads), or -1."""
    pos = np.full(new.num_rows, -1, dtype=np.int64)
    if not old.num_rows or not new.num_rows:
        return pos
    keys = [row_id_column(i) for i in sources]
    current = pc.equal(old.column(computed_marker(c.name)), fingerprint).fill_null(False)  # pyright: ignore[reportAttributeAccessIssue]
    cand = pa.table({**{f"__k{n}": old.column(k).fill_null(-1) for n, k in enumerate(keys)},
                     "__oi": pa.array(np.arange(old.num_rows, dtype=np.int64))}).filter(current)
    if not cand.num_rows:
        return pos
    first = cand.group_by([f"__k{n}" for n in range(len(keys))], use_threads=False).aggregate([("__oi", "min")])
    ok = np.ones(new.num_rows, dtype=bool)
    for i in sources:
        if len(changed.get(i, ())):
            ids = np.asarray(new.column(row_id_column(i)).fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
            ok &= ~np.isin(ids, changed[i])
    probe = pa.table({**{f"__k{n}": new.column(k).fill_null(-1) for n, k in enumerate(keys)},
                      "__ni": pa.array(np.arange(new.num_rows, dtype=np.int64))})
    hit = probe.join(first, keys=[f"__k{n}" for n in range(len(keys))], join_type="inner", use_threads=False)
    ni = np.asarray(hit.column("__ni").to_numpy(), np.int64)
    oi = np.asarray(hit.column("__oi_min").to_numpy(), np.int64)
    pos[ni] = oi
    pos[~ok] = -1
    return pos


def row_identities(rel: pa.Table, sources: list[int]) -> np.ndarray:
    """Per staged row, what its UDF value depends on beyond its first-table
    row's id and version: the id and version of each joined row of
    ``sources`` (``"1:7@3;2:-"``; ``-`` a LEFT row without match), as a row
    checkpoint's input identity (one first-table row has a view row per match)."""
    parts = []
    for i in sources:
        if i == 0:
            continue
        ids = rel.column(joined_row_id(i)).cast(pa.string())
        vers = rel.column(joined_version(i)).cast(pa.string())
        parts.append(pc.binary_join_element_wise(f"{i}:", ids, "@", vers, "").fill_null(f"{i}:-"))  # pyright: ignore[reportAttributeAccessIssue]
    if not parts:
        return np.full(rel.num_rows, "", dtype=object)
    joined = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, ";")  # pyright: ignore[reportAttributeAccessIssue]
    return np.asarray(joined.to_pylist(), dtype=object)


# A join task's UDF call for one column: ``udf_call(column, inputs, first ids,
# first versions, identities, udf_rows, errors)`` -> the column's values and
# markers; ``identities()`` gives the rows' :func:`row_identities` (built only
# when a checkpoint needs them). The task's is checkpointed
# (:func:`mv_assets.execution.tasks.join_udf_call`).
UdfCall = Callable[[ColumnSpec, pa.RecordBatch, pa.Array, pa.Array, Callable[[], np.ndarray], dict, list],
                   dict[str, pa.Array]]


def _udf_values(rel: pa.Table, join: Join, definition: ViewDefinition, udf_rows: dict, errors: list,
                old: pa.Table | None, changed: dict, udf_call: UdfCall) -> dict[str, pa.Array]:
    """Every UDF column's values and markers for the rows of ``rel`` (see :data:`UdfCall`)."""
    out: dict[str, pa.Array] = {}
    ids = rel.column(SOURCE_ROW_ID).combine_chunks()
    versions = rel.column(SOURCE_ROW_VERSION).combine_chunks()
    for c in definition.udf_columns:
        u = c.the_udf
        udf_rows.setdefault(c.name, 0)
        pos = _to_compute(rel, join, c, old, changed)
        todo = np.flatnonzero(pos < 0)
        values: pa.Array
        markers: pa.Array
        computed_v = computed_m = pa.array([], pa.null())
        if len(todo):
            every = len(todo) == rel.num_rows  # (nothing to copy: no gather)
            sub = rel if every else rel.take(pa.array(todo))
            inputs = pa.RecordBatch.from_arrays(
                [sub.column(staged_name(*join.refs[n])).combine_chunks() for n in u.input_columns],
                names=list(u.input_columns))
            got = udf_call(c, inputs, ids if every else ids.take(pa.array(todo)),
                           versions if every else versions.take(pa.array(todo)),
                           _once(functools.partial(row_identities, sub, join.udf_sources.get(c.name, []))),
                           udf_rows, errors)
            computed_v, computed_m = got[c.name], got[computed_marker(c.name)]
        if len(todo) == rel.num_rows:
            values, markers = computed_v, computed_m
        else:
            assert old is not None
            kept = np.flatnonzero(pos >= 0)
            order = np.concatenate([kept, todo]) if len(todo) else kept
            parts_v = [old.column(c.name).take(pa.array(pos[kept]))]
            parts_m = [old.column(computed_marker(c.name)).take(pa.array(pos[kept]))]
            if len(todo):
                parts_v.append(pa.chunked_array([computed_v]))
                parts_m.append(pa.chunked_array([computed_m]))
            inverse = np.empty(len(order), dtype=np.int64)
            inverse[order] = np.arange(len(order))
            values = pa.chunked_array([ch for p in parts_v for ch in p.chunks], type=parts_v[0].type) \
                .take(pa.array(inverse)).combine_chunks()
            markers = pa.chunked_array([ch for p in parts_m for ch in p.chunks], type=pa.string()) \
                .take(pa.array(inverse)).combine_chunks()
        out[c.name], out[computed_marker(c.name)] = values, markers
    return out


def _once(make: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
    """``make``, called at most once."""
    got: list[np.ndarray] = []

    def value() -> np.ndarray:
        if not got:
            got.append(make())
        return got[0]
    return value


def _view_batch(rel: pa.Table, join: Join, definition: ViewDefinition, schema: pa.Schema,
                udfs: dict[str, pa.Array]) -> pa.Table:
    columns = {c.name: c for c in definition.columns}
    arrays = []
    for f in schema:
        if f.name in udfs:
            col = udfs[f.name]
        elif f.name in columns and columns[f.name].kind == "sql":
            col = rel.column(f"__x__{f.name}")
        elif f.name in columns:
            col = rel.column(staged_name(*join.refs[columns[f.name].expr or f.name]))
        else:  # the row keys
            col = rel.column(f.name)
        arrays.append(col.cast(f.type) if col.type != f.type else col)
    return pa.Table.from_arrays(arrays, schema=schema)


def join_batches(definition: ViewDefinition, schema: pa.Schema, args: dict, udf_rows: dict,
                 errors: list, udf_call: UdfCall, stats: dict | None = None) -> Iterator[pa.RecordBatch]:
    """The view rows of one task: ``args`` (planned by :mod:`mv_assets.ops.join_refresh`)
    names the sources' uris and versions and the first table's fragments or row ids.
    ``stats["rows_replaced"]``: how many of them replace a view row removed with the
    same provenance (the same source rows: an update, as its reader sees it)."""
    datasets = [objects.dataset(u, version=v) for u, v in zip(args["uris"], args["versions"], strict=True)]
    yield from _batches_over(definition, schema, args, udf_rows, errors, datasets, udf_call, stats)


def _staged(definition: ViewDefinition, args: dict, datasets: list[lance.LanceDataset],
            touched: set[int] | None = None) -> tuple[Join, pa.Table, pa.Table, pa.Table | None]:
    """The task's first-table rows, their staged join (filtered, SQL columns
    evaluated) and the view's rows of them it may reuse UDF values from.
    ``touched``: gets the first table's fragments (where they are now) of the
    rows read by id whose view rows change: those the task writes view rows
    of, and those whose old view rows go (the fragments of rows scanned whole
    the plan knows)."""
    join = Join.of(definition)
    old = None
    reuse = args.get("reuse") or {}
    rows = reuse.get("rows") or []
    if rows:  # the view's rows of these first-table rows (the plan found them), by the view's stable row ids
        view_ds = objects.dataset(args["view_uri"], version=reuse["view_version"])
        values = [n for n in view_ds.schema.names if n in {c.name for c in definition.udf_columns}
                  or n in {computed_marker(c.name) for c in definition.udf_columns}]
        # (their provenance and versions as the plan's arrangement holds them: only the UDF values
        # are read, in the order asked; a NULL provenance id was held as -1)
        taken = take_rows(view_ds, pa.array(rows, pa.uint64()), values)
        ids = {n: np.asarray(v, np.int64) for n, v in reuse["held"].items()}
        old = pa.table({**{n: pa.array(v, pa.int64(), mask=v < 0 if n.startswith(JOINED_ROW_ID_PREFIX) else None)
                           for n, v in ids.items()}, **{n: taken.column(n) for n in values}})
    # the row versions already known: passed by the plan (the change feed's, the view's arrangement's),
    # and those of the view rows read whole
    known = [np.asarray(v, np.int64) for v in args.get("known_versions") or ([], [])]
    if old is not None:
        known = [np.concatenate([known[0], _id_array(old, SOURCE_ROW_ID)]),
                 np.concatenate([known[1], _id_array(old, SOURCE_ROW_VERSION)])]
    addresses: list[np.ndarray] = []
    first = read_first(datasets[0], join.reads(0), fragments=args.get("fragments"),
                       ids=None if args.get("ids") is None else np.asarray(args["ids"], np.int64),
                       part=args.get("slice"), known=(known[0], known[1]), pushed=pushed_filters(join).get(0),
                       addresses=addresses)
    staged = evaluated(joined_rows(first, datasets, join), join)
    if touched is not None and addresses:
        changed = _id_array(staged, SOURCE_ROW_ID)
        removed = _removed(args, old)
        if removed is not None:
            changed = np.concatenate([changed, _id_array(removed, SOURCE_ROW_ID)])
        mine = isin(_id_array(first, SOURCE_ROW_ID), distinct(changed))
        touched.update(int(f) for f in np.unique(addresses[0][mine] >> np.uint64(32)))
    return join, first, staged, old


def replaced_rows(new: pa.Table, old: pa.Table, sources: int) -> int:
    """How many rows of ``new`` have the provenance of a row of ``old`` (the same
    stable id of every source row, a LEFT row's missing match included)."""
    if not new.num_rows or not old.num_rows:
        return 0
    keys = [row_id_column(i) for i in range(sources)]
    names = [f"__k{n}" for n in range(sources)]

    def keyed(t: pa.Table) -> pa.Table:
        return pa.table({n: t.column(k).cast(pa.int64()).fill_null(-1) for n, k in zip(names, keys, strict=True)})

    distinct_old = keyed(old).group_by(names, use_threads=False).aggregate([])
    return keyed(new).join(distinct_old, keys=names, join_type="inner", use_threads=False).num_rows


def _to_compute(rel: pa.Table, join: Join, c: ColumnSpec, old: pa.Table | None, changed: dict) -> np.ndarray:
    """For each row: the position of the view row to copy ``c``'s value from, or -1 (computed)."""
    if old is None:
        return np.full(rel.num_rows, -1, dtype=np.int64)
    return _reuse(rel, old, c, join.udf_sources.get(c.name, []),
                  {int(k): np.asarray(v, np.int64) for k, v in changed.get(c.name, {}).items()}, c.fingerprint)


def planned_calls(definition: ViewDefinition, args: dict) -> tuple[int, dict[str, int], int]:
    """A task's view rows, each UDF column's calls, exactly, without calling
    any UDF (a dry run's counts: rows whose value is copied, or whose inputs
    are NULL under ``skip_nulls``, call nothing), and how many of the rows
    replace a view row of the same provenance (updates: :func:`replaced_rows`)."""
    datasets = [objects.dataset(u, version=v) for u, v in zip(args["uris"], args["versions"], strict=True)]
    join, _, staged, old = _staged(definition, args, datasets)
    calls = {}
    for c in definition.udf_columns:
        todo = _to_compute(staged, join, c, old, (args.get("reuse") or {}).get("changed", {})) < 0
        if c.the_udf.skip_nulls:
            for ref in c.the_udf.input_columns:
                todo &= ~np.asarray(staged.column(staged_name(*join.refs[ref])).is_null().to_numpy(
                    zero_copy_only=False))
        calls[c.name] = int(todo.sum())
    removed = _removed(args, old)
    return staged.num_rows, calls, (0 if removed is None else replaced_rows(staged, removed, len(join.sources)))


def _removed(args: dict, old: pa.Table | None) -> pa.Table | None:
    """The provenance of the view rows the refresh removes that came from the
    task's first-table rows: as the plan gave it, else of the view rows read."""
    given = (args.get("reuse") or {}).get("provenance")
    if given is None:
        return old
    return pa.table({name: pa.array(ids, pa.int64()) for name, ids in given.items()})


def _batches_over(definition: ViewDefinition, schema: pa.Schema, args: dict, udf_rows: dict, errors: list,
                  datasets: list[lance.LanceDataset], udf_call: UdfCall,
                  stats: dict | None = None) -> Iterator[pa.RecordBatch]:
    touched: set[int] = set()
    join, first, staged, old = _staged(definition, args, datasets, touched)
    if stats is not None and touched:
        stats["first_fragments"] = sorted(touched)
    removed = _removed(args, old)
    if stats is not None and removed is not None:
        stats["rows_replaced"] = stats.get("rows_replaced", 0) + replaced_rows(staged, removed, len(join.sources))
    done = 0
    for start in range(0, staged.num_rows, OUT_BATCH):
        rel = staged.slice(start, OUT_BATCH)
        udfs = _udf_values(rel, join, definition, udf_rows, errors, old, (args.get("reuse") or {}).get("changed", {}),
                           udf_call)
        yield from _view_batch(rel, join, definition, schema, udfs).to_batches()
        step = first.num_rows * (start + rel.num_rows) // staged.num_rows - done  # (progress counts first rows)
        progress.advance(step)
        done += step
    progress.advance(first.num_rows - done)


def computed_join(definition: ViewDefinition, schema: pa.Schema, datasets: list[lance.LanceDataset],
                  compute_udf_columns: Callable) -> pa.Table:
    """Every row of a join view over ``datasets`` (at their versions), in this process."""
    args = {"uris": [d.uri for d in datasets], "versions": [d.version for d in datasets], "fragments": None}
    udf_rows: dict[str, int] = {}

    def udf_call(c, inputs, ids, versions, _identities, rows, errors):
        return compute_udf_columns([c], inputs, ids, versions, rows, errors)
    batches = list(_batches_over(definition, schema, args, udf_rows, [], datasets, udf_call))
    return pa.Table.from_batches(batches, schema=schema)
