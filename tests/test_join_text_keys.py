"""Join views over text keys (customer codes, UUIDs as strings): the first
table's key is arranged as a 64-bit hash of each value's bytes, so a change
of a joined table is probed in memory, as an integer key is, where a filtered
scan read the first table's key column at each refresh. Two codes may share
a hash; a probe then finds a superset of the rows, computed again the same,
so the view stays exact (checked here with a hash made to collide).
Expectations come from plain pyarrow over the sources (its own hash join)."""

import random

import lance
import numpy as np
import pyarrow as pa
import pytest
import test_join_unmatched as unmatched
from test_join_unmatched import _rows

import mv_assets as mv
from mv_assets.model import arrangement as model_arrangement
from mv_assets.model.arrangement import key_codes
from mv_assets.ops import arrangements


def _code(i: int) -> str:
    return f"cust-{i:04d}-é"  # (non-ASCII bytes too)


def _sources(db, customers: int = 8, orders: int = 120):
    o = db.create_table("orders", pa.table({"oid": list(range(orders)),
                                            "code": [_code(i % (customers + 2)) for i in range(orders)]}))
    c = db.create_table("customers", pa.table({"code": [_code(i) for i in range(customers)],
                                               "name": [f"n{i}" for i in range(customers)]}))
    return o, c


def _view(db, how: str):
    return unmatched._view(db, how, key="code")


def _oracle(db, how: str) -> list[tuple]:
    return unmatched._oracle(db, how, key="code")


def _reference(data: bytes) -> int:
    """The hash of HASH_VERSION 1, one byte at a time in Python integers."""
    m = (1 << 64) - 1
    h = sum((b + 1) * pow(0x100000001B3, j, 1 << 64) for j, b in enumerate(data)) & m
    z = h ^ ((len(data) * 0x9E3779B97F4A7C15) & m)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    z ^= z >> 31
    return z - (1 << 64) if z >= 1 << 63 else z


def test_key_codes_are_the_bytes_hash_whatever_the_arrays_layout():
    values = ["", "a", "b", "ab", "ba", "cust-0001-é", "\x00", "\x00\x00", None, "x" * 5000]
    codes = key_codes(pa.array(values))
    # the same bytes, the same code: large strings, binary, slices, chunks, one value at a time
    assert np.array_equal(codes, key_codes(pa.array(values, pa.large_string())))
    assert np.array_equal(codes, key_codes(pa.array([None if v is None else v.encode() for v in values], pa.binary())))
    assert np.array_equal(codes[3:], key_codes(pa.array(values).slice(3)))
    assert np.array_equal(codes, key_codes(pa.chunked_array([pa.array(values[:4]), pa.array(values[4:])])))
    assert [int(key_codes(pa.array([v]))[0]) for v in values if v is not None] == \
        [int(c) for c, v in zip(codes, values, strict=True) if v is not None]
    present = [c for c, v in zip(codes, values, strict=True) if v is not None]
    assert len(set(present)) == len(present)  # (order, length and NUL bytes all count)
    many = key_codes(pa.array([_code(i) for i in range(200_000)]))
    assert len(np.unique(many)) == 200_000
    # the codes are what the definition says, byte by byte (they are part of what copies on disk hold: a
    # change of the hash must change HASH_VERSION, and this reference with it)
    assert [int(c) for c in present] == [_reference(v.encode()) for v in values if v is not None]
    assert model_arrangement.HASH_VERSION == 1
    assert key_codes(pa.array([3, None, -2], pa.int32())).tolist()[::2] == [3, -2]


