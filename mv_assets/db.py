"""Geneva's ``geneva.db`` names that Geneva programs import (``from geneva.db import
Connection, dataset_uses_stable_row_ids`` runs as ``from mv_assets.db import ...``)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mv_assets.api.catalog import Connection as Connection

__all__ = ["Connection", "dataset_uses_stable_row_ids"]


def dataset_uses_stable_row_ids(dataset: Any) -> bool:
    """Whether a Lance dataset (``table.to_lance()``) has stable row ids: every
    table and view mv_assets creates has them; a dataset written elsewhere may
    not (``db.enable_stable_row_ids(name)`` brings it in)."""
    return bool(getattr(dataset, "has_stable_row_ids", False))


def __getattr__(name: str) -> Any:
    # ``Connection`` (Geneva's docs call ``Connection.local_ray_context()`` on the class) is
    # imported on first use, as ``mv_assets.Connection`` is: this module stays as light
    if name == "Connection":
        from mv_assets.api.catalog import Connection

        return Connection
    raise AttributeError(f"module 'mv_assets.db' has no attribute {name!r}")
