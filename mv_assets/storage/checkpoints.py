"""The one checkpoint store for UDF results, shared by refresh and backfill.

A store is a folder of Arrow IPC files, each written whole or not at all,
each holding the results of some rows::

    __ckpt_row_id | __ckpt_row_version | __ckpt_inputs | <column> | <marker> ...

with the rows the UDFs failed on as JSON in the schema metadata (``errors``).
A row's *identity* is its stable row id, its row version and the markers of
the computed columns its UDFs read (``__ckpt_inputs``): none of them is a
physical address, so a result stays valid across compactions and re-plans.

Refresh saves under a key derived from the identities of a scanner batch and
looks results up by identity (rows may be batched differently next time);
backfill saves under the batch keys of its plan and reads batches back by key.
Both read files and look rows up through the same code here.
"""

import hashlib
import json

import numpy as np
import pyarrow as pa

from mv_assets.model.names import Alias
from mv_assets.storage import objects

__all__ = ["CheckpointStore", "CheckpointIndex", "ID", "VERSION", "INPUTS"]

ID, VERSION, INPUTS = Alias.CHECKPOINT_ROW_ID, Alias.CHECKPOINT_ROW_VERSION, Alias.CHECKPOINT_INPUTS
_SUFFIX = ".arrow"


def _no_inputs(n: int) -> np.ndarray:
    return np.full(n, "", dtype=object)


class CheckpointStore:
    """Checkpointed UDF results under ``root`` (see the module docstring)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, key: str) -> str:
        return objects.join(self.root, f"{key}{_SUFFIX}")

    @staticmethod
    def identity_key(row_ids: np.ndarray, row_versions: np.ndarray, inputs: np.ndarray) -> str:
        """A key naming exactly these rows at these versions and inputs."""
        h = hashlib.sha256(row_ids.astype(np.int64).tobytes() + row_versions.astype(np.int64).tobytes())
        h.update("|".join(inputs.tolist()).encode())
        return h.hexdigest()[:24]

    def keys(self) -> list[str]:
        """The saved keys, sorted."""
        return sorted(n[: -len(_SUFFIX)] for n in objects.listdir(self.root) if n.endswith(_SUFFIX))

    def has(self, key: str) -> bool:
        return objects.exists(self._path(key))

    def save(
        self,
        row_ids: np.ndarray,
        row_versions: np.ndarray,
        inputs: np.ndarray | None,
        values: dict[str, pa.Array],
        errors: list[dict],
        key: str | None = None,
    ) -> str:
        """Save the results of some rows (whole or not at all); returns the key."""
        if inputs is None:
            inputs = _no_inputs(len(row_ids))
        table = pa.table({
            ID: pa.array(row_ids, pa.int64()), VERSION: pa.array(row_versions, pa.int64()),
            INPUTS: pa.array(inputs.tolist(), pa.string()), **values,
        }).replace_schema_metadata({b"errors": json.dumps(errors).encode()})
        key = key or self.identity_key(row_ids, row_versions, inputs)
        objects.write_arrow(self._path(key), table)
        return key

    def read(self, key: str) -> tuple[pa.Table, list[dict]]:
        """One saved file: its rows and the errors recorded with them."""
        data = objects.read_arrow(self._path(key))
        return data, json.loads((data.schema.metadata or {}).get(b"errors", b"[]"))

    def index(self, keys: list[str] | None = None) -> "CheckpointIndex":
        """Every saved row (or the rows of ``keys``), looked up by identity."""
        return CheckpointIndex([self.read(k) for k in (self.keys() if keys is None else keys)])

    def remove(self, keys: list[str]) -> None:
        for k in keys:
            objects.remove(self._path(k))

    def clear(self) -> None:
        objects.remove_tree(self.root)


class CheckpointIndex:
    """Saved rows of several files, sorted by row id for lookups by identity."""

    def __init__(self, files: list[tuple[pa.Table, list[dict]]]) -> None:
        self.tables = [t for t, _ in files]
        self._errors: dict[int, list[dict]] = {}
        for _, errs in files:
            for e in errs:
                self._errors.setdefault(int(e["row_id"]), []).append(e)
        cat = (lambda xs: np.concatenate(xs) if xs else np.empty(0, np.int64))  # noqa: E731
        self.ids = cat([t.column(ID).to_numpy() for t in self.tables])
        self.versions = cat([t.column(VERSION).to_numpy() for t in self.tables])
        self._inputs = np.concatenate([np.asarray(t.column(INPUTS).to_pylist(), dtype=object) for t in self.tables]) \
            if self.tables else _no_inputs(0)
        self._file = cat([np.full(t.num_rows, k, dtype=np.int64) for k, t in enumerate(self.tables)])
        self._row = cat([np.arange(t.num_rows, dtype=np.int64) for t in self.tables])
        self._order = np.argsort(self.ids, kind="stable")
        self._sorted = self.ids[self._order]

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, row_ids: np.ndarray, row_versions: np.ndarray, inputs: np.ndarray | None = None) -> np.ndarray:
        """Position of each row's saved result (-1: not saved at this version and these inputs)."""
        if len(self.ids) == 0:
            return np.full(len(row_ids), -1, dtype=np.int64)
        if inputs is None:
            inputs = _no_inputs(len(row_ids))
        p = np.minimum(np.searchsorted(self._sorted, row_ids), len(self._sorted) - 1)
        pos = self._order[p]
        found = (self._sorted[p] == row_ids) & (self.versions[pos] == row_versions) & (self._inputs[pos] == inputs)
        out = np.where(found, pos, -1)
        # an id saved several times (a join view's row id is its first table's: one per joined row, told
        # apart by the inputs): the rows not found at the first of their id look through the others
        hi = np.searchsorted(self._sorted, row_ids, side="right")
        for k in np.flatnonzero(~found & (hi - p > 1)):
            for q in self._order[p[k] + 1:hi[k]]:
                if self.versions[q] == row_versions[k] and self._inputs[q] == inputs[k]:
                    out[k] = q
                    break
        return out

    def values(self, pos: np.ndarray, names: list[str]) -> dict[str, pa.Array]:
        """The saved ``names`` of the rows at ``pos`` (positions from :meth:`lookup`), in that order."""
        if len(pos) == 0:
            schema = self.tables[0].schema if self.tables else pa.schema([])
            return {n: pa.array([], schema.field(n).type) for n in names}
        files = self._file[pos]
        needed = np.unique(files)
        base = np.zeros(int(needed.max()) + 1, dtype=np.int64)
        parts, total = [], 0
        for f in needed:
            base[f] = total
            total += self.tables[f].num_rows
            parts.append(self.tables[f].select(names))
        taken = pa.concat_tables(parts).take(pa.array(base[files] + self._row[pos]))
        return {n: taken.column(n).combine_chunks() for n in names}

    def errors_for(self, row_ids: np.ndarray) -> list[dict]:
        return [e for i in row_ids.tolist() for e in self._errors.get(int(i), [])]
