"""Aggregate views' group arithmetic (kind ``"aggregate"``, see :mod:`mv_assets.model.agg_view`).

* :func:`groups_from_rows`: the exact state and outputs of every group of some
  rows (a full refresh: all passing rows; a recompute: one group's rows).
* :func:`apply_changes`: the new rows of the groups the changes since ``v0``
  touched, from the view's current rows of those groups and the changed source
  rows with signed weights (an insert +1; a delete -1, its values read from the
  source at ``v0`` by stable row id; an update -old +new): counts and sums are
  added; a min / max absorbs new values and is recomputed from the source only
  for the groups whose current extreme was deleted or updated away (their whole
  state is then recomputed exactly: float sums re-based); a group whose row
  count reaches 0 goes.

Float sums are carried as double-doubles (the sum and a remainder column,
about 106 bits): each incremental refresh adds the exact sum of its changed
rows' values (``math.fsum``), so a long history adds no drift; a group
recomputed for its min / max is re-based on its exact sum. A full refresh sums
each group with Arrow (pairwise: within a few ulps of the exact sum per group).

Used by the planner (exact counts for the dry run) and by the task (rows
written), with the same pinned versions, so both see the same result.
"""

import math
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.model.agg_view import GROUP, ROWS, Aggregate, cnt_col, comp_col, group_key, sum_col
from mv_assets.model.definition import quote_ident, sql_literal
from mv_assets.model.names import SOURCE_ROW_ID
from mv_assets.model.udtf_view import partition_id
from mv_assets.storage import objects

__all__ = ["GroupChanges", "groups_from_rows", "apply_changes", "changed_rows", "agg_batches"]

ID_CHUNK = 50_000  # row ids per ``_rowid IN`` lookup of old values
GROUPS_PER_SCAN = 500  # groups per recompute scan (their predicate is an OR of key matches)


def _and(*parts: str | None) -> str | None:
    kept = [p for p in parts if p]
    return " AND ".join(f"({p})" for p in kept) if kept else None


def _aggregate(rows: pa.Table, agg: Aggregate, exact: bool = False) -> pa.Table | None:
    """Per group of ``rows``: ``__n`` rows, ``__c_<i>`` non-NULL counts, ``__s_<i>`` sums,
    ``__lo_<i>`` / ``__hi_<i>`` extremes (i: the value column's position), and the keys
    (None: no rows). ``exact``: float sums as the exact sum's double-double
    (``__s_<i>`` + ``__e_<i>``, by ``math.fsum`` of each group's values: for
    changes, whose rows are few); else Arrow's (pairwise) sum."""
    cols = agg.value_columns
    specs: list = [([], "count_all")]
    for c in cols:
        specs.append((c, "count"))
    floats = [c for c in agg.summed() if pa.types.is_floating(rows.schema.field(c).type)] if exact else []
    for c in agg.summed():
        specs.append((c, "list" if c in floats else "sum"))
    for fn, c in agg.extremes():
        specs.append((c, fn))
    keys = list(agg.keys)
    if rows.num_rows == 0:
        return None
    if keys:
        grouped = rows.group_by(keys, use_threads=False).aggregate(specs)
    else:  # one group of every row
        grouped = rows.append_column("__one", pa.array(np.zeros(rows.num_rows, np.int8))).group_by(
            ["__one"], use_threads=False).aggregate(specs)
    # pyarrow names an output "<column>_<function>" ("count_all"); where it puts the keys varies by version
    produced = ["count_all"] + [f"{c}_count" for c in cols] + [
        f"{c}_list" if c in floats else f"{c}_sum" for c in agg.summed()] + [f"{c}_{fn}" for fn, c in agg.extremes()]
    names = ["__n"] + [f"__c_{cols.index(c)}" for c in cols] + [f"__s_{cols.index(c)}" for c in agg.summed()] + [
        f"__{'lo' if fn == 'min' else 'hi'}_{cols.index(c)}" for fn, c in agg.extremes()]
    out = grouped.select(keys + produced).rename_columns(keys + names)
    for c in floats:  # the exact sum of each group's values, as hi + lo
        at = out.schema.get_field_index(f"__s_{cols.index(c)}")
        pairs = [_exact([v for v in vals if v is not None]) for vals in out.column(at).to_pylist()]
        out = out.set_column(at, f"__s_{cols.index(c)}", pa.array([p[0] for p in pairs], pa.float64()))
        out = out.append_column(f"__e_{cols.index(c)}", pa.array([p[1] for p in pairs], pa.float64()))
    return out


