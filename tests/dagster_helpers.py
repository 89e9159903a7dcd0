"""Shared pieces of the Dagster tests: a small catalog with a view over a
view, and applying a sensor's partition requests to an instance (a directly
evaluated sensor does not apply them)."""

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
