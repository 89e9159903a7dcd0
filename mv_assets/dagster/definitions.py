"""Build Dagster definitions from a catalog: wiring only, the engine does the work.

* every base table -> an observable source asset (data version = Lance version);
* every view -> an asset partitioned by source fragment (one dynamic
  partitions definition per source), materialized together with its UDF
  columns, which are downstream assets with the same partitions;
* views over views -> the upstream view and its columns feed the derived view;
* one sensor per table that views read: cursor = Lance version; it adds
  partitions for new fragments, retires partitions of fragments that are gone,
  and requests one run for what changed with the source version pinned;
* computed columns added to a base table (``add_columns``) -> downstream
  assets of the table (code version = UDF fingerprint) materialized by a
  checkpointed backfill of the rows that need it; a ``<table>_columns``
  sensor requests them when new or changed rows lack values.

Loading these definitions reads view metadata only: no UDF is unpickled and
no JVM starts.
"""

import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import dagster as dg
import lance

from ..catalog import Connection, connect
from ..changes import fragment_changes
from ..checks import check_view
from ..policy import POLICY_METADATA_KEY, RefreshPolicy
from ..columns import COLUMNS_METADATA_KEY
from ..query import VIEW_METADATA_KEY
from ..spark import InlineRunner
from ..status import refresh_decision, view_status
from .resource import MvAssetsResource

__all__ = ["build_definitions", "TableInfo", "catalog_tables", "TAG_SOURCE_VERSION", "TAG_SCOPE", "RESOURCE_KEY"]

RESOURCE_KEY = "mv_assets"
TAG_SOURCE_VERSION = "mv_assets/source_version"
TAG_SCOPE = "mv_assets/scope"
CHECK_NAMES = ("matches_source_query", "no_orphan_rows", "udf_values_present")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def partitions_def_name(source: str) -> str:
    return f"{_safe(source)}__fragments"


@dataclass
class TableInfo:
    """What the wiring needs to know of a table, read without unpickling UDFs."""

    name: str
    uri: str
    is_view: bool
    source: str | None = None
    filter: str | None = None
    limit: int | None = None
    columns: list[dict] = field(default_factory=list)
    policy: RefreshPolicy = field(default_factory=RefreshPolicy)

    @property
    def udf_columns(self) -> list[dict]:
        return [c for c in self.columns if c["kind"] == "udf"]

    @property
    def partitioned(self) -> bool:
        return self.is_view and self.limit is None


def catalog_tables(db: Connection) -> dict[str, TableInfo]:
    out = {}
    for name in db.table_names():
        uri = db._table_uri(name)
        md = lance.dataset(uri).schema.metadata or {}
        raw = md.get(VIEW_METADATA_KEY.encode())
        if raw is None:
            cols = json.loads(md.get(COLUMNS_METADATA_KEY.encode(), b"[]"))
            out[name] = TableInfo(name, uri, False, columns=cols)
        else:
            d = json.loads(raw)
            policy = RefreshPolicy.from_json(md.get(POLICY_METADATA_KEY.encode()))
            out[name] = TableInfo(name, uri, True, d["source"], d.get("filter"), d.get("limit"), d["columns"], policy)
    return out


def _view_description(info: TableInfo) -> str:
    cols = ", ".join(c["name"] for c in info.columns)
    where = f" where `{info.filter}`" if info.filter else ""
    lim = f", limited to {info.limit} rows" if info.limit is not None else ""
    return (
        f"Materialized view over `{info.source}`{where}{lim}: {cols}. "
        f"One partition per source fragment; refreshed incrementally on Spark. Policy: {info.policy.describe()}."
    )


def _udf_description(view: str, col: dict) -> str:
    u = col["udf"]
    inputs = ", ".join(u.get("input_columns") or ["<all columns>"])
    return f"UDF column `{col['name']}` of `{view}`: `{u['name']}`({inputs}) -> {u['data_type']}. Code fingerprint {u['fingerprint']}."


def _source_observation(name: str, uri: str) -> dg.AssetObservation:
    ds = lance.dataset(uri)
    return dg.AssetObservation(
        asset_key=dg.AssetKey([name]),
        metadata={"lance_version": ds.version, "fragments": len(ds.get_fragments())},
        tags={"dagster/data_version": str(ds.version)},
    )


