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
  count reaches 0 goes, but for the one group of an aggregate without keys:
  as in SQL (``SELECT count(*), sum(x) FROM t``), it is there over no rows
  too (count 0, every other aggregate NULL).

Float sums are carried as double-doubles (the sum and a remainder column,
about 106 bits): each incremental refresh adds the exact sum of its changed
rows' values (``math.fsum``), so a long history adds no drift; a group
recomputed for its min / max is re-based on its exact sum. A full refresh sums
each group's values with Arrow in two parts (:func:`exact_parts`): their large
parts' sum exact, so deleting the large values later leaves the small ones' sum.

The planner applies the changes (so its counts are exact) and hands the new
rows to the task; a full refresh's task computes every group itself. Group
states are combined column-wise (Arrow and numpy), not group by group.
"""

import math
import uuid
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.model.agg_view import (
    EXTREMES_KEPT,
    GROUP,
    ROWS,
    SPECIALS,
    Aggregate,
    bucket_value,
    cnt_col,
    comp_col,
    dist_col,
    distinct_type,
    ext_col,
    group_key,
    qs_col,
    quantile_bucket,
    special_col,
    sum_col,
    sum_with_specials,
)
from mv_assets.model.definition import quote_ident, sql_literals
from mv_assets.model.names import LANCE_ROW_COLUMNS, SOURCE_ROW_ID
from mv_assets.model.sql_names import columns_read
from mv_assets.model.udtf_view import partition_ids
from mv_assets.storage import objects, threads
from mv_assets.storage.lance_compat import take_rows

__all__ = ["GroupChanges", "groups_from_rows", "apply_changes", "changed_rows", "agg_batches"]

ID_CHUNK = 50_000  # row ids per ``_rowid IN`` lookup of old values
GROUPS_PER_SCAN = 500  # groups per recompute scan (their predicate is an OR of key matches)


def _and(*parts: str | None) -> str | None:
    kept = [p for p in parts if p]
    return " AND ".join(f"({p})" for p in kept) if kept else None


def _aggregate(rows: pa.Table, agg: Aggregate, exact: bool = False) -> pa.Table | None:
    """Per group of ``rows``: ``__n`` rows, ``__c_<i>`` non-NULL counts, ``__s_<i>`` sums,
    ``__lo_<i>`` / ``__hi_<i>`` extremes (i: the value column's position), and the keys
    (None: no rows). Float sums are of the finite values, with ``__nan_<i>``,
    ``__pinf_<i>``, ``__ninf_<i>`` their rows holding NaN, +inf, -inf.
    ``exact``: float sums as the exact sum's double-double (``__s_<i>`` +
    ``__e_<i>``, by ``math.fsum`` of each group's values: for changes, whose
    rows are few); else Arrow's sums of :func:`exact_parts`, as a double-double."""
    cols = agg.value_columns
    specs: list = [([], "count_all")]
    for c in cols:
        specs.append((c, "count"))
    counted = [c for c in agg.summed if pa.types.is_floating(rows.schema.field(c).type)]
    floats = counted if exact else []
    for c in counted:  # the non-finite values, counted apart (and left out of the sum)
        j, x = cols.index(c), rows.column(c)
        for kind, flags in (("nan", pc.is_nan(x)), ("pinf", pc.equal(x, math.inf)),  # pyright: ignore[reportAttributeAccessIssue]
                            ("ninf", pc.equal(x, -math.inf))):  # pyright: ignore[reportAttributeAccessIssue]
            rows = rows.append_column(f"__mv_{kind}_{j}", pc.cast(pc.fill_null(flags, False), pa.int64()))
        if not exact:
            rows = rows.append_column(f"__mv_fin_{j}", pc.if_else(pc.is_finite(x), x, pa.scalar(None, x.type)))  # pyright: ignore[reportAttributeAccessIssue]
    parts: dict[str, int] = {}  # (not exact) a float column summed in parts: how many
    gids = _group_ids(rows, agg.keys) if any(c not in floats for c in counted) and rows.num_rows else None
    for c in counted:
        if c not in floats and gids is not None:
            j = cols.index(c)
            split = exact_parts(np.asarray(rows.column(f"__mv_fin_{j}").fill_null(0.0).to_numpy(), np.float64), gids)
            parts[c] = len(split) - 1
            for k, part in enumerate(split[1:]):
                rows = rows.append_column(f"__mv_part{k}_{j}", pa.array(part))
            if len(split) > 1:
                rows = rows.set_column(rows.schema.get_field_index(f"__mv_fin_{j}"), f"__mv_fin_{j}",
                                       pa.array(split[0]))
    exact_ints = [c for c in agg.summed if c not in counted]
    for c in exact_ints:  # integers summed as decimals: exact (int64 arithmetic wraps past 2**63)
        rows = rows.append_column(f"__mv_dec_{cols.index(c)}", pc.cast(rows.column(c), WIDE))
    for c in agg.summed:
        summed = (f"__mv_fin_{cols.index(c)}" if c in counted and c not in floats
                  else f"__mv_dec_{cols.index(c)}" if c in exact_ints else c)
        specs.append((c, "list") if c in floats else (summed, "sum"))
        specs += [(f"__mv_part{k}_{cols.index(c)}", "sum") for k in range(parts.get(c, 0))]
    for c in counted:
        specs += [(f"__mv_{kind}_{cols.index(c)}", "sum") for kind in SPECIALS]
    for fn, c in agg.extremes:
        specs.append((c, fn))
    listed = list(dict.fromkeys(c for _, c in agg.extremes if c not in floats))  # their values: extreme buffers
    for c in listed:
        specs.append((c, "list"))
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
        f"{c}_list" if c in floats else f"__mv_fin_{cols.index(c)}_sum" if c in counted
        else f"__mv_dec_{cols.index(c)}_sum" if c in exact_ints else f"{c}_sum"
        for c in agg.summed] + [f"__mv_{kind}_{cols.index(c)}_sum" for c in counted for kind in SPECIALS] + [
        f"{c}_{fn}" for fn, c in agg.extremes] + [f"{c}_list" for c in listed] + [
        f"__mv_part{k}_{cols.index(c)}_sum" for c, m in parts.items() for k in range(m)]
    names = ["__n"] + [f"__c_{cols.index(c)}" for c in cols] + [f"__s_{cols.index(c)}" for c in agg.summed] + [
        f"__{kind}_{cols.index(c)}" for c in counted for kind in SPECIALS] + [
        f"__{'lo' if fn == 'min' else 'hi'}_{cols.index(c)}" for fn, c in agg.extremes] + [
        f"__l_{cols.index(c)}" for c in listed] + [f"__p{k}_{cols.index(c)}" for c, m in parts.items() for k in range(m)]
    out = grouped.select(keys + produced).rename_columns(keys + names)
    for c, m in parts.items():  # the parts' sums (each exact but the last) as one double-double
        if not m:
            continue
        j = cols.index(c)
        hi = np.asarray(out.column(f"__s_{j}").fill_null(0.0).to_numpy(), np.float64)
        lo = np.zeros(len(hi))
        for k in range(m):
            hi, lo = _dd_add(hi, lo, np.asarray(out.column(f"__p{k}_{j}").fill_null(0.0).to_numpy(), np.float64),
                             np.zeros(len(hi)))
        out = out.drop_columns([f"__p{k}_{j}" for k in range(m)])
        out = out.set_column(out.schema.get_field_index(f"__s_{j}"), f"__s_{j}", pa.array(hi, pa.float64()))
        out = out.append_column(f"__e_{j}", pa.array(lo, pa.float64()))
    for c in floats:  # the exact sum of each group's finite values, as hi + lo (the values stay: __l_<i>)
        at = out.schema.get_field_index(f"__s_{cols.index(c)}")
        lists = out.column(at).combine_chunks()
        out = out.append_column(f"__l_{cols.index(c)}", lists)
        flat = np.asarray(lists.values.fill_null(0.0).to_numpy(zero_copy_only=False), np.float64)
        flat = np.where(np.isfinite(flat), flat, 0.0)
        bounds = np.asarray(lists.offsets.to_numpy(zero_copy_only=False), np.int64)
        pairs = [_exact(flat[lo:hi].tolist()) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        out = out.set_column(at, f"__s_{cols.index(c)}", pa.array([p[0] for p in pairs], pa.float64()))
        out = out.append_column(f"__e_{cols.index(c)}", pa.array([p[1] for p in pairs], pa.float64()))
    if agg.distincts or agg.sketched:
        texts = _keys_of(out, agg)
        for c in agg.distincts:
            out = out.append_column(f"__d_{cols.index(c)}", _distinct_lists(rows, agg, c, texts))
        for c in agg.sketched:  # the sketch: rows per bucket of the finite values, kept as distinct bucket counts
            x = np.asarray(rows.column(c).cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False))
            finite = np.isfinite(x)
            buckets = pa.array(quantile_bucket(np.where(finite, x, 0.0)), pa.int64(), mask=~finite)
            keyed = rows.select(list(agg.keys)).append_column("__bucket", buckets)
            out = out.append_column(f"__q_{cols.index(c)}", _distinct_lists(keyed, agg, "__bucket", texts))
    return out


