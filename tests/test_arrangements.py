"""Arrangements (seed 004): the in-memory state a join view's refreshes keep
between refreshes (mv_assets.model.arrangement, mv_assets.ops.arrangements).

Checked two ways: the structure against a plain dict over random changes,
and every plan a join view makes with its arrangements against the plan the
same view makes reading the view and the first table instead (no arrangement
kept), over random histories that also compact the view, drop and create it
again, and write its sources with other tools; each refresh against the
oracle of test_join_views."""

import random

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_join_views import OPS, apply, chain_view, make_sources, oracle_chain, oracle_star, star_view

import mv_assets as mv
from mv_assets.model.arrangement import Arrangement
from mv_assets.ops import arrangements

# -- the structure -------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["add", "remove", "find", "kill"]),
                                st.lists(st.integers(0, 40), max_size=12)), max_size=25))
def test_an_arrangement_answers_as_a_dict_of_its_rows_does(steps):
    rows: dict[int, tuple[int, int | None]] = {i: (i % 7, None if i % 5 == 0 else i % 3) for i in range(30)}
    ids = np.array(list(rows), np.int64)
    arr = Arrangement("id", {"id": ids, "a": np.array([rows[i][0] for i in ids]),
                             "b": np.array([rows[i][1] or 0 for i in ids])},
                      {"b": np.array([rows[i][1] is not None for i in ids])})
    next_id = 100
    for what, values in steps:
        if what == "add":  # (new rows, and rows written again: removed first, as a change feed says)
            again = [v for v in values if v in rows]
            arr.remove(np.array(again, np.int64))
            new = {**{v: (v % 4, v % 2 or None) for v in again},
                   **{next_id + k: (v % 7, None if v % 3 == 0 else v % 5) for k, v in enumerate(values)}}
            next_id += len(values)
            rows.update(new)
            keys = np.array(list(new), np.int64)
            arr.add({"id": keys, "a": np.array([new[i][0] for i in keys], np.int64),
                     "b": np.array([new[i][1] or 0 for i in keys], np.int64)},
                    {"b": np.array([new[i][1] is not None for i in keys])})
        elif what == "remove":
            arr.remove(np.array(values, np.int64))
            for v in values:
                rows.pop(v, None)
        elif what == "kill":  # (the rows two finds gave, overlapping, forgotten by their slots)
            a, b = values[: len(values) // 2], values[len(values) // 2:]
            finds = [arr.find({"a": np.array(a, np.int64)}), arr.find({"a": np.array(a + b, np.int64)})]
            gone = [i for i, (x, _) in rows.items() if x in a + b]
            assert arr.kill(finds) == len(gone)
            for i in gone:
                del rows[i]
            assert len(arr) == len(rows)
        else:
            a, b = values[: len(values) // 2], values[len(values) // 2:]
            found = arr.rows(arr.find({"a": np.array(a, np.int64), "b": np.array(b, np.int64)}))
            got = sorted(found["id"].tolist())
            want = sorted(i for i, (x, y) in rows.items() if x in a or (y is not None and y in b))
            assert got == want
            # (each row's values as held; a NULL reads -1)
            assert all(rows[i] == (x, None if y == -1 else y)
                       for i, x, y in zip(found["id"].tolist(), found["a"].tolist(), found["b"].tolist(), strict=True))
        assert len(arr) == len(rows)


# -- plans with and without arrangements -----------------------------------------

ARRANGEMENT_OPS = [op for op in OPS if op != "refresh"] + ["compact_view", "recreate_view", "refresh", "refresh"]


def _plan_facts(view):
    """What a plan decides: counts, the first-table rows computed again, the view rows removed."""
    p = view.plan_refresh()
    held = sorted(p.view_key_addrs[1].tolist()) if p.view_key_addrs is not None else []
    return (p.full, p.rows_to_insert, p.rows_to_update, p.rows_to_delete, dict(p.udf_rows),
            sorted(p.keys.delete.tolist()) if p.keys.delete is not None else None, held), p


@pytest.mark.parametrize("shape", ["chain", "star"])
@pytest.mark.parametrize("how", ["inner", "left"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(ARRANGEMENT_OPS), st.integers(0, 1000)), min_size=2, max_size=10),
       where=st.sampled_from(["clips", "orphans", "coalesce"]))
def test_plans_with_arrangements_equal_plans_reading_the_view(tmp_path_factory, how, shape, ops, where):
    db = mv.connect(str(tmp_path_factory.mktemp("arr")), runner=mv.InlineRunner())
    rng = random.Random(len(ops))
    make_sources(db, rng)
    make, oracle = (chain_view, oracle_chain) if shape == "chain" else (star_view, oracle_star)
    v = make(db, how, where)
    db.refresh(v.name)
    state = {"next": 100}
    probed = 0
    for op, k in ops:
        if op == "compact_view":  # (rows move to new addresses: the view's arrangement is loaded again)
            lance.dataset(v.uri).optimize.compact_files()
        elif op == "recreate_view":  # (the same name and path, another table: never the old arrangement)
            db.drop_table(v.name)
            v = make(db, how, where)
            db.refresh(v.name)
        elif not apply(db, op, k, rng, state):
            continue
        if k % 3 == 0:  # (as a new process does: this one keeps none, the copies on disk are read)
            arrangements.forget(disk=False)
        with_them, plan = _plan_facts(v)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(arrangements, "MAX_BYTES", 0)
            without, _ = _plan_facts(v)
        assert with_them == without
        probed += bool(plan.details.get("arrangements"))
        db.refresh(v.name)
        assert sorted(v.to_arrow().to_pylist(), key=str) == sorted(
            oracle(db, v.source_versions, how, where=where), key=str)
        # the checks of the newest refresh (found apart from the plan: scans, no arrangement) agree
        assert all(c.passed for c in v.check(scope="last_refresh")), v.check(scope="last_refresh")


def _orders_and_customers(db, orders: int, customers: int):
    """``orders`` orders over ``customers`` customers (order i: customer i % customers)."""
    return (db.create_table("orders", pa.table({"oid": list(range(orders)),
                                                "cid": [i % customers for i in range(orders)]})),
            db.create_table("customers", pa.table({"cid": list(range(customers)),
                                                   "name": [str(i) for i in range(customers)]})))


def _orders_view(db, name: str, orders, customers, how: str = "inner"):
    return db.create_materialized_view(name, orders.search(None).join(customers, on="cid", how=how)
                                       .select({"oid": "oid", "name": "name"}))


def _same_as_loaded(v) -> None:
    """The view's arrangement this process keeps holds what loading it again reads."""
    key = next(k for k in arrangements._KEPT if k[0] == v.uri)
    kept = arrangements._KEPT[key].arrangement.state()
    ds = lance.dataset(v.uri)
    assert arrangements._KEPT[key].version == ds.version
    loaded = arrangements._load(ds, key[1].removeprefix("addr:").split(","), True).state()
    order, again = np.argsort(kept["_rowid"]), np.argsort(loaded["_rowid"])
    assert sorted(kept) == sorted(loaded)
    for name in kept:
        assert np.array_equal(np.asarray(kept[name])[order], np.asarray(loaded[name])[again]), name


def test_an_arrangement_is_kept_caught_up_and_loaded_again_when_it_must_be(db):
    orders, customers = _orders_and_customers(db, 200, 10)
    v = _orders_view(db, "o", orders, customers)
    v.refresh()
    customers.update(where="cid = 1", values={"name": "x"})
    first = v.refresh()
    assert first.rows_updated == 20
    # (the refresh brought the view's arrangement to its own commit: the next plan reads nothing of the view)
    assert first.details["arrangements"]["view"]["after"] == "followed the commit (20 rows in, 20 out)"
    customers.update(where="cid = 2", values={"name": "y"})
    plan = v.plan_refresh()
    hows = {k: i["how"] for k, i in plan.details["arrangements"].items()}
    assert hows["view"] == "kept" and hows["orders.cid"] == "kept"
    _same_as_loaded(v)
    v.refresh()
    orders.add(pa.table({"oid": [300, 301], "cid": [4, 99]}))  # (a refresh probing nothing: its rows added after)
    assert v.refresh().details["arrangements"]["view"]["after"] == "followed the commit (1 rows in, 0 out)"
    assert v.plan_refresh().details["arrangements"] == {}  # (nothing moved: nothing probed)
    _same_as_loaded(v)
    lance.dataset(v.uri).create_scalar_index("oid", "BTREE")  # (a commit after the refresh's: caught up from it)
    customers.update(where="cid = 5", values={"name": "q"})
    plan = v.plan_refresh()
    assert plan.details["arrangements"]["view"]["how"].startswith("caught up from version")
    _same_as_loaded(v)
    v.refresh()
    lance.dataset(v.uri).optimize.compact_files()  # (a Rewrite of the view: addresses move)
    customers.update(where="cid = 3", values={"name": "z"})
    plan = v.plan_refresh()
    assert plan.details["arrangements"]["view"]["how"] == "loaded"
    orders.add(pa.table({"oid": [500, 501], "cid": [3, 3]}))
    customers.update(where="cid = 3", values={"name": "w"})
    plan = v.plan_refresh()
    assert plan.details["arrangements"]["orders.cid"]["how"].startswith("caught up")
    assert (plan.rows_to_insert, plan.rows_to_update) == (2, 20)  # (the 2 new orders found by the probe)
    v.refresh()
    assert sorted(r["oid"] for r in v.to_arrow().to_pylist() if r["name"] == "w") == [
        *range(3, 200, 10), 500, 501]
    assert any(h["uri"] == v.uri for h in arrangements.held())
    arrangements.forget(v.uri)
    assert not any(h["uri"] == v.uri for h in arrangements.held())


def test_a_process_keeping_none_reads_the_copy_on_disk_and_catches_it_up(db, tmp_path, monkeypatch):
    """A Dagster run is a process of its own: it reads the arrangements an
    earlier process saved and catches them up, where it would load them; a
    copy of a table created again, or of a version cleaned up, is not used."""
    monkeypatch.setenv("MV_ASSETS_ARRANGEMENT_DIR", str(tmp_path / "arr"))
    orders, customers = _orders_and_customers(db, 300, 10)
    v = _orders_view(db, "o", orders, customers)
    v.refresh()
    customers.update(where="cid = 1", values={"name": "x"})
    r = v.refresh()  # (loaded, and saved)
    assert r.details["arrangements"]["view"]["how"] == "loaded" and "saved_s" in r.details["arrangements"]["view"]
    assert len(list((tmp_path / "arr").rglob("current.json"))) == 2  # (the view's and the orders key's)
    customers.update(where="cid = 2", values={"name": "y"})
    arrangements.forget(disk=False)  # (a new process)
    plan = v.plan_refresh()
    hows = {k: i["how"] for k, i in plan.details["arrangements"].items()}
    assert hows["view"].startswith("read from disk (version ") and "caught up from version" in hows["view"]
    assert hows["orders.cid"] == f"read from disk (version {orders.version}); kept"
    arrangements.forget(disk=False)
    with monkeypatch.context() as mp:
        mp.setattr(arrangements, "MAX_BYTES", 0)
        read_whole = _plan_facts(v)[0]
    assert _plan_facts(v)[0] == read_whole
    v.refresh()
    assert sorted(r["oid"] for r in v.to_arrow().to_pylist() if r["name"] == "y") == list(range(2, 300, 10))
    # the view dropped and created again under the same path: its old copy is not used
    db.drop_table("o")
    assert len(list((tmp_path / "arr").rglob("current.json"))) == 1  # (the orders key's stays)
    v = _orders_view(db, "o", orders, customers)
    v.refresh()
    customers.update(where="cid = 3", values={"name": "z"})
    arrangements.forget(disk=False)
    assert v.plan_refresh().details["arrangements"]["view"]["how"] == "loaded"
    v.refresh()
    assert sorted(r["oid"] for r in v.to_arrow().to_pylist() if r["name"] == "z") == list(range(3, 300, 10))


def test_a_copy_on_disk_from_another_table_or_a_damaged_one_is_not_used(db, tmp_path, monkeypatch):
    monkeypatch.setenv("MV_ASSETS_ARRANGEMENT_DIR", str(tmp_path / "arr"))
    orders, customers = _orders_and_customers(db, 100, 10)
    v = _orders_view(db, "o", orders, customers)
    v.refresh()
    customers.update(where="cid = 1", values={"name": "x"})
    v.refresh()
    for path in (tmp_path / "arr").rglob("*.npy"):
        path.write_bytes(b"not an array")
    customers.update(where="cid = 2", values={"name": "y"})
    arrangements.forget(disk=False)
    hows = {k: i["how"] for k, i in v.plan_refresh().details["arrangements"].items()}
    assert hows == {"view": "loaded", "orders.cid": "loaded"}
    v.refresh()
    monkeypatch.setenv("MV_ASSETS_ARRANGEMENT_DIR", "")  # (none written or read)
    arrangements.forget(disk=False)
    customers.update(where="cid = 3", values={"name": "z"})
    info = v.plan_refresh().details["arrangements"]["view"]
    assert info["how"] == "loaded" and "saved_s" not in info


def test_the_views_arrangement_loads_while_the_first_tables_key_is_probed(db, monkeypatch):
    """A joined table's update probes the first table's key, then the view's
    rows: a process keeping neither loads the view's arrangement in a thread
    meanwhile, and says so; a load ahead that fails is done by the probe; an
    append to the first table probes nothing and loads nothing."""
    import threading

    orders, customers = _orders_and_customers(db, 300, 10)
    v = _orders_view(db, "o", orders, customers)
    v.refresh()
    customers.update(where="cid = 1", values={"name": "x"})
    v.refresh()
    arrangements.forget()  # (a new process, no copy on disk)
    customers.update(where="cid = 2", values={"name": "y"})
    loads = []
    real = arrangements._load
    begun = threading.Event()  # (the load ahead has begun: the key's load waits for it, so the order is fixed)

    def load(ds, columns, addresses):
        loads.append((threading.current_thread().name, columns[0]))
        if threading.current_thread().name == "mv-assets-arrangement-ahead":
            begun.set()
        elif columns == ["cid"]:
            assert begun.wait(60), "the view's arrangement was not loaded ahead"
        return real(ds, columns, addresses)

    monkeypatch.setattr(arrangements, "_load", load)
    plan = v.plan_refresh()
    info = plan.details["arrangements"]
    assert info["view"]["how"] == "loaded" and info["view"]["ahead_s"] > 0 and info["orders.cid"]["how"] == "loaded"
    assert "ahead_s" not in info["orders.cid"]
    assert ("mv-assets-arrangement-ahead", "__source_row_id") in loads
    with_them = _plan_facts(v)[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(arrangements, "MAX_BYTES", 0)
        assert _plan_facts(v)[0] == with_them
    v.refresh()
    assert sorted(r["oid"] for r in v.to_arrow().to_pylist() if r["name"] == "y") == list(range(2, 300, 10))

    def failing(ds, columns, addresses):  # (the load ahead fails: the probe loads it)
        if threading.current_thread().name == "mv-assets-arrangement-ahead":
            raise OSError("a read failed")
        return real(ds, columns, addresses)

    arrangements.forget()
    monkeypatch.setattr(arrangements, "_load", failing)
    customers.update(where="cid = 3", values={"name": "z"})
    info = v.plan_refresh().details["arrangements"]["view"]
    assert info["how"] == "loaded" and "ahead_s" not in info
    v.refresh()
    assert sorted(r["oid"] for r in v.to_arrow().to_pylist() if r["name"] == "z") == list(range(3, 300, 10))

    arrangements.forget()
    loads.clear()
    monkeypatch.setattr(arrangements, "_load", load)
    orders.add(pa.table({"oid": [300], "cid": [4]}))
    assert v.refresh().details.get("arrangements", {}) == {} and loads == []


def test_an_arrangement_whose_version_was_cleaned_up_is_loaded_again(db, monkeypatch):
    from datetime import timedelta

    orders, customers = _orders_and_customers(db, 100, 10)
    v = _orders_view(db, "o", orders, customers)
    v.refresh()
    customers.update(where="cid = 1", values={"name": "x"})
    v.refresh()  # (the view's arrangement loaded at the version this refresh planned on)
    customers.update(where="cid = 2", values={"name": "y"})
    v.refresh()  # (the arrangement brought to the refresh's commit ...)
    orders.add(pa.table({"oid": [100], "cid": [5]}))
    with monkeypatch.context() as m:  # (... which another process's refresh follows, unseen by this one ...)
        m.setattr(arrangements.Follow, "after", lambda self, ds: "not followed: another process")
        v.refresh()
    lance.dataset(v.uri).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)  # (... and is gone)
    customers.update(where="cid = 3", values={"name": "z"})
    plan = v.plan_refresh()
    assert plan.details["arrangements"]["view"]["how"] == "loaded"
    v.refresh()
    assert sorted(r["oid"] for r in v.to_arrow().to_pylist() if r["name"] == "z") == list(range(3, 100, 10))


def test_appended_fragments_are_scanned_and_mixed_ones_read_by_id(db):
    """An append's new fragments hold only new rows: their tasks scan them (as a
    full refresh's do) where rows read by id cost a random read each. A fragment
    also holding rows updated since (Lance's merge_insert writes both) is read by id."""
    @mv.udf
    def tag(name: str, oid: int) -> str:
        return f"{name}:{oid}"

    orders, customers = _orders_and_customers(db, 100, 10)
    query = orders.search(None).join(customers, on="cid").select({"oid": "oid", "name": "name", "t": tag})
    v = db.create_materialized_view("o", query)
    v.refresh()
    orders.add(pa.table({"oid": list(range(100, 120)), "cid": [i % 12 for i in range(20)]}))  # (cid 10, 11: no match)
    plan = v.plan_refresh()
    assert plan.details["work"]["first_rows_scanned"] == 20
    assert [t.kind_args.get("fragments") is not None for t in plan.tasks] == [True]
    r = v.refresh()
    assert (r.rows_inserted, r.udf_rows_computed["t"]) == (18, 18)  # (the UDF: the matching new rows only)
    lance.dataset(orders.uri).merge_insert("oid").when_matched_update_all().when_not_matched_insert_all().execute(
        pa.table({"oid": [5, 6, 200], "cid": [1, 1, 2]}))
    plan = v.plan_refresh()
    assert plan.details["work"].get("first_rows_scanned", 0) == 0  # (updated and new rows in one fragment: by id)
    v.refresh()
    fresh = db.create_materialized_view("fresh", query)
    fresh.refresh()
    assert sorted(map(str, v.to_arrow().to_pylist())) == sorted(map(str, fresh.to_arrow().to_pylist()))


def test_plans_in_threads_share_arrangements_and_agree(db):
    """Threads planning join views at once (a service refreshing several):
    each table's arrangement is loaded once and every plan equals the plan
    made alone."""
    from concurrent.futures import ThreadPoolExecutor

    orders, customers = _orders_and_customers(db, 3000, 30)
    views = [_orders_view(db, f"o{k}", orders, customers, how) for k, how in enumerate(["inner", "left", "inner"])]
    for v in views:
        v.refresh()
    customers.update(where="cid % 7 = 1", values={"name": "x"})
    customers.delete("cid = 9")
    alone = [_plan_facts(v)[0] for v in views]
    for v in views:
        arrangements.forget(v.uri)
    arrangements.forget(orders.uri)
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda v: _plan_facts(v)[0], views * 2))
    assert together == alone * 2
    assert sum(h["uri"] == orders.uri for h in arrangements.held()) == 1  # (the key arrangement: one, shared)


