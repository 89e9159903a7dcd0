"""Small refreshes never pay a Spark job: prints, side by side in one run, the
wall time of small incremental refreshes with the default automatic choice
(driver-local when the estimated work is small) and forced onto Spark (a warm
local Spark session, start-up excluded), plus the path each one took.

Usage: python bench/bench_small_refresh.py [--rows 200000] [--append 1000] [--master local[2]]
"""

import argparse
import os
import shutil
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import mv_assets as mv  # noqa: E402


@mv.udf
def model_score(x: float) -> float:
    """Stands in for a model call: ~20 microseconds of Python per row."""
    acc = x
    for k in range(60):
        acc = (acc * 1.0001 + k) % 997.0
    return acc


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": np.arange(start, start + n), "x": np.random.default_rng(start).random(n)})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--append", type=int, default=1000)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="mv_bench_small_")
    auto = mv.SparkRunner(master=args.master)                   # the default choice
    forced = mv.SparkRunner(master=args.master, local_below_rows=0)  # always a Spark job
    try:
        db = mv.connect(os.path.join(root, "catalog"), runner=forced)
        src = db.create_table("t", rows(0, args.rows))
        v = db.create_materialized_view("v", src.search(None).select({"id": "id", "s": model_score}))
        first = v.refresh()  # on Spark (also warms the session); measures the cost per row
        print(f"\nsmall refresh benchmark: {args.rows:,} rows, +{args.append:,} per refresh, Spark {args.master}")
        print(f"  first refresh {first.seconds:.2f} s on {first.runner}; measured "
              f"{v.refresh_state().seconds_per_row * 1e6:.1f} us/row")
        results: dict[str, list] = {"auto": [], "spark job": []}
        start = args.rows
        for _ in range(3):
            for label, runner in (("auto", auto), ("spark job", forced)):
                src.add(rows(start, args.append))
                start += args.append
                t0 = time.perf_counter()
                r = v.refresh(runner=runner)
                results[label].append((time.perf_counter() - t0, r.runner, r.udf_rows_computed.get("s", 0)))
        for label, rs in results.items():
            best = min(rs)
            print(f"  {label:10s} best {best[0]:.3f} s  path {best[1]:20s} rows computed {best[2]}")
        print(f"  ratio auto / spark job: {min(results['auto'])[0] / min(results['spark job'])[0]:.2f}"
              f"  (Spark session started by auto: {auto.started})")
        # a no-op refresh reads versions and state only: O(1) in the view's size
        small = db.create_table("small", rows(0, 1000))
        sv = db.create_materialized_view("sv", small.search(None).select({"id": "id", "x": "x"}))
        sv.refresh(runner=mv.InlineRunner())
        v.refresh(runner=auto)
        noop = {}
        for name, view in (("1k-row view", sv), (f"{v.count_rows():,}-row view", v)):
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                r = view.refresh(runner=auto)
                times.append(time.perf_counter() - t0)
                assert r.runner == "none"
            noop[name] = min(times)
        (a_name, a_s), (b_name, b_s) = noop.items()
        print(f"  no-op refresh: {a_name} {a_s * 1000:.1f} ms, {b_name} {b_s * 1000:.1f} ms (ratio {b_s / a_s:.2f})")
    finally:
        auto.stop()
        forced.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