def _distinct_lists(rows: pa.Table, agg: Aggregate, c: str, group_texts: list[str]) -> pa.Array:
    """Per group (in the order of ``group_texts``, the groups' keys): its
    distinct non-NULL values of ``c`` in ``rows``, each with its row count."""
    t = rows.schema.field(c).type
    valued = rows.filter(pc.is_valid(rows.column(c)))  # pyright: ignore[reportAttributeAccessIssue]
    if pa.types.is_floating(t):
        valued = valued.set_column(valued.schema.get_field_index(c), c, _one_nan(valued.column(c).combine_chunks()))
    by = list(dict.fromkeys([*agg.keys, c]))
    pairs = valued.group_by(by, use_threads=False).aggregate([([], "count_all")])
    entries = pa.StructArray.from_arrays([pairs.column(c).combine_chunks().cast(t),
                                          pairs.column("count_all").combine_chunks().cast(pa.int64())],
                                         names=["v", "n"])
    at = pc.index_in(pa.array(_keys_of(pairs, agg), pa.string()), value_set=pa.array(group_texts, pa.string()))  # pyright: ignore[reportAttributeAccessIssue]
    return _lists_by_group(np.asarray(at.to_numpy(zero_copy_only=False), np.int64), entries, len(group_texts), t)


def _one_nan(values: pa.Array) -> pa.Array:
    """Floats as count(distinct) tells them apart (Arrow groups by bits): every
    NaN the one NaN, -0.0 as 0.0 (SQL's equality); other types as they are."""
    if not pa.types.is_floating(values.type) or len(values) == 0:
        return values
    x = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False), np.float64)
    x = np.where(np.isnan(x), np.nan, np.where(x == 0, 0.0, x))
    return pa.array(x, mask=values.is_null().to_numpy(zero_copy_only=False)).cast(values.type)


def _lists_by_group(groups: np.ndarray, entries: pa.Array, n: int, t: pa.DataType) -> pa.Array:
    """A list per group position ``0..n-1`` of the ``entries`` whose position ``groups`` holds."""
    order = np.argsort(groups, kind="stable")
    sizes = np.bincount(groups, minlength=n) if len(groups) else np.zeros(n, np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    taken = entries.take(pa.array(order)) if len(order) else entries.slice(0, 0)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), taken, type=distinct_type(t))


def _exact(values: list[float]) -> tuple[float, float]:
    """The exact sum of ``values`` as a double-double (hi, lo): hi the correctly
    rounded sum, lo the rounded remainder."""
    try:
        hi = math.fsum(values)
    except OverflowError:  # finite values whose partial sums overflow: scaled by a power of two below the
        # count's (exact but for subnormals), summed, scaled back (inf where the sum itself overflows)
        k = len(values).bit_length() + 1
        scaled = [math.ldexp(v, -k) for v in values]
        part = math.fsum(scaled)
        hi = part * 2.0 ** k
        if not math.isfinite(hi):
            return hi, 0.0
        return hi, math.fsum([*scaled, -math.ldexp(hi, -k)]) * 2.0 ** k
    if not math.isfinite(hi):
        return hi, 0.0
    return hi, math.fsum([*values, -hi])




def _keys_of(table: pa.Table, agg: Aggregate) -> list[str]:
    """The group key of each row of ``table`` (which holds the key columns):
    :func:`group_key` of its key values, built column-wise by Arrow where the
    JSON text of every value is plain (integers, booleans, printable ASCII
    strings without quotes or backslashes), else value by value."""
    if not agg.keys:
        return [group_key([])] * table.num_rows
    texts = [_json_texts(table.column(k)) for k in agg.keys]
    if all(t is not None for t in texts):
        inner = texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*texts, ", ")  # pyright: ignore[reportAttributeAccessIssue]
        return pc.binary_join_element_wise("[", inner, "]", "").to_pylist()  # pyright: ignore[reportAttributeAccessIssue]
    columns = [table.column(k).to_pylist() for k in agg.keys]
    return [group_key(list(vals)) for vals in zip(*columns, strict=True)]


_PLAIN_TEXT = r"^[ !#-\[\]-~]*$"  # printable ASCII but '"' and '\': its JSON text is itself quoted


def _json_texts(column: "pa.ChunkedArray | pa.Array") -> "pa.Array | pa.ChunkedArray | None":
    """``json.dumps`` of each value of ``column`` (NULL: ``null``), or None
    where Arrow's text of a value may differ from JSON's."""
    t = column.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):  # "12", "-3", "true": as JSON writes them
        text = pc.cast(column, pa.string())
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        plain = pc.match_substring_regex(column, _PLAIN_TEXT)  # pyright: ignore[reportAttributeAccessIssue]
        if pc.any(pc.invert(plain)).as_py():  # pyright: ignore[reportAttributeAccessIssue]
            return None
        text = pc.binary_join_element_wise('"', pc.cast(column, pa.string()), '"', "")  # pyright: ignore[reportAttributeAccessIssue]
    else:
        return None
    return pc.fill_null(text, "null")


