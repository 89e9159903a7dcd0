"""Where a task's time goes, when asked: ``MV_ASSETS_STAGE_TIMINGS=1`` in the
environment of the processes that run tasks (the driver for the inline
runner; on Spark, forwarded to the executors with
``MV_ASSETS_SPARK_FORWARD_ENV=MV_ASSETS_STAGE_TIMINGS``).

A task then fills a :class:`StageClock` with the seconds its threads spent in
each stage, returned in ``TaskResult.stages`` and summed over a refresh's
tasks in ``RefreshResult.timings`` (``stage_read_s`` ...):

* ``read_s``: scanning and decoding the source rows to Arrow (and joining them
  into compute batches), in the reading thread when the task overlaps;
* ``udf_s``: the UDF columns' calls (the model with its conversions: the UDF
  itself knows how that splits), set-up excluded;
* ``setup_s``: constructing stateful UDFs (a model's load), once per process:
  a task that finds its UDF made by an earlier one in the process adds nothing;
* ``write_s``: encoding and writing the view's data files, in the writing
  thread when the task overlaps (its waits for the next batch excluded);
* ``cpu_s``: the CPU time of the task's process over the task, all its
  threads (Lance's native ones included): against the task's wall time, how
  many cores it kept busy (a worker process runs one task at a time; the
  inline runner's process may do other work meanwhile).

Stages that overlap (a task reading, computing and writing at once,
execution.pipeline) add up to more than the task's time; each is the busy
time of the thread doing it. Unasked, no clock exists and nothing is timed.

>>> clock = StageClock()
>>> list(clock.timed_iter(iter([1, 2]), "read_s")), sorted(clock.seconds)
([1, 2], ['read_s'])
"""

import os
import threading
import time
from collections.abc import Iterable, Iterator

__all__ = ["ENV", "StageClock", "clock"]

ENV = "MV_ASSETS_STAGE_TIMINGS"


class StageClock:
    """Seconds per stage, added to from any of a task's threads."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def timed_iter(self, items: Iterable, stage: str) -> Iterator:
        """``items``, the time spent producing each one added to ``stage``."""
        it = iter(items)
        try:
            while True:
                started = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    self.add(stage, time.perf_counter() - started)
                    return
                self.add(stage, time.perf_counter() - started)
                yield item
        finally:
            close = getattr(it, "close", None)
            if callable(close):
                close()


def clock() -> StageClock | None:
    """A new clock when stage timings are asked for (:data:`ENV`), else None."""
    return StageClock() if os.environ.get(ENV, "") not in ("", "0") else None
