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
    "ChangeSet",
    "KeyPlan",
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
    return table.column(col).to_numpy().astype(np.int64)


def isin(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Boolean mask of ``values`` found in ``members`` (hash-based, O(n + m)).

    The hash table is always built on the smaller side: an incremental refresh
    checks a few changed ids against a large view without hashing the view.
    """
    values = np.asarray(values, dtype=np.int64)
    members = np.asarray(members, dtype=np.int64)
    if len(values) == 0 or len(members) == 0:
        return np.zeros(len(values), dtype=bool)
    if len(members) > 4 * len(values):
        members = members[_mask(members, values)]  # hash the small side only
        if len(members) == 0:
            return np.zeros(len(values), dtype=bool)
    return _mask(values, members)


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


def _sorted(a: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(a, dtype=np.int64))


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
        gone = np.unique(np.concatenate([changes.deleted, changes.changed_fail]))
        delete = gone[isin(gone, view) & ~isin(gone, update)]
        return KeyPlan(_sorted(insert), _sorted(update), _sorted(delete))
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
