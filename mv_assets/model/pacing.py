"""Checkpoints sized by time, not rows (pure: the caller measures the time).

A refresh computes UDFs in slices and keeps their results in memory; it
saves them as one checkpoint once they took ``target_seconds`` of UDF time.
A cheap UDF (microseconds per row) then never saves during a task (the task's
own checkpoint covers it when its files are written), an expensive one saves
about every ``target_seconds`` and a crash loses at most that much work. The
slice size follows the measured cost per row, so one slice of an expensive
UDF never runs much longer than the target either.

>>> p = CheckpointPacer(target_seconds=10, min_rows=16, max_rows=8192)
>>> p.next_rows()          # nothing measured yet: a small first slice
16
>>> p.computed(16, 1.6)    # 0.1 s per row: not yet worth a checkpoint
False
>>> p.next_rows()          # about target_seconds of work per slice
100
>>> p.computed(100, 10.0)  # 11.6 s of results held: save them now
True
>>> p.computed(8192, 0.01), p.next_rows()  # cheap rows: big slices, nothing to save
(False, 8192)
"""

import math
import os
from dataclasses import dataclass, field

__all__ = ["CheckpointPacer", "DEFAULT_CHECKPOINT_SECONDS"]

DEFAULT_CHECKPOINT_SECONDS = 10.0

# Until a job's cost per row is measured (a view's refresh measures its own):
# a model-like UDF, ~20 us a row. Work estimated below a runner's bound runs on
# the driver (SparkRunner.local_below_seconds).
DEFAULT_SECONDS_PER_ROW = 20e-6


def default_target_seconds() -> float:
    """``$MV_ASSETS_CHECKPOINT_SECONDS`` or 10 s (Geneva's adaptive sizer aims there too);
    a value that is not a number of seconds above 0 is an error naming the variable."""
    raw = os.environ.get("MV_ASSETS_CHECKPOINT_SECONDS")
    if not raw:
        return DEFAULT_CHECKPOINT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"$MV_ASSETS_CHECKPOINT_SECONDS must be a number of seconds above 0 (UDF work between "
                         f"checkpoints), got {raw!r}")
    return seconds


@dataclass
class CheckpointPacer:
    target_seconds: float = DEFAULT_CHECKPOINT_SECONDS
    min_rows: int = 16
    max_rows: int = 65536
    _rows: int = field(default=0, init=False)
    _seconds: float = field(default=0.0, init=False)
    _pending: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if self.target_seconds <= 0 or self.min_rows <= 0 or self.max_rows < self.min_rows:
            raise ValueError("checkpoint pacing needs target_seconds > 0 and 0 < min_rows <= max_rows")

    def next_rows(self) -> int:
        """How many rows to compute in the next slice (from the cost per row of the last one)."""
        if self._rows == 0:
            return self.min_rows
        if self._seconds <= 0:
            return self.max_rows
        per_row = self._seconds / self._rows
        return int(min(self.max_rows, max(self.min_rows, self.target_seconds / per_row)))

    def computed(self, rows: int, seconds: float) -> bool:
        """Record a slice; True when the results held since the last save should be saved now."""
        if rows > 0:
            self._rows, self._seconds = rows, max(0.0, seconds)
        self._pending += seconds
        if self._pending >= self.target_seconds:
            self._pending = 0.0
            return True
        return False

    def unsaved(self, seconds: float) -> None:
        """Count ``seconds`` of work as still unsaved after a save (results let go
        of before it, see ``tasks.PacedRowStore``): the next save comes that much
        sooner, so a crash still loses less than ``target_seconds`` of work.

        >>> p = CheckpointPacer(target_seconds=10)
        >>> p.computed(100, 10.0), p.unsaved(4.0), p.computed(100, 6.0)
        (True, None, True)
        """
        self._pending += max(0.0, seconds)
