"""Pure planning logic: no Lance, no Spark."""

import os

import numpy as np
import pytest

import mv_assets as mv
from mv_assets.model.planning import ChangeSet, plan_keys, select_limited, shuffle_keys, split_ranges


def _p(view, changed_pass, changed_fail, deleted, candidates=None, limit=None, seed=None):
    p = plan_keys(np.array(view, np.int64), ChangeSet(changed_pass, changed_fail, deleted, candidates), limit, seed)
    return p.insert.tolist(), p.update.tolist(), p.delete.tolist()


@pytest.mark.parametrize(
    "view, changed_pass, changed_fail, deleted, expected",
    [
        # nothing changed
        ([1, 2, 3], [], [], [], ([], [], [])),
        # plain append
        ([1, 2], [3, 4], [], [], ([3, 4], [], [])),
        # append of rows failing the filter
        ([1, 2], [], [3, 4], [], ([], [], [])),
        # delete of a view row and of a row never in the view
        ([1, 2], [], [], [2, 9], ([], [], [2])),
        # update that stays in the filter: recompute
        ([1, 2], [2], [], [], ([], [2], [])),
        # update that moves a row out of the filter
        ([1, 2], [], [2], [], ([], [], [2])),
        # update that moves a row into the filter
        ([1, 2], [5], [], [], ([5], [], [])),
        # everything at once
        ([1, 2, 3, 4], [4, 7], [3], [1, 8], ([7], [4], [1, 3])),
        # first refresh
        ([], [1, 2, 3], [4], [], ([1, 2, 3], [], [])),
    ],
)
def test_plan_keys_table(view, changed_pass, changed_fail, deleted, expected):
    assert _p(view, changed_pass, changed_fail, deleted) == expected


def test_compute_and_remove_sets():
    p = plan_keys(np.array([1, 2, 3]), ChangeSet([2, 4], [3], [1]))
    assert p.compute.tolist() == [2, 4]
    assert p.remove_from_view.tolist() == [1, 2, 3]


def test_limit_without_seed_keeps_first_rows_by_row_id():
    # candidates 1..10 pass, limit 3 -> 1,2,3; view has 1,2,5
    assert _p([1, 2, 5], [], [], [], candidates=list(range(1, 11)), limit=3) == ([3], [], [5])


def test_limit_refills_after_delete():
    # 2 was deleted: next candidate enters
    assert _p([1, 2, 3], [], [], [2], candidates=[1, 3, 4, 5], limit=3) == ([4], [], [2])


def test_limit_updates_only_kept_changed_rows():
    assert _p([1, 2, 3], [2, 9], [], [], candidates=[1, 2, 3, 9], limit=3) == ([], [2], [])


def test_limit_requires_candidates():
    with pytest.raises(ValueError, match="candidate"):
        plan_keys(np.array([1]), ChangeSet([], [], []), limit=3)


def test_shuffle_keys_deterministic_and_seed_dependent():
    ids = np.arange(1000)
    a = shuffle_keys(ids, 42)
    assert np.array_equal(a, shuffle_keys(ids, 42))
    assert not np.array_equal(a, shuffle_keys(ids, 43))
    assert len(np.unique(a)) == 1000
    # order really is shuffled: far from sorted
    assert abs(np.corrcoef(np.argsort(a), ids)[0, 1]) < 0.1
    assert np.array_equal(shuffle_keys(ids, None), ids.astype(np.uint64))


def test_select_limited_is_history_independent():
    cand = np.arange(100)
    chosen = select_limited(cand, 10, 7)
    # adding unrelated candidates with larger keys never evicts chosen ones
    keys = shuffle_keys(cand, 7)
    threshold = np.sort(keys)[9]
    assert all(shuffle_keys(np.array([c]), 7)[0] <= threshold for c in chosen)
    # order of input does not matter
    assert np.array_equal(select_limited(cand[::-1], 10, 7), chosen)
    assert select_limited(cand, None, 7).tolist() == cand.tolist()
    assert select_limited(cand, 0, 7).tolist() == []


@pytest.mark.parametrize(
    "n, m, expected",
    [
        (0, 4, []),
        (3, 4, [(0, 3)]),
        (4, 4, [(0, 4)]),
        (10, 4, [(0, 3), (3, 7), (7, 10)]),
        (8, 4, [(0, 4), (4, 8)]),
    ],
)
def test_split_ranges(n, m, expected):
    assert split_ranges(n, m) == expected


def test_split_ranges_covers_everything():
    for n in range(0, 50):
        for m in range(1, 12):
            r = split_ranges(n, m)
            assert sum(b - a for a, b in r) == n
            assert all(0 < b - a <= m for a, b in r)
            assert all(r[i][1] == r[i + 1][0] for i in range(len(r) - 1))


def test_split_ranges_rejects_bad_size():
    with pytest.raises(ValueError):
        split_ranges(3, 0)


