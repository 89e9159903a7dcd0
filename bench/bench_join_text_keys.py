"""A join on a text key (customer codes, UUIDs as strings): a change of the
joined table probed in the first table's key arrangement (the key held as a
64-bit hash of its bytes) next to the same refresh probing by a filtered scan
of the first table's key column (as text keys were before: the view's own
arrangement used by both), in one run, alternated over the same changes.

    python bench/bench_join_text_keys.py                    # 3M facts x 30k dims
    python bench/bench_join_text_keys.py --facts 10000000 --dims 100000

Two views over the same two tables, ``facts ⋈ dims ON code`` with a scalar
UDF over the dimension's name and the fact's amount; after each change (1% of
the dimensions renamed, a different 1% each round) view A refreshes with the
key's arrangement, view B with a filtered scan of the key column, and both are compared with pyarrow's own join
of the sources at the versions each reflects. Printed: each refresh's plan
and total seconds, medians over the rounds after the first (the first
loads A's arrangements: printed apart), and the rows each plan read. Nothing
is asserted on time; the exit status is 1 when a view differs from its oracle.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import mv_assets as mv  # noqa: E402
from mv_assets.ops import arrangements  # noqa: E402


@mv.udf
def score(name: str, amount: float) -> float:
    return len(name) + amount


def code(i: "np.ndarray") -> pa.Array:
    return pa.array([f"cust-{int(k):08d}" for k in i])


def oracle_rows(db, view) -> pa.Table:
    v = view.source_versions
    f = lance.dataset(db.open_table("facts").uri, version=v["facts"]).to_table(columns=["id", "code", "amount"])
    d = lance.dataset(db.open_table("dims").uri, version=v["dims"]).to_table(columns=["code", "name"])
    j = f.join(d, keys="code", join_type="inner")
    s = [len(n) + a for n, a in zip(j.column("name").to_pylist(), j.column("amount").to_pylist(), strict=True)]
    return pa.table({"fid": j.column("id"), "name": j.column("name"), "s": pa.array(s, pa.float64())}).sort_by("fid")


def same(db, view) -> bool:
    got = view.to_arrow().select(["fid", "name", "s"]).sort_by("fid")
    want = oracle_rows(db, view)
    return got.num_rows == want.num_rows and got.cast(want.schema).equals(want)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--facts", type=int, default=3_000_000)
    p.add_argument("--dims", type=int, default=30_000)
    p.add_argument("--rounds", type=int, default=5, help="changes refreshed (at least 2)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (printed)")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="mvtext-")
    try:
        return run(args, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def run(args, root: str) -> int:
    rng = np.random.default_rng(0)
    db = mv.connect(f"{root}/catalog", runner=mv.InlineRunner())
    t0 = time.perf_counter()
    facts = db.create_table("facts", pa.table({"id": np.arange(args.facts),
                                               "code": code(rng.integers(0, args.dims + args.dims // 10, args.facts)),
                                               "amount": rng.random(args.facts)}))
    dims = db.create_table("dims", pa.table({"code": code(np.arange(args.dims)),
                                             "name": [f"name-{i}" for i in range(args.dims)]}))
    views = {w: db.create_materialized_view(f"v_{w}", facts.search(None).join(dims, on="code")
                                            .select({"fid": "id", "name": "name", "s": score})) for w in "AB"}
    for v in views.values():
        v.refresh()
    print(f"facts {args.facts:,} x dims {args.dims:,}, text keys (set-up and first refreshes "
          f"{time.perf_counter() - t0:.1f} s; {root})", flush=True)
    times: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    wrong = False
    for rnd in range(max(2, args.rounds)):
        dims.update(where=f"code LIKE '%{rnd:02d}'",  # (1% of the dimensions: codes ending so)
                    values_sql={"name": "concat(name, '-u')"})
        for w, v in views.items():
            saved = arrangements.arranged_alike
            if w == "B":  # (a text key not arranged: probed by a filtered scan, as before)
                arrangements.arranged_alike = lambda a, b, alike=saved: alike(a, b) and not pa.types.is_string(a)
            try:
                t = time.perf_counter()
                r = v.refresh()
                wall = time.perf_counter() - t
            finally:
                arrangements.arranged_alike = saved
            timings = r.timings or {}
            plan = wall - timings.get("execute_s", 0.0) - timings.get("commit_s", 0.0)
            times[w].append((plan, wall))
            work = (r.details or {}).get("work") or {}
            arranged = (r.details or {}).get("arrangements") or {}
            ok = same(db, v)
            wrong |= not ok
            how = arranged.get("facts.code", {}).get("how", "none").split(" (")[0]
            print(f"  round {rnd} view {w} ({'key arranged' if w == 'A' else 'key scanned'}): plan {plan:.3f} s, "
                  f"refresh {wall:.3f} s; key rows scanned {work.get('key_rows_scanned', 0):,}, probe matches "
                  f"{work.get('probe_matches', 0):,}, UDF rows {r.udf_rows_computed.get('s', 0):,}; facts.code: {how}; "
                  f"oracle {'ok' if ok else 'DIFFERS'}", flush=True)
    print()
    for w in "AB":
        later = times[w][1:]
        print(f"view {w} ({'key arranged' if w == 'A' else 'key scanned'}): first change plan {times[w][0][0]:.3f} s "
              f"refresh {times[w][0][1]:.3f} s; later changes (median of {len(later)}) plan "
              f"{statistics.median(t[0] for t in later):.3f} s refresh {statistics.median(t[1] for t in later):.3f} s")
    a = statistics.median(t[1] for t in times["A"][1:])
    b = statistics.median(t[1] for t in times["B"][1:])
    print(f"a 1% dimension change, the key arranged / scanned: {a / b:.2f}x")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
