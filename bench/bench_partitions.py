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
       [--storage sqlite postgres postgres-batched]
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
from mv_assets.dagster.storage import BATCH_SIZE, sqlite_storage_yaml  # noqa: E402

SUBSET_ENV = "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"
# Dagster stores a run's materializations in batches of this many events where
# the storage can (Postgres: one INSERT a batch; Dagster's SQLite storage one by
# one whatever the setting, mv_assets.dagster.storage's in one transaction)
BATCH_ENV = "DAGSTER_EVENT_BATCH_SIZE"


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


def postgres_home(home: str, pg, name: str) -> None:
    """A Dagster home whose runs, events and schedules are in a database of
    the server ``pg`` (dagster-postgres)."""
    pg.create_database(name)
    with open(os.path.join(home, "dagster.yaml"), "w") as f:
        f.write(
            "storage:\n  postgres:\n    postgres_db:\n      username: postgres\n      password: ''\n"
            f"      hostname: 127.0.0.1\n      port: {pg.port}\n      db_name: {name}\n"
            "      scheme: postgresql+psycopg2\n"
        )


def full_run(root: str, n_frags: int, subset_planned: bool, storage: str = "sqlite", pg=None) -> dict:
    label = f"{'subset' if subset_planned else 'per_partition'}_{n_frags}_{storage.replace('-', '_')}"
    db = catalog(os.path.join(root, f"cat_{label}"), n_frags)
    home = os.path.join(root, f"home_{label}")
    os.makedirs(home)
    if storage.startswith("postgres"):
        postgres_home(home, pg, label)
    elif storage == "sqlite-batched":  # what make demo and mv_assets.dagster.devserver write
        with open(os.path.join(home, "dagster.yaml"), "w") as f:
            f.write(sqlite_storage_yaml(home))
    if storage.endswith("-batched"):
        os.environ[BATCH_ENV] = str(BATCH_SIZE)
    else:
        os.environ.pop(BATCH_ENV, None)
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
    ap.add_argument(
        "--storage", nargs="+", default=["sqlite"], choices=["sqlite", "sqlite-batched", "postgres", "postgres-batched"],
        help="Dagster instance storages to compare (sqlite: Dagster's default; postgres: a throw-away server of "
        f"Debian's postgresql; -batched: with {BATCH_ENV}={BATCH_SIZE}, and on SQLite mv_assets.dagster.storage's "
        "event log, as make demo has it)",
    )
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="mv_bench_partitions_")
    pg = None
    if any(s != "sqlite" for s in args.storage):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from postgres_server import PostgresServer

        pg = PostgresServer()
    runs = {}
    try:
        for storage in args.storage:
            for n in sorted({args.baseline_fragments, args.fragments}):
                for subset in (False, True):
                    if not subset and (n > args.baseline_fragments or storage != "sqlite"):
                        continue  # the default structure is measured at the baseline size on SQLite only (the slow one)
                    r = full_run(root, n, subset, storage, pg)
                    runs[(storage, n, subset)] = r
                    what = "one planned event per asset" if subset else "planned per partition"
                    print(f"{storage}, {n} fragments, {what}: {r}", flush=True)
    finally:
        if pg is not None:
            pg.stop()
    print(f"\nmv_assets: a Dagster run over every partition (2 assets, {os.cpu_count()} cores)")
    print(f"{'storage':<17} {'fragments':>9}  {'planned events':<18} {'create':>8} {'execute':>8} {'total':>8} {'events':>7}  per partition")
    for (storage, n, subset), r in runs.items():
        what = "one per asset" if subset else "one per partition"
        print(
            f"{storage:<17} {n:>9,}  {what:<18} {r['create']:7.1f}s {r['execute']:7.1f}s {r['total']:7.1f}s {r['events']:>7,}"
            f"  {1000 * r['total'] / n:6.1f} ms   materialized {r['materialized']}"
        )
    b, s = runs.get(("sqlite", args.baseline_fragments, False)), runs.get(("sqlite", args.baseline_fragments, True))
    if b and s:
        print(f"ratio at {args.baseline_fragments:,} fragments, one planned event per asset / per partition: "
              f"{s['total'] / b['total']:.2f}")
    for storage in args.storage:
        big = runs.get((storage, args.fragments, True))
        if big:
            print(f"{storage}: {args.fragments:,} fragments, full run: {big['total']:.0f} s")
    sq = runs.get(("sqlite", args.fragments, True))
    for storage in args.storage:
        other = runs.get((storage, args.fragments, True))
        if sq and other and storage != "sqlite":
            print(f"{storage} / sqlite at {args.fragments:,} fragments: {other['total'] / sq['total']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
