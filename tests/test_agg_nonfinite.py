"""NaN and infinities in aggregate views, against plain Python with SQL's rules
(tests/oracle.py: PostgreSQL's and DuckDB's): a sum is NaN when a NaN or both
infinities are in the group, else the infinity there, else the finite sum; avg
is that sum over count(x); min / max order NaN above every number; count(distinct)
counts every NaN as one value; approx_quantile sketches finite values only.

A running sum cannot take a non-finite value back out, so each group keeps its
counts of NaN, +inf and -inf beside the sum of its finite values: deleting or
updating the row that brought one in makes the sum finite again, incrementally.
"""

import math

import lance
import pyarrow as pa
import pytest
from oracle import same_number, sql_count_distinct, sql_max, sql_min, sql_sum

NAN, INF = float("nan"), float("inf")
SCHEMA = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("x", pa.float64()), ("i", pa.int64())])
AGGS = {"n": "count(*)", "nx": "count(x)", "sx": "sum(x)", "ax": "avg(x)", "lo": "min(x)", "hi": "max(x)",
        "dx": "count(distinct x)", "q": "approx_quantile(x, 0.5)", "si": "sum(i)"}


def table(rows: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([{"id": r[0], "g": r[1], "x": r[2], "i": r[0]} for r in rows], schema=SCHEMA)


def oracle(uri: str, version: int) -> dict:
    groups: dict = {}
    for r in lance.dataset(uri, version=version).to_table().to_pylist():
        groups.setdefault(r["g"], []).append(r)
    out = {}
    for g, rs in groups.items():
        xs = [r["x"] for r in rs if r["x"] is not None]
        finite = sorted(x for x in xs if math.isfinite(x))
        out[g] = {
            "n": len(rs), "nx": len(xs), "sx": sql_sum(xs) if xs else None,
            "ax": sql_sum(xs) / len(xs) if xs else None,
            "lo": sql_min(xs) if xs else None, "hi": sql_max(xs) if xs else None,
            "dx": sql_count_distinct(xs), "si": sum(r["i"] for r in rs),
            "q": ("~", finite[math.floor(0.5 * (len(finite) - 1))]) if finite else None,
        }
    return out


def check_view(view, uri: str) -> None:
    got = {r["g"]: r for r in view.to_arrow().to_pylist()}
    want = oracle(uri, view.source_version)
    assert set(got) == set(want)
    for g, w in want.items():
        for name, a in w.items():
            if name not in got[g]:  # (a view of some of the aggregates)
                continue
            b = got[g][name]
            if isinstance(a, tuple):  # approx_quantile: within its 1% relative accuracy
                assert b is not None and abs(b - a[1]) <= 0.01 * abs(a[1]) + 1e-12, (g, name, a[1], b)
            else:
                assert same_number(a, b), (g, name, a, b)


def checks(view) -> dict:
    return {c.name: c.passed for c in view.check()}


ROWS = [
    (0, 0, 1.5), (1, 0, 2.25), (2, 0, None),  # finite
    (3, 1, 1.0), (4, 1, INF), (5, 1, 2.0),  # +inf
    (6, 2, -INF), (7, 2, 3.0),  # -inf
    (8, 3, NAN), (9, 3, 1.0), (10, 3, NAN),  # NaN (twice: one distinct value)
    (11, 4, INF), (12, 4, -INF), (13, 4, 5.0),  # both infinities: NaN
    (14, 5, None),  # only NULL
    (15, 6, INF), (16, 6, INF),  # only +inf
    (17, 7, 0.0), (18, 7, -0.0),  # one distinct value
]


@pytest.mark.parametrize("how", ["full", "incremental"])
def test_sums_averages_and_extremes_of_groups_holding_nan_and_infinities(db, how):
    """Each group of ROWS, brought in by the first (full) refresh or by an
    incremental one onto a view holding other rows."""
    if how == "full":
        src = db.create_table("src", table(ROWS), primary_key="id")
    else:
        src = db.create_table("src", table([(100, 0, 4.0), (101, 1, -1.0), (102, 9, 1.0)]), primary_key="id")
    v = db.create_materialized_view("agg", src.search(None).group_by("g").agg(AGGS))
    r = v.refresh()
    if how == "incremental":
        src.add(table(ROWS))
        r = v.refresh()
    assert r.full == (how == "full")
    check_view(v, src.uri)
    got = {r["g"]: r for r in v.to_arrow().to_pylist()}
    assert got[1]["sx"] == INF and got[2]["sx"] == -INF and math.isnan(got[3]["sx"]) and math.isnan(got[4]["sx"])
    assert got[1]["ax"] == INF and got[6]["sx"] == INF and got[6]["ax"] == INF
    assert math.isnan(got[3]["hi"]) and got[3]["lo"] == 1.0 and got[3]["dx"] == 2
    assert got[4]["lo"] == -INF and got[1]["hi"] == INF and got[7]["dx"] == 1
    assert checks(v) == {"no_orphan_rows": True, "values_match_source": True}


def test_deleting_or_updating_away_non_finite_values_makes_sums_finite_again(db):
    src = db.create_table("src", table([(0, 0, 1.5), (1, 0, 2.0), (2, 1, 1.0), (3, 1, 4.0), (4, 2, 0.5)]),
                          primary_key="id")
    v = db.create_materialized_view("agg", src.search(None).group_by("g").agg(AGGS))
    v.refresh()

    def sums():
        return {r["g"]: (r["sx"], r["ax"], r["hi"]) for r in v.to_arrow().to_pylist()}

    src.add(table([(10, 0, INF), (11, 1, NAN), (12, 2, INF), (13, 2, -INF)]))
    assert not v.refresh().full
    check_view(v, src.uri)
    got = sums()
    assert got[0][:2] == (INF, INF) and all(math.isnan(x) for x in (*got[1], got[2][0], got[2][1]))
    src.delete("id = 10")  # the inf goes: finite again
    src.update("id = 11", values_sql={"x": "2.5"})  # the NaN becomes a number
    src.delete("id = 13")  # one infinity of two left: +inf
    r = v.refresh()
    assert not r.full and r.details["groups_recomputed"] == 0  # from the counts, not the source
    check_view(v, src.uri)
    assert sums() == {0: (3.5, 3.5 / 2, 2.0), 1: (7.5, 2.5, 4.0), 2: (INF, INF, INF)}
    src.delete("id = 12")
    src.update("id = 4", values_sql={"x": "CAST('-inf' AS DOUBLE)"})  # a row's value becomes -inf
    v.refresh()
    check_view(v, src.uri)
    assert sums()[2] == (-INF, -INF, -INF)
    src.update("id = 4", values_sql={"x": "0.25"})
    v.refresh()
    assert sums()[2] == (0.25, 0.25, 0.25)
    assert checks(v) == {"no_orphan_rows": True, "values_match_source": True}


def test_nan_leaves_min_and_max_buffers_and_count_distinct_when_its_rows_go(db):
    """max is NaN while a NaN is in the group and the largest number once it
    leaves (NaN sits at the head of the max buffer, kept across refreshes);
    min skips it; count(distinct) counts the NaNs as one value until the last goes."""
    rows = [(i, 0, float(i)) for i in range(30)] + [(100, 0, NAN), (101, 0, NAN), (102, 0, INF), (103, 0, -INF)]
    src = db.create_table("src", table(rows), primary_key="id")
    v = db.create_materialized_view("agg", src.search(None).group_by("g").agg(AGGS))
    v.refresh()
    check_view(v, src.uri)
    steps = [
        lambda: src.delete("id = 100"),  # one NaN left
        lambda: src.add(table([(104, 0, NAN), (105, 0, 50.0)])),
        lambda: src.delete("id IN (101, 104)"),  # no NaN: max is inf
        lambda: src.delete("id IN (102, 103)"),  # no infinity: 50, 0
        lambda: src.add(table([(106, 0, NAN)])),
        lambda: src.update("id = 106", values_sql={"x": "7.0"}),
    ]
    for step in steps:
        step()
        r = v.refresh()
        assert not r.full
        check_view(v, src.uri)
        assert checks(v) == {"no_orphan_rows": True, "values_match_source": True}
    got = v.to_arrow().to_pylist()[0]
    assert (got["lo"], got["hi"], got["dx"]) == (0.0, 50.0, 31)


def test_check_passes_a_correct_view_holding_infinities_and_nan(db):
    src = db.create_table("src", table([(0, 0, INF), (1, 0, 1.0), (2, 1, NAN), (3, 2, -INF), (4, 2, INF)]),
                          primary_key="id")
    v = db.create_materialized_view("agg", src.search(None).group_by("g").agg(
        {"hi": "max(x)", "lo": "min(x)", "sx": "sum(x)", "ax": "avg(x)"}))
    v.refresh()
    assert checks(v) == {"no_orphan_rows": True, "values_match_source": True}
    src.add(table([(5, 0, 2.0), (6, 1, 3.0)]))
    v.refresh()
    assert checks(v) == {"no_orphan_rows": True, "values_match_source": True}


def test_a_view_stored_without_the_non_finite_counts_keeps_working(db, monkeypatch):
    """A view created before the counts existed (its schema lacks them): its
    sums hold every value as before; a touched group whose stored sum is not
    finite is recomputed from the source, so deletes still make it finite."""
    from mv_assets.model import agg_view

    original = agg_view.view_schema  # (what the aggregate kind's schema is asked of: model.kinds)

    def without_counts(definition, datasets):
        schema = original(definition, datasets)
        return pa.schema([f for f in schema if not f.name.startswith(("__agg__nan__", "__agg__pinf__",
                                                                       "__agg__ninf__"))],
                         metadata=schema.metadata)

    monkeypatch.setattr(agg_view, "view_schema", without_counts)
    src = db.create_table("src", table([(0, 0, 1.5), (1, 0, 2.0), (2, 1, 1.0), (3, 1, INF)]), primary_key="id")
    v = db.create_materialized_view("agg", src.search(None).group_by("g").agg(AGGS))
    monkeypatch.undo()
    assert not any(n.startswith("__agg__nan__") for n in lance.dataset(v.uri).schema.names)
    v.refresh()
    check_view(v, src.uri)
    src.add(table([(4, 0, NAN), (5, 1, -INF)]))
    assert not v.refresh().full
    check_view(v, src.uri)
    src.delete("id IN (3, 4)")
    r = v.refresh()
    assert not r.full and r.details["groups_recomputed"] == 2  # their stored sums were not finite
    check_view(v, src.uri)
    src.delete("id = 5")
    v.refresh()
    check_view(v, src.uri)
    assert {r["g"]: r["sx"] for r in v.to_arrow().to_pylist()} == {0: 3.5, 1: 1.0}
    assert checks(v) == {"no_orphan_rows": True, "values_match_source": True}


def test_finite_values_whose_sum_overflows(db):
    """1e308 + 1e308 overflows a double: inf, as SQL says; taking one back out
    recomputes the group from the source (a running sum cannot)."""
    src = db.create_table("src", table([(0, 0, 1e308), (1, 0, 1.0)]), primary_key="id")
    v = db.create_materialized_view("agg", src.search(None).group_by("g").agg({"sx": "sum(x)", "ax": "avg(x)"}))
    v.refresh()
    src.add(table([(2, 0, 1e308)]))
    v.refresh()
    assert v.to_arrow().to_pylist()[0]["sx"] == INF
    src.delete("id = 2")
    v.refresh()
    assert v.to_arrow().to_pylist()[0]["sx"] == 1e308
    assert checks(v) == {"no_orphan_rows": True, "values_match_source": True}


def test_changed_rows_whose_sum_overflows_even_halved(db):
    """Three rows of 1.7e308 added to a group at once: their partial sums
    overflow math.fsum even halved (the incremental refresh raised
    OverflowError, and every one after it too); the sum is inf, as a full
    refresh says, and finite again once two of them go."""
    src = db.create_table("src", table([(0, 0, 1.0)]), primary_key="id")
    aggs = {k: a for k, a in AGGS.items() if k != "q"}  # (approx_quantile near the float limit: not here)
    v = db.create_materialized_view("agg", src.search(None).group_by("g").agg(aggs))
    v.refresh()
    src.add(table([(i, 0, 1.7e308) for i in (1, 2, 3)]))
    v.refresh()
    assert [(r["sx"], r["n"]) for r in v.to_arrow().to_pylist()] == [(INF, 4)]
    check_view(v, src.uri)
    src.add(table([(4, 0, 2.0)]))
    src.delete("id = 1 OR id = 2")
    v.refresh()
    assert [(r["sx"], r["n"]) for r in v.to_arrow().to_pylist()] == [(1.7e308, 3)]
    check_view(v, src.uri)
    assert checks(v) == {"no_orphan_rows": True, "values_match_source": True}
