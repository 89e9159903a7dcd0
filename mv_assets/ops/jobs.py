"""Jobs running in this process: a backfill, refresh or column load started in
a background thread (``backfill_async``, ``refresh_async``,
``load_columns_async``), as Geneva's ``Job``: ``status``, ``done(timeout=)``,
``result(timeout=)``.

A job that finished is known from what it left in the catalog (its commit, or
its error records: :mod:`mv_assets.storage.jobs`); the registry here adds the
jobs this process started (the last ``KEEP`` of them), so ``db.list_jobs()``
shows those still running, and those that failed or wrote nothing, too.
"""

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Job", "PENDING", "RUNNING", "DONE", "FAILED", "process_jobs"]

PENDING, RUNNING, DONE, FAILED = "PENDING", "RUNNING", "DONE", "FAILED"
KEEP = 1000  # jobs of this process remembered

_jobs: dict[tuple[str | None, str], "Job"] = {}  # by (catalog, job id), in start order
_lock = threading.Lock()


class Job:
    """A job running ``target(*args, **kwargs)`` in a background (non-daemon)
    thread: the interpreter waits for it before exiting, so a job is never
    cut off half-committed.

    ``status`` is ``"RUNNING"``, then ``"DONE"`` or ``"FAILED"``;
    ``result(timeout)`` blocks and returns the job's result (or raises the
    job's exception; ``TimeoutError`` if it is still running after
    ``timeout`` seconds: the job goes on)."""

    def __init__(self, job_id: str, target: Callable[..., Any], args: tuple = (), kwargs: dict | None = None, *,
                 job_type: str = "backfill", table: str | None = None, column: str | None = None,
                 catalog: str | None = None) -> None:
        self.job_id = job_id
        self.catalog = catalog  # the root of the catalog holding the table
        self.job_type = job_type
        self.table_name = table
        self.column_name = column
        self.launched_at = time.time()
        self.completed_at: float | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(target, args, kwargs or {}),
                                        name=f"{job_type}-{job_id}")
        with _lock:
            _jobs.pop((catalog, job_id), None)
            _jobs[(catalog, job_id)] = self
            while len(_jobs) > KEEP:
                del _jobs[next(iter(_jobs))]
        self._thread.start()

    def _run(self, target: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        try:
            self._result = target(*args, **kwargs)
        except BaseException as exc:  # handed to result()
            self._error = exc
        finally:
            self.completed_at = time.time()

    @property
    def status(self) -> str:
        if self._thread.is_alive():
            return RUNNING
        return FAILED if self._error is not None else DONE

    @property
    def error(self) -> BaseException | None:
        """The exception the job failed with (None while running or when it succeeded)."""
        return None if self._thread.is_alive() else self._error

    def done(self, timeout: float | None = None) -> bool:
        """Whether the job has finished, waiting up to ``timeout`` seconds for it (None or 0: do not wait)."""
        if timeout:
            self._thread.join(_seconds(timeout))
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> Any:
        """The job's result, waiting up to ``timeout`` seconds (None: until it ends)."""
        wait = None if timeout is None else _seconds(timeout)
        self._thread.join(wait)
        if self._thread.is_alive():
            raise TimeoutError(f"{self.job_type} job {self.job_id} is still running after {wait}s (it goes on)")
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, {self.job_type}, status={self.status})"


def _seconds(timeout: Any) -> float:
    """Seconds of a timeout given as a number or a ``timedelta``."""
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise ValueError(f"a timeout is a number of seconds >= 0 or a timedelta, got {timeout!r}")
    return float(seconds)


def process_jobs(catalog: str | None = None) -> list[Job]:
    """The jobs this process started (the last ``KEEP``) in ``catalog`` (its root), oldest first."""
    with _lock:
        return [j for j in _jobs.values() if j.catalog == catalog]
