"""Build Dagster definitions from a catalog: wiring only, the engine does the work.

See :mod:`.assets` for what becomes an asset and :mod:`.sensors` for what
triggers runs. Loading these definitions reads table metadata only: no UDF
is unpickled and no JVM starts.
"""

import os
from typing import Any

import dagster as dg

from mv_assets.api.catalog import Connection, connect
from mv_assets.api.declare import load_declared
from mv_assets.dagster.assets import (
    RESOURCE_KEY,
    TAG_SCOPE,
    TAG_SOURCE_VERSION,
    lineage_asset,
    partitions_def_name,
    safe_name,
    source_asset,
    unreadable_asset,
)
from mv_assets.dagster.catalog import TableInfo, catalog_tables
from mv_assets.dagster.io_manager import IO_MANAGER_KEY, MvAssetsIOManager
from mv_assets.dagster.pipes_client import as_pipes_launcher
from mv_assets.dagster.resource import MvAssetsResource
from mv_assets.dagster.sensors import JoinWatch, lineage_order, observe_sensor, table_sensor, view_schedule
from mv_assets.model.errors import CatalogNotFoundError

__all__ = [
    "build_definitions", "TableInfo", "catalog_tables", "TAG_SOURCE_VERSION", "TAG_SCOPE", "RESOURCE_KEY",
    "partitions_def_name", "job_name", "AUTOMATIONS", "AUTOMATION_SENSOR", "FULL_CHECKS_CRON", "full_checks_job_name",
]

AUTOMATIONS = ("sensor", "conditions")
AUTOMATION_SENSOR = "mv_assets_automation"


def job_name(table: str) -> str:
    """The job refreshing everything downstream of base table ``table``."""
    return f"refresh_{safe_name(table)}"


def lineage_job(table: TableInfo, views: list[TableInfo], view_assets: dict[str, list[dg.AssetKey]],
                column_keys: list[dg.AssetKey]):
    """``refresh_<table>``: the table's computed columns, its views (and views
    over them) with their column assets and checks. The table's sensor and
    its views' schedules launch their runs in it, so the runs of one lineage
    are found under one job in the UI."""
    keys = [*column_keys, *(k for v in views for k in view_assets[v.name])]
    return dg.define_asset_job(
        name=job_name(table.name),
        selection=dg.AssetSelection.assets(*keys),  # (partitioned as they are: by the table's fragments)
        description=(
            f"Everything downstream of Lance table `{table.name}`: backfills its computed columns "
            f"({', '.join(c['name'] for c in table.columns) or 'none'}) and refreshes its views in lineage order "
            f"({', '.join(v.name for v in views) or 'none'}), with their UDF columns and checks. Its sensor "
            f"`{safe_name(table.name)}_changes` launches its runs here."
        ),
    )


FULL_CHECKS_CRON = "0 3 * * *"  # the full checks' schedules: daily at 03:00 (stopped until turned on)


def full_checks_job_name(table: str) -> str:
    """The job running the full checks of every view downstream of ``table``."""
    return f"full_checks_{safe_name(table)}"


def full_checks(table: TableInfo, views: list[TableInfo], view_assets: dict[str, list[dg.AssetKey]], lineage):
    """``full_checks_<table>`` and its daily schedule: the checks of the
    table's views (views over them too) alone, so each reads every row of its
    view (a materialization's checks read what its refresh changed only).
    The schedule is stopped until turned on (Automation, or
    ``full_checks_running=True``): full checks read whole views."""
    view_keys = {view_assets[v.name][0] for v in views}
    keys = [k for k in lineage.check_keys if k.asset_key in view_keys]
    if not keys:
        return None, None
    job = dg.define_asset_job(
        name=full_checks_job_name(table.name),
        selection=dg.AssetSelection.checks(*keys),
        description=(f"The full checks of the views over `{table.name}` ({', '.join(v.name for v in views)}): "
                     "every row of each view against its source. Refreshes nothing."),
    )
    return job, keys


