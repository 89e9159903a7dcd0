"""How long an idle Spark Python worker, and a model a process set up, is kept.

One setting, ``$MV_ASSETS_PYTHON_WORKER_KEEP_S`` (or ``SparkRunner(keep_workers_seconds=)``):
the execution layer's Spark daemon keeps a worker the executor let go that long
(execution/daemon.py), and a process lets go of a stateful UDF instance unused that long
(model/udf.py). Standard library only: the daemon imports this before it forks.
"""

import os

KEEP_ENV = "MV_ASSETS_PYTHON_WORKER_KEEP_S"
DEFAULT_KEEP_S = 900.0


def keep_seconds(environ=os.environ) -> float:
    """The keep time in seconds (0: nothing kept past Spark's own minute); a
    bad value is a ValueError naming the variable."""
    raw = environ.get(KEEP_ENV, "")
    if not raw.strip():
        return DEFAULT_KEEP_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{KEEP_ENV} must be a number of seconds, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{KEEP_ENV} must be 0 or more seconds, got {raw!r}")
    return value


def resolve_keep(keep: float | None, local: bool, environ=os.environ) -> float | None:
    """Seconds a Spark application keeps idle Python workers, or None for
    Spark's own daemon: ``keep`` when given, else the variable when set, else
    the default on a local master (a cluster's executors must have mv_assets
    installed, so only when asked there)."""
    if keep is not None:
        value = keep_seconds({KEEP_ENV: str(keep)})
    elif environ.get(KEEP_ENV, "").strip():
        value = keep_seconds(environ)
    elif local:
        value = DEFAULT_KEEP_S
    else:
        return None
    return value or None
