"""A chunk view's task (kind ``"chunker"``, see :mod:`mv_assets.model.chunk_view`):
the child rows of the parents in the task's source pieces.

Each parent is chunked (one chunker call per parent, batched as the chunker
asks), except a parent the view already holds children of, made from the same
chunker inputs (digest): those children are copied with the parent's new
inherited columns and version, and so are the values of columns added to the
view that read only the chunker's outputs, stamped current at the version the
refresh commits (the others become NULL: stale).
"""

from typing import Any

import numpy as np
import pyarrow as pa

from mv_assets.execution import blobs, progress
from mv_assets.model.chunk_view import child_index, inherited_columns, input_digests
from mv_assets.model.definition import ViewDefinition, quote_ident, stored_columns
from mv_assets.model.errors import UdfError
from mv_assets.model.markers import marker_value
from mv_assets.model.names import (
    CHUNK_INDEX,
    CHUNK_INPUTS,
    SOURCE_ROW_ID,
    SOURCE_ROW_VERSION,
    Alias,
    computed_marker,
    input_alias,
)
from mv_assets.model.udf import RowError
from mv_assets.storage import objects
from mv_assets.storage.lance_compat import take_rows, with_filter_columns

__all__ = ["chunk_batches"]

_ROW_VERSION = Alias.TASK_ROW_VERSION


def _kept_computed(schema: pa.Schema, outputs: list[str]) -> dict[str, str]:
    """Columns added to the view whose values survive a copy of the child, with
    their fingerprints: their UDF reads only chunker outputs (an inherited
    input may have changed)."""
    return {c.name: c.fingerprint for c in stored_columns(schema)
            if c.udf is not None and c.udf.input_columns and set(c.udf.input_columns) <= set(outputs)}


def _old_children(view_uri: str, view_version: int | None, row_ids: list[int] | None, schema: pa.Schema):
    """The view rows to reuse (children of updated parents), by parent id."""
    if not row_ids or view_version is None:
        return {}
    view = objects.dataset(view_uri, version=view_version)
    rows = take_rows(view, [int(i) for i in row_ids], [n for n in schema.names if n in view.schema.names])
    rows = rows.sort_by([(SOURCE_ROW_ID, "ascending"), (CHUNK_INDEX, "ascending")])
    keys = rows.column(SOURCE_ROW_ID).to_numpy()
    out: dict[int, pa.Table] = {}
    if len(keys):
        bounds = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1], True])
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            out[int(keys[lo])] = rows.slice(int(lo), int(hi - lo))
    return out


def chunk_batches(
    scanner_source: Any,
    definition: ViewDefinition,
    schema: pa.Schema,
    predicate: str | None,
    batch_size: int,
    calls: dict[str, int],
    errors: list[dict] | None,
    *,
    view_uri: str,
    view_version: int | None = None,
    reuse_rows: list[int] | None = None,
):
    """Yield the view batches of the parents ``scanner_source`` yields under ``predicate``."""
    chunker = definition.table_function
    inherited = inherited_columns(definition)
    inputs = list(chunker.input_columns)
    outputs = chunker.output_schema.names
    projection = dict(inherited)
    for col in inputs:
        projection[input_alias(col)] = quote_ident(col)
    projection[_ROW_VERSION] = "_row_last_updated_at_version"
    columns = with_filter_columns(projection, predicate)
    scanner = scanner_source.scanner(columns=columns, filter=predicate, with_row_id=True, blob_handling=blobs.BYTES,
                                     **blobs.scan_options(scanner_source, columns, predicate, batch_size))
    old = _old_children(view_uri, view_version, reuse_rows, schema)
    kept = _kept_computed(schema, outputs)
    # A copied child is a new row of the refresh's commit, which lands at the next
    # view version (committed without retry): its kept values are stamped current there.
    stamp_version = None if view_version is None else view_version + 1
    calls.setdefault(chunker.name, 0)
    for batch in scanner.to_batches():
        if batch.num_rows == 0:
            continue
        progress.advance(batch.num_rows)  # parents
        ids = batch.column("_rowid").cast(pa.int64()).to_numpy()
        vers = batch.column(_ROW_VERSION).cast(pa.int64())
        args = pa.RecordBatch.from_arrays([batch.column(input_alias(c)) for c in inputs], names=inputs)
        digests = input_digests(args, inputs)
        same = np.zeros(batch.num_rows, dtype=bool)
        if old:
            for i, pid in enumerate(ids):
                prior = old.get(int(pid))
                same[i] = prior is not None and prior.column(CHUNK_INPUTS)[0].as_py() == digests[i].as_py()
        fresh = np.flatnonzero(~same)
        parts: list[pa.Table] = []
        if len(fresh):
            parts.append(_chunked(chunker, schema, batch, args, fresh, ids, vers, digests, calls, errors))
        for i in np.flatnonzero(same):
            prior = old[int(ids[i])]
            at = pa.array(np.full(prior.num_rows, i, dtype=np.int64))
            values = {n: prior.column(n) for n in [*outputs, CHUNK_INDEX]}
            for name, fingerprint in kept.items():
                was = prior.column(computed_marker(name)).to_pylist()
                values[name] = prior.column(name)
                values[computed_marker(name)] = pa.array(
                    [None if m is None or stamp_version is None or not m.startswith(f"{fingerprint}@")
                     else marker_value(fingerprint, stamp_version) for m in was], pa.string())
            parts.append(_rows(schema, batch, at, ids, vers, digests, values))
        for part in parts:
            if part.num_rows:
                yield from part.to_batches()


