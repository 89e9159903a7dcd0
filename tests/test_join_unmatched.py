"""A row of an inner-joined table deleted (or moved to another key) with no
other row holding its key: the first-table rows that matched it join
nothing now, so their view rows only go. The refresh removes them without a
task reading those rows (the bulk of the cost of a dimension delete), and
still names the first table's fragments they are in (the Dagster partitions
whose rows changed). Expectations come from plain pyarrow over the sources
and from pylance's row addresses, never from mv_assets' join code."""

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import mv_assets as mv


@mv.udf
def shout(name: str) -> str:
    return name.upper()


@pytest.fixture
def db(tmp_path):
    db = mv.connect(str(tmp_path / "db"))
    orders = db.create_table("orders", pa.table({"oid": list(range(0, 40)), "cid": [i % 4 for i in range(0, 40)]}))
    for start in (40, 80):  # (three fragments, each holding orders of every customer)
        orders.add(pa.table({"oid": list(range(start, start + 40)), "cid": [i % 4 for i in range(start, start + 40)]}))
    db.create_table("customers", pa.table({"cid": [0, 1, 2, 3], "name": ["a", "b", "c", "d"]}))
    return db


def _view(db, how: str = "inner", key: str = "cid"):
    """orders joined to customers on ``key``: oid, the name, the UDF over it (refreshed once)."""
    o, c = db.open_table("orders"), db.open_table("customers")
    v = db.create_materialized_view(f"v_{how}", o.search(None).join(c, on=key, how=how)
                                    .select({"oid": "oid", "name": "name", "loud": (shout, ["name"])}))
    v.refresh()
    return v


def _oracle(db, how: str, key: str = "cid") -> list[tuple]:
    """The view's rows as plain pyarrow joins the two tables."""
    orders = lance.dataset(db.open_table("orders").uri).to_table()
    customers = lance.dataset(db.open_table("customers").uri).to_table()
    joined = orders.join(customers, keys=key, join_type="inner" if how == "inner" else "left outer")
    return sorted((r["oid"], r["name"], None if r["name"] is None else r["name"].upper()) for r in joined.to_pylist())


def _rows(v) -> list[tuple]:
    return sorted((r["oid"], r["name"], r["loud"]) for r in v.to_arrow().to_pylist())


def _fragments_of(db, where: str) -> list[int]:
    ds = lance.dataset(db.open_table("orders").uri)
    addresses = ds.to_table(columns=[], filter=where, with_row_address=True).column("_rowaddr").to_numpy()
    return sorted({int(a) >> 32 for a in addresses})


def test_a_deleted_dimension_row_only_removes_its_view_rows(db):
    v = _view(db)
    db.open_table("customers").delete("cid = 3")
    plan = v.plan_refresh()
    assert plan.details["work"]["first_rows_only_removed"] == 30 and not plan.tasks  # (was: one task, 30 rows)
    assert (plan.rows_to_insert, plan.rows_to_update, plan.rows_to_delete) == (0, 0, 30)
    r = v.refresh()
    assert _rows(v) == _oracle(db, "inner") and len(_rows(v)) == 90 and not any(r.udf_rows_computed.values())
    assert r.first_fragments == _fragments_of(db, "cid = 3") == [0, 1, 2]


def test_a_dimension_key_moved_by_another_writer_only_removes(db):
    v = _view(db)
    lance.dataset(db.open_table("customers").uri).update({"cid": "7"}, where="cid = 2")  # (plain pylance)
    plan = v.plan_refresh()
    assert plan.details["work"]["first_rows_only_removed"] == 30 and not plan.tasks
    r = v.refresh()
    assert _rows(v) == _oracle(db, "inner") and not any(r.udf_rows_computed.values())


def test_a_key_another_row_still_holds_is_computed_again(db):
    customers = db.open_table("customers")
    customers.add(pa.table({"cid": [3], "name": ["e"]}))  # (two customers hold key 3)
    v = _view(db)
    customers.delete("name = 'd'")
    plan = v.plan_refresh()
    assert plan.details["work"]["first_rows_only_removed"] == 0 and plan.tasks
    r = v.refresh()
    assert _rows(v) == _oracle(db, "inner") and not any(r.udf_rows_computed.values())  # (the value kept: 'e' was there)
    assert [r for r in _rows(v) if r[0] == 3] == [(3, "e", "E")]


def test_a_first_table_row_moved_at_the_same_time_is_computed(db):
    v = _view(db)
    db.open_table("orders").update(where="oid = 3", values={"cid": 1})
    db.open_table("customers").delete("cid = 3")
    plan = v.plan_refresh()
    assert plan.details["work"]["first_rows_only_removed"] == 29
    v.refresh()
    assert _rows(v) == _oracle(db, "inner") and (3, "b", "B") in _rows(v)


def test_under_a_left_join_the_rows_are_padded_not_removed(db):
    v = _view(db, "left")
    db.open_table("customers").delete("cid = 3")
    plan = v.plan_refresh()
    assert plan.details["work"]["first_rows_only_removed"] == 0
    v.refresh()
    assert _rows(v) == _oracle(db, "left") and len(_rows(v)) == 120
    assert sum(1 for r in _rows(v) if r[1] is None) == 30


def test_the_refreshes_after_agree_with_the_oracle(db):
    """Deletes, re-adds and moves, one after another: each refresh equal to plain pyarrow."""
    v = _view(db)
    customers = db.open_table("customers")
    rng = np.random.default_rng(3)
    for step in range(8):
        cid = int(rng.integers(0, 6))
        if step % 3 == 0:
            customers.delete(f"cid = {cid}")
        elif step % 3 == 1:
            customers.add(pa.table({"cid": [cid], "name": [f"n{step}"]}))
        else:
            lance.dataset(customers.uri).update({"cid": str(int(rng.integers(0, 6)))}, where=f"cid = {cid}")
        v.refresh()
        assert _rows(v) == _oracle(db, "inner"), step
    assert pc.count(v.to_arrow().column("oid")).as_py() == len(_oracle(db, "inner"))
