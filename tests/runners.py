"""Runners the tests stand in for a crash with (real tasks, real checkpoints)."""

import mv_assets as mv


class CrashAfter(mv.InlineRunner):
    """An inline runner whose driver dies after running ``n`` tasks: their
    checkpoints are written, nothing is committed (a killed refresh)."""

    def __init__(self, n: int = 2) -> None:
        self.n = n

    def run(self, tasks, definition_raw, **kwargs):
        from mv_assets.execution.tasks import run_task

        for task in tasks[: self.n]:
            run_task(task, definition_raw)
        raise RuntimeError("driver died")
