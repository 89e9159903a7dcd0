"""Committing a transaction built against a table's latest version, built again
after a conflict.

Operations that write into a table others may write meanwhile (a backfill, a
column load) build their transaction against the latest version and commit it
with Lance's own retries off: a conflict (another writer committed first) means
the work behind the transaction is redone against the new version, which only
the operation can do. :func:`commit_latest` is that loop.
"""

import contextlib
import time
from typing import Callable, ContextManager, TypeVar

from lance import Transaction

from mv_assets.model.errors import ConcurrentWriteError
from mv_assets.storage import indexes, objects
from mv_assets.storage.lance_compat import CommitConflictError

__all__ = ["COMMIT_ATTEMPTS", "commit_latest"]

# How many times :func:`commit_latest` builds and commits before it gives up
# (ConcurrentWriteError); it pauses 0.05 s times the attempt number after each
# conflict.
COMMIT_ATTEMPTS = 5

T = TypeVar("T")


def commit_latest(
    uri: str,
    build: Callable[[], "tuple[Transaction | None, T]"],
    *,
    what: str,
    guard: Callable[[], ContextManager] = contextlib.nullcontext,
    attempts: int | None = None,
) -> "tuple[int | None, T]":
    """Commit what ``build()`` returns: ``(transaction, value)``, the transaction
    built against the latest version of the dataset at ``uri`` (its
    ``read_version``) or None when there is nothing to commit. A commit
    conflict calls ``build`` again, up to ``attempts`` times in all (default
    ``COMMIT_ATTEMPTS``); ``guard()`` is held around each commit (a lock).

    Once committed, the table's indexes are brought up to date (a separate
    commit after it; see :func:`mv_assets.storage.indexes.catch_up`).

    Returns (the committed version, or None, and the value of the last build).
    Raises ``ConcurrentWriteError`` naming ``what`` after the last conflict,
    chained from it: nothing was committed."""
    tries = COMMIT_ATTEMPTS if attempts is None else attempts
    if tries < 1:
        raise ValueError(f"commit attempts must be at least 1, got {tries}")
    conflict: CommitConflictError | None = None
    for attempt in range(tries):
        if attempt:
            time.sleep(0.05 * attempt)
        txn, value = build()
        if txn is None:
            return None, value
        try:
            with guard():
                committed = objects.commit(uri, txn, read_version=txn.read_version, max_retries=0)
        except CommitConflictError as exc:  # a concurrent writer won: build again against its version
            conflict = exc
            continue
        # the rows or column values just written join the table's indexes (storage.indexes)
        indexes.catch_up(uri)
        return committed.version, value
    raise ConcurrentWriteError(
        f"could not commit {what}: another writer committed first {tries} times in a row; nothing was "
        "committed, run it again"
    ) from conflict
