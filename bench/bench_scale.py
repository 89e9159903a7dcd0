"""Scale benchmark: many small fragments and planning memory, side by side.

1. A source of 2,000 fragments of 50 rows (no UDF): first refresh with small
   fragments packed into tasks by rows / one task per fragment (what packing
   replaced, forced with max_rows_per_task=50): task count, view fragments,
   seconds, inline and on Spark; then a no-op refresh over the resulting view.
2. Driver memory of planning a first refresh at 1M and 10M rows: peak RSS
   growth while planning (sampled every 5 ms, in a fresh process per case) of
   the streamed plan (a fragment at a time) / the id-set plan (every source
   row id, address and version held at once), as bytes per source row.

Usage: python bench/bench_scale.py [--sizes 1000000,10000000] [--master local[2]] [--skip-spark] [--skip-memory]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import mv_assets as mv  # noqa: E402


def small_fragments(db, n_frag: int, rows: int):
    t = db.create_table("src", pa.table({"id": np.arange(rows, dtype=np.int64), "x": np.arange(rows, dtype=np.int64)}))
    for k in range(1, n_frag):
        lo = k * rows
        lance.write_dataset(
            pa.table({"id": np.arange(lo, lo + rows, dtype=np.int64), "x": np.arange(lo, lo + rows, dtype=np.int64)}),
            t.uri, mode="append",
        )
    return t


def many_fragments(runner, label: str, n_frag: int = 2000, rows: int = 50) -> None:
    root = tempfile.mkdtemp(prefix="mv_scale_")
    try:
        db = mv.connect(os.path.join(root, "cat"), runner=runner)
        warm = db.create_table("warm", [{"id": 1}])  # start the engine (JVM, workers) outside the timings
        db.create_materialized_view("warm_v", warm.search(None)).refresh()
        t = small_fragments(db, n_frag, rows)
        out = {}
        for name, per_task in (("packed", 131_072), ("per-fragment", rows // 2)):
            v = db.create_materialized_view(name, t.search(None).where("x % 2 = 0").select({"id": "id", "x": "x"}))
            t0 = time.perf_counter()
            r = v.refresh(max_rows_per_task=per_task)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            v.refresh()
            noop = time.perf_counter() - t0
            out[name] = (r.tasks, len(lance.dataset(v.uri).get_fragments()), first, noop, r.timings.get("compact_s", 0.0))
        p, f = out["packed"], out["per-fragment"]
        print(f"[{label}] {n_frag} fragments x {rows} rows, filter keeps half:")
        for label_, x in (("packed:      ", p), ("per-fragment:", f)):
            print(
                f"  {label_} {x[0]:5d} tasks, first refresh {x[2]:6.2f} s (of which compacting the view "
                f"{x[4]:.2f} s), then {x[1]} view fragment(s), no-op refresh {x[3]:.3f} s"
            )
        print(f"  ratio packed/per-fragment: first refresh {p[2] / f[2]:.3f}, no-op {p[3] / f[3]:.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


_CHILD = r"""
import json, os, sys, threading, time
os.environ.setdefault("LANCE_LOG", "error")
import mv_assets as mv
from mv_assets.ops import refresh as R

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

db = mv.connect(sys.argv[1], runner=mv.InlineRunner())
v = db.open_table(sys.argv[3])
how = sys.argv[2]
peak = [0]
stop = threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], rss()); time.sleep(0.005)
base = rss()
th = threading.Thread(target=sample); th.start()
t0 = time.perf_counter()
if how == "streamed":
    plan = v.plan_refresh()
    n = plan.rows_to_insert
else:  # the id-set plan: every passing row id, address and version at once
    src = db.open_table("src")._dataset()
    vk = v._dataset().to_table(columns=["__source_row_id", "__source_row_version"], with_row_address=True)
    keys, rows, _ = R._changed_rows(src, src.uri, v.definition, "sync", None, src.version, None, None, vk, [], None)
    pieces = R.pieces_from_rows(R._ids(rows, "_rowaddr"), R._ids(rows), 131072)
    tasks = R.pack_pieces(pieces, 131072)
    n = len(keys.insert)
secs = time.perf_counter() - t0
stop.set(); th.join()
print(json.dumps({"rows": n, "peak_growth": max(peak[0], rss()) - base, "seconds": secs}))
"""


def planning_memory(size: int) -> None:
    root = tempfile.mkdtemp(prefix="mv_mem_")
    try:
        db = mv.connect(os.path.join(root, "cat"), runner=mv.InlineRunner())
        chunk = 1_000_000
        t = None
        for lo in range(0, size, chunk):
            n = min(chunk, size - lo)
            data = pa.table({"id": np.arange(lo, lo + n, dtype=np.int64), "x": np.arange(lo, lo + n, dtype=np.int64)})
            if t is None:
                t = db.create_table("src", data)
            else:
                lance.write_dataset(data, t.uri, mode="append")
        db.create_materialized_view("v", t.search(None).where("x % 10 != 3").select({"id": "id", "x": "x"}))
        res = {}
        for how in ("streamed", "id-set"):
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, db.uri, how, "v"], capture_output=True, text=True, check=True
            )
            res[how] = json.loads(out.stdout.strip().splitlines()[-1])
        s, i = res["streamed"], res["id-set"]
        assert s["rows"] == i["rows"], (s, i)
        print(f"[memory] first refresh plan of {size:,} source rows ({s['rows']:,} pass the filter):")
        for name, r in (("streamed", s), ("id-set", i)):
            print(
                f"  {name:9s} peak driver growth {r['peak_growth'] / 2**20:8.1f} MiB "
                f"({r['peak_growth'] / size:6.1f} B/row), {r['seconds']:.2f} s"
            )
        print(f"  ratio streamed/id-set peak memory: {s['peak_growth'] / max(i['peak_growth'], 1):.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--skip-spark", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    many_fragments(mv.InlineRunner(), "inline")
    if not args.skip_spark:
        runner = mv.SparkRunner(master=args.master, local_below_rows=0)  # every refresh a Spark job
        many_fragments(runner, f"spark {args.master}")
        runner.stop()
    for size in () if args.skip_memory else (int(x) for x in args.sizes.split(",")):
        planning_memory(size)


if __name__ == "__main__":
    main()
