"""Where refresh and backfill tasks run, as users pick it: in process
(:class:`InlineRunner`) or on Spark (:class:`SparkRunner`: local, a cluster,
or Spark Connect). Implemented in :mod:`mv_assets.execution.spark`."""

from mv_assets.execution.spark import InlineRunner, Runner, SparkRunner, default_runner, lance_dataframe

__all__ = ["InlineRunner", "Runner", "SparkRunner", "default_runner", "lance_dataframe"]
