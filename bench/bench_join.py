"""Join views (kind "join") at scale: a first refresh next to DuckDB computing
the same join from the same Lance tables, and each class of change refreshed
incrementally, as a fraction of the first refresh, INNER and LEFT side by side.

    python bench/bench_join.py            # 10M fact rows x 100k dimension rows
    python bench/bench_join.py --quick    # 1M x 10k
    python bench/bench_join.py --facts 3000000 --dims 30000

Data (made with mv_assets in a temp dir, stable row ids): ``facts(id, dim_id,
amount)``, ``dim_id`` uniform over 1.1 x the dimension's ids (about 9% of the
facts match nothing: INNER drops them, LEFT pads them), and ``dims(id, name,
region, weight)``. Per join kind one view::

    facts ⋈ dims (dim_id = id) -> fid, amount, region, name, label = upper(dims.name)

``label`` is an Arrow-batch UDF (``pa.Array`` in, ``pa.Array`` out); the
views marked ``+s`` compute it with a scalar UDF instead, the form users
write (``@udf def score(name: str, amount: float) -> float``, one call per
row). The baseline (DuckDB, its default threads): both tables read with
pylance to Arrow (the columns the join needs), joined in DuckDB, the same UDF
applied to its result (the Arrow one per batch, the scalar one per row in a
plain Python loop), written with ``lance.write_dataset``. Each change is
measured against that baseline (measured once per view at its first
refresh: a 1% change leaves its cost the same) and against the view's own
first refresh; the goals are the former's. What each refresh read and
rewrote is printed from its plan (``details["work"]``: changed rows per
source, first-table rows its probes matched, view key values read, rows
recomputed and removed).

After every refresh the view is checked against an oracle: DuckDB's join of
the sources read at ``view.source_versions`` with the UDF applied, compared
sorted by ``fid`` (a fact row gives one view row: dimension ids are unique).
UDF calls are checked exactly: an append calls it on the appended rows in the
view (for LEFT, an appended fact matching nothing too: a batched UDF is
called on the NULL a LEFT row pads with), an update of the dimension column
it reads on exactly the view rows of the updated dimensions, any other change
0 times. A change's refresh also misses its goal when its plan read more than
2 rows (view keys streamed, key columns scanned) per row the change touches:
with the view's arrangement and the first table's key arrangement kept in
memory between refreshes (mv_assets.ops.arrangements), it reads none; the
first refresh after the view's first that needs one loads it (one read of the
view's provenance columns, counted in its plan seconds: "loaded").
Goals are printed next to what was measured (PASS/MISS); nothing is
asserted on time. The exit status is 1 when a view differed from its oracle
or a UDF call count was wrong.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

import duckdb  # noqa: E402
import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

import mv_assets as mv  # noqa: E402


@mv.udf(data_type=pa.string())
def label(name: pa.Array) -> pa.Array:
    """The UDF column: one Arrow call per batch (NULL in, NULL out)."""
    return pc.utf8_upper(name)  # pyright: ignore[reportAttributeAccessIssue]


@mv.udf
def score(name: str, amount: float) -> float:
    """The scalar UDF column: one call per row (a NULL input is NULL, no call)."""
    return len(name) + amount


HOWS = ("inner", "left", "inner+s", "left+s")  # (+s: the scalar UDF)
DUCK_HOW = {"inner": "INNER", "left": "LEFT"}


def base(how: str) -> str:
    """The join kind of a bench view ("inner+s" -> "inner")."""
    return how.split("+")[0]


def is_scalar(how: str) -> bool:
    return how.endswith("+s")
COLUMNS = ["fid", "amount", "region", "name", "label"]


def make_facts(rng: np.random.Generator, start: int, n: int, dims: int) -> pa.Table:
    return pa.table({"id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                     "dim_id": pa.array(rng.integers(0, dims + dims // 10, n, dtype=np.int64)),
                     "amount": pa.array(rng.random(n))})


def make_dims(n: int) -> pa.Table:
    ids = np.arange(n, dtype=np.int64)
    return pa.table({"id": pa.array(ids), "name": pa.array([f"name-{i}" for i in range(n)]),
                     "region": pa.array([f"region-{i % 25}" for i in range(n)]), "weight": pa.array(ids * 3)})


def view_query(facts, dims, how: str):
    udf = (score, ["dims.name", "facts.amount"]) if is_scalar(how) else (label, ["dims.name"])
    return (facts.search(None).join(dims, left_on="dim_id", right_on="id", how=base(how))
            .select({"fid": "facts.id", "amount": "facts.amount", "region": "dims.region", "name": "dims.name",
                     "label": udf}))


def read_sources(db, versions: dict[str, int]) -> tuple[pa.Table, pa.Table]:
    """The two sources at these versions, read with pylance (the columns the join needs)."""
    f = lance.dataset(db.open_table("facts").uri, version=versions["facts"]).to_table(columns=["id", "dim_id", "amount"])
    d = lance.dataset(db.open_table("dims").uri, version=versions["dims"]).to_table(columns=["id", "name", "region"])
    return f, d


def duck_join(facts: pa.Table, dims: pa.Table, how: str) -> pa.Table:
    """DuckDB's join of the two Arrow tables, with the UDF applied to its result."""
    con = duckdb.connect()
    try:
        con.register("f", facts)
        con.register("d", dims)
        out = con.sql(f"SELECT f.id AS fid, f.amount, d.region, d.name FROM f {DUCK_HOW[base(how)]} JOIN d "
                      "ON f.dim_id = d.id").to_arrow_table()
    finally:
        con.close()
    name = out.column("name").combine_chunks()
    if is_scalar(how):  # per row, in a plain loop: what a scalar UDF costs with no engine around it
        f = score.func
        values = [None if n is None else f(n, a)  # (a NULL input: NULL, no call, as a scalar UDF skips NULLs)
                  for n, a in zip(name.to_pylist(), out.column("amount").to_pylist(), strict=True)]
        return out.append_column("label", pa.array(values, pa.float64()))
    return out.append_column("label", label(name))


