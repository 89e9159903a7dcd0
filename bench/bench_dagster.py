"""Dagster-layer benchmark: prints numbers measured side by side in one run.

1. Sensor tick time with 10,000 source fragments (goal <= 2 s): first tick
   (adds 10k partitions) and a steady-state tick after a one-fragment append.
2. Per-run overhead for each Spark mode: a fresh process materializing one
   partition of a small view, as Dagster's run launcher does per run:
   inline (no Spark), local JVM, Spark Connect (long-lived server), and Spark
   Connect with small refreshes (<= 100k rows) run on the driver.
3. One-fragment append -> view updated through a real `dagster dev` sensor,
   wall time beyond the sensor interval (goal <= 5 s), per Spark mode.

Usage: python bench/bench_dagster.py [--fragments 10000] [--skip-dev]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

import dagster as dg  # noqa: E402
import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import mv_assets as mv  # noqa: E402
from mv_assets.dagster import build_definitions  # noqa: E402
from mv_assets.dagster.definitions import partitions_def_name  # noqa: E402
from mv_assets.dagster.devserver import dagster_dev  # noqa: E402
from mv_assets.execution import connect_server  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@mv.udf
def inc(x: int) -> int:
    return x + 1


def sensor_ticks(n_frags: int, root: str) -> tuple[float, float]:
    db = mv.connect(os.path.join(root, "frags"), runner=mv.InlineRunner())
    t = pa.table({"id": pa.array(np.arange(n_frags * 2, dtype=np.int64)), "x": pa.array(np.arange(n_frags * 2))})
    db.create_table("src", schema=t.schema)
    lance.write_dataset(t, db._table_uri("src"), mode="append", max_rows_per_file=2)
    src = db.open_table("src")
    db.create_materialized_view("v", src.search(None).select({"id": "id", "y": inc}))
    defs = build_definitions(db)
    sensor = defs.get_repository_def().get_sensor_def("src_changes")
    with dg.instance_for_test() as instance:
        t0 = time.perf_counter()
        with dg.build_sensor_context(instance=instance, cursor=None, definitions=defs, resources=defs.resources) as ctx:
            r = sensor(ctx)
        first = time.perf_counter() - t0
        for req in r.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        assert len(instance.get_dynamic_partitions(partitions_def_name("src"))) == n_frags
        src.add([{"id": 10**9, "x": 1}])
        t0 = time.perf_counter()
        with dg.build_sensor_context(instance=instance, cursor=r.cursor, definitions=defs, resources=defs.resources) as ctx:
            r = sensor(ctx)
        steady = time.perf_counter() - t0
        assert len(r.run_requests) == 1
    return first, steady


def small_catalog(path: str) -> mv.Connection:
    db = mv.connect(path, runner=mv.InlineRunner())
    src = db.create_table("events", [{"id": i, "x": i} for i in range(100)], primary_key="id")
    db.create_materialized_view("ev", src.search(None).select({"id": "id", "y": inc}))
    return db


RUN_SCRIPT = """
import os, sys, time
t0 = time.perf_counter()
import dagster as dg
from mv_assets.dagster import MvAssetsResource, build_definitions
from mv_assets.dagster.definitions import partitions_def_name
uri, mode, part = sys.argv[1], sys.argv[2], sys.argv[3]
res = MvAssetsResource(catalog_uri=uri, runner="inline" if mode == "inline" else "spark",
                       spark_master="local[2]",
                       spark_remote=os.environ.get("BENCH_REMOTE") if mode.startswith("connect") else None,
                       local_below_rows=100_000 if mode.endswith("small-local") else 0)
defs = build_definitions(uri, resource=res)
assets = [defs.get_repository_def().assets_defs_by_key[dg.AssetKey(["ev"])]]
with dg.instance_for_test() as inst:
    inst.add_dynamic_partitions(partitions_def_name("events"), [part])
    assert dg.materialize(assets, instance=inst, partition_key=part, tags={"mv_assets/scope": "changes"}).success