def _group_ids(rows: pa.Table, keys: tuple[str, ...]) -> np.ndarray:
    """Each row's group as a number (0 to groups - 1): its keys dictionary-encoded
    (NULL a value of its own), combined, encoded again."""
    if not keys:
        return np.zeros(rows.num_rows, np.int64)
    code = None
    for k in keys:
        enc = pc.dictionary_encode(rows.column(k).combine_chunks(), null_encoding="encode")  # pyright: ignore[reportAttributeAccessIssue]
        idx = np.asarray(enc.indices.to_numpy(zero_copy_only=False), np.int64)
        code = idx if code is None else np.asarray(pc.dictionary_encode(  # pyright: ignore[reportAttributeAccessIssue]
            pa.array(code * len(enc.dictionary) + idx)).indices.to_numpy(zero_copy_only=False), np.int64)
    assert code is not None
    return code


def exact_parts(x: np.ndarray, groups: np.ndarray) -> list[np.ndarray]:
    """``x`` (finite values; ``groups``: each one's group, 0 to groups - 1)
    split into parts that add up to it exactly, value by value, such that a
    part's sum over a group's rows is exact in any order, but for the last
    part (Rump, Ogita and Oishi's error-free extraction, level after level:
    each value's share that is a multiple of ``ulp(s) / 2``, ``s`` a power of
    two above twice the group's sum of the magnitudes left, which no partial
    sum reaches). Each level takes the group's largest magnitudes whole (a
    value's bits within ~``53 - log2(rows)`` of the top), the next the ones
    below, so a group's large values stay apart from its small ones: its sum
    as its parts' sums, added as a double-double, stays right once the large
    ones leave (1e17 + 3 + 4, then 1e17 deleted: 7; 1e300 - 1e300 + 3 + 4,
    both large ones deleted: 7; a float sum keeps 0). ``EXTRACTION_LEVELS``
    levels, fewer once nothing is left; what is left after the last is
    summed as floats. A group whose magnitudes sum past the largest power of
    two is summed as it is. ``[x]`` when nothing is split. A full refresh sums
    each part with Arrow.

    >>> x = np.array([1e17, 3.0, 4.0, 0.5])
    >>> [p.tolist() for p in exact_parts(x, np.array([0, 0, 0, 1]))]
    [[1e+17, 0.0, 0.0, 0.5], [0.0, 3.0, 4.0, 0.0]]
    """
    if not len(x):
        return [x]
    one = not groups.any()  # (one group: a scale, not one a row)

    def scales(values: np.ndarray) -> "np.ndarray | float":
        """Per row, its group's power of two above twice the group's sum of |values| (0: none: kept whole)."""
        with np.errstate(over="ignore"):
            total = 2.0 * (np.array([np.sum(np.abs(values))]) if one else np.bincount(groups, weights=np.abs(values)))
        high = np.frexp(total)[1].astype(np.int64)  # 2**high > twice the sum (frexp: total = f * 2**high, f < 1)
        ok = (total > 0) & np.isfinite(total) & (high <= 1023) & (high >= -1000)
        scale = np.where(ok, np.ldexp(1.0, np.clip(high, -1000, 1023)), 0.0)
        return float(scale[0]) if one else scale[groups]

    parts: list[np.ndarray] = []
    left = x
    for _ in range(EXTRACTION_LEVELS):
        s = scales(left)
        if not np.any(s):
            break
        q = s + left
        q -= s
        parts.append(q)
        left = left - q  # (exact: |left - q| <= ulp(s) / 2)
        if not left.any():
            return parts
    return [*parts, left] if parts else [x]


# Levels of exact_parts. Two take every value within ~53 - log2(rows) bits of
# the group's top magnitude whole, and the rest of the largest values' bits:
# what is left (values far below the top, their low bits) is summed as
# floats, as the double-double the view keeps (~106 bits below the top) could
# not hold it anyway; the incremental path's exact sums are rounded to it too.
# (~0.15 s a level at 10M rows in 1,000 groups.)
EXTRACTION_LEVELS = 2


def _dd_add(hi: np.ndarray, lo: np.ndarray, x_hi: np.ndarray, x_lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hi + lo) + (x_hi + x_lo) elementwise in double-double arithmetic (about 106 bits)."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = hi + x_hi
        bb = s - hi
        e = (hi - (s - bb)) + (x_hi - bb) + lo + x_lo
        t = s + e
        low = e - (t - s)
    t = np.where(np.isfinite(s), t, s)  # an infinity or NaN stays one (inf - inf in ``e`` would make NaN)
    return t, np.where(np.isfinite(t), low, 0.0)


def _take(table: pa.Table | None, name: str, at: np.ndarray, dtype: pa.DataType) -> pa.Array:
    """``table[name]`` at positions ``at`` (-1: NULL); all NULL without a table."""
    if table is None:
        return pa.nulls(len(at), dtype)
    idx = pa.array(at, mask=at < 0)
    return table.column(name).take(idx).combine_chunks().cast(dtype)


def _num(a: pa.Array, dtype: type = np.int64) -> np.ndarray:
    return np.asarray(a.fill_null(0).to_numpy(zero_copy_only=False), dtype=dtype)


def _values(table: pa.Table | None, name: str, at: np.ndarray, dtype: pa.DataType) -> list[list]:
    """Each position's list of non-NULL values (empty where -1 or no table)."""
    if table is None:
        return [[] for _ in at]
    lists = _take(table, name, at, pa.list_(dtype))
    return [[v for v in vals if v is not None] if vals else [] for vals in lists.to_pylist()]


