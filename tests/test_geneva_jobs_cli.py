"""Geneva's jobs CLI (lancedb/geneva-examples ``ops/jobs.py`` and the record helpers it shares with
the TUI, ``core/jobs.py``) over an mv_assets catalog, with only the import changed.

``core/jobs.py`` is copied as written. ``ops/jobs.py`` is copied as written, with
``import geneva`` -> ``import mv_assets as geneva`` and the helpers it imports from
``core/common.py`` and ``core/config.py`` (``setup_logging``, ``load_config``, ``connect``) cut
down to local mode, which is all the test uses. The CLI reads a job record as Geneva's
(``status.value``, ``metrics`` as ``name``/``n``/``total``/``desc``, ``events``, ``config`` JSON)
and takes ``ValueError`` from ``get_job`` as "not found"; the test runs it with typer's
``CliRunner`` over real jobs (a backfill committing twice, a failed one, a refresh, one still
running while ``tail`` follows it) and checks what it prints against what the jobs did.
"""

# ruff: noqa: B008  (typer options as defaults, as the CLI is written)
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import typer
from typer.testing import CliRunner

import mv_assets as mv
from mv_assets.execution.spark import InlineRunner, set_default_runner

logger = logging.getLogger(__name__)


# -- geneva_examples/core/jobs.py, as written ---------------------------------------------------

# Only these two mean "still going"; the rest are end states.
ACTIVE_STATUSES = ["RUNNING", "PENDING"]
ALL_STATUSES = ["PENDING", "RUNNING", "DONE", "FAILED", "CANCELLED"]
TERMINAL_STATUSES = frozenset({"DONE", "FAILED", "CANCELLED"})


def job_status(jr: object) -> str:
    """The job's status as a plain string (geneva stores it as an enum)."""
    s = getattr(jr, "status", None)
    return getattr(s, "value", str(s))


def job_target(jr: object) -> str:
    """``table.column`` — the column this job is computing."""
    return f"{getattr(jr, 'table_name', '-')}.{getattr(jr, 'column_name', '-')}"


def format_dt(value: object) -> str:
    """A UTC ``YYYY-MM-DD HH:MM:SS`` stamp, or ``-`` if absent/not a datetime."""
    if not isinstance(value, datetime):
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def elapsed(jr: object) -> str:
    """``H:MM:SS`` between launch and completion — or launch and now, if running."""
    start = getattr(jr, "launched_at", None)
    if not isinstance(start, datetime):
        return "-"
    end = getattr(jr, "completed_at", None)
    if not isinstance(end, datetime):
        end = datetime.now(UTC)
    secs = max(0, int((end - start).total_seconds()))
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{s:02d}"


def metrics_line(jr: object) -> str:
    """One-line ``name n/total (pct)`` summary of a job's metrics, or '' if none."""
    parts = []
    for m in getattr(jr, "metrics", None) or []:
        name = getattr(m, "name", "?")
        n, total = getattr(m, "n", "?"), getattr(m, "total", "?")
        pct = ""
        if isinstance(n, (int, float)) and isinstance(total, (int, float)) and total:
            pct = f" ({n / total:.0%})"
        parts.append(f"{name} {n}/{total}{pct}")
    return "  ".join(parts)


_PROGRESS_METRICS = ("rows_committed", "tasks_completed", "fragments")


def progress_summary(jr: object, limit: int = 3) -> str:
    """A short ``name n/total (pct)`` progress line, or '' if nothing usable."""
    ratios: dict[str, str] = {}
    for m in getattr(jr, "metrics", None) or []:
        name = getattr(m, "name", "?")
        n, total = getattr(m, "n", None), getattr(m, "total", None)
        if (
            isinstance(n, (int, float))
            and isinstance(total, (int, float))
            and not isinstance(n, bool)
            and total > 0
        ):
            ratios[name] = f"{name} {n}/{total} ({n / total:.0%})"
    if not ratios:
        return ""
    preferred = [ratios[name] for name in _PROGRESS_METRICS if name in ratios]
    rest = [v for k, v in ratios.items() if k not in _PROGRESS_METRICS]
    return "  ".join((preferred or rest)[:limit])


def status_counts(jobs: list) -> str:
    """``2 RUNNING · 1 FAILED`` — a one-line tally for a list of job records."""
    counts: dict[str, int] = {}
    for jr in jobs:
        key = job_status(jr)
        counts[key] = counts.get(key, 0) + 1
    order = {s: i for i, s in enumerate(ALL_STATUSES)}
    ranked = sorted(counts.items(), key=lambda kv: order.get(kv[0], len(order)))
    return " · ".join(f"{n} {status}" for status, n in ranked)


