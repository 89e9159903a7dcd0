"""Small file helpers for the catalog's own state files."""

import os
import tempfile


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` so that readers see the old file or the new one, never half."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
