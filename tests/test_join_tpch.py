"""Join views on TPC-H data (tpchgen-cli, scale factor 0.01), checked against
DuckDB: Q3 (lineitem ⋈ orders ⋈ customer, a filter on all three, revenue as a
SQL column; an aggregate view over the join view groups it), a Q10 shape (a
four-table chain to nation) and a Q13 shape (customer LEFT JOIN orders,
orders counted per customer, customers without orders included). Each is
also written as one view, joins and ``GROUP BY`` in one query, as SQL has it
(``sum(l_extendedprice * (1 - l_discount))``): a join aggregate.

After the first refresh and after each refresh function and update (RF1: new
orders and their lineitems, keys above the max; RF2: orders deleted, then
their lineitems; customers changing market segment, entering and leaving
Q3's filter; order dates moved across the cutoff; prices updated; new
customers), every join view is refreshed, then its aggregate view, and the
aggregate view's rows are compared with DuckDB's answer to the same query
over the tables read with pylance at the versions the join view reflects
(``source_versions``); sums with a relative tolerance (1e-9).
"""

import os
import shutil
import subprocess
import sys

import duckdb
import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

TABLES = ("customer", "orders", "lineitem", "nation")


def _tpchgen() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
    return here if os.path.exists(here) else shutil.which("tpchgen-cli")


def _plain(t: pa.Table) -> pa.Table:
    """Types every writer here reads: string_view as string, decimals as float64; no field metadata."""
    fields = []
    for f in t.schema:
        typ = f.type
        if pa.types.is_string_view(typ) or pa.types.is_large_string(typ):
            typ = pa.string()
        elif pa.types.is_decimal(typ):
            typ = pa.float64()
        fields.append(pa.field(f.name, typ, nullable=True))
    return t.cast(pa.schema(fields))


@pytest.fixture(scope="module")
def tpch(tmp_path_factory) -> dict[str, pa.Table]:
    exe = _tpchgen()
    if exe is None:
        pytest.skip("tpchgen-cli is not installed (pip install tpchgen-cli: the test extra)")
    out = tmp_path_factory.mktemp("tpch")
    subprocess.run([exe, "parquet", "--scale-factor", "0.01", "--output-dir", str(out), "--quiet",
                    *(a for t in TABLES for a in ("--tables", t))], check=True, capture_output=True, timeout=120)
    return {t: _plain(pq.read_table(out / f"{t}.parquet")) for t in TABLES}


# -- the queries: as join views and aggregate views, and as DuckDB's SQL ----------

Q3_FILTER = ("customer.c_mktsegment = 'BUILDING' AND orders.o_orderdate < DATE '1995-03-15' "
             "AND lineitem.l_shipdate > DATE '1995-03-15'")
Q3_SQL = f"""
SELECT l_orderkey, o_orderdate, o_shippriority, sum(l_extendedprice * (1 - l_discount)) AS revenue
FROM lineitem JOIN orders ON l_orderkey = o_orderkey JOIN customer ON o_custkey = c_custkey
WHERE {Q3_FILTER}
GROUP BY l_orderkey, o_orderdate, o_shippriority"""

Q10_FILTER = ("orders.o_orderdate >= DATE '1993-10-01' AND orders.o_orderdate < DATE '1994-01-01' "
              "AND lineitem.l_returnflag = 'R'")
Q10_SQL = f"""
SELECT c_custkey, c_name, n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue, count(*) AS lines
FROM lineitem JOIN orders ON l_orderkey = o_orderkey JOIN customer ON o_custkey = c_custkey
JOIN nation ON c_nationkey = n_nationkey
WHERE {Q10_FILTER}
GROUP BY c_custkey, c_name, n_name"""

Q13_SQL = """
SELECT c_custkey, count(o_orderkey) AS orders, count(*) AS rows_, sum(o_totalprice) AS total
FROM customer LEFT JOIN orders ON c_custkey = o_custkey
GROUP BY c_custkey"""

