"""The demo through the UI path, timed: a real `dagster dev` in the demo
configuration (its own Spark Connect server, refreshes of <= 1000 rows in the
run process, immediate run launch, sensors on), driven through GraphQL the way
the UI's buttons drive it. Prints numbers measured in one run, next to the goals:

1. start -> every asset materialized by the sensor, no failed run (goal: < 2 min)
2. source append -> the view and the view over it updated, beyond the sensor
   interval (goal <= 5 s)
3. "Materialize" on one partition of a view that has nothing to do, launch ->
   success (goal <= 5 s)
4. "Materialize all" (a backfill of every partition of every asset), launch ->
   every asset materialized (goal <= 20 s), and -> the backfill marked done
5. "Materialize" on a view, every partition picked, "Launch backfill" (what the
   UI sends: a backfill) -> its run created, -> started (goal <= 5 s); and each
   run's start-up, created -> started (its process up, the definitions loaded),
   by phase from the run's events: created -> enqueued, -> starting (Dagster's
   run queue, looked at every second), -> the run's process up (a new Python:
   dagster, its instance and our modules imported: "Started process for run"),
   -> started (the definitions built, the run planned)
6. what a run's process spends before its run starts, outside Dagster: a fresh
   Python importing the demo's definitions.py, by piece (after dagster dev has
   stopped, on the catalog it left)

The figures depend on the machine: its cores and what else runs on them (a run
process's start-up is CPU-bound), and on cached bytecode (``dagster dev`` here
and ``make demo`` cache mv_assets', see mv_assets.dagster.devserver.cache_bytecode).

With ``--launcher both`` (the default) all of it runs twice, one after the
other, each in a new catalog and ``dagster dev``: with Dagster's
``DefaultRunLauncher`` (a new Python per run) and with the demo's
(mv_assets.dagster.warm_launcher: each run's process forked from a helper that
has imported dagster, lance and mv_assets), printed side by side.

Usage: python bench/bench_demo_ui.py [--interval 15] [--launcher both|warm|dagster]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("LANCE_LOG", "error")

from mv_assets.dagster.devserver import dagster_dev, free_port, graphql, wait_until  # noqa: E402
from mv_assets.demo import _documents, seed  # noqa: E402
from mv_assets.execution import connect_server  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = [["documents", "checksum"], ["doc_features"], ["doc_features", "words"], ["doc_features", "embedding"],
          ["doc_features", "summary"], ["long_docs"]]


def latest(base: str, path: list[str]) -> float:
    data = graphql(base, "query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { ... on Asset { "
                     "assetMaterializations(limit: 1) { timestamp } } } }", k={"path": path})["assetOrError"]
    mats = data.get("assetMaterializations") or []
    return float(mats[0]["timestamp"]) / 1000.0 if mats else 0.0


def failed_runs(base: str) -> int:
    runs = graphql(base, "{ runsOrError { ... on Runs { results { status } } } }")["runsOrError"]["results"]
    return sum(r["status"] == "FAILURE" for r in runs)


def backfill_done_id(base: str, backfill_id: str) -> bool:
    status = graphql(base, "query($id: String!) { partitionBackfillOrError(backfillId: $id) { "
                           "... on PartitionBackfill { status } } }", id=backfill_id)["partitionBackfillOrError"]["status"]
    return status in ("COMPLETED", "COMPLETED_SUCCESS")


def run_times(base: str, backfill_id: str) -> list[tuple[float, float | None]]:
    """(created, started) of the backfill's runs (started None until then)."""
    runs = graphql(base, "query($f: RunsFilter) { runsOrError(filter: $f) { ... on Runs { results { "
                         "creationTime startTime } } } }",
                   f={"tags": [{"key": "dagster/backfill", "value": backfill_id}]})["runsOrError"]["results"]
    return [(float(r["creationTime"]), float(r["startTime"]) if r["startTime"] else None) for r in runs]


def startups(base: str) -> list[float]:
    """Created -> started of every run so far (s)."""
    runs = graphql(base, "{ runsOrError { ... on Runs { results { creationTime startTime } } } }")[
        "runsOrError"]["results"]
    return [float(r["startTime"]) - float(r["creationTime"]) for r in runs if r["startTime"]]


# A run's start-up as it happens in Dagster: from its creation, each phase ends at the first event of
# its kind (and message) after the phase before. "Started process for run": the run's process reports
# it once dagster is imported and its instance loaded, which imports mv_assets (the demo's dagster.yaml
# names mv_assets' run coordinator and event-log storage) and so lance: a new Python with Dagster's
# launcher, a process forked from one that imported them with mv_assets' (warm_launcher); the
# definitions are built after it (build_definitions), then the run is planned and starts
PHASES = (("created -> enqueued", "RunEnqueuedEvent", ""),
          ("enqueued -> starting (the run queue, looked at every second)", "RunStartingEvent", ""),
          ("starting -> its process up (a process, dagster, its instance, imports)", "EngineEvent",
           "Started process for run"),
          ("process up -> started (the definitions built, the run planned)", "RunStartEvent", ""))