def _sortable(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _fresh_buffers(lists: pa.Array, t: pa.DataType, descending: bool) -> pa.Array:
    """Each group's :data:`EXTREMES_KEPT` most extreme non-NULL values, sorted,
    from all its values (``lists``; numeric types: numpy, no Python per value;
    floats in :func:`_float_keys`' order)."""
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    flat = lists.values
    valid = np.asarray(flat.is_valid().to_numpy(zero_copy_only=False), bool)
    vals = np.asarray(flat.fill_null(0).to_numpy(zero_copy_only=False))
    floats = pa.types.is_floating(t)
    if floats:
        vals = _float_keys(vals)
    bounds = np.asarray(lists.offsets.to_numpy(zero_copy_only=False), np.int64)
    parts, offsets = [], [0]
    k = EXTREMES_KEPT
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        seg = vals[lo:hi][valid[lo:hi]]
        if len(seg) > k:  # the k smallest (min) or largest (max), unordered
            seg = np.partition(seg, len(seg) - k)[len(seg) - k:] if descending else np.partition(seg, k - 1)[:k]
        seg = np.sort(seg)
        parts.append(seg[::-1] if descending else seg)
        offsets.append(offsets[-1] + len(seg))
    kept = np.concatenate(parts) if parts else np.empty(0, vals.dtype)
    values = pa.array(_float_values(kept)).cast(t) if floats else pa.array(kept, t)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _rank(v):
    """min / max's order of a value: SQL's, NaN above every number (infinities included)."""
    return (1, 0.0) if isinstance(v, float) and v != v else (0, v)


def _buffer(held: list, before: int, removed: list, added: list, descending: bool, after: int) -> tuple[list, bool]:
    """A group's extreme buffer after a change: ``held`` is a prefix of its
    non-NULL values sorted (ascending for min, descending for max, in
    :func:`_rank`'s order; all of them when ``len(held) == before``);
    ``removed`` / ``added`` values left / joined it. Returns the new prefix (at
    most :data:`EXTREMES_KEPT`) and False when it ran out while the group still
    has ``after`` values (recompute)."""
    complete = len(held) == before
    bound = _rank(held[-1]) if held else None
    buf = list(held)
    for v in removed:  # every value more extreme than the buffer's last is in it (a prefix)
        at = next((i for i, w in enumerate(buf) if _rank(w) == _rank(v)), None)  # (NaN is one value here)
        if at is not None:
            del buf[at]
    if complete:
        keep = added
    else:  # only values up to the old bound are known to precede what the buffer lacks
        keep = [v for v in added if (_rank(v) >= bound if descending else _rank(v) <= bound)]  # pyright: ignore[reportOperatorIssue]
    if keep:
        buf = sorted(buf + keep, key=_rank, reverse=descending)
    buf = buf[:EXTREMES_KEPT]
    return buf, bool(buf) or after <= 0


def _flat(lists: pa.Array, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(group position, value) of every non-NULL value of ``lists`` (one list per
    group position; NULL lists hold nothing)."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    if len(lists) == 0 or n == 0:
        return np.empty(0, np.int64), np.empty(0)
    values = pc.list_flatten(lists)  # pyright: ignore[reportAttributeAccessIssue]
    parents = np.asarray(pc.list_parent_indices(lists).to_numpy(zero_copy_only=False), np.int64)  # pyright: ignore[reportAttributeAccessIssue]
    valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), bool)
    return parents[valid], np.asarray(values.filter(pa.array(valid)).to_numpy(zero_copy_only=False))


def _buffers(held: pa.Array, before: np.ndarray, removed: pa.Array, added: pa.Array, descending: bool,
             after: np.ndarray, t: pa.DataType) -> tuple[pa.Array, np.ndarray] | None:
    """:func:`_buffer` for every group at once (numeric types, numpy: no Python
    per group or value): the new buffers as a list array and, per group, False
    where the buffer ran out while the group still has values. None where
    this cannot say what :func:`_buffer` would (a group with values and an
    empty buffer): the caller runs :func:`_buffer` per group. Floats are
    ordered by :func:`_float_keys` (NaN above every number, as :func:`_rank`)."""
    n = len(before)
    hg, hv = _flat(held, n)
    rg, rv = _flat(removed, n)
    ag, av = _flat(added, n)
    floats = pa.types.is_floating(t)
    if floats:
        hv, rv, av = _float_keys(hv), _float_keys(rv), _float_keys(av)
    held_len = np.bincount(hg, minlength=n)
    complete = held_len == before
    if (~complete & (held_len == 0)).any():
        return None
    last = np.zeros(n, np.int64 if floats else hv.dtype if len(hv) else (av.dtype if len(av) else np.float64))
    if len(hv):
        ends = np.cumsum(held_len) - 1  # held is sorted within each group: its last value is the bound
        has = held_len > 0
        last[has] = hv[ends[has]]
    if len(rg):  # a removed value past a buffer's bound is not in it: drop it before sorting
        inside = complete[rg] | ((rv >= last[rg]) if descending else (rv <= last[rg]))
        rg, rv = rg[inside], rv[inside]
    # removed values leave the buffer, one occurrence each (a multiset difference per group)
    g = np.concatenate([hg, rg])
    v = np.concatenate([hv, rv]) if len(rv) else hv
    w = np.concatenate([np.ones(len(hg), np.int64), -np.ones(len(rg), np.int64)])
    order = np.lexsort((v, g))
    g, v, w = g[order], v[order], w[order]
    new_run = np.ones(len(g), bool)
    new_run[1:] = (g[1:] != g[:-1]) | (v[1:] != v[:-1])
    run = np.cumsum(new_run) - 1
    starts = np.flatnonzero(new_run)
    held_n = np.bincount(run, weights=(w > 0), minlength=len(starts)).astype(np.int64)
    gone_n = np.bincount(run, weights=(w < 0), minlength=len(starts)).astype(np.int64)
    keep = np.maximum(held_n - gone_n, 0)
    kg, kv = np.repeat(g[starts], keep), np.repeat(v[starts], keep)
    # added values join: all of them in a complete buffer, else only those up to its old bound
    ok_add = (complete[ag] | ((av >= last[ag]) if descending else (av <= last[ag]))) if len(ag) else None
    if ok_add is not None and ok_add.any():
        kg, kv = np.concatenate([kg, ag[ok_add]]), np.concatenate([kv, av[ok_add]]) if len(kv) else av[ok_add]
        order = np.lexsort((kv, kg))
        kg, kv = kg[order], kv[order]
    # (else the kept values are in order already: sorted by group and value above)
    # each group's EXTREMES_KEPT most extreme values, in order
    counts = np.bincount(kg, minlength=n)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(len(kg)) - first[kg]
    if descending:
        pos = counts[kg] - 1 - pos
        keep_k = pos < EXTREMES_KEPT
        kg, kv, pos = kg[keep_k], kv[keep_k], pos[keep_k]
        order = np.lexsort((pos, kg))
        kg, kv = kg[order], kv[order]
    else:
        keep_k = pos < EXTREMES_KEPT
        kg, kv = kg[keep_k], kv[keep_k]
    sizes = np.bincount(kg, minlength=n)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    values = pa.array(_float_values(kv)).cast(t) if floats else pa.array(kv, t)
    lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
    return lists, (sizes > 0) | (after <= 0)


_LOW_BITS = np.int64(0x7FFFFFFFFFFFFFFF)


def _float_keys(v: np.ndarray) -> np.ndarray:
    """Floats as int64 keys ordered as SQL orders them: -inf < numbers < inf <
    NaN, every NaN one key and -0.0 the key of 0.0 (IEEE bits, a negative's
    flipped but for the sign)."""
    x = np.where(v == 0, 0.0, np.asarray(v, np.float64))
    x = np.where(np.isnan(x), np.nan, x)  # one NaN
    bits = x.view(np.int64)
    return np.where(bits < 0, bits ^ _LOW_BITS, bits)


def _float_values(k: np.ndarray) -> np.ndarray:
    """The floats of :func:`_float_keys`' keys."""
    k = np.asarray(k, np.int64)
    return np.where(k < 0, k ^ _LOW_BITS, k).view(np.float64)


