"""Small file helpers for the catalog's own state files."""

import os
import tempfile

import pyarrow as pa


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` so that readers see the old file or the new one, never half."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def atomic_write_arrow(path: str, table: pa.Table) -> None:
    """Write ``table`` as an Arrow IPC file, whole or not at all (temp file + rename)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    os.close(fd)
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, path)


def read_arrow(path: str) -> pa.Table:
    """An Arrow IPC file, memory-mapped (columns are paged in when used)."""
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all()
