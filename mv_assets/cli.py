"""``mv-assets``: the command line for a catalog.

Exit codes: 0 success, 1 a refresh failed, 2 bad input (unknown view, bad
option, invalid request, no catalog at ``--db``), 3 refused because of
another refresh or a stale upstream view. No command creates a catalog: a
``--db`` that holds none is reported, not created.
"""

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable

from mv_assets.api import progress
from mv_assets.api.catalog import Connection, connect
from mv_assets.api.runners import InlineRunner, SparkRunner
from mv_assets.api.table import MaterializedView
from mv_assets.model.definition import short_error
from mv_assets.model.errors import MvAssetsError, TableNotFoundError, UdfError
from mv_assets.model.join_agg_view import hidden_join_refusal, is_join_under
from mv_assets.model.kinds import kind_of

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_REFUSED = 3


def _print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def _print_rows(rows: list[dict], title: str, whole: tuple[str, ...] = ()) -> None:
    """``rows`` as a table; the ``whole`` columns are never cut (an id a later
    command takes), the others wrap or fold into the width left."""
    if not rows:
        click.echo(f"{title}: none")
        return
    table = RichTable(title=title)
    for col in rows[0]:
        if col in whole:
            width = max(len(col), *(len("" if r[col] is None else str(r[col])) for r in rows))
            table.add_column(col, no_wrap=True, min_width=width)
        else:
            table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(*["" if v is None else str(v) for v in r.values()])
    Console().print(table)


def _bars(as_json: bool) -> Progress:
    """Progress bars on stderr when it is a terminal (a count of items, and
    the rows of the work under way: see :func:`_follow`)."""
    return Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=None),
        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
        disable=as_json or not sys.stderr.isatty(), console=Console(stderr=True), expand=True,
    )


def _detail(p: progress.Progress) -> str:
    """``1,200/5,000 rows, 400 rows/s, 10 s left; 300 from checkpoints``."""
    text = f"{min(p.rows_done, p.rows_planned):,}/{p.rows_planned:,} rows"
    if p.rows_done and p.seconds > 0:
        text += f", {p.rate:,.0f}/s"
    left = p.seconds_left
    if left is not None and not p.done:
        text += f", {progress.format_seconds(left)} left"
    if p.rows_resumed:
        text += f"; {p.rows_resumed:,} from checkpoints"
    return text


@contextmanager
def _follow(bars: Progress, what: str, as_json: bool) -> Iterator[None]:
    """Follow the engine's progress of the work inside: a bar of its rows on
    a terminal, else a line on stderr every $MV_ASSETS_PROGRESS_SECONDS
    (nothing with --json, nor for work that ends sooner)."""
    if as_json:
        yield
        return
    if bars.disable:
        with progress.listen(lambda p: click.echo(f"{what}: {p}", err=True)):
            yield
        return
    bar = bars.add_task(what, total=None, detail="", visible=False)

    def show(p: progress.Progress) -> None:
        bars.update(bar, description=f"{what}: {p.stage}", total=max(1, p.rows_planned),
                    completed=min(p.rows_done, p.rows_planned), detail=_detail(p), visible=True)

    try:
        with progress.listen(show, every=0.2):
            yield
    finally:
        bars.remove_task(bar)


class _Ctx:
    def __init__(self, db_uri: str, runner: str, master: str | None, remote: str | None):
        self.db_uri = db_uri
        self.runner_name = runner
        self.master = master
        self.remote = remote
        self._db: Connection | None = None

    @property
    def db(self) -> Connection:
        if self._db is None:
            runner = InlineRunner() if self.runner_name == "inline" else SparkRunner(master=self.master, remote=self.remote)
            # every command works on an existing catalog: a mistyped path is an
            # error ("no catalog at ..."), never a new empty catalog
            self._db = connect(self.db_uri, runner=runner, create=False)
        return self._db

    def view(self, name: str) -> MaterializedView:
        refusal = hidden_join_refusal(name)
        if refusal is not None:
            raise click.BadParameter(refusal, param_hint="VIEW")
        t = self.db.open_table(name)
        if not isinstance(t, MaterializedView):
            raise click.BadParameter(f"{name!r} is a table, not a materialized view", param_hint="VIEW")
        return t