def format_config(value: object) -> str:
    """Pretty-print the job's launch ``config``, which geneva stores as JSON text."""
    if not value:
        return ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, TypeError):
            return value
    try:
        return json.dumps(value, indent=2, default=str, sort_keys=True)
    except (TypeError, ValueError):
        return str(value)


def format_detail(jr: object, events_limit: int | None = 10) -> str:
    """Render a full job record as text."""
    lines = [
        f"job_id:     {getattr(jr, 'job_id', '-')}",
        f"status:     {job_status(jr)}",
        f"type:       {getattr(jr, 'job_type', '-')}",
        f"target:     {job_target(jr)}",
        f"cluster:    {getattr(jr, 'cluster_name', None) or '-'}",
        f"launched:   {format_dt(getattr(jr, 'launched_at', None))} "
        f"by {getattr(jr, 'launched_by', None) or '-'}",
        f"updated:    {format_dt(getattr(jr, 'updated_at', None))}",
        f"completed:  {format_dt(getattr(jr, 'completed_at', None))}",
        f"elapsed:    {elapsed(jr)}",
    ]

    object_ref = getattr(jr, "object_ref", None)
    if object_ref:
        lines.append(f"object_ref: {object_ref}")
    manifest_id = getattr(jr, "manifest_id", None)
    if manifest_id:
        checksum = getattr(jr, "manifest_checksum", None) or "-"
        lines.append(f"manifest:   {manifest_id} (checksum {checksum})")

    config = format_config(getattr(jr, "config", None))
    if config:
        lines.append("config:")
        lines += [f"    {line}" for line in config.splitlines()]

    metrics = getattr(jr, "metrics", None) or []
    if metrics:
        lines.append("metrics:")
        for m in metrics:
            name = getattr(m, "name", "?")
            n, total = getattr(m, "n", "?"), getattr(m, "total", "?")
            desc = getattr(m, "desc", "")
            lines.append(f"    {name}: {n}/{total} {desc}")

    events = getattr(jr, "events", None) or []
    if events:
        shown = events if events_limit is None else events[-events_limit:]
        hidden = len(events) - len(shown)
        label = f"events ({len(events)} total"
        label += f", showing last {len(shown)})" if hidden > 0 else ")"
        lines.append(f"{label}:")
        lines += [f"    {e}" for e in shown]

    return "\n".join(lines)


def query_jobs(conn: Any, table: str | None, statuses: list[str]) -> list:
    """``list_jobs`` of core/jobs.py: union jobs across statuses."""
    merged: dict = {}
    for s in statuses:
        try:
            for jr in conn.list_jobs(table_name=table, status=s):
                merged[getattr(jr, "job_id", None) or id(jr)] = jr
        except Exception as exc:  # noqa: BLE001
            logger.warning("list_jobs(status=%s) failed: %s", s, exc)
    return list(merged.values())


def sort_newest_first(jobs: list) -> list:
    """Sort job records by launch time, newest first (undated ones last)."""
    jobs.sort(
        key=lambda j: (
            getattr(j, "launched_at", None) or datetime.min.replace(tzinfo=UTC)
        ),
        reverse=True,
    )
    return jobs


# -- core/common.py and core/config.py, local mode only ----------------------------------------


@dataclass
class Config:
    db_uri: str
    mode: str = "local"


def setup_logging(level: str = "INFO") -> None:
    logging.getLogger("geneva_examples").setLevel(level.upper())


def load_config(config_path: Path | None = None, *, mode_override: str | None = None,
                db_uri_override: str | None = None) -> Config:
    assert mode_override in (None, "local") and db_uri_override, "the test runs local mode with --db-uri"
    return Config(db_uri=db_uri_override)


def connect(cfg: Config) -> Any:
    import mv_assets as geneva

    return geneva.connect(uri=cfg.db_uri)


# -- geneva_examples/ops/jobs.py, as written (`import geneva` -> `import mv_assets as geneva`) -----

app = typer.Typer(add_completion=False, help="Jobs CLI: list and cancel Geneva backfill/refresh jobs on the cluster.")


def _open_connection(config: Path | None, db_uri: str | None, log_level: str, mode: str | None = None,
                     ) -> tuple[Config, Any]:
    setup_logging(log_level)

    import mv_assets as geneva  # noqa: F401  (ensure importable before connect)

    cfg = load_config(config, mode_override=mode, db_uri_override=db_uri)
    return cfg, connect(cfg)


