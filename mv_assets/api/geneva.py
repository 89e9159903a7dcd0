"""Geneva's parameters: what each means here, or why it does not apply.

A Geneva user's working code runs unchanged: every parameter Geneva's
``Table`` and ``Connection`` methods take is accepted. Those that have a
meaning here are mapped to it (``concurrency`` is the number of tasks a job is
cut into, ``commit_granularity`` commits a backfill a group of fragments at a
time, ``num_frags`` / ``skip_frags`` pick fragments, ...: see
docs/geneva.md); those that do not (Ray's admission control, threads inside a
Ray actor, the job tracker's polling interval, ...) are accepted with one
:class:`GenevaCompatWarning` saying why, and only when given a value other
than Geneva's default (the default changes nothing here either). A name that
is no parameter of the Geneva method raises ``TypeError``, as Python does.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lance

from mv_assets.model.compat import GenevaCompatWarning, warn_ignored

__all__ = [
    "GenevaCompatWarning", "accept", "warn", "BackfillOptions", "backfill_options", "fragments_between", "seconds",
    "BACKFILL_IGNORED", "BACKFILL_ASYNC_IGNORED", "PLAN_BACKFILL_IGNORED", "REFRESH_IGNORED", "LOAD_IGNORED",
    "LOAD_ASYNC_IGNORED", "ADD_IGNORED",
]




_NO_ADMISSION = ("there is no admission control here: Spark runs the tasks as executor cores free up (a cluster "
                 "without executors fails after $MV_ASSETS_SPARK_RESOURCE_WAIT seconds)")
_ONE_THREAD = ("each task runs its UDF in one thread; Spark runs one task per executor core (concurrency= sets how "
               "many tasks the job is cut into)")
_NO_TRACKER = "jobs are recorded by their own commits and error records, always (db.list_jobs())"
_NO_POLLING = "the call blocks until the job is over; there is no job tracker to poll (db.list_jobs() lists jobs)"
_BLOBS = "Lance blob columns are read as plain binary columns here"
_NO_SHUFFLE = "tasks are packed by fragment, in fragment order"

# name -> (Geneva's default, why it does not apply)
BACKFILL_ASYNC_IGNORED: dict[str, tuple[Any, str]] = {
    "intra_applier_concurrency": (1, _ONE_THREAD),
    "_admission_check": (None, _NO_ADMISSION),
    "_admission_strict": (None, _NO_ADMISSION),
    "blob_read_strategy": ("auto", _BLOBS),
    "blob_read_buffer_size": (None, _BLOBS),
    "_enable_job_tracker_saves": (True, _NO_TRACKER),
    "task_shuffle_diversity": (8, _NO_SHUFFLE),
    "_return_future": (False, "backfill_async returns a Job; its result() waits for the job"),
}
BACKFILL_IGNORED: dict[str, tuple[Any, str]] = {
    **{k: v for k, v in BACKFILL_ASYNC_IGNORED.items() if k != "_return_future"},
    "refresh_status_secs": (2.0, _NO_POLLING),
}
PLAN_BACKFILL_IGNORED: dict[str, tuple[Any, str]] = {}
REFRESH_IGNORED: dict[str, tuple[Any, str]] = {
    "where": (None, "Geneva documents refresh(where=) as not implemented (a TODO); a view's rows are chosen by its "
                    "query's where(), and fragments= refreshes part of a view"),
    "intra_applier_concurrency": (1, _ONE_THREAD),
    "_admission_check": (None, _NO_ADMISSION),
    "_admission_strict": (None, _NO_ADMISSION),
}
_LOAD_ONE_PASS = "load_columns joins the source in this process and commits once: it has no tasks and no checkpoints"
LOAD_ASYNC_IGNORED: dict[str, tuple[Any, str]] = {
    "concurrency": (8, _LOAD_ONE_PASS),
    "task_size": (None, _LOAD_ONE_PASS),
    "checkpoint_size": (None, _LOAD_ONE_PASS),
    "min_checkpoint_size": (None, _LOAD_ONE_PASS),
    "max_checkpoint_size": (None, _LOAD_ONE_PASS),
    "checkpoint_interval_seconds": (None, _LOAD_ONE_PASS),
    "_loader_cpus": (None, _LOAD_ONE_PASS),
    "_loader_memory": (None, _LOAD_ONE_PASS),
    "commit_granularity": (None, _LOAD_ONE_PASS),
    "enable_job_tracker_saves": (True, _NO_TRACKER),
}
LOAD_IGNORED: dict[str, tuple[Any, str]] = {**LOAD_ASYNC_IGNORED, "refresh_status_secs": (2.0, _NO_POLLING)}
_VECTORS = "rows are checked against the table's schema; vector columns get no separate check or fill"
ADD_IGNORED: dict[str, tuple[Any, str]] = {
    "on_bad_vectors": ("error", _VECTORS),
    "fill_value": (0.0, _VECTORS),
}


def _is_default(value: Any, default: Any) -> bool:
    if value is None or default is None:
        return value is default
    try:
        return bool(value == default)
    except Exception:  # an array, say: not the default
        return False


def accept(api: str, given: dict[str, Any], ignored: dict[str, tuple[Any, str]], *, stacklevel: int = 3) -> None:
    """Check Geneva parameters ``given`` to ``api`` that do not apply here:
    a warning for each given another value than Geneva's default; TypeError
    for a name Geneva's ``api`` does not take."""
    for name, value in given.items():
        if name not in ignored:
            raise TypeError(f"{api}() got an unexpected keyword argument {name!r}")
        default, why = ignored[name]
        if not _is_default(value, default):
            warn(api, name, value, why, stacklevel=stacklevel + 1)


