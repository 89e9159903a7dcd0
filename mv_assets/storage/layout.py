"""Where a catalog keeps its datasets and the engine's own state, and the
locks that serialise writers: everything work code needs of "the catalog",
as a small frozen value (no handle to call back into).

::

    <root>/<name>.lance                       tables and views
    <root>/_mv_assets/checkpoints/<name>/     refresh task and row checkpoints
    <root>/_mv_assets/checkpoints/<name>/columns/<fingerprint>/   column backfills
    <root>/_mv_assets/status/<view>.json      load state records (LOADING, FAILED_LOAD only)
    <root>/_mv_assets/errors.lance            rows a UDF failed on
    <root>/_mv_assets/summaries.json          what each dataset is, a cache (storage.summaries)
    <root>/_mv_assets/locks/<name>.lock       one refresh of a view at a time
    <root>/_mv_assets/adopt/<name>/           a table being rewritten with stable row ids
"""

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import filelock

try:
    import fcntl
except ImportError:  # not a POSIX system: filelock's own locks
    fcntl = None

from mv_assets.model.errors import ConcurrentRefreshError
from mv_assets.storage import objects

__all__ = ["Layout", "STATE_DIR", "Lease"]

STATE_DIR = "_mv_assets"


@dataclass(frozen=True)
class Layout:
    """The catalog at ``root`` (a path or an object-store URI): dataset URIs,
    state paths and locks."""

    root: str

    def table_uri(self, name: str) -> str:
        return objects.join(self.root, f"{name}.lance")

    def state(self, *parts: str) -> str:
        return objects.join(self.root, STATE_DIR, *parts)

    def holds_catalog(self, names: list[str] | None = None) -> bool:
        """Whether a catalog is at the root: a Lance dataset (``<name>.lance``)
        or the engine's state. ``names``: the root's listing, when the caller
        took it; else one listing here (also on object stores)."""
        listed = objects.listdir(self.root) if names is None else names
        return any(e.endswith(".lance") or e == STATE_DIR for e in listed)

    def summaries(self) -> str:
        """What each dataset is, remembered across processes (storage.summaries)."""
        return self.state("summaries.json")

    def checkpoints(self, name: str) -> str:
        """Task checkpoints of one plan live in a folder each under here, row checkpoints in ``batches``."""
        return self.state("checkpoints", name)

    def batch_checkpoints(self, name: str) -> str:
        return self.state("checkpoints", name, "batches")

    def column_checkpoints(self, name: str, fingerprint: str) -> str:
        return self.state("checkpoints", name, "columns", fingerprint)

    def adoption(self, name: str) -> str:
        """Where ``name`` is rewritten with stable row ids before it replaces the
        table (see :mod:`mv_assets.storage.row_ids`)."""
        return self.state("adopt", name)

    def status_dir(self) -> str:
        """Load state records: one per view while a refresh of it is under way or failed."""
        return self.state("status")

    def status_file(self, view: str) -> str:
        return objects.join(self.status_dir(), f"{view}.json")

    def job_file(self, job_id: str) -> str:
        """A job's own record (a backfill's while it runs or after it failed, a
        failed refresh's once another refresh replaced its load state): storage.jobs."""
        return self.state("jobs", f"{job_id}.json")

    def errors_uri(self) -> str:
        return self.state("errors.lance")

    def clear_stale_checkpoints(self, name: str, keep: str | None) -> None:
        """Remove the task checkpoints of other plans (row and column
        checkpoints are keyed by content and outlive a plan)."""
        root = self.checkpoints(name)
        for entry in objects.listdir(root):
            path = objects.join(root, entry)
            if path != keep and entry not in ("batches", "columns"):
                objects.remove_tree(path)

    def lock(self, name: str, timeout: float | None):
        """Mutual exclusion of refreshes (and column writes) of ``name``: an
        OS file lock for a local catalog (released if the process dies), a
        :class:`Lease` in the catalog's object store otherwise."""
        if not objects.is_local(self.root):
            return Lease(self.state("locks", f"{name}.lease"), name, timeout).held()
        path = self.state("locks", f"{name}.lock")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if fcntl is not None:
            return _flocked(path, name, timeout)
        lock = filelock.FileLock(path, timeout=-1 if timeout is None else timeout)

        @contextlib.contextmanager
        def held():
            try:
                lock.acquire()
            except filelock.Timeout as exc:
                raise _busy(name, timeout, path) from exc
            try:
                yield
            finally:
                lock.release()

        return held()


