"""lancedb's differential refresh test (``rust/lancedb/src/materialized_view/
differential.rs``), ported onto mv_assets' API.

The refresh contract is a property: after any sequence of source mutations,
a view maintained by default refreshes equals the definition evaluated
against the source directly, and so does a forced full refresh. The oracle is
an independent read of the source (a plain pyarrow column read, the filter
applied in Python), sharing nothing with the refresh path. It is checked after
every step, not only at the end: a later mutation that forces a rebuild would
heal an incremental error.

lancedb's ``differential_exhaustive`` runs every sequence of the seven
operations up to length 3 for each of the three view shapes (3 x 399). Here,
by default, every sequence up to length 2 (3 x 56) and 49 of the 343 of length
3 per shape: (a, b, (a + b) mod 7), which put every pair of ops at every pair
of positions (a pairwise-covering design), about 40 s on a shared 2-core
machine. ``MV_ASSETS_DIFFERENTIAL_DEPTH=3`` runs lancedb's full sweep (about
3.5 min there), ``=4`` its ``differential_exhaustive_deep``. Sequences sharing
a prefix share its work: the op tree is walked depth first, each node's
catalog (source, view and mv_assets' state) copied for each child, so every
step is one op, one refresh and one check; the forced full refresh of each
sequence runs on its node's copy once its children have theirs.

Where lancedb's API has no counterpart the op is written with pylance, beside
mv_assets (an open-world write): adding an all-null column, and merge_insert's
``when_not_matched_by_source_delete``. lancedb's cross-process concurrency
cases are not ported here (mv_assets' refresh lock and commit retries are
covered by tests/test_hardening.py and tests/test_overlap.py).
"""

import os
import shutil
from dataclasses import dataclass, replace

import lance
import pyarrow as pa
import pytest

import mv_assets as mv
from mv_assets.api.table import MaterializedView

OPS = ("AppendNew", "DeleteEven", "UpdateOddScore", "Compact", "AddColumn", "MergeDropLargest", "MergeUpsert")
SHAPES = ("Identity", "Filtered", "Limited")
CAP = 4
# unset: every sequence up to length 2, and the length-3 sequences (a, b, (a + b) mod 7), which hold every
# pair of ops at every pair of positions (49 of 343); N: every sequence up to length N (lancedb: 3, deep: 4)
_DEPTH_ENV = os.environ.get("MV_ASSETS_DIFFERENTIAL_DEPTH")
DEPTH = int(_DEPTH_ENV) if _DEPTH_ENV else 3
EXHAUSTIVE = bool(_DEPTH_ENV)


@dataclass(frozen=True)
class Counters:
    next_id: int = 100
    added_columns: int = 0


def _rows(ids: list[int], bump: int = 0) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int32()),
                     "score": pa.array([float(i * 10 + bump) for i in ids], pa.float32())})


def _matches(shape: str, score: float) -> bool:
    return score > 50 if shape == "Filtered" else True


def _connect(root: str) -> mv.Connection:
    return mv.connect(root, runner=mv.InlineRunner())


def _new_case(root: str, shape: str):
    db = _connect(root)
    src = db.create_table("src", _rows([1, 2, 3, 4]), primary_key="id")
    q = src.search(None).select({"id": "id", "score": "score"})
    if shape == "Filtered":
        q = q.where("score > 50")
    if shape == "Limited":
        q = q.limit(CAP)
    return db, db.create_materialized_view("view", q)


def _open_view(db: mv.Connection) -> MaterializedView:
    view = db.open_table("view")
    assert isinstance(view, MaterializedView)
    return view


def _source_ids(uri: str) -> list[int]:
    return lance.dataset(uri).to_table(columns=["id"]).column("id").to_pylist()


def _apply(db: mv.Connection, op: str, c: Counters) -> Counters:
    src = db.open_table("src")
    if op == "AppendNew":  # mixed parity: UpdateOddScore always has an appended row to move
        src.add(_rows([c.next_id, c.next_id + 101, c.next_id + 202]))
        return replace(c, next_id=c.next_id + 303)
    if op == "DeleteEven":
        src.delete("id % 2 = 0")
    elif op == "UpdateOddScore":
        src.update("id % 2 = 1", {"score": -1.0})
    elif op == "Compact":
        src.compact_files()
    elif op == "AddColumn":  # a column the view does not read (pylance: an all-null column)
        lance.dataset(src.uri).add_columns(pa.field(f"extra_{c.added_columns + 1}", pa.int32()))
        return replace(c, added_columns=c.added_columns + 1)
    elif op == "MergeDropLargest":  # merge_insert whose by-source arm deletes (pylance)
        ids = sorted(_source_ids(src.uri))[:-1]
        if ids:
            (lance.dataset(src.uri).merge_insert("id").when_not_matched_by_source_delete()
             .execute(_rows(ids)))
    elif op == "MergeUpsert":  # one row updated in place, one inserted, one transaction
        ids = sorted(_source_ids(src.uri))
        existing = ids[0] if ids else c.next_id
        src.merge_insert(_rows(sorted({existing, c.next_id}), bump=5))
        return replace(c, next_id=c.next_id + 1)
    else:  # pragma: no cover
        raise AssertionError(op)
    return c


def _oracle(db: mv.Connection, shape: str) -> list[tuple[int, int]]:
    t = lance.dataset(db.table_uri("src")).to_table(columns=["id", "score"]).to_pylist()
    return sorted((r["id"], int(r["score"])) for r in t if _matches(shape, r["score"]))