@pytest.mark.parametrize("n_values, n_members", [(0, 5), (5, 0), (3, 100), (100, 3), (50, 50)])
def test_isin_and_positions_match_numpy(n_values, n_members):
    from mv_assets.model.planning import isin, positions

    rng = np.random.default_rng(n_values * 1000 + n_members)
    members = rng.choice(1000, size=n_members, replace=False)
    values = rng.choice(1000, size=n_values, replace=False)
    assert isin(values, members).tolist() == np.isin(values, members).tolist()
    expected = [int(np.nonzero(members == v)[0][0]) if v in members else -1 for v in values]
    assert positions(values, members).tolist() == expected


@pytest.mark.parametrize("span", [1_000, 10_000_000, 2**40])
def test_membership_and_isin_of_many_thin_ids_match_numpy_and_hold_o_members(span):
    """A 1% delete's ids spread over the table: the lookup holds a bit per id
    of their span, or their sorted array when the span is wider, never a bool
    per id of the table (10 MB at 10M rows before, whatever was deleted)."""
    from mv_assets.model.planning import Membership, isin

    rng = np.random.default_rng(span % 997)
    n = min(span // 100, 100_000)
    members = rng.choice(span, size=n, replace=False) if span < 2**31 else rng.integers(0, span, n)
    values = np.concatenate([rng.integers(-5, span + 5, 50_000), members[::3]])

    def held(m: Membership) -> int:  # the bytes of the arrays the lookup keeps
        return sum(a.nbytes for a in vars(m).values() if isinstance(a, np.ndarray))

    m = Membership(members)
    assert m.mask(values).tolist() == np.isin(values, members).tolist()
    assert isin(values, members).tolist() == np.isin(values, members).tolist()
    assert held(m) <= 8 * n + (1 << 20), held(m)  # O(members): at most their sorted array, or 1 MiB
    assert held(Membership(members[:1])) <= 8 + (1 << 20)
    assert Membership(np.empty(0, np.int64)).mask(values).tolist() == [False] * len(values)


# --- how a refresh looks for rows: a table of cases ---------------------------

from mv_assets.model.planning import History, choose_how, pack_pieces, pieces_from_rows, ranges_predicate  # noqa: E402

_BASE = dict(mode="auto", definition_changed=False, v0=5, target=9, scope=None, recompute=None,
             scoped_since_whole=False, history=History())

HOW_CASES = [
    # (changes to the base case, expected how, words in the reason)
    ({}, "incremental", "incremental"),
    ({"mode": "full"}, "full", "requested"),
    ({"mode": "incremental_strict"}, "incremental", "incremental"),
    ({"definition_changed": True}, "full", "definition changed"),
    ({"history": History(breaks_row_ids="source version 7 is an Overwrite")}, "full", "Overwrite"),
    ({"v0": None, "history": History(breaks_row_ids="x")}, "sync", "first refresh"),
    ({"scope": [2, 3]}, "sync", "fragments [2, 3]"),
    ({"recompute": ["y"]}, "sync", "recompute ['y']"),
    ({"v0": None}, "sync", "first refresh"),
    ({"history": History(cleaned_up_at=6)}, "sync", "up to version 6 was cleaned up"),
    ({"history": History(breaks_row_ids="an Overwrite", cleaned_up_at=6)}, "full", "Overwrite"),
    ({"scoped_since_whole": True}, "sync", "fragment-scoped"),
    # scoped refreshes within [v0, target]: the change feed since v0 covers what they changed
    ({"scoped_since_whole": True, "scoped_versions": (5, 9)}, "incremental", "after fragment-scoped refreshes"),
    ({"scoped_since_whole": True, "scoped_versions": (6, 7)}, "incremental", "after fragment-scoped refreshes"),
    ({"scoped_since_whole": True, "scoped_versions": (4, 9)}, "sync", "fragment-scoped"),  # one went back
    ({"scoped_since_whole": True, "scoped_versions": (6, 10)}, "sync", "fragment-scoped"),  # one past the target
    ({"scoped_since_whole": True, "scoped_versions": (6, 7), "target": 3}, "sync", "older than the reflected"),
    ({"scoped_since_whole": True, "scoped_versions": (6, 7), "history": History(cleaned_up_at=6)}, "sync",
     "cleaned up"),
    ({"target": 3}, "sync", "older than the reflected version 5"),
    ({"target": 5}, "incremental", "incremental"),
    ({"definition_changed": True, "scope": [1]}, "full", "definition changed"),
]


@pytest.mark.parametrize("change,how,words", HOW_CASES)
def test_choose_how(change, how, words):
    got_how, reason = choose_how(**{**_BASE, **change})
    assert got_how == how and words in reason


RANGE_CASES = [
    ([7], "(_rowaddr >= 7 AND _rowaddr <= 7)"),
    ([1, 2, 3], "(_rowaddr >= 1 AND _rowaddr <= 3)"),
    ([1, 2, 5, 6], "((_rowaddr >= 1 AND _rowaddr <= 2) OR (_rowaddr >= 5 AND _rowaddr <= 6))"),
    (list(range(0, 200, 2)), ""),  # 100 runs: too scattered for ranges
]


@pytest.mark.parametrize("addrs,expected", RANGE_CASES)
def test_ranges_predicate(addrs, expected):
    assert ranges_predicate(np.array(addrs)) == expected


def test_pieces_select_exactly_their_rows_and_packing_keeps_tasks_small():
    frag = lambda f, offsets: [(f << 32) + o for o in offsets]  # noqa: E731
    addrs = frag(0, range(10)) + frag(1, [0, 5, 9]) + frag(3, range(0, 400, 3))
    ids = list(range(len(addrs)))
    pieces = pieces_from_rows(np.array(addrs), np.array(ids), 4)
    assert sum(p[2] for p in pieces) == len(addrs)
    assert all(p[2] <= 4 for p in pieces)
    assert {p[0] for p in pieces} == {0, 1, 3}
    scattered = [p for p in pieces if p[0] == 3]
    assert all("_rowaddr >=" in p[1] and "_rowid" not in p[1] for p in scattered)  # 4 rows a piece: few runs
    big = pieces_from_rows(np.array(frag(3, range(0, 400, 3))), np.arange(134), 200)
    assert big[0][1].startswith("_rowid IN (")  # 134 scattered rows: by id
    groups = pack_pieces([[0, None, 3], [1, None, 3], [2, None, 3], [3, None, 9], [4, None, 1]], 9)
    assert [[p[0] for p in g] for g in groups] == [[0, 1, 2], [3], [4]]
    assert pack_pieces([], 5) == []


@pytest.mark.parametrize(
    "master, remote, env, expected",
    [("local[2]", None, None, 2), ("local", None, None, 1), ("local[*]", None, None, os.cpu_count() or 1),
     ("local[4,2]", None, None, 4), ("spark://h:7077", None, None, 8), (None, "sc://h:15002", None, 8),
     ("local[2]", None, "3", 3)],
)
def test_runner_parallelism_without_starting_spark(master, remote, env, expected, monkeypatch):
    if env:
        monkeypatch.setenv("MV_ASSETS_SPARK_PARALLELISM", env)
    else:
        monkeypatch.delenv("MV_ASSETS_SPARK_PARALLELISM", raising=False)
    monkeypatch.delenv("MV_ASSETS_SPARK_REMOTE", raising=False)
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    runner = mv.SparkRunner(master=master, remote=remote)
    assert runner.parallelism() == expected and not runner.started
    assert mv.InlineRunner().parallelism() == 1



def _index_in_oracle(values, keys):
    """Each value's index in ``keys`` by a plain dict (NULL: None), NULL keys matching nothing."""
    at = {}
    for i, k in enumerate(keys):
        if k is not None:
            at.setdefault(k, i)
    return [None if v is None else at.get(v) for v in values]


@pytest.mark.parametrize("seed", range(40))
def test_a_join_step_looks_up_integer_keys_as_a_dict_would(seed):
    """The direct lookup a join task uses for integer keys (a table over the
    keys' span) finds what a dict finds: NULLs on either side, values outside
    the span, negative and huge values, unsigned types; keys held twice or
    spread far are left to the hash join (None)."""
    import pyarrow as pa

    from mv_assets.execution.join_tasks import _looked_up
    from mv_assets.model.planning import direct_positions

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    lo = int(rng.choice([0, -50, 10**12, -(2**62)]))
    keys = list(rng.permutation(np.arange(lo, lo + 2 * n + 1))[:n].tolist())
    if n and seed % 5 == 0:
        keys[int(rng.integers(0, n))] = None
    values = [int(x) for x in rng.integers(lo - 10, lo + 2 * n + 10, int(rng.integers(0, 400)))]
    values += [2**63 - 1, -(2**63)] if seed % 3 == 0 else []
    if values and seed % 4 == 0:
        values[0] = None
    got = _looked_up(pa.chunked_array([pa.array(values, pa.int64())]), pa.array(keys, pa.int64()))
    assert got is not None and got.to_pylist() == _index_in_oracle(values, keys)
    # other integer types, as Arrow casts them
    small = [v for v in values if v is None or 0 <= v < 2**31]
    ukeys = [k for k in keys if k is None or 0 <= k < 2**31]
    got = _looked_up(pa.array(small, pa.int32()), pa.array(ukeys, pa.uint64()))
    assert got is not None and got.to_pylist() == _index_in_oracle(small, ukeys)
    if n > 1:  # a key held twice: not a dimension, the hash join's
        dup = [k for k in keys if k is not None]
        assert len(dup) < 2 or direct_positions(np.array(values[1:3] or [0]), np.array(dup + dup[:1])) is None
    # spread far: no table of its span
    assert direct_positions(np.array([1]), np.array([0, 10**9])) is None
    # a uint64 past int64's range, or a float key: not looked up this way
    assert _looked_up(pa.array([1], pa.int64()), pa.array([2**64 - 1], pa.uint64())) is None
    assert _looked_up(pa.array([1.0]), pa.array([1.0])) is None
