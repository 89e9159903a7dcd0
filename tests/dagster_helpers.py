"""Shared pieces of the Dagster tests: a small catalog with a view over a
view, applying a sensor's result to an instance as the daemon does (a
directly evaluated sensor does not), and the UI's GraphQL over definitions."""

import os
import sys
from contextlib import contextmanager

import dagster as dg

import mv_assets as mv


@mv.udf
def double(x: int) -> int:
    return 2 * x


def small_catalog(path) -> mv.Connection:
    """src (two fragments) -> v (x != 3, y = double(x)) -> w (y > 4)."""
    db = mv.connect(str(path), runner=mv.InlineRunner())
    src = db.create_table("src", [{"id": i, "x": i} for i in range(6)], primary_key="id")
    src.add([{"id": i, "x": i} for i in range(6, 10)])
    view = db.create_materialized_view("v", src.search(None).where("x != 3").select({"id": "id", "x": "x", "y": double}))
    db.create_materialized_view("w", view.search(None).where("y > 4").select({"id": "id", "y": "y"}))
    return db


def apply_partition_requests(instance, result) -> None:
    """What the daemon does with a sensor tick's result besides its runs:
    store its asset events (observations, check evaluations), then apply
    its partition requests."""
    for event in getattr(result, "asset_events", None) or []:
        instance.report_runless_asset_event(event)
    for req in getattr(result, "dynamic_partitions_requests", None) or []:
        if isinstance(req, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        else:
            for key in req.partition_keys:
                instance.delete_dynamic_partition(req.partitions_def_name, key)



def call_sensor(sensor, **kwargs):
    """Call a sensor's function with the definitions' resources open (as the
    daemon does around each tick)."""
    with dg.build_sensor_context(**kwargs) as ctx:
        return sensor(ctx)


def evaluate_sensor(sensor, **kwargs):
    """One sensor tick, resources open."""
    with dg.build_sensor_context(**kwargs) as ctx:
        return sensor.evaluate_tick(ctx)


def evaluate_schedule(schedule, **kwargs):
    """One schedule tick, resources open."""
    with dg.build_schedule_context(**kwargs) as ctx:
        return schedule.evaluate_tick(ctx)


UI_DEFS = '''
from mv_assets.dagster import MvAssetsResource, build_definitions

defs = build_definitions({uri!r}, views={views!r}, resource=MvAssetsResource(catalog_uri={uri!r}, runner="inline"))
'''


@contextmanager
def ui_graphql(instance, folder, uri: str, views: str | None = None):
    """``query(text, **variables)`` answering GraphQL as the Dagster UI asks
    it (dagster-webserver's schema), over the definitions of the catalog at
    ``uri`` loaded in this process from a file written in ``folder``."""
    from dagster._core.test_utils import in_process_test_workspace
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster_graphql.test.utils import execute_dagster_graphql

    path = os.path.join(str(folder), "ui_definitions.py")
    with open(path, "w") as f:
        f.write(UI_DEFS.format(uri=uri, views=views))
    origin = LoadableTargetOrigin(python_file=path, attribute="defs", executable_path=sys.executable)
    with in_process_test_workspace(instance, origin) as context:
        def query(text: str, **variables):
            result = execute_dagster_graphql(context, text, variables=variables or None)
            assert not result.errors, result.errors
            return result.data

        yield query


def run_requested(defs, instance, result) -> list:
    """What the daemon does with a sensor tick's result: apply its partition
    requests and asset events, then run each requested run in process, in
    the job the sensor launches it in (its table's ``refresh_<table>``). The
    runs' results."""
    apply_partition_requests(instance, result)
    return execute_runs(defs, instance, result)


def execute_runs(defs, instance, result) -> list:
    """Each run a sensor tick requested, run in process as the daemon runs it
    (in its table's ``refresh_<table>``, tagged with its run key; a key used
    before is not run again). The runs' results, each a success."""
    from mv_assets.dagster.definitions import job_name
    from mv_assets.dagster.sensors import RUN_KEY_TAG, TAG_LINEAGE

    out = []
    for run in getattr(result, "run_requests", None) or []:
        if run.run_key and instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run.run_key})):
            continue
        lineage = run.tags.get(TAG_LINEAGE)
        job = defs.resolve_job_def(job_name(lineage)) if lineage else defs.resolve_implicit_global_asset_job_def()
        tags = {**run.tags, **({RUN_KEY_TAG: run.run_key} if run.run_key else {})}
        done = job.execute_in_process(instance=instance, asset_selection=run.asset_selection, tags=tags)
        assert done.success
        out.append(done)
    return out


def run_log(instance, result) -> list[str]:
    """The messages a run logged through ``context.log`` (its Dagster events left out)."""
    return [r.user_message for r in instance.all_logs(result.run_id) if r.dagster_event is None and r.user_message]


def column_lineage(lineage) -> dict[str, set[tuple[str, str]]]:
    """An asset's ``dagster/column_lineage`` metadata (the value, or its
    metadata wrapper) as ``{column: {(asset key, column), ...}}``."""
    if not isinstance(lineage, dg.TableColumnLineage):
        lineage = lineage.column_lineage
    return {col: {(d.asset_key.to_user_string(), d.column_name) for d in deps}
            for col, deps in lineage.deps_by_column.items()}
