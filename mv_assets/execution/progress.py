"""Progress of long work while it runs: rows done of rows planned, the rate,
the time left, and how many rows came from checkpoints of an interrupted run.

The engine reports the work it hands to a runner as a *stage* (a refresh's
tasks, a backfill's compute or write tasks): the runner opens the stage with
the rows it plans, tasks count rows as their batches finish (in the process
that runs them; a Spark job's are counted from its finished tasks). Whoever
starts the work listens::

    from mv_assets import progress

    with progress.listen(print, every=5):      # a log, a progress bar, Dagster's run log
        view.refresh()

A listener gets a :class:`Progress` every ``every`` seconds while a stage runs
(from one background clock per process, so a slow batch or a Spark job does
not silence it) and one when the stage ends, if it got one before: work that
ends within ``every`` seconds reports nothing. Without ``listen``, stages are
reported to the ``mv_assets.progress`` logger when it is enabled for INFO.

Cost: without a listener, every hook is a context-variable lookup; with one, a
stage registers with the clock (the clock thread starts once per process).

>>> p = Progress("computing", rows_done=12_000, rows_planned=50_000, rows_resumed=2_000, seconds=30.0)
>>> str(p)
'computing: 12,000 of 50,000 rows (24%) in 30 s, 400 rows/s, about 1 min 35 s left; 2,000 rows from checkpoints'
>>> str(Progress("computing", 50_000, 50_000, 0, 95.0, done=True))
'computing: 50,000 of 50,000 rows (100%) in 1 min 35 s, 526 rows/s, done'
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["Progress", "listen", "stage", "advance", "resumed", "task", "format_seconds", "default_every"]

log = logging.getLogger("mv_assets.progress")

DEFAULT_EVERY = 10.0


def default_every() -> float:
    """Seconds between reports unless told: ``$MV_ASSETS_PROGRESS_SECONDS`` or 10."""
    return float(os.environ.get("MV_ASSETS_PROGRESS_SECONDS") or DEFAULT_EVERY)


def format_seconds(seconds: float) -> str:
    """``95.0`` -> ``"1 min 35 s"``; ``3725`` -> ``"1 h 2 min"``.

    >>> format_seconds(0.4), format_seconds(42), format_seconds(3725)
    ('0 s', '42 s', '1 h 2 min')
    """
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {(s % 3600) // 60} min"


@dataclass(frozen=True)
class Progress:
    """Where a stage of work stands."""

    stage: str  # "computing" (a refresh's or backfill's tasks) or "writing" (a staged backfill's writes)
    rows_done: int
    rows_planned: int
    rows_resumed: int  # of the rows done, those whose results came from checkpoints of an earlier run
    seconds: float
    done: bool = False

    @property
    def fraction(self) -> float:
        return 1.0 if self.rows_planned <= 0 else min(1.0, self.rows_done / self.rows_planned)

    @property
    def rate(self) -> float:
        """Rows per second so far."""
        return self.rows_done / self.seconds if self.seconds > 0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        """At the rate so far (None: nothing done yet)."""
        if self.done:
            return 0.0
        if self.rows_done <= 0 or self.seconds <= 0:
            return None
        return max(0, self.rows_planned - self.rows_done) / self.rate

    def __str__(self) -> str:
        text = (f"{self.stage}: {min(self.rows_done, self.rows_planned):,} of {self.rows_planned:,} rows "
                f"({self.fraction:.0%}) in {format_seconds(self.seconds)}")
        if self.rows_done and self.seconds > 0:
            text += f", {self.rate:,.0f} rows/s"
        left = self.seconds_left
        text += ", done" if self.done else (f", about {format_seconds(left)} left" if left is not None else "")
        if self.rows_resumed:
            text += f"; {self.rows_resumed:,} rows from checkpoints"
        return text


@dataclass
class _Listener:
    callback: Callable[[Progress], None]
    every: float


_LISTENER: ContextVar["_Listener | None"] = ContextVar("mv_assets_progress_listener", default=None)
_STAGE: ContextVar["_Stage | None"] = ContextVar("mv_assets_progress_stage", default=None)
# the rows the running task counted so far (its own: tasks on threads each run in a copy of the context)
_TASK: ContextVar["list[int] | None"] = ContextVar("mv_assets_progress_task", default=None)


@contextmanager
def listen(callback: Callable[[Progress], None], every: float | None = None) -> Iterator[None]:
    """Report the stages of the work started inside this block to
    ``callback``, every ``every`` seconds (default :func:`default_every`)
    while each runs and once when it ends (if it ran that long). The
    callback runs on the progress clock's thread: keep it short."""
    every = default_every() if every is None else every
    if every <= 0:
        raise ValueError(f"every must be > 0 seconds, got {every!r}")
    token = _LISTENER.set(_Listener(callback, float(every)))
    try:
        yield
    finally:
        _LISTENER.reset(token)


