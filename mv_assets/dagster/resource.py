"""The Dagster resource: a catalog connection whose Spark starts lazily."""

import os
from typing import Any, Literal, Optional

import dagster as dg
from pydantic import Field, PrivateAttr

from mv_assets.api.catalog import Connection, connect, keep_arrangements_on_disk
from mv_assets.api.runners import InlineRunner, Runner, SparkRunner
from mv_assets.dagster.spark_session import PySparkResourceRunner, as_pyspark_resource

ENV = {
    "spark_master": "MV_ASSETS_SPARK_MASTER",
    "spark_remote": "MV_ASSETS_SPARK_REMOTE",
    "local_below_rows": "MV_ASSETS_LOCAL_BELOW_ROWS",
    "inline_threads": "MV_ASSETS_INLINE_THREADS",
}
"""Resource fields bound to environment variables (:meth:`MvAssetsResource.from_env`);
``runner`` comes from ``MV_ASSETS_RUNNER``."""


class MvAssetsResource(dg.ConfigurableResource):
    """Opens the catalog and runs refreshes on Spark.

    Nothing starts at definition load or resource construction: the Spark
    session (a local JVM, or a Spark Connect client) is created by the first
    refresh that has work to do, and shared by every asset in the run.

    ``pyspark``: a dagster-pyspark ``LazyPySparkResource`` (or
    ``PySparkResource``) whose session runs the refreshes instead of one
    configured by ``spark_master`` / ``spark_remote``: its ``spark_config``
    says where Spark runs and how (see :mod:`mv_assets.dagster.spark_session`).
    """

    catalog_uri: str = Field(description="Catalog: a local directory or an object-store URI (s3://bucket/path...).")
    storage_options: Optional[dict[str, str]] = Field(
        default=None,
        description="Lance object-store options for the catalog (endpoint, region, allow_http...); default "
        "$MV_ASSETS_STORAGE_OPTIONS (JSON). Keep credentials in the environment (AWS_* variables or "
        "$MV_ASSETS_STORAGE_OPTIONS), not in definitions.",
    )
    spark_master: Optional[str] = Field(
        default=None, description="Spark master URL; default local[*] (or $MV_ASSETS_SPARK_MASTER)."
    )
    spark_remote: Optional[str] = Field(
        default=None, description="Spark Connect URL such as sc://127.0.0.1:15002; overrides spark_master."
    )
    runner: Literal["spark", "inline"] = Field(
        default="spark", description="'spark' (default) or 'inline' (run tasks in the run process, no JVM)."
    )
    inline_threads: int = Field(
        default=1,
        description="With runner 'inline': tasks run at once on threads of the run process, sharing its "
        "stateful UDF instances (one model per process; the UDF must take calls from several threads). "
        "Default $MV_ASSETS_INLINE_THREADS or 1.",
    )
    local_below_rows: Optional[int] = Field(
        default=None,
        description="Refreshes computing at most this many rows run in the run process instead of a Spark job "
        "(default $MV_ASSETS_LOCAL_BELOW_ROWS or 0: always Spark).",
    )

    pyspark: Optional[dg.ConfigurableResource] = Field(
        default=None,
        description="A dagster-pyspark LazyPySparkResource (or PySparkResource, taken as lazy): the refreshes run "
        "on the session it builds from its spark_config, started by the first refresh with Spark work, instead of "
        "spark_master / spark_remote.",
    )

    _runner: Optional[Runner] = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        if data.get("pyspark") is not None:  # refused here, with what to pass, not by a pydantic error
            data["pyspark"] = as_pyspark_resource(data["pyspark"])
            given = [name for name in ("spark_master", "spark_remote") if data.get(name)]
            if given:
                raise ValueError(
                    f"MvAssetsResource: {' and '.join(given)} and pyspark= both say where Spark runs; the pyspark "
                    "resource's spark_config does (spark.master, spark.remote): give one of them"
                )
        super().__init__(**data)

    @classmethod
    def from_env(
        cls, catalog_uri: str, storage_options: dict[str, str] | None = None, pyspark: Any = None,
    ) -> "MvAssetsResource":
        """The resource with each setting whose environment variable is set
        bound as a ``dg.EnvVar`` (see ``ENV``): the value is read when the
        resource initialises, never stored in the definitions, and the
        Dagster UI shows which variable it comes from. With ``pyspark`` (a
        dagster-pyspark resource) its spark_config says where Spark runs:
        ``MV_ASSETS_SPARK_MASTER`` and ``MV_ASSETS_SPARK_REMOTE`` are not read."""
        kwargs: dict = {}
        if pyspark is not None:
            kwargs["pyspark"] = pyspark
        for name, var in ENV.items():
            if pyspark is not None and name in ("spark_master", "spark_remote"):
                continue
            if os.environ.get(var):
                kwargs[name] = dg.EnvVar.int(var) if name in ("local_below_rows", "inline_threads") else dg.EnvVar(var)
        runner = os.environ.get("MV_ASSETS_RUNNER")
        if runner:  # a Literal field takes the value itself (checked here, before any run)
            if runner not in ("spark", "inline"):
                raise ValueError(f"MV_ASSETS_RUNNER must be 'spark' or 'inline', got {runner!r}")
            kwargs["runner"] = runner
        return cls(catalog_uri=catalog_uri, storage_options=storage_options, **kwargs)

    def get_runner(self) -> Runner:
        if self._runner is None:
            if self.runner == "inline":
                self._runner = InlineRunner(threads=self.inline_threads)
            elif self.runner == "spark" and self.pyspark is not None:
                self._runner = PySparkResourceRunner(pyspark=self.pyspark, local_below_rows=self.local_below_rows)
            elif self.runner == "spark":
                self._runner = SparkRunner(
                    master=self.spark_master or None,
                    remote=self.spark_remote or None,
                    local_below_rows=self.local_below_rows,
                )
            else:
                raise ValueError(f"runner must be 'spark' or 'inline', got {self.runner!r}")
        return self._runner

    def connection(self) -> Connection:
        """The catalog, refreshing with this resource's runner (Spark starts on
        first use). A run is a process of its own: join views' arrangements are
        kept on disk for the runs after it (``mv_assets.ops.arrangements``)."""
        keep_arrangements_on_disk()
        return connect(self.catalog_uri, runner=self.get_runner(), storage_options=self.storage_options)

    def reader(self) -> Connection:
        """The catalog for reading and planning only (sensors, schedules): its
        runner computes in process, so nothing here can start a JVM."""
        return connect(self.catalog_uri, runner=InlineRunner(), storage_options=self.storage_options)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if isinstance(self._runner, SparkRunner):
            self._runner.stop()
