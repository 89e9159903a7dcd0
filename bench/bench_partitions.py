"""A Dagster run covering every partition of a many-fragment source: prints
numbers measured side by side in one run.

The view ``v`` (``y = inc(x)``, one UDF column asset ``v/y``) is partitioned by
the fragments of ``src`` (2 rows per fragment). One run materializes both
assets for every partition, as "Materialize all" or a sensor catch-up does: the
run is created the way the daemon creates it (execution plan, planned events),
on a real SQLite Dagster instance (the default storage of ``dagster dev``).

Printed per structure: seconds to create the run (planned events), to execute
it, events written, and the partitions the asset's status shows materialized.

* per-partition planned events: Dagster's default (one planned event per asset
  and partition, written before the run starts);
* one planned event per asset: ``DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS=1``,
  set by ``mv_assets.dagster.devserver`` and ``make demo``.

Usage: python bench/bench_partitions.py [--fragments 10000] [--baseline-fragments 1000]
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

import dagster as dg  # noqa: E402
import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import mv_assets as mv  # noqa: E402
from mv_assets.dagster import MvAssetsResource, build_definitions  # noqa: E402
from mv_assets.dagster.definitions import partitions_def_name  # noqa: E402

SUBSET_ENV = "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"


@mv.udf
def inc(x: int) -> int:
    return x + 1


def catalog(path: str, n_frags: int) -> mv.Connection:
    db = mv.connect(path, runner=mv.InlineRunner())
    t = pa.table({"id": pa.array(np.arange(n_frags * 2, dtype=np.int64)), "x": pa.array(np.arange(n_frags * 2))})
    db.create_table("src", schema=t.schema)
    lance.write_dataset(t, db._table_uri("src"), mode="append", max_rows_per_file=2)
    db.create_materialized_view("v", db.open_table("src").search(None).select({"id": "id", "y": inc}))
    return db


def full_run(root: str, n_frags: int, subset_planned: bool) -> dict:
    label = f"{'subset' if subset_planned else 'per_partition'}_{n_frags}"
    db = catalog(os.path.join(root, f"cat_{label}"), n_frags)
    home = os.path.join(root, f"home_{label}")
    os.makedirs(home)
    if subset_planned:
        os.environ[SUBSET_ENV] = "1"
    else:
        os.environ.pop(SUBSET_ENV, None)
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    job = defs.resolve_implicit_global_asset_job_def()
    keys = [dg.AssetKey(["v"]), dg.AssetKey(["v", "y"])]
    with dg.DagsterInstance.from_config(home) as inst:
        parts = [str(f) for f in db.open_table("src").fragment_ids()]
        inst.add_dynamic_partitions(partitions_def_name("src"), parts)
        tags = {"dagster/asset_partition_range_start": parts[0], "dagster/asset_partition_range_end": parts[-1]}
        t0 = time.perf_counter()
        result = job.execute_in_process(instance=inst, tags=tags, asset_selection=keys, raise_on_error=True)
        total = time.perf_counter() - t0
        records = inst.get_records_for_run(result.run_id, limit=1_000_000).records
        kinds: dict[str, int] = {}
        for r in records:
            if r.event_log_entry.dagster_event is not None:
                name = r.event_log_entry.dagster_event.event_type_value
                kinds[name] = kinds.get(name, 0) + 1
        stamps = [r.event_log_entry.timestamp for r in records]
        start = next(
            r.event_log_entry.timestamp for r in records
            if r.event_log_entry.dagster_event is not None and r.event_log_entry.dagster_event.event_type == dg.DagsterEventType.RUN_START
        )
        materialized = {
            k.to_user_string(): len(inst.get_materialized_partitions(k)) for k in keys
        }
        rows = db.open_table("v").count_rows()
    return {
        "total": total, "create": start - stamps[0], "execute": stamps[-1] - start, "events": len(records),
        "planned": kinds.get(dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED.value, 0),
        "materializations": kinds.get(dg.DagsterEventType.ASSET_MATERIALIZATION.value, 0), "materialized": materialized, "rows": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fragments", type=int, default=10_000)
    ap.add_argument("--baseline-fragments", type=int, default=1_000)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="mv_bench_partitions_")
    runs = {}
    for n in sorted({args.baseline_fragments, args.fragments}):
        for subset in (False, True):
            if not subset and n > args.baseline_fragments:
                continue  # the default structure is measured at the baseline size only (it is the slow one)
            r = full_run(root, n, subset)
            runs[(n, subset)] = r
            print(f"{n} fragments, {'one planned event per asset' if subset else 'planned per partition'}: {r}", flush=True)
    print(f"\nmv_assets: a Dagster run over every partition (2 assets, SQLite instance, {os.cpu_count()} cores)")
    print(f"{'fragments':>9}  {'planned events':<22} {'create':>8} {'execute':>8} {'total':>8} {'events':>7}  per partition")
    for (n, subset), r in sorted(runs.items()):
        what = "one per asset" if subset else "one per partition"
        print(
            f"{n:>9,}  {what:<22} {r['create']:7.1f}s {r['execute']:7.1f}s {r['total']:7.1f}s {r['events']:>7,}"
            f"  {1000 * r['total'] / n:6.1f} ms   materialized {r['materialized']}"
        )
    b, s = runs.get((args.baseline_fragments, False)), runs.get((args.baseline_fragments, True))
    if b and s:
        print(f"ratio at {args.baseline_fragments:,} fragments, one planned event per asset / per partition: "
              f"{s['total'] / b['total']:.2f}")
    big = runs.get((args.fragments, True))
    if big:
        print(f"{args.fragments:,} fragments, full run: {big['total']:.0f} s (goal <= 300 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
