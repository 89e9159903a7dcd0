"""Fragment-scoped refreshes (what a Dagster partition run does) interleaved with
whole refreshes, refreshes to older versions and every kind of source change.

The promise: after any such interleaving, a whole refresh makes the view equal
the query over the source at the version it records. Inline runner (no JVM):
the planning and commit code is the same as on Spark.
"""

import os
from datetime import timedelta

import lance
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from oracle import actual_view, expected_view, shuffle_key, source_rows
from spies import whole_source_scans

import mv_assets as mv


def _keep(row):
    return row["x"] % 3 != 0


def _project(row):
    return {"id": row["id"], "x": row["x"], "y": row["x"] * 10 + 1}


@mv.udf
def y(x: int) -> int:
    return x * 10 + 1


def _make(db, n=5):
    t = db.create_table("raw", [{"id": i, "x": i} for i in range(n)], primary_key="id")
    v = db.create_materialized_view("v", t.search(None).where("x % 3 != 0").select({"id": "id", "x": "x", "y": y}))
    return t, v


def _fragments(t) -> list[int]:
    return [f.fragment_id for f in lance.dataset(t.uri).get_fragments()]


def _assert_matches(t, v):
    version = v.source_version
    assert version is not None
    assert actual_view(v) == expected_view(t.uri, version, _keep, _project)


def test_row_inserted_by_a_scoped_refresh_then_deleted_leaves_the_view(db):
    t, v = _make(db)
    v.refresh()
    t.add([{"id": 10, "x": 10}])
    v.refresh(fragments=[_fragments(t)[-1]])  # a partition run picks the new row up
    assert 10 in v.to_arrow().column("id").to_pylist()
    t.delete("id = 10")
    v.refresh()
    _assert_matches(t, v)
    assert 10 not in v.to_arrow().column("id").to_pylist()
    v.refresh()  # and stays gone
    assert 10 not in v.to_arrow().column("id").to_pylist()


def test_refresh_to_an_older_version_after_a_later_scoped_refresh(db):
    t, v = _make(db)
    v.refresh()
    t.add([{"id": 11, "x": 11}])
    older = t.version
    t.add([{"id": 13, "x": 13}])
    t.update("id = 1", {"x": 100})
    v.refresh(fragments=_fragments(t)[-2:])  # scoped, at a version later than `older`
    assert 13 in v.to_arrow().column("id").to_pylist()  # a row of the later version
    r = v.refresh(src_version=older)
    assert v.source_version == older
    _assert_matches(t, v)  # no row or row version of the later versions survives
    assert r.udf_rows_computed == {"y": 2}  # row 1 goes back to its old value, row 11 is new to the view


def test_scoped_refresh_records_nothing_and_the_next_whole_refresh_clears_the_flag(db):
    t, v = _make(db)
    v.refresh()
    t.add([{"id": 20, "x": 20}])
    r = v.refresh(fragments=[_fragments(t)[-1]])
    state = v.refresh_state()
    assert state.scoped_since_whole and state.source_version == r.from_version
    r = v.refresh()  # sync: nothing to compute (the scoped refresh did it), state recorded
    assert r.udf_rows_computed == {} and v.source_version == t.version
    assert not v.refresh_state().scoped_since_whole
    before = lance.dataset(v.uri).version
    v.refresh()  # now a true no-op: commits nothing
    assert lance.dataset(v.uri).version == before


def test_reading_the_state_stops_at_the_newest_refresh_commit(db):
    """Scoped commits carry the last whole source version: reading the state
    does not walk the view's history back to the last whole refresh."""
    t, v = _make(db)
    v.refresh()
    whole = v.source_version
    for i in range(3):
        t.add([{"id": 100 + i, "x": 100 + i}])
        v.refresh(fragments=[_fragments(t)[-1]])
    ds = lance.dataset(v.uri)
    read = []
    real = ds.read_transaction

    class Spy:
        version = ds.version

        def read_transaction(self, version):
            read.append(version)
            return real(version)

        def get_transactions(self, n):  # (the handle's own version's, read with its manifest)
            read.extend(range(self.version, self.version - n, -1))
            return ds.get_transactions(n)

    from mv_assets.storage.state import read_refresh_state

    state = read_refresh_state(Spy())
    assert state.source_version == whole and state.scoped_since_whole
    assert read == [ds.version]