def join_watches(view_infos: list[TableInfo], tables: dict[str, TableInfo], view_assets: dict[str, list[dg.AssetKey]],
                 jobs: dict[str, Any], pdefs: dict[str, Any]) -> dict[str, list[JoinWatch]]:
    """Which table's sensor refreshes which join view of another lineage: each
    join view is in the lineage of its first source (its root's job and
    partitions, refreshed as a whole); a joined source of another lineage
    (a base table, or a view of that table's lineage) moves without that
    lineage's sensor seeing it, so the joined source's root's sensor asks
    the view's policy and launches the run, in the view's own lineage job:
    the view's assets and the eager views below it."""
    out: dict[str, list[JoinWatch]] = {}
    for v in view_infos:
        others = [w for w in v.watchers if w != v.root and w in tables]
        if not others or v.name not in view_assets or v.root not in jobs:
            continue
        below, names = [], {v.name}
        for d in lineage_order([t for t in view_infos if t.root == v.root], tables):
            if d.name not in names and any(s in names for s in d.sources) and d.policy.kind == "eager":
                below.append(d)
                names.add(d.name)
        keys = [k for t in [v, *below] for k in view_assets.get(t.name, [])]
        for w in others:
            out.setdefault(w, []).append(JoinWatch(v, keys, jobs[v.root], pdefs.get(v.root)))
    return out


def _open_catalog(uri: str) -> Connection:
    """The catalog at ``uri``, which must exist: loading definitions creates
    nothing (a mistyped local path gave an empty graph, and a directory of
    that name). An object-store prefix is opened as it is (it has no
    directory to be missing)."""
    if "://" not in str(uri) and not os.path.exists(uri):
        raise CatalogNotFoundError(
            f"no mv_assets catalog at {uri}: check the path (create one with mv_assets.connect({str(uri)!r}) "
            "and add tables to it first)"
        )
    return connect(uri)


