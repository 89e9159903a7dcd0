"""The run coordinator of the demo's ``dagster.yaml``: runs start within a
second or two of being requested, from a sensor or from the UI's buttons.

Dagster's daemon hands runs and backfills on at fixed intervals: the run queue
every ``dequeue_interval_seconds`` (5 s by default) and requested backfills
every 30 s (``dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS``, not
a setting). "Materialize" on a partitioned view is a backfill in the UI
(several partitions), so a click waited ~25 s before its run even existed.
And with Dagster's ``DefaultRunCoordinator`` (runs launched as they are
requested, no queue) the UI's launch dialog warns that launching backfills
without a queued run coordinator is not advised.

:class:`QuickRunCoordinator` is Dagster's ``QueuedRunCoordinator`` (so no
warning, and ``max_concurrent_runs`` holds) with one more setting,
``backfill_interval_seconds``: the backfill daemon's interval, set in the
process that reads the instance's configuration before its daemons start
(``dagster-daemon``; the webserver and run workers read it too, to no effect).
:func:`quick_runs_yaml` writes it with both intervals short.
"""

from dagster import Field, IntSource
from dagster._core.run_coordinator import QueuedRunCoordinator

__all__ = ["QuickRunCoordinator", "quick_runs_yaml", "DEQUEUE_INTERVAL_S", "BACKFILL_INTERVAL_S"]

DEQUEUE_INTERVAL_S = 1  # the run queue looked at every second
BACKFILL_INTERVAL_S = 2  # requested backfills looked at every 2 s (Dagster: 30 s)


def _set_backfill_interval(seconds: int) -> None:
    """The backfill daemon's interval: Dagster reads this module constant when
    the daemon's loop starts (``execute_backfill_iteration_loop``)."""
    from dagster._daemon import controller

    controller.DEFAULT_DAEMON_INTERVAL_SECONDS = seconds


class QuickRunCoordinator(QueuedRunCoordinator):
    """Dagster's ``QueuedRunCoordinator`` that also sets the backfill daemon's
    interval (``backfill_interval_seconds``; see the module)."""

    @classmethod
    def config_type(cls):  # type: ignore[override]
        base = QueuedRunCoordinator.config_type()
        assert isinstance(base, dict)
        return {
            **base,
            "backfill_interval_seconds": Field(
                IntSource, is_required=False,
                description="How often the daemon looks for requested backfills (Dagster's 30 s when unset).",
            ),
        }

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # type: ignore[override]
        config = dict(config_value)
        backfill = config.pop("backfill_interval_seconds", None)
        if backfill is not None:
            _set_backfill_interval(int(backfill))
        return super().from_config_value(inst_data, config)


def quick_runs_yaml() -> str:
    """The ``run_coordinator`` section of a ``dagster.yaml`` with
    :class:`QuickRunCoordinator`, its intervals short."""
    return (
        f"run_coordinator:\n  module: {__name__}\n  class: QuickRunCoordinator\n  config:\n"
        f"    dequeue_interval_seconds: {DEQUEUE_INTERVAL_S}\n    dequeue_use_threads: true\n"
        f"    backfill_interval_seconds: {BACKFILL_INTERVAL_S}\n"
    )
