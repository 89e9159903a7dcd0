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

A record has the shape of Geneva's (what its tools read: ``status`` an enum
with ``.value``, ``metrics`` a list of ``name``/``n``/``total``/``done``/``desc``,
``events`` a list of lines, ``config`` JSON text); fields Geneva fills from its
cluster (``cluster_name``, ``object_ref``, the manifest) are None here.
"""

import contextlib
import datetime as dt
import enum
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from mv_assets.storage import objects
from mv_assets.storage.changes import BACKFILL_KEY, STATE_KEY
from mv_assets.storage.error_log import read_errors
from mv_assets.storage.layout import Layout, lock_held
from mv_assets.storage.status import FAILED_LOAD, LOADING, load_record, recorded_views
from mv_assets.storage.versions import listed_versions

__all__ = ["JobMetric", "JobRecord", "JobStatus", "job_record", "job_records", "LOAD_COLUMNS_KEY", "RUNNING",
           "DONE", "FAILED"]

LOAD_COLUMNS_KEY = "mv_assets.load_columns"


class JobStatus(enum.StrEnum):
    """A job's status, as Geneva's enum (``.value``); equal to its name as a string (``"DONE"``)."""

    PENDING = "PENDING"  # not here: a job starts at once
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"  # not here: no job is cancelled


RUNNING, DONE, FAILED = JobStatus.RUNNING, JobStatus.DONE, JobStatus.FAILED

_DESCRIPTIONS = {
    "rows_committed": "rows the job committed",  # a refresh: inserted + updated + deleted
    "rows": "rows written",
    "udf_rows_computed": "rows the UDFs computed",
    "errors": "rows a UDF failed on (skipped, or failing the job)",
    "rows_inserted": "view rows inserted (a chunk view's: parents; a table-function view's: partitions)",
    "rows_updated": "view rows updated (a chunk view's: parents; a table-function view's: partitions)",
    "rows_deleted": "view rows deleted (a chunk view's: parents; a table-function view's: partitions)",
    "udf_errors": "rows a UDF failed on",
}


@dataclass(frozen=True)
class JobMetric:
    """One of a job's counters, as Geneva's: ``n`` of ``total`` (``total`` 0
    where a counter has no total), ``done`` once the job has ended."""

    name: str
    n: int
    total: int
    done: bool
    desc: str = ""


@dataclass(frozen=True)
class JobRecord:
    """One job, as Geneva's job records name their fields."""

    job_id: str
    job_type: str  # "backfill" | "refresh" | "load_columns"
    table_name: str
    column_name: str | None  # a backfill's or load's columns, joined by ","; None for a refresh
    status: JobStatus
    launched_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    version: int | None = None  # the (last) commit that recorded it
    metrics: list[JobMetric] = field(default_factory=list)
    error: str | None = None
    events: list[str] = field(default_factory=list)  # what happened, oldest first
    updated_at: dt.datetime | None = None  # the last event's time
    config: str = "{}"  # JSON text: what the job was asked to do
    input_columns: list[str] | None = None
    output_columns: list[str] | None = None
    launched_by: str | None = None
    cluster_name: str | None = None
    object_ref: str | None = None
    manifest_id: str | None = None
    manifest_checksum: str | None = None

    def metric(self, name: str, default: Any = None) -> Any:
        """Counter ``name``'s ``n`` (``default`` where the job has none of that name)."""
        return next((m.n for m in self.metrics if m.name == name), default)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values (times in ISO 8601, ``config`` parsed)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dt.datetime):
                value = value.isoformat()
            elif f.name == "metrics":
                value = [asdict(m) for m in value]
            elif f.name == "config":
                value = json.loads(value)
            elif isinstance(value, JobStatus):
                value = value.value
            out[f.name] = value
        return out


def _stamp(at: dt.datetime | None) -> str:
    return at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC: ") if at is not None else ""


