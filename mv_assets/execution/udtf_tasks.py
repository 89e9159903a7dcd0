"""A table-function view's task (kind ``"udtf"``, see :mod:`mv_assets.model.udtf_view`):
the view rows of whole partitions.

The task reads every row of its partitions (``TaskSpec.partitions``, their
keys) passing the view's filter, at the task's pinned source version, in one
scan; each partition's rows (in scan order) go to one UDTF call, and its
output rows get the partition's key and id.
"""

import lance
import numpy as np
import pyarrow as pa

from mv_assets.execution import blobs
from mv_assets.model.definition import ViewDefinition
from mv_assets.model.errors import UdfError
from mv_assets.model.names import PARTITION, SOURCE_ROW_ID
from mv_assets.model.udtf_view import group_partitions, partition_id, partition_predicate

__all__ = ["udtf_batches"]


def _and(*parts: str | None) -> str | None:
    kept = [p for p in parts if p]
    return " AND ".join(f"({p})" for p in kept) if kept else None


def udtf_batches(ds: lance.LanceDataset, definition: ViewDefinition, schema: pa.Schema, keys: list[str],
                 calls: dict[str, int]):
    """Yield the view batches of the partitions ``keys`` of ``ds`` (one UDTF
    call per partition that has rows; ``calls[udtf name]`` counts them)."""
    f = definition.table_function
    calls.setdefault(f.name, 0)
    if not keys:
        return
    column = f.partition_by
    dtype = ds.schema.field(column).type if column is not None else None
    predicate = _and(partition_predicate(column, dtype, keys), definition.filter)
    rows = ds.to_table(columns=list(f.input_columns), filter=predicate, with_row_id=True, blob_handling=blobs.BYTES)
    groups = group_partitions(rows.column(column) if column is not None else None, rows.num_rows)
    # one take puts every partition's rows together (in scan order within each); then zero-copy slices
    present = [k for k in keys if k in groups]  # (the planner saw rows in each: it never plans an empty partition)
    order = np.concatenate([groups[k] for k in present]) if present else np.empty(0, np.int64)
    ids = rows.column("_rowid").to_numpy()[order]
    rows = rows.drop_columns(["_rowid"]).take(pa.array(order)).combine_chunks()
    starts = np.cumsum([0] + [len(groups[k]) for k in present])
    for key, lo, hi in zip(present, starts[:-1], starts[1:], strict=True):
        try:
            out = f.apply(rows.slice(int(lo), int(hi - lo)))
        except UdfError as exc:  # named by the partition's first and last source rows
            exc.locate(column=f.name, fingerprint=f.fingerprint, row_id=int(ids[lo]), last_row_id=int(ids[hi - 1]),
                       row_version=ds.version)
            exc.add_note(f"UDTF {f.name!r} failed on partition {key} ({hi - lo} rows)")
            raise
        calls[f.name] += 1
        if out.num_rows == 0:
            continue
        n = out.num_rows
        arrays = []
        for field in schema:
            if field.name == SOURCE_ROW_ID:
                arrays.append(pa.array(np.full(n, partition_id(key), dtype=np.int64)))
            elif field.name == PARTITION:
                arrays.append(pa.array([key] * n, pa.string()))
            else:  # the UDTF's columns (apply checked them; add_columns is refused on these views)
                arrays.append(out.column(field.name).cast(field.type))
        yield from pa.Table.from_arrays(arrays, schema=schema).to_batches()
