"""TPC-H Q3, Q10 and Q13 as one view each (joins and GROUP BY in one query,
kind "join_aggregate"), next to DuckDB computing the same query from scratch.

    python bench/bench_tpch.py                 # scale factor 1 (lineitem 6M rows)
    python bench/bench_tpch.py --sf 0.1        # quicker

Data from ``tpchgen-cli`` (parquet, decimals as float64), written to Lance
tables with mv_assets. Per query: the first refresh, then TPC-H's refresh
functions and dimension changes, each refreshed incrementally; every step is
paired with DuckDB running the same SQL over the tables read with pylance at
the versions the view records (read + query), and the view is checked
against that answer (groups equal; sums within 1e-9 relative). Printed per
step: mv_assets' time, DuckDB's, their ratio, and what the refresh read
(full or incremental, the groups). Nothing is asserted on time; the exit status is 1 when a view
differed from DuckDB.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

import duckdb  # noqa: E402
import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import mv_assets as mv  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from test_join_tpch import (  # noqa: E402  (the queries, their DuckDB SQL and the refresh functions)
    Q3_SQL,
    Q10_SQL,
    Q13_SQL,
    TABLES,
    _plain,
    _tpchgen,
    by_key,
    in_list,
    make_one_views,
    rf1,
    rf2_keys,
)

SQL = {"q3": Q3_SQL, "q10": Q10_SQL, "q13": Q13_SQL}


def generate(sf: float, out: str) -> dict[str, pa.Table]:
    exe = _tpchgen()
    if exe is None:
        sys.exit("tpchgen-cli is not installed (pip install tpchgen-cli: the test extra)")
    subprocess.run([exe, "parquet", "--scale-factor", str(sf), "--output-dir", out, "--quiet",
                    *(a for t in TABLES for a in ("--tables", t))], check=True, capture_output=True, timeout=1800)
    return {t: _plain(pq.read_table(os.path.join(out, f"{t}.parquet"))) for t in TABLES}


def duckdb_from_scratch(db, versions: dict[str, int], sql: str) -> tuple[float, pa.Table]:
    """DuckDB's answer, timed: the tables read with pylance at ``versions``, the query run."""
    t0 = time.perf_counter()
    con = duckdb.connect()
    try:
        for name, version in versions.items():
            con.register(name, lance.dataset(db.open_table(name).uri, version=version).to_table())
        out = con.sql(sql).to_arrow_table()
    finally:
        con.close()
    return time.perf_counter() - t0, out


def same(got: pa.Table, want: pa.Table, keys) -> bool:
    g, w = by_key(got, keys), by_key(want, keys)
    if g.keys() != w.keys():
        return False
    for k, row in w.items():
        for col, value in row.items():
            a = g[k][col]
            if isinstance(value, float) and a is not None and value is not None:
                if abs(a - value) > 1e-9 * max(1.0, abs(value)):
                    return False
            elif a != value:
                return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (1: lineitem 6M rows)")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="mvtpch-")
    t0 = time.perf_counter()
    data = generate(args.sf, os.path.join(root, "parquet"))
    db = mv.connect(os.path.join(root, "catalog"), runner=mv.InlineRunner())
    for t in TABLES:
        db.create_table(t, data[t])
    views = make_one_views(db)
    print(f"TPC-H sf {args.sf:g}: lineitem {data['lineitem'].num_rows:,} rows, orders {data['orders'].num_rows:,}, "
          f"customer {data['customer'].num_rows:,} (loaded in {time.perf_counter() - t0:.1f} s; {root})", flush=True)
    del data
    rng = np.random.default_rng(3)
    lines, wrong = [], False

    def step(what: str) -> None:
        nonlocal wrong
        for name, (_, view, sql, keys) in views.items():
            t1 = time.perf_counter()
            r = view.refresh()
            wall = time.perf_counter() - t1
            versions = {t: v for t, v in view.source_versions.items() if t in TABLES}
            duck_s, want = duckdb_from_scratch(db, versions, sql)
            ok = same(view.to_arrow(), want, keys)
            wrong |= not ok
            line = (f"{name:>4} {what:<34} mv {wall:7.2f} s  duckdb {duck_s:6.2f} s  ratio {wall / duck_s:6.3f}  "
                    f"{'full' if r.full else 'incr'}  groups {want.num_rows:,}  {'ok' if ok else 'DIFFERS'}")
            lines.append(line)
            print(line, flush=True)

    step("first refresh")
    n = max(10, int(1500 * args.sf))
    rf1(db, rng, n)
    step(f"RF1 ({n} orders + lineitems)")
    doomed = rf2_keys(db, rng, n)
    db.open_table("orders").delete(f"o_orderkey IN {in_list(doomed)}")
    db.open_table("lineitem").delete(f"l_orderkey IN {in_list(doomed)}")
    step(f"RF2 ({len(doomed)} orders + lineitems)")
    db.open_table("customer").update(where="c_custkey % 100 = 3", values={"c_mktsegment": "BUILDING"})
    step("1% customers change segment")
    db.open_table("nation").update(where="n_nationkey = 3", values_sql={"n_name": "'ATLANTIS'"})
    step("a nation renamed")
    top = pc.max(lance.dataset(db.open_table("customer").uri).to_table(columns=["c_custkey"]).column(0)).as_py()  # pyright: ignore[reportAttributeAccessIssue]
    extra = db.open_table("customer").to_arrow().slice(0, 100)
    extra = extra.set_column(0, "c_custkey", pa.array(np.arange(top + 1, top + 101, dtype=np.int64)))
    db.open_table("customer").add(extra)
    step("+100 customers")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    if wrong:
        print("a view differed from DuckDB")
        sys.exit(1)


if __name__ == "__main__":
    main()