def duckdb_baseline(db, versions: dict[str, int], how: str, scratch: str) -> tuple[float, pa.Table]:
    """The baseline, timed: read, join, UDF, write; and its result (the first refresh's oracle)."""
    t0 = time.perf_counter()
    f, d = read_sources(db, versions)
    out = duck_join(f, d, how)
    lance.write_dataset(out, scratch, mode="overwrite")
    return time.perf_counter() - t0, out


def canonical(t: pa.Table) -> pa.Table:
    t = t.select(COLUMNS)
    t = t.cast(pa.schema([pa.field(n, t.schema.field(n).type) for n in COLUMNS]))
    return t.sort_by("fid").combine_chunks()


def matches_oracle(view, want: pa.Table) -> bool:
    got = canonical(view.to_arrow())
    want = canonical(want.cast(got.schema))
    return got.num_rows == want.num_rows and got.equals(want)


def oracle(db, view, how: str) -> pa.Table:
    return duck_join(*read_sources(db, view.source_versions), how)


def view_rows_of(db, view, fact_filter, dim_ids: np.ndarray | None, how: str) -> int:
    """View rows (at the view's source versions) from the fact rows ``fact_filter``
    selects (a boolean mask over the facts) whose dimension is in ``dim_ids``
    (None: any, a LEFT row without a match included)."""
    f, d = read_sources(db, view.source_versions)
    keep = fact_filter(f)
    keys = f.column("dim_id").filter(keep)
    if dim_ids is not None:
        return int(pc.sum(pc.is_in(keys, pa.array(dim_ids))).as_py() or 0)  # pyright: ignore[reportAttributeAccessIssue]
    if base(how) == "left" and not is_scalar(how):  # (a batched UDF is called on a LEFT row's NULL too)
        return len(keys)
    return int(pc.sum(pc.is_in(keys, d.column("id"))).as_py() or 0)  # pyright: ignore[reportAttributeAccessIssue]


def warm_up(uri: str) -> None:
    """One tiny join view refreshed and one DuckDB join, untimed: imports and
    first-call costs out of the first measurement."""
    db = mv.connect(uri, runner=mv.InlineRunner())
    rng = np.random.default_rng(1)
    f, d = db.create_table("facts", make_facts(rng, 0, 1000, 10)), db.create_table("dims", make_dims(10))
    for how in HOWS:
        v = db.create_materialized_view(f"w_{how.replace('+', '_s')}", view_query(f, d, how))
        v.refresh()
        duckdb_baseline(db, v.source_versions, how, f"{uri}/duckdb_out.lance")


def timed_refresh(view):
    t0 = time.perf_counter()
    r = view.refresh()
    return time.perf_counter() - t0, r


