"""Refreshes launched through Dagster Pipes: ``build_definitions(..., pipes_client=...)``.

A view's refresh, the recompute of its UDF columns whose code changed, and
its checks run in ``python -m mv_assets.pipes`` (:mod:`mv_assets.pipes`)
wherever the Pipes client launches it (a subprocess, EMR Serverless,
Databricks, a Kubernetes pod), so a long refresh does not live in the run
process. The run process keeps the wiring as in-process runs do it: the
partitions, the data versions and input pointers, one materialization per
partition with its numbers (read back from what the Pipes process reports),
the observations of source fragments.

How a launch is made (:class:`PipesLauncher`): a ``dagster.PipesSubprocessClient``
is run with ``[sys.executable, "-m", "mv_assets.pipes"]``; any other client
takes its own arguments (a job's parameters, a cluster spec), so it is given
as a callable ``launch(context, extras)`` returning what ``client.run(...)``
returns::

    emr = PipesEMRServerlessClient()
    def launch(context, extras):
        return emr.run(context=context, extras=extras, start_job_run_params={...})
    build_definitions(db, pipes_client=launch)

The extras sent: the catalog (``catalog``, ``storage_options`` given in code)
and the runner (``runner``, ``spark_master``, ``spark_remote``,
``local_below_rows``, ``inline_threads``) from the definitions' resource,
then :attr:`PipesLauncher.extras` (what the cluster runs with), then what
the run asks (``view``, ``fragments``, ``src_version``, ``checks``...): see
:mod:`mv_assets.pipes` and docs/deploy.md, "Dagster Pipes".
"""

import dataclasses
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from dagster._core.events import DagsterEventType  # not exported by dagster

from mv_assets.api.table import RefreshResult
from mv_assets.dagster.resource import MvAssetsResource
from mv_assets.dagster.spark_session import PySparkResourceRunner
from mv_assets.pipes import DESCRIPTION_KEY, RECOMPUTED_KEY, REFRESH_KEY

__all__ = ["PIPES_MODULE", "PipesLauncher", "as_pipes_launcher", "pipes_command", "launch_view", "view_pipes_extras"]

PIPES_MODULE = "mv_assets.pipes"
_CLOSED_WITH_EXCEPTION = "[pipes] external process pipes closed with exception"


def pipes_command() -> list[str]:
    """The command a subprocess client runs: this Python, ``-m mv_assets.pipes``."""
    return [sys.executable, "-m", PIPES_MODULE]


@dataclass(frozen=True)
class PipesLauncher:
    """How the view assets launch ``python -m mv_assets.pipes``.

    ``launch(context, extras)`` starts it through a Pipes client and returns
    what the client's ``run`` returns (a ``PipesClientCompletedInvocation``);
    ``extras`` are sent with every launch, over those taken from the
    definitions' resource (say ``{"runner": "spark", "spark_master": ...}``
    for the cluster's Spark, or ``{"storage_options": ...}``)."""

    launch: Callable[[Any, dict], Any]
    extras: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def subprocess(cls, client: dg.PipesSubprocessClient | None = None, extras: Mapping[str, Any] | None = None,
                   ) -> "PipesLauncher":
        """A launcher running ``python -m mv_assets.pipes`` as a subprocess of the run."""
        client = client or dg.PipesSubprocessClient()

        def launch(context, extras: dict):
            return client.run(context=context, command=pipes_command(), extras=extras)

        return cls(launch, dict(extras or {}))


def as_pipes_launcher(client: Any) -> PipesLauncher | None:
    """``build_definitions``' ``pipes_client``: a :class:`PipesLauncher`, a
    ``PipesSubprocessClient``, or a callable ``(context, extras) ->
    client.run(...)`` for any other client. Anything else is refused here,
    when the definitions load."""
    if client is None or isinstance(client, PipesLauncher):
        return client
    if isinstance(client, dg.PipesSubprocessClient):
        return PipesLauncher.subprocess(client)
    if isinstance(client, dg.PipesClient):
        raise TypeError(
            f"pipes_client: {type(client).__name__} takes arguments of its own (a job's parameters, a cluster, an "
            "image): pass a function launch(context, extras) that returns client.run(context=context, "
            "extras=extras, ...) running `python -m mv_assets.pipes` (docs/deploy.md, \"Dagster Pipes\")"
        )
    if callable(client):
        return PipesLauncher(client)
    raise TypeError(f"pipes_client must be a Pipes client, a PipesLauncher or a function launch(context, extras), "
                    f"got {type(client).__name__}")