Q3_KEYS = ("l_orderkey", "o_orderdate", "o_shippriority")
Q10_KEYS = ("c_custkey", "c_name", "n_name")
Q13_KEYS = ("c_custkey",)


def make_views(db) -> dict[str, tuple]:
    """name -> (join view, aggregate view, DuckDB SQL, group keys)."""
    c, o, li, n = (db.open_table(t) for t in TABLES)
    q3 = (li.search(None).join(o, left_on="l_orderkey", right_on="o_orderkey")
          .join(c, left_on="orders.o_custkey", right_on="c_custkey").where(Q3_FILTER)
          .select({"l_orderkey": "lineitem.l_orderkey", "o_orderdate": "orders.o_orderdate",
                   "o_shippriority": "o_shippriority", "revenue": "l_extendedprice * (1 - l_discount)"}))
    q10 = (li.search(None).join(o, left_on="l_orderkey", right_on="o_orderkey")
           .join(c, left_on="o_custkey", right_on="c_custkey")
           .join(n, left_on="customer.c_nationkey", right_on="n_nationkey").where(Q10_FILTER)
           .select({"c_custkey": "customer.c_custkey", "c_name": "c_name", "n_name": "nation.n_name",
                    "revenue": "lineitem.l_extendedprice * (1 - lineitem.l_discount)"}))
    q13 = (c.search(None).join(o, left_on="c_custkey", right_on="o_custkey", how="left")
           .select({"c_custkey": "customer.c_custkey", "o_orderkey": "orders.o_orderkey",
                    "o_totalprice": "o_totalprice"}))
    out = {}
    for name, q, keys, aggs, sql in [
        ("q3", q3, Q3_KEYS, {"revenue": "sum(revenue)"}, Q3_SQL),
        ("q10", q10, Q10_KEYS, {"revenue": "sum(revenue)", "lines": "count(*)"}, Q10_SQL),
        ("q13", q13, Q13_KEYS, {"orders": "count(o_orderkey)", "rows_": "count(*)", "total": "sum(o_totalprice)"},
         Q13_SQL),
    ]:
        jv = db.create_materialized_view(f"{name}_join", q)
        av = db.create_materialized_view(f"{name}_agg", db.open_table(jv.name).search(None).group_by(*keys).agg(aggs))
        out[name] = (jv, av, sql, keys)
    return out


def make_one_views(db) -> dict[str, tuple]:
    """name -> (None, the one view, DuckDB SQL, group keys): each query as one join aggregate."""
    c, o, li, n = (db.open_table(t) for t in TABLES)
    q3 = (li.search(None).join(o, left_on="l_orderkey", right_on="o_orderkey")
          .join(c, left_on="orders.o_custkey", right_on="c_custkey").where(Q3_FILTER)
          .group_by(*Q3_KEYS).agg({"revenue": "sum(l_extendedprice * (1 - l_discount))"}))
    q10 = (li.search(None).join(o, left_on="l_orderkey", right_on="o_orderkey")
           .join(c, left_on="o_custkey", right_on="c_custkey")
           .join(n, left_on="customer.c_nationkey", right_on="n_nationkey").where(Q10_FILTER)
           .group_by("customer.c_custkey", "c_name", "nation.n_name")
           .agg({"revenue": "sum(lineitem.l_extendedprice * (1 - lineitem.l_discount))", "lines": "count(*)"}))
    q13 = (c.search(None).join(o, left_on="c_custkey", right_on="o_custkey", how="left")
           .group_by("customer.c_custkey")
           .agg({"orders": "count(orders.o_orderkey)", "rows_": "count(*)", "total": "sum(o_totalprice)"}))
    return {name: (None, db.create_materialized_view(name, q), sql, keys)
            for name, q, keys, sql in [("q3", q3, Q3_KEYS, Q3_SQL), ("q10", q10, Q10_KEYS, Q10_SQL),
                                       ("q13", q13, Q13_KEYS, Q13_SQL)]}