print(time.perf_counter() - t0)
"""


def run_overhead(root: str, mode: str, remote: str | None, label: str = "") -> float:
    db = small_catalog(os.path.join(root, f"run_{mode.replace('+', '_')}{label}"))
    src = db.open_table("events")
    part = str(lance.dataset(src.uri).get_fragments()[0].fragment_id)
    env = {**os.environ, "BENCH_REMOTE": remote or ""}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", RUN_SCRIPT, db.uri, mode, part], check=True, env=env, capture_output=True)
    return time.perf_counter() - t0


def sensor_latency(root: str, mode: str, remote: str | None, interval: int = 2, immediate: bool = True) -> float:
    """Append one fragment; seconds until the view reflects it, minus the interval."""
    label = mode.replace("+", "_") + ("" if immediate else "_queued")
    db = small_catalog(os.path.join(root, f"dev_{label}"))
    src, view = db.open_table("events"), db.open_table("ev")
    env = {
        "MV_ASSETS_DB": db.uri,
        "MV_ASSETS_SENSOR_INTERVAL": str(interval),
        "MV_ASSETS_SPARK_MASTER": "local[2]",
    }
    if mode.startswith("connect"):
        env["MV_ASSETS_SPARK_REMOTE"] = remote
    if mode.endswith("small-local"):
        env["MV_ASSETS_LOCAL_BELOW_ROWS"] = "100000"
    with dagster_dev(
        os.path.join(ROOT, "workspace.yaml"), os.path.join(root, f"home_{label}"), env,
        os.path.join(root, f"dev_{label}.log"), immediate_runs=immediate,
    ):
        deadline = time.time() + 300
        while view.refresh_state().source_version != src.version:  # the first sensor run catches up
            if time.time() > deadline:
                raise RuntimeError("dagster dev never refreshed the view")
            time.sleep(0.5)
        time.sleep(interval + 1)
        src.add([{"id": 10_000, "x": 1}])
        target, t0 = src.version, time.perf_counter()
        while view.refresh_state().source_version != target:
            if time.perf_counter() - t0 > 300:
                raise RuntimeError("the sensor-driven refresh did not happen")
            time.sleep(0.2)
        return time.perf_counter() - t0 - interval


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fragments", type=int, default=10_000)
    ap.add_argument("--skip-dev", action="store_true", help="skip the dagster dev latency measurement")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="mv_bench_dagster_")
    first, steady = sensor_ticks(args.fragments, root)
    print(f"sensor ticks at {args.fragments} fragments: first {first:.2f} s, steady {steady:.2f} s", flush=True)
    remote = connect_server.start(state_dir=os.path.join(root, "spark-connect"))
    try:
        run_overhead(root, "connect", remote, "_warmup")  # warm the server's Python workers once
        modes = ("inline", "local", "connect", "connect+small-local")
        overheads = {m: run_overhead(root, m, remote) for m in modes}
        latency = {}
        if not args.skip_dev:
            for m in ("connect", "connect+small-local", "local"):
                latency[m] = sensor_latency(root, m, remote)
            latency["connect+small-local, run queue"] = sensor_latency(root, "connect+small-local", remote, immediate=False)
    finally:
        connect_server.stop(state_dir=os.path.join(root, "spark-connect"))
    print(f"\nmv_assets Dagster benchmark ({os.cpu_count()} cores)")
    print(f"1. sensor tick with {args.fragments:,} source fragments (goal <= 2 s)")
    print(f"   first tick (adds every partition): {first:.2f} s")
    print(f"   tick after a one-fragment append:  {steady:.2f} s")
    print("2. per-run overhead: fresh process materializing one partition (like a Dagster run)")
    for m, s in overheads.items():
        print(f"   {m:<20} {s:6.2f} s   ({s / overheads['inline']:.1f}x inline)")
    if latency:
        print("3. one-fragment append -> view updated via dagster dev sensor, beyond the 2 s interval (goal <= 5 s);")
        print("   runs launched immediately (DefaultRunCoordinator) unless marked 'run queue'")
        for m, s in latency.items():
            print(f"   {m:<32} {s:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