def _guard(fn):
    """Map engine errors to exit codes with a one-line message."""

    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise
        except ValueError as exc:  # bad input, including unknown names
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except MvAssetsError as exc:  # refused: another refresh, stale upstream view
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_REFUSED)
        except Exception as exc:
            if not (isinstance(exc, OSError) or type(exc).__module__.split(".")[0] == "obstore"):
                raise
            # the store (a bucket missing, an endpoint down, credentials refused): what it said, in one line
            ctx = click.get_current_context().find_object(_Ctx)
            where = f" at {ctx.db_uri}" if ctx is not None else ""
            click.echo(f"error: the catalog{where} cannot be read: {type(exc).__name__}: "
                       f"{' '.join(short_error(exc).split())[:400]}", err=True)
            sys.exit(EXIT_BAD_INPUT)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


@click.group()
@click.option("--db", "db_uri", envvar="MV_ASSETS_DB", default=".demo/catalog", show_default=True,
              help="Catalog directory ($MV_ASSETS_DB).")
@click.option("--runner", type=click.Choice(["spark", "inline"]), default="spark", show_default=True,
              help="Where refresh tasks run.")
@click.option("--master", envvar="MV_ASSETS_SPARK_MASTER", default=None, help="Spark master URL.")
@click.option("--remote", envvar="MV_ASSETS_SPARK_REMOTE", default=None, help="Spark Connect URL.")
@click.pass_context
def main(ctx: click.Context, db_uri: str, runner: str, master: str | None, remote: str | None) -> None:
    """Materialized views with UDF columns over Lance, refreshed incrementally."""
    ctx.obj = _Ctx(db_uri, runner, master, remote)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
@_guard
def tables(obj: _Ctx, as_json: bool) -> None:
    """List tables and views."""
    rows = []
    for name in obj.db.table_names():
        try:
            t = obj.db.open_table(name)
        except Exception as exc:  # a dataset that does not open (damaged files): listed, not hiding the others
            rows.append({"name": name, "kind": "unreadable", "source": f"{type(exc).__name__}: {short_error(exc)}",
                         "version": None, "rows": None})
            continue
        is_view = isinstance(t, MaterializedView)
        rows.append(
            {
                "name": name,
                # (model.kinds: "chunk view", "join view"...; a query view is "view")
                "kind": (kind_of(t.definition).noun.replace("materialized view", "view") if is_view else "table"),
                # (a join aggregate: its tables, not the join kept under it)
                "source": ", ".join(s for s in t.definition.sources if not is_join_under(s)) if is_view else None,
                "version": t.version,
                "rows": t.count_rows(),
            }
        )
    _print_json(rows) if as_json else _print_rows(rows, f"tables in {obj.db.uri}")