def job_record(job_id: str, job_type: str, table: str, column: str | None, status: str,
               launched_at: dt.datetime | None, completed_at: dt.datetime | None, version: int | None = None,
               counts: dict[str, Any] | None = None, error: str | None = None,
               commits: Sequence[tuple[int, dt.datetime | None]] = (), config: dict[str, Any] | None = None
               ) -> JobRecord:
    """A record from what a job left: its integer counters become ``metrics``
    (``rows_committed``, the rows it committed, first, as a ratio of itself
    once the job is over), its commits and end become ``events``."""
    status = JobStatus(str(status).upper())
    over = status in (DONE, FAILED, JobStatus.CANCELLED)
    counts = {k: v for k, v in (counts or {}).items() if isinstance(v, int) and not isinstance(v, bool)}
    metrics: list[JobMetric] = []
    committed = counts.get("rows", sum(counts.get(k, 0) for k in ("rows_inserted", "rows_updated", "rows_deleted")))
    if version is not None:
        metrics.append(JobMetric("rows_committed", committed, committed if over else 0, over,
                                 _DESCRIPTIONS["rows_committed"]))
    metrics += [JobMetric(k, v, 0, over, _DESCRIPTIONS.get(k, "")) for k, v in counts.items()]
    events = [f"{_stamp(launched_at)}{job_type} of {table}{f' ({column})' if column else ''} launched"]
    events += [f"{_stamp(at)}committed version {v}" for v, at in commits]
    if status == FAILED:
        events.append(f"{_stamp(completed_at)}Job failed: {error or 'unknown error'}")
    elif over:
        events.append(f"{_stamp(completed_at)}Job completed with status {status.value}")
    times = [t for t in (launched_at, completed_at, *(at for _, at in commits)) if t is not None]
    columns = column.split(",") if column else None
    return JobRecord(job_id, job_type, table, column, status, launched_at, completed_at, version, metrics, error,
                     events, max(times, default=None), json.dumps(config or {}, sort_keys=True, default=str),
                     output_columns=columns)


def _when(seconds: float | None) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc) if seconds else None


def _commit_time(entry: Any) -> dt.datetime | None:
    ts = entry.get("timestamp")
    if isinstance(ts, dt.datetime):
        return ts if ts.tzinfo else ts.replace(tzinfo=dt.timezone.utc)
    return None


@dataclass
class _Committed:
    """What the commits of one job say (a backfill may commit several times)."""

    job_id: str
    job_type: str
    table: str
    column: str | None
    launched: dt.datetime | None
    counts: dict[str, Any]
    config: dict[str, Any]
    commits: list[tuple[int, dt.datetime | None]]

    def merged(self, other: "_Committed") -> "_Committed":
        counts = dict(self.counts)
        for k, v in other.counts.items():
            both_int = isinstance(v, int) and isinstance(counts.get(k), int)
            counts[k] = counts[k] + v if both_int else v
        launched = min((t for t in (self.launched, other.launched) if t is not None), default=None)
        return _Committed(self.job_id, self.job_type, self.table, self.column, launched, counts,
                          {**self.config, **other.config}, sorted(self.commits + other.commits, key=lambda c: c[0]))

    def record(self) -> JobRecord:
        version, at = self.commits[-1]
        completed = max((t for _, t in self.commits if t is not None), default=at)
        return job_record(self.job_id, self.job_type, self.table, self.column, DONE, self.launched or completed,
                          completed, version, self.counts, commits=self.commits, config=self.config)