def _firsts(lists: pa.ListArray, t: pa.DataType) -> pa.Array:
    """Each list's first value (NULL for an empty list)."""
    offsets = np.asarray(lists.offsets.to_numpy(zero_copy_only=False), np.int64)
    sizes = np.diff(offsets)
    at = np.where(sizes > 0, offsets[:-1], -1)
    return lists.values.take(pa.array(at, mask=at < 0)).cast(t) if len(lists.values) else pa.nulls(len(lists), t)


@dataclass
class _Combined:
    rows: pa.Table  # the groups with rows, in the view's schema
    counts: np.ndarray  # each key's new row count (<= 0: the group goes)
    stale: np.ndarray  # the group's min / max may have left it: recompute it from the source


def _positions(key_arr: pa.Array, table_keys: list[str] | None) -> np.ndarray:
    """Each of ``key_arr``'s position in ``table_keys`` (-1: not there, or no table)."""
    if not table_keys:
        return np.full(len(key_arr), -1, np.int64)
    at = pc.index_in(key_arr, value_set=pa.array(table_keys, pa.string()))  # pyright: ignore[reportAttributeAccessIssue]
    return np.asarray(at.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)


@dataclass
class _Found:
    """The ``n`` groups of :func:`_combine` in its three inputs: ``old`` (view
    rows), ``plus`` and ``minus`` (:func:`_aggregate` outputs), and each
    group's position in each (-1: not there)."""
    n: int
    old: pa.Table | None
    plus: pa.Table | None
    minus: pa.Table | None
    po: np.ndarray
    pp: np.ndarray
    pm: np.ndarray

    def added(self, stored: str, name: str, dtype: type = np.int64) -> np.ndarray:
        """Per group: ``old[stored]`` + ``plus[name]`` - ``minus[name]`` (a missing value: 0)."""
        return (_num(_take(self.old, stored, self.po, pa.int64()), dtype)
                + _num(_take(self.plus, name, self.pp, pa.int64()), dtype)
                - _num(_take(self.minus, name, self.pm, pa.int64()), dtype))

    def parts(self, stored: str, name: str) -> list:
        """The ``parts`` of :func:`_distinct_state`: ``old[stored]`` + ``plus[name]`` - ``minus[name]``."""
        return [(self.old, stored, self.po, 1), (self.plus, name, self.pp, 1), (self.minus, name, self.pm, -1)]


@dataclass
class _GroupStates:
    """The combined state of each group of :func:`_combine`, column-wise."""
    rows: np.ndarray  # the group's row count
    cnt: dict[str, np.ndarray]  # per value column: its non-NULL values
    sums: dict[str, tuple[np.ndarray, np.ndarray]]  # per summed column: the sum and its remainder
    specials: dict[str, list[np.ndarray]]  # a float sum's counts of NaN, +inf, -inf values
    ext: dict[tuple[str, str], pa.Array]  # per (min / max, column): the extreme
    buffers: dict[tuple[str, str], pa.Array]  # per (min / max, column): the extremes kept
    distinct: dict[str, tuple[pa.Array, np.ndarray]]  # distinct values with their row counts, and how many
    sketches: dict[str, pa.Array]  # per quantile column: its sketch


def _combine(keys: list[str], agg: Aggregate, schema: pa.Schema, old: pa.Table | None, plus: pa.Table | None,
             minus: pa.Table | None) -> _Combined:
    """The new state of the groups ``keys`` (vectorized): ``old`` (view rows,
    found by their ``GROUP`` key) plus ``plus`` minus ``minus``
    (:func:`_aggregate` outputs, found by their key columns)."""
    n = len(keys)
    key_arr = pa.array(keys, pa.string())
    found = _Found(n, old, plus, minus,
                   _positions(key_arr, old.column(GROUP).to_pylist() if old is not None else None),
                   _positions(key_arr, _keys_of(plus, agg) if plus is not None else None),
                   _positions(key_arr, _keys_of(minus, agg) if minus is not None else None))
    cols = agg.value_columns
    typ = {f.name: f.type for f in schema}
    rows = found.added(ROWS, "__n")
    cnt = {c: found.added(cnt_col(c), f"__c_{j}") for j, c in enumerate(cols)}
    sums, specials, sums_stale = _combined_sums(found, agg, typ)
    ext, buffers, ext_stale = _combined_extremes(found, agg, typ, cnt)
    distinct = {c: _distinct_state(typ[dist_col(c)].value_type.field("v").type, n,
                                   found.parts(dist_col(c), f"__d_{cols.index(c)}")) for c in agg.distincts}
    sketches = {c: _distinct_state(pa.int64(), n, found.parts(qs_col(c), f"__q_{cols.index(c)}"))[0]
                for c in agg.sketched}
    states = _GroupStates(rows, cnt, sums, specials, ext, buffers, distinct, sketches)
    arrays = _state_arrays(keys, key_arr, agg, typ, found, states)
    arrays.update(_output_arrays(agg, typ, n, states))
    table = pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema)
    live = _live(agg, rows)
    return _Combined(table.filter(pa.array(live)), rows, (sums_stale | ext_stale) & live)


def _live(agg: Aggregate, rows: np.ndarray) -> np.ndarray:
    """Which groups of these row counts are in the view: those holding rows;
    without keys, the one group always (SQL's aggregate over no rows is one row)."""
    return rows > 0 if agg.keys else np.ones(len(rows), bool)


def _combined_sums(found: _Found, agg: Aggregate, typ: dict[str, pa.DataType]
                   ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, list[np.ndarray]], np.ndarray]:
    """Each summed column's new (sum, remainder) per group, a float sum's
    counts of NaN, +inf and -inf values (where the view keeps them), and the
    groups whose sum must be recomputed from the source."""
    n, cols = found.n, agg.value_columns
    sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    specials: dict[str, list[np.ndarray]] = {}  # a float sum's counts of NaN, +inf, -inf values
    stale = np.zeros(n, dtype=bool)
    for c in agg.summed:
        j = cols.index(c)
        if comp_col(c) in typ:  # floats: double-double (of the finite values, where their counts are kept)
            counted = special_col("nan", c) in typ
            hi = stored = _num(_take(found.old, sum_col(c), found.po, pa.float64()), np.float64)
            lo = _num(_take(found.old, comp_col(c), found.po, pa.float64()), np.float64)
            for t, at, sign in ((found.plus, found.pp, 1.0), (found.minus, found.pm, -1.0)):
                if t is None:
                    continue
                x_hi = _num(_take(t, f"__s_{j}", at, pa.float64()), np.float64)
                x_lo = (_num(_take(t, f"__e_{j}", at, pa.float64()), np.float64) if f"__e_{j}" in t.column_names
                        else np.zeros(n))
                if not counted:  # a view stored without the counts: its sums hold every value
                    x_hi = x_hi + sum_with_specials(np.zeros(n), *(_num(_take(t, f"__{kind}_{j}", at, pa.int64()))
                                                                   for kind in SPECIALS))
                hi, lo = _dd_add(hi, lo, sign * x_hi, sign * x_lo)
            if counted:
                specials[c] = [found.added(special_col(kind, c), f"__{kind}_{j}") for kind in SPECIALS]
            # a running sum cannot take out what made it infinite or NaN (finite values that
            # overflowed; without the counts, any non-finite value): the group is recomputed
            stale |= (found.pm >= 0) & ~(np.isfinite(stored) & np.isfinite(hi))
            sums[c] = (hi, lo)
        else:
            sums[c] = (_int_sums(found, c, j), np.zeros(n))
    return sums, specials, stale


