"""Build Dagster definitions from a catalog: wiring only, the engine does the work.

See :mod:`.assets` for what becomes an asset and :mod:`.sensors` for what
triggers runs. Loading these definitions reads table metadata only: no UDF
is unpickled and no JVM starts.
"""

from typing import Any

import dagster as dg

from ..catalog import Connection, connect
from ..declare import load_declared
from .assets import (
    RESOURCE_KEY,
    TAG_SCOPE,
    TAG_SOURCE_VERSION,
    partitions_def_name,
    source_asset,
    table_columns_asset,
    view_asset,
)
from .catalog import TableInfo, catalog_tables
from .resource import MvAssetsResource
from .sensors import table_sensor, view_schedule

__all__ = [
    "build_definitions", "TableInfo", "catalog_tables", "TAG_SOURCE_VERSION", "TAG_SCOPE", "RESOURCE_KEY",
    "partitions_def_name",
]


def build_definitions(
    db: Connection | str,
    *,
    resource: MvAssetsResource | None = None,
    sensor_interval_seconds: int = 15,
    sensors_running: bool = True,
    views: dict | str | None = None,
) -> dg.Definitions:
    """Definitions for every table and view of the catalog ``db`` (a Connection or URI).

    ``views``: views declared in code, as ``{name: query}`` or the module
    (dotted name or ``.py`` path) whose ``views(db)`` returns them. Their UDF
    code is the code version of the column assets; a materialization first
    makes the catalog follow the code (see :mod:`mv_assets.declare`).

    Runs execute in process (one Spark session per run, shared by its assets).
    """
    conn = db if isinstance(db, Connection) else connect(db)
    declared = load_declared(views, conn) if isinstance(views, str) else views
    tables = catalog_tables(conn, declared)
    resource = resource or MvAssetsResource(catalog_uri=conn.uri)
    status = dg.DefaultSensorStatus.RUNNING if sensors_running else dg.DefaultSensorStatus.STOPPED
    views = [t for t in tables.values() if t.is_view and t.source in tables]
    pdefs = {
        s: dg.DynamicPartitionsDefinition(name=partitions_def_name(s))
        for s in sorted({v.source for v in views if v.partitioned})
    }
    assets: list[Any] = [source_asset(t) for t in tables.values() if not t.is_view]
    view_assets: dict[str, list[dg.AssetKey]] = {}
    for v in views:
        asset, keys = view_asset(v, tables, pdefs)
        assets.append(asset)
        view_assets[v.name] = keys
    column_keys: dict[str, list[dg.AssetKey]] = {}
    for t in tables.values():
        if not t.is_view and t.columns:
            asset, keys = table_columns_asset(t)
            assets.append(asset)
            column_keys[t.name] = keys
    sensors = [
        table_sensor(t, tables, pdefs.get(t.name), view_assets, column_keys.get(t.name, []), sensor_interval_seconds, status)
        for t in tables.values()
        if not t.is_view and (t.name in column_keys or any(v.root == t.name for v in views))
    ]
    schedule_status = dg.DefaultScheduleStatus.RUNNING if sensors_running else dg.DefaultScheduleStatus.STOPPED
    schedules = [
        view_schedule(v, pdefs.get(v.source) if v.partitioned else None, view_assets[v.name], schedule_status)
        for v in views
        if v.policy.kind == "cron"
    ]
    return dg.Definitions(
        assets=assets,
        sensors=sensors,
        schedules=schedules,
        resources={RESOURCE_KEY: resource},
        executor=dg.in_process_executor,
    )
