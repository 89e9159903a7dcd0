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

__all__ = ["TABLE_ID_KEY", "table_id", "ensure_table_id"]

TABLE_ID_KEY = "mv_assets.table_id"


def table_id(ds: lance.LanceDataset) -> str | None:
    """The dataset's identity, or None when nobody stamped it yet."""
    return ds.config().get(TABLE_ID_KEY)


def ensure_table_id(uri: str) -> str:
    """The identity of the dataset at ``uri``, stamping a new one if it has none."""
    ds = objects.dataset(uri)
    found = table_id(ds)
    if found is not None:
        return found
    ds.update_config({TABLE_ID_KEY: uuid.uuid4().hex})
    # two stampers racing: the last commit wins (the loser's view rebuilds once more, never wrongly)
    return str(table_id(objects.dataset(uri)))
