"""``python -m mv_assets.pipes``: a view's refresh as a Dagster Pipes process.

Launched by a Dagster Pipes client (``PipesSubprocessClient``,
``PipesEMRServerlessClient``, ``PipesDatabricksClient``, ``PipesK8sClient``...)
where the cluster is, so a long refresh does not live in the Dagster run
process; its logs, its materialization and its check results stream back
through Pipes. It imports ``dagster_pipes`` (the small package), never
``dagster``: the cluster's Python needs mv_assets and its dependencies only.

What it reads from the Pipes context's extras (docs/deploy.md, "Dagster Pipes"):

``catalog`` (required)
    The catalog URI (a path, ``s3://...``).
``view`` (required)
    The view to refresh.
``runner``
    ``"inline"`` (tasks in this process) or ``"spark"`` (default): Spark on
    ``spark_master`` / ``spark_remote`` when given, else the session the
    cluster's ``spark-submit`` configured (EMR, Databricks), else ``local[*]``
    (or ``$MV_ASSETS_SPARK_MASTER``). ``spark_conf`` (a dict), ``local_below_rows``
    and ``inline_threads`` as the runners take them.
``storage_options``
    Lance's object-store options (default ``$MV_ASSETS_STORAGE_OPTIONS``;
    credentials belong in the cluster's environment or role, not here).
``fragments``
    The source fragments to refresh (a list of ids), or null for the whole
    view. Absent: the launching asset's partition key, when it has one, names
    the one source fragment (a range of partitions is not sent by Dagster to
    Pipes processes: without ``fragments`` it refreshes the whole view).
``src_version``, ``recompute``, ``backfill``, ``upstream``, ``refresh``
    Refresh to this source version; UDF columns to compute again for the
    rows refreshed; UDF columns whose rows computed by other code are
    recomputed (a changed UDF); whether upstream views are brought up to
    date first (default true); whether to refresh at all (false: checks only).
``checks``, ``since_version``
    The view's checks the launching asset declares (names; none when absent),
    reported with ``report_asset_check``: what the refresh changed (from
    ``since_version``, default the view's version before it), or every row
    when nothing was refreshed.
``asset_key``, ``checks_asset_key``
    The asset the materialization is reported for (default: the launching
    asset's one key; a UDF column's when only columns of the view are
    materialized), and the asset the checks are (default: ``asset_key``).

A failing refresh fails the Pipes session with its error (and exit status 1);
bad extras fail it before anything is written.
"""

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from dagster_pipes import (
    PipesCliArgsParamsLoader,
    PipesContext,
    PipesDbfsContextLoader,
    PipesDbfsMessageWriter,
    PipesDefaultContextLoader,
    PipesDefaultMessageWriter,
    PipesEnvVarParamsLoader,
    PipesUnityCatalogVolumesContextLoader,
    PipesUnityCatalogVolumesMessageWriter,
    open_dagster_pipes,
)

from mv_assets.api import progress
from mv_assets.api.catalog import Connection, connect, keep_arrangements_on_disk
from mv_assets.api.runners import InlineRunner, Runner, SparkRunner
from mv_assets.api.table import MaterializedView
from mv_assets.model.errors import CatalogNotFoundError
from mv_assets.model.kinds import kind_of
from mv_assets.model.markers import recompute_words

__all__ = ["PipesRequest", "PipesExtrasError", "main", "run"]

SCOPE_CHANGES = "changes since the last refresh"  # as the in-process runs say (mv_assets.dagster.assets)
SCOPE_FRAGMENTS = "selected fragments"
REFRESH_KEY = "mv_assets/refresh"  # the refresh's result (JSON), read back by mv_assets.dagster
RECOMPUTED_KEY = "mv_assets/recomputed"  # the recomputes' results (JSON list)
DESCRIPTION_KEY = "description"  # a check's description: Pipes carries check metadata only
_KNOWN = {"catalog", "view", "runner", "spark_master", "spark_remote", "spark_conf", "local_below_rows",
          "inline_threads", "storage_options", "fragments", "src_version", "recompute", "backfill", "upstream",
          "refresh", "checks", "since_version", "asset_key", "checks_asset_key"}


class PipesExtrasError(ValueError):
    """The Pipes extras do not say what to refresh (raised before anything is written)."""