@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_text_key_is_probed_in_its_arrangement_and_the_view_stays_exact(tmp_path, how):
    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    _sources(db)
    v = _view(db, how)
    rng = random.Random(7)
    customers, orders = db.open_table("customers"), db.open_table("orders")
    next_oid, probed = 1000, 0
    steps = ["rename", "delete_customer", "add_orders", "move_key", "add_customer", "foreign_rename",
             "delete_orders"] * 2
    rng.shuffle(steps)
    for step in steps:
        k = rng.randrange(10)
        if step == "rename":
            customers.update(where=f"code = '{_code(k)}'", values={"name": f"r{k}-{next_oid}"})
        elif step == "delete_customer":
            customers.delete(f"code = '{_code(k)}'")
        elif step == "add_orders":
            orders.add(pa.table({"oid": list(range(next_oid, next_oid + 5)), "code": [_code(k)] * 5}))
        elif step == "move_key":
            customers.update(where=f"code = '{_code(k)}'", values={"code": _code(k + 20)})
        elif step == "add_customer":
            customers.add(pa.table({"code": [_code(k + 8)], "name": [f"new{k}"]}))
        elif step == "foreign_rename":  # (plain pylance)
            lance.dataset(customers.uri).update({"name": f"'f{next_oid}'"}, where=f"code = '{_code(k)}'")
        else:
            orders.delete(f"oid % 10 = {k}")
        next_oid += 10
        if step == "add_orders" and k % 2 == 0:
            arrangements.forget(disk=False)  # (a process keeping none: loaded again)
        plan = v.plan_refresh()
        with pytest.MonkeyPatch.context() as mp:  # (the same plan reading the first table instead)
            mp.setattr(arrangements, "MAX_BYTES", 0)
            without = v.plan_refresh()
        assert (plan.rows_to_insert, plan.rows_to_update, plan.rows_to_delete, dict(plan.udf_rows)) == \
            (without.rows_to_insert, without.rows_to_update, without.rows_to_delete, dict(without.udf_rows))
        used = plan.details.get("arrangements", {}).get("orders.code")
        if used is not None:
            probed += 1
            assert used["how"].split(" ")[0] in ("kept", "loaded", "caught", "read"), used
            assert not plan.details["work"].get("key_rows_scanned"), plan.details["work"]
        v.refresh()
        assert _rows(v) == _oracle(db, how), step
    assert probed >= 4  # (the changes of customers were probed in the arrangement, not by scans)


def test_codes_that_collide_find_more_rows_and_compute_them_the_same(tmp_path, monkeypatch):
    """Every text key made to share one hash: a probe finds every order,
    which is computed again the same (its UDF value copied, not called)."""
    monkeypatch.setattr(model_arrangement, "_hashed", lambda values: np.zeros(len(values), np.int64))
    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    _sources(db)
    v = _view(db, "inner")
    db.open_table("customers").update(where=f"code = '{_code(3)}'", values={"name": "renamed"})
    plan = v.plan_refresh()
    assert plan.details["arrangements"]["orders.code"]["how"].startswith(("kept", "loaded"))
    assert plan.details["work"]["probe_matches"] == 120  # (every order: all codes collide)
    r = v.refresh()
    assert _rows(v) == _oracle(db, "inner")
    assert r.udf_rows_computed == {"loud": 12}  # (only the renamed customer's orders called again)


def test_a_deleted_customer_with_a_text_key_only_removes_its_view_rows(tmp_path):
    """The joined table's text key probed in its own arrangement: no customer
    holds the deleted code now, so its orders' view rows only go (no task)."""
    db = mv.connect(str(tmp_path / "db"), runner=mv.InlineRunner())
    _sources(db)
    v = _view(db, "inner")
    db.open_table("customers").delete(f"code = '{_code(3)}'")
    plan = v.plan_refresh()
    assert plan.details["work"]["first_rows_only_removed"] == 12 and not plan.tasks
    assert plan.details["arrangements"]["customers.code"]["how"].startswith("loaded")
    r = v.refresh()
    assert _rows(v) == _oracle(db, "inner") and not any(r.udf_rows_computed.values())
    # a code still held by another customer (added again): its orders are computed, not dropped
    db.open_table("customers").add(pa.table({"code": [_code(3)], "name": ["back"]}))
    db.open_table("customers").delete(f"code = '{_code(4)}' OR name = 'back'")
    db.open_table("customers").add(pa.table({"code": [_code(4)], "name": ["again"]}))
    plan = v.plan_refresh()
    assert plan.details["work"]["first_rows_only_removed"] == 0
    v.refresh()
    assert _rows(v) == _oracle(db, "inner")
