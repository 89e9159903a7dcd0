"""Overlapping a task's reading, computing and writing.

A task of a view with UDF columns does three things per batch: read and
decode source rows (Lance, native threads), run the UDFs (the user's code: a
model on a GPU, a call to a service), write the view rows (Lance encodes and
writes, native threads). One after the other, a GPU model waits on the
reading and writing in between: measured, a model of 2.0 s over 100k rows
took 3.2 s in a refresh. Here the three run at once, each in its own thread,
with at most ``depth`` batches between two stages (memory stays bounded:
compute batches are at most ``tasks.COMPUTE_BATCH_BYTES``). The UDF keeps the
thread that calls it (the task's), so thread-bound state (a CUDA context, the
task's progress) is where it was.

A failure in any stage stops the others and is raised in the task's thread,
as it would have been raised without the overlap.
"""

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["prefetched", "write_behind"]

_DONE = object()
_POLL_S = 0.1


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _put(q: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put ``item``, waiting for room unless ``stop`` is set (then False)."""
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def prefetched(items: Iterable, depth: int = 2, name: str = "mv_assets-read") -> Iterator:
    """``items``, produced by a background thread up to ``depth`` ahead of the
    consumer. An exception in ``items`` is raised to the consumer at the point
    it would have come; a consumer that stops (an exception, or ``close()``)
    stops the producer at its next item."""
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if not _put(q, item, stop):
                    return
            _put(q, _DONE, stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            _put(q, _Failed(exc), stop)
        finally:
            close = getattr(items, "close", None)
            if callable(close) and stop.is_set():
                close()

    worker = threading.Thread(target=produce, name=name, daemon=True)
    worker.start()
    try:
        yield from _drained(q)
    finally:
        stop.set()
        worker.join()


def _drained(q: queue.Queue) -> Iterator:
    """The items put on ``q`` up to the end, a failure put there raised."""
    while True:
        item = q.get()
        if item is _DONE:
            return
        if isinstance(item, _Failed):
            raise item.exc
        yield item


def write_behind(batches: Iterable, write: Callable[[Iterator], Any], depth: int = 2,
                 name: str = "mv_assets-write") -> Any:
    """``write(iterator over batches)`` run in a background thread while this
    thread produces ``batches``: the writer consumes each batch as it comes,
    at most ``depth`` behind. Returns what ``write`` returns; a failure of
    either side stops the other and is raised here (the producer's first)."""
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = write(_drained(q))
        except BaseException as exc:  # noqa: BLE001 - raised in the caller
            outcome["error"] = exc
        finally:
            stop.set()  # nothing more is read: a producer waiting for room stops

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    handed = True
    try:
        for batch in batches:
            if not _put(q, batch, stop):
                handed = False  # the writer failed (or returned early): see below
                break
        else:
            handed = _put(q, _DONE, stop)
    except BaseException as exc:
        _put(q, _Failed(exc), stop)  # False: the writer is gone already
        worker.join()
        raise
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    if not handed:
        raise RuntimeError("the writer stopped reading before the last batch: nothing it wrote may be used")
    return outcome.get("value")