def build_definitions(
    db: Connection | str,
    *,
    resource: MvAssetsResource | None = None,
    pyspark: Any = None,
    sensor_interval_seconds: int = 15,
    sensors_running: bool = True,
    views: dict | str | None = None,
    automation: str = "sensor",
    full_checks_running: bool = False,
    pipes_client: Any = None,
) -> dg.Definitions:
    """Definitions for every table and view of the catalog ``db`` (a Connection or URI).

    ``views``: views declared in code, as ``{name: query}`` or the module
    (dotted name or ``.py`` path) whose ``views(db)`` returns them. Their UDF
    code is the code version of the column assets; a materialization first
    makes the catalog follow the code (see :mod:`mv_assets.declare`).

    ``automation``: what launches refreshes. "sensor" (the default): a
    sensor ``<table>_changes`` per source table (one run per change, the
    whole lineage) and a schedule per cron view. "conditions": each view
    asset carries the AutomationCondition of its refresh policy (see
    :func:`~mv_assets.dagster.assets.automation_condition`), evaluated by the
    automation condition sensor ``mv_assets_automation``; a sensor
    ``<table>_observe`` per source table adds its fragments' partitions and
    observes their data versions, and launches no run.

    ``full_checks_running``: whether the daily ``full_checks_<table>``
    schedules (every row of every view checked, ``FULL_CHECKS_CRON``) start
    running; stopped by default (turn them on in the UI). A
    materialization's checks cover what its refresh changed only.

    ``pyspark``: a dagster-pyspark ``LazyPySparkResource`` (or
    ``PySparkResource``): the runs' refreshes use the Spark session it builds
    from its ``spark_config`` (started by the first refresh with Spark work;
    ``spark.remote`` in it: Spark Connect) instead of ``MV_ASSETS_SPARK_MASTER``
    / ``MV_ASSETS_SPARK_REMOTE``. The same as ``resource=MvAssetsResource(...,
    pyspark=...)``; give one of the two.

    ``pipes_client``: the views' refreshes and checks run in ``python -m
    mv_assets.pipes`` launched through Dagster Pipes (a ``PipesSubprocessClient``,
    a function ``launch(context, extras)`` for any other client, or a
    :class:`~mv_assets.dagster.pipes_client.PipesLauncher`); see docs/deploy.md.

    Runs execute in process (one Spark session per run, shared by its assets).
    """
    _check_arguments(automation, pyspark, resource)
    conditions = automation == "conditions"
    pipes = as_pipes_launcher(pipes_client)  # (refused here, at load, when it is nothing Pipes can launch with)
    conn = db if isinstance(db, Connection) else _open_catalog(db)
    declared = load_declared(views, conn) if isinstance(views, str) else views
    unreadable: dict[str, str] = {}
    tables = catalog_tables(conn, declared, unreadable)
    resource = resource or _resource(conn, pyspark)
    view_infos = [t for t in tables.values() if t.is_view and t.source in tables]
    roots = sorted({v.root for v in view_infos} | {t.name for t in tables.values() if not t.is_view and t.columns})
    pdefs = {r: dg.DynamicPartitionsDefinition(name=partitions_def_name(r)) for r in roots}
    assets: list[Any] = [source_asset(t, pdefs.get(t.name)) for t in tables.values() if not t.is_view]
    # a damaged dataset is in the graph, with its reason, not hidden (a view declared in code under its name: not here)
    assets += [unreadable_asset(name, why) for name, why in sorted(unreadable.items()) if name not in tables]
    lineages, view_assets, column_keys = _lineage_assets(roots, view_infos, tables, pdefs, conditions,
                                                         resource.runner, pipes)
    assets += list(lineages.values())
    jobs = {r: lineage_job(tables[r], [v for v in view_infos if v.root == r], view_assets, column_keys[r]) for r in roots}
    check_jobs = [job for job, _ in (full_checks(tables[r], [v for v in view_infos if v.root == r], view_assets,
                                                  lineages[r]) for r in roots) if job is not None]
    sensors, schedules = _launchers(tables, view_infos, roots, pdefs, view_assets, column_keys, jobs,
                                    conditions=conditions, interval=sensor_interval_seconds, running=sensors_running)
    schedules += _full_check_schedules(check_jobs, full_checks_running)
    return dg.Definitions(
        assets=assets,
        jobs=list(jobs.values()) + check_jobs,
        sensors=sensors,
        schedules=schedules,
        resources={RESOURCE_KEY: resource, IO_MANAGER_KEY: MvAssetsIOManager(mv_assets=resource)},
        executor=dg.in_process_executor,
    )


def _check_arguments(automation: str, pyspark: Any, resource: MvAssetsResource | None) -> None:
    if automation not in AUTOMATIONS:
        raise ValueError(f"automation must be one of {AUTOMATIONS}, got {automation!r}")
    if pyspark is not None and resource is not None:
        raise ValueError("build_definitions: give pyspark= to the MvAssetsResource passed as resource= "
                         "(MvAssetsResource(catalog_uri=..., pyspark=...)), or pass no resource")


def _resource(conn: Connection, pyspark: Any) -> MvAssetsResource:
    """The runs' resource for the catalog ``conn``, from the environment.
    Storage options given in code go into it; options from the environment
    stay there (they may hold credentials the UI would show)."""
    options = conn.storage_options if conn.storage_options_given else None
    return MvAssetsResource.from_env(conn.uri, storage_options=options, pyspark=pyspark)


