"""Dagster with production storage: runs, event logs and schedules in
PostgreSQL (dagster-postgres, SQLAlchemy 2.x scheme ``postgresql+psycopg2``),
materializing view partitions and evaluating the table sensor against it."""

import os
import textwrap

import dagster as dg
import pyarrow as pa
import pytest
from dagster_helpers import apply_partition_requests, call_sensor
from postgres_server import PostgresServer, postgres_bin

import mv_assets as mv
from mv_assets.dagster import MvAssetsResource, build_definitions, partitions_def_name

pytestmark = pytest.mark.skipif(
    postgres_bin("postgres") is None and not os.environ.get("MV_ASSETS_REQUIRE_POSTGRES"),
    reason="Debian's postgresql is not installed (CI installs it and sets MV_ASSETS_REQUIRE_POSTGRES)",
)


@pytest.fixture
def postgres():
    server = PostgresServer()
    yield server
    server.stop()


@mv.udf
def doubled(x: int) -> int:
    return 2 * x


def test_runs_and_materializations_are_stored_in_postgres(postgres, tmp_path):
    postgres.create_database("dagster")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(textwrap.dedent(f"""
        storage:
          postgres:
            postgres_db:
              username: postgres
              password: ""
              hostname: 127.0.0.1
              port: {postgres.port}
              db_name: dagster
              scheme: postgresql+psycopg2
    """))
    db = mv.connect(str(tmp_path / "cat"), runner=mv.InlineRunner())
    t = db.create_table("t", pa.table({"x": list(range(10))}))
    db.create_materialized_view("v", t.search(None).select({"x": "x", "y": doubled}))
    defs = build_definitions(db, resource=MvAssetsResource(catalog_uri=db.uri, runner="inline"))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        # the sensor adds the fragment partitions and requests the refresh
        sensor = defs.get_repository_def().get_sensor_def("t_changes")
        result = call_sensor(sensor, instance=instance, cursor=None, definitions=defs, resources=defs.resources)
        apply_partition_requests(instance, result)
        assert result.run_requests
        pdef = partitions_def_name("t")
        keys = instance.get_dynamic_partitions(pdef)
        assert keys == [str(f) for f in t.fragment_ids()]
        job = defs.get_implicit_global_asset_job_def()
        req = result.run_requests[0]
        out = job.execute_in_process(instance=instance, tags=req.tags, asset_selection=req.asset_selection)
        assert out.success
        assert sorted(r["y"] for r in db.open_table("v").to_arrow().to_pylist()) == [2 * x for x in range(10)]
        mats = instance.fetch_materializations(dg.AssetKey(["v"]), limit=10).records
        assert mats and mats[0].partition_key in keys
    # written by Postgres, read back with plain SQL
    assert postgres.query("dagster", "select count(*) from runs")[0][0] >= 1
    assert postgres.query("dagster", "select count(*) from event_logs where asset_key like '%\"v\"%'")[0][0] >= 1