def _make_source_asset(info: TableInfo):
    @dg.observable_source_asset(
        key=dg.AssetKey([info.name]),
        group_name="sources",
        description=f"Lance table `{info.name}` ({info.uri}). Its data version is the Lance version.",
        required_resource_keys={RESOURCE_KEY},
        tags={"dagster/kind/lance": ""},
    )
    def _observe(context) -> dg.DataVersion:
        ds = lance.dataset(info.uri)
        return dg.DataVersion(str(ds.version))

    return _observe


def _view_asset(info: TableInfo, tables: dict[str, TableInfo], pdefs: dict[str, Any]):
    view_key = dg.AssetKey([info.name])
    src = tables[info.source]
    pdef = pdefs.get(info.source) if info.partitioned else None
    if src.is_view:
        mapping = dg.AllPartitionMapping() if (pdef is not None or src.partitioned) else None
        deps = [dg.AssetDep(dg.AssetKey([src.name]), partition_mapping=mapping)] + [
            dg.AssetDep(dg.AssetKey([src.name, c["name"]]), partition_mapping=mapping) for c in src.udf_columns
        ]
    else:
        deps = [dg.AssetDep(dg.AssetKey([src.name]))] + [
            dg.AssetDep(dg.AssetKey([src.name, c["name"]])) for c in src.columns
        ]
    common = {"group_name": _safe(info.name)}
    specs = [
        dg.AssetSpec(
            view_key,
            deps=deps,
            description=_view_description(info),
            kinds={"lance", "spark"},
            metadata={
                "uri": info.uri,
                "source": info.source,
                "filter": info.filter or "",
                "refresh_policy": info.policy.describe(),
            },
            tags={"mv_assets/policy": info.policy.kind},
            freshness_policy=_freshness(info.policy),
            **common,
        )
    ]
    col_keys = {}
    for col in info.udf_columns:
        key = dg.AssetKey([info.name, col["name"]])
        col_keys[col["name"]] = key
        specs.append(
            dg.AssetSpec(
                key,
                deps=[view_key],
                description=_udf_description(info.name, col),
                kinds={"python", "spark"},
                code_version=col["udf"]["fingerprint"],
                metadata={"udf": col["udf"]["name"], "data_type": col["udf"]["data_type"]},
                **common,
            )
        )
    check_specs = [dg.AssetCheckSpec(name, asset=view_key) for name in CHECK_NAMES]

    @dg.multi_asset(
        name=f"refresh_{_safe(info.name)}",
        specs=specs,
        check_specs=check_specs,
        can_subset=True,
        partitions_def=pdef,
        backfill_policy=dg.BackfillPolicy.single_run() if pdef is not None else None,
        required_resource_keys={RESOURCE_KEY},
        op_tags={"dagster/kind/spark": ""},
    )
    def _refresh(context: dg.AssetExecutionContext):
        resource: MvAssetsResource = getattr(context.resources, RESOURCE_KEY)
        db = resource.connection()
        view = db.open_table(info.name)
        tags = context.run.tags
        pinned = int(tags[TAG_SOURCE_VERSION]) if TAG_SOURCE_VERSION in tags else None
        partitions = list(context.partition_keys) if pdef is not None else []
        whole = pdef is None or tags.get(TAG_SCOPE) == "changes"
        selected = context.selected_asset_keys
        # Only UDF columns selected (say their code changed): recompute just those
        # columns for the rows in scope; changed rows are refreshed as usual.
        recompute = None
        if view_key not in selected:
            recompute = [name for name, key in col_keys.items() if key in selected]
        fragments = None if whole else [int(k) for k in partitions]
        started = time.perf_counter()
        result = view.refresh(src_version=pinned, fragments=fragments, recompute=recompute)
        duration = time.perf_counter() - started
        context.log.info(
            f"{info.name}: source v{result.from_version}->v{result.to_version}, +{result.rows_inserted} "
            f"~{result.rows_updated} -{result.rows_deleted}, UDF rows {result.udf_rows_computed}, "
            f"{result.tasks} tasks ({result.tasks_resumed} resumed) in {duration:.2f}s"
        )
        base = {
            "source_version": result.to_version,
            "view_version": result.view_version,
            "duration_s": round(duration, 3),
            "partitions": dg.MetadataValue.json(partitions),
            "scope": "changes since last refresh" if whole else "selected fragments",
        }
        if view_key in selected:
            yield dg.MaterializeResult(
                asset_key=view_key,
                data_version=dg.DataVersion(str(result.view_version)),
                metadata={
                    **base,
                    "rows_inserted": result.rows_inserted,
                    "rows_updated": result.rows_updated,
                    "rows_deleted": result.rows_deleted,
                    "rows_total": view.count_rows(),
                    "udf_rows_computed": sum(result.udf_rows_computed.values()),
                    "tasks": result.tasks,
                    "tasks_resumed": result.tasks_resumed,
                    **_status_metadata(view),
                },
            )
        for name, key in col_keys.items():
            if key in selected:
                yield dg.MaterializeResult(
                    asset_key=key,
                    metadata={**base, "udf_rows_computed": result.udf_rows_computed.get(name, 0)},
                )
        wanted_checks = {k.name for k in context.selected_asset_check_keys}
        if wanted_checks:
            for outcome in check_view(view):
                if outcome.name in wanted_checks:
                    yield dg.AssetCheckResult(
                        asset_key=view_key,
                        check_name=outcome.name,
                        passed=outcome.passed,
                        description=outcome.description,
                        metadata={k: dg.MetadataValue.json(v) if isinstance(v, (dict, list)) else v for k, v in outcome.metadata.items()},
                    )

    return _refresh, [view_key, *col_keys.values()]


