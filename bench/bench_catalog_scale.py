"""Catalogs that grow: what sensors, the status and the definitions load cost
with N source tables (one view each), on local disk and on an S3 server
(moto's, on 127.0.0.1, behind a counting proxy: requests are counted exactly;
each costs far less there than on a real object store, so read the counts).

    python bench/bench_catalog_scale.py                     # N = 10 100, local and S3
    python bench/bench_catalog_scale.py --sizes 10 100 300 1000 --stores local
    python bench/bench_catalog_scale.py --compare /path/to/older/checkout
    python bench/bench_catalog_scale.py --fragments 1000 10000      # one table of many fragments

Per N it prints: the idle tick of one sensor (seconds, requests), a tick after
an append to its table, every sensor once, db.status() (in the process that
ticked the sensors), the definitions load (build_definitions in a fresh
process: first with no summaries of the catalog, ``cold``, then a second
and a third time with what the loads before remembered, storage.summaries) and ``mv-assets status`` (the CLI, in
a fresh process). ``--compare`` runs the same
measurements with another checkout's mv_assets (PYTHONPATH) on the same
machine, one after the other, and prints both side by side with ratios.

``--s3-list indexed``: the S3 server answers a LIST from the keys under its
prefix (tests/moto_indexed.py) instead of filtering every key of the bucket as
moto does: an object store's LIST by prefix does not grow with the bucket, and
at N = 1,000 the bucket holds ~30,000 keys. The requests are the same.

``--fragments N...``: one table of N 2-row fragments (written with one Append)
and a view over it, local disk, in this process: the first sensor tick (its
partition requests and observations, applied as the daemon does) plus the run
it starts, a tick after an append and its run, and a one-fragment run, with
the events each wrote; on Dagster's SQLite storage as it comes and as ``make
demo`` sets it up (``--dagster-storage sqlite batched``: mv_assets' event log
writing a run's materializations in batches, mv_assets.dagster.storage).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")


# the sensor daemon's threads in the dagster.yaml of make demo and the devserver
# (mv_assets.dagster.devserver.SENSOR_THREADS_YAML)
SENSOR_WORKERS = 8


def _build(uri: str, n: int, options: dict | None) -> None:
    import mv_assets as mv

    db = mv.connect(uri, storage_options=options, runner=mv.InlineRunner())
    have = set(db.table_names())
    for i in range(n):
        if f"t{i}" in have:
            continue
        t = db.create_table(f"t{i}", [{"id": j, "x": j} for j in range(3)], primary_key="id")
        db.create_materialized_view(f"v{i}", t.search(None).where("x >= 0").select({"id": "id", "x": "x"})).refresh()


def _build_by_upload(uri: str, n: int, s3, local: str | None = None) -> str:
    """The catalog of :func:`_build` on the S3 server, written on local disk
    (or the one at ``local``, built so before) and its files uploaded as they
    are (Lance's paths inside a dataset are relative; the catalog is the same
    bytes), concurrently: building 100 tables through the S3 server takes ~6
    minutes, 1,000 an hour. Returns the local catalog."""
    from concurrent.futures import ThreadPoolExecutor

    if local is None:
        local = os.path.join(tempfile.mkdtemp(prefix="mvscale-up-"), "catalog")
        _build(local, n, None)
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    files = [os.path.join(d, f) for d, _, fs in os.walk(local) for f in fs]
    client = s3.client()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda f: client.upload_file(f, bucket, f"{prefix}/{os.path.relpath(f, local)}"), files))
    import mv_assets as mv

    statuses = mv.connect(uri, storage_options=s3.options).status().to_pylist()
    fine = [r for r in statuses if r["load_state"] == "LOADED" and r["versions_behind"] == 0]
    if len(fine) != n:
        raise RuntimeError(f"uploaded catalog: {len(fine)} of {n} views loaded and current: {statuses[:3]}")
    return local


def _measure(uri: str, options: dict | None, proxy) -> dict:
    """One side's figures (in this process, the mv_assets on sys.path)."""
    import contextlib

    import dagster as dg
    from dagster_helpers import evaluate_sensor

    import mv_assets as mv
    from mv_assets.dagster import MvAssetsResource, build_definitions

    def counting():
        return proxy.counting() if proxy is not None else contextlib.nullcontext(None)

    out: dict = {}
    db = mv.connect(uri, storage_options=options, runner=mv.InlineRunner())
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=uri, runner="inline", storage_options=options))
    sensors = [s for s in defs.get_repository_def().sensor_defs if s.name.endswith("_changes")]
    with dg.instance_for_test() as instance:
        cursors = {}
        for s in sensors:  # first ticks: partitions, cursors
            r = evaluate_sensor(s, instance=instance, definitions=defs, resources=defs.resources)
            for req in r.dynamic_partitions_requests:
                instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
            cursors[s.name] = r.cursor
        for s in sensors:  # settled (the views are current): what the daemon sees from then on
            r = evaluate_sensor(s, instance=instance, cursor=cursors[s.name], definitions=defs, resources=defs.resources)
            cursors[s.name] = r.cursor or cursors[s.name]
        one = next(s for s in sensors if s.name == "t0_changes")

        def ticks(key: str, which: list, threads: int = 1) -> None:
            """``which`` sensors ticked once each (on ``threads`` threads, as
            Dagster's daemon does with ``sensors: use_threads``): seconds and
            requests as ``key``."""
            from concurrent.futures import ThreadPoolExecutor

            def tick(s) -> None:
                evaluate_sensor(s, instance=instance, cursor=cursors[s.name], definitions=defs,
                                resources=defs.resources)

            with counting() as seen:
                t0 = time.perf_counter()
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(tick, which))
                out[f"{key}_s"] = time.perf_counter() - t0
            out[f"{key}_req"] = seen.total if seen is not None else None

        ticks("idle", [one])
        ticks("all", sensors)
        ticks("all_threads", sensors, threads=SENSOR_WORKERS)
        db.open_table("t0").add([{"id": 1000 + int(time.time() * 1000) % 10**6, "x": 1}])
        ticks("changed", [one])
        db.refresh("v0")
    with counting() as seen:
        t0 = time.perf_counter()
        db.status()
        out["status_s"] = time.perf_counter() - t0
    out["status_req"] = seen.total if seen is not None else None
    code = ("import sys, time; t0 = time.perf_counter(); from mv_assets.dagster import build_definitions; "
            "build_definitions(sys.argv[1]); print(time.perf_counter() - t0)")
    env = {**os.environ, "MV_ASSETS_STORAGE_OPTIONS": json.dumps(options or {})}
    from mv_assets.storage import objects

    # first with no summaries of the catalog (storage.summaries: what a new process remembers of each
    # dataset; code without them never reads nor writes the file), then twice with what the loads wrote
    # (the first remembers each dataset's kind, the second each table's newest manifest)
    objects.remove(objects.join(uri, "_mv_assets", "summaries.json"))
    for key in ("defs_cold", "defs_second", "defs"):
        with counting() as seen:
            done = subprocess.run([sys.executable, "-c", code, uri], capture_output=True, text=True, env=env,
                                  check=True)
        out[f"{key}_s"] = float(done.stdout.strip().splitlines()[-1])
        out[f"{key}_req"] = seen.total if seen is not None else None
    # `mv-assets status`: a new process (nothing cached), as an operator runs it
    code = ("import sys, time; t0 = time.perf_counter(); from mv_assets.cli import main\n"
            "try:\n    main(['--db', sys.argv[1], '--runner', 'inline', 'status', '--json'])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print(time.perf_counter() - t0, file=sys.stderr)")
    with counting() as seen:
        done = subprocess.run([sys.executable, "-c", code, uri], capture_output=True, text=True, env=env, check=True)
    out["cli_status_s"] = float(done.stderr.strip().splitlines()[-1])
    out["cli_status_req"] = seen.total if seen is not None else None
    return out