# --- property test: scoped refreshes interleaved with everything else --------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 5)),
        st.tuples(st.just("delete"), st.integers(0, 6)),
        st.tuples(st.just("delete_fragment"), st.integers(0, 9)),
        st.tuples(st.just("update"), st.integers(0, 6)),
        st.tuples(st.just("optimize"), st.just(0)),
        st.tuples(st.just("refresh"), st.just(0)),
        st.tuples(st.just("refresh_older"), st.integers(0, 9)),
        st.tuples(st.just("scoped"), st.integers(0, 9)),
        st.tuples(st.just("scoped_older"), st.integers(0, 99)),
        st.tuples(st.just("cleanup"), st.integers(0, 1)),  # 0: the source's history, 1: the view's
    ),
    min_size=1,
    max_size=14,
)
EXAMPLES = int(os.environ.get("MV_ASSETS_HYPOTHESIS_EXAMPLES", "12")) * 4


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@example(ops=[("refresh", 0), ("add", 1), ("scoped", 1), ("delete", 6), ("refresh", 0)])
@example(ops=[("refresh", 0), ("add", 1), ("add", 2), ("update", 1), ("scoped", 3), ("refresh_older", 2)])
@example(ops=[("refresh", 0), ("add", 2), ("delete_fragment", 9), ("refresh", 0)])
@example(ops=[("add", 2), ("scoped", 0), ("optimize", 0), ("scoped_older", 3), ("update", 2), ("refresh", 0)])
@example(ops=[("refresh", 0), ("add", 2), ("cleanup", 0), ("update", 1), ("refresh", 0), ("cleanup", 1), ("add", 1)])
@example(ops=[("add", 3), ("scoped", 1), ("cleanup", 1), ("delete", 2), ("cleanup", 0), ("refresh_older", 1)])
@given(ops=OPS)
def test_scoped_and_whole_refreshes_interleaved_match_the_oracle(ops, tmp_path_factory):
    db = mv.connect(str(tmp_path_factory.mktemp("cat")), runner=mv.InlineRunner())
    t, v = _make(db, n=6)
    # the same rows, shuffled: one order over the whole view after every whole refresh
    shuffled = db.create_materialized_view(
        "s", t.search(None).where("x % 3 != 0").select({"id": "id", "x": "x", "y": y}).shuffle(seed=11)
    )
    next_id = 6

    def existing(arg):  # a version still in the history (cleanup removes old ones)
        versions = [x["version"] for x in lance.dataset(t.uri).versions()]
        return versions[arg % len(versions)]

    for op, arg in list(ops) + [("refresh", 0)]:
        if op == "add":
            t.add([{"id": next_id + k, "x": (next_id + k) * 7 % 11} for k in range(arg)])
            next_id += arg
        elif op == "delete":
            t.delete(f"id % 7 = {arg}")
        elif op == "delete_fragment":  # empties one whole source fragment
            frags = lance.dataset(t.uri).get_fragments()
            if frags:
                ids = frags[arg % len(frags)].to_table(columns=["id"]).column("id").to_pylist()
                if ids:
                    t.delete(f"id IN ({', '.join(map(str, ids))})")
        elif op == "update":
            t.update(f"id % 7 = {arg}", values_sql={"x": "x + 1"})
        elif op == "optimize":
            t.optimize()
        elif op == "cleanup":
            (t if arg == 0 else v).optimize(cleanup_older_than=timedelta(0))
        elif op in ("scoped", "scoped_older"):
            version = t.version if op == "scoped" else existing(arg)
            frags = lance.dataset(t.uri, version=version).get_fragments()
            if not frags:
                continue
            frag = frags[arg % len(frags)]
            v.refresh(src_version=version, fragments=[frag.fragment_id])
            got = actual_view(v)
            exp = expected_view(t.uri, version, _keep, _project)
            in_frag = set(frag.to_table(columns=[], with_row_id=True).column("_rowid").to_pylist())
            assert {k: got.get(k) for k in in_frag} == {k: exp.get(k) for k in in_frag}
            assert set(got) <= set(source_rows(t.uri, version))  # deletions are applied in full
        elif op == "refresh_older":
            version = existing(arg)
            v.refresh(src_version=version)
            assert v.source_version == version
            _assert_matches(t, v)
        else:
            v.refresh()
            assert v.source_version == t.version
            _assert_matches(t, v)
            shuffled.refresh()
            _assert_matches(t, shuffled)
            ids = shuffled.to_arrow(with_internal=True).column("__source_row_id").to_pylist()
            keys = [shuffle_key(i, 11) for i in ids]
            assert keys == sorted(keys)  # shuffle order over the whole view



