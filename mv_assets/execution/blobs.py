"""Blob columns in tasks: read as their bytes, handed to a scalar UDF as a
file object where its parameter is annotated ``lance.blob.BlobFile`` (as
Geneva does), written back through Lance's dataset writer (see
:mod:`mv_assets.model.blobs`).

``blob_handling=BYTES`` is what a task's scan of a source (or of a view it
rewrites) passes so blob columns come as ``large_binary`` values, not Lance's
descriptors (a no-op for a dataset without blob columns).
"""

import io
import os
from typing import Final, Literal

from lance.blob import BlobFile

from mv_assets.model import udf as _udf

__all__ = ["BYTES", "BytesBlobFile"]

BYTES: Final[Literal["all_binary"]] = "all_binary"


class BytesBlobFile(BlobFile):
    """A ``lance.blob.BlobFile`` over one value's bytes, already read: ``read``,
    ``readall``, ``readinto``, ``seek``, ``tell``, ``size``, a context manager."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:  # (no Lance handle: no super().__init__)
        io.BufferedIOBase.__init__(self)
        self._buffer = io.BytesIO(bytes(data))
        self._size = len(self._buffer.getbuffer())

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