@main.command()
@click.argument("view", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
@_guard
def status(obj: _Ctx, view: str | None, as_json: bool) -> None:
    """The status table: load state, staleness, load number per view."""
    if view:
        try:
            obj.view(view)
        except (click.ClickException, TableNotFoundError):
            raise
        except Exception:  # a dataset that does not open (damaged files): its row says UNREADABLE, and why
            pass
    # a view whose source is gone shows as SOURCE_MISSING with the reason, the others as usual
    rows = [s.to_dict() for s in obj.db.view_statuses(view)]
    if as_json:
        _print_json(rows[0] if view else rows)
        return
    _print_status(rows)


def _age(iso: str | None, now: datetime | None = None) -> str:
    """``"2026-01-02T03:04:05+00:00"`` as ``"5m ago"``."""
    if not iso:
        return "never"
    then = datetime.fromisoformat(iso)
    then = then if then.tzinfo else then.replace(tzinfo=timezone.utc)
    s = max(0, int(((now or datetime.now(timezone.utc)) - then).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit} ago"
    return f"{s}s ago"


def _print_status(rows: list[dict]) -> None:
    """The status table, readable at 80 columns: one line per view (its
    state, rows, load number, source version, how far behind, stale rows,
    policy, last update), then each view's last error on lines of its own."""
    if not rows:
        click.echo("view status: no views")
        return
    table = RichTable(title="view status", box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left",
                      padding=(0, 1), collapse_padding=True, show_edge=False)
    for name, justify, wrap in (("view", "left", False), ("state", "left", False), ("rows", "right", False),
                                ("load", "right", False), ("source", "right", False), ("behind", "right", False),
                                ("stale", "right", False), ("policy", "left", False), ("updated", "left", True)):
        table.add_column(name, justify=justify, no_wrap=not wrap, overflow="fold")  # type: ignore[arg-type]
    for r in rows:
        state = r["load_state"] + ("" if _valid_or_never(r) else "*")  # (a short mark: one line at 80 columns)
        table.add_row(
            r["name"], state, _n(r["cardinality"]), _n(r["load_number"]),
            "" if r["source_version"] is None else f"v{r['source_version']}", _n(r["versions_behind"]),
            _n(r["stale_count"]), r["policy"] or "", _age(r["updated"]),
        )
    console = Console()
    console.print(table)
    for r in rows:
        if r["last_error"]:
            console.print(f"{r['name']}: last error: {r['last_error']}", highlight=False, soft_wrap=False)
    console.print("behind: source versions since the view's that change what it reads\n"
                  "stale: source rows written or deleted since (some may not pass the view's filter)"
                  + ("" if all(_valid_or_never(r) for r in rows) else
                     "\n*: invalid: its rows are the query's at no source version (see its last error)"),
                  style="dim", highlight=False)


def _valid_or_never(r: dict) -> bool:
    return bool(r["valid"]) or r["load_state"] == "NEVER_LOADED"


def _n(value: Any) -> str:
    return "" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
@_guard
def arrangements(obj: _Ctx, as_json: bool) -> None:
    """What join views' refreshes keep in memory between refreshes (their
    arrangements): each one's rows and size, the views that share it, what
    each view's last refresh did to have it (kept, caught up, loaded) and in
    how long, and its copy on disk for the processes after."""
    rows = obj.db.arrangements()
    if as_json:
        _print_json(rows)
        return
    if not rows:
        click.echo("arrangements: no join views")
        return
    table = RichTable(title="arrangements", box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left",
                      padding=(0, 1), collapse_padding=True, show_edge=False)
    for name, justify in (("arrangement", "left"), ("rows", "right"), ("memory", "right"), ("views", "left"),
                          ("last refresh", "left"), ("on disk", "left")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in rows:
        last = "; ".join(f"{v}: {i.get('how', '?').split(' (')[0]} {i.get('seconds', 0):.3f}s"
                         for v, i in r["last_refresh"].items())
        disk = r["on_disk"]
        table.add_row(r["name"] + (" (hashed)" if r["hashed"] else ""), _n(r["rows"]), _size(r["bytes"]),
                      ", ".join(r["views"]), last or "-",
                      "-" if disk is None else f"v{disk['version']}, {_size(disk['bytes'])}")
    console = Console()
    console.print(table)
    console.print("memory: once loaded, in each process that refreshes (about 9 bytes a value)",
                  style="dim", highlight=False)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@main.command()
@click.argument("view")
@click.option("--src-version", type=int, default=None, help="Source version to plan for (default latest).")
@click.option("--mode", type=click.Choice(["auto", "full", "incremental_strict"]), default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
@_guard
def plan(obj: _Ctx, view: str, src_version: int | None, mode: str, as_json: bool) -> None:
    """Dry run: rows to insert, update, delete and UDF rows to compute."""
    v = obj.view(view)
    p = v.plan_refresh(src_version=src_version, mode=mode)
    s = p.summary()
    request = v.resource_request()
    refused = v.source_behind()  # (the plan is against its source view as it is; refresh would refuse)
    if as_json:
        _print_json({**s, "resources": request.hints_dict() if request else None, "refresh_refused": refused})
        return
    moved = _moved(p.details)
    head = (f"{s['view']}: {moved} ({s['reason']})" if moved is not None else
            f"{s['view']}: source {s['source']} "
            + (f"v{s['from_version']} -> " if s["from_version"] is not None else "(never refreshed) -> ")
            + f"v{s['to_version']} ({s['reason']})")
    click.echo(
        f"{head}\n"
        f"  insert {s['rows_to_insert']:,}, update {s['rows_to_update']:,}, delete {s['rows_to_delete']:,}\n"
        f"  UDF rows: {_udf_rows_text(s['udf_rows'])}, in {s['tasks']} task{'s' if s['tasks'] != 1 else ''}"
        + _work_text(p.details)
        + (f"\n  each task asks for {request.describe()} (scheduled on a Spark cluster; see docs/deploy.md)"
           if request else "")
        + (f"\n  refresh would refuse: {refused}" if refused else "")
    )


def _udf_rows_text(udf_rows: dict) -> str:
    """``caption 120, badge 0`` (``none``: nothing for a UDF to compute, or no UDF column)."""
    return ", ".join(f"{name} {n:,}" for name, n in udf_rows.items()) or "none"


def _work_text(details: dict) -> str:
    """A join view's plan: what it read and why full or incremental."""
    work, adaptive = details.get("work"), details.get("adaptive")
    if not work:
        return ""
    text = (f"\n  read: changed rows {', '.join(f'{k} {v:,}' for k, v in work['changed_rows'].items()) or 'none'}; "
            f"probe matches {work['probe_matches']:,}; view key values {work['view_key_rows_read']:,}")
    if work.get("key_rows_scanned"):
        text += f"; key rows scanned {work['key_rows_scanned']:,}"
    for name, info in (details.get("arrangements") or {}).items():  # (the view's and the first table's key's)
        size = f" ({info['rows']:,} rows, {info['bytes'] / 2**20:,.1f} MiB, {info['seconds']:.3f} s)" if "rows" in info else ""
        early = f", ahead of its probe in {info['ahead_s']:.3f} s" if "ahead_s" in info else ""
        text += f"\n  arrangement {name}: {info['how']}{size}{early}"
    if adaptive:
        text += (f"\n  recomputes {adaptive['rows']:,} of {adaptive['first_table_rows']:,} first-table rows "
                 f"({adaptive['share']:.1%}; full at {adaptive['threshold']:.0%}): {adaptive['chosen']}")
    return text


@main.command()
@click.argument("views", nargs=-1, required=True)
@click.option("--src-version", type=int, default=None, help="Refresh to this source version (one view only).")
@click.option("--mode", type=click.Choice(["auto", "full", "incremental_strict"]), default="auto", show_default=True)
@click.option("--upstream", is_flag=True, help="Refresh the views these read first, in lineage order.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
@_guard
def refresh(obj: _Ctx, views: tuple[str, ...], src_version: int | None, mode: str, upstream: bool, as_json: bool) -> None:
    """Refresh views (in lineage order), with a progress bar."""
    for v in views:
        obj.view(v)
    if src_version is not None and len(views) != 1:
        raise click.BadParameter("--src-version applies to a single view", param_hint="--src-version")
    todo = list(views)
    if upstream:
        for v in views:
            todo = obj.db.upstream(v) + todo
    order = obj.db.lineage_order(list(dict.fromkeys(todo)))
    results = []
    with _bars(as_json) as bars:
        bar = bars.add_task("refreshing", total=len(order), detail=f"0/{len(order)} views")
        for i, name in enumerate(order):
            bars.update(bar, description=f"refreshing {name}")
            try:
                with _follow(bars, f"refreshing {name}", as_json):
                    r = obj.view(name).refresh(src_version=src_version if name in views else None, mode=mode)
            except Exception as exc:
                if (isinstance(exc, (MvAssetsError, ValueError)) and not isinstance(exc, UdfError)
                        and not _recorded_failure(obj.view(name), exc)):
                    raise  # refused or bad input, before the refresh did anything
                click.echo(f"error: refresh of {name!r} failed: {type(exc).__name__}: {exc}", err=True)
                if as_json:
                    _print_json([r.summary() for r in results])
                sys.exit(EXIT_FAILED)
            results.append(r)
            bars.update(bar, advance=1, detail=f"{i + 1}/{len(order)} views")
    if as_json:
        _print_json([r.summary() for r in results])
        return
    for r in results:
        click.echo(_refreshed(r))


def _recorded_failure(view: MaterializedView, exc: Exception) -> bool:
    """Whether the refresh of ``view`` ran and failed with ``exc`` (its status
    records it: FAILED_LOAD with that error), as a refresh that fails on its
    data does (Lance's ValueError of a SQL cast, say): exit 1, not 2."""
    try:
        status = view.status()
    except Exception:  # (the status unreadable: the error as it came)
        return False
    return status.load_state == "FAILED_LOAD" and status.last_error == f"{type(exc).__name__}: {exc}"


def _moved(details: dict) -> str | None:
    """A view of several sources: each source that moved, ``b v2 -> v3`` (None: one source)."""
    if "sources" not in details:
        return None
    moved = details.get("moved") or {}
    if not moved:
        return "no source moved"
    return "sources " + ", ".join(f"{n} {'(new)' if a is None else f'v{a}'} -> v{b}" for n, (a, b) in moved.items())


def _refreshed(r) -> str:
    """A refresh's outcome in a line (``first refresh``, never ``vNone``)."""
    moved = _moved(r.details)
    if moved is not None:  # a join view: every source it reads, and how it was refreshed
        how = "full" if r.full else "incremental" if (r.tasks or r.rows_deleted) else "no-op"
        computed = ", ".join(f"{c} {n:,}" for c, n in r.udf_rows_computed.items()) or "none"
        return (f"{r.view}: {moved}: {how}: +{r.rows_inserted:,} ~{r.rows_updated:,} -{r.rows_deleted:,}, UDF rows "
                f"computed: {computed}; {r.seconds:.2f}s")
    nothing = r.nothing_done()
    if nothing is not None:
        return nothing
    since = r.since()
    computed = ", ".join(f"{c} {n:,}" for c, n in r.udf_rows_computed.items()) or "none"
    resumed = sum((r.udf_rows_resumed or {}).values())
    return (f"{r.view}: {since}: +{r.rows_inserted:,} ~{r.rows_updated:,} -{r.rows_deleted:,}, UDF rows computed: "
            f"{computed}" + (f", {resumed:,} from checkpoints" if resumed else "") + f"; {r.seconds:.2f}s")


@main.command()
@click.argument("table")
@click.argument("column")
@click.option("--where", default=None, help="SQL predicate: (re)compute these rows instead of the stale ones.")
@click.option("--retry-failed", is_flag=True, help="Only the rows whose COLUMN failed (see `errors`).")
@click.option("--checkpoint-size", type=int, default=None,
              help="Rows per checkpoint batch (staged). Default: UDF columns in one pass, checkpointed by time.")
@click.option("--max-rows-per-task", type=click.IntRange(min=1), default=65_536, show_default=True,
              help="Rows per Spark task.")
@click.option("--dry-run", is_flag=True, help="Print the plan (rows, batches, checkpoints done) and stop.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
@_guard
def backfill(obj: _Ctx, table: str, column: str, where: str | None, retry_failed: bool, checkpoint_size: int | None,
             max_rows_per_task: int, dry_run: bool, as_json: bool) -> None:
    """Compute a computed COLUMN of TABLE (or view) for the rows that need it.

    Checkpointed: run it again after a crash and finished batches are kept.
    Exit code 1 when the job fails; rows skipped by a UDF's error policy are
    reported, not fatal.
    """
    t = obj.db.open_table(table)
    if retry_failed and where is not None:
        raise click.BadParameter("--retry-failed and --where do not combine", param_hint="--retry-failed")
    row_ids = t.get_failed_row_ids(column) if retry_failed else None
    kwargs = {"where": where, "row_ids": row_ids, "checkpoint_size": checkpoint_size,
              "max_rows_per_task": max_rows_per_task}
    plan = t.plan_backfill(column, **kwargs)
    if dry_run:
        s = plan.summary()
        if as_json:
            _print_json(s)
        else:
            how = "one pass" if s["one_pass"] else f"{s['batches']} batches ({s['batches_checkpointed']} checkpointed)"
            click.echo(
                f"{table}.{','.join(s['columns'])}: {_count(s['rows'], 'row')} in {how}, {_count(s['tasks'], 'task')}; "
                f"{_count(s['rows_checkpointed'], 'row')} already checkpointed -> {_count(s['rows_to_compute'], 'row')} "
                "to compute"
            )
        return
    if plan.rows_checkpointed and not as_json:
        click.echo(f"{table}.{column}: resuming: {plan.rows_checkpointed:,} of {plan.rows:,} rows have results "
                   "checkpointed by an interrupted run", err=True)
    with _bars(as_json) as bars:
        try:
            with _follow(bars, f"backfilling {table}.{column}", as_json):
                r = t.backfill(column, **kwargs)
        except Exception as exc:
            if isinstance(exc, (MvAssetsError, ValueError)) and not isinstance(exc, UdfError):
                raise
            click.echo(f"error: backfill of {table}.{column} failed: {type(exc).__name__}: {exc}\n"
                       "finished batches are checkpointed: run the same command again to resume", err=True)
            sys.exit(EXIT_FAILED)
    if as_json:
        _print_json(r.summary())
        return
    click.echo(
        f"{table}.{','.join(r.columns)}: {r.rows_written} rows written, {r.rows_failed} failed, "
        f"{r.rows_skipped} changed meanwhile; UDF rows {r.udf_rows_computed}, {r.rows_resumed} resumed from checkpoints; "
        f"job {r.job_id}; {r.seconds:.2f}s"
    )
    if r.rows_failed:
        click.echo(f"  see `mv-assets errors {table} --column {column}`; retry with --retry-failed")


@main.command()
@click.argument("table")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
@_guard
def columns(obj: _Ctx, table: str, as_json: bool) -> None:
    """Computed columns of TABLE: rows current, stale and failed."""
    rows = obj.db.open_table(table).column_status()
    if as_json:
        _print_json(rows)
        return
    keep = ("column", "kind", "udf", "fingerprint", "rows", "current", "stale", "failed")
    _print_rows([{k: r[k] for k in keep} for r in rows], f"computed columns of {table}")


@main.command()
@click.argument("job_id", required=False)
@click.option("--table", default=None, help="Only the jobs of this table or view.")
@click.option("--status", type=click.Choice(["RUNNING", "DONE", "FAILED"], case_sensitive=False), default=None,
              help="Only the jobs in this state.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
@_guard
def jobs(obj: _Ctx, job_id: str | None, table: str | None, status: str | None, as_json: bool) -> None:
    """Jobs (backfills, refreshes, column loads), newest first; with JOB_ID,
    that job's record: counters, commits, error."""
    if job_id:
        record = obj.db.get_job(job_id)
        if as_json:
            _print_json(record.to_dict())
            return
        click.echo(_job_block(record))
        return
    records = list(reversed(obj.db.list_jobs(table_name=table, status=status)))
    if as_json:
        _print_json([r.to_dict() for r in records])
        return
    rows = [{"job": r.job_id, "type": r.job_type, "target": r.table_name + (f".{r.column_name}" if r.column_name else ""),
             "status": r.status.value, "launched": _when(r.launched_at), "took": _took(r),
             "rows": _n(r.metric("rows_committed")), "error": r.error} for r in records]
    _print_rows(rows, f"jobs in {obj.db.uri}", whole=("job", "type", "status", "took", "rows"))


def _when(at: datetime | None) -> str | None:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if at is not None else None


def _took(r: Any) -> str | None:
    """How long a job ran (so far, while it runs)."""
    if r.launched_at is None:
        return None
    end = r.completed_at or datetime.now(timezone.utc)
    return f"{max(0.0, (end - r.launched_at).total_seconds()):.1f}s"


def _job_block(r: Any) -> str:
    """One job's record, as lines: what, when, counters, then its events."""
    target = r.table_name + (f" ({r.column_name})" if r.column_name else "")
    lines = [f"job {r.job_id} · {r.job_type} of {target} · {r.status.value}",
             f"  launched {_when(r.launched_at) or '-'} · completed {_when(r.completed_at) or '-'}"
             f" · took {_took(r) or '-'}" + (f" · version {r.version}" if r.version is not None else "")]
    if r.error:
        lines.append(f"  error: {r.error}")
    if r.metrics:
        lines.append("  " + " · ".join(f"{m.name} {_n(m.n)}" for m in r.metrics))
    lines += [f"  {event}" for event in r.events]
    return "\n".join(lines)


def _still_failing(t: Any, column: str) -> set[int]:
    """The rows of ``column`` still failing; none for a column dropped since its errors were recorded."""
    try:
        return set(t.get_failed_row_ids(column))
    except ValueError:  # (no such computed column any more)
        return set()


@main.command()
@click.argument("table")
@click.option("--column", default=None, help="Only this column.")
@click.option("--job", "job_id", default=None, help="Only this job.")
@click.option("--failing", is_flag=True, help="Only rows whose value is still not computed (not fixed since).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with tracebacks).")
@click.pass_obj
@_guard
def errors(obj: _Ctx, table: str, column: str | None, job_id: str | None, failing: bool, as_json: bool) -> None:
    """Rows a UDF failed on: job, column, stable row id, exception, and
    whether the row still fails (no value computed since) or was fixed by a
    later backfill or refresh (or is gone)."""
    t = obj.db.open_table(table)
    if column is not None and column not in t.schema.names and not t.get_errors(column_name=column):
        # (a chunk or table-function view's errors are recorded under its function's name)
        raise click.BadParameter(f"{table!r} has no column {column!r} (its columns: {', '.join(t.schema.names)})",
                                 param_hint="--column")
    records = t.get_errors(job_id=job_id, column_name=column)
    if job_id is not None and not records:
        obj.db.get_job(job_id)  # (a job id nobody ran: refused in words, as `jobs JOB_ID` does, not "none")
    still = {c: _still_failing(t, c) for c in sorted({r.column for r in records})}
    rows = [(r, r.row_id in still[r.column]) for r in records]
    if failing:
        rows = [(r, s) for r, s in rows if s]
    if as_json:
        _print_json([{**r.__dict__, "still_failing": s} for r, s in rows])
        return
    if not rows:
        click.echo(f"errors in {table}: none")
        return
    n_failing = sum(s for _, s in rows)
    click.echo(f"errors in {table}: {len(rows)} record{'s' if len(rows) != 1 else ''}, {n_failing} still failing")
    width = max(40, min(Console().width, 120))
    for r, s in rows:
        click.echo(_error_block(r, s, width))


def _count(n: int, noun: str) -> str:
    """``n`` ``noun`` s, in words (``1 row``, ``2 rows``)."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _error_block(r: Any, still_failing: bool, width: int) -> str:
    """One error record as a block that reads at any terminal width: a line of
    what failed where (wrapped), then the exception, indented and wrapped.

    >>> from types import SimpleNamespace as R
    >>> rec = R(job_id="0279ebcf6cb6", column="y", row_id=17, attempts=2, error_type="KeyError",
    ...         created_at="2026-11-27 05:16:12", message="'missing' " * 12)
    >>> print(_error_block(rec, True, 60))
    row 17 · column y · FAILING · 2 attempts · job 0279ebcf6cb6
      at 2026-11-27 05:16:12
      KeyError: 'missing' 'missing' 'missing' 'missing'
        'missing' 'missing' 'missing' 'missing' 'missing'
        'missing' 'missing' 'missing'
    """
    import textwrap

    attempts = f"{r.attempts} attempt{'s' if r.attempts != 1 else ''}" if r.attempts is not None else None
    head = " · ".join(x for x in (f"row {r.row_id}", f"column {r.column}", "FAILING" if still_failing else "fixed",
                                  attempts, f"job {r.job_id}") if x)
    lines = textwrap.wrap(head, width, subsequent_indent="  ")
    if r.created_at is not None:
        lines.append(f"  at {r.created_at}")
    message = f"{r.error_type or 'error'}: {' '.join((r.message or '').split())}".strip()
    lines += textwrap.wrap(message, width, initial_indent="  ", subsequent_indent="    ") or ["  (no message)"]
    return "\n".join(lines)


@main.command()
@click.argument("table")
@click.option("--drop-indexes", is_flag=True,
              help="Drop indexes that cannot be rebuilt without their parameters (vector, full-text...); "
                   "create them again after.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
@_guard
def adopt(obj: _Ctx, table: str, drop_indexes: bool, as_json: bool) -> None:
    """Bring in TABLE, created without stable row ids (lancedb's default): rewrite it once with them.

    Keeps rows, schema, config and BTree/Bitmap/LabelList indexes; the version
    history starts again. One full read and write; stop other writers meanwhile.
    Interrupted, run it again: the table is never lost.
    """
    r = obj.db.enable_stable_row_ids(table, drop_indexes=drop_indexes)
    if as_json:
        _print_json(r.__dict__)
        return
    if not r.rewritten:
        click.echo(f"{table}: has stable row ids already; nothing to do")
        return
    click.echo(f"{table}: rewritten with stable row ids: {r.rows} rows in {r.seconds:.2f}s, now version {r.version}")
    if r.indexes_rebuilt:
        click.echo(f"  indexes rebuilt: {', '.join(r.indexes_rebuilt)}")
    if r.indexes_dropped:
        click.echo(f"  indexes dropped, create them again: {', '.join(r.indexes_dropped)}")
    if r.stale_columns:
        click.echo(f"  computed columns now stale, backfill them: {', '.join(r.stale_columns)}")


if __name__ == "__main__":
    main()