def run_phases(base: str) -> dict[str, list[float]]:
    """The start-up phases (:data:`PHASES`) of every run so far, in seconds."""
    runs = graphql(base, "{ runsOrError { ... on Runs { results { creationTime eventConnection(limit: 100) { "
                         "events { __typename ... on MessageEvent { timestamp message } } } } } } }")[
        "runsOrError"]["results"]
    out: dict[str, list[float]] = {name: [] for name, _, _ in PHASES}
    for r in runs:
        events = [(e["__typename"], e.get("message") or "", float(e["timestamp"]) / 1000.0)
                  for e in r["eventConnection"]["events"]]
        at: float | None = float(r["creationTime"])
        for name, then, text in PHASES:
            seen = next((t for kind, message, t in events
                         if kind == then and message.startswith(text) and at is not None and t >= at), None)
            if at is not None and seen is not None:
                out[name].append(seen - at)
            at = seen
    return out


# What a run's process does before its run starts, outside Dagster, by piece
LOAD = """
import json, sys, time
t0 = time.perf_counter()
import dagster
t1 = time.perf_counter()
import lance, pyarrow.dataset
t2 = time.perf_counter()
import mv_assets.dagster
t3 = time.perf_counter()
import definitions
t4 = time.perf_counter()
print("LOAD " + json.dumps({"import dagster": t1 - t0, "import lance (pyarrow, pandas)": t2 - t1,
                            "import mv_assets.dagster (the rest of ours)": t3 - t2,
                            "definitions.py: build_definitions": t4 - t3}))
"""


def definitions_load(env: dict[str, str], tries: int = 3) -> dict[str, float]:
    """A fresh Python loading the demo's definitions.py (what each run's
    process does before its run starts), by piece and whole (start to exit):
    the median of ``tries`` (s)."""
    got: list[dict[str, float]] = []
    for _ in range(tries):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", LOAD], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                              text=True, check=True)
        whole = time.perf_counter() - t0
        line = next(x for x in done.stdout.splitlines() if x.startswith("LOAD "))
        got.append({**json.loads(line[len("LOAD "):]), "the process, start to exit": whole})
    return {k: statistics.median(g[k] for g in got) for k in got[0]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=int, default=15, help="sensor interval (the demo's default: 15 s)")
    ap.add_argument("--launcher", choices=("warm", "dagster", "both"), default="both",
                    help="the demo's run launcher (warm: mv_assets.dagster.warm_launcher), Dagster's "
                         "DefaultRunLauncher, or both one after the other, printed side by side (default)")
    args = ap.parse_args()
    kinds = {"warm": [True], "dagster": [False], "both": [False, True]}[args.launcher]
    results = [measure(args.interval, warm) for warm in kinds]
    names = ["warm launcher" if warm else "Dagster's launcher" for warm in kinds]
    print(f"\nmv_assets demo through the UI path ({os.cpu_count()} cores, sensor interval {args.interval} s, "
          f"load average {os.getloadavg()[0]:.1f} at the end)")
    goals = {"1.": "< 120", "   after the sensor tick": "<= 5", "3.": "<= 5", "4.": "<= 20",
             "   -> run started": "<= 5"}
    print(f"  {'':<60} " + " ".join(f"{n:>18}" for n in names))
    for k in results[-1]:
        goal = next((g for prefix, g in goals.items() if k.startswith(prefix)), "")
        cells = " ".join(f"{r[k]:18.2f}" if k in r else f"{'':>18}" for r in results)
        print(f"  {k:<60} {cells}   {('goal ' + goal) if goal else ''}")
    return 0


