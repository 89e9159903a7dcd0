"""Progress of long refreshes and backfills while they run, as users follow
it: ``with progress.listen(callback, every=10): view.refresh()`` gets rows
done of rows planned, the rate, the time left and the rows that came from
checkpoints (see :mod:`mv_assets.execution.progress`, where the engine counts them)."""

from mv_assets.execution.progress import Progress, default_every, format_seconds, listen

__all__ = ["Progress", "default_every", "format_seconds", "listen"]