def _column_description(table: str, col: dict) -> str:
    if col["kind"] == "sql":
        return f"SQL column `{col['name']}` of `{table}`: `{col['expr']}`, computed for new rows as they arrive."
    return _udf_description(table, col).replace("UDF column", "Computed column", 1) + (
        " Materializing backfills the rows that lack a value from this code (checkpointed, resumable)."
    )


def _table_columns_asset(info: TableInfo):
    """The computed columns of a base table: materializing one backfills it."""
    table_key = dg.AssetKey([info.name])
    specs, keys = [], {}
    for col in info.columns:
        key = dg.AssetKey([info.name, col["name"]])
        keys[col["name"]] = key
        fingerprint = col["udf"]["fingerprint"] if "udf" in col else None
        specs.append(
            dg.AssetSpec(
                key,
                deps=[table_key],
                description=_column_description(info.name, col),
                kinds={"python", "spark"} if "udf" in col else {"sql"},
                code_version=fingerprint,
                metadata={"udf": col["udf"]["name"], "data_type": col["udf"]["data_type"]} if "udf" in col else {
                    "expression": col.get("expr", "")},
                group_name="sources",
            )
        )

    @dg.multi_asset(
        name=f"backfill_{_safe(info.name)}_columns",
        specs=specs,
        can_subset=True,
        required_resource_keys={RESOURCE_KEY},
        op_tags={"dagster/kind/spark": ""},
    )
    def _backfill(context: dg.AssetExecutionContext):
        resource: MvAssetsResource = getattr(context.resources, RESOURCE_KEY)
        table = resource.connection().open_table(info.name)
        done: dict[str, Any] = {}
        for name, key in keys.items():
            if key not in context.selected_asset_keys:
                continue
            if name not in done:
                result = table.backfill(name)
                for c in result.columns:  # a multi-column UDF fills its siblings too
                    done[c] = result
                context.log.info(
                    f"{info.name}.{name}: {result.rows_written} rows written, {result.rows_failed} failed, "
                    f"{result.rows_skipped} changed meanwhile, {result.batches_resumed}/{result.batches} batches "
                    f"resumed, job {result.job_id}"
                )
            r = done[name]
            yield dg.MaterializeResult(
                asset_key=key,
                metadata={
                    "job_id": r.job_id,
                    "rows_written": r.rows_written,
                    "rows_failed": r.rows_failed,
                    "rows_skipped": r.rows_skipped,
                    "udf_rows_computed": r.udf_rows_computed,
                    "batches_resumed": r.batches_resumed,
                    "table_version": r.version if r.version is not None else table.version,
                },
            )

    return _backfill, list(keys.values())