def where_time_goes(wall: float, r) -> str:
    t = r.timings or {}
    execute, commit = t.get("execute_s", 0.0), t.get("commit_s", 0.0)
    work = (r.details or {}).get("work")
    read = "" if not work else (
        f"; read: changed {sum(work['changed_rows'].values()):,}, probe matches {work['probe_matches']:,}, "
        f"view keys {work['view_key_rows_read']:,}, key rows scanned {work.get('key_rows_scanned', 0):,}; "
        f"recomputed {work['first_rows_computed']:,}")
    arranged = (r.details or {}).get("arrangements") or {}
    if arranged:
        read += "; arrangements: " + ", ".join(
            f"{k} {i['how'].split(' (')[0]} {i.get('seconds', 0):.3f} s"
            + (f" (loaded ahead, in a thread: {i['ahead_s']:.3f} s)" if "ahead_s" in i else "")
            for k, i in arranged.items())
    return (f"plan {max(wall - execute - commit, 0.0):.2f}  execute {execute:.2f}  commit {commit:.2f}  "
            f"(rows +{r.rows_inserted:,} -{r.rows_deleted:,}{read})")


def read_share(r) -> float | None:
    """Rows the plan read to find what to recompute (view keys streamed, key
    columns scanned) per row the change touches (changed source rows, view
    rows removed, first-table rows computed again); None: nothing touched."""
    work = (r.details or {}).get("work")
    if not work:
        return None
    touched = sum(work["changed_rows"].values()) + work["view_rows_removed"] + work["first_rows_computed"]
    read = work["view_key_rows_read"] + work.get("key_rows_scanned", 0)
    return read / touched if touched else None