def _chunked(chunker: Any, schema: pa.Schema, batch: pa.RecordBatch, args: pa.RecordBatch, fresh: np.ndarray,
             ids: np.ndarray, vers: pa.Array, digests: pa.Array, calls: dict[str, int],
             errors: list[dict] | None) -> pa.Table:
    """The children of the parents at positions ``fresh`` of ``batch``, from
    the chunker (``args``: its inputs); its calls counted in ``calls``, the
    rows it skipped recorded in ``errors``."""
    row_errors: list[RowError] = []
    sub = args.take(pa.array(fresh)) if len(fresh) < batch.num_rows else args
    try:
        children, parent, n = chunker.apply(sub, pa.array(ids[fresh]), row_errors)
    except UdfError as exc:
        at = fresh[exc.row_index or 0]
        exc.locate(column=chunker.name, fingerprint=chunker.fingerprint, row_id=int(ids[at]),
                   last_row_id=int(ids[at]), row_version=int(vers[at].as_py()))
        raise
    calls[chunker.name] += n
    for e in row_errors:
        if errors is not None:
            at = fresh[e.index]
            errors.append({
                "column": chunker.name, "udf_name": chunker.name, "udf_fingerprint": chunker.fingerprint,
                "row_id": int(ids[at]), "row_version": int(vers[at].as_py()), "error_type": e.error_type,
                "message": e.message, "traceback": e.traceback, "attempts": e.attempts,
            })
    at = pa.array(fresh[parent.to_numpy()] if len(parent) else np.empty(0, np.int64))
    values = {n: children.column(n) for n in chunker.output_schema.names}
    values[CHUNK_INDEX] = pa.array(child_index(parent.to_numpy()), pa.int32())
    return _rows(schema, batch, at, ids, vers, digests, values)


def _rows(schema: pa.Schema, batch: pa.RecordBatch, at: pa.Array, ids: np.ndarray, vers: pa.Array,
          digests: pa.Array, values: dict[str, Any]) -> pa.Table:
    """Child rows: parent ``at[i]`` of ``batch`` for each, with ``values`` (the
    rest of the view's columns NULL)."""
    n = len(at)
    arrays = []
    for f in schema:
        if f.name == SOURCE_ROW_ID:
            arrays.append(pa.array(ids, pa.int64()).take(at))
        elif f.name == SOURCE_ROW_VERSION:
            arrays.append(vers.take(at))
        elif f.name == CHUNK_INPUTS:
            arrays.append(digests.take(at))
        elif f.name in values:
            arrays.append(pa.array(values[f.name]).cast(f.type) if not isinstance(values[f.name], pa.ChunkedArray)
                          else values[f.name].combine_chunks().cast(f.type))
        elif f.name in batch.schema.names:
            arrays.append(batch.column(f.name).take(at).cast(f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)