def _make_columns_sensor(info: TableInfo, keys: list[dg.AssetKey], interval: int, status):
    @dg.sensor(
        name=f"{_safe(info.name)}_columns",
        minimum_interval_seconds=interval,
        default_status=status,
        asset_selection=keys,
        description=(
            f"Watches Lance table `{info.name}`; on a new version it requests a backfill of the computed columns "
            f"({', '.join(c['name'] for c in info.columns)}) that have rows without a current value."
        ),
    )
    def _sensor(context: dg.SensorEvaluationContext):
        version = lance.dataset(info.uri).version
        if context.cursor and int(context.cursor) == version:
            return dg.SkipReason(f"{info.name} is still at version {version}")
        table = connect(os.path.dirname(info.uri), runner=InlineRunner()).open_table(info.name)
        stale = [k for k, c in zip(keys, info.columns) if table.plan_backfill(c["name"]).rows > 0]
        runs = [dg.RunRequest(run_key=f"{info.name}@{version}:columns", asset_selection=stale)] if stale else []
        return dg.SensorResult(run_requests=runs, cursor=str(version))

    return _sensor


def _freshness(policy: RefreshPolicy):
    """A ttl view is expected to be refreshed within its ttl: the UI shows it as
    warning after one ttl plus a sensor margin, failing after two."""
    if policy.kind != "ttl" or policy.ttl_seconds is None:
        return None
    ttl = timedelta(seconds=policy.ttl_seconds)
    margin = timedelta(minutes=1)
    return dg.FreshnessPolicy.time_window(fail_window=2 * ttl + margin, warn_window=ttl + margin)


def _status_metadata(view) -> dict:
    s = view_status(view)
    return {
        "load_state": s.load_state,
        "valid": s.valid,
        "cardinality": s.cardinality,
        "load_number": s.load_number,
        "node": s.node or "",
        "versions_behind": s.versions_behind,
        "stale_count": s.stale_count,
        "refresh_policy": s.policy,
    }


def _range_tags(keys: list[str]) -> dict:
    return {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}


def _make_sensor(source: TableInfo, views: list[TableInfo], pdef, view_assets: dict, interval: int, status):
    eager = [v for v in views if v.policy.kind == "eager"]
    deferred = [v for v in views if v.policy.kind in ("ttl", "staleness")]
    part_keys = [k for v in eager if v.partitioned for k in view_assets[v.name]]
    flat_keys = [k for v in eager if not v.partitioned for k in view_assets[v.name]]
    watched = [k for v in eager + deferred for k in view_assets[v.name]]

    @dg.sensor(
        name=f"{_safe(source.name)}_changes",
        minimum_interval_seconds=interval,
        default_status=status,
        asset_selection=watched or [k for v in views for k in view_assets[v.name]],
        description=(
            f"Watches Lance table `{source.name}`; on a new version it adds partitions for new fragments and "
            f"retires partitions of fragments that are gone. Refreshes eagerly: "
            f"{', '.join(v.name for v in eager) or 'none'}; when their ttl / staleness policy says so: "
            f"{', '.join(v.name for v in deferred) or 'none'}."
        ),
    )
    def _sensor(context: dg.SensorEvaluationContext):
        since = int(context.cursor) if context.cursor else None
        known = set()
        if pdef is not None:
            known = {int(k) for k in context.instance.get_dynamic_partitions(pdef.name)}
        ch = fragment_changes(source.uri, since, known)
        due = []
        if deferred:
            db = connect(os.path.dirname(source.uri), runner=InlineRunner())
            for v in deferred:
                decision = refresh_decision(db.open_table(v.name))
                context.log.info(f"{v.name}: {decision.reason}")
                if decision.refresh:
                    due.append(v)
        if since == ch.version and not ch.added and not ch.retired and not due:
            return dg.SkipReason(f"{source.name} is still at version {ch.version}")
        part_requests = []
        if pdef is not None and ch.added:
            part_requests.append(pdef.build_add_request([str(f) for f in ch.added]))
        if pdef is not None and ch.retired:
            part_requests.append(pdef.build_delete_request([str(f) for f in ch.retired]))
        runs = []
        tags = {TAG_SOURCE_VERSION: str(ch.version), TAG_SCOPE: "changes"}
        todo = ch.to_refresh
        if since != ch.version and todo and part_keys:
            runs.append(
                dg.RunRequest(
                    run_key=f"{source.name}@{ch.version}:fragments",
                    asset_selection=part_keys,
                    tags={**tags, **_range_tags([str(todo[0]), str(todo[-1])])},
                )
            )
        if since != ch.version and flat_keys:
            runs.append(dg.RunRequest(run_key=f"{source.name}@{ch.version}", asset_selection=flat_keys, tags=tags))
        all_parts = [str(f) for f in ch.fragments]
        for v in due:  # deferred policies refresh everything changed since the view's own version
            extra = _range_tags(all_parts) if v.partitioned and all_parts else {}
            if v.partitioned and not all_parts:
                continue
            runs.append(
                dg.RunRequest(
                    run_key=f"{source.name}@{ch.version}:{v.name}",
                    asset_selection=view_assets[v.name],
                    tags={**tags, **extra, "mv_assets/policy": v.policy.kind},
                )
            )
        events = [] if source.is_view else [_source_observation(source.name, source.uri)]
        return dg.SensorResult(
            run_requests=runs, dynamic_partitions_requests=part_requests, cursor=str(ch.version), asset_events=events
        )

    return _sensor