def test_the_first_tables_key_arrangement_follows_a_compaction(db):
    """A compaction moves the first table's rows (stable ids kept): its key
    arrangement is caught up across it, and a joined row's change still finds
    every row, in the compacted fragments too."""
    orders = db.create_table("orders", pa.table({"oid": list(range(40)), "cid": [i % 4 for i in range(40)]}))
    for k in range(4):  # (small fragments, some rows deleted: a compaction has work)
        orders.add(pa.table({"oid": list(range(100 + 10 * k, 110 + 10 * k)), "cid": [k] * 10}))
    orders.delete("oid % 7 = 0")
    customers = db.create_table("customers", pa.table({"cid": list(range(4)), "name": list("abcd")}))
    v = db.create_materialized_view("o", orders.search(None).join(customers, on="cid")
                                    .select({"oid": "oid", "name": "name"}))
    v.refresh()
    customers.update(where="cid = 0", values={"name": "x"})
    v.refresh()  # (the key arrangement loaded)
    lance.dataset(orders.uri).optimize.compact_files()
    customers.update(where="cid = 2", values={"name": "y"})
    plan = v.plan_refresh()
    assert plan.details["arrangements"]["orders.cid"]["how"].startswith("caught up")
    with_them = _plan_facts(v)[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(arrangements, "MAX_BYTES", 0)
        assert _plan_facts(v)[0] == with_them
    v.refresh()
    want = sorted(r["oid"] for r in orders.to_arrow().to_pylist() if r["cid"] == 2)
    assert sorted(r["oid"] for r in v.to_arrow().to_pylist() if r["name"] == "y") == want and len(want) > 10


def test_an_arrangement_that_would_not_match_the_commit_is_dropped(db, monkeypatch):
    """Following a commit checks the rows it would hold against the view's
    count (the manifest's): a commit that did other than the plan said drops
    the arrangement (loaded again when needed), never kept wrong."""
    orders, customers = _orders_and_customers(db, 100, 10)
    v = _orders_view(db, "o", orders, customers)
    v.refresh()
    customers.update(where="cid = 1", values={"name": "x"})
    v.refresh()  # (loaded, and followed)
    customers.update(where="cid = 2", values={"name": "y"})
    monkeypatch.setattr(Arrangement, "kill", lambda self, finds: 0)  # (as if the removed rows were others)
    r = v.refresh()
    assert r.details["arrangements"]["view"]["after"].startswith("dropped: it would hold 110 rows, the view holds 100")
    assert not any(h["uri"] == v.uri for h in arrangements.held())
    monkeypatch.undo()
    customers.update(where="cid = 3", values={"name": "z"})
    plan = v.plan_refresh()
    assert plan.details["arrangements"]["view"]["how"].startswith(("loaded", "read from disk"))
    v.refresh()
    assert sorted(r["oid"] for r in v.to_arrow().to_pylist() if r["name"] == "z") == list(range(3, 100, 10))


def test_a_probe_of_millions_of_values_in_parts_on_threads_answers_as_one_pass_does(monkeypatch):
    from mv_assets.model import arrangement

    rng = np.random.default_rng(7)
    values = rng.integers(-5, 3_000_000, 3_000_001, dtype=np.int64)  # (an odd length: the parts differ)
    ids = np.unique(rng.integers(0, 3_000_000, 20_000, dtype=np.int64))
    monkeypatch.setattr(arrangement, "_CPUS", 3)
    threaded = arrangement._Probe(ids).mask(values)
    monkeypatch.setattr(arrangement, "_CPUS", 1)
    assert np.array_equal(threaded, arrangement._Probe(ids).mask(values))
    assert np.array_equal(threaded, np.isin(values, ids))


@pytest.mark.parametrize("ids", [[-2**63], [-2**63, -2**63 + 5], [2**63 - 1], [-3, 0, 4]])
def test_a_probe_at_the_ends_of_int64_answers_as_isin(ids):
    """Ids at the smallest int64: the probe's offset (the smallest id minus
    one) did not fit an int64, and an incremental join refresh probing a
    changed key -2**63 raised OverflowError. Values at both ends and between."""
    from mv_assets.model import arrangement

    ids = np.array(ids, dtype=np.int64)
    ends = [-2**63, -2**63 + 1, -2**63 + 5, -2**63 + 6, -4, -3, 0, 4, 5, 2**62, 2**63 - 2, 2**63 - 1]
    values = np.array(ends, dtype=np.int64)
    assert np.array_equal(arrangement._Probe(ids).mask(values), np.isin(values, ids))


def test_an_incremental_join_refresh_over_the_whole_int64_range_of_keys(db):
    """The join view of the adversarial pass: first-table keys -2**63, 2**63-1
    and 0, a dimension row of key -2**63 added: its refresh raised."""
    f = db.create_table("f", pa.table({"id": pa.array([0, 1, 2], pa.int64()),
                                       "key": pa.array([-2**63, 2**63 - 1, 0], pa.int64())}))
    d = db.create_table("d", pa.table({"key": pa.array([0], pa.int64()), "dv": pa.array([10], pa.int64())}))
    v = db.create_materialized_view("v", f.search(None).join(d, on="key", how="left").select(
        {"id": "f.id", "dv": "d.dv"}))
    v.refresh()
    d.add(pa.table({"key": pa.array([-2**63], pa.int64()), "dv": pa.array([20], pa.int64())}))
    assert not v.refresh().full
    assert sorted((r["id"], r["dv"]) for r in v.to_arrow().to_pylist()) == [(0, 20), (1, None), (2, 10)]


@pytest.mark.parametrize("rows_counted", [None, 2])
def test_an_arrangement_filled_batch_by_batch_equals_one_read_whole(tmp_path, rows_counted):
    """The arrays filled as a scan yields batches (NULLs first met in a later
    batch, a narrow integer key, uint64 ids and addresses) equal the columns of
    one read converted whole; rows beyond the count grow the arrays."""
    t = pa.table({"k": pa.array([1, 2, None, 4, None, 6, 7], pa.int32()), "j": pa.array(range(7), pa.int64())})
    lance.write_dataset(t, str(tmp_path / "x.lance"), enable_stable_row_ids=True)
    ds = lance.dataset(str(tmp_path / "x.lance"))
    ds.delete("j = 3")
    ds = lance.dataset(str(tmp_path / "x.lance"))
    whole = ds.to_table(columns=["k", "j"], with_row_id=True, with_row_address=True)
    filling = arrangements._Filling(rows_counted or ds.count_rows(), ["k", "j"], True)
    for batch in ds.to_batches(columns=["k", "j"], with_row_id=True, with_row_address=True, batch_size=2):
        filling.add(batch)
    values, valid = filling.done()
    assert values["_rowid"].tolist() == whole.column("_rowid").to_pylist()
    assert values["_rowaddr"].tolist() == whole.column("_rowaddr").to_pylist()
    assert values["k"].tolist() == [0 if v is None else v for v in whole.column("k").to_pylist()]
    assert valid["k"].tolist() == [v is not None for v in whole.column("k").to_pylist()]
    assert "j" not in valid and values["j"].tolist() == whole.column("j").to_pylist()
    loaded = arrangements._load(ds, ["k"], True)
    assert sorted(loaded.rows(loaded.find({"k": np.array([0, 2, 4, 6])}))["_rowid"].tolist()) == \
        sorted(i for i, k in zip(whole.column("_rowid").to_pylist(), whole.column("k").to_pylist(), strict=True)
               if k in (2, 4, 6))


def test_the_arrangements_of_a_catalog_are_listed_with_the_views_sharing_them(tmp_path, monkeypatch):
    """``db.arrangements()`` and ``mv-assets arrangements`` (seed 004's
    analyzing arrangements): one entry an arrangement, the first table's key
    shared by the two views joining it by that column, a text key hashed, an
    inner join's dimension key (a LEFT join probes none), each view's
    provenance; rows counted apart with pylance; what this process holds, the
    copy on disk and what each view's last refresh did."""
    import json

    from click.testing import CliRunner

    from mv_assets.cli import main

    monkeypatch.setenv("MV_ASSETS_ARRANGEMENT_DIR", str(tmp_path / "copies"))
    arrangements.forget(disk=False)
    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    f = db.create_table("facts", pa.table({"id": list(range(100)), "dim_id": [i % 7 for i in range(100)],
                                           "code": [f"c{i % 7}" for i in range(100)]}))
    dims = db.create_table("dims", pa.table({"id": list(range(6)), "code": [f"c{i}" for i in range(6)],
                                             "name": [f"n{i}" for i in range(6)]}))
    views = [db.create_materialized_view("v1", f.search(None).join(dims, left_on="dim_id", right_on="id")
                                         .select({"fid": "facts.id", "name": "name"})),
             db.create_materialized_view("v2", f.search(None).join(dims, left_on="dim_id", right_on="id", how="left")
                                         .select({"fid": "facts.id", "name": "name"})),
             db.create_materialized_view("v3", f.search(None).join(dims, on="code")
                                         .select({"fid": "facts.id", "name": "name"}))]
    # a join aggregate: the join kept under it, named by the view users created
    agg = db.create_materialized_view("v4", f.search(None).join(dims, left_on="dim_id", right_on="id")
                                      .group_by("dims.name").agg({"n": "count(*)"}))
    for v in [*views, agg]:
        v.refresh()
    dims.update(where="id = 2", values={"name": "zz"})
    for v in [*views, agg]:
        v.refresh()
    listed = {a["name"]: a for a in db.arrangements()}
    assert sorted(listed) == ["dims.code", "dims.id", "facts.code", "facts.dim_id", "v1 (provenance)",
                              "v2 (provenance)", "v3 (provenance)", "v4 (its join's provenance)"]
    assert listed["v4 (its join's provenance)"]["views"] == ["v4"]
    assert listed["v4 (its join's provenance)"]["last_refresh"]["v4"]["how"].startswith("loaded")
    key = listed["facts.dim_id"]
    assert key["views"] == ["v1", "v2", "v4"] and key["table"] == "facts" and not key["hashed"]
    assert key["rows"] == lance.dataset(f.uri).count_rows() == 100 and key["held"]["rows"] == 100
    assert key["last_refresh"]["v1"]["how"].startswith("loaded") and key["last_refresh"]["v2"]["how"] == "kept" \
        and key["last_refresh"]["v4"]["how"] == "kept"
    assert key["on_disk"]["bytes"] > 0 and key["on_disk"]["version"] == key["held"]["version"]
    assert listed["facts.code"]["hashed"] and listed["facts.code"]["views"] == ["v3"]
    assert listed["dims.id"]["views"] == ["v1", "v4"]  # (v2 is a LEFT join: its lost matches are padded, no probe)
    for v in views:
        prov = listed[f"{v.name} (provenance)"]
        assert prov["views"] == [v.name] and prov["rows"] == lance.dataset(v.uri).count_rows()
        assert prov["held"]["rows"] == prov["rows"] and prov["last_refresh"][v.name]["seconds"] >= 0
    out = CliRunner().invoke(main, ["--db", db.uri, "arrangements"], env={"COLUMNS": "200"}, catch_exceptions=False)
    assert out.exit_code == 0 and "facts.dim_id" in out.output and "v1, v2" in out.output
    assert "facts.code (hashed)" in out.output
    as_json = CliRunner().invoke(main, ["--db", db.uri, "arrangements", "--json"], catch_exceptions=False)
    assert sorted(a["name"] for a in json.loads(as_json.output)) == sorted(listed)


def test_an_append_only_join_refresh_records_the_arrangement_it_kept(db):
    """A join refresh of rows only appended to the first table keeps the
    view's arrangement and brings it along after its commit: its commit says
    so (`db.arrangements()` / `mv-assets arrangements` showed no last refresh
    for any arrangement after it)."""
    f = db.create_table("f", pa.table({"id": pa.array(range(50), pa.int64()),
                                       "k": pa.array([i % 5 for i in range(50)], pa.int64())}))
    d = db.create_table("d", pa.table({"k": pa.array(range(5), pa.int64()), "name": pa.array(list("abcde"))}))
    j = db.create_materialized_view("j", f.search(None).join(d, on="k"))
    j.refresh()
    d.update("k = 2", values={"name": "zz"})
    j.refresh()
    f.add([{"id": 100, "k": 1}])
    assert j.refresh().details["arrangements"]["view"]["how"] == "kept"
    listed = {a["name"]: a for a in db.arrangements()}
    assert listed["j (provenance)"]["last_refresh"] == {"j": {"how": "kept"}}
