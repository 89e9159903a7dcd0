"""Checkpoints sized by time vs every N rows: prints ratios measured side by
side in one run (never asserted in tests).

1. Cheap vectorized UDF, full refresh of --rows rows: summed task time with
   time-sized checkpoints (default) / with a checkpoint every 8,192 rows (the
   old default). Goal: checkpointing costs a cheap UDF almost nothing.
2. Expensive scalar UDF (~2 ms per row): checkpoint files written while
   computing --slow-rows rows, and the UDF time between two saves (what a
   crash can lose), with MV_ASSETS_CHECKPOINT_SECONDS=0.5.

Usage: python bench/bench_checkpoints.py [--rows 1000000] [--slow-rows 2000]
"""

import argparse
import os
import shutil
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

import mv_assets as mv  # noqa: E402
from mv_assets.storage import objects  # noqa: E402


@mv.udf(data_type=pa.float64())
def scaled(x: pa.Array) -> pa.Array:
    return pc.add(pc.multiply(x, 2.0), 1.0)


def _files(db: mv.Connection, view: str) -> int:
    root = db.layout.batch_checkpoints(view)
    return sum(len(objects.listdir(os.path.join(root, d))) for d in objects.listdir(root))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--slow-rows", type=int, default=2000)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="mv_bench_ckpt_")
    try:
        db = mv.connect(os.path.join(root, "catalog"), runner=mv.InlineRunner())
        rng = np.random.default_rng(0)
        src = db.create_table("t", pa.table({"id": np.arange(args.rows), "x": rng.random(args.rows)}))
        out = {}
        for label, size in (("every 8192 rows", 8192), ("by time (default)", None)):
            best = None
            for i in range(3):
                name = f"v_{size or 'time'}_{i}"
                v = db.create_materialized_view(name, src.search(None).select({"id": "id", "y": scaled}))
                t0 = time.perf_counter()
                r = v.refresh(checkpoint_size=size)
                wall = time.perf_counter() - t0
                task = r.timings["task_s_total"]
                best = (task, wall) if best is None or task < best[0] else best
            out[label] = best
        print(f"\ncheckpoint benchmark: {args.rows:,} rows, cheap vectorized UDF, inline runner")
        for label, (task, wall) in out.items():
            print(f"  {label:20s} task time {task:6.3f} s   wall {wall:6.3f} s")
        print(f"  ratio by time / every 8192 rows (task time): "
              f"{out['by time (default)'][0] / out['every 8192 rows'][0]:.2f}")

        # expensive UDF: how often checkpoints are saved while it computes. The
        # UDF fails on the last row, so the refresh stops before its commit
        # (which would clear them) and the checkpoints written can be counted.
        os.environ["MV_ASSETS_CHECKPOINT_SECONDS"] = "0.5"
        last = args.slow_rows - 1

        @mv.udf
        def slow(id: int) -> int:
            time.sleep(0.002)
            if id == last:
                raise RuntimeError("stop before the commit")
            return id + 1

        slow_src = db.create_table("s", pa.table({"id": np.arange(args.slow_rows)}))
        v = db.create_materialized_view("sv", slow_src.search(None).select({"id": "id", "y": slow}))
        t0 = time.perf_counter()
        try:
            v.refresh()
        except Exception:
            pass
        udf_s = time.perf_counter() - t0
        files = _files(db, "sv")
        print(f"\nexpensive UDF: {args.slow_rows:,} rows x 2 ms ({udf_s:.1f} s), target 0.5 s per checkpoint")
        print(f"  checkpoints saved {files}, i.e. one per {udf_s / max(files, 1):.2f} s of UDF time "
              f"({args.slow_rows / max(files, 1):.0f} rows); every 8192 rows would have saved "
              f"{args.slow_rows // 8192} (a crash would lose up to {min(args.slow_rows, 8192) * 0.002:.0f} s)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