def lock_held(layout: "Layout", name: str) -> bool:
    """Whether :meth:`Layout.lock` ``name`` is held now, by any process (a
    probe: a local lock is tried without waiting and let go at once; a lease
    is held while its record is there and not stale)."""
    if not objects.is_local(layout.root):
        lease = Lease(layout.state("locks", f"{name}.lease"), name, 0)
        got = objects.get_tagged(lease.uri)
        return got is not None and not lease._stale(got[0].decode(errors="replace"))
    path = layout.state("locks", f"{name}.lock")
    if not os.path.exists(path):
        return False
    if fcntl is None:  # (filelock's is_locked says whether this instance holds it: tried instead)
        probe = filelock.FileLock(path)
        try:
            probe.acquire(timeout=0)
        except filelock.Timeout:
            return True
        probe.release()
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (releases the probe's lock, if it took it)
    return False


def _busy(name: str, timeout: float | None, path: str) -> ConcurrentRefreshError:
    return ConcurrentRefreshError(
        f"another refresh of {name!r} is running (waited {timeout}s for {path}); try again later"
    )


@contextlib.contextmanager
def _flocked(path: str, name: str, timeout: float | None):
    """An exclusive ``flock`` on ``path`` for the block, on a descriptor of its
    own (so threads of one process exclude each other too); the OS releases it
    when the process dies. ``filelock`` does the same with thread and fork
    bookkeeping that cost ~0.3 ms a refresh (a no-change refresh is ~1.3 ms);
    it stays the fallback where ``fcntl`` is missing."""
    assert fcntl is not None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            deadline, pause = time.monotonic() + timeout, 0.001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise _busy(name, timeout, path) from None
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_log = logging.getLogger(__name__)


class Lease:
    """A lock in an object store: an object created with a conditional PUT
    (fails if it exists), renewed by a heartbeat, removed on release. A lease
    whose holder stopped renewing (``$MV_ASSETS_LEASE_SECONDS``, default 60)
    or whose process is gone (same host) is taken over. Takeovers and
    renewals are PUTs conditional on the e-tag of the record read (or last
    written): of two refreshes taking over the same stale lease one wins, and
    a renewal never overwrites a lease taken over. (Removal on release is a
    read then a delete: it could remove a record written in between, which
    needs the holder to have missed renewals for a whole ttl.)

    Every commit names the version it read and Lance refuses one that
    conflicts with a commit made meanwhile; but two commits that only add
    fragments do not conflict, so for refreshes that only append the lease
    (with the refresh's version check just before it commits) is what keeps
    the same rows from being committed twice."""

    def __init__(self, uri: str, name: str, timeout: float | None, ttl: float | None = None) -> None:
        self.uri, self.name, self.timeout = uri, name, timeout
        self.ttl = ttl if ttl is not None else float(os.environ.get("MV_ASSETS_LEASE_SECONDS") or 60)
        self.owner = uuid.uuid4().hex
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None  # the renewing thread while held
        self._tag: str | None = None  # the tag of the record it wrote last (its e-tag)

    def _record(self) -> str:
        return json.dumps({"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                           "expires": time.time() + self.ttl})

    def _stale(self, raw: str | None) -> bool:
        if raw is None:
            return False
        try:
            held = json.loads(raw)
        except ValueError:
            return True  # not a lease record
        if held.get("expires", 0) < time.time():
            return True
        return held.get("host") == socket.gethostname() and not _pid_alive(int(held.get("pid", 0)))

    def acquire(self) -> None:
        start = time.monotonic()
        while True:
            tag = objects.put_tagged(self.uri, self._record().encode())
            if tag is None:  # held: taken over only if its holder is gone, and only as it was read
                got = objects.get_tagged(self.uri)
                if got is not None and self._stale(got[0].decode(errors="replace")):
                    tag = objects.put_tagged(self.uri, self._record().encode(), tag=got[1])
                elif got is None:
                    continue  # released meanwhile
            if tag is not None:
                self._tag = tag
                return
            if self.timeout is not None and time.monotonic() - start >= self.timeout:
                raise ConcurrentRefreshError(
                    f"another refresh of {self.name!r} is running (waited {self.timeout}s for {self.uri}); "
                    "try again later"
                )
            time.sleep(0.2)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                tag = objects.put_tagged(self.uri, self._record().encode(), tag=self._tag)
            except Exception as exc:  # the store unreachable for a moment: the next beat tries again
                _log.warning("could not renew the lease %s (%s); trying again in %.0f s", self.uri, exc, self.ttl / 3)
                continue
            if tag is None:
                return  # taken over (or removed): nothing to renew
            self._tag = tag

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:  # a renewal in flight would write the record back after the removal
            self._beat.join()
        got = objects.get_tagged(self.uri)
        if got is not None and (got[1] == self._tag or self._owns(got[0])):  # still this holder's record
            objects.remove(self.uri)

    def _owns(self, raw: bytes) -> bool:
        try:
            return json.loads(raw).get("owner") == self.owner
        except ValueError:
            return False

    @contextlib.contextmanager
    def held(self):
        self.acquire()
        self._beat = threading.Thread(target=self._heartbeat, name=f"lease-{self.name}", daemon=True)
        self._beat.start()
        try:
            yield
        finally:
            self.release()
