"""Sensors and schedules: one sensor per base table watches it and every view
downstream of it (views over views included), and asks the engine what is
due; Dagster only launches the runs.

Per tick of ``<table>_changes``:

* partitions: new source fragments are added, fragments that are gone (and
  keys that are not fragment ids, say typed in the launch dialog) retired;
* one run (partition range over the changed fragments) for everything due:
  computed columns of the table with rows lacking a current value (a
  backfill), views their refresh policy says are due (a commit that matters
  to them, or a ttl / staleness threshold; refreshed incrementally to the
  version the sensor saw), and views over views whose upstream is due (they
  run after it in the same run, so they never wait for another tick and
  never fail because of ordering);
* join views of other lineages that read the table (or a view of its
  lineage) as a joined source: each one its policy says is due gets a run of
  its own lineage's job (``refresh_<its first table's root>``), over every
  partition of that lineage (a join view refreshes as a whole), one run of a
  lineage at a time as for the lineage's own sensor.

Run keys carry the versions and load numbers they act on, so a tick that sees
the same state again requests nothing new.
"""

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (  # not exported by dagster
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.data_version import DATA_VERSION_TAG  # not exported by dagster
from dagster._core.events import DagsterEventType

from mv_assets.api.table import MaterializedView, Table
from mv_assets.dagster.assets import (
    CODE_CHECK,
    TAG_RECORD_ONLY,
    TAG_SCOPE,
    TAG_SOURCE_VERSION,
    code_check_evaluations,
    fragment_keys,
    fragment_observation,
    safe_name,
    source_observation,
    unobserved_fragments,
)
from mv_assets.dagster.catalog import TableInfo
from mv_assets.dagster.resource import MvAssetsResource

__all__ = ["table_sensor", "observe_sensor", "view_schedule", "lineage_order", "JoinWatch", "TAG_JOINED"]

TAG_JOINED = "mv_assets/joined_source"  # on a join view's run launched by a joined source's sensor: that source


def lineage_order(views: list[TableInfo], tables: dict[str, TableInfo]) -> list[TableInfo]:
    """Views ordered so each comes after every view it reads (a join view:
    after each of its sources)."""
    memo: dict[str, int] = {}

    def depth(name: str, seen: frozenset) -> int:
        t = tables.get(name)
        if t is None or not t.is_view or name in seen:
            return 0
        if name not in memo:
            memo[name] = 1 + max((depth(s, seen | {name}) for s in t.sources), default=0)
        return memo[name]

    return sorted(views, key=lambda v: (depth(v.name, frozenset()), v.name))


@dataclass(frozen=True)
class JoinWatch:
    """A join view of another lineage that a table's sensor refreshes when a
    joined source moved: the view, what its run selects (the view's assets
    and its eager views below), its lineage's job and partitions."""

    view: TableInfo
    keys: list[dg.AssetKey]
    job: Any  # its lineage's refresh_<table> (an asset job)
    pdef: dg.DynamicPartitionsDefinition | None


def _range_tags(keys: list[str]) -> dict:
    return {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}


def _parse_cursor(raw: str | None) -> tuple[int | None, dict, dict]:
    """The cursor: the table version last seen, the last reported state of
    each code check, and the whole cursor (what the last full look saw: the
    views' versions, the declared code, when a ttl runs out)."""
    if not raw:
        return None, {}, {}
    if raw.isdigit():  # cursors of earlier releases: the bare version
        return int(raw), {}, {}
    d = json.loads(raw)
    return d.get("version"), d.get("code", {}), d


def _code_id(tree: list[TableInfo]) -> str:
    """The code declared for the lineage's views now (changes on a reload of
    definitions with edited UDFs)."""
    code = [(v.name, v.declared is not None, [(c["name"], (c.get("udf") or {}).get("fingerprint"))
                                              for c in v.columns]) for v in tree]
    return hashlib.sha256(json.dumps(code, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _idle(seen: dict, since: int | None, watched: dict[str, int | None], table: str, code_id: str) -> bool:
    """Nothing a full look could act on changed since the last one: the
    table's version, every view's version (a refresh or backfill made
    elsewhere, a view created or dropped), the declared code; and no ttl ran
    out. Then a tick costs one version read per dataset of the lineage,
    whatever the catalog's size."""
    due_at = seen.get("due_at")
    return (since is not None and watched.get(table) == since and seen.get("code_id") == code_id
            and seen.get("views") == {n: v for n, v in watched.items() if n != table}
            and (due_at is None or _now() < due_at))


TAG_LINEAGE = "mv_assets/lineage"
_IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def _run_in_flight(context: dg.SensorEvaluationContext, table: str) -> bool:
    runs = context.instance.get_run_records(
        filters=dg.RunsFilter(tags={TAG_LINEAGE: table}, statuses=_IN_FLIGHT), limit=1
    )
    return bool(runs)


def _latest_materialization(instance, key: dg.AssetKey):
    """What a check evaluated outside a run is about: the asset's latest
    materialization (None: never materialized)."""
    records = instance.fetch_materializations(key, limit=1).records
    if not records:
        return None
    r = records[0]
    return AssetCheckEvaluationTargetMaterializationData(storage_id=r.storage_id, run_id=r.run_id, timestamp=r.timestamp)


def _code_checks(context, tree: list[TableInfo], db, reported: dict, state: dict):
    """Columns of views declared in code: a failed ``udf_code_current`` check
    marks the ones with rows not computed by the declared code (a code change,
    a recompute that failed). Reported when the verdict or the counts change,
    against the column's latest materialization: without it, the UI counts an
    evaluation made outside a run as about the latest materialization only if
    its timestamp (whole seconds in SQLite) is later, and shows "0/1 passed"
    for a check that passed."""
    checks = []
    for v in tree:
        for key, (passed, text, md) in code_check_evaluations(v, db).items():
            state[key.to_user_string()] = text
            if reported.get(key.to_user_string()) != text:
                checks.append(dg.AssetCheckEvaluation(
                    asset_key=key, check_name=CODE_CHECK, passed=passed, description=text, metadata=md,
                    target_materialization_data=_latest_materialization(context.instance, key),
                ))
    return checks, state


def _partition_changes(context, table: Table, pdef, since: int | None):
    """The table's fragment changes since the cursor's version, the dynamic
    partition requests that follow (new fragments added, keys that are not
    fragment ids retired), and the request retiring the partitions of
    fragments that are gone (held back while a run may still name them)."""
    part_requests = []
    known: list[int] = []
    if pdef is not None:
        known, bad = fragment_keys(context.instance.get_dynamic_partitions(pdef.name))
        if bad:
            part_requests.append(pdef.build_delete_request(bad))
            context.log.warning(
                f"retired partition keys {bad}: they are not fragment ids of {table.name!r} "
                "(partitions of its views are source fragments)"
            )
    ch = table.fragment_changes(since, known)
    if pdef is not None and ch.added:
        part_requests.append(pdef.build_add_request([str(f) for f in ch.added]))
    retire = pdef.build_delete_request([str(f) for f in ch.retired]) if pdef is not None and ch.retired else None
    return ch, part_requests, retire


def _due_views(context, db, tree: list[TableInfo], watched: dict[str, int | None]
               ) -> tuple[dict[str, str], dict[str, int], float | None]:
    """The views of the lineage their policies say are due (with why), every
    view's load number, and when a ttl not run out yet will (None: none)."""
    due: dict[str, str] = {}
    loads: dict[str, int] = {}
    due_at: float | None = None
    for v in tree:
        if watched.get(v.name) is None:  # declared in code, not created yet: its first run creates it
            if v.policy.kind in ("manual", "cron"):  # (on request only, or its schedule: it computed every row)
                context.log.info(f"{v.name}: declared in code, not created yet; its policy ({v.policy.kind}) "
                                 "leaves its first run to a request")
                continue
            due[v.name], loads[v.name] = "declared in code, not created yet", 0
            continue
        view = db.open_view(v.name)
        decision = view.refresh_decision()
        loads[v.name] = view.refresh_state().load_number
        upstream = [s for s in v.sources if s in due]  # (a join view: any of its sources)
        upstream_due = bool(upstream) and v.policy.kind == "eager"
        if decision.refresh or upstream_due:
            due[v.name] = decision.reason if decision.refresh else f"its upstream {upstream[0]} is due"
            context.log.info(f"{v.name}: refresh ({due[v.name]})")
        elif decision.retry_at is not None:
            due_at = decision.retry_at if due_at is None else min(due_at, decision.retry_at)
    return due, loads, due_at


def _join_run(context, db, table: str, version: int | None, watch: JoinWatch
              ) -> tuple[dg.RunRequest | None, float | None]:
    """A run of a join view of another lineage when its policy says it is due
    (a joined source moved), and when to look again (None: at the next
    change): a run of its lineage in flight defers it to the next tick."""
    v = watch.view
    if v.name not in db:  # declared in code, not created yet: its own lineage's sensor creates it
        return None, None
    view = db.open_view(v.name)
    decision = view.refresh_decision()
    if not decision.refresh:
        return None, decision.retry_at
    if _run_in_flight(context, v.root):  # one run of a lineage at a time: the next tick asks again
        context.log.info(f"{v.name}: due ({decision.reason}), waiting for the run of {v.root}'s lineage in progress")
        return None, time.time()
    parts = list(context.instance.get_dynamic_partitions(watch.pdef.name)) if watch.pdef is not None else []
    if watch.pdef is not None and not parts:  # its lineage's sensor has not ticked yet: its first run refreshes it
        return None, None
    context.log.info(f"{v.name}: refresh ({decision.reason}), a join view of {v.root}'s lineage reading {table}")
    tags = {TAG_SCOPE: "changes", TAG_LINEAGE: v.root, TAG_JOINED: table, **(_range_tags(parts) if parts else {})}
    load = view.refresh_state().load_number
    return dg.RunRequest(run_key=f"{table}@{version}:join:{v.name}#{load}", job_name=watch.job.name,
                         asset_selection=watch.keys, tags=tags), None


@dataclass(frozen=True)
class _Watched:
    """What a table's sensor watches, fixed when the definitions are built."""

    table: TableInfo
    tree: list[TableInfo]  # its views, in lineage order
    pdef: Any
    view_assets: dict[str, list[dg.AssetKey]]
    column_keys: list[dg.AssetKey]
    columns: list[str]
    joins: list[JoinWatch]
    own_job: str | None  # (a sensor of several jobs names each run's)
    interval: int = 30  # seconds between ticks (a failed run's second retry waits that long, see _retry_wait)


def table_sensor(
    table: TableInfo,
    tables: dict[str, TableInfo],
    pdef,
    view_assets: dict[str, list[dg.AssetKey]],
    column_keys: list[dg.AssetKey],
    interval: int,
    status,
    job=None,
    joins: list[JoinWatch] | None = None,
):
    """The sensor ``<table>_changes``; its runs are runs of ``job`` (the
    lineage's ``refresh_<table>``), each selecting what is due. ``joins``:
    join views of other lineages reading the table (or a view of its
    lineage) as a joined source; each due one gets a run of its own lineage's
    job. A table read only as a joined source has a sensor for those alone."""
    joins = list(joins or [])
    tree = lineage_order([t for t in tables.values() if t.is_view and t.root == table.name and t.name in view_assets], tables)
    selection = [k for v in tree for k in view_assets[v.name]] + list(column_keys)
    jobs = list({j.name: j for j in ([job] if job is not None else []) + [w.job for w in joins]}.values())
    w = _Watched(table, tree, pdef, view_assets, list(column_keys), [c["name"] for c in table.columns], joins,
                 job.name if joins and job is not None else None, interval)

    @dg.sensor(
        name=f"{safe_name(table.name)}_changes",
        minimum_interval_seconds=interval,
        default_status=status,
        job=job if not joins else None,
        jobs=jobs if joins else None,
        asset_selection=selection if job is None and not joins else None,
        description=_sensor_description(w),
    )
    def _sensor(context: dg.SensorEvaluationContext, mv_assets: MvAssetsResource):
        return _tick(context, mv_assets, w)

    return _sensor


def _sensor_description(w: _Watched) -> str:
    joined_text = (f" A change of it refreshes the join views reading it, each in a run of its own lineage: "
                   f"{', '.join(j.view.name for j in w.joins)}." if w.joins else "")
    return (
        f"Watches Lance table `{w.table.name}`. On a new version it adds partitions for new fragments, retires "
        f"partitions of fragments that are gone, backfills its computed columns "
        f"({', '.join(w.columns) or 'none'}) and refreshes the views their policies say are due: "
        f"{', '.join(v.name for v in w.tree) or 'none'}.{joined_text}"
    )


def _tick(context: dg.SensorEvaluationContext, mv_assets: MvAssetsResource, w: _Watched):
    """One evaluation of the sensor ``<table>_changes`` (see the module)."""
    table, tree, pdef = w.table, w.tree, w.pdef
    since, reported, seen = _parse_cursor(context.cursor)
    db = mv_assets.reader()
    watched = db.latest_versions([table.name] + [v.name for v in tree])
    code_id = _code_id(tree)
    # (partition keys typed in the launch dialog are no fragment ids: a full look retires them;
    # the instance's list of keys is a database read, not an object-store one)
    typed = pdef is not None and bool(fragment_keys(context.instance.get_dynamic_partitions(pdef.name))[1])
    last, ended = _last_run(context, seen)
    if last == "failed" and not seen["run"].get("failed_at"):
        seen["run"]["failed_at"] = ended or _now()
    # (a failed run waiting for its retry: idle till then, its due time is the cursor's)
    waiting = last == "failed" and seen["run"].get("wait_until") is not None
    if not typed and (last != "failed" or waiting) and _idle(seen, since, watched, table.name, code_id):
        why = f"{table.name} is still at version {since} and no view below it changed"
        if waiting:
            why = _waiting_text(seen["run"])
        if last == "done":  # (its outcome known: later idle ticks look it up no more)
            return dg.SensorResult(skip_reason=why, cursor=json.dumps({k: v for k, v in seen.items() if k != "run"}))
        return dg.SkipReason(why)
    handle = db.open_table(table.name)
    ch, part_requests, retire = _partition_changes(context, handle, pdef, since)
    warning = handle.fragments_warning(len(ch.fragments)) if pdef is not None else None
    if warning:  # Dagster's limit of dynamic partitions per asset comes near
        context.log.warning(warning)
    checks, code_state = _code_checks(context, tree, db, reported, {})
    if _run_in_flight(context, table.name):
        # One run of a lineage at a time: what it leaves due is seen on the first
        # tick after it ends (the version in the cursor stays, so nothing is missed);
        # partitions it may name are retired after it.
        if not part_requests and not checks:
            return dg.SkipReason(f"a run of {table.name}'s lineage is in progress")
        return dg.SensorResult(
            dynamic_partitions_requests=part_requests, asset_events=checks,
            cursor=json.dumps({"version": since, "code": code_state, **({"run": seen["run"]} if "run" in seen else {})}),
        )
    moved = since != ch.version
    # Fragments whose rows changed since their last observation (a fragment never
    # observed: once a row of it is deleted; none on a first tick over fragments
    # written once): one observation each, so a partition downstream depends on its
    # own fragment only.
    observed = (unobserved_fragments(context.instance, handle, sorted(set(ch.to_refresh) | set(ch.added)))
                if pdef is not None and (moved or ch.added) else {})
    stale = _stale_columns(w, handle, moved, bool(observed), pdef is not None and bool(ch.added))
    due, loads, due_at = _due_views(context, db, tree, watched)
    behind = _recorded_behind(context, db, w, handle, ch.fragments, due)
    runs, retire, kept = _lineage_run(w, ch, stale, due, loads, retire, behind,
                                      seen.get("run") if last == "failed" else None, watched)
    if kept is None and last == "pending" and "run" in seen:
        kept = seen["run"]  # (its outcome is looked up at the next tick)
    retry_at = kept.get("wait_until") if kept is not None else None  # a failed run's retry, not due yet
    if retry_at is not None:
        due_at = retry_at if due_at is None else min(due_at, retry_at)
    for watch in w.joins:  # join views of other lineages reading this table (or a view of its lineage)
        request, again = _join_run(context, db, table.name, ch.version, watch)
        if request is not None:
            runs.append(request)
        if again is not None:
            due_at = again if due_at is None else min(due_at, again)
    if retire is not None:
        part_requests.append(retire)
    # what this full look saw: until one of it changes, ticks are idle (_idle)
    cursor = json.dumps({"version": ch.version, "code": code_state, "code_id": code_id, "due_at": due_at,
                         "views": {v.name: watched.get(v.name) for v in tree},
                         **({"run": kept} if kept is not None else {})})
    if not runs and not part_requests and not moved and not checks:
        why = f"{table.name} is still at version {ch.version} and no view is due"
        if retry_at is not None and kept is not None:
            why = _waiting_text(kept)
        return dg.SensorResult(skip_reason=why, cursor=cursor)
    events = [fragment_observation(handle, f, v) for f, v in observed.items()]
    if moved and pdef is None:
        events = [source_observation(handle, ch.version)]
    return dg.SensorResult(
        run_requests=runs,
        dynamic_partitions_requests=part_requests,
        cursor=cursor,
        asset_events=events + checks,
    )


RUN_KEY_TAG = "dagster/run_key"  # (Dagster's tag on a run a sensor requested: its run key)
_FAILED = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
RETRY_MAX_WAIT = 3600.0  # seconds: the longest a failed run's retry waits


def _last_run(context, seen: dict) -> tuple[str | None, float | None]:
    """What became of the run the sensor requested last (the cursor's
    ``run``): None (none requested, or its outcome known), "pending" (not
    launched yet, or going), "failed" (failed or cancelled: a full look
    requests it again) or "done"; and when it ended (None: not, or unknown)."""
    req = seen.get("run")
    if not req:
        return None, None
    records = context.instance.get_run_records(filters=dg.RunsFilter(tags={RUN_KEY_TAG: req["key"]}), limit=1)
    if not records:
        return "pending", None
    status, ended = records[0].dagster_run.status, records[0].end_time
    if status in _FAILED:
        return "failed", float(ended) if ended else None
    return ("done" if status == dg.DagsterRunStatus.SUCCESS else "pending"), None


def _waiting_text(run: dict) -> str:
    """What a tick says while a failed run waits for its retry."""
    return (f"the last run ({run['key']}) failed: it is requested again (retry {int(run.get('attempt', 0)) + 1}) "
            f"from {time.strftime('%H:%M:%S', time.localtime(run['wait_until']))}")


def _now() -> float:
    """The clock a failed run's retry is timed by."""
    return time.time()


def _retry_wait(interval: int, attempt: int) -> float:
    """Seconds a failed run's ``attempt``-th retry waits after the failure:
    none for the first (the next tick), then the sensor's interval, doubled
    at each failure in a row, at most :data:`RETRY_MAX_WAIT` (a UDF that
    fails on some row is not run again every tick)."""
    if attempt <= 1:
        return 0.0
    return min(float(max(interval, 1)) * 2 ** (attempt - 2), RETRY_MAX_WAIT)


def _recorded_behind(context, db, w: _Watched, handle: Table, fragments: list[int], due: dict[str, str]
                     ) -> dict[str, list[str]]:
    """Per view of the lineage that is current (nothing to refresh) and not
    due, the partitions Dagster records behind what the view holds: never
    materialized, or materialized from inputs older than those the view
    reflects (its source fragment's data version, its upstream partition's,
    a joined source's). A refresh made outside a run naming them leaves them
    so: from Python or the CLI, a run of other partitions or of another
    lineage that refreshed the view as a whole, a view over a view bringing
    its upstream along, a failed run's rows refreshed by the next. A run over
    them records them as they are (its refresh has nothing to do). Views
    over a view behind are behind in the same partitions. One query per view
    (and per view it reads), whatever the partition count."""
    if w.pdef is None or not fragments:
        return {}
    keys = [str(f) for f in fragments]
    storage = context.instance.event_log_storage
    current = {str(f): v for f, v in handle.fragment_data_versions(fragments).items()}
    out: dict[str, list[str]] = {}
    moving = set(due)  # views this run refreshes, or behind their sources: those over them are left alone
    for v in w.tree:
        if v.name in due or v.name not in db or not w.view_assets.get(v.name):
            continue
        if v.over_view and v.source_name in moving:  # (its upstream changes in this run, or is behind)
            moving.add(v.name)
            continue
        view = db.open_view(v.name)
        if view.pending_source_versions() or view.refresh_state().scoped_since_whole:
            moving.add(v.name)
            continue  # behind its source: Dagster showing it so is right (its policy says when it refreshes)
        view_key = w.view_assets[v.name][0]
        source_key = dg.AssetKey([v.source_name])
        joined = {}
        for name in v.joined:
            if name in db:
                other = db.open_table(name)
                joined[dg.AssetKey([name])] = str(other.version if isinstance(other, MaterializedView)
                                                  else other.data_version())
        if v.over_view:  # its partitions read the upstream view's, as last materialized
            expected = {p: t.get(DATA_VERSION_TAG) for p, t in storage.get_latest_tags_by_partition(
                source_key, DagsterEventType.ASSET_MATERIALIZATION, [DATA_VERSION_TAG], asset_partitions=keys).items()}
        else:
            expected = current
        tag = {k: f"dagster/input_data_version/{k.to_user_string()}" for k in [source_key, *joined]}
        recorded = _latest_tags(context.instance, view_key, keys)
        upstream_behind = set(out.get(v.source_name, []))
        lagging = [p for p in keys if p in upstream_behind or not recorded.get(p)
                   or recorded[p].get(tag[source_key]) != expected.get(p)
                   or any(recorded[p].get(tag[k]) != version for k, version in joined.items())]
        if lagging:
            out[v.name] = lagging
            context.log.info(f"{v.name}: {len(lagging)} partition(s) recorded behind the view's rows "
                             f"({', '.join(lagging[:10])}{', ...' if len(lagging) > 10 else ''}): recorded again")
    return out


def _latest_tags(instance, key: dg.AssetKey, partitions: list[str]) -> dict[str, dict[str, str]]:
    """The tags of the latest materialization of each of ``partitions`` of
    ``key`` (those materialized; Dagster indexes no tag but the data version
    by partition: the events are read, two queries)."""
    ids = instance.get_latest_storage_id_by_partition(key, DagsterEventType.ASSET_MATERIALIZATION, set(partitions))
    if not ids:
        return {}
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, storage_ids=list(ids.values())), limit=len(ids)).records
    out = {}
    for r in records:
        m = r.asset_materialization
        if m is not None and m.partition is not None:
            out[m.partition] = dict(r.event_log_entry.tags or {})
    return out


def _stale_columns(w: _Watched, handle: Table, moved: bool, observed: bool, new_partitions: bool
                   ) -> list[dg.AssetKey]:
    """The table's computed columns the run backfills: those with rows lacking
    a current value, and all of them when fragments changed or are new: their
    partitions of those fragments record the new input (a backfill with
    nothing to compute), or they would show Unsynced though current."""
    if not w.column_keys or not (moved or observed or new_partitions):
        return []
    return [k for k, c in zip(w.column_keys, w.columns, strict=True)
            if observed or new_partitions or handle.plan_backfill(c, where=handle.recompute_where(c)).rows > 0]


def _lineage_run(w: _Watched, ch, stale: list[dg.AssetKey], due: dict[str, str], loads: dict[str, int], retire,
                 behind: dict[str, list[str]] | None = None, failed: dict | None = None,
                 versions: dict[str, int | None] | None = None) -> tuple[list[dg.RunRequest], Any, dict | None]:
    """One run for everything due downstream of the table (its partitions
    definition is shared, so the run carries the whole lineage in order), if
    anything is, the request retiring gone fragments' partitions still to
    send, and what the cursor keeps of the run requested (None: none). The
    run key names what it acts on (table version, views' load numbers), so a
    tick that sees the same state again requests nothing new.

    ``behind``: views' partitions Dagster records behind the views' rows
    (:func:`_recorded_behind`): named by the run too, and recorded, not
    refreshed (``TAG_RECORD_ONLY``); ``versions``: the views' Lance versions
    (in the run key: the same partitions behind again after another refresh
    are a new run). ``failed``: the
    cursor's record of the last run requested, which failed: its partitions
    are named again, and a run of the same key is retried under a key of its
    own (``~retry<n>``) once :func:`_retry_wait` has passed since the failure
    (till then none is requested: the record comes back with ``wait_until``)."""
    behind = behind or {}
    wanted = list(stale) + [k for v in w.tree if v.name in due or v.name in behind for k in w.view_assets[v.name]]
    if not wanted:
        return [], retire, None
    base = f"{w.table.name}@{ch.version}:" + ",".join(f"{v.name}#{loads[v.name]}" for v in w.tree if v.name in due)
    if behind:  # (the partitions recorded behind and the views' versions: the same state is not asked again)
        state = sorted((name, parts, (versions or {}).get(name)) for name, parts in behind.items())
        digest = hashlib.sha256(json.dumps(state).encode()).hexdigest()[:8]
        base += f";recorded:{digest}"
    existing = {str(f) for f in ch.fragments}
    named = set(ch.to_refresh) | {p for parts in behind.values() for p in parts}
    attempt = 0
    if failed is not None:
        named |= {p for p in failed.get("parts", []) if p in existing}
        if failed.get("base") == base:  # the same work again: retried once the wait since the failure is over
            attempt = int(failed.get("attempt", 0)) + 1
            ready = float(failed.get("failed_at") or 0) + _retry_wait(w.interval, attempt)
            if _now() < ready:
                return [], retire, {**failed, "wait_until": ready}
    key = base if attempt == 0 else f"{base}~retry{attempt}"
    todo = sorted({str(f) for f in named}, key=int) or [str(f) for f in ch.fragments]
    if not todo and retire is not None:
        # the table has no fragment left: the run names the partitions of the fragments
        # that are gone (it refreshes the views as a whole); a later tick retires them
        todo, retire = [str(f) for f in ch.retired], None
    tags = {TAG_SOURCE_VERSION: str(ch.version), TAG_SCOPE: "changes", TAG_LINEAGE: w.table.name}
    if behind:
        tags[TAG_RECORD_ONLY] = ",".join(sorted(behind))
    request = {"key": key, "base": base, "parts": todo, "attempt": attempt}
    if todo:
        return [dg.RunRequest(run_key=key, asset_selection=wanted, tags={**tags, **_range_tags(todo)},
                              job_name=w.own_job)], retire, request
    # no fragment and no partition either: a run without partitions (Dagster cannot
    # check a partitioned asset in such a run, so it runs no checks)
    return [dg.RunRequest(run_key=key, asset_selection=wanted, tags=tags, asset_check_keys=[],
                          job_name=w.own_job)], retire, request


def view_schedule(view: TableInfo, pdef, keys: list[dg.AssetKey], status, job=None):
    """The schedule of a view with a cron policy; its runs are runs of ``job``
    (its lineage's ``refresh_<table>``) selecting the view's assets."""
    if view.policy.cron is None:
        raise ValueError(f"{view.name!r} has no cron policy to schedule")

    @dg.schedule(
        name=f"{safe_name(view.name)}_schedule",
        cron_schedule=view.policy.cron,
        target=job if job is not None else keys,
        default_status=status,
        description=f"Refreshes `{view.name}` on its cron policy '{view.policy.cron}' when its source moved.",
    )
    def _schedule(context: dg.ScheduleEvaluationContext, mv_assets: MvAssetsResource):
        db = mv_assets.reader()
        decision = db.open_view(view.name).refresh_decision(scheduled=True)
        if not decision.refresh:
            return dg.SkipReason(decision.reason)
        tags = {TAG_SCOPE: "changes", "mv_assets/policy": "cron"}
        if pdef is not None:
            parts = list(context.instance.get_dynamic_partitions(pdef.name))
            if not parts:
                # (the source's sensor adds its fragments as partitions: stopped, or not ticked yet, it has not:
                # a run naming none would refresh the view and fail recording it)
                parts = [str(f) for f in db.open_table(view.root).fragment_ids()]
                if not parts:
                    return dg.SkipReason(f"{view.root!r} has no fragments (no rows): nothing to refresh")
                context.instance.add_dynamic_partitions(pdef.name, parts)
            tags.update(_range_tags(parts))
        return dg.RunRequest(asset_selection=keys, tags=tags)

    return _schedule



def observe_sensor(table: TableInfo, pdef, interval: int, status):
    """The sensor ``<table>_observe`` (automation "conditions", in place of
    ``<table>_changes``): it launches no run. On a new Lance version it adds
    partitions for new fragments, retires those of fragments that are gone,
    and observes the fragments whose rows changed (the table, when it has no
    partitions): AutomationConditions see the new data versions."""

    @dg.sensor(
        name=f"{safe_name(table.name)}_observe",
        minimum_interval_seconds=interval,
        default_status=status,
        description=(
            f"Observes Lance table `{table.name}`: partitions for its fragments and their data versions, "
            "which the automation conditions of everything downstream see. Launches no run."
        ),
    )
    def _sensor(context: dg.SensorEvaluationContext, mv_assets: MvAssetsResource):
        since, _, _ = _parse_cursor(context.cursor)
        handle = mv_assets.reader().open_table(table.name)
        ch, part_requests, retire = _partition_changes(context, handle, pdef, since)
        if retire is not None:
            part_requests.append(retire)
        if pdef is not None:
            # every fragment never observed too: to automation conditions an unobserved partition is missing
            events = [fragment_observation(handle, f, v) for f, v in unobserved_fragments(
                context.instance, handle, ch.fragments, also=ch.fragments).items()]
        else:
            events = [source_observation(handle, ch.version)] if since != ch.version else []
        if not events and not part_requests and since == ch.version:
            return dg.SkipReason(f"{table.name} is still at version {ch.version}")
        return dg.SensorResult(dynamic_partitions_requests=part_requests, asset_events=events,
                               cursor=json.dumps({"version": ch.version}))

    return _sensor