def _approx(table: pa.Table | None, name: str, at: np.ndarray) -> np.ndarray:
    """``table[name]`` at positions ``at`` (-1 or no table: 0) as the nearest floats."""
    if table is None:
        return np.zeros(len(at))
    values = table.column(name).take(pa.array(at, mask=at < 0)).combine_chunks()
    return _num(pc.cast(values, pa.float64(), safe=False), np.float64)


WIDE = pa.decimal128(38, 0)  # an integer column's sums while aggregated: exact
_NEAR = 2.0 ** 62  # sums this large are added as Python integers


def _int_sums(found: _Found, c: str, j: int) -> np.ndarray:
    """An integer column's new sum per group: the stored sum plus the added
    rows' minus the removed rows' (exact decimals), in int64 arithmetic where
    every term is far from its limits, else as Python integers; a sum beyond
    int64 raises a ValueError saying so (int64 arithmetic wrapped it round)."""
    terms = [(found.old, sum_col(c), found.po, 1), (found.plus, f"__s_{j}", found.pp, 1),
             (found.minus, f"__s_{j}", found.pm, -1)]
    approx = [_approx(t, name, at) for t, name, at, _ in terms]
    near = (np.abs(approx[0]) >= _NEAR) | (np.abs(approx[1]) >= _NEAR) | (np.abs(approx[2]) >= _NEAR) | (
        np.abs(approx[0] + approx[1] - approx[2]) >= _NEAR)
    out = np.zeros(found.n, np.int64)
    safe = ~near
    if safe.any():
        for t, name, at, sign in terms:
            out[safe] += sign * _num(_take(t, name, np.where(safe, at, -1), pa.int64()))[safe]
    if near.any():
        where = np.flatnonzero(near)
        exact = [0] * len(where)
        for t, name, at, sign in terms:
            values = _take(t, name, np.where(near, at, -1), WIDE).to_pylist()
            for k, i in enumerate(where):
                exact[k] += sign * int(values[i] or 0)
        beyond = [v for v in exact if not -2**63 <= v < 2**63]
        if beyond:
            raise ValueError(
                f"the sum of integer column {c!r} in {len(beyond)} group(s) is beyond int64 (e.g. {beyond[0]}): "
                f"sum({c}) and avg({c}) cannot hold it; aggregate a double of it instead (a view with "
                f"CAST({c} AS DOUBLE))")
        out[where] = exact
    return out


def _combined_extremes(found: _Found, agg: Aggregate, typ: dict[str, pa.DataType], cnt: dict[str, np.ndarray]
                       ) -> tuple[dict[tuple[str, str], pa.Array], dict[tuple[str, str], pa.Array], np.ndarray]:
    """Each min / max's new extreme and buffer of extremes kept per group, and
    the groups whose buffer ran out while they still have values (recompute
    them from the source)."""
    cols = agg.value_columns
    old, plus, minus, po, pp, pm = found.old, found.plus, found.minus, found.po, found.pp, found.pm
    stale = np.zeros(found.n, dtype=bool)
    ext: dict[tuple[str, str], pa.Array] = {}
    buffers: dict[tuple[str, str], pa.Array] = {}
    out_name = {(a.fn, a.column): a.name for a in agg.aggs if a.fn in ("min", "max")}
    for fn, c in agg.extremes:
        j, t = cols.index(c), typ[out_name[(fn, c)]]
        if old is None and minus is None and _sortable(t):  # every group new (a full refresh): numpy
            buffers[(fn, c)] = _fresh_buffers(_take(plus, f"__l_{j}", pp, pa.list_(t)), t, fn == "max")
            ext[(fn, c)] = _firsts(buffers[(fn, c)], t)
            continue
        before = _num(_take(old, cnt_col(c), po, pa.int64()))
        done = None
        if _sortable(t):  # numpy, every group at once
            done = _buffers(_take(old, ext_col(fn, c), po, pa.list_(t)), before,
                            _take(minus, f"__l_{j}", pm, pa.list_(t)), _take(plus, f"__l_{j}", pp, pa.list_(t)),
                            fn == "max", cnt[c], t)
        if done is not None:
            bufs, ok = done
            stale |= ~ok  # the buffer ran out while the group still has values: recompute it
            buffers[(fn, c)] = bufs
            ext[(fn, c)] = _firsts(bufs, t)
            continue
        buffers[(fn, c)], ext[(fn, c)], gone = _extremes_by_group(found, fn, c, j, t, before, cnt[c])
        stale |= gone  # the buffer ran out while the group still has values: recompute it
    return ext, buffers, stale


def _extremes_by_group(found: _Found, fn: str, c: str, j: int, t: pa.DataType, before: np.ndarray,
                       count: np.ndarray) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """:func:`_combined_extremes` group by group (values numpy cannot order):
    the buffers, the extremes and the groups whose buffer ran out."""
    held = _take(found.old, ext_col(fn, c), found.po, pa.list_(t)).to_pylist()
    joined = _values(found.plus, f"__l_{j}", found.pp, t)
    left = _values(found.minus, f"__l_{j}", found.pm, t)
    new_bufs, gone = [], np.zeros(found.n, dtype=bool)
    for i in range(found.n):
        buf, ok = _buffer(held[i] or [], int(before[i]), left[i], joined[i], fn == "max", int(count[i]))
        new_bufs.append(buf)
        gone[i] = not ok
    return pa.array(new_bufs, pa.list_(t)), pa.array([b[0] if b else None for b in new_bufs], t), gone


def _state_arrays(keys: list[str], key_arr: pa.Array, agg: Aggregate, typ: dict[str, pa.DataType], found: _Found,
                  s: _GroupStates) -> dict[str, pa.Array]:
    """The view's columns of the groups' state (ids, keys, counts, sums, buffers,
    distinct values, sketches), by name."""
    arrays: dict[str, pa.Array] = {
        SOURCE_ROW_ID: pa.array(partition_ids(keys), pa.int64()), GROUP: key_arr, ROWS: pa.array(s.rows, pa.int64()),
    }
    for c, (lists, _) in s.distinct.items():
        arrays[dist_col(c)] = lists
    for c, sketch in s.sketches.items():
        arrays[qs_col(c)] = sketch
    for k in agg.keys:  # a group's key values are the same wherever it is found (NULL included)
        arrays[k] = pc.coalesce(_take(found.old, k, found.po, typ[k]), _take(found.plus, k, found.pp, typ[k]),  # pyright: ignore[reportAttributeAccessIssue]
                                _take(found.minus, k, found.pm, typ[k]))
    for c in agg.value_columns:
        arrays[cnt_col(c)] = pa.array(s.cnt[c], pa.int64())
    for (fn, c), bufs in s.buffers.items():
        arrays[ext_col(fn, c)] = bufs
    for c in agg.summed:
        hi, lo = s.sums[c]
        arrays[sum_col(c)] = pa.array(hi, typ[sum_col(c)])
        if comp_col(c) in typ:
            arrays[comp_col(c)] = pa.array(lo, pa.float64())
        for kind, counts in zip(SPECIALS, s.specials.get(c, ()), strict=False):
            arrays[special_col(kind, c)] = pa.array(counts, pa.int64())
    return arrays