class _Stage:
    def __init__(self, name: str, planned: int, listener: _Listener) -> None:
        self.name, self.planned, self.listener = name, int(planned), listener
        self.done = 0
        self.resumed = 0
        self._lock = threading.Lock()  # tasks on several threads (the inline runner's) count at once
        self.started = time.monotonic()
        self.next_at = self.started + listener.every
        self.reported = False
        self.closed = False  # its last report made: the clock, still holding it, reports no more
        self._report_lock = threading.Lock()  # reports in order: none after the last
        self.poll: Callable[[], int | None] | None = None  # rows done elsewhere (a Spark job's finished tasks)

    def add(self, rows: int = 0, resumed: int = 0) -> None:
        with self._lock:
            self.done += rows
            self.resumed += resumed

    def snapshot(self, done: bool = False) -> Progress:
        rows = self.done
        if self.poll is not None:
            try:
                polled = self.poll()
            except Exception:  # a status read failing never fails the work
                polled = None
            if polled is not None:
                rows = max(rows, polled)
        if done:
            rows = max(rows, self.planned)
        return Progress(self.name, rows, self.planned, self.resumed, time.monotonic() - self.started, done)

    def report(self) -> None:
        """A report while it runs (from the clock)."""
        with self._report_lock:  # the clock may have taken the stage just before it ended
            if not self.closed:
                self._call(done=False)

    def finish(self, report: bool = True) -> None:
        """It ended: say so if it reported while it ran (and ``report``);
        after this, the clock reports nothing."""
        with self._report_lock:
            self.closed = True
            if report and self.reported:
                self._call(done=True)

    def _call(self, done: bool) -> None:
        self.reported = True
        try:
            self.listener.callback(self.snapshot(done))
        except Exception:  # a listener failing never fails the work
            log.warning("a progress listener failed", exc_info=True)


class _Clock:
    """One daemon thread per process calling each open stage's listener when due."""

    def __init__(self) -> None:
        self._stages: set[_Stage] = set()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, st: _Stage) -> None:
        with self._cv:
            self._stages.add(st)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="mv_assets-progress", daemon=True)
                self._thread.start()
            self._cv.notify()

    def remove(self, st: _Stage) -> None:
        with self._cv:
            self._stages.discard(st)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stages:
                    self._cv.wait()
                now = time.monotonic()
                due = [s for s in self._stages if s.next_at <= now]
                if not due:
                    self._cv.wait(timeout=min(s.next_at for s in self._stages) - now)
                    continue
                for s in due:
                    s.next_at = now + s.listener.every
            for s in due:
                s.report()


_CLOCK = _Clock()


def _logged(p: Progress) -> None:
    log.info("%s", p)


@contextmanager
def stage(planned: int, name: str = "computing") -> Iterator["_Stage | None"]:
    """A stage of ``planned`` rows (a runner opens one around the tasks it
    runs). Inside another stage it is that stage (a runner calling another);
    without a listener (nor the ``mv_assets.progress`` logger enabled for
    INFO) it is None and costs nothing."""
    outer = _STAGE.get()
    if outer is not None:
        yield outer
        return
    listener = _LISTENER.get()
    if listener is None:
        if not log.isEnabledFor(logging.INFO):
            yield None
            return
        listener = _Listener(_logged, default_every())
    st = _Stage(name, planned, listener)
    token = _STAGE.set(st)
    _CLOCK.add(st)
    ended = False
    try:
        yield st
        ended = True
    finally:
        _CLOCK.remove(st)
        _STAGE.reset(token)
        st.finish(report=ended)  # reported while it ran: say it ended too (not when it failed)


def advance(rows: int) -> None:
    """``rows`` more rows done in the current stage (a finished batch)."""
    st = _STAGE.get()
    if st is not None:
        st.add(rows)
        counted = _TASK.get()
        if counted is not None:
            counted[0] += rows


def resumed(rows: int) -> None:
    """``rows`` of the current stage's rows came from checkpoints of an earlier run."""
    st = _STAGE.get()
    if st is not None:
        st.add(resumed=rows)


@contextmanager
def task(rows: int) -> Iterator[None]:
    """A task of ``rows`` planned rows: when it ends, the stage counts them all
    done, whatever its batches counted (a filter, say, made them fewer)."""
    st = _STAGE.get()
    if st is None:
        yield
        return
    counted = [0]
    token = _TASK.set(counted)
    try:
        yield
    finally:
        _TASK.reset(token)
    st.add(max(0, rows - counted[0]))  # (tasks running beside it count their own)