READ_GOAL = 2.0  # rows read per row touched, at most


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--facts", type=int, default=10_000_000)
    p.add_argument("--dims", type=int, default=100_000)
    p.add_argument("--quick", action="store_true", help="1M x 10k")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="first refreshes (and DuckDB runs) measured: the median")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (printed)")
    args = p.parse_args()
    if args.repeat < 1:
        p.error("--repeat is at least 1")
    n_facts, n_dims = (1_000_000, 10_000) if args.quick else (args.facts, args.dims)
    rng = np.random.default_rng(args.seed)
    root = tempfile.mkdtemp(prefix="mvjoin-")
    scratch = f"{root}/duckdb_out.lance"
    db = mv.connect(f"{root}/catalog", runner=mv.InlineRunner())

    warm_up(f"{root}/warm")
    t0 = time.perf_counter()
    facts = db.create_table("facts", make_facts(rng, 0, n_facts, n_dims))
    dims = db.create_table("dims", make_dims(n_dims))
    views = {how: db.create_materialized_view(f"fv_{how.replace('+', '_s')}", view_query(facts, dims, how)) for how in HOWS}
    print(f"facts {n_facts:,} x dims {n_dims:,} (built in {time.perf_counter() - t0:.1f} s; {root})", flush=True)

    rows: list[tuple] = []  # (how, what, goal text, measured text, passed, calls text, oracle ok)
    breakdown: list[str] = []
    first: dict[str, float] = {}
    duck: dict[str, float] = {}  # DuckDB computing each view from scratch (at its first refresh)
    wrong = False

    def record(how, what, goal, measured, passed, calls, ok, wall: float = 0.0, r=None):
        nonlocal wrong
        wrong |= not ok or "WRONG" in calls
        rows.append((how, what, goal, measured, passed and ok and "WRONG" not in calls, calls, ok))
        if r is not None:
            breakdown.append(f"{how:>7} {what:<48} {wall:7.2f} s: {where_time_goes(wall, r)}")
        print(f"  {how:>7} {what:<34} {measured:>10}  calls {calls:<24} oracle {'ok' if ok else 'DIFFERS'}",
              flush=True)

    # -- first refresh, next to DuckDB -------------------------------------------
    for how in HOWS:
        walls, ducks = [], []
        v, r, duck_out = views[how], None, pa.table({})
        for rep in range(args.repeat):  # (a repeat: the view dropped and created again; the median is kept)
            if rep:
                db.drop_table(views[how].name)
                views[how] = db.create_materialized_view(f"fv_{how.replace('+', '_s')}", view_query(facts, dims, how))
            v = views[how]
            wall, r = timed_refresh(v)
            walls.append(wall)
            duck_s, duck_out = duckdb_baseline(db, v.source_versions, how, scratch)
            ducks.append(duck_s)
        assert r is not None
        wall, duck_s = statistics.median(walls), statistics.median(ducks)
        first[how], duck[how] = wall, duck_s
        ok = matches_oracle(v, duck_out)
        want = duck_out.num_rows - (duck_out.column("name").null_count if is_scalar(how) else 0)
        got = r.udf_rows_computed.get("label", 0)
        calls = f"{got:,}" + ("" if got == want else f" WRONG (want {want:,})")
        ratio = wall / duck_s
        goal = 1.2 if is_scalar(how) else 1.5
        record(how, f"first refresh {wall:.2f} s / duckdb {duck_s:.2f} s", f"<= {goal}x", f"{ratio:.2f}x",
               ratio <= goal, calls, ok, walls[-1], r)  # (where the time goes: the last one)
        del duck_out

    def step(what: str, goal: float, expected_calls, change) -> None:
        """Apply ``change``, then refresh each view and check it."""
        change()
        for how in HOWS:
            v = views[how]
            wall, r = timed_refresh(v)
            want = expected_calls(v, how)
            got = r.udf_rows_computed.get("label", 0)
            calls = f"{got:,}" + (f" (= {want:,})" if got == want else f" WRONG (want {want:,})")
            ok = matches_oracle(v, oracle(db, v, how))
            ratio = wall / duck[how]  # (the goal: a fraction of DuckDB computing the view from scratch)
            share = read_share(r)
            reads = "" if share is None else f", read {share:.2f}x touched" + (
                "" if share <= READ_GOAL else f" MISS (> {READ_GOAL:g}x)")
            record(how, f"{what} ({wall / first[how]:.3f} of own 1st{reads})", f"<= {goal:g}", f"{ratio:.4f}",
                   ratio <= goal and not r.full and (share is None or share <= READ_GOAL), calls, ok, wall, r)

    n_new = n_facts // 100
    start = n_facts

    def append() -> None:
        facts.add(make_facts(rng, start, n_new, n_dims))

    step("+1% fact rows appended", 0.03,
         lambda v, how: view_rows_of(db, v, lambda f: pc.greater_equal(f.column("id"), start),  # pyright: ignore[reportAttributeAccessIssue]
                                   None, how), append)

    def updated(m: int) -> np.ndarray:
        return updated_by(100, m)

    def updated_by(every_n: int, m: int) -> np.ndarray:
        return np.arange(n_dims, dtype=np.int64)[np.arange(n_dims) % every_n == m]

    every = lambda f: pa.array(np.ones(f.num_rows, dtype=bool))  # noqa: E731
    step("1% dims updated, column UDF reads", 0.05, lambda v, how: view_rows_of(db, v, every, updated(3), how),
         lambda: dims.update(where="id % 100 = 3", values_sql={"name": "concat(name, '-u')"}))
    step("0.1% dims updated, column UDF reads", 0.01, lambda v, how: view_rows_of(db, v, every, updated_by(1000, 13), how),
         lambda: dims.update(where="id % 1000 = 13", values_sql={"name": "concat(name, '-t')"}))
    step("1% dims updated, column UDF skips", 0.05, lambda v, how: 0,
         lambda: dims.update(where="id % 100 = 4", values_sql={"region": "concat(region, '-u')"}))
    step("1% dims updated, column view skips", 0.01, lambda v, how: 0,
         lambda: dims.update(where="id % 100 = 5", values_sql={"weight": "weight + 1"}))
    step("1% fact rows deleted", 0.02, lambda v, how: 0, lambda: facts.delete("id % 100 = 7"))

    def dim_delete_calls(v, how: str) -> int:
        # INNER: the rows go; LEFT: they stay, padded with NULLs, and the UDF is called on the NULL
        return view_rows_of(db, v, every, updated(8), how) if base(how) == "left" and not is_scalar(how) else 0

    # (the LEFT count is of facts whose dimension is gone at the new version: counted before the delete)
    gone: dict[str, int] = {}

    def delete_dims() -> None:
        for how in HOWS:
            gone[how] = dim_delete_calls(views[how], how)
        dims.delete("id % 100 = 8")

    step("1% dimension rows deleted", 0.05, lambda v, how: gone[how], delete_dims)

    # -- the table ----------------------------------------------------------------
    print()
    print(f"{'join':>7}  {'measurement':<64} {'goal':>8} {'measured':>9}  {'UDF calls':<26} {'oracle':<7} mark")
    for how, what, goal, measured, passed, calls, ok in rows:
        print(f"{how:>7}  {what:<64} {goal:>8} {measured:>9}  {calls:<26} {'ok' if ok else 'DIFFERS':<7} "
              f"{'PASS' if passed else 'MISS'}")
    print("\nwhere the time goes (wall s; plan = wall - execute - commit):")
    for line in breakdown:
        print("  " + line)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    if wrong:
        print("\na view differed from its oracle or a UDF call count was wrong")
        sys.exit(1)


if __name__ == "__main__":
    main()
