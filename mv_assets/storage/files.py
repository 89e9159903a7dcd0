"""Whole-or-nothing state files of the catalog, local or on an object store
(see :mod:`mv_assets.storage.objects`)."""

import pyarrow as pa

from mv_assets.storage import objects


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` so that readers see the old file or the new one, never half."""
    objects.write_text(path, text)


def atomic_write_arrow(path: str, table: pa.Table) -> None:
    """Write ``table`` as an Arrow IPC file, whole or not at all."""
    objects.write_arrow(path, table)


def read_arrow(path: str) -> pa.Table:
    """An Arrow IPC file (memory-mapped when local)."""
    return objects.read_arrow(path)