def _print_detail(jr: object, events_limit: int | None = 10) -> None:
    typer.echo(format_detail(jr, events_limit))


@app.callback(invoke_without_command=True)
def list_jobs(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", help="Path to config.yaml."),
    mode: str | None = typer.Option(None, "--mode", help="Connection mode: 'local' or 'enterprise'."),
    log_level: str = typer.Option("WARNING", help="Logging level (connection noise)."),
    db_uri: str | None = typer.Option(None, help="Override config db_uri."),
    job_id: str | None = typer.Option(None, help="Show full detail for a single job id."),
    full_events: bool = typer.Option(False, "--full-events", help="With --job-id, print the entire event log."),
    table: str | None = typer.Option(None, help="Filter by table name."),
    status: str | None = typer.Option(None, help="Filter by exact status (PENDING/RUNNING/DONE/FAILED/CANCELLED)."),
    show_all: bool = typer.Option(False, "--all", help="Show all jobs (default: only PENDING/RUNNING)."),
    limit: int = typer.Option(50, help="Max rows to display."),
) -> None:
    if ctx.invoked_subcommand is not None:
        return

    cfg, conn = _open_connection(config, db_uri, log_level, mode)

    if job_id:
        try:
            jr = conn.get_job(job_id)
        except ValueError:
            typer.secho(f"job {job_id} not found on {cfg.db_uri}", fg="red", err=True)
            raise typer.Exit(code=1) from None
        _print_detail(jr, events_limit=None if full_events else 10)
        return

    if status:
        statuses = [status.upper()]
    elif show_all:
        statuses = ALL_STATUSES
    else:
        statuses = ACTIVE_STATUSES
    jobs = sort_newest_first(query_jobs(conn, table, statuses))

    scope = status or ("all" if show_all else "active (PENDING/RUNNING)")
    typer.echo(f"db_uri: {cfg.db_uri}   filter: {scope}   showing: {min(len(jobs), limit)}/{len(jobs)}")
    if not jobs:
        typer.echo("  (no matching jobs)")
        return

    header = f"{'STATUS':<9} {'TYPE':<10} {'ELAPSED':>9}  {'LAUNCHED (UTC)':<19}  TARGET / JOB"
    typer.echo(header)
    typer.echo("-" * len(header))
    for jr in jobs[:limit]:
        typer.echo(
            f"{job_status(jr):<9} {getattr(jr, 'job_type', '-'):<10} {elapsed(jr):>9}  "
            f"{format_dt(getattr(jr, 'launched_at', None)):<19}  {job_target(jr)}  "
            f"{getattr(jr, 'job_id', '-')}"
        )


@app.command()
def show(
    job_id: str = typer.Argument(..., help="Job id to inspect."),
    config: Path | None = typer.Option(None, "--config", help="Path to config.yaml."),
    mode: str | None = typer.Option(None, "--mode", help="Connection mode: 'local' or 'enterprise'."),
    log_level: str = typer.Option("WARNING", help="Logging level (connection noise)."),
    db_uri: str | None = typer.Option(None, help="Override config db_uri."),
    full_events: bool = typer.Option(False, "--full-events", help="Print the entire event log (not just the tail)."),
) -> None:
    cfg, conn = _open_connection(config, db_uri, log_level, mode)

    try:
        jr = conn.get_job(job_id)
    except ValueError:
        typer.secho(f"job {job_id} not found on {cfg.db_uri}", fg="red", err=True)
        raise typer.Exit(code=1) from None

    _print_detail(jr, events_limit=None if full_events else 10)


