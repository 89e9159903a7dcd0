"""Where a catalog keeps its datasets and the engine's own state, and the
locks that serialise writers: everything work code needs of "the catalog",
as a small frozen value (no handle to call back into).

::

    <root>/<name>.lance                       tables and views
    <root>/_mv_assets/checkpoints/<name>/     refresh task and row checkpoints
    <root>/_mv_assets/checkpoints/<name>/columns/<fingerprint>/   column backfills
    <root>/_mv_assets/status/<view>.json      load state records
    <root>/_mv_assets/errors.lance            rows a UDF failed on
    <root>/_mv_assets/locks/<name>.lock       one refresh of a view at a time
"""

import contextlib
import os
import shutil
from dataclasses import dataclass

import filelock

from mv_assets.model.errors import ConcurrentRefreshError

__all__ = ["Layout", "STATE_DIR"]

STATE_DIR = "_mv_assets"


@dataclass(frozen=True)
class Layout:
    """The catalog at ``root``: dataset URIs, state paths and locks."""

    root: str

    def table_uri(self, name: str) -> str:
        return os.path.join(self.root, f"{name}.lance")

    def state(self, *parts: str) -> str:
        return os.path.join(self.root, STATE_DIR, *parts)

    def checkpoints(self, name: str) -> str:
        """Task checkpoints of one plan live in a folder each under here, row checkpoints in ``batches``."""
        return self.state("checkpoints", name)

    def batch_checkpoints(self, name: str) -> str:
        return self.state("checkpoints", name, "batches")

    def column_checkpoints(self, name: str, fingerprint: str) -> str:
        return self.state("checkpoints", name, "columns", fingerprint)

    def status_file(self, view: str) -> str:
        return self.state("status", f"{view}.json")

    def errors_uri(self) -> str:
        return self.state("errors.lance")

    def clear_stale_checkpoints(self, name: str, keep: str | None) -> None:
        """Remove the task checkpoints of other plans (row and column
        checkpoints are keyed by content and outlive a plan)."""
        root = self.checkpoints(name)
        if not os.path.isdir(root):
            return
        for entry in os.listdir(root):
            path = os.path.join(root, entry)
            if path != keep and entry not in ("batches", "columns"):
                shutil.rmtree(path, ignore_errors=True)

    def lock(self, name: str, timeout: float | None):
        """An inter-process lock serialising refreshes (and column writes) of ``name``."""
        path = self.state("locks", f"{name}.lock")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = filelock.FileLock(path, timeout=-1 if timeout is None else timeout)

        @contextlib.contextmanager
        def held():
            try:
                lock.acquire()
            except filelock.Timeout as exc:
                raise ConcurrentRefreshError(
                    f"another refresh of {name!r} is running (waited {timeout}s for {path}); try again later"
                ) from exc
            try:
                yield
            finally:
                lock.release()

        return held()