def _exact(values: list[float]) -> tuple[float, float]:
    """The exact sum of ``values`` as a double-double (hi, lo): hi the correctly
    rounded sum, lo the rounded remainder."""
    hi = math.fsum(values)
    if not math.isfinite(hi):
        return hi, 0.0
    return hi, math.fsum([*values, -hi])


def _two_sum(a: float, b: float) -> tuple[float, float]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _dd_add(hi: float, lo: float, x_hi: float, x_lo: float) -> tuple[float, float]:
    """(hi + lo) + (x_hi + x_lo) in double-double arithmetic (about 106 bits)."""
    s, e = _two_sum(hi, x_hi)
    if not math.isfinite(s):
        return s, 0.0
    e += lo + x_lo
    t = s + e
    return t, e - (t - s)


def _keys_of(table: pa.Table, agg: Aggregate) -> list[str]:
    if not agg.keys:
        return [group_key([])] * table.num_rows
    columns = [table.column(k).to_pylist() for k in agg.keys]
    return [group_key(list(vals)) for vals in zip(*columns, strict=True)]


@dataclass
class _State:
    """One group's state while changes are applied (Python values)."""

    key_values: list
    rows: int = 0
    cnt: dict = field(default_factory=dict)  # value column -> non-NULL count
    sums: dict = field(default_factory=dict)  # summed column -> sum
    comp: dict = field(default_factory=dict)  # float summed column -> compensation
    ext: dict = field(default_factory=dict)  # (fn, column) -> extreme or None


def _states(grouped: pa.Table | None, agg: Aggregate) -> dict[str, _State]:
    """States of groups from :func:`_aggregate`'s output (exact: compensation 0)."""
    cols = agg.value_columns
    out: dict[str, _State] = {}
    if grouped is None or grouped.num_rows == 0:
        return out
    data = grouped.to_pydict()
    keys = _keys_of(grouped, agg)
    for i, key in enumerate(keys):
        st = _State([data[k][i] for k in agg.keys], rows=int(data["__n"][i]))
        for j, c in enumerate(cols):
            st.cnt[c] = int(data[f"__c_{j}"][i])
        for c in agg.summed():
            v = data[f"__s_{cols.index(c)}"][i]
            st.sums[c] = v if v is not None else 0
            err = data.get(f"__e_{cols.index(c)}")
            st.comp[c] = float(err[i]) if err is not None else 0.0
        for fn, c in agg.extremes():
            st.ext[(fn, c)] = data[f"__{'lo' if fn == 'min' else 'hi'}_{cols.index(c)}"][i]
        out[key] = st
    return out


def _view_states(view_rows: pa.Table, agg: Aggregate, schema: pa.Schema) -> dict[str, _State]:
    out: dict[str, _State] = {}
    if view_rows.num_rows == 0:
        return out
    data = view_rows.to_pydict()
    by_fn = {(a.fn, a.column): a.name for a in agg.aggs if a.fn in ("min", "max")}
    for i, key in enumerate(data[GROUP]):
        st = _State([data[k][i] for k in agg.keys], rows=int(data[ROWS][i]))
        for c in agg.value_columns:
            st.cnt[c] = int(data[cnt_col(c)][i])
        for c in agg.summed():
            st.sums[c] = data[sum_col(c)][i]
            st.comp[c] = data[comp_col(c)][i] if comp_col(c) in schema.names else 0.0
        for fn, c in agg.extremes():
            st.ext[(fn, c)] = data[by_fn[(fn, c)]][i]
        out[key] = st
    return out


def _rows_table(states: dict[str, _State], agg: Aggregate, schema: pa.Schema) -> pa.Table:
    """The view rows of groups with rows, in ``schema`` (sorted by key: deterministic files)."""
    keys = sorted(k for k, st in states.items() if st.rows > 0)
    cols: dict[str, list] = {f.name: [] for f in schema}
    for key in keys:
        st = states[key]
        cols[SOURCE_ROW_ID].append(partition_id(key))
        cols[GROUP].append(key)
        for k, v in zip(agg.keys, st.key_values, strict=True):
            cols[k].append(v)
        for a in agg.aggs:
            c = a.column
            if a.fn == "count":
                cols[a.name].append(st.rows if c is None else st.cnt[c])
            elif a.fn == "sum":
                assert c is not None
                cols[a.name].append((st.sums[c] + st.comp[c]) if st.cnt[c] else None)
            elif a.fn == "avg":
                assert c is not None
                cols[a.name].append(float(st.sums[c] + st.comp[c]) / st.cnt[c] if st.cnt[c] else None)
            else:
                cols[a.name].append(st.ext[(a.fn, c)] if st.cnt[c] else None)
        cols[ROWS].append(st.rows)
        for c in agg.value_columns:
            cols[cnt_col(c)].append(st.cnt[c])
        for c in agg.summed():
            cols[sum_col(c)].append(st.sums[c])
            if comp_col(c) in cols:
                cols[comp_col(c)].append(st.comp[c])
    return pa.Table.from_arrays([pa.array(cols[f.name], f.type) for f in schema], schema=schema)