@app.command()
def kill(
    job_id: str = typer.Argument(..., help="Job id to cancel."),
    config: Path | None = typer.Option(None, "--config", help="Path to config.yaml."),
    mode: str | None = typer.Option(None, "--mode", help="Connection mode: 'local' or 'enterprise'."),
    log_level: str = typer.Option("WARNING", help="Logging level (connection noise)."),
    db_uri: str | None = typer.Option(None, help="Override config db_uri."),
    force: bool = typer.Option(False, "--force", help="Mark CANCELLED even if the job is already terminal."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Skip the confirmation prompt."),
) -> None:
    cfg, conn = _open_connection(config, db_uri, log_level, mode)

    try:
        jr = conn.get_job(job_id)
    except ValueError:
        typer.secho(f"job {job_id} not found on {cfg.db_uri}", fg="red", err=True)
        raise typer.Exit(code=1) from None

    status = job_status(jr)
    target = job_target(jr)

    if status in TERMINAL_STATUSES and not force:
        typer.echo(
            f"job {job_id} ({target}) is already {status}; nothing to cancel "
            "(use --force to mark CANCELLED anyway)."
        )
        return

    if not yes:
        typer.confirm(f"Cancel {status} job {job_id} ({target})?", abort=True)

    set_completed = getattr(getattr(conn, "_history", None), "set_completed", None)
    if not callable(set_completed):
        typer.secho(
            "this geneva build does not expose the private jobs-history API "
            "(conn._history.set_completed) that `kill` relies on; the geneva pin "
            "may have changed. Cannot cancel from the client.",
            fg="red",
            err=True,
        )
        raise typer.Exit(code=1)

    set_completed(job_id, status="CANCELLED")
    typer.secho(f"marked job {job_id} CANCELLED", fg="yellow")
    _print_detail(conn.get_job(job_id))


@app.command()
def tail(
    job_id: str = typer.Argument(..., help="Job id to tail."),
    config: Path | None = typer.Option(None, "--config", help="Path to config.yaml."),
    mode: str | None = typer.Option(None, "--mode", help="Connection mode: 'local' or 'enterprise'."),
    log_level: str = typer.Option("WARNING", help="Logging level (connection noise)."),
    db_uri: str | None = typer.Option(None, help="Override config db_uri."),
    interval: float = typer.Option(2.0, help="Poll interval (seconds)."),
    once: bool = typer.Option(False, help="Print the current state once and exit (no follow)."),
) -> None:
    cfg, conn = _open_connection(config, db_uri, log_level, mode)

    try:
        jr = conn.get_job(job_id)
    except ValueError:
        typer.secho(f"job {job_id} not found on {cfg.db_uri}", fg="red", err=True)
        raise typer.Exit(code=1) from None

    typer.echo(f"tailing job {job_id} ({job_target(jr)}) on {cfg.db_uri}")

    printed = 0  # events already emitted
    last_metrics = ""
    last_status: str | None = None

    try:
        while True:
            events = getattr(jr, "events", None) or []
            for ev in events[printed:]:
                typer.echo(f"  {ev}")
            printed = len(events)

            status = job_status(jr)
            if status != last_status:
                typer.secho(f"  [status: {status}]", fg="cyan")
                last_status = status

            metrics = metrics_line(jr)
            if metrics and metrics != last_metrics:
                typer.echo(f"  [metrics: {metrics}]")
                last_metrics = metrics

            if once or status in TERMINAL_STATUSES:
                break

            time.sleep(max(0.5, interval))
            jr = conn.get_job(job_id)
    except KeyboardInterrupt:
        typer.echo("")
        return

    typer.echo("")
    _print_detail(jr)


# -- the test ------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def inline_default():
    set_default_runner(InlineRunner())
    yield
    set_default_runner(None)


def _cli(uri: str, *args: str) -> tuple[int, str]:
    """``jobs [COMMAND] --db-uri URI ARGS...`` (the listing when there is no command)."""
    command = list(args[:1]) if args and args[0] in ("show", "kill", "tail") else []
    result = CliRunner().invoke(app, [*command, "--db-uri", uri, *args[len(command):]])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _catalog(tmp_path: Path):
    """Jobs of every kind: a backfill that commits twice, one that fails, a view's refresh."""
    db = mv.connect(str(tmp_path / "db"))
    t = db.create_table("t", pa.table({"id": list(range(10)), "x": list(range(10))}), primary_key="id")
    t.add(pa.table({"id": list(range(10, 30)), "x": list(range(10, 30))}))

    @mv.udf
    def double(x: int) -> int:
        return 2 * x

    @mv.udf
    def seven(x: int) -> int:
        if x == 7:
            raise ValueError("seven is not allowed")
        return x

    t.add_columns({"y": double, "bad": seven})
    t.backfill("y", job_id="fill", commit_granularity=1)  # two fragments: two commits
    with pytest.raises(mv.UdfError, match="seven"):
        t.backfill("bad", job_id="broken")
    db.create_materialized_view("v", t.search(None).select(["id", "y"]))
    db.refresh("v", job_id="first-refresh")
    return db, t


def test_show_prints_a_job_record_as_geneva_tools_read_it(tmp_path):
    db, t = _catalog(tmp_path)
    code, out = _cli(db.uri, "show", "fill")
    assert code == 0, out
    lines = out.splitlines()
    assert "status:     DONE" in lines and "type:       backfill" in lines and "target:     t.y" in lines
    assert "    rows_committed: 30/30 rows the job committed" in lines  # n/total as a ratio of the rows
    assert "    errors: 0/0 rows a UDF failed on (skipped, or failing the job)" in lines
    committed = [v for v in (int(e.rsplit(" ", 1)[1]) for e in db.get_job("fill").events if "committed version" in e)]
    assert len(committed) == 2 and committed == sorted(committed) and committed[-1] == db.get_job("fill").version
    assert lines[-1].endswith("Job completed with status DONE")
    assert any(line.strip().startswith('"columns": [') for line in lines)  # the config, as JSON
    record = db.get_job("fill")
    assert progress_summary(record) == "rows_committed 30/30 (100%)"
    assert record.status == "DONE" and record.status.value == "DONE" and record.status is mv.JobStatus.DONE
    assert record.updated_at == record.completed_at and record.output_columns == ["y"]

    code, out = _cli(db.uri, "show", "broken")
    assert code == 0 and "status:     FAILED" in out and "target:     t.bad" in out
    assert out.rstrip().splitlines()[-1].strip().endswith("Job failed: ValueError: seven is not allowed"), out

    code, out = _cli(db.uri, "show", "first-refresh")
    assert code == 0 and "type:       refresh" in out and "rows_committed: 30/30" in out
    assert "rows_inserted: 30/0 view rows inserted" in out and '"source_version": ' in out


def test_listing_filters_and_unknown_ids(tmp_path):
    db, t = _catalog(tmp_path)
    code, out = _cli(db.uri, "--all")
    assert code == 0, out
    rows = {line.split()[-1]: line.split()[:2] for line in out.splitlines()[3:]}
    assert rows == {"fill": ["DONE", "backfill"], "broken": ["FAILED", "backfill"],
                    "first-refresh": ["DONE", "refresh"]}, out
    assert status_counts(query_jobs(db, None, ALL_STATUSES)) == "2 DONE · 1 FAILED"
    code, out = _cli(db.uri, "--status", "failed")
    assert code == 0 and "showing: 1/1" in out and "broken" in out
    code, out = _cli(db.uri)  # the active ones: none
    assert code == 0 and "(no matching jobs)" in out

    code, out = _cli(db.uri, "show", "no-such-job")  # get_job raises ValueError, as Geneva's
    assert code == 1 and "job no-such-job not found" in out
    code, out = _cli(db.uri, "--job-id", "no-such-job")
    assert code == 1 and "not found" in out

    code, out = _cli(db.uri, "kill", "fill")
    assert code == 0 and "is already DONE; nothing to cancel" in out
    code, out = _cli(db.uri, "kill", "fill", "--force", "--yes")  # no cancellation here (docs/geneva.md)
    assert code == 1 and "Cannot cancel from the client" in out
    assert db.get_job("fill").status == "DONE"


def test_tail_follows_a_running_job_to_its_end(tmp_path, monkeypatch):
    """The job is held running until tail has read its record once (then it goes on to DONE):
    tail sees RUNNING, then DONE, whatever the machine's speed."""
    db, t = _catalog(tmp_path)
    looked = threading.Event()
    get_job = mv.Connection.get_job

    def watched(self, job_id):
        record = get_job(self, job_id)
        looked.set()
        return record

    monkeypatch.setattr(mv.Connection, "get_job", watched)
    gate = tmp_path / "gate"
    gate.write_text("x")

    @mv.udf
    def slow(x: int) -> int:
        while gate.exists():
            time.sleep(0.01)
        return x + 1

    t.add_columns({"z": slow})
    job = t.backfill_async("z", job_id="slowjob")
    opened = threading.Thread(target=lambda: (looked.wait(60), gate.unlink()))  # after tail's first look
    opened.start()
    try:
        code, out = _cli(db.uri, "tail", "slowjob", "--interval", "0.5")
    finally:
        looked.set()
        opened.join()
        job.result(timeout=60)
    assert code == 0, out
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0].startswith("tailing job slowjob (t.z)")
    statuses = [line for line in lines if line.startswith("[status:")]
    assert statuses == ["[status: RUNNING]", "[status: DONE]"], out
    assert any(line.endswith("backfill of t (z) launched") for line in lines)
    assert "[metrics: rows_committed 30/30 (100%)  rows 30/0  udf_rows_computed 30/0  errors 0/0]" in lines
    assert "status:     DONE" in lines
    assert [v.n for v in db.get_job("slowjob").metrics if v.name == "rows"] == [30]
