"""Pure planning: what a refresh must insert, update and delete, and how the
work is cut into tasks. No I/O, no Spark; everything here is tested with plain
arrays.

Vocabulary
----------
* ``view_keys``: the ``__source_row_id`` values the view holds now.
* ``changed_pass``: source row ids new or updated since the view's last
  refresh that pass the view's filter at the target version.
* ``changed_fail``: source row ids new or updated since then that do not pass.
* ``deleted``: source row ids deleted since then (Lance's change feed).
* ``candidates``: for views with ``limit``: every source row id passing the
  filter at the target version (keys only, no UDF work).
"""

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "History",
    "direct_positions",
    "fit_to_fragments",
    "choose_how",
    "ranges_predicate",
    "pieces_from_rows",
    "pack_pieces",
    "ChangeSet",
    "KeyPlan",
    "Membership",
    "plan_keys",
    "shuffle_keys",
    "select_limited",
    "split_ranges",
    "isin",
    "positions",
    "column_ids",
]

_U64 = np.uint64


def shuffle_keys(row_ids: np.ndarray, seed: int | None) -> np.ndarray:
    """Deterministic pseudo-random sort keys for row ids (splitmix64).

    The same (seed, row id) always gives the same key, so a shuffled view's
    order and a shuffled limited view's membership do not depend on refresh
    history. Without a seed the key is the row id itself (insertion order).
    """
    ids = np.asarray(row_ids, dtype=np.int64).astype(_U64)
    if seed is None:
        return ids
    with np.errstate(over="ignore"):
        z = ids + _U64((int(seed) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
        z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
        z = z ^ (z >> _U64(31))
    return z


def select_limited(candidates: np.ndarray, limit: int | None, seed: int | None) -> np.ndarray:
    """The row ids a limited view holds: the ``limit`` smallest shuffle keys.

    Ties cannot happen without a seed (keys are the ids); with a seed they
    are broken by row id.
    """
    cand = np.asarray(candidates, dtype=np.int64)
    if limit is None or len(cand) <= limit:
        return np.sort(cand)
    keys = shuffle_keys(cand, seed)
    order = np.lexsort((cand, keys))
    return np.sort(cand[order[:limit]])


@dataclass
class ChangeSet:
    """What changed in the source between two versions, as row id sets."""

    changed_pass: np.ndarray
    changed_fail: np.ndarray
    deleted: np.ndarray
    candidates: np.ndarray | None = None  # only for limited views

    def __post_init__(self) -> None:
        for name in ("changed_pass", "changed_fail", "deleted"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=np.int64))
        if self.candidates is not None:
            self.candidates = np.asarray(self.candidates, dtype=np.int64)


def _mask(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    mask = pc.is_in(pa.array(values), value_set=pa.array(members))  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
    return mask.to_numpy(zero_copy_only=False).astype(bool)


def column_ids(table: pa.Table, col: str = "_rowid") -> np.ndarray:
    """An id column (uint64 row ids included) as an int64 numpy array."""
    if table.num_rows == 0:
        return np.empty(0, np.int64)
    ids = table.column(col).to_numpy()
    if ids.dtype == np.uint64:  # Lance's row ids and addresses are below 2**63: the same bits, no copy
        return ids.view(np.int64)
    return ids.astype(np.int64, copy=False)


_DENSE_MIN = 65_536  # below this many ids hashing is as fast
_BLOCK = 1 << 14  # ids a step of a bitmap's build or lookup


def isin(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Boolean mask of ``values`` found in ``members`` (hash-based, O(n + m)).

    The hash table is always built on the smaller side: an incremental refresh
    checks a few changed ids against a large view without hashing the view.
    """
    values = np.asarray(values, dtype=np.int64)
    members = np.asarray(members, dtype=np.int64)
    if len(values) == 0 or len(members) == 0:
        return np.zeros(len(values), dtype=bool)
    if len(values) + len(members) >= _DENSE_MIN:
        # Row ids are small dense integers: a bitmap over their range is one
        # vectorized gather (5x faster than hashing at 1M ids)
        lo = min(int(values.min()), int(members.min()))
        span = max(int(values.max()), int(members.max())) - lo + 1
        if lo >= 0 and span <= 8 * (len(values) + len(members)):
            mark = np.zeros(span, dtype=bool)
            mark[members - lo] = True
            return mark[values - lo]
    if len(members) > 4 * len(values):
        members = members[_mask(members, values)]  # hash the small side only
        if len(members) == 0:
            return np.zeros(len(values), dtype=bool)
    if len(members) >= _DENSE_MIN:
        # Many ids spread thinly (a 1% delete: 100,000 ids over 10M): sorted already (a view's
        # keys in its order), searched where they are; else a bitmap of their span: no copy, or
        # ~1 bit an id, where a hash table holds ~60 bytes an id (and is slower to build)
        if _sorted_distinct(members):
            return _in_sorted(values, members)
        if Membership.fits_bitmap(int(members.min()), int(members.max()), len(members)):
            return Membership(members).mask(values)
    return _mask(values, members)


def _sorted_distinct(a: np.ndarray) -> bool:
    return len(a) < 2 or bool((a[1:] > a[:-1]).all())


def _in_sorted(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Mask of ``values`` found in ``members`` (sorted, distinct, not empty)."""
    out = np.empty(len(values), dtype=bool)
    for start in range(0, len(values), _BLOCK):  # (in blocks: a few small temporaries)
        v = values[start:start + _BLOCK]
        pos = np.searchsorted(members, v)
        np.minimum(pos, len(members) - 1, out=pos)
        out[start:start + _BLOCK] = members[pos] == v
    return out


class Membership:
    """``isin`` against one set of ``members`` asked many times (a stream of
    batches): the lookup is built once, in memory O(members). Members whose
    span (largest less smallest) is small next to their count get a bitmap
    of that span, one bit an id (one gather a batch); others a sorted array
    (a binary search a value). At most ``BITS_PER_MEMBER`` bits a member
    beyond ``BITMAP_FREE_BITS``: a 1% delete at 10M rows (100,000 ids over
    10M) holds 1.2 MiB, where a bool an id of the whole span held 10 MiB.

    >>> m = Membership(np.array([5, 3, 9]))
    >>> m.mask(np.array([1, 3, 9, 12, -1])).tolist()
    [False, True, True, False, False]
    >>> Membership(np.array([2**40, 7])).mask(np.array([7, 2**40, 8])).tolist()
    [True, True, False]
    >>> Membership(np.array([-4, 2**62])).mask(np.array([-4, 2**62, 0])).tolist()
    [True, True, False]
    """

    BITS_PER_MEMBER = 64  # a bitmap no larger than the sorted array (8 bytes a member) ...
    BITMAP_FREE_BITS = 1 << 23  # ... beyond 1 MiB

    def __init__(self, members: np.ndarray) -> None:
        members = np.asarray(members, dtype=np.int64)
        self._bits: np.ndarray | None = None
        self._lo = self._hi = 0
        if len(members) and self.fits_bitmap(int(members.min()), int(members.max()), len(members)):
            self._lo, self._hi = int(members.min()), int(members.max())
            self._bits = np.zeros((self._hi - self._lo + 8) >> 3, dtype=np.uint8)
            for start in range(0, len(members), _BLOCK):  # (in blocks: a few small temporaries, no sorted copy)
                rel = members[start:start + _BLOCK] - self._lo
                bit = np.left_shift(np.uint8(1), rel.astype(np.uint8) & 7)
                rel >>= 3  # each member's byte
                np.bitwise_or.at(self._bits, rel, bit)
            self._sorted = np.empty(0, np.int64)  # (the bitmap answers)
        else:
            self._sorted = _distinct(members)

    @classmethod
    def fits_bitmap(cls, lo: int, hi: int, count: int) -> bool:
        """Whether ``count`` members from ``lo`` to ``hi`` get a bitmap."""
        return hi - lo + 1 <= cls.BITS_PER_MEMBER * count + cls.BITMAP_FREE_BITS  # (Python ints: no overflow)

    def mask(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.int64)
        if self._bits is None:
            if not len(self._sorted):
                return np.zeros(len(values), dtype=bool)
            pos = np.minimum(np.searchsorted(self._sorted, values), len(self._sorted) - 1)
            return self._sorted[pos] == values
        out = np.empty(len(values), dtype=bool)
        span = np.uint64(self._hi - self._lo)
        for start in range(0, len(values), _BLOCK):  # (in blocks: a few small temporaries)
            rel = values[start:start + _BLOCK] - self._lo  # (below lo: wraps around as unsigned, outside too)
            inside = rel.view(np.uint64) <= span
            rel[~inside] = 0
            shift = rel.astype(np.uint8) & 7
            rel >>= 3
            out[start:start + _BLOCK] = inside & ((self._bits[rel] >> shift) & 1).astype(bool)
        return out


def positions(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    """For each of ``values``, its index in ``members`` (distinct ids), or -1.

    Hashes ``values`` (the small side in an incremental refresh) and scans
    ``members`` once.
    """
    values = np.asarray(values, dtype=np.int64)
    members = np.asarray(members, dtype=np.int64)
    out = np.full(len(values), -1, dtype=np.int64)
    if len(values) == 0 or len(members) == 0:
        return out
    idx = pc.index_in(pa.array(members), value_set=pa.array(values))  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
    found = idx.is_valid().to_numpy(zero_copy_only=False)
    out[idx.filter(idx.is_valid()).to_numpy().astype(np.int64)] = np.nonzero(found)[0]
    return out


# A key table of one slot a value of the keys' span, when the span is at most this many
# times the number of keys (plus a small floor): dimension ids, dense or nearly.
DIRECT_SPAN_PER_KEY = 4
_DIRECT_SPAN_FLOOR = 1 << 16


def direct_positions(values: np.ndarray, keys: np.ndarray) -> np.ndarray | None:
    """For each of ``values`` (int64), its index in ``keys`` (distinct int64),
    or -1; through a table of one slot a value of the keys' span (a gather a
    value: 2 ms for 100,000 values against 100,000 keys, where Arrow's
    ``index_in`` and the distinct count it needs take 35 ms). None when the
    keys are not distinct or spread too far for such a table.

    >>> direct_positions(np.array([7, 3, 9, -1, 7]), np.array([3, 7, 8])).tolist()
    [1, 0, -1, -1, 1]
    >>> direct_positions(np.array([3]), np.array([3, 3])) is None
    True
    """
    keys = np.asarray(keys, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    if not len(keys):
        return np.full(len(values), -1, dtype=np.int64)
    lo, hi = int(keys.min()), int(keys.max())
    span = hi - lo + 1
    if lo == np.iinfo(np.int64).min or span > DIRECT_SPAN_PER_KEY * len(keys) + _DIRECT_SPAN_FLOOR:
        return None
    index = np.arange(len(keys), dtype=np.int32 if len(keys) < 2**31 else np.int64)
    # (slot 0: every value below the span, the last: every value above; a value is clipped into them)
    table = np.full(span + 2, -1, dtype=index.dtype)
    slots = keys - (lo - 1)
    table[slots] = index
    if not np.array_equal(table[slots], index):  # (a key held twice: one of its slots was written over)
        return None
    at = np.subtract(values, lo - 1)  # (a value far outside the span wraps past its ends: clipped, no match)
    np.clip(at, 0, span + 1, out=at)
    return table[at].astype(np.int64, copy=False)


def _sorted(a: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(a, dtype=np.int64))


def distinct(a: np.ndarray) -> np.ndarray:
    """The distinct int64 values of ``a``, sorted (``np.unique`` by a sort: ~40x
    faster than NumPy 2's hashing ``unique`` on 100,000 row ids).

    >>> distinct(np.array([5, 3, 5, 1])).tolist()
    [1, 3, 5]
    """
    return _distinct(a)


def without(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The distinct values of ``a`` not in ``b``, sorted (``np.setdiff1d``).

    >>> without(np.array([4, 1, 4, 9]), np.array([9])).tolist()
    [1, 4]
    """
    a = _distinct(a)
    return a[~isin(a, b)] if len(a) and len(b) else a


def _distinct(a: np.ndarray, owned: bool = False) -> np.ndarray:
    """The distinct values of ``a``, sorted (``np.unique``, by a sort: NumPy 2's hashing
    ``unique`` is ~5x slower on 100,000 ids). ``owned``: ``a`` is int64 and the
    caller's own (a concatenation): sorted in place, not copied."""
    a = np.asarray(a, dtype=np.int64)
    if _sorted_distinct(a):  # (row ids from Lance: mostly so already, no copy)
        return a
    if owned:
        a.sort()
    else:
        a = _sorted(a)
    new = a[1:] != a[:-1]
    return a if new.all() else a[np.r_[True, new]]  # (row ids: mostly distinct already, no copy)


@dataclass
class KeyPlan:
    """Row-level outcome of a refresh, keyed by source row id (sorted, disjoint)."""

    insert: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    update: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    delete: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    @property
    def compute(self) -> np.ndarray:
        """Source rows whose view row must be (re)computed: inserts + updates."""
        return _sorted(np.concatenate([self.insert, self.update]))

    @property
    def remove_from_view(self) -> np.ndarray:
        """View keys whose current row goes away: deletes + the old side of updates."""
        return _sorted(np.concatenate([self.delete, self.update]))


def plan_keys(view_keys: np.ndarray, changes: ChangeSet, limit: int | None = None, seed: int | None = None) -> KeyPlan:
    """Decide inserts, updates and deletes from a change set.

    ``view_keys`` and each id set of ``changes`` hold distinct ids (row ids
    are unique within a version). Cost is linear in their sizes.

    >>> import numpy as np
    >>> p = plan_keys(np.array([1, 2, 3]), ChangeSet([2, 4], [3], [1]))
    >>> p.insert.tolist(), p.update.tolist(), p.delete.tolist()
    ([4], [2], [1, 3])
    """
    view = np.asarray(view_keys, dtype=np.int64)
    if limit is None:
        passing = changes.changed_pass[~isin(changes.changed_pass, changes.deleted)]
        in_view = isin(passing, view)
        insert, update = passing[~in_view], passing[in_view]
        gone = (_distinct(np.concatenate([changes.deleted, changes.changed_fail]), owned=True)
                if len(changes.changed_fail) else _distinct(changes.deleted))
        delete = gone[isin(gone, view) & ~isin(gone, update)]  # (sorted: a subset of gone)
        return KeyPlan(_sorted(insert), _sorted(update), delete)
    if changes.candidates is None:
        raise ValueError("a limited view needs the full candidate set to plan")
    target = select_limited(changes.candidates, limit, seed)
    in_view = isin(target, view)
    insert = target[~in_view]
    keep = target[in_view]
    update = keep[isin(keep, changes.changed_pass)]
    delete = view[~isin(view, target)]
    return KeyPlan(_sorted(insert), _sorted(update), _sorted(delete))


def split_ranges(num_rows: int, max_rows: int) -> list[tuple[int, int]]:
    """Cut ``[0, num_rows)`` into near-equal half-open ranges of at most ``max_rows``.

    >>> split_ranges(10, 4)
    [(0, 3), (3, 7), (7, 10)]
    >>> split_ranges(0, 4)
    []
    """
    if num_rows <= 0:
        return []
    if max_rows <= 0:
        raise ValueError("max_rows must be positive")
    parts = -(-num_rows // max_rows)
    bounds = [round(i * num_rows / parts) for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]


def ranges_predicate(addrs: np.ndarray, max_runs: int = 64) -> str:
    """SQL selecting exactly these (sorted) row addresses: address ranges, or
    "" when they are too scattered (more than ``max_runs`` runs).

    >>> ranges_predicate(np.array([5, 6, 7]))
    '(_rowaddr >= 5 AND _rowaddr <= 7)'
    >>> ranges_predicate(np.array([1, 3]), max_runs=1)
    ''
    """
    breaks = np.nonzero(np.diff(addrs) != 1)[0]
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(addrs) - 1]])
    if len(starts) > max_runs:
        return ""
    parts = [
        f"(_rowaddr >= {int(addrs[a])} AND _rowaddr <= {int(addrs[b])})" for a, b in zip(starts, ends, strict=True)
    ]
    return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"


def _in_list(ids: np.ndarray) -> str:
    return ", ".join(str(int(i)) for i in ids)


def pieces_from_rows(addrs: np.ndarray, ids: np.ndarray, max_rows: int,
                     within: "tuple[np.ndarray, str | None] | None" = None) -> list[list]:
    """Pieces ``[fragment id, predicate, rows]`` selecting exactly the given
    rows (row addresses and ids), at most ``max_rows`` each, fragment by
    fragment: address ranges when the rows are contiguous runs (appends, whole
    fragments), else their row ids.

    ``within``: the addresses of the candidate rows the given rows were chosen
    from and SQL selecting exactly those candidates (None: every row), say
    the rows an update rewrote that pass the view's filter. Rows that are
    scattered but are every candidate of their address span are selected by
    that span and the SQL: a task then scans that span with a short predicate
    instead of a list of thousands of ids (1% of 1M rows updated, 90% of them
    passing the filter: a list of 9,000 ids cost 3 ms to write and ~12 ms to scan).

    >>> pieces_from_rows(np.array([0, 1, 2, (1 << 32) + 4]), np.array([10, 11, 12, 20]), 2)
    [[0, '(_rowaddr >= 0 AND _rowaddr <= 1)', 2], [0, '(_rowaddr >= 2 AND _rowaddr <= 2)', 1], [1, '(_rowaddr >= 4294967300 AND _rowaddr <= 4294967300)', 1]]
    >>> every_other = np.arange(0, 140, 2)  # 70 runs: too scattered for ranges
    >>> pieces_from_rows(every_other, every_other, 100, within=(np.arange(0, 142, 2), "x > 1"))
    [[0, '(_rowaddr >= 0 AND _rowaddr <= 138) AND (x > 1)', 70]]
    """
    addrs = np.asarray(addrs, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    order = np.argsort(addrs, kind="stable")
    addrs, ids = addrs[order], ids[order]
    candidates = np.sort(np.asarray(within[0], dtype=np.int64)) if within is not None else None
    frag_ids = addrs >> 32
    pieces: list[list] = []
    for fid in np.unique(frag_ids):
        sel = frag_ids == fid
        f_addrs, f_ids = addrs[sel], ids[sel]
        for lo, hi in split_ranges(len(f_addrs), max_rows):
            predicate = ranges_predicate(f_addrs[lo:hi])
            if not predicate and candidates is not None and within is not None:
                first, last = int(f_addrs[lo]), int(f_addrs[hi - 1])
                in_span = int(np.searchsorted(candidates, last, "right") - np.searchsorted(candidates, first, "left"))
                if in_span == hi - lo:  # the rows are every candidate of their span
                    span = f"(_rowaddr >= {first} AND _rowaddr <= {last})"
                    predicate = f"{span} AND ({within[1]})" if within[1] else span
            pieces.append([int(fid), predicate or f"_rowid IN ({_in_list(f_ids[lo:hi])})", int(hi - lo)])
    return pieces


def pack_pieces(pieces: list[list], max_rows: int, balanced: bool = False) -> list[list[list]]:
    """Group consecutive pieces ``[fragment, predicate, rows]`` into tasks of at
    most ``max_rows`` rows (a piece is never larger): many small fragments make
    few tasks, and few view files. ``balanced`` (tasks sized automatically):
    as many tasks as ``max_rows`` asks for, of about equal size (one may pass
    ``max_rows`` by part of a piece), never one more (see :func:`balanced_groups`).

    >>> [len(g) for g in pack_pieces([[0, None, 40], [1, None, 40], [2, None, 40]], 100)]
    [2, 1]
    >>> [len(g) for g in pack_pieces([[0, None, 97], [1, None, 100], [2, None, 100]], 150)]
    [1, 1, 1]
    >>> [len(g) for g in pack_pieces([[0, None, 97], [1, None, 100], [2, None, 100]], 150, balanced=True)]
    [2, 1]
    """
    if balanced:
        total = sum(p[2] for p in pieces)
        return [[pieces[i] for i in g] for g in balanced_groups([p[2] for p in pieces], -(-total // max(1, max_rows)))]
    groups: list[list[list]] = []
    current: list[list] = []
    size = 0
    for piece in pieces:
        if current and size + piece[2] > max_rows:
            groups.append(current)
            current, size = [], 0
        current.append(piece)
        size += piece[2]
    if current:
        groups.append(current)
    return groups


@dataclass(frozen=True)
class History:
    """What the source's commits between the reflected and the target version
    say (read by the caller, see ``refresh.read_history``)."""

    breaks_row_ids: str | None = None  # why row ids no longer mean the same rows (an Overwrite...)
    cleaned_up_at: int | None = None  # the newest version whose commit a history cleanup removed
    # every such commit is a Restore: the rows it brings back carry the ids and row versions
    # they had (a 1:1 view compares them, as when refreshed back to an older version)
    restores_only: bool = False


def choose_how(
    *,
    mode: str,
    definition_changed: bool,
    v0: int | None,
    target: int,
    scope: list[int] | None,
    recompute: list[str] | None,
    scoped_since_whole: bool,
    history: History,
    source_replaced: str | None = None,
    view_written: tuple[bool, str] | None = None,
    scoped_versions: tuple[int, int] | None = None,
) -> tuple[str, str]:
    """How a refresh finds the rows to look at, and why:

    * ``full``: every row, recomputed;
    * ``sync``: every row (in scope), skipping rows the view holds at their
      current version (and markers);
    * ``incremental``: the rows the change feed reports since ``v0``, skipping
      current ones.

    ``source_replaced`` says why the source is not the table the view was
    built from (dropped and created again: row ids and versions restarted);
    nothing the view holds can be matched against it, so it is rebuilt.
    ``view_written`` (rebuild?, why): another tool wrote rows into the view
    since its last refresh; rows it touched are found by their row versions
    and every other row is compared with the source (``sync``), unless the
    writes cannot be traced (an overwrite): then the view is rebuilt.
    ``scoped_versions``: the lowest and highest source version of the
    fragment-scoped refreshes since the last whole one, where the planner can
    take them into account (1:1 views: the rows they brought in that are gone
    since, and rows they already hold current). Within ``[v0, target]`` the
    change feed since ``v0`` covers every row they can have changed, so the
    refresh is incremental; otherwise (or unknown) every row is compared.

    >>> choose_how(mode="auto", definition_changed=False, v0=3, target=5, scope=None, recompute=None,
    ...            scoped_since_whole=False, history=History())
    ('incremental', 'incremental')
    >>> choose_how(mode="incremental_strict", definition_changed=False, v0=3, target=1, scope=None, recompute=None,
    ...            scoped_since_whole=False, history=History(), source_replaced="source 't' was recreated")
    ('full', "source 't' was recreated")
    """
    if mode == "full":
        return "full", "full refresh requested"
    if source_replaced:
        return "full", source_replaced
    if view_written is not None:
        rebuild, why = view_written
        return ("full", f"{why}: rebuilt") if rebuild else ("sync", f"{why}: repaired")
    if definition_changed:
        return "full", "view definition changed"
    if v0 is not None and history.breaks_row_ids:
        return "full", history.breaks_row_ids
    if scope is not None:
        return "sync", f"source fragments {scope}"
    if recompute is not None:
        return "sync", f"recompute {recompute}"
    if v0 is None:
        return "sync", "first refresh"
    if history.cleaned_up_at is not None:
        return "sync", f"the source's history up to version {history.cleaned_up_at} was cleaned up: comparing row versions"
    if target < v0:
        return "sync", f"source version {target} is older than the reflected version {v0}"
    if scoped_since_whole:
        if scoped_versions is not None and v0 <= scoped_versions[0] and scoped_versions[1] <= target:
            return "incremental", "incremental (after fragment-scoped refreshes)"
        # rows a scoped refresh took from other source versions are only found
        # by comparing every row with the source (the change feed since v0 misses them)
        return "sync", "fragment-scoped refreshes since the last whole refresh"
    return "incremental", "incremental"


# Bounds of automatically sized tasks: a task holds its output rows in memory
# until it writes them, and a task of expensive rows should not run for hours.
MAX_TASK_ROWS = 1 << 20
MIN_TASK_ROWS = 1024
MAX_TASK_SECONDS = 120.0


def fit_to_fragments(per_task: int, largest_fragment: int, slack: float = 1.25) -> int:
    """Rows per task raised to the largest fragment when that is only a little
    larger: whole fragments make one task each instead of a full piece plus a
    small remainder that packs with nothing (Lance writes fragments of
    1,048,576 rows; 1M-row tasks cut 10M rows into 18 tasks, not 10).

    >>> fit_to_fragments(1_000_000, 1_048_576)
    1048576
    >>> fit_to_fragments(1_000_000, 4_000_000), fit_to_fragments(1_000_000, 900_000)
    (1000000, 1000000)
    """
    if per_task < largest_fragment <= per_task * slack:
        return largest_fragment
    return per_task


def balanced_groups(sizes: list[int], groups: int) -> list[list[int]]:
    """Indexes of consecutive items cut into at most ``groups`` groups of about
    equal total size: an item goes to the group its middle falls in. Filling
    groups greedily up to a bound makes one group too many whenever the items
    do not add up to the bound exactly (eight fragments, one of them a little
    smaller, into tasks of half the rows: 4 + 3 + 1), a second wave of tasks
    on a machine with as many cores as groups.

    >>> balanced_groups([121, 125, 125, 125, 125, 125, 125, 125], 2)
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> balanced_groups([10, 1000, 10], 2), balanced_groups([5, 5], 4), balanced_groups([], 2)
    ([[0], [1, 2]], [[0], [1]], [])
    """
    total = sum(sizes)
    if not sizes:
        return []
    if total <= 0 or groups <= 1:
        return [list(range(len(sizes)))]
    target = total / groups
    out: list[list[int]] = [[] for _ in range(groups)]
    seen = 0
    for i, n in enumerate(sizes):
        out[min(groups - 1, int((seen + n / 2) // target))].append(i)
        seen += n
    return [g for g in out if g]


def fragment_tasks(counts: list[int], parallelism: int, rows_per_task: int | None = None) -> list[list[int]]:
    """Indexes of consecutive fragments (``counts`` rows to compute in each)
    grouped into tasks sized automatically (:func:`task_rows`), or of about
    ``rows_per_task`` rows (whole fragments: a task holds at least one), of
    about equal size (:func:`balanced_groups`).

    >>> fragment_tasks([121_000] + [125_000] * 7, 2)   # two cores: two tasks, not 4 + 3 + 1
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> fragment_tasks([300, 400], 2)                  # small work: one task (at least 1,024 rows each)
    [[0, 1]]
    >>> fragment_tasks([300, 400, 500], 2, rows_per_task=400)   # a task size given: three tasks
    [[0], [1], [2]]
    """
    total = sum(counts)
    if not total:
        return []
    per_task = rows_per_task if rows_per_task else task_rows(total, None, parallelism)
    return balanced_groups(counts, min(len(counts), -(-total // per_task)))


def task_rows(total_rows: int, seconds_per_row: float | None, parallelism: int) -> int:
    """Rows per task when the caller did not fix it: as few tasks as keep every
    core busy (a multiple of ``parallelism``: per-task overhead dominates
    cheap UDFs), more when a task would hold over ``MAX_TASK_ROWS`` rows or run
    over ``MAX_TASK_SECONDS`` of estimated work (``seconds_per_row``, None:
    unknown, the row bound alone).

    >>> task_rows(1_000_000, 5e-6, 2)      # cheap rows, two cores: two tasks
    500000
    >>> task_rows(10_000_000, 5e-6, 2)     # memory bound: 10 tasks of 1M
    1000000
    >>> task_rows(100_000, 0.01, 2)        # 1,000 s of work: tasks of <= 120 s, a multiple of 2
    10000
    >>> task_rows(500, None, 8), task_rows(0, None, 4)
    (1024, 1024)
    """
    parallelism = max(1, int(parallelism))
    per_task = MAX_TASK_ROWS
    if seconds_per_row and seconds_per_row > 0:
        per_task = min(per_task, max(MIN_TASK_ROWS, int(MAX_TASK_SECONDS / seconds_per_row)))
    waves = max(1, -(-total_rows // (parallelism * per_task)))
    n_tasks = parallelism * waves
    return max(MIN_TASK_ROWS, -(-total_rows // n_tasks))


def values_differ(x: "pa.Array | pa.ChunkedArray", y: "pa.Array | pa.ChunkedArray") -> np.ndarray:
    """Mask of the positions where two aligned columns differ (NULL equals
    NULL; values Arrow cannot compare, nested ones say, compared as Python values).

    >>> values_differ(pa.array([1, None, 3]), pa.array([1, None, 4])).tolist()
    [False, False, True]
    """
    try:
        same = pc.fill_null(pc.equal(x, y.cast(x.type)), False)  # pyright: ignore[reportAttributeAccessIssue]
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))  # pyright: ignore[reportAttributeAccessIssue]
        return ~np.asarray(pc.or_(same, both_null).to_numpy(zero_copy_only=False), dtype=bool)  # pyright: ignore[reportAttributeAccessIssue]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return np.array([a != b for a, b in zip(x.to_pylist(), y.to_pylist(), strict=True)], dtype=bool)
