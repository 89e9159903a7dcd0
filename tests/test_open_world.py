"""The open world: tables and views whose directories other tools write too
(plain pylance, lancedb, Spark). Every write made behind mv_assets' back is
noticed: computed values follow their input rows, recreated sources and
foreign writes into a view are caught, and what cannot be done is refused in
mv_assets' own words before anything is written."""

import lance
import pyarrow as pa
import pytest

import mv_assets as mv


@mv.udf
def double(x: int) -> int:
    return 2 * x


def _table(db, n: int = 6):
    t = db.create_table("t", pa.table({"id": list(range(n)), "x": list(range(n)), "z": [0] * n}), primary_key="id")
    t.add_columns({"y": double, "s": "x + 1"})
    t.backfill("y")
    return t


def _status(t) -> dict[str, tuple[int, int]]:
    return {c["column"]: (c["current"], c["stale"]) for c in t.column_status()}


def _oracle(t) -> dict[int, tuple[int, int]]:
    """(y, s) expected from the table's own x, in plain Python."""
    return {r["id"]: (2 * r["x"], r["x"] + 1) for r in lance.dataset(t.uri).to_table(columns=["id", "x"]).to_pylist()}


def _values(t) -> dict[int, tuple[int, int]]:
    return {r["id"]: (r["y"], r["s"]) for r in t.to_arrow().select(["id", "y", "s"]).to_pylist()}


@pytest.mark.parametrize("writer", ["update", "merge_insert"])
def test_computed_columns_go_stale_when_another_tool_rewrites_their_input(db, writer):
    t = _table(db)
    assert _status(t) == {"y": (6, 0), "s": (6, 0)}
    ds = lance.dataset(t.uri)
    if writer == "update":
        ds.update({"x": "x + 100"}, where="id IN (1, 2)")
    else:  # a pylance merge_insert of the input column only (one new row too)
        (ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
         .execute(pa.table({"id": [1, 2, 9], "x": [101, 102, 9], "z": [0, 0, 0]})))
    new_rows = 1 if writer == "merge_insert" else 0
    # the rewritten rows (and a new one) are stale for both columns: status says so, backfill computes them
    assert _status(t) == {"y": (4, 2 + new_rows), "s": (4, 2 + new_rows)}
    assert t.plan_backfill("y").rows == 2 + new_rows
    result = t.backfill("y")
    assert result.udf_rows_computed == 2 + new_rows
    t.backfill("s")
    assert _status(t) == {"y": (6 + new_rows, 0), "s": (6 + new_rows, 0)}
    assert _values(t) == _oracle(t)
    assert t.backfill("y").udf_rows_computed == 0  # and nothing is computed twice


def test_an_update_through_mv_assets_keeps_columns_that_do_not_read_it_current(db):
    t = _table(db)
    t.update("id = 1", {"z": 5})  # neither y nor s reads z
    assert _status(t) == {"y": (6, 0), "s": (6, 0)}
    assert t.backfill("y").udf_rows_computed == 0
    t.update("id = 2", {"x": 50})  # both read x: s is filled at once, y waits for its backfill
    assert _status(t) == {"y": (5, 1), "s": (6, 0)}
    assert t.backfill("y").udf_rows_computed == 1
    assert _values(t) == _oracle(t)
