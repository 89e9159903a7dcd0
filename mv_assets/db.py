"""Geneva's ``geneva.db`` helpers that Geneva programs import (``from geneva.db
import dataset_uses_stable_row_ids`` runs as ``from mv_assets.db import ...``)."""

from typing import Any

__all__ = ["dataset_uses_stable_row_ids"]


def dataset_uses_stable_row_ids(dataset: Any) -> bool:
    """Whether a Lance dataset (``table.to_lance()``) has stable row ids: every
    table and view mv_assets creates has them; a dataset written elsewhere may
    not (``db.enable_stable_row_ids(name)`` brings it in)."""
    return bool(getattr(dataset, "has_stable_row_ids", False))
