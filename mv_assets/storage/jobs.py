"""Job records, read from what jobs leave in the catalog (nothing else is written).

* a **backfill** commits its values with its job id, columns and counts in the
  commit's transaction properties (``mv_assets.backfill``); one with
  ``commit_granularity`` commits several times under one job id;
* a **refresh** commits the view's refresh state (``mv_assets.refresh``), with
  its job id since these records existed (older ones: ``refresh-<load number>``);
* a **load_columns** commits under ``mv_assets.load_columns``;
* a job that failed left error records (``errors.lance``: a UDF failure under
  ``on_error="fail"`` names the row) and, for a refresh, the view's load state
  record (FAILED_LOAD with the error); a refresh under way is LOADING there.

So a job's record is as durable as the table's history: a cleanup of old
versions forgets the jobs whose commits it removed. Rows a UDF skipped
(``on_error="skip"``) do not fail a job: it is DONE, with ``errors`` counted.
"""

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from mv_assets.storage import objects
from mv_assets.storage.changes import BACKFILL_KEY, STATE_KEY
from mv_assets.storage.error_log import read_errors
from mv_assets.storage.layout import Layout
from mv_assets.storage.status import FAILED_LOAD, LOADING, load_record, recorded_views

__all__ = ["JobRecord", "job_records", "LOAD_COLUMNS_KEY", "RUNNING", "DONE", "FAILED"]

LOAD_COLUMNS_KEY = "mv_assets.load_columns"
RUNNING, DONE, FAILED = "RUNNING", "DONE", "FAILED"


@dataclass(frozen=True)
class JobRecord:
    """One job, as Geneva's job records name their fields."""

    job_id: str
    job_type: str  # "backfill" | "refresh" | "load_columns"
    table_name: str
    column_name: str | None  # a backfill's or load's columns, joined by ","; None for a refresh
    status: str  # "RUNNING" | "DONE" | "FAILED"
    launched_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    version: int | None = None  # the (last) commit that recorded it
    metrics: dict = field(default_factory=dict)
    error: str | None = None


def _when(seconds: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc) if seconds else None


def _commit_time(entry: Any) -> dt.datetime | None:
    ts = entry.get("timestamp")
    if isinstance(ts, dt.datetime):
        return ts if ts.tzinfo else ts.replace(tzinfo=dt.timezone.utc)
    return None


def _from_commit(table: str, version: int, at: dt.datetime | None, props: dict) -> JobRecord | None:
    """The job a commit records, if any."""
    if BACKFILL_KEY in props:
        d = json.loads(props[BACKFILL_KEY])
        if not d.get("job_id"):  # markers restamped after an update: no job
            return None
        return JobRecord(
            d["job_id"], "backfill", table, ",".join(d.get("columns") or []) or None, DONE,
            _when(d.get("started_at")) or at, at, version,
            {"rows": d.get("rows", 0), "udf_rows_computed": d.get("udf_rows_computed", 0),
             "errors": d.get("errors", 0)},
        )
    if LOAD_COLUMNS_KEY in props:
        d = json.loads(props[LOAD_COLUMNS_KEY])
        load = d.get("load_columns") or {}
        return JobRecord(
            d.get("job_id") or f"load_columns-{table}-{version}", "load_columns", table,
            ",".join(load.get("columns") or []) or None, DONE, _when(d.get("started_at")) or at, at, version,
            {"rows": d.get("rows", 0)},
        )
    if STATE_KEY in props:
        d = json.loads(props[STATE_KEY])
        if "carried_from" in d:  # the state carried forward before a cleanup: no job
            return None
        done = _when(d.get("refreshed_at")) or at
        return JobRecord(
            d.get("job_id") or f"refresh-{d.get('load_number', 0)}", "refresh", table, None, DONE,
            _when(d.get("started_at")) or done, done, version,
            {k: d.get(k) for k in ("rows_inserted", "rows_updated", "rows_deleted", "udf_rows_computed", "udf_errors",
                                   "source_version", "full")},
        )
    return None


def _merge(a: JobRecord, b: JobRecord) -> JobRecord:
    """Two commits of one job (a backfill committing every ``commit_granularity`` fragments)."""
    metrics = dict(a.metrics)
    for k, v in b.metrics.items():
        metrics[k] = metrics.get(k, 0) + v if isinstance(v, int) and isinstance(metrics.get(k), int) else v
    launched = min((t for t in (a.launched_at, b.launched_at) if t is not None), default=None)
    completed = max((t for t in (a.completed_at, b.completed_at) if t is not None), default=None)
    return JobRecord(a.job_id, a.job_type, a.table_name, a.column_name, DONE, launched, completed,
                     max(a.version or 0, b.version or 0) or None, metrics)


def _committed(layout: Layout, table: str) -> list[JobRecord]:
    uri = layout.table_uri(table)
    if not objects.is_dataset(uri):
        return []
    ds = objects.dataset(uri)
    out: dict[str, JobRecord] = {}
    for entry in ds.versions():
        version = int(entry["version"])
        try:
            txn = objects.read_transaction(ds, version)
        except Exception:  # cleaned up: its job is forgotten
            continue
        if txn is None:
            continue
        job = _from_commit(table, version, _commit_time(entry), txn.transaction_properties or {})
        if job is not None:
            out[job.job_id] = _merge(out[job.job_id], job) if job.job_id in out else job
    return list(out.values())


def _refresh_state(layout: Layout, view: str) -> JobRecord | None:
    """A refresh the view's load state record says is under way or failed."""
    record = load_record(layout, view)
    state = record.get("load_state")
    if state not in (LOADING, FAILED_LOAD):
        return None
    running = state == LOADING and not record.get("process_gone")
    if state == LOADING and not running:
        state = FAILED_LOAD
    job_id = record.get("job_id") or f"refresh-{record.get('load_number') or '?'}"
    since = _when(record.get("state_since"))
    return JobRecord(
        job_id, "refresh", view, None, RUNNING if running else FAILED, since, None if running else since, None, {},
        None if running else (record.get("last_error") or "the refreshing process is gone"),
    )


def job_records(layout: Layout, tables: list[str], views: list[str]) -> list[JobRecord]:
    """Every job the catalog has a record of for ``tables`` (and ``views``,
    a subset of them: their refreshes), oldest first."""
    jobs: dict[tuple[str, str], JobRecord] = {}
    for name in tables:
        for job in _committed(layout, name):
            jobs[(name, job.job_id)] = job
    recorded = recorded_views(layout) if views else set()  # (one listing: only views loading or failed have one)
    for name in (v for v in views if v in recorded):
        job = _refresh_state(layout, name)
        if job is not None and (name, job.job_id) not in jobs:
            jobs[(name, job.job_id)] = job
    wanted = set(tables)
    failed: dict[tuple[str, str], list] = {}
    for e in read_errors(layout):
        if e.table in wanted:
            failed.setdefault((e.table, e.job_id), []).append(e)
    for key, errors in failed.items():
        if key in jobs:
            continue  # rows skipped by a job that committed (counted in its metrics)
        first = errors[0]
        at = first.created_at if isinstance(first.created_at, dt.datetime) else None
        jobs[key] = JobRecord(
            first.job_id, "refresh" if first.job_id.startswith("refresh-") else "backfill", first.table,
            None if first.job_id.startswith("refresh-") else first.column, FAILED, at, at, None,
            {"errors": len(errors)}, f"{first.error_type}: {first.message}",
        )
    epoch = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    return sorted(jobs.values(), key=lambda j: (j.launched_at or j.completed_at or epoch, j.job_id))