def duckdb_answer(db, versions: dict[str, int], sql: str) -> pa.Table:
    """DuckDB's answer over the tables read with pylance at ``versions``."""
    con = duckdb.connect()
    try:
        for name, version in versions.items():
            con.register(name, lance.dataset(db.open_table(name).uri, version=version).to_table())
        return con.sql(sql).to_arrow_table()
    finally:
        con.close()


def by_key(t: pa.Table, keys: tuple[str, ...]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for r in t.to_pylist():
        k = tuple(r[c] for c in keys)
        assert k not in out, f"group {k} twice"
        out[k] = {c: v for c, v in r.items() if c not in keys}
    return out


def refresh_and_check(db, views: dict[str, tuple], when: str) -> dict[str, int]:
    """Refresh every join view then its aggregate view; compare with DuckDB. Groups per query."""
    groups = {}
    for name, (jv, av, sql, keys) in views.items():
        if jv is None:  # one view: it refreshes the join kept under it, then its groups
            ra = db.refresh(av.name)
            if when != "first refresh":
                assert not ra.full, (when, name, ra.details)
            versions = {t: v for t, v in av.source_versions.items() if t in TABLES}
            assert set(versions) == set(av.definition.sources[1:]), (when, name, versions)
        else:
            rj, ra = db.refresh(jv.name), db.refresh(av.name)
            if when != "first refresh":  # every later refresh is incremental, the join's and the aggregate's
                assert not rj.full and not ra.full, (when, name, rj.details, ra.details)
            versions = jv.source_versions
            assert av.source_versions == {jv.name: db.open_table(jv.name).version}, (when, name)
        assert not av.refresh_decision().refresh, (when, name)  # (every table's version recorded)
        got = by_key(av.to_arrow(), keys)
        want = by_key(duckdb_answer(db, versions, sql), keys)
        assert got.keys() == want.keys(), (when, name, sorted(set(got) ^ set(want))[:5])
        for k, w in want.items():
            for col, value in w.items():
                assert got[k][col] == (value if isinstance(value, int) or value is None
                                       else pytest.approx(value, rel=1e-9)), (when, name, k, col)
        groups[name] = len(want)
    return groups


# -- the refresh functions and updates --------------------------------------------

def q3_answer_keys(db) -> np.ndarray:
    """The orders in Q3's answer now (from the join view, or the one view)."""
    name = "q3_join" if "q3_join" in db.table_names() else "q3"
    return np.unique(db.open_table(name).to_arrow().column("l_orderkey").to_numpy())


def rf1(db, rng: np.random.Generator, n: int) -> None:
    """New orders (keys above the max) copied from existing ones (half of them
    from orders in Q3's answer, so new rows enter it), and their lineitems."""
    orders = db.open_table("orders").to_arrow()
    lineitem = db.open_table("lineitem").to_arrow()
    top = pc.max(orders.column("o_orderkey")).as_py()  # pyright: ignore[reportAttributeAccessIssue]
    q3_keys = q3_answer_keys(db)
    some = rng.choice(orders.column("o_orderkey").to_numpy(), n // 2, replace=False)
    picked = np.unique(np.concatenate([rng.choice(q3_keys, min(n - n // 2, len(q3_keys)), replace=False), some]))
    new_key = {int(k): top + 1 + i for i, k in enumerate(picked)}
    new_orders = orders.filter(pc.is_in(orders.column("o_orderkey"), pa.array(picked)))  # pyright: ignore[reportAttributeAccessIssue]
    new_orders = new_orders.set_column(0, "o_orderkey", pa.array([new_key[k] for k in
                                                                 new_orders.column("o_orderkey").to_pylist()]))
    new_lines = lineitem.filter(pc.is_in(lineitem.column("l_orderkey"), pa.array(picked)))  # pyright: ignore[reportAttributeAccessIssue]
    new_lines = new_lines.set_column(0, "l_orderkey", pa.array([new_key[k] for k in
                                                               new_lines.column("l_orderkey").to_pylist()]))
    db.open_table("orders").add(new_orders)
    db.open_table("lineitem").add(new_lines)


def rf2_keys(db, rng: np.random.Generator, n: int) -> list[int]:
    """Orders to delete: half in Q3's answer, half anywhere."""
    keys = db.open_table("orders").to_arrow().column("o_orderkey").to_numpy()
    q3_keys = q3_answer_keys(db)
    return sorted({int(k) for k in rng.choice(q3_keys, min(n // 2, len(q3_keys)), replace=False)}
                  | {int(k) for k in rng.choice(keys, n - n // 2, replace=False)})


def in_list(keys: list[int]) -> str:
    return "(" + ", ".join(map(str, keys)) + ")"


@pytest.mark.parametrize("form", ["join view + aggregate view", "one view"])
def test_tpch_q3_q10_q13_follow_refresh_functions_and_updates(db, tpch, form):
    for t in TABLES:
        db.create_table(t, tpch[t])
    views = make_views(db) if form != "one view" else make_one_views(db)
    rng = np.random.default_rng(3)
    first = refresh_and_check(db, views, "first refresh")
    assert first["q3"] > 50 and first["q10"] > 50 and first["q13"] == tpch["customer"].num_rows  # real answers

    rf1(db, rng, 150)
    refresh_and_check(db, views, "RF1")

    doomed = rf2_keys(db, rng, 150)
    db.open_table("orders").delete(f"o_orderkey IN {in_list(doomed)}")  # RF2 in two commits: orders first,
    refresh_and_check(db, views, "RF2 orders")  # (their lineitems then match nothing)
    db.open_table("lineitem").delete(f"l_orderkey IN {in_list(doomed)}")
    refresh_and_check(db, views, "RF2 lineitems")

    # customers change segment: BUILDING ones leave Q3's filter, others enter it
    customer = db.open_table("customer")
    customer.update(where="c_custkey % 7 = 3 AND c_mktsegment = 'BUILDING'", values={"c_mktsegment": "MACHINERY"})
    customer.update(where="c_custkey % 7 = 4 AND c_mktsegment <> 'BUILDING'", values={"c_mktsegment": "BUILDING"})
    refresh_and_check(db, views, "customer segments")

    # order dates moved across Q3's and Q10's cutoffs, both ways
    orders = db.open_table("orders")
    orders.update(where="o_orderkey % 11 = 5 AND o_orderdate < DATE '1995-03-15'",
                  values_sql={"o_orderdate": "DATE '1995-06-01'"})
    orders.update(where="o_orderkey % 11 = 6 AND o_orderdate >= DATE '1995-03-15'",
                  values_sql={"o_orderdate": "DATE '1993-11-01'"})
    refresh_and_check(db, views, "order dates")

    # prices and discounts: revenue changes in place; a customer renamed (a group key of Q10)
    db.open_table("lineitem").update(where="l_orderkey % 5 = 1", values_sql={
        "l_extendedprice": "l_extendedprice * 1.5", "l_discount": "0.01"})
    db.open_table("customer").update(where="c_custkey % 13 = 2", values_sql={"c_name": "concat(c_name, '*')"})
    refresh_and_check(db, views, "prices and names")

    # new customers (Q13: rows without orders) and a nation renamed (Q10's group key)
    top = pc.max(db.open_table("customer").to_arrow().column("c_custkey")).as_py()  # pyright: ignore[reportAttributeAccessIssue]
    extra = tpch["customer"].slice(0, 20)
    extra = extra.set_column(0, "c_custkey", pa.array(np.arange(top + 1, top + 21, dtype=np.int64)))
    db.open_table("customer").add(extra)
    db.open_table("nation").update(where="n_nationkey = 3", values_sql={"n_name": "'ATLANTIS'"})
    groups = refresh_and_check(db, views, "new customers, nation renamed")
    assert groups["q13"] == db.open_table("customer").count_rows()

    for jv, av, _, _ in views.values():
        assert db.refresh((jv or av).name).tasks == 0
