"""A model column refreshed on Spark, again right away and again after a pause
longer than a minute: with Spark's own Python daemon, and with mv_assets'
(``spark.python.daemon.module = mv_assets.execution.daemon``), side by side in
one run.

Spark's executors close every idle Python worker once they have started none
for a minute (a fixed limit), and a closed worker exits: the next refresh sets
the model up again in fresh workers. mv_assets' daemon parks those workers and
hands them the executor's next connections, with their models.

The model stands in for a real one's set-up (a torch import, a CUDA context, a
weights load: 3.7 s per process on the H100 machine, docs/performance.md):
``--setup-s`` seconds of CPU, then weights; each batch is a matmul. Per
configuration and refresh: wall seconds, the set-up's task-seconds (the
engine's stage timings, summed over tasks), and the workers that ran tasks
(pids) new to that refresh. The values are checked against numpy's on the
source after every refresh.

Usage: python bench/bench_worker_keep.py [--rows 200000] [--dim 64] [--setup-s 3]
           [--idle 75] [--master local[2]]
"""

import argparse
import os
import shutil
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")
os.environ["MV_ASSETS_STAGE_TIMINGS"] = "1"

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import mv_assets as mv  # noqa: E402
from mv_assets.execution.spark import SparkRunner  # noqa: E402

PIDS_ENV = "BENCH_PIDS_DIR"


@mv.udf(data_type=pa.list_(pa.float32(), 32), batch_size=8192, version="bench-worker-keep")
class Model:
    """Set-up: ``$BENCH_SETUP_S`` seconds of CPU, then the weights. Call: a matmul."""

    def __init__(self) -> None:
        until = time.process_time() + float(os.environ["BENCH_SETUP_S"])
        while time.process_time() < until:
            pass
        self.w = np.random.default_rng(0).random((int(os.environ["BENCH_DIM"]), 32), dtype=np.float32)

    def __call__(self, v: pa.Array) -> pa.Array:
        open(os.path.join(os.environ[PIDS_ENV], str(os.getpid())), "a").close()
        x = v.flatten().to_numpy(zero_copy_only=False).reshape(len(v), -1)
        return pa.FixedSizeListArray.from_arrays(pa.array((x @ self.w).ravel()), 32)


def _rows(rng, start: int, n: int, dim: int) -> pa.Table:
    x = rng.random((n, dim), dtype=np.float32)
    return pa.table({"id": np.arange(start, start + n), "v": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), dim)})


def _check(view, src, dim: int) -> None:
    got = view.to_arrow().sort_by("id")
    want = src.to_arrow().sort_by("id")
    assert got.column("id").equals(want.column("id")), "rows differ"
    x = want.column("v").combine_chunks().values.to_numpy().reshape(len(want), dim)
    w = np.random.default_rng(0).random((dim, 32), dtype=np.float32)
    y = got.column("y").combine_chunks().values.to_numpy().reshape(len(got), 32)
    np.testing.assert_allclose(y, x @ w, rtol=1e-5)


def _workers(d: str) -> set[int]:
    pids = {int(n) for n in os.listdir(d)}
    for n in os.listdir(d):
        os.remove(os.path.join(d, n))
    return pids


def run(config: str, keep: float, args, root: str) -> list[tuple[str, float, float, int]]:
    pids_dir = os.path.join(root, f"pids-{config}")
    os.makedirs(pids_dir)
    os.environ[PIDS_ENV] = pids_dir
    runner = SparkRunner(master=args.master, local_below_rows=0, keep_workers_seconds=keep,
                         forward_env=["MV_ASSETS_STAGE_TIMINGS", PIDS_ENV, "BENCH_SETUP_S", "BENCH_DIM"])
    out = []
    seen: set[int] = set()
    try:
        db = mv.connect(os.path.join(root, f"catalog-{config}"), runner=runner)
        rng = np.random.default_rng(1)
        half = args.rows // 2
        src = db.create_table("src", _rows(rng, 0, half, args.dim))
        src.add(_rows(rng, half, half, args.dim))
        view = db.create_materialized_view("v", src.search(None).select({"id": "id", "y": Model}))
        runner.session()  # the JVM's start is not the refresh's
        start = args.rows
        for label, idle in (("first refresh", 0.0), ("right after", 0.0), (f"after {args.idle:g} s idle", args.idle)):
            time.sleep(idle)
            if label != "first refresh":
                src.add(_rows(rng, start, half, args.dim))
                src.add(_rows(rng, start + half, half, args.dim))
                start += args.rows
            t0 = time.perf_counter()
            result = view.refresh()
            wall = time.perf_counter() - t0
            _check(view, src, args.dim)
            workers = _workers(pids_dir)
            out.append((label, wall, result.timings.get("stage_setup_s", 0.0), len(workers - seen)))
            seen |= workers
    finally:
        runner.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--setup-s", type=float, default=3.0)
    ap.add_argument("--idle", type=float, default=75.0)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    os.environ["BENCH_SETUP_S"] = str(args.setup_s)
    os.environ["BENCH_DIM"] = str(args.dim)
    root = tempfile.mkdtemp(prefix="bench-keep-")
    try:
        configs = {"Spark's daemon": 0.0, "mv_assets' daemon": 900.0}
        results = {name: run(name.split("'")[0].strip().lower().replace(" ", "-"), keep, args, root)
                   for name, keep in configs.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{args.rows:,} rows x {args.dim} float32 per refresh, model set-up {args.setup_s:g} CPU-s per process, "
          f"{args.master}; values checked after every refresh")
    print(f"| refresh | {' | '.join(f'{n}: wall / set-up task-s / new workers' for n in results)} | speed-up |")
    print("|---|---|---|---|")
    names = list(results)
    for i, (label, *_rest) in enumerate(results[names[0]]):
        cells = [f"{results[n][i][1]:.2f} s / {results[n][i][2]:.2f} / {results[n][i][3]}" for n in names]
        ratio = results[names[0]][i][1] / results[names[1]][i][1]
        print(f"| {label} | {' | '.join(cells)} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