@dataclass(frozen=True)
class PipesRequest:
    """What one Pipes launch asks, from its extras and partition (validated)."""

    catalog: str
    view: str
    runner: str = "spark"
    spark_master: str | None = None
    spark_remote: str | None = None
    spark_conf: dict = field(default_factory=dict)
    local_below_rows: int | None = None
    inline_threads: int = 1
    storage_options: dict | None = None
    fragments: list[int] | None = None
    src_version: int | None = None
    recompute: list[str] | None = None
    backfill: list[str] = field(default_factory=list)
    upstream: bool = True
    refresh: bool = True
    checks: list[str] = field(default_factory=list)
    since_version: int | None = None
    asset_key: str | None = None
    checks_asset_key: str | None = None

    @classmethod
    def from_extras(cls, extras: dict, partition_key: str | None = None) -> "PipesRequest":
        """The request, or :class:`PipesExtrasError` naming what is missing or wrong.

        >>> PipesRequest.from_extras({"catalog": "/c", "view": "v"}, "3").fragments
        [3]
        >>> PipesRequest.from_extras({"view": "v"})
        Traceback (most recent call last):
        ...
        mv_assets.pipes.PipesExtrasError: the Pipes extras lack 'catalog' (the catalog URI); got extras: view
        """
        got = ", ".join(sorted(extras)) or "none"
        for key, what in (("catalog", "the catalog URI"), ("view", "the view to refresh")):
            if not isinstance(extras.get(key), str) or not extras[key]:
                raise PipesExtrasError(f"the Pipes extras lack {key!r} ({what}); got extras: {got}")
        unknown = sorted(set(extras) - _KNOWN)
        if unknown:
            raise PipesExtrasError(f"unknown Pipes extras {unknown} (known: {sorted(_KNOWN)})")
        if extras.get("runner", "spark") not in ("spark", "inline"):
            raise PipesExtrasError(f"the Pipes extra 'runner' must be 'spark' or 'inline', got {extras['runner']!r}")
        args: dict[str, Any] = {k: v for k, v in extras.items() if v is not None or k == "fragments"}
        if "fragments" not in extras and partition_key is not None:
            args["fragments"] = [partition_key]  # the launching asset's partition: one source fragment
        if args.get("fragments") is not None:
            args["fragments"] = _fragment_ids(args["fragments"], extras["view"])
        return cls(**args)

    def make_runner(self) -> Runner:
        if self.runner == "inline":
            return InlineRunner(threads=int(self.inline_threads))
        master = self.spark_master or (None if self.spark_remote else _submitted_master())
        return SparkRunner(master=master, remote=self.spark_remote, conf=dict(self.spark_conf),
                           local_below_rows=self.local_below_rows)


def _fragment_ids(keys: list, view: str) -> list[int]:
    bad = [k for k in keys if not str(k).isdigit()]
    if bad:
        raise PipesExtrasError(f"partition keys {bad} of {view!r} are not fragment ids of its source: "
                               "a partition of a view is one source fragment")
    return [int(k) for k in keys]


def _submitted_master() -> str | None:
    """The master ``spark-submit`` gave this driver (EMR, Databricks, YARN,
    Kubernetes: it sets ``PYSPARK_GATEWAY_PORT``), so the refresh runs on
    the cluster it was submitted to and not on ``local[*]``; None elsewhere."""
    if os.environ.get("MV_ASSETS_SPARK_MASTER") or not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    from pyspark.sql import SparkSession  # the submitted session, with its configuration

    return SparkSession.builder.getOrCreate().sparkContext.master


def _open(request: PipesRequest) -> tuple[Connection, MaterializedView]:
    """The catalog and the view, or an error naming what is not there (nothing written)."""
    keep_arrangements_on_disk()  # (a process a refresh: join views' arrangements kept for the next one)
    try:
        db = connect(request.catalog, runner=request.make_runner(), storage_options=request.storage_options,
                     create=False)
    except CatalogNotFoundError as exc:
        raise PipesExtrasError(f"the Pipes extra 'catalog' names no catalog: {exc}") from exc
    names = db.table_names()
    if request.view not in names:
        views = [n for n in names if isinstance(db.open_table(n), MaterializedView)]
        raise PipesExtrasError(f"no view {request.view!r} in the catalog at {request.catalog} "
                               f"(its views: {', '.join(views) or 'none'})")
    view = db.open_table(request.view)
    if not isinstance(view, MaterializedView):
        raise PipesExtrasError(f"{request.view!r} in the catalog at {request.catalog} is a table, not a view")
    return db, view


