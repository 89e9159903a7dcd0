"""Resource requests of a job's tasks (``@udf(num_cpus=, num_gpus=, memory=)``)
and the device a task runs on (:func:`current_device`).

A refresh or backfill asks its runner for the most any of its UDF columns (or
its chunker's / UDTF's function) asks: its tasks compute all of them. What the
runner does with the request:

* :class:`~mv_assets.execution.spark.SparkRunner` on a cluster master
  (standalone, Kubernetes, YARN) or a Spark Connect server on one: stage-level
  scheduling, a task ``ResourceProfile`` with ``cpus(ceil(num_cpus))`` and
  ``resource("gpu", num_gpus)``; a fraction (0.5) puts several tasks on one
  GPU. Each task's GPU address comes from ``TaskContext.resources()``.
* Spark local mode, the inline runner, a small job run on the driver, a
  runner that does not take requests: warned (:func:`unscheduled`), run as
  CPU tasks; :func:`current_device` says ``"cpu"`` (or ``$MV_ASSETS_DEVICE``).

``memory`` is not a task resource in Spark (executors have their memory,
``spark.executor.memory``): it is carried and said, not reserved per task.
"""

import json
import math
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

__all__ = ["ResourceRequest", "current_device", "request_of", "request_of_definition", "unscheduled"]

DEVICE_ENV = "MV_ASSETS_DEVICE"


@dataclass(frozen=True)
class ResourceRequest:
    """What each task of a job asks for: the largest hint of each kind among
    the columns it computes (``hints``: the columns' own hints, by name)."""

    label: str  # whose tasks: "view 'v'", "backfill of 't'"
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None
    hints: tuple[tuple[str, tuple[float, float, int | None]], ...] = ()

    @property
    def task_cpus(self) -> int:
        """Spark's task CPUs are whole: ``num_cpus`` rounded up."""
        return max(1, math.ceil(self.num_cpus))

    @property
    def schedulable(self) -> bool:
        """Whether a Spark task profile would differ from the default one (1 CPU, no GPU)."""
        return self.num_gpus > 0 or self.task_cpus > 1

    def describe(self) -> str:
        parts = [f"num_cpus={self.num_cpus:g}", f"num_gpus={self.num_gpus:g}"]
        if self.memory is not None:
            parts.append(f"memory={self.memory}")
        return ", ".join(parts)

    def hints_dict(self) -> dict[str, dict]:
        return {n: {"num_cpus": c, "num_gpus": g, "memory": m} for n, (c, g, m) in self.hints}


def request_of(label: str, hints: dict[str, tuple[float, float, int | None] | dict | None]) -> ResourceRequest | None:
    """The request of tasks computing columns with these hints (``(num_cpus,
    num_gpus, memory)`` or a stored spec's ``resources`` dict; None: the
    defaults); None when no column asks for more than the defaults."""
    kept: list[tuple[str, tuple[float, float, int | None]]] = []
    for name, h in hints.items():
        if h is None:
            continue
        if isinstance(h, dict):
            h = (float(h.get("num_cpus", 1.0)), float(h.get("num_gpus", 0.0)), h.get("memory"))
        if h == (1.0, 0.0, None):
            continue
        kept.append((name, h))
    if not kept:
        return None
    memories = [m for _, (_, _, m) in kept if m is not None]
    return ResourceRequest(
        label=label, num_cpus=max(c for _, (c, _, _) in kept), num_gpus=max(g for _, (_, g, _) in kept),
        memory=max(memories) if memories else None, hints=tuple(kept))


def request_of_definition(label: str, definition_raw: bytes) -> ResourceRequest | None:
    """The request of a view's tasks, from its stored definition (JSON only:
    nothing is unpickled; a view without hints costs a byte search)."""
    if b'"resources"' not in definition_raw:
        return None
    d = json.loads(definition_raw)
    hints = {c["name"]: (c.get("udf") or {}).get("resources") for c in d.get("columns", [])}
    function = d.get("function") or {}
    if function.get("resources"):
        hints[function.get("name", "function")] = function["resources"]
    return request_of(label, hints)


def unscheduled(request: ResourceRequest | None, why: str) -> None:
    """Say (a UserWarning) that ``request`` is not scheduled, and why: its tasks run as CPU tasks."""
    if request is None:
        return
    warnings.warn(
        f"{request.label}: resource hints {request.hints_dict()} are not scheduled: {why}; its tasks run as CPU "
        f"tasks, no GPU is reserved, and mv.current_device() is {current_device()!r}", stacklevel=4)


# The device of the task running in this process (a Spark task with a GPU), else None.
_task_device: str | None = None
# The device ("" for none) the last task of this (reused) Python worker process ran on.
_process_device: str | None = None


def current_device() -> str:
    """The device a UDF should put its model on, read in its set-up
    (``__init__`` of a stateful UDF) or per batch:

    * in a Spark task scheduled with a GPU (``num_gpus`` on a cluster):
      ``"cuda:<address>"``, the first GPU address Spark assigned the task
      (``TaskContext.resources()["gpu"]``);
    * anywhere else (the driver, the inline runner, Spark local mode, a task
      without a GPU): ``$MV_ASSETS_DEVICE`` when set (``"cuda:0"`` on a
      one-GPU machine, ``"mps"``), else ``"cpu"``.
    """
    return _task_device or os.environ.get(DEVICE_ENV) or "cpu"


def device_of(task_resources: dict) -> str | None:
    """``"cuda:<address>"`` of a Spark task's resources (``TaskContext.resources()``), or None without a GPU."""
    gpu = task_resources.get("gpu")
    addresses = list(getattr(gpu, "addresses", None) or [])
    return f"cuda:{addresses[0]}" if addresses else None


@contextmanager
def spark_task_device() -> Iterator[str | None]:
    """Within: :func:`current_device` is the GPU Spark assigned the running
    task (if any). Spark reuses a Python worker for the next task, which may
    hold another GPU: stateful UDF instances made for the former device are
    dropped then, so set-up runs again on the new one."""
    global _task_device, _process_device
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        device = device_of(ctx.resources()) if ctx is not None else None
    except Exception:  # no Spark here, or no resources API: no device
        device = None
    effective = device or ""
    if _process_device is not None and effective != _process_device:
        from mv_assets.model.udf import UDF

        UDF._instances.clear()
    _process_device = effective
    _task_device = device
    try:
        yield device
    finally:
        _task_device = None