def _from_commit(table: str, version: int, at: dt.datetime | None, props: dict) -> _Committed | None:
    """The job a commit records, if any."""
    if BACKFILL_KEY in props:
        d = json.loads(props[BACKFILL_KEY])
        if not d.get("job_id"):  # markers restamped after an update: no job
            return None
        columns = d.get("columns") or []
        return _Committed(d["job_id"], "backfill", table, ",".join(columns) or None, _when(d.get("started_at")) or at,
                          # (a row a UDF failed on is written NULL: counted in errors, not in rows, as
                          # BackfillResult.rows_written counts it)
                          {"rows": max(0, int(d.get("rows") or 0) - int(d.get("errors") or 0)),
                           "udf_rows_computed": d.get("udf_rows_computed", 0), "errors": d.get("errors", 0)},
                          {"columns": columns}, [(version, at)])
    if LOAD_COLUMNS_KEY in props:
        d = json.loads(props[LOAD_COLUMNS_KEY])
        load = d.get("load_columns") or {}
        columns = load.get("columns") or []
        return _Committed(d.get("job_id") or f"load_columns-{table}-{version}", "load_columns", table,
                          ",".join(columns) or None, _when(d.get("started_at")) or at, {"rows": d.get("rows", 0)},
                          {"columns": columns}, [(version, at)])
    if STATE_KEY in props:
        d = json.loads(props[STATE_KEY])
        if "carried_from" in d:  # the state carried forward before a cleanup: no job
            return None
        done = _when(d.get("refreshed_at")) or at
        return _Committed(d.get("job_id") or f"refresh-{d.get('load_number', 0)}", "refresh", table, None,
                          _when(d.get("started_at")) or done,
                          {k: d.get(k) for k in ("rows_inserted", "rows_updated", "rows_deleted", "udf_rows_computed",
                                                 "udf_errors") if d.get(k) is not None},
                          {k: d.get(k) for k in ("source_version", "full") if d.get(k) is not None},
                          [(version, done)])
    return None


def _committed(layout: Layout, table: str) -> list[JobRecord]:
    uri = layout.table_uri(table)
    if not objects.is_dataset(uri):
        return []
    ds = objects.dataset(uri)
    out: dict[str, _Committed] = {}
    for entry in listed_versions(ds):
        version = int(entry["version"])
        try:
            txn = objects.read_transaction(ds, version)
        except Exception:  # cleaned up: its job is forgotten
            continue
        if txn is None:
            continue
        job = _from_commit(table, version, _commit_time(entry), txn.transaction_properties or {})
        if job is not None:
            out[job.job_id] = out[job.job_id].merged(job) if job.job_id in out else job
    return [job.record() for job in out.values()]


def _refresh_state(layout: Layout, view: str) -> JobRecord | None:
    """A refresh the view's load state record says is under way or failed."""
    record = load_record(layout, view)
    state = record.get("load_state")
    if state not in (LOADING, FAILED_LOAD):
        return None
    running = state == LOADING and not record.get("process_gone")
    job_id = record.get("job_id") or f"refresh-{record.get('load_number') or '?'}"
    since = _when(record.get("state_since"))
    return job_record(job_id, "refresh", view, None, RUNNING if running else FAILED,
                      _when(record.get("launched_at")) or since, None if running else since,
                      error=None if running else (record.get("last_error") or "the refreshing process is gone"))


def _failed_after_commits(job: JobRecord, errors: list) -> JobRecord:
    """A committed backfill with error records: rows it skipped (its commits
    count them), or also the row that stopped it after some groups committed
    (``commit_granularity``: one more than its commits count), then it failed.
    What tells it without the backfill's own record (:func:`backfill_under_way`:
    one written before that record existed, or whose record could not be written)."""
    if job.job_type != "backfill" or job.status != DONE or len(errors) <= (job.metric("errors", 0) or 0):
        return job
    last = errors[-1]
    at = last.created_at if isinstance(last.created_at, dt.datetime) else job.completed_at
    return _failed(job, f"{last.error_type}: {last.message}", at)


def _failed(job: JobRecord, error: str, at: dt.datetime | None, **changes: Any) -> JobRecord:
    """``job`` (DONE from its commits) as FAILED at ``at`` with ``error``, after the commits it made."""
    commits = sum(1 for e in job.events if "committed version" in e)
    events = [*job.events[:-1], f"{_stamp(at)}Job failed after {commits} commit(s) (they stand): {error}"]
    return replace(job, status=FAILED, completed_at=at or job.completed_at, error=error, events=events,
                   updated_at=max((t for t in (job.updated_at, at) if t is not None), default=None), **changes)


# A backfill's record while it runs (and after it failed): state/jobs/<job_id>.json
def _job_file(layout: Layout, job_id: str) -> str:
    return layout.job_file(job_id)