def test_a_scoped_refresh_removes_rows_deleted_anywhere_without_reading_every_row_id(db, monkeypatch):
    """A partition run removes the view's rows whose source row is gone from
    any fragment: those the whole view held, from the change feed since the
    version it reflects; those scoped refreshes brought in since, by id. The
    source is not scanned whole (before: every row id of the table, ~0.2 s of
    a one-fragment run at 10,000 fragments). Once that version is cleaned up,
    every row id is read, with the same outcome."""
    t, v = _make(db, n=8)
    v.refresh()
    t.add([{"id": 10, "x": 10}, {"id": 11, "x": 11}])
    t.add([{"id": 20, "x": 20}])
    first, second, third = _fragments(t)
    v.refresh(fragments=[second])  # brings 10 and 11 in, at versions after the whole refresh's
    t.delete("id IN (1, 10)")  # one row the whole refresh brought in, one a scoped refresh did
    t.update("id = 2", values_sql={"x": "x + 3"})  # moved to a new fragment, its id kept: not gone
    lance.dataset(t.uri).delete("id = 4")  # another tool
    scans = whole_source_scans(monkeypatch, t.uri)
    v.refresh(fragments=[third])
    monkeypatch.undo()
    assert scans == []
    ids = {r["id"] for r in actual_view(v).values()}
    assert ids == {2, 5, 7, 11, 20}
    assert set(actual_view(v)) <= set(source_rows(t.uri, t.version))

    t.optimize(cleanup_older_than=timedelta(0))  # the version the whole view reflects is gone
    t.delete("id IN (5, 11)")
    scans = whole_source_scans(monkeypatch, t.uri)
    v.refresh(fragments=[_fragments(t)[0]])
    monkeypatch.undo()
    assert scans  # (every row id read)
    assert {r["id"] for r in actual_view(v).values()} == {2, 7, 20}
    v.refresh()
    _assert_matches(t, v)


def test_the_whole_refresh_after_partition_runs_follows_the_change_feed(db, monkeypatch):
    """After fragment-scoped refreshes at source versions since the last whole
    refresh, the next whole refresh is incremental (before: it compared every
    row of the source with the view, 1.0-1.5 s at 10,000 fragments): no scan
    of the whole source, nothing the partition runs computed is computed
    again, and a row they brought in that was deleted since goes."""
    t, v = _make(db, n=8)
    v.refresh()
    t.add([{"id": 10, "x": 10}, {"id": 11, "x": 11}])
    v.refresh(fragments=_fragments(t)[-1:])
    t.add([{"id": 13, "x": 13}])
    t.delete("id IN (1, 10)")
    assert v.plan_refresh().reason == "incremental (after fragment-scoped refreshes)"
    scans = whole_source_scans(monkeypatch, t.uri)
    r = v.refresh()
    monkeypatch.undo()
    assert scans == []
    assert (r.udf_rows_computed, r.rows_inserted, r.rows_deleted) == ({"y": 1}, 1, 2)  # 13 in; 1 and 10 out
    _assert_matches(t, v)
    assert not v.refresh_state().scoped_since_whole

    v.refresh(src_version=t.version - 1, fragments=_fragments(t)[:1])  # a partition run pinned to an older version
    assert v.plan_refresh().reason == "fragment-scoped refreshes since the last whole refresh"  # compares every row
    v.refresh()
    _assert_matches(t, v)