def _view_rows(db: mv.Connection) -> list[tuple[int, int]]:
    t = lance.dataset(db.table_uri("view")).to_table(columns=["id", "score"]).to_pylist()
    return sorted((r["id"], int(r["score"])) for r in t)


def _check(db: mv.Connection, shape: str, label: str) -> None:
    expected, actual = _oracle(db, shape), _view_rows(db)
    if shape != "Limited":
        assert actual == expected, f"{label}: view diverged from the oracle\n  expected {expected}\n  actual   {actual}"
        return
    # a capped view holds a subset of the definition's rows, at most the cap, each once, and is complete below it
    assert len(actual) <= CAP, f"{label}: {len(actual)} rows over the cap of {CAP}: {actual}"
    assert len(set(actual)) == len(actual), f"{label}: a row twice: {actual}"
    stray = [r for r in actual if r not in expected]
    assert not stray, f"{label}: {stray} not selected by the definition {expected}"
    assert len(actual) >= min(CAP, len(expected)), f"{label}: {len(actual)} of {len(expected)} rows under the cap"


def _children(ops: tuple[str, ...]) -> tuple[str, ...]:
    if EXHAUSTIVE or len(ops) < 2:
        return OPS
    return (OPS[(OPS.index(ops[0]) + OPS.index(ops[1])) % len(OPS)],)


def _walk(root: str, shape: str, ops: tuple[str, ...], c: Counters, depth: int, counted: list[int]) -> None:
    """Children first (each on its own copy), then this sequence's forced full refresh."""
    label = f"{shape} {list(ops)}"
    if len(ops) < depth:
        for op in _children(ops):
            child = f"{root}-{OPS.index(op)}"
            shutil.copytree(root, child)
            db = _connect(child)
            c2 = _apply(db, op, c)
            _open_view(db).refresh()
            _check(db, shape, f"{shape} {list(ops + (op,))} (step {len(ops)}, {op})")
            counted[0] += 1
            _walk(child, shape, ops + (op,), c2, depth, counted)
    db = _connect(root)
    result = _open_view(db).refresh(mode="full")
    assert result.full
    _check(db, shape, f"{label} (final full refresh)")
    shutil.rmtree(root)


@pytest.mark.parametrize("shape", SHAPES)
def test_differential_exhaustive(tmp_path, shape):
    """Every op sequence up to DEPTH: the oracle after every step and after a
    forced full refresh of each sequence."""
    root = str(tmp_path / "c")
    db, view = _new_case(root, shape)
    view.refresh()
    _check(db, shape, f"{shape} (initial)")
    counted = [0]
    _walk(root, shape, (), Counters(), DEPTH, counted)
    n = len(OPS)
    assert counted[0] == (sum(n**k for k in range(1, DEPTH + 1)) if EXHAUSTIVE else n + n * n + n * n)




def _refresh(view):
    before = lance.dataset(view.uri).version
    r = view.refresh()
    moved = lance.dataset(view.uri).version != before
    return ("rebuild" if r.full else "incremental" if moved else "no_op"), r


def test_differential_named_regressions(tmp_path):
    """lancedb's named interleavings; the mode assertions pin how each op is
    refreshed, which value comparison alone cannot (a needless rebuild still
    matches the oracle)."""
    # An append stays incremental.
    db, view = _new_case(str(tmp_path / "a"), "Identity")
    view.refresh()
    _apply(db, "AppendNew", Counters())
    mode, r = _refresh(view)
    assert mode == "incremental" and r.rows_inserted == 3
    _check(db, "Identity", "append stays incremental")

    # A column the view does not read does not force a rebuild, and writes nothing.
    db, view = _new_case(str(tmp_path / "b"), "Identity")
    view.refresh()
    _apply(db, "AddColumn", Counters())
    mode, r = _refresh(view)
    assert mode != "rebuild" and r.rows_inserted + r.rows_updated == 0
    _check(db, "Identity", "unread column")

    # Compaction rearranges rows without changing them: nothing rebuilt or computed.
    db, view = _new_case(str(tmp_path / "c"), "Identity")
    view.refresh()
    c = _apply(db, "AppendNew", Counters())
    view.refresh()
    c = _apply(db, "Compact", c)
    mode, r = _refresh(view)
    assert mode != "rebuild" and r.rows_inserted + r.rows_updated == 0
    _check(db, "Identity", "compaction alone")
    # ... and the next append is computed alone.
    _apply(db, "AppendNew", c)
    mode, r = _refresh(view)
    assert mode == "incremental" and r.rows_inserted == 3 and r.rows_updated == 0
    _check(db, "Identity", "compact then append")

    # A row updated out of the filter leaves the view: the fixture proves an
    # eviction happened, not only that the end state matches.
    db, view = _new_case(str(tmp_path / "d"), "Filtered")
    _apply(db, "AppendNew", Counters())
    view.refresh()
    before = len(_view_rows(db))
    _apply(db, "UpdateOddScore", Counters(next_id=403))
    mode, r = _refresh(view)
    after = len(_view_rows(db))
    assert mode == "incremental" and r.rows_deleted > 0
    assert after < before, f"no view row was evicted ({before} -> {after})"
    _check(db, "Filtered", "update crosses the filter")