def _launchers(tables: dict[str, TableInfo], view_infos: list[TableInfo], roots: list[str], pdefs: dict,
               view_assets: dict, column_keys: dict, jobs: dict, *, conditions: bool, interval: int,
               running: bool) -> tuple[list[Any], list[Any]]:
    """What launches the refreshes: the sensors of ``automation`` (each
    lineage's, and each table's read only as a joined source) and, with
    sensors, the schedule of each cron view; started when ``running``."""
    watches = join_watches(view_infos, tables, view_assets, jobs, pdefs)
    # base tables read only as joined sources of join views: a sensor each, for those views alone
    joined_only = sorted(t for t in watches if t not in roots and not tables[t].is_view)
    status = dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED
    if conditions:
        return _condition_sensors(tables, [*roots, *joined_only], pdefs, column_keys, view_assets, interval,
                                  status), []
    sensors = _table_sensors(tables, roots, joined_only, pdefs, view_assets, column_keys, jobs, watches, interval,
                             status)
    schedule_status = dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED
    schedules: list[Any] = [view_schedule(v, pdefs.get(v.root), view_assets[v.name], schedule_status,
                                          jobs.get(v.root)) for v in view_infos if v.policy.kind == "cron"]
    return sensors, schedules


def _table_sensors(tables: dict[str, TableInfo], roots: list[str], joined_only: list[str], pdefs: dict,
                   view_assets: dict, column_keys: dict, jobs: dict, watches: dict, interval: int, status) -> list[Any]:
    """``automation="sensor"``: the ``<table>_changes`` sensor of each lineage,
    and of each table read only as a joined source (for those join views)."""
    return [
        table_sensor(tables[r], tables, pdefs[r], view_assets, column_keys[r], interval, status, jobs[r],
                     watches.get(r))
        for r in roots
    ] + [
        table_sensor(tables[t], tables, None, view_assets, [], interval, status, None, watches[t])
        for t in joined_only
    ]


def _lineage_assets(roots: list[str], view_infos: list[TableInfo], tables: dict[str, TableInfo], pdefs: dict,
                    conditions: bool, runner: str, pipes) -> tuple[dict[str, Any], dict, dict]:
    """The multi-asset of each base table's lineage (by root), the asset keys
    of each view (the view, its UDF columns, its row columns) and the keys of
    each root's computed columns."""
    view_assets: dict[str, list[dg.AssetKey]] = {}
    column_keys: dict[str, list[dg.AssetKey]] = {}
    lineages: dict[str, Any] = {}
    for root in roots:
        tree = lineage_order([v for v in view_infos if v.root == root], tables)
        asset, keys, columns = lineage_asset(tables[root], tree, tables, pdefs[root], conditions, runner, pipes=pipes)
        lineages[root] = asset
        view_assets.update(keys)
        column_keys[root] = columns
    return lineages, view_assets, column_keys


def _condition_sensors(tables: dict[str, TableInfo], watched: list[str], pdefs: dict, column_keys: dict,
                       view_assets: dict, interval: int, status) -> list[Any]:
    """``automation="conditions"``: a ``<table>_observe`` sensor per watched
    table, and the automation condition sensor over the views and the
    tables' computed columns."""
    sensors: list[Any] = [observe_sensor(tables[r], pdefs.get(r), interval, status) for r in watched]
    targets = [k for keys in column_keys.values() for k in keys] + [k for keys in view_assets.values() for k in keys]
    if targets:
        sensors.append(dg.AutomationConditionSensorDefinition(
            AUTOMATION_SENSOR, target=dg.AssetSelection.assets(*targets), default_status=status,
            minimum_interval_seconds=interval,
            description="Evaluates the AutomationConditions of the views (from their refresh policies) "
                        "and of the tables' computed columns, and requests their runs.",
        ))
    return sensors


def _full_check_schedules(check_jobs: list, running: bool) -> list[dg.ScheduleDefinition]:
    """The daily schedule of each ``full_checks_<table>`` job."""
    return [
        dg.ScheduleDefinition(
            name=f"{job.name}_daily", job=job, cron_schedule=FULL_CHECKS_CRON,
            default_status=dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED,
            description=f"Runs {job.name} daily: the full checks of its views (every row).",
        )
        for job in check_jobs
    ]