def resource_extras(resource: MvAssetsResource) -> dict[str, Any]:
    """What the Pipes process needs of the definitions' resource: the catalog
    and the runner (with a dagster-pyspark resource, ``pyspark=``: where its
    ``spark_config`` says Spark runs, and the rest of it as ``spark_conf``).
    Storage options only where given in code (options from the environment
    may hold credentials: the cluster has its own)."""
    extras: dict[str, Any] = {"catalog": resource.catalog_uri, "runner": resource.runner}
    for name in ("spark_master", "spark_remote", "local_below_rows"):
        if getattr(resource, name) is not None:
            extras[name] = getattr(resource, name)
    if resource.pyspark is not None:  # (the user's Spark settings: the Pipes process builds its session of them)
        spark = PySparkResourceRunner(pyspark=resource.pyspark)
        remote = spark.resolved_remote()
        extras["spark_remote" if remote else "spark_master"] = remote or spark.resolved_master()
        extras["spark_conf"] = {k: v for k, v in spark.conf.items() if k not in ("spark.master", "spark.remote")}
    if resource.inline_threads != 1:
        extras["inline_threads"] = resource.inline_threads
    if resource.storage_options:
        extras["storage_options"] = dict(resource.storage_options)
    return extras


def view_pipes_extras(context: dg.AssetExecutionContext, catalog: str, view: str, **more: Any) -> dict[str, Any]:
    """The extras for an asset of your own that launches ``python -m
    mv_assets.pipes`` for ``view``: the source fragments of the run's
    partitions (Dagster sends a Pipes process no key of a partition range),
    the checks of the asset the run selects, and ``more`` (``runner``,
    ``spark_master``...)."""
    extras: dict[str, Any] = {"catalog": catalog, "view": view}
    if context.has_partition_key or context.has_partition_key_range:
        extras["fragments"] = list(context.partition_keys)
    keys = context.selected_asset_keys
    key = next(iter(keys)) if len(keys) == 1 else dg.AssetKey([view])
    extras["asset_key"] = key.to_escaped_user_string()
    extras["checks"] = sorted(k.name for k in context.selected_asset_check_keys if k.asset_key == key)
    return {**extras, **more}


@dataclass(frozen=True)
class RemoteBackfill:
    """What a recompute in the Pipes process did, as the run's records read it
    (the fields of the engine's ``BackfillResult`` they use)."""

    columns: list[str]
    rows_written: int = 0
    rows_failed: int = 0
    udf_rows_computed: int = 0
    rows_resumed: int = 0
    rows_by_fragment: dict[int, int] = field(default_factory=dict)


@dataclass
class PipesOutcome:
    """One launch's results: the refresh, the recomputes by column, the check results."""

    result: RefreshResult | None = None
    recomputed: dict[str, RemoteBackfill] = field(default_factory=dict)
    checks: list[dg.AssetCheckResult] = field(default_factory=list)


def launch_view(context, launcher: PipesLauncher, resource: MvAssetsResource, view: str, view_key: dg.AssetKey,
                request: dict[str, Any], report_key: dg.AssetKey | None = None) -> PipesOutcome:
    """Launch ``python -m mv_assets.pipes`` for ``view`` and read back what it
    reported; its failure fails the step with the Pipes process's error.
    ``report_key``: the selected asset its materialization is reported for
    (default the view's; a UDF column's when the run materializes only
    columns of the view: Pipes takes reports of the step's selected assets
    only); the view's checks are reported for the view."""
    report_key = report_key or view_key
    extras = {**resource_extras(resource), **launcher.extras, "view": view,
              "asset_key": report_key.to_escaped_user_string(),
              "checks_asset_key": view_key.to_escaped_user_string(), **request}
    step = context.get_step_execution_context()
    typed = step.requires_typed_event_stream
    mark = _last_engine_event(context)
    try:
        invocation = launcher.launch(context, extras)
        results = invocation.get_results(implicit_materializations=False)
    except Exception as exc:
        raise _pipes_failure(context, view, mark, exc) from exc
    finally:
        if not typed:
            # A Pipes session makes the step require one output per selected asset; this op
            # records its materializations as logged events instead (one per partition, with
            # data versions of their own), as in-process runs do: the requirement is lifted.
            step._requires_typed_event_stream = False
            step._typed_event_stream_error_message = None
    return _outcome(results, report_key)