def _fragments(n: int, storage: str) -> None:
    """One table of ``n`` fragments: the Dagster costs that follow its fragment
    count, on a SQLite instance: Dagster's storage as it comes (``sqlite``), or
    as ``make demo`` and the devserver set it up (``batched``: mv_assets'
    event log, DAGSTER_EVENT_BATCH_SIZE)."""
    os.environ.setdefault("DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS", "1")  # as make demo sets it
    from mv_assets.dagster.devserver import DAGSTER_ENV, prepare_home

    if storage == "batched":
        os.environ["DAGSTER_EVENT_BATCH_SIZE"] = DAGSTER_ENV["DAGSTER_EVENT_BATCH_SIZE"]
    else:
        os.environ.pop("DAGSTER_EVENT_BATCH_SIZE", None)
    from collections import Counter

    import dagster as dg
    from dagster_helpers import apply_partition_requests, evaluate_sensor
    from test_fragments_scale import _fragmented  # (the tests' n-fragment table and its view)

    from mv_assets.dagster import MvAssetsResource, build_definitions

    path = os.path.join(tempfile.mkdtemp(prefix="mvfrags-"), "catalog")
    db = _fragmented(path, n)
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=path, runner="inline"))
    sensor = defs.get_repository_def().get_sensor_def("src_changes")
    job = defs.resolve_job_def("refresh_src")
    print(f"\n== one table of {n:,} fragments, one view; Dagster storage: {storage}")
    home = os.path.join(os.path.dirname(path), "dagster_home")
    if storage == "batched":
        prepare_home(home, immediate_runs=False)
    else:
        os.makedirs(home)
    with dg.DagsterInstance.from_config(home) as instance:
        kw = {"instance": instance, "definitions": defs, "resources": defs.resources}

        def tick_and_run(label: str, cursor):
            t0 = time.perf_counter()
            r = evaluate_sensor(sensor, cursor=cursor, **kw)
            tick = time.perf_counter() - t0
            apply_partition_requests(instance, r)
            applied = time.perf_counter() - t0 - tick
            events: Counter = Counter()
            for req in r.run_requests:
                done = job.execute_in_process(instance=instance, asset_selection=req.asset_selection, tags=req.tags)
                events.update(e.event_type_value for e in done.all_events if e.event_type_value.startswith("ASSET"))
            total = time.perf_counter() - t0
            print(f"{label:34} tick {tick:6.2f} s ({len(r.asset_events or [])} events), applied {applied:6.2f} s, "
                  f"run {total - tick - applied:7.2f} s {dict(events)}; total {total:7.2f} s", flush=True)
            return r.cursor or cursor

        cursor = tick_and_run("first tick + the run it starts", None)
        cursor = evaluate_sensor(sensor, cursor=cursor, **kw).cursor or cursor
        db.open_table("src").add([{"id": 10 * n, "x": 1}])
        cursor = tick_and_run("tick after an append + its run", cursor)
        t0 = time.perf_counter()
        done = job.execute_in_process(instance=instance, partition_key=str(n // 2))
        events = Counter(e.event_type_value for e in done.all_events if e.event_type_value.startswith("ASSET"))
        print(f"{'one-fragment run':34} {time.perf_counter() - t0:6.2f} s {dict(events)}", flush=True)


def _side(args) -> None:
    """Measure with this process's mv_assets; print one JSON line."""
    sys.path.insert(0, TESTS)
    proxy = None
    options = json.loads(args.options) if args.options else None
    if args.proxy_upstream:
        from counting_proxy import CountingProxy

        proxy = CountingProxy(args.proxy_upstream)
        options = {**(options or {}), "aws_endpoint": proxy.endpoint}
    try:
        print("RESULT " + json.dumps(_measure(args.uri, options, proxy)))
    finally:
        if proxy is not None:
            proxy.stop()


ROWS = [("idle tick, one sensor", "idle"), ("tick after an append", "changed"), ("every sensor once", "all"),
        (f"... on {SENSOR_WORKERS} threads", "all_threads"),
        ("db.status()", "status"), ("definitions load, cold", "defs_cold"),
        ("definitions load, second", "defs_second"), ("definitions load", "defs"),
        ("mv-assets status", "cli_status")]


def _run_side(checkout: str | None, uri: str, options: dict | None, upstream: str | None) -> dict:
    env = dict(os.environ)
    if checkout:
        env["PYTHONPATH"] = checkout + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.abspath(__file__), "--side", "--uri", uri]
    if options:
        cmd += ["--options", json.dumps(options)]
    if upstream:
        cmd += ["--proxy-upstream", upstream]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=checkout or os.path.dirname(HERE))
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode != 0 or not line:
        raise RuntimeError(f"measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(line[0][len("RESULT "):])


def _fmt(d: dict, k: str) -> str:
    req = d.get(f"{k}_req")
    return f"{d[f'{k}_s']:8.3f} s" + (f" {req:6d} req" if req is not None else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 100])
    p.add_argument("--stores", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    p.add_argument("--compare", help="another checkout's root: its mv_assets measured the same way, side by side")
    p.add_argument("--fragments", type=int, nargs="+", help="one table of N fragments (and only that)")
    p.add_argument("--s3-list", nargs="+", choices=["moto", "indexed"], default=["moto"],
                   help="the S3 server's LIST: moto's (filters every key of the bucket) and/or by prefix; "
                        "with --upload both get the same catalog")
    p.add_argument("--upload", action="store_true",
                   help="build the S3 catalogs on local disk and upload their files (faster than through moto)")
    p.add_argument("--dagster-storage", nargs="+", default=["sqlite", "batched"], choices=["sqlite", "batched"],
                   help="with --fragments: Dagster's SQLite storage as it comes, and/or as make demo sets it up")
    p.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--uri", help=argparse.SUPPRESS)
    p.add_argument("--options", help=argparse.SUPPRESS)
    p.add_argument("--proxy-upstream", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        return _side(args)
    sys.path.insert(0, TESTS)
    if args.fragments:
        for n in args.fragments:
            for storage in args.dagster_storage:
                _fragments(n, storage)
        return
    servers: dict = {}
    try:
        for store in args.stores:
            for n in args.sizes:
                local = None
                for listing in args.s3_list if store == "s3" else [None]:
                    if store == "s3":
                        from s3_server import S3Server

                        s3 = servers.setdefault(listing, None) or S3Server(indexed_list=listing == "indexed")
                        servers[listing] = s3
                        uri, options, upstream = f"s3://{s3.new_bucket()}/catalog", s3.options, s3.endpoint
                    else:
                        s3, options, upstream = None, None, None
                        uri = os.path.join(tempfile.mkdtemp(prefix="mvscale-"), "catalog")
                    t0 = time.perf_counter()
                    if s3 is not None and args.upload:
                        local = _build_by_upload(uri, n, s3, local)
                    else:
                        _build(uri, n, options)
                    where = f"{store} (LIST: {listing})" if listing else store
                    print(f"\n== {where}, N = {n} tables with one view each (built in {time.perf_counter() - t0:.0f} s)")
                    _print_sides(args, uri, options, upstream)
    finally:
        for s3 in servers.values():
            s3.stop()


def _print_sides(args, uri: str, options: dict | None, upstream: str | None) -> None:
    now = _run_side(None, uri, options, upstream)
    before = _run_side(args.compare, uri, options, upstream) if args.compare else None
    print(f"{'':24} {'this checkout':>22}" + (f" {'compared':>22}   ratio (s)" if before else ""))
    for label, k in ROWS:
        line = f"{label:24} {_fmt(now, k):>22}"
        if before:
            line += f" {_fmt(before, k):>22}   {now[f'{k}_s'] / max(before[f'{k}_s'], 1e-9):.3f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