def groups_from_rows(rows: pa.Table, agg: Aggregate, schema: pa.Schema) -> pa.Table:
    """The view rows of every group of ``rows`` (exact state)."""
    return _rows_table(_states(_aggregate(rows, agg), agg), agg, schema)


def changed_rows(src: lance.LanceDataset, old: lance.LanceDataset, filter_sql: str | None, agg: Aggregate,
                 moved: list[int] | None, appended: bool) -> tuple[pa.Table, pa.Table]:
    """The source rows the changes since ``old``'s version add (written since,
    passing now, at ``src``) and remove (updated or deleted since, passing at
    ``old``, their values there), each with the aggregate's input columns."""
    v0 = old.version
    since = f"_row_last_updated_at_version > {int(v0)}"
    inputs = agg.input_columns
    frags = None if moved is None else [f for f in (src.get_fragment(i) for i in moved) if f is not None]
    if frags is not None and not frags:
        plus = src.schema.empty_table().select(inputs)
        written = np.empty(0, np.int64)
    else:
        plus = src.scanner(columns=inputs, filter=_and(since, filter_sql), fragments=frags).to_table()
        written = (np.empty(0, np.int64) if appended else
                   src.scanner(columns=[], filter=since, with_row_id=True, fragments=frags).to_table()
                   .column("_rowid").to_numpy().astype(np.int64))
    deleted = (src.delta(begin_version=v0, end_version=src.version).get_deleted_row_ids().read_all()
               .column(0).to_numpy().astype(np.int64) if src.version > v0 and not appended
               else np.empty(0, np.int64))
    old_ids = np.unique(np.concatenate([written, deleted]))
    parts = []
    for lo in range(0, len(old_ids), ID_CHUNK):
        chunk = ", ".join(str(int(i)) for i in old_ids[lo:lo + ID_CHUNK])
        parts.append(old.to_table(columns=inputs, filter=_and(f"_rowid IN ({chunk})", filter_sql)))
    minus = pa.concat_tables(parts) if parts else old.schema.empty_table().select(inputs)
    return plus, minus


def _group_predicate(agg: Aggregate, states: list[_State], schema: pa.Schema) -> str:
    ors = []
    for st in states:
        ands = []
        for k, v in zip(agg.keys, st.key_values, strict=True):
            ands.append(f"{quote_ident(k)} IS NULL" if v is None else f"{quote_ident(k)} = {sql_literal(v)}")
        ors.append("(" + " AND ".join(ands) + ")" if ands else "true")
    return " OR ".join(ors) if ors else "false"


@dataclass
class GroupChanges:
    """What applying the changes since ``v0`` does to the touched groups."""

    rows: pa.Table  # the new view rows of the touched groups that still have rows
    inserted: list[str]  # group keys new to the view
    updated: list[str]  # group keys the view holds and keeps (rows rewritten)
    deleted: list[str]  # group keys the view holds whose row count reached 0
    recomputed: list[str]  # groups whose min / max was deleted or updated away: recomputed from the source
    source_rows: int  # changed source rows read (added + removed)


