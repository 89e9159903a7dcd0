"""Blob columns in tasks: read as their bytes, handed to a scalar UDF as a
file object where its parameter is annotated ``lance.blob.BlobFile`` (as
Geneva does), written back through Lance's dataset writer (see
:mod:`mv_assets.model.blobs`).

``blob_handling=BYTES`` is what a task's scan of a source (or of a view it
rewrites) passes so blob columns come as ``large_binary`` values, not Lance's
descriptors (a no-op for a dataset without blob columns).

A scan batch holds every blob byte of its rows at once, so a scan reading
blob columns takes as many rows per batch as fit :data:`SCAN_BYTES` with its
largest row (:func:`scan_options`: the sizes come from Lance's descriptors,
read first, not from the bytes): 8,192 rows of 100 MB videos would be 800 GB.
And it reads :data:`READ_AHEAD` batches ahead, not Lance's 16: a UDF slower
than the disk would otherwise hold 16 such batches waiting.
"""

import io
import os
from typing import Any, TypedDict

import pyarrow.compute as pc
from lance.blob import BlobFile

from mv_assets.model import udf as _udf
from mv_assets.model.blobs import BYTES, blob_sources

__all__ = ["BYTES", "READ_AHEAD", "SCAN_BYTES", "BytesBlobFile", "scan_options"]

SCAN_BYTES = 32 * 1024 * 1024  # blob bytes a scan batch holds at most (beyond one row larger than that)
READ_AHEAD = 2  # batches a scan reading blob columns reads ahead of its consumer


class ScanOptions(TypedDict, total=False):
    batch_size: int
    batch_readahead: int


def scan_options(scan: Any, columns: dict[str, str] | list[str], filter: str | None, batch_size: int,
                 budget: int | None = None) -> ScanOptions:
    """The ``batch_size`` (and ``batch_readahead``) of a scan of ``columns``
    (``{name: "`column`"}`` or names) from ``scan`` (a dataset, fragment, or
    anything with ``scanner`` and ``schema``): ``batch_size`` where no blob
    column is read; else as many rows as keep the largest row's blob bytes
    times the rows within ``budget`` (:data:`SCAN_BYTES`; at least 1), and
    :data:`READ_AHEAD` batches ahead."""
    blob_cols = sorted(set(blob_sources(columns, scan.schema).values()))
    if not blob_cols:
        return {"batch_size": batch_size}
    sizes = scan.scanner(columns={f"__blob{i}": f"`{c}`" for i, c in enumerate(blob_cols)}, filter=filter
                         ).to_table()  # Lance's descriptors: where each blob is and its size, not its bytes
    largest = 0
    if sizes.num_rows:
        total = None
        for i in range(len(blob_cols)):
            size = pc.fill_null(pc.struct_field(sizes.column(f"__blob{i}"), "size"), 0)  # pyright: ignore[reportAttributeAccessIssue]
            total = size if total is None else pc.add(total, size)  # pyright: ignore[reportAttributeAccessIssue]
        largest = int(pc.max(total).as_py() or 0)  # pyright: ignore[reportAttributeAccessIssue]
    rows = max(1, min(batch_size, (budget or SCAN_BYTES) // max(1, largest)))
    return {"batch_size": rows, "batch_readahead": READ_AHEAD}


class BytesBlobFile(BlobFile):
    """A ``lance.blob.BlobFile`` over one value's bytes, already read: ``read``,
    ``readall``, ``readinto``, ``seek``, ``tell``, ``size``, a context manager."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:  # (no Lance handle: no super().__init__)
        io.BufferedIOBase.__init__(self)
        self._buffer = io.BytesIO(data)
        self._size = len(data)

    def close(self) -> None:
        self._buffer.close()

    @property
    def closed(self) -> bool:
        return self._buffer.closed

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._buffer.seek(offset, whence)

    def tell(self) -> int:
        return self._buffer.tell()

    def size(self) -> int:
        return self._size

    def read(self, size: int | None = -1) -> bytes:
        return self._buffer.read(-1 if size is None else size)

    def read1(self, size: int = -1) -> bytes:
        return self._buffer.read1(size)

    def readall(self) -> bytes:
        return self._buffer.read()

    def readinto(self, b) -> int:
        return self._buffer.readinto(b)

    def __repr__(self) -> str:
        return f"BytesBlobFile({self._size} bytes)"


_udf.PARAM_ADAPTERS[f"{BlobFile.__module__}.{BlobFile.__qualname__}"] = BytesBlobFile
