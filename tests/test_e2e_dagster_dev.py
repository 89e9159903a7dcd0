"""End to end: a real `dagster dev` (webserver + daemon) on 127.0.0.1.

1. Launch a materialization of the missing partitions through GraphQL the way
   the UI's Materialize button does (a partition backfill), check the view.
2. Start the sensor, append to the source, wait for the sensor-driven run to
   bring the view up to date.
"""

import os

import dagster as dg
import lance
import pytest
import requests
from oracle import actual_view, expected_view

import mv_assets as mv
from mv_assets.dagster.definitions import partitions_def_name
from mv_assets.dagster.devserver import dagster_dev, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.spark]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class GraphQL:
    def __init__(self, url):
        self.url = url

    def __call__(self, query, **variables):
        r = requests.post(self.url, json={"query": query, "variables": variables}, timeout=30)
        r.raise_for_status()
        body = r.json()
        assert "errors" not in body, body
        return body["data"]



@mv.udf
def triple(x: int) -> int:
    return 3 * x


@mv.udf
def square(x: int) -> int:
    return x * x


def _keep(r):
    return r["x"] % 4 != 0


def _project(r):
    return {"id": r["id"], "t": 3 * r["x"]}


def test_dagster_dev_materialize_then_sensor_refresh(tmp_path):
    catalog = str(tmp_path / "catalog")
    home = tmp_path / "dagster_home"
    home.mkdir()
    db = mv.connect(catalog, runner=mv.InlineRunner())
    src = db.create_table("events", [{"id": i, "x": i} for i in range(20)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(20, 30)])
    src.add_columns({"sq": square})  # a computed column of the table: its own asset, filled by backfill
    db.create_materialized_view("ev", src.search(None).where("x % 4 != 0").select({"id": "id", "t": triple}))
    partitions = [str(f.fragment_id) for f in lance.dataset(src.uri).get_fragments()]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(partitions_def_name("events"), partitions)

    env = {
        "MV_ASSETS_DB": catalog,
        "MV_ASSETS_SENSORS": "stopped",
        "MV_ASSETS_SENSOR_INTERVAL": "1",
        "MV_ASSETS_SPARK_MASTER": "local[2]",
        "LANCE_LOG": "error",
    }
    workspace = os.path.join(ROOT, "workspace.yaml")
    with dagster_dev(workspace, str(home), env, str(tmp_path / "dagster_dev.log")) as base:
        gql = GraphQL(f"{base}/graphql")
        repo = wait_until(
            lambda: (gql("{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }")
                     ["repositoriesOrError"].get("nodes") or [None])[0],
            60, "the code location",
        )
        selector = {"repositoryName": repo["name"], "repositoryLocationName": repo["location"]["name"]}

        # 1. The UI's "Materialize" on missing partitions: a partition backfill of the view and its column.
        launched = gql(
            """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
                 __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""",
            params={
                "partitionNames": partitions,
                "assetSelection": [{"path": ["ev"]}, {"path": ["ev", "t"]}],
                "fromFailure": False,
            },
        )["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched

        def backfill_done():
            status = gql(
                "query($id: String!) { partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill { status } } }",
                id=launched["backfillId"],
            )["partitionBackfillOrError"]["status"]
            assert status not in ("FAILED", "CANCELED", "COMPLETED_FAILED"), status
            return status in ("COMPLETED", "COMPLETED_SUCCESS")

        wait_until(backfill_done, 240, "the backfill")
        view = db.open_table("ev")
        assert actual_view(view) == expected_view(src.uri, src.version, _keep, _project)
        # One run over every partition: one planned event per asset (not per partition),
        # and every partition of both assets shows materialized with its own numbers.
        keys = [dg.AssetKey(["ev"]), dg.AssetKey(["ev", "t"])]
        with dg.DagsterInstance.from_config(str(home)) as instance:
            (run,) = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": launched["backfillId"]}))
            planned = instance.get_records_for_run(
                run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED, limit=1000
            ).records
            assert sorted(r.event_log_entry.dagster_event.asset_key for r in planned) == sorted(keys)
            for key in keys:
                assert instance.get_materialized_partitions(key) == set(partitions)
            by_partition = {
                e.partition_key: e.asset_materialization.metadata["rows_computed"].value
                for e in instance.fetch_materializations(keys[0], limit=100).records
                if e.asset_materialization is not None
            }
            assert sum(by_partition.values()) == view.count_rows() and len(by_partition) == len(partitions)

        # 2. Sensor-driven refresh after an append.
        started = gql(
            """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename } }""",
            s={**selector, "sensorName": "events_changes"},
        )["startSensor"]
        assert started["__typename"] == "Sensor", started
        src.add([{"id": i, "x": i} for i in range(100, 110)])
        target = src.version
        wait_until(lambda: view.refresh_state().source_version == target, 240, "the sensor-driven refresh", 2.0)
        assert actual_view(view) == expected_view(src.uri, target, _keep, _project)
        runs = gql("{ runsOrError { ... on Runs { results { status tags { key value } } } } }")["runsOrError"]["results"]
        sensor_runs = [r for r in runs if any(t["key"] == "dagster/sensor_name" for t in r["tags"])]
        assert sensor_runs and all(r["status"] in ("SUCCESS", "STARTED", "STARTING", "QUEUED") for r in sensor_runs)

        # 3. The table's computed column: the same sensor requests a backfill of the rows lacking values.
        wait_until(lambda: src.plan_backfill("sq").rows == 0, 240, "the sensor-driven column backfill", 2.0)
        assert sorted((r["id"], r["sq"]) for r in src.to_arrow().to_pylist()) == sorted(
            (i, i * i) for i in [*range(30), *range(100, 110)]
        )