GONE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 4)),
        st.tuples(st.just("add_scoped"), st.integers(1, 4)),  # a partition run of the rows just added
        st.tuples(st.just("delete"), st.integers(0, 6)),
        st.tuples(st.just("lance_delete"), st.integers(0, 6)),  # another tool
        st.tuples(st.just("update"), st.integers(0, 6)),
        st.tuples(st.just("optimize"), st.just(0)),
        st.tuples(st.just("cleanup"), st.just(0)),
        st.tuples(st.just("scoped"), st.integers(0, 9)),
        st.tuples(st.just("scoped_older"), st.integers(0, 99)),  # a partition run pinned to an older version
        st.tuples(st.just("refresh"), st.just(0)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@example(ops=[("add_scoped", 2), ("delete", 0), ("add_scoped", 3), ("update", 2), ("lance_delete", 3)], at=0)
@example(ops=[("add_scoped", 4), ("refresh", 0), ("add_scoped", 2), ("cleanup", 0), ("delete", 2)], at=1)
@example(ops=[("add_scoped", 2), ("update", 0), ("add_scoped", 1), ("delete", 6), ("refresh", 0)], at=0)
@example(ops=[("add", 2), ("update", 1), ("scoped_older", 1), ("add_scoped", 1), ("refresh", 0)], at=0)
@given(ops=GONE_OPS, at=st.integers(0, 99))
def test_the_rows_found_gone_are_those_missing_from_the_source_at_that_version(ops, at, tmp_path_factory):
    """storage.changes.gone_rows (the change feed since the whole view's
    version, lookups by id) against the oracle, the source's row ids read at
    the same version, for the view's keys after random histories of scoped
    and whole refreshes: at the newest version and at an older one. Each
    whole refresh (incremental after scoped refreshes within its versions)
    makes the view equal the oracle."""
    from mv_assets.storage.changes import deleted_since, gone_rows

    db = mv.connect(str(tmp_path_factory.mktemp("cat")), runner=mv.InlineRunner())
    t, v = _make(db, n=6)
    v.refresh()
    next_id = 6
    for op, arg in ops:
        if op in ("add", "add_scoped"):
            t.add([{"id": next_id + k, "x": next_id + k} for k in range(arg)])
            next_id += arg
            if op == "add_scoped":
                v.refresh(fragments=_fragments(t)[-1:])
        elif op == "delete":
            t.delete(f"id % 7 = {arg}")
        elif op == "lance_delete":
            lance.dataset(t.uri).delete(f"id % 7 = {arg}")
        elif op == "update":
            t.update(f"id % 7 = {arg}", values_sql={"x": "x + 3"})
        elif op == "optimize":
            t.optimize()
        elif op == "cleanup":
            t.optimize(cleanup_older_than=timedelta(0))
        elif op == "scoped":
            frags = _fragments(t)
            if frags:  # (0: the newest fragment, whose rows no whole refresh saw)
                v.refresh(fragments=[frags[-1 - arg % len(frags)]])
        elif op == "scoped_older":
            history = [x["version"] for x in lance.dataset(t.uri).versions()]
            version = history[arg % len(history)]
            frags = [f.fragment_id for f in lance.dataset(t.uri, version=version).get_fragments()]
            if frags:
                v.refresh(src_version=version, fragments=frags[-1:])
        else:
            v.refresh()
            assert v.source_version == t.version
            _assert_matches(t, v)
        held = v.to_arrow(with_internal=True)
        keys = np.asarray(held.column("__source_row_id").to_pylist(), dtype=np.int64)
        versions = np.asarray(held.column("__source_row_version").to_pylist(), dtype=np.int64)
        history = [x["version"] for x in lance.dataset(t.uri).versions()]
        for version in {t.version, history[at % len(history)]}:
            present = set(source_rows(t.uri, version))
            expected = [int(k) not in present for k in keys]
            src = lance.dataset(t.uri, version=version)
            got = gone_rows(src, keys, versions, v.source_version, deleted_since(src, v.source_version))
            assert got.tolist() == expected, (op, version, v.source_version)


def test_scoped_refresh_validates_its_fragments(db):
    t, v = _make(db)
    with pytest.raises(ValueError, match="limit"):
        db.create_materialized_view("lim", t.search(None).limit(2)).refresh(fragments=[0])


def test_recompute_a_column_next_to_list_columns(db):
    """Column-only recompute copies the other columns, nested types included
    (Dagster's "materialize only this column" path)."""
    import pyarrow as pa

    @mv.udf(data_type=pa.list_(pa.float32()))
    def emb(x: pa.Array) -> pa.Array:
        return pa.array([[float(v), 1.0] for v in x.to_pylist()], pa.list_(pa.float32()))

    t = db.create_table("raw", [{"id": i, "x": i} for i in range(4)])
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "e": emb, "y": y}))
    v.refresh()
    r = v.refresh(recompute=["y"])
    assert r.udf_rows_computed.get("y") == 4 and not r.udf_rows_computed.get("e")
    rows = sorted(v.to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["e"], r["y"]) for r in rows] == [(i, [float(i), 1.0], i * 10 + 1) for i in range(4)]


@mv.udf
def _plus_one(x: int) -> int:
    return x + 1


def test_a_view_only_fragment_scoped_refreshes_loaded_is_as_stale_as_its_rows_left(tmp_path):
    """A view never refreshed whole, loaded by fragment-scoped refreshes (each
    Dagster partition run): stale_pct follows the rows left (it said 100 %
    beside stale_count 0 once every fragment was covered)."""
    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    t = db.create_table("t", [{"id": i, "x": i} for i in range(20)])
    t.add([{"id": i, "x": i} for i in range(20, 30)])
    v = db.create_materialized_view("v", t.search(None).select({"id": "id", "y": _plus_one}), with_no_data=True)
    assert v.status().stale_pct == 100.0  # (never loaded)
    f0, f1 = t.fragment_ids()
    v.refresh(fragments=[f0])
    s = v.status()
    assert (s.stale_count, s.stale_pct, s.versions_behind) == (10, 50.0, 1)
    v.refresh(fragments=[f1])
    s = v.status()
    assert (s.stale_count, s.stale_pct, s.versions_behind) == (0, 0.0, 0)
