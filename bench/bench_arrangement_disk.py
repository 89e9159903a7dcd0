"""A join view refreshed by a process of its own (a Dagster run, the Pipes
process): with the arrangements an earlier process kept on disk, against
loading them from the view, side by side in one run.

    python bench/bench_arrangement_disk.py                  # 10M x 100k
    python bench/bench_arrangement_disk.py --facts 1000000 --dims 10000

The view is bench_join's (facts ⋈ dims, INNER, the scalar ``@udf``). After
its first refresh and a first incremental one (which loads the arrangements
and writes their copies), each round changes 0.1% of the dimension rows in a
column the UDF reads and refreshes as a new process would: the arrangements
dropped from memory (``forget(disk=False)``), then either read from the
copies on disk (``MV_ASSETS_ARRANGEMENT_DIR`` set) or loaded from the view
(set empty). The two alternate, which runs first flipping each round; medians
of ``--repeat`` rounds of each, the ratio printed with the goal beside it
(nothing asserted on time). Every refresh is checked against the oracle
(DuckDB's join of the sources at the view's versions, bench_join's); the exit
status is 1 when one differs.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_join as bj  # noqa: E402

import mv_assets as mv  # noqa: E402
from mv_assets.api.catalog import keep_arrangements_on_disk  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--facts", type=int, default=10_000_000)
    p.add_argument("--dims", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3, help="rounds of each side (medians)")
    args = p.parse_args()
    from mv_assets.ops import arrangements  # (the bench reads what the engine keeps; users never need to)

    copies = tempfile.mkdtemp(prefix="mv-arrangement-copies-")
    os.environ["MV_ASSETS_ARRANGEMENT_DIR"] = copies
    keep_arrangements_on_disk(copies)
    rng = np.random.default_rng(0)
    root = tempfile.mkdtemp(prefix="mv-arrdisk-")
    db = mv.connect(f"{root}/catalog", runner=mv.InlineRunner())
    facts = db.create_table("facts", bj.make_facts(rng, 0, args.facts, args.dims))
    dims = db.create_table("dims", bj.make_dims(args.dims))
    view = db.create_materialized_view("v", bj.view_query(facts, dims, "inner+s"))
    view.refresh()
    wrong = False
    step = [0]

    def refresh(use_copies: bool) -> tuple[float, float, dict]:
        nonlocal wrong
        step[0] += 1
        dims.update(where=f"id % 1000 = {step[0] % 1000}", values_sql={"name": f"concat(name, '-{step[0]}')"})
        arrangements.forget(disk=False)  # (a new process keeps none)
        os.environ["MV_ASSETS_ARRANGEMENT_DIR"] = copies if use_copies else ""
        t = time.perf_counter()
        r = view.refresh()
        wall = time.perf_counter() - t
        os.environ["MV_ASSETS_ARRANGEMENT_DIR"] = copies
        if not bj.matches_oracle(view, bj.oracle(db, view, "inner+s")):
            wrong = True
            print(f"  round {step[0]}: the view differs from its oracle", flush=True)
        return wall, wall - r.timings["execute_s"] - r.timings["commit_s"], r.details.get("arrangements", {})

    _, _, first = refresh(True)  # (loads them, and writes the copies)
    print(f"facts {args.facts:,} x dims {args.dims:,}; first incremental refresh: "
          + "; ".join(f"{k} {i['how']} {i['seconds']:.3f} s, copy written in {i.get('saved_s', 0):.3f} s"
                      for k, i in first.items()), flush=True)
    walls: dict[bool, list[float]] = {True: [], False: []}
    plans: dict[bool, list[float]] = {True: [], False: []}
    for rnd in range(args.repeat):
        for use in ((True, False) if rnd % 2 == 0 else (False, True)):
            wall, plan, info = refresh(use)
            walls[use].append(wall)
            plans[use].append(plan)
            print(f"  {'copies on disk' if use else 'loaded        '}  refresh {wall:.3f} s (plan {plan:.3f} s): "
                  + "; ".join(f"{k} {i['how'][:70]}" for k, i in info.items()), flush=True)
    with_copies, loading = statistics.median(walls[True]), statistics.median(walls[False])
    print(f"refresh in a new process, 0.1% of the dimension rows changed: with the copies {with_copies:.3f} s "
          f"(plan {statistics.median(plans[True]):.3f}), loading them {loading:.3f} s "
          f"(plan {statistics.median(plans[False]):.3f}): {with_copies / loading:.2f}x (goal < 1x)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