def _output_arrays(agg: Aggregate, typ: dict[str, pa.DataType], n: int, s: _GroupStates) -> dict[str, pa.Array]:
    """The view's output columns (the aggregates asked for) from the groups' state, by name."""
    arrays: dict[str, pa.Array] = {}
    for a in agg.aggs:
        c = a.column
        if a.fn == "count":
            arrays[a.name] = pa.array(s.rows if c is None else s.cnt[c], pa.int64())
            continue
        if a.fn == "count_distinct":
            assert c is not None
            arrays[a.name] = pa.array(s.distinct[c][1], pa.int64())
            continue
        if a.fn == "approx_quantile":
            assert c is not None and a.q is not None
            arrays[a.name] = _quantiles(s.sketches[c], a.q)
            continue
        assert c is not None
        none = s.cnt[c] <= 0  # only NULLs (or no rows): NULL
        if a.fn in ("sum", "avg"):
            hi, lo = s.sums[c]
            total = hi + lo if comp_col(c) in typ else hi
            if c in s.specials:
                total = sum_with_specials(total, *s.specials[c])
            if a.fn == "sum":
                arrays[a.name] = pa.array(total, typ[a.name], mask=none)
            else:
                with np.errstate(invalid="ignore", divide="ignore"):
                    arrays[a.name] = pa.array(total / np.where(none, 1, s.cnt[c]), pa.float64(), mask=none)
        else:
            arrays[a.name] = pc.if_else(pa.array(none), pa.nulls(n, typ[a.name]), s.ext[(a.fn, c)])  # pyright: ignore[reportAttributeAccessIssue]
    return arrays


def _quantiles(sketches: pa.Array, q: float) -> pa.Array:
    """Each group's ``q`` quantile from its sketch (a list of bucket and row
    count): the value of the bucket holding the row of rank ``q * (n - 1)``
    in the group's finite values, sorted (NULL for a group with none)."""
    n = len(sketches)
    if len(sketches.values) == 0 or n == 0:
        return pa.nulls(n, pa.float64())
    flat = pc.list_flatten(sketches)  # pyright: ignore[reportAttributeAccessIssue]
    g = np.asarray(pc.list_parent_indices(sketches).to_numpy(zero_copy_only=False), np.int64)  # pyright: ignore[reportAttributeAccessIssue]
    k = np.asarray(flat.field("v").to_numpy(zero_copy_only=False), np.int64)
    c = np.asarray(flat.field("n").to_numpy(zero_copy_only=False), np.int64)
    order = np.lexsort((k, g))
    g, k, c = g[order], k[order], c[order]
    cum = np.cumsum(c)
    totals = np.bincount(g, weights=c, minlength=n).astype(np.int64)
    start = np.cumsum(totals) - totals  # rows of the groups before each one
    has = totals > 0
    target = start + np.floor(q * (np.maximum(totals, 1) - 1)).astype(np.int64)
    at = np.minimum(np.searchsorted(cum, target, side="right"), len(cum) - 1)
    return pa.array(np.where(has, bucket_value(k[at]), 0.0), pa.float64(), mask=~has)


def _distinct_state(t: pa.DataType, n: int, parts: list) -> tuple[pa.Array, np.ndarray]:
    """Each group's distinct values with their row counts after a change, and
    how many values each group has: the counts of ``parts`` (table, its state
    column, each group's position in it (-1: none), +1 / -1) added per (group,
    value); values whose count reaches 0 leave."""
    gs, vs, ns = [], [], []
    for table, name, at, sign in parts:
        if table is None:
            continue
        lists = _take(table, name, at, distinct_type(t))
        if len(lists.values) == 0:
            continue
        flat = pc.list_flatten(lists)  # pyright: ignore[reportAttributeAccessIssue]
        gs.append(np.asarray(pc.list_parent_indices(lists).to_numpy(zero_copy_only=False), np.int64))  # pyright: ignore[reportAttributeAccessIssue]
        vs.append(flat.field("v"))
        ns.append(np.asarray(flat.field("n").to_numpy(zero_copy_only=False), np.int64) * sign)
    if not gs:
        return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], distinct_type(t).value_type),
                                        type=distinct_type(t)), np.zeros(n, np.int64)
    summed = pa.table({"g": np.concatenate(gs), "v": _one_nan(pa.concat_arrays([v.cast(t) for v in vs])),
                       "n": np.concatenate(ns)}).group_by(["g", "v"], use_threads=False).aggregate([("n", "sum")])
    live = summed.filter(pc.greater(summed.column("n_sum"), 0))  # pyright: ignore[reportAttributeAccessIssue]
    groups = np.asarray(live.column("g").to_numpy(), np.int64)
    entries = pa.StructArray.from_arrays([live.column("v").combine_chunks(), live.column("n_sum").combine_chunks()],
                                         names=["v", "n"])
    return _lists_by_group(groups, entries, n, t), np.bincount(groups, minlength=n).astype(np.int64)


def groups_from_rows(rows: pa.Table, agg: Aggregate, schema: pa.Schema, exact: bool = False) -> pa.Table:
    """The view rows of every group of ``rows``, sorted by group key
    (``exact``: float sums exact, see :func:`_aggregate`)."""
    grouped = _aggregate(rows, agg, exact=exact)
    if grouped is None:  # (no rows: no group, but the one of an aggregate without keys)
        return _combine([group_key([])], agg, schema, None, None, None).rows if not agg.keys else schema.empty_table()
    keys = _keys_of(grouped, agg)
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return _combine([keys[i] for i in order], agg, schema, None, grouped.take(pa.array(order, pa.int64())), None).rows


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
    # sorted and unique (deleted ids are: a delete-only change needs no second pass)
    old_ids = np.sort(deleted) if len(written) == 0 else np.unique(np.concatenate([written, deleted]))
    return plus, _old_rows(old, old_ids, inputs, filter_sql)