def warn(api: str, name: str, value: Any, why: str, *, stacklevel: int = 3) -> None:
    """One :class:`GenevaCompatWarning`: ``api(name=value)`` is accepted and ignored because ``why``."""
    warn_ignored(api, name, value, why, stacklevel=stacklevel + 1)


def _positive(name: str, value: Any, *, zero: bool = False) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise ValueError(f"{name} must be an int >= {0 if zero else 1}, got {value!r}")
    return value


def seconds(name: str, value: Any) -> float | None:
    """A duration given as seconds or a ``timedelta`` (None stays None)."""
    if value is None:
        return None
    s = value.total_seconds() if hasattr(value, "total_seconds") else value
    if isinstance(s, bool) or not isinstance(s, (int, float)) or s < 0:
        raise ValueError(f"{name} is a number of seconds >= 0 or a timedelta, got {value!r}")
    return float(s)


def fragments_between(dataset: Callable[[], lance.LanceDataset], skip_frags: Any, num_frags: Any
                      ) -> list[int] | None:
    """Geneva's ``skip_frags`` / ``num_frags``: the ids of the fragments
    ``skip_frags`` .. ``skip_frags + num_frags - 1`` of the dataset in id
    order (None: every fragment; the dataset is opened only when needed)."""
    skip = _positive("skip_frags", skip_frags if skip_frags is not None else 0, zero=True) or 0
    num = _positive("num_frags", num_frags)
    if not skip and num is None:
        return None
    ids = sorted(dataset().fragment_ids())
    return ids[skip:] if num is None else ids[skip : skip + num]


@dataclass(frozen=True)
class BackfillOptions:
    """What Geneva's backfill parameters come to here."""

    parallelism: int | None = None  # concurrency: tasks the job is cut into (None: the runner's cores)
    checkpoint_size: int | None = None  # rows per checkpoint (None: checkpoints sized by time)
    task_size: int | None = None  # rows per task
    fragments: list[int] | None = None  # num_frags / skip_frags
    commit_granularity: int | None = None  # fragments per intermediate commit
    checkpoint_seconds: float | None = None  # batch_checkpoint_flush_interval_seconds


def backfill_options(
    api: str,
    dataset: Callable[[], lance.LanceDataset],
    *,
    concurrency: Any = None,
    checkpoint_size: Any = None,
    batch_size: Any = None,
    min_checkpoint_size: Any = None,
    max_checkpoint_size: Any = None,
    task_size: Any = None,
    num_frags: Any = None,
    skip_frags: Any = None,
    read_version: Any = None,
    commit_granularity: Any = None,
    batch_checkpoint_flush_interval_seconds: Any = None,
    stacklevel: int = 4,
) -> BackfillOptions:
    """Map Geneva's backfill parameters (checked here: bad values raise
    ``ValueError`` before anything is written).

    * ``concurrency``: how many tasks the job is cut into (Geneva: Ray actors);
    * ``checkpoint_size`` (its deprecated alias ``batch_size``; 0: not given), else
      ``min_checkpoint_size == max_checkpoint_size`` (Geneva: a fixed size),
      else (None) the UDF's ``@udf(checkpoint_size=)``: rows per checkpoint; other
      ``min_`` / ``max_checkpoint_size`` bounds warn (checkpoints are sized by
      time here, not by an adaptive row count);
    * ``task_size``: rows per task; ``num_frags`` / ``skip_frags``: which
      fragments; ``commit_granularity``: fragments per commit;
    * ``batch_checkpoint_flush_interval_seconds``: the seconds of UDF work
      after which results are checkpointed (0: every slice);
    * ``read_version``: a backfill computes rows as they are at the latest
      version; an older one warns (values computed from it would be stale at
      once for rows changed since), one that does not exist raises."""
    parallelism = _positive("concurrency", concurrency)
    size = _positive("checkpoint_size", checkpoint_size)
    alias = _positive("batch_size", batch_size, zero=True)
    low = _positive("min_checkpoint_size", min_checkpoint_size)
    high = _positive("max_checkpoint_size", max_checkpoint_size)
    if size is None and alias:
        size = alias
    if low is not None and low == high:
        size = size or low
    elif low is not None or high is not None:
        if low not in (None, 1):
            warn(api, "min_checkpoint_size", low, "checkpoints are sized by time here (or fixed by checkpoint_size), "
                 "not adaptively between bounds", stacklevel=stacklevel)
        if high is not None:
            warn(api, "max_checkpoint_size", high, "checkpoints are sized by time here (or fixed by checkpoint_size), "
                 "not adaptively between bounds; @udf(batch_size=) bounds the rows of one call", stacklevel=stacklevel)
    rv = read_version
    if rv is not None:
        ds = dataset()
        if isinstance(rv, bool) or not isinstance(rv, int) or rv < 1 or rv > ds.version:
            raise ValueError(f"read_version must be a version of the table (1 .. {ds.version}), got {rv!r}")
        if rv != ds.version:
            warn(api, "read_version", rv, f"a backfill computes the rows as they are at the latest version "
                 f"({ds.version}): values computed from version {rv} would be stale at once for rows changed since "
                 "(rows unchanged since get the same values)", stacklevel=stacklevel)
    return BackfillOptions(
        parallelism=parallelism, checkpoint_size=size, task_size=_positive("task_size", task_size),
        fragments=fragments_between(dataset, skip_frags, num_frags),
        commit_granularity=_positive("commit_granularity", commit_granularity),
        checkpoint_seconds=seconds("batch_checkpoint_flush_interval_seconds", batch_checkpoint_flush_interval_seconds),
    )