def measure(interval: int, warm: bool) -> dict[str, float]:
    """Every step of the module's list, in a new catalog and ``dagster dev``
    (``warm``: the demo's run launcher; else Dagster's)."""
    root = tempfile.mkdtemp(prefix="mv_bench_ui_")
    db = seed(os.path.join(root, "catalog"))
    spark_state = os.path.join(root, "spark-connect")
    remote = connect_server.start(port=free_port(), state_dir=spark_state)
    env = {
        "MV_ASSETS_DB": db.uri,
        "MV_ASSETS_VIEWS": "mv_assets.demo",
        "MV_ASSETS_SPARK_REMOTE": remote,
        "MV_ASSETS_LOCAL_BELOW_ROWS": "1000",
        "MV_ASSETS_SENSOR_INTERVAL": str(interval),
    }
    out: dict[str, float] = {}
    try:
        t_start = time.time()
        with dagster_dev(os.path.join(ROOT, "workspace.yaml"), os.path.join(root, "home"), env,
                         os.path.join(root, "dagster_dev.log"), immediate_runs=True, warm_runs=warm) as base:
            up = time.time()
            wait_until(lambda: all(latest(base, p) > 0 for p in ASSETS), 300, "the first materializations")
            out["1. start -> all materialized (s)"] = time.time() - t_start
            out["   of which dagster dev start (s)"] = up - t_start
            out["   failed runs"] = failed_runs(base)
            repo = graphql(base, "{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }")[
                "repositoriesOrError"]["nodes"][0]
            selector = {"repositoryName": repo["name"], "repositoryLocationName": repo["location"]["name"]}

            # 2. append -> both views updated; measured from the sensor tick that saw it
            docs, feats, longs = db.open_table("documents"), db.open_table("doc_features"), db.open_table("long_docs")
            beyond, totals = [], []
            for _ in range(3):
                time.sleep(2)
                start = int(docs.to_arrow().column("doc_id").to_numpy().max()) + 1
                docs.add(_documents(start, 50))
                t0, target = time.time(), docs.version
                wait_until(lambda target=target: feats.refresh_state().source_version == target and longs.status().versions_behind == 0,
                     120, "the sensor-driven refresh")
                done = time.time()
                ticks = graphql(base, "query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) { ... on Sensor { "
                                  "sensorState { ticks(limit: 10) { timestamp runIds } } } } }",
                            s={**selector, "sensorName": "documents_changes"})["sensorOrError"]["sensorState"]["ticks"]
                tick = min(float(t["timestamp"]) for t in ticks if t["runIds"] and float(t["timestamp"]) >= t0)
                totals.append(done - t0)
                beyond.append(done - tick)
            out["2. append -> both views updated (s, worst of 3)"] = max(totals)
            out["   after the sensor tick that saw it (s, worst of 3)"] = max(beyond)

            # 3. Materialize one partition that has nothing to do (the UI's launch of one partition)
            frag = str(feats.connection.open_table("documents")._dataset().get_fragments()[0].fragment_id)
            before = latest(base, ["doc_features"])
            t0 = time.time()
            launched = graphql(
                base,
                """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) { __typename
                   ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
                p={"selector": {**selector, "jobName": "__ASSET_JOB", "assetSelection": [{"path": ["doc_features"]}]},
                   "executionMetadata": {"tags": [{"key": "dagster/partition", "value": frag}]}},
            )["launchRun"]
            if launched["__typename"] != "LaunchRunSuccess":
                raise RuntimeError(launched)
            run_id = launched["run"]["runId"]

            def run_done():
                status = graphql(base, "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }", id=run_id)[
                    "runOrError"]["status"]
                if status in ("FAILURE", "CANCELED"):
                    raise RuntimeError(f"run {run_id} {status}")
                return status == "SUCCESS"

            wait_until(run_done, 120, "the one-partition run")
            out["3. Materialize one partition, nothing to do (s)"] = time.time() - t0
            assert latest(base, ["doc_features"]) > before

            # 4. Materialize all: a backfill of every partition of every asset
            partitions = [str(f.fragment_id) for f in db.open_table("documents")._dataset().get_fragments()]
            before = {tuple(p): latest(base, p) for p in ASSETS}
            t0 = time.time()
            launched = graphql(
                base,
                """mutation($b: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $b) { __typename
                   ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""",
                b={"partitionNames": partitions, "assetSelection": [{"path": p} for p in ASSETS], "fromFailure": False},
            )["launchPartitionBackfill"]
            if launched["__typename"] != "LaunchBackfillSuccess":
                raise RuntimeError(launched)
            wait_until(lambda: all(latest(base, list(p)) > t for p, t in before.items()), 180, "Materialize all")
            out["4. Materialize all -> every asset materialized (s)"] = time.time() - t0

            def backfill_done():
                return backfill_done_id(base, launched["backfillId"])

            wait_until(backfill_done, 180, "the backfill status")
            out["   -> the backfill marked completed (s)"] = time.time() - t0

            # 5. "Materialize" on a view, all partitions, "Launch backfill": click -> run created, started
            for attempt in range(3):
                t0 = time.time()
                launched = graphql(
                    base,
                    """mutation($b: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $b) { __typename
                       ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""",
                    b={"partitionNames": partitions, "assetSelection": [{"path": ["doc_features"]}],
                       "fromFailure": False},
                )["launchPartitionBackfill"]
                if launched["__typename"] != "LaunchBackfillSuccess":
                    raise RuntimeError(launched)
                (created, started), = wait_until(
                    lambda b=launched["backfillId"]: [t for t in run_times(base, b) if t[1] is not None], 180,
                    "the backfill's run to start", interval=0.1)
                out[f"5. Materialize a view, launch -> run created (s, try {attempt + 1})"] = created - t0
                out[f"   -> run started (s, try {attempt + 1})"] = started - t0
                wait_until(lambda b=launched["backfillId"]: backfill_done_id(base, b), 180, "the backfill")
            ups = startups(base)
            out["   run start-up, created -> started (s, median of all runs)"] = sorted(ups)[len(ups) // 2]
            out["   run start-up, created -> started (s, worst)"] = max(ups)
            out["   runs"] = len(ups)
            for name, seconds in run_phases(base).items():
                if seconds:
                    out[f"   {name} (s, median)"] = statistics.median(seconds)
            out["   failed runs at the end"] = failed_runs(base)
    finally:
        connect_server.stop(state_dir=spark_state)
    for name, seconds in definitions_load(env).items():
        out[f"6. {name} (s)" if name.startswith("import dagster") else f"   {name} (s)"] = seconds
    return out


if __name__ == "__main__":
    sys.exit(main())
