"""Which table a dataset is: an identity that survives appends, compaction,
history cleanup and overwrites, but not the table being dropped and created
again under the same name.

A view records the identity of the source it was built from with every
refresh. A source removed and recreated (lancedb's ``drop_table`` then
``create_table``, ``rm -r`` then any writer) restarts its row ids at 0 and its
versions at 1, so without this the view would match new rows against old ones
by (row id, version). The refresh compares identities first and rebuilds the
view when they differ.

The identity is a random id in the dataset's Lance config (key
``mv_assets.table_id``): Lance carries config through every commit, including
compaction, cleanup and Overwrite. A table made by another tool has none until
a view is created over it (or a refresh rebuilds after a recreation): then one
``UpdateConfig`` commit stamps it, which changes no row.
"""

import uuid

import lance

from mv_assets.storage import objects

__all__ = ["TABLE_ID_KEY", "VIEW_ID_KEY", "table_id", "view_id", "ensure_table_id", "restored_id"]

TABLE_ID_KEY = "mv_assets.table_id"
# A materialized view's identity: a random id in its schema's metadata, written
# with the view's first (empty) version, so no commit of its own. It names the
# view's refresh plans (their job ids and checkpoint folders), so a view dropped
# and created again under the same name does not take the dropped one's job ids.
VIEW_ID_KEY = "mv_assets.view_id"


def view_id(ds: lance.LanceDataset) -> str:
    """The view's identity ("" for a view created before views had one)."""
    return (ds.schema.metadata or {}).get(VIEW_ID_KEY.encode(), b"").decode()


def table_id(ds: lance.LanceDataset, recorded: str | None = None) -> str | None:
    """The dataset's identity, or None when nobody stamped it yet.

    ``recorded``: the identity a view recorded of it. A table restored to a
    version from before it was stamped lost the stamp with the rest of that
    version's config; it is still the table it was when the version its
    restore left carries the stamp (looked for only then, the restore among
    its last :data:`RESTORE_LOOKBACK` commits). Without this a restore read as
    the table dropped and made again: every view over it was rebuilt."""
    found = ds.config().get(TABLE_ID_KEY)
    if found is not None or recorded is None:
        return found
    return restored_id(ds)


RESTORE_LOOKBACK = 64


def restored_id(ds: lance.LanceDataset) -> str | None:
    """The identity the table carried before its newest restore (a commit
    among its last :data:`RESTORE_LOOKBACK`), None without one."""
    for v in range(ds.version, max(1, ds.version - RESTORE_LOOKBACK), -1):
        try:
            txn = objects.read_transaction(ds, v)
        except Exception:  # (history cleaned up: nothing more to read)
            return None
        if type(getattr(txn, "operation", None)).__name__ == "Restore":
            try:
                return ds.checkout_version(v - 1).config().get(TABLE_ID_KEY)
            except (ValueError, OSError):
                return None
    return None


def ensure_table_id(uri: str) -> str:
    """The identity of the dataset at ``uri``, stamping one if it has none:
    the one it carried before a restore that took it away, else a new one."""
    ds = objects.dataset(uri)
    found = table_id(ds)
    if found is not None:
        return found
    ds.update_config({TABLE_ID_KEY: restored_id(ds) or uuid.uuid4().hex})
    # two stampers racing: the last commit wins (the loser's view rebuilds once more, never wrongly)
    return str(table_id(objects.dataset(uri)))