def _outcome(results, view_key: dg.AssetKey) -> PipesOutcome:
    out = PipesOutcome()
    for r in results:
        if isinstance(r, dg.MaterializeResult) and r.asset_key == view_key:
            md = r.metadata or {}
            if REFRESH_KEY in md:
                out.result = _refresh_result(_value(md[REFRESH_KEY]))
            for done in _value(md.get(RECOMPUTED_KEY)) or []:
                backfill = _backfill(done)
                for name in backfill.columns:  # a multi-column UDF: one recompute for its siblings
                    out.recomputed[name] = backfill
        elif isinstance(r, dg.AssetCheckResult):
            md = dict(r.metadata or {})
            description = _value(md.pop(DESCRIPTION_KEY, None))
            out.checks.append(dg.AssetCheckResult(
                asset_key=r.asset_key, check_name=r.check_name, passed=r.passed, severity=r.severity,
                description=description, metadata=md,
            ))
    return out


def _value(md: Any) -> Any:
    return md.value if isinstance(md, dg.MetadataValue) else md


def _refresh_result(raw: dict) -> RefreshResult:
    names = {f.name for f in dataclasses.fields(RefreshResult)}
    fields = {k: v for k, v in raw.items() if k in names}
    fields["rows_by_fragment"] = {int(k): int(v) for k, v in (raw.get("rows_by_fragment") or {}).items()}
    return RefreshResult(**fields)


def _backfill(raw: dict) -> RemoteBackfill:
    names = {f.name for f in dataclasses.fields(RemoteBackfill)}
    fields = {k: v for k, v in raw.items() if k in names}
    fields["rows_by_fragment"] = {int(k): int(v) for k, v in (raw.get("rows_by_fragment") or {}).items()}
    return RemoteBackfill(**fields)


def _last_engine_event(context) -> int | None:
    records = context.instance.get_records_for_run(context.run.run_id, of_type=DagsterEventType.ENGINE_EVENT, limit=1,
                                                   ascending=False).records
    return records[0].storage_id if records else None


def _pipes_failure(context, view: str, mark: int | None, exc: Exception) -> dg.Failure:
    """The step's failure: the error the Pipes process closed its session
    with (the engine's sentence: a UDF's column and row, what is missing in
    the extras), else the client's own error (the launch failed)."""
    records = context.instance.get_records_for_run(context.run.run_id, of_type=DagsterEventType.ENGINE_EVENT,
                                                   limit=20, ascending=False).records
    for record in records:
        event = record.event_log_entry.dagster_event
        if mark is not None and record.storage_id <= mark:
            break
        error = event.engine_event_data.error if event is not None and event.engine_event_data else None
        if error is not None and event is not None and event.message == _CLOSED_WITH_EXCEPTION:
            message = error.message.strip()
            # (the class's name, bare or with its module's: "mv_assets.model.errors.UdfError: UDF 'f' raised ...")
            message = re.sub(rf"^(?:\w+\.)*{re.escape(error.cls_name or '')}: ", "", message) if error.cls_name else message
            return dg.Failure(description=message, metadata={
                "view": view, "error_type": error.cls_name or "", "launched": f"python -m {PIPES_MODULE}",
                "traceback": dg.MetadataValue.text("".join(error.stack)),
            })
    return dg.Failure(description=f"{view}: the Pipes launch of `python -m {PIPES_MODULE}` failed: {exc}",
                      metadata={"view": view, "error_type": type(exc).__name__})