def _scoped(db: Connection, view: MaterializedView) -> bool:
    """Whether a source fragment of the view refreshes on its own (as the
    Dagster wiring's ``TableInfo.scoped``): a view over a base table, no
    limit, of a kind whose rows follow their source fragment."""
    d = view.definition
    return (d.limit is None and kind_of(d).by_fragment
            and not isinstance(db.open_table(view.source), MaterializedView))


def _refresh(pipes: PipesContext, request: PipesRequest, db: Connection, view: MaterializedView,
             fragments: list[int] | None):
    """The refresh (upstream views first), logged to the run as in-process runs log it."""
    say = pipes.log.info
    if request.upstream:
        for name in db.upstream(view.name):
            up = db.open_view(name)
            if up.pending_source_versions() or up.refresh_state().scoped_since_whole:
                with progress.listen(lambda p, n=name: say(f"{n} (upstream of {view.name}): refresh: {p}")):
                    r = up.refresh()
                say(f"brought upstream view {name} to source v{r.to_version} first")
    current = view.source_version
    pinned = request.src_version
    if pinned is not None and current is not None and pinned < current:
        pinned = current  # another run got further already: never go back
    with progress.listen(lambda p: say(f"{view.name}: refresh: {p}")):
        result = view.refresh(src_version=pinned, fragments=fragments, recompute=request.recompute)
    say(result.told(kind_of(view.definition).name, result.seconds))  # (the launching asset logs none of its own)
    return result


def _recompute(pipes: PipesContext, view: MaterializedView, columns: list[str]) -> list:
    """UDF columns whose code changed: recompute exactly their rows computed by other code."""
    done: list = []
    for name in columns:
        if any(name in d.columns for d in done):
            continue  # a multi-column UDF filled it with a sibling
        where = view.recompute_where(name)  # (not the rows failing under the current code: retry_errors's)
        plan = view.plan_backfill(name, where=where)
        if not plan.rows:
            continue
        what, rows = recompute_words(plan.rows, view.rows_never_computed(name, where))
        verb, why = what.split(" ", 1)
        pipes.log.info(f"{view.name}: {verb} {name} {why}: {rows}")
        with progress.listen(lambda p, n=name: pipes.log.info(f"{view.name}: recomputing {n}: {p}")):
            done.append(view.backfill(name, where=where))
    return done


def _json(value: Any) -> Any:
    """``value`` as plain JSON (fragment ids as keys become strings)."""
    return json.loads(json.dumps(value, default=str))


def _metadata(view: MaterializedView, result, recomputed: list, fragments: list[int] | None, seconds: float) -> dict:
    """The materialization's metadata: the keys in-process runs record
    (docs/dagster.md, "Metadata"), plus the results as JSON."""
    unit = {"chunker": "parents", "aggregate": "groups", "join_aggregate": "groups"}.get(
        kind_of(view.definition).name, "rows")
    computed_key = "parents_chunked" if unit == "parents" else "rows_computed"
    md: dict[str, Any] = {
        "source_version": view.source_version if result is None else result.to_version,
        "view_version": view.version, "run_duration_s": round(seconds, 3),
        "scope": SCOPE_CHANGES if fragments is None else SCOPE_FRAGMENTS,
        "dagster/row_count": view.count_rows(),
    }
    if len(view.sources) > 1:
        md["source_versions"] = {"raw_value": _json(view.source_versions), "type": "json"}
    if result is not None:
        md.update({
            "runner": result.runner, f"run_{unit}_inserted": result.rows_inserted,
            f"run_{unit}_updated": result.rows_updated, f"run_{unit}_deleted": result.rows_deleted,
            f"run_{computed_key}": sum(result.rows_by_fragment.values()),
            "run_udf_rows_computed": {"raw_value": _json(result.udf_rows_computed), "type": "json"},
            # (the plan's details left out: they may list rows)
            REFRESH_KEY: {"raw_value": _json({**result.summary(), "details": {}}), "type": "json"},
        })
        if fragments is not None and len(fragments) == 1:
            fid = fragments[0]  # one partition: its own numbers
            md.update({"source_fragment": fid, computed_key: int(result.rows_by_fragment.get(fid, 0)),
                       "partition_row_count": view.rows_by_fragment(result.to_version, [fid]).get(fid, 0)})
    if recomputed:
        md["run_udf_rows_recomputed"] = sum(d.rows_written for d in recomputed)
        md[RECOMPUTED_KEY] = {"raw_value": _json([d.summary() for d in recomputed]), "type": "json"}
    return md