def apply_changes(src: lance.LanceDataset, old: lance.LanceDataset, view_rows: pa.Table, filter_sql: str | None,
                  agg: Aggregate, schema: pa.Schema, moved: list[int] | None, appended: bool) -> GroupChanges:
    """The touched groups' new rows (see the module docstring). ``view_rows``:
    the view's rows (all columns) of at least the touched groups."""
    plus, minus = changed_rows(src, old, filter_sql, agg, moved, appended)
    add = _states(_aggregate(plus, agg, exact=True), agg)
    sub = _states(_aggregate(minus, agg, exact=True), agg)
    touched = set(add) | set(sub)
    held = {k: st for k, st in _view_states(view_rows, agg, schema).items() if k in touched}
    out: dict[str, _State] = {}
    recompute: list[str] = []
    floats = {c for c in agg.summed() if comp_col(c) in schema.names}
    for key in sorted(touched):
        base = held.get(key)
        a, s = add.get(key), sub.get(key)
        st = _State(list((base or a or s).key_values), rows=base.rows if base else 0)  # type: ignore[union-attr]
        for c in agg.value_columns:
            st.cnt[c] = (base.cnt[c] if base else 0) + (a.cnt[c] if a else 0) - (s.cnt[c] if s else 0)
        st.rows += (a.rows if a else 0) - (s.rows if s else 0)
        for c in agg.summed():
            total, comp = (base.sums[c], base.comp[c]) if base else (0, 0.0)
            if c in floats:  # double-double: exact deltas add no drift
                total, comp = float(total), float(comp)
                if a and a.cnt[c]:
                    total, comp = _dd_add(total, comp, float(a.sums[c]), a.comp[c])
                if s and s.cnt[c]:
                    total, comp = _dd_add(total, comp, -float(s.sums[c]), -s.comp[c])
            else:
                total = int(total) + (int(a.sums[c]) if a and a.cnt[c] else 0) - (int(s.sums[c]) if s and s.cnt[c] else 0)
            st.sums[c], st.comp[c] = total, comp
        stale = False
        for fn, c in agg.extremes():
            cur = base.ext[(fn, c)] if base else None
            gone = s.ext[(fn, c)] if s else None
            if gone is not None and cur is not None and (gone <= cur if fn == "min" else gone >= cur):
                stale = True  # the current extreme (or a value as extreme) left the group
            new = a.ext[(fn, c)] if a else None
            if new is not None and (cur is None or (new < cur if fn == "min" else new > cur)):
                cur = new
            st.ext[(fn, c)] = cur
        if st.rows > 0 and stale:
            recompute.append(key)
        out[key] = st
    if recompute:
        for lo in range(0, len(recompute), GROUPS_PER_SCAN):
            chunk = recompute[lo:lo + GROUPS_PER_SCAN]
            rows = src.to_table(columns=agg.input_columns,
                                filter=_and(_group_predicate(agg, [out[k] for k in chunk], src.schema), filter_sql))
            exact = _states(_aggregate(rows, agg, exact=True), agg)
            for k in chunk:
                out[k] = exact.get(k, _State(out[k].key_values, rows=0))
    new = _rows_table(out, agg, schema)
    return GroupChanges(
        rows=new,
        inserted=sorted(k for k in touched if k not in held and out[k].rows > 0),
        updated=sorted(k for k in touched if k in held and out[k].rows > 0),
        deleted=sorted(k for k in touched if k in held and out[k].rows <= 0),
        recomputed=recompute,
        source_rows=plus.num_rows + minus.num_rows,
    )


def view_rows_of(view_ds: lance.LanceDataset, keys: list[str] | None, with_address: bool = False) -> pa.Table:
    """The view's rows of the groups ``keys`` (None: all), all columns."""
    if keys is not None and len(keys) <= 1000:
        flt = f"{GROUP} IN ({', '.join(sql_literal(k) for k in keys)})" if keys else "false"
        return view_ds.to_table(filter=flt, with_row_address=with_address)
    rows = view_ds.to_table(with_row_address=with_address)
    if keys is None:
        return rows
    return rows.filter(pc.is_in(rows.column(GROUP), value_set=pa.array(keys, pa.string())))  # pyright: ignore[reportAttributeAccessIssue]


def agg_batches(ds: lance.LanceDataset, definition, schema: pa.Schema, args: dict | None):
    """The task's view rows: every group (``args`` None: a full refresh) or the
    groups the changes since ``args["since"]`` touched."""
    agg = Aggregate.from_definition(definition)
    if not args:
        rows = ds.to_table(columns=agg.input_columns, filter=definition.filter)
        yield from groups_from_rows(rows, agg, schema).to_batches()
        return
    old = ds.checkout_version(int(args["since"]))
    view_ds = objects.dataset(args["view_uri"], version=int(args["view_version"]))
    held = view_rows_of(view_ds, args.get("groups"))
    changes = apply_changes(ds, old, held, definition.filter, agg, schema, args.get("moved"),
                            bool(args.get("appended")))
    yield from changes.rows.to_batches()


def task_args(v0: int, view_uri: str, view_version: int, moved: list[int] | None, appended: bool,
              groups: list[str]) -> dict:
    return {"since": v0, "view_uri": view_uri, "view_version": view_version, "moved": moved,
            "appended": appended, "groups": groups}