def _old_rows(old: lance.LanceDataset, ids: np.ndarray, inputs: list[str], filter_sql: str | None) -> pa.Table:
    """The rows ``ids`` (stable ids; those absent at ``old``'s version are
    skipped) as they were at ``old``'s version, if they passed ``filter_sql``
    then. Taken by id (~1 us a row); the filter is evaluated by Lance on just
    those rows, in a temporary in-memory dataset. A filter naming Lance's row
    columns (``_rowid``, row versions: they would be the temporary dataset's)
    is evaluated by a scan of the source with an id list instead."""
    if len(ids) == 0:
        return old.schema.empty_table().select(inputs)

    read = set(columns_read(filter_sql, [*LANCE_ROW_COLUMNS, *old.schema.names]))  # (model.sql_names)

    def named(name: str) -> bool:
        return name in read

    if not any(named(n) for n in LANCE_ROW_COLUMNS):
        reads = [n for n in old.schema.names if named(n)]
        taken = _taken(old, ids, list(dict.fromkeys([*inputs, *reads])))
        if not filter_sql:
            return taken.select(inputs)
        # Only the columns the filter reads go to Lance, in memory (its memory store lives
        # as long as the handle: no files to write and remove); the rows passing it are
        # taken from the Arrow table by position (one fragment, no deletions: a row's
        # address is its position). 100k rows of 4 columns written whole: ~13 ms; the filter's 1: ~4.
        probe = taken.select(reads) if reads else pa.table({"__row": pa.nulls(taken.num_rows, pa.int8())})
        rows = lance.write_dataset(probe, f"memory://mv_assets_agg_{uuid.uuid4().hex}",
                                   max_rows_per_file=max(1, probe.num_rows))  # one fragment
        passing = rows.to_table(columns=[], filter=filter_sql, with_row_address=True).column("_rowaddr")
        return taken.select(inputs).take(passing)
    parts = []  # the scan, by id lists
    for lo in range(0, len(ids), ID_CHUNK):
        chunk = ", ".join(str(int(i)) for i in ids[lo:lo + ID_CHUNK])
        parts.append(old.to_table(columns=inputs, filter=_and(f"_rowid IN ({chunk})", filter_sql)))
    return pa.concat_tables(parts)


# Ids taken per thread: a take of scattered rows waits on many small reads,
# which threads overlap (100k ids of 10M rows: 125 ms in one call, ~80 ms in 4).
TAKE_CHUNK = 25_000


def _taken(ds: lance.LanceDataset, ids: np.ndarray, columns: list[str]) -> pa.Table:
    """Rows ``ids`` (stable ids; sorted, each chunk is read from few fragments) of
    ``ds``, taken in chunks by parallel threads."""
    chunks = [ids[lo:lo + TAKE_CHUNK] for lo in range(0, len(ids), TAKE_CHUNK)]
    if len(chunks) <= 1:
        return take_rows(ds, pa.array(ids.astype(np.uint64)), columns)
    parts = list(threads.pool("take", 4).map(lambda c: take_rows(ds, pa.array(c.astype(np.uint64)), columns), chunks))
    return pa.concat_tables(parts)


def _group_predicate(agg: Aggregate, rows: pa.Table) -> str:
    """SQL matching the source rows of the groups of ``rows`` (which hold the key columns)."""
    ors = []
    for values in zip(*[sql_literals(rows.column(k)) for k in agg.keys], strict=True) if agg.keys else [()]:
        ands = [f"{quote_ident(k)} IS NULL" if v == "NULL" else f"{quote_ident(k)} = {v}"
                for k, v in zip(agg.keys, values, strict=True)]
        ors.append("(" + " AND ".join(ands) + ")" if ands else "true")
    return " OR ".join(ors) if ors else "false"


@dataclass
class GroupChanges:
    """What applying the changes since ``v0`` does to the touched groups."""

    rows: pa.Table  # the new view rows of the touched groups that still have rows
    inserted: list[str]  # group keys new to the view
    updated: list[str]  # group keys the view holds and keeps (rows rewritten)
    deleted: list[str]  # group keys the view holds whose row count reached 0
    recomputed: list[str]  # groups recomputed from the source: their min / max buffer ran out, or a
    # value left a float sum that was not finite (an overflow; a view stored without the non-finite counts)
    source_rows: int  # changed source rows read (added + removed)


def apply_changes(src: lance.LanceDataset, old: lance.LanceDataset, view_rows: pa.Table, filter_sql: str | None,
                  agg: Aggregate, schema: pa.Schema, moved: list[int] | None, appended: bool) -> GroupChanges:
    """The touched groups' new rows (see the module docstring). ``view_rows``:
    the view's rows (all columns) of at least the touched groups."""
    plus_rows, minus_rows = changed_rows(src, old, filter_sql, agg, moved, appended)
    plus, minus = _aggregate(plus_rows, agg, exact=True), _aggregate(minus_rows, agg, exact=True)
    touched = sorted(set(_keys_of(plus, agg) if plus is not None else [])
                     | set(_keys_of(minus, agg) if minus is not None else []))
    held_keys = set(view_rows.column(GROUP).to_pylist())
    combined = _combine(touched, agg, schema, view_rows, plus, minus)
    new = combined.rows
    recompute = [k for k, s in zip(touched, combined.stale, strict=True) if s]
    if recompute:  # their state anew from the source (exact): the extreme, and the sums re-based
        redo = pa.array(recompute, pa.string())
        keep = pc.invert(pc.is_in(new.column(GROUP), value_set=redo))  # pyright: ignore[reportAttributeAccessIssue]
        stale_rows = new.filter(pc.is_in(new.column(GROUP), value_set=redo))  # pyright: ignore[reportAttributeAccessIssue]
        parts = [new.filter(keep)]
        for lo in range(0, stale_rows.num_rows, GROUPS_PER_SCAN):
            chunk = stale_rows.slice(lo, GROUPS_PER_SCAN)
            rows = src.to_table(columns=agg.input_columns, filter=_and(_group_predicate(agg, chunk), filter_sql))
            parts.append(groups_from_rows(rows, agg, schema, exact=True))
        new = pa.concat_tables(parts).sort_by(GROUP)
    live = dict(zip(touched, _live(agg, combined.counts), strict=True))
    return GroupChanges(
        rows=new,
        inserted=[k for k in touched if k not in held_keys and live[k]],
        updated=[k for k in touched if k in held_keys and live[k]],
        deleted=[k for k in touched if k in held_keys and not live[k]],
        recomputed=recompute,
        source_rows=plus_rows.num_rows + minus_rows.num_rows,
    )


def view_rows_of(view_ds: lance.LanceDataset) -> pa.Table:
    """Every row of the aggregate view (one per group: the planner finds the
    touched groups' state and addresses among them), with row addresses."""
    return view_ds.to_table(with_row_address=True)


def agg_batches(ds: lance.LanceDataset, definition, schema: pa.Schema, args: dict | None):
    """The task's view rows: every group (``args`` None: a full refresh), or
    the touched groups' new rows the plan computed (``args["rows"]``, an
    Arrow file in the plan's checkpoint directory)."""
    agg = Aggregate.from_definition(definition)
    if not args:
        rows = ds.to_table(columns=agg.input_columns, filter=definition.filter)
        yield from groups_from_rows(rows, agg, schema).to_batches()
        return
    yield from objects.read_arrow(args["rows"]).cast(schema).to_batches()