def _report_checks(pipes: PipesContext, request: PipesRequest, view: MaterializedView, since: int | None) -> None:
    """The view's checks the launching asset declares: what this refresh
    changed (``since``), or every row when nothing was refreshed."""
    if not request.checks:
        return
    outcomes = view.check(scope="last_refresh", since_version=since) if since is not None else view.check()
    for outcome in outcomes:
        if outcome.name not in request.checks:
            continue
        md: dict[str, Any] = {DESCRIPTION_KEY: {"raw_value": outcome.description, "type": "text"}}
        for key, value in _json(outcome.metadata).items():
            md[key] = {"raw_value": value, "type": "json"} if isinstance(value, (dict, list)) else value
        pipes.report_asset_check(outcome.name, outcome.passed, "ERROR", md,
                                 asset_key=request.checks_asset_key or request.asset_key)


def run(pipes: PipesContext) -> None:
    """One launch: read the request, refresh, report the materialization and the checks."""
    span = pipes.partition_key_range if pipes.is_partition_step else None  # (Dagster sends none for a range)
    partition = span["start"] if span is not None and span["start"] == span["end"] else None
    request = PipesRequest.from_extras(dict(pipes.extras), partition)
    db, view = _open(request)
    before = view.version
    fragments = request.fragments if request.fragments is not None and _scoped(db, view) else None
    started = time.perf_counter()
    result = _refresh(pipes, request, db, view, fragments) if request.refresh else None
    recomputed = _recompute(pipes, view, request.backfill) if request.backfill else []
    md = _metadata(view, result, recomputed, fragments, time.perf_counter() - started)
    wrote = request.refresh or bool(request.backfill)
    if wrote:
        pipes.report_asset_materialization(metadata=md, asset_key=request.asset_key)
    since = request.since_version if request.since_version is not None else before
    _report_checks(pipes, request, view, since if wrote else None)


CHANNELS = {  # how the Pipes context arrives and messages go back, by where it runs
    "default": (PipesDefaultContextLoader, PipesDefaultMessageWriter),  # a subprocess, Kubernetes, EMR, ECS...
    "dbfs": (PipesDbfsContextLoader, PipesDbfsMessageWriter),  # Databricks classic (PipesDatabricksClient)
    "volumes": (PipesUnityCatalogVolumesContextLoader, PipesUnityCatalogVolumesMessageWriter),  # Databricks
}                                                             # serverless (PipesDatabricksServerlessClient)


def main(argv: list[str] | None = None) -> int:
    """``python -m mv_assets.pipes [--channel default|dbfs|volumes]``. Exit
    status: 0 done, 1 the refresh failed (the Pipes session closed with its
    error), 2 not launched by a Dagster Pipes client. The Pipes parameters
    come from the environment, or from ``--dagster-pipes-context`` /
    ``--dagster-pipes-messages`` arguments (a Databricks job on an existing
    cluster)."""
    parser = argparse.ArgumentParser(prog="python -m mv_assets.pipes", description="A view's refresh as a Dagster Pipes process.")
    parser.add_argument("--channel", choices=sorted(CHANNELS), default="default",
                        help="how the Pipes context and messages travel (default: as the client's defaults; dbfs: "
                             "PipesDatabricksClient; volumes: PipesDatabricksServerlessClient)")
    args, _ = parser.parse_known_args(argv)  # (the Pipes arguments are read by their own loader)
    params = PipesEnvVarParamsLoader()
    if not params.is_dagster_pipes_process():
        params = PipesCliArgsParamsLoader()
    if not params.is_dagster_pipes_process():
        print("mv_assets.pipes: launch this through a Dagster Pipes client (see docs/deploy.md, "
              "\"Dagster Pipes\"): no Pipes context in the environment or the arguments", file=sys.stderr)
        return 2
    loader, writer = CHANNELS[args.channel]
    try:
        with open_dagster_pipes(params_loader=params, context_loader=loader(), message_writer=writer()) as pipes:
            run(pipes)
    except Exception as exc:  # reported to Dagster by the Pipes session as it closed
        print(f"mv_assets.pipes: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