def _make_schedule(view: TableInfo, pdef, keys: list[dg.AssetKey], status):
    @dg.schedule(
        name=f"{_safe(view.name)}_schedule",
        cron_schedule=view.policy.cron,
        target=keys,
        default_status=status,
        description=f"Refreshes `{view.name}` on its cron policy '{view.policy.cron}' when its source moved.",
    )
    def _schedule(context: dg.ScheduleEvaluationContext):
        db = connect(os.path.dirname(view.uri), runner=InlineRunner())
        decision = refresh_decision(db.open_table(view.name), scheduled=True)
        if not decision.refresh:
            return dg.SkipReason(decision.reason)
        tags = {TAG_SCOPE: "changes", "mv_assets/policy": "cron"}
        if pdef is not None:
            parts = context.instance.get_dynamic_partitions(pdef.name)
            if not parts:
                return dg.SkipReason("no partitions yet: the source sensor adds them")
            tags.update(_range_tags(list(parts)))
        return dg.RunRequest(asset_selection=keys, tags=tags)

    return _schedule


def build_definitions(
    db: Connection | str,
    *,
    resource: MvAssetsResource | None = None,
    sensor_interval_seconds: int = 15,
    sensors_running: bool = True,
) -> dg.Definitions:
    """Definitions for every table and view of the catalog ``db`` (a Connection or URI).

    Runs execute in process (one Spark session per run, shared by its assets).
    """
    conn = db if isinstance(db, Connection) else connect(db)
    tables = catalog_tables(conn)
    resource = resource or MvAssetsResource(catalog_uri=conn.uri)
    status = dg.DefaultSensorStatus.RUNNING if sensors_running else dg.DefaultSensorStatus.STOPPED
    sources_read = sorted({t.source for t in tables.values() if t.is_view and t.source in tables})
    pdefs = {s: dg.DynamicPartitionsDefinition(name=partitions_def_name(s)) for s in sources_read}
    assets: list[Any] = [_make_source_asset(t) for t in tables.values() if not t.is_view]
    view_assets: dict[str, list[dg.AssetKey]] = {}
    for t in tables.values():
        if t.is_view and t.source in tables:
            asset, keys = _view_asset(t, tables, pdefs)
            assets.append(asset)
            view_assets[t.name] = keys
    sensors = []
    for t in tables.values():
        if not t.is_view and t.columns:
            asset, keys = _table_columns_asset(t)
            assets.append(asset)
            sensors.append(_make_columns_sensor(t, keys, sensor_interval_seconds, status))
    for s in sources_read:
        views = [t for t in tables.values() if t.is_view and t.source == s]
        sensors.append(_make_sensor(tables[s], views, pdefs[s], view_assets, sensor_interval_seconds, status))
    schedules = [
        _make_schedule(
            t,
            pdefs.get(t.source) if t.partitioned else None,
            view_assets[t.name],
            dg.DefaultScheduleStatus.RUNNING if sensors_running else dg.DefaultScheduleStatus.STOPPED,
        )
        for t in tables.values()
        if t.is_view and t.name in view_assets and t.policy.kind == "cron"
    ]
    return dg.Definitions(
        assets=assets,
        sensors=sensors,
        schedules=schedules,
        resources={RESOURCE_KEY: resource},
        executor=dg.in_process_executor,
    )