@contextlib.contextmanager
def backfill_under_way(layout: Layout, job_id: str, table: str, column: str, lock: str):
    """What says a backfill is running while it does (the lock ``lock`` it
    takes tells it from one whose process is gone) and why it failed after
    (an exception ending it is recorded); removed once it ends well."""
    path = _job_file(layout, job_id)
    record = {"job_id": job_id, "job_type": "backfill", "table": table, "column": column, "lock": lock,
              "launched_at": time.time()}
    objects.write_text(path, json.dumps(record), durable=False)
    try:
        yield
    except BaseException as exc:
        kind, text = getattr(exc, "error_type", None), getattr(exc, "message", None)
        error = f"{kind}: {text}" if isinstance(kind, str) and isinstance(text, str) else f"{type(exc).__name__}: {exc}"
        record.update(failed_at=time.time(), error=error)  # (a UDF's error as its error record says it)
        objects.write_text(path, json.dumps(record), durable=False)
        raise
    objects.remove(path)


def drop_job_records(layout: Layout, table: str) -> None:
    """Forget the backfill records, and failed refreshes' kept records, of a
    dropped table (a new one of the same name starts clean)."""
    for record in _under_way(layout, {table}):
        objects.remove(_job_file(layout, record["job_id"]))


def _under_way(layout: Layout, wanted: set[str]) -> list[dict]:
    """The records of backfills running, or ended without finishing, and of
    failed refreshes kept (one listing)."""
    out = []
    for name in objects.listdir(layout.state("jobs")):
        raw = objects.read_text(layout.state("jobs", name)) if name.endswith(".json") else None
        try:
            record = json.loads(raw) if raw else None
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("table") in wanted and record.get("job_id"):
            out.append(record)
    return out


def _with_run_record(job: JobRecord | None, record: dict, layout: Layout) -> JobRecord:
    """A backfill's job as its record says: RUNNING while its lock is held,
    else FAILED (the error that ended it, or its process gone), after the
    commits it made if any."""
    launched = _when(record.get("launched_at"))
    if record.get("error") is None and lock_held(layout, record.get("lock") or ""):
        if job is None:
            return job_record(record["job_id"], "backfill", record["table"], record.get("column"), RUNNING, launched,
                              None)
        events = job.events[:-1] if job.status != RUNNING else job.events
        return replace(job, status=RUNNING, completed_at=None, events=events, launched_at=launched or job.launched_at)
    ended = _when(record.get("failed_at"))
    error = record.get("error") or "its process ended before it finished (killed?)"
    if job is None:
        return job_record(record["job_id"], "backfill", record["table"], record.get("column"), FAILED, launched,
                          ended or launched, error=error)
    return _failed(job, error, ended, launched_at=launched or job.launched_at)


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
    for record in _under_way(layout, wanted):
        key = (record["table"], record["job_id"])
        if record.get("job_type") == "refresh":  # a failed refresh's, kept (keep_failed_refresh)
            at = _when(record.get("failed_at"))
            jobs.setdefault(key, job_record(record["job_id"], "refresh", record["table"], None, FAILED,
                                            _when(record.get("launched_at")) or at, at, error=str(record["error"])))
        else:
            jobs[key] = _with_run_record(jobs.get(key), record, layout)
    failed: dict[tuple[str, str], list] = {}
    for e in read_errors(layout):
        if e.table in wanted:
            failed.setdefault((e.table, e.job_id), []).append(e)
    for key, errors in failed.items():
        if key in jobs:
            if jobs[key].status == DONE:
                jobs[key] = _failed_after_commits(jobs[key], errors)
            continue
        first = errors[0]
        at = first.created_at if isinstance(first.created_at, dt.datetime) else None
        refresh = first.job_id.startswith("refresh-")
        jobs[key] = job_record(first.job_id, "refresh" if refresh else "backfill", first.table,
                               None if refresh else first.column, FAILED, at, at, None, {"errors": len(errors)},
                               f"{first.error_type}: {first.message}")
    epoch = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    return sorted(jobs.values(), key=lambda j: (j.launched_at or j.completed_at or epoch, j.job_id))
