"""Executor-side work: read source rows of one fragment, compute the view's
columns and UDFs, write Lance data files into the view, return small metadata.

Everything here runs inside a Spark Python worker (or in-process with the
inline runner). It receives only plain data (URIs, versions, fragment ids, the
encoded view definition) and opens Lance itself; nothing Lance- or JVM-side is
shipped from the driver.
"""

import functools
import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.fragment import FragmentMetadata

from mv_assets.execution import blobs, progress
from mv_assets.execution.agg_tasks import agg_batches
from mv_assets.execution.chunk_tasks import chunk_batches
from mv_assets.execution.join_tasks import join_batches
from mv_assets.execution.pipeline import prefetched, write_behind
from mv_assets.execution.stages import StageClock
from mv_assets.execution.stages import clock as stage_clock
from mv_assets.execution.udtf_tasks import udtf_batches
from mv_assets.model.blobs import logical_schema
from mv_assets.model.definition import (
    SOURCE_MARKER_PREFIX,
    SOURCE_ROW_ID,
    SOURCE_ROW_VERSION,
    ColumnSpec,
    ViewDefinition,
    computed_marker,
    short_error,
)
from mv_assets.model.errors import UdfError
from mv_assets.model.kinds import kind_of
from mv_assets.model.names import Alias, input_alias, input_marker_alias
from mv_assets.model.pacing import CheckpointPacer
from mv_assets.model.planning import column_ids, isin, positions, shuffle_keys
from mv_assets.model.udf import UDF, RowError
from mv_assets.storage import objects
from mv_assets.storage.checkpoints import CheckpointIndex, CheckpointStore
from mv_assets.storage.lance_compat import with_filter_columns

__all__ = [
    "TaskSpec", "TaskResult", "run_task", "compute_rows", "and_filters", "PacedRowStore", "checkpointed_udf_columns",
    "input_identity", "paced", "without_inputs",
]


def _shallow(obj: object) -> dict:
    """A dataclass's fields as a dict, not copied (``asdict`` deep-copies every
    nested list and dict: ~0.3 ms a small refresh, for JSON that reads them as they are)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)  # pyright: ignore[reportArgumentType]
            if f.metadata.get("wire", True)}


@dataclass
class TaskSpec:
    """One unit of work: for each part ``[fragment id, predicate, rows]``, the
    rows of that source fragment matching the predicate. Small fragments are
    packed into one task (and one set of view files) up to the task size."""

    task_id: str
    src_uri: str
    src_version: int
    parts: list[list]  # [[fragment_id, predicate | None, rows], ...]
    view_uri: str
    rows: int  # rows the planner expects this task to compute
    checkpoint_dir: str | None = None
    max_rows_per_file: int = 1 << 20
    batch_size: int = 8192
    # Set for tasks that rewrite rows the view already holds: only these UDF
    # columns are computed, the other values are copied from ``view_version``.
    recompute: list[str] | None = None
    # The view's version the plan read (its schema is the one the task writes)
    view_version: int | None = None
    # Where UDF results are checkpointed per scanner batch (by the UDFs'
    # fingerprints and each row's stable id and version, see RowStore): a task
    # that dies redoes at most the batch it was computing, even if the rows are
    # batched differently next time (compaction, another plan).
    batch_checkpoint_dir: str | None = None
    batch_resume: bool = False  # an earlier run left row checkpoints: look them up
    # Checkpoints sized by time (model.pacing): UDF results are saved once they
    # took this long to compute; None: every ``batch_size`` rows.
    checkpoint_seconds: float | None = None
    # Chunk views: the view's rows (stable ids, at ``view_version``) of the
    # task's parents that the view already holds: reused if their inputs did not change.
    reuse_rows: list[int] | None = None
    # Table-function views: the keys of the partitions the task computes, whole
    # (model.udtf_view.partition_key); ``parts`` is then empty.
    partitions: list[str] | None = None
    # Arguments of a view kind's own task (aggregate views: the version whose
    # changes the task applies, the groups they touch; execution.agg_tasks)
    kind_args: dict | None = None
    # The only task of its refresh: when it took less than a checkpoint's worth
    # of time (``checkpoint_seconds``), it saves no task checkpoint, UDF columns
    # or not: a crash before the commit redoes less work than that, as the row
    # checkpoints' pacing allows, where the checkpoint cost every small refresh
    # its write and removal.
    only_task: bool = False

    @property
    def fragment_ids(self) -> list[int]:
        return [int(p[0]) for p in self.parts]

    def to_json(self) -> str:
        return json.dumps(_shallow(self))

    @staticmethod
    def from_json(raw: str) -> "TaskSpec":
        return TaskSpec(**json.loads(raw))


@dataclass
class TaskResult:
    task_id: str
    # the view fragments written, as FragmentMetadata JSON: what travels (from a Spark worker, in a
    # task checkpoint); a task run in this process hands over the FragmentMetadata itself
    # (``metas``), made JSON only when the result is (:meth:`to_json`; ~0.1 ms a fragment)
    fragments: list[dict] = field(default_factory=list)
    rows_written: int = 0
    udf_rows: dict[str, int] = field(default_factory=dict)  # rows each UDF computed in this run
    # rows whose results came from checkpoints instead (row checkpoints of an
    # earlier, interrupted run; the whole task when its checkpoint is loaded)
    udf_rows_resumed: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    resumed: bool = False
    worker_pid: int = 0
    errors: list[dict] = field(default_factory=list)  # rows a UDF failed on (on_error="skip")
    rows_path: str | None = None  # shuffled views: the task's rows (Arrow IPC), ordered at the commit
    # seconds per stage (read_s, udf_s, setup_s, write_s), only when asked for (execution.stages)
    stages: dict[str, float] = field(default_factory=dict)
    # rows written that stand for a view row removed with the same provenance (a join view's row
    # computed again from the same source rows): counted as updates, not an insert and a delete
    rows_replaced: int = 0
    # a join task reading first-table rows by id: the fragments (where they are now) of those whose
    # view rows it wrote or removed (its partitions whose rows change: ops.join_refresh)
    first_fragments: list[int] = field(default_factory=list)
    metas: list = field(default_factory=list, repr=False, compare=False, metadata={"wire": False})

    def to_json(self) -> str:
        out = _shallow(self)
        if self.metas:
            out["fragments"] = self.fragment_json()
        return json.dumps(out)

    def fragment_json(self) -> list[dict]:
        """The view fragments written, as FragmentMetadata JSON."""
        return [m.to_json() for m in self.metas] if self.metas else self.fragments

    def fragment_metadata(self) -> list:
        """The view fragments written, as Lance's FragmentMetadata."""
        return self.metas or [FragmentMetadata.from_json(json.dumps(f)) for f in self.fragments]

    @staticmethod
    def from_json(raw: str) -> "TaskResult":
        return TaskResult(**json.loads(raw))


def and_filters(*parts: str | None) -> str | None:
    """AND together the non-empty SQL predicates, each parenthesised."""
    kept = [p for p in parts if p]
    if not kept:
        return None
    if len(kept) == 1:
        return kept[0]
    return " AND ".join(f"({p})" for p in kept)


_DEFINITIONS: dict[str, ViewDefinition] = {}


def decode_definition(raw: bytes) -> ViewDefinition:
    """Decode (and cache per process) a view definition with its UDFs."""
    key = hashlib.sha256(raw).hexdigest()
    d = _DEFINITIONS.get(key)
    if d is None:
        d = ViewDefinition.decode(raw)
        _DEFINITIONS[key] = d
    return d


_ROW_VERSION = Alias.TASK_ROW_VERSION
_in_name = input_alias
_in_marker_name = input_marker_alias


def input_identity(batch: pa.RecordBatch, computed_inputs: list[str]) -> np.ndarray:
    """Per row, the markers of the computed source columns a UDF reads, joined:
    what (besides row id and version) its checkpointed results depend on. A
    backfill rewrites such a column without moving row versions."""
    if not computed_inputs:
        return np.full(batch.num_rows, "", dtype=object)
    parts = [batch.column(_in_marker_name(c)).fill_null("") for c in computed_inputs]
    joined = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "|")  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
    return np.asarray(joined.to_pylist(), dtype=object)


def without_inputs(batch: pa.RecordBatch, names: list[str]) -> pa.RecordBatch:
    """``batch`` without its UDF input columns ``names``: what a row identity
    computed later (when its results are checkpointed) may hold. Results held
    until a checkpoint kept their whole input batches alive with it: a blob
    column's bytes, 10 batches of 32 MB of videos at once."""
    present = [n for n in names if n in batch.schema.names]
    return batch.drop_columns(present) if present else batch


def _compute_batches(
    scanner_source: "lance.LanceDataset | lance.LanceFragment | _FragmentsScan",
    definition: ViewDefinition,
    schema: pa.Schema,
    source_schema: pa.Schema,
    predicate: str | None,
    batch_size: int,
    udf_rows: dict[str, int],
    only: list[str] | None = None,
    errors: list[dict] | None = None,
    batch_checkpoint_dir: str | None = None,
    batch_resume: bool = True,
    udf_resumed: dict[str, int] | None = None,
    checkpoint_seconds: float | None = None,
    overlap: bool = False,
    clock: StageClock | None = None,
):
    """Yield view batches; with ``only``, just the key, version and those
    columns (UDF columns computed again, or every other column read again).
    With ``overlap``, source batches are read ahead in a thread while the UDF
    columns are computed. With a ``clock``, the time reading and in the
    UDFs is added to its ``read_s`` and ``udf_s``."""
    if only is not None:
        definition = ViewDefinition(
            definition.source, tuple(c for c in definition.columns if c.name in only), definition.filter
        )
        keep = {SOURCE_ROW_ID, SOURCE_ROW_VERSION, *only, *(computed_marker(c) for c in only)}
        schema = pa.schema([f for f in schema if f.name in keep])
    inputs = definition.udf_input_columns(source_schema)
    computed_inputs = [c for c in inputs if computed_marker(c) in source_schema.names]
    projection = _scan_projection(definition, schema, inputs, computed_inputs)
    columns = with_filter_columns(projection, predicate)
    scanner = scanner_source.scanner(
        columns=columns,
        filter=predicate,
        with_row_id=True,
        blob_handling=blobs.BYTES,  # a blob column's bytes, not Lance's descriptors
        **blobs.scan_options(scanner_source, columns, predicate, batch_size),  # (fewer rows of large blobs)
    )
    specs = [c for c in definition.udf_columns if c.name in schema.names]
    store = _row_store(batch_checkpoint_dir, specs, batch_resume, checkpoint_seconds)
    sql_markers = {computed_marker(c.name): c.fingerprint for c in definition.columns
                   if c.kind == "sql" and computed_marker(c.name) in schema.names}
    if overlap and specs:
        # The next batches are read while the UDFs run (execution.pipeline), in
        # batches no larger than the UDFs take in one call (no slicing and joining
        # again) and of OVERLAP_BATCH_BYTES: smaller batches fill and drain the
        # pipeline sooner.
        read = paced(_scanned(scanner, definition), store, udf_batch_rows(specs), OVERLAP_BATCH_BYTES, batch_size)
        source = prefetched(read if clock is None else clock.timed_iter(read, "read_s"))
    else:
        read = paced(_scanned(scanner, definition), store, checkpoint_rows=batch_size)
        source = read if clock is None else clock.timed_iter(read, "read_s")
    for batch in source:
        if batch.num_rows == 0:
            continue
        input_batch = None
        if inputs:
            input_batch = pa.RecordBatch.from_arrays(
                [batch.column(_in_name(c)) for c in inputs], names=inputs
            )
        row_ids = _ids(batch.column("_rowid"))
        row_versions = _ids(batch.column(_ROW_VERSION))
        started = time.perf_counter()
        udf_values = checkpointed_udf_columns(
            specs, input_batch, row_ids, row_versions, udf_rows, errors, store,
            functools.partial(input_identity, without_inputs(batch, [_in_name(c) for c in inputs]), computed_inputs),
            udf_resumed,
        )
        if clock is not None:
            clock.add("udf_s", time.perf_counter() - started)
        if isinstance(store, PacedRowStore) and store.computed(batch.num_rows, time.perf_counter() - started):
            store.flush()
        progress.advance(batch.num_rows)
        yield _view_batch(schema, batch, row_ids, row_versions, udf_values, sql_markers)


def _scan_projection(definition: ViewDefinition, schema: pa.Schema, inputs: list[str],
                     computed_inputs: list[str]) -> dict[str, str]:
    """The columns :func:`_compute_batches` scans: the projection of the
    view's columns in ``definition`` and the markers of computed source
    columns it keeps in ``schema`` (both the task's: only its ``recompute``
    columns when it rewrites some), then the UDFs' inputs, the markers of
    those computed, and the row version."""
    projection = dict(definition.projection)
    for f in schema:
        if f.name.startswith(SOURCE_MARKER_PREFIX):
            projection[f.name] = f"`{computed_marker(f.name[len(SOURCE_MARKER_PREFIX):])}`"
    for col in inputs:
        projection[_in_name(col)] = f"`{col}`"
    for col in computed_inputs:
        projection[_in_marker_name(col)] = f"`{computed_marker(col)}`"
    projection[_ROW_VERSION] = "_row_last_updated_at_version"
    return projection


def _row_store(batch_checkpoint_dir: str | None, specs: list, batch_resume: bool,
               checkpoint_seconds: float | None) -> "RowStore | None":
    """Where the UDF results of the rows are checkpointed (none without a
    directory or a UDF): held for ``checkpoint_seconds`` of compute when given."""
    if not (batch_checkpoint_dir and specs):
        return None
    return (RowStore(batch_checkpoint_dir, specs, lookup=batch_resume) if checkpoint_seconds is None
            else PacedRowStore(batch_checkpoint_dir, specs, batch_resume, checkpoint_seconds))


def _view_batch(schema: pa.Schema, batch: pa.RecordBatch, row_ids: pa.Array, row_versions: pa.Array,
                udf_values: dict, sql_markers: dict[str, str]) -> pa.RecordBatch:
    """The view's batch of the scanned ``batch``: its columns in ``schema``'s
    order, UDF values and SQL columns' markers in their place."""
    arrays = []
    for f in schema:
        if f.name == SOURCE_ROW_ID:
            arrays.append(row_ids)
        elif f.name == SOURCE_ROW_VERSION:
            arrays.append(row_versions)
        elif f.name in udf_values:
            arrays.append(_as(udf_values[f.name], f.type))
        elif f.name in sql_markers:  # a SQL column added to the view: computed by the projection
            arrays.append(repeat_string(sql_markers[f.name], batch.num_rows))
        else:
            arrays.append(_as(batch.column(f.name), f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _ids(values: pa.Array) -> pa.Array:
    """Lance's row ids and versions (uint64, below 2**63) as int64: the same bits,
    reinterpreted (a cast call costs ~20 us a batch)."""
    return values.view(pa.int64()) if values.type == pa.uint64() else _as(values, pa.int64())


def _as(values: pa.Array, to: pa.DataType) -> pa.Array:
    """``values`` cast to ``to`` (a cast call costs ~20 us even when there is nothing to do)."""
    return values if values.type == to else values.cast(to)


COMPUTE_BATCH_BYTES = 32 * 1024 * 1024
OVERLAP_BATCH_BYTES = 8 * 1024 * 1024


def udf_batch_rows(specs: list[ColumnSpec]) -> int | None:
    """The fewest rows one of the columns' UDFs takes per call (``batch_size``), or None."""
    sizes = [int(n) for c in specs if c.udf is not None and (n := getattr(c.udf, "batch_size", None))]
    return min(sizes) if sizes else None


def paced(batches, store: "RowStore | None", max_rows: int | None = None, max_bytes: int = COMPUTE_BATCH_BYTES,
          checkpoint_rows: int | None = None):
    """Scanner batches, joined into compute batches of up to the pacer's
    ``max_rows`` rows (and ``COMPUTE_BATCH_BYTES``: wide rows, images or
    embeddings, make smaller ones), then cut into slices as the pacer asks
    (checkpoints by time). Without a store, batches are joined the same way; a
    store saving every batch (``checkpoint_size``) gets the scanner's batches,
    cut to ``checkpoint_rows`` (a filtered scan's batches can be larger than
    its batch size: 60 rows of a 50-row batch size, so 60-row checkpoints).

    Per batch, the engine pays a fixed Python cost (the UDF call, markers,
    casts): a cheap UDF over 8,192-row batches spent a quarter of its task
    time there."""
    if store is not None and not isinstance(store, PacedRowStore):
        for batch in batches:
            if checkpoint_rows is None or batch.num_rows <= checkpoint_rows:
                yield batch
                continue
            for offset in range(0, batch.num_rows, checkpoint_rows):
                yield batch.slice(offset, checkpoint_rows)
        return
    if store is None:
        yield from _coalesced(batches, min(CheckpointPacer().max_rows, max_rows or 2**62), max_bytes)
        return
    for batch in _coalesced(batches, min(store.pacer.max_rows, max_rows or 2**62), max_bytes):
        offset = 0
        while offset < batch.num_rows:
            n = store.pacer.next_rows()
            yield batch.slice(offset, n)
            offset += n


def _scanned(scanner, definition: ViewDefinition):
    """The scanner's batches; Lance failing to evaluate the view's SQL (a cast
    that does not hold for some row, say) is a ValueError in our words."""
    try:
        it = iter(scanner.to_batches())
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            yield batch
    except pa.ArrowInvalid as exc:
        raise ValueError(f"the SQL of the view over {definition.source!r} failed on the source's rows: {short_error(exc)}") from exc
    except OSError as exc:
        if "Invalid user input" not in str(exc):
            raise
        raise ValueError(f"the SQL of the view over {definition.source!r} failed: {short_error(exc)}") from exc


def repeat_string(value: str, n: int) -> pa.Array:
    """``value`` ``n`` times as a string array, built from buffers (fast)."""
    raw = value.encode()
    offsets = np.arange(0, len(raw) * (n + 1), len(raw), dtype=np.int64 if len(raw) * n >= 2**31 else np.int32)
    if offsets.dtype == np.int64:
        return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n)).cast(pa.string())
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


def compute_udf_columns(
    specs: list[ColumnSpec],
    inputs: pa.RecordBatch | None,
    row_ids: pa.Array,
    row_versions: pa.Array,
    udf_rows: dict[str, int],
    errors: list[dict] | None,
) -> dict[str, pa.Array]:
    """Values of UDF columns and of their computed markers for one batch.

    A multi-column UDF runs once for all its sibling columns. Rows a UDF
    failed on under ``on_error="skip"`` get NULL values and NULL markers, and
    an error record (keyed by stable row id) in ``errors``; under "fail" the
    UDF's :class:`UdfError` is raised naming the column and the row ids.
    """
    out: dict[str, pa.Array] = {}
    runs: dict[tuple, tuple[pa.Array, np.ndarray]] = {}
    n = len(row_ids)
    for spec in specs:
        u = spec.udf
        assert u is not None and inputs is not None
        # one run for a multi-column UDF's sibling columns (one function: its pickle), never
        # for two functions of one code that captured different values
        key = (u.instance_key(), tuple(u.input_columns))
        if key not in runs:
            row_errors: list[RowError] = []
            try:
                values, computed = u.apply(inputs, row_errors)
            except UdfError as exc:  # on_error "fail": name the column and the rows
                first = exc.row_index or 0
                exc.locate(
                    column=spec.name, fingerprint=u.fingerprint, row_id=int(row_ids[first].as_py()),
                    last_row_id=int(row_ids[first + exc.rows - 1].as_py()),
                    row_version=int(row_versions[first].as_py()),
                )
                raise
            udf_rows[spec.name] = udf_rows.get(spec.name, 0) + computed
            failed = np.zeros(n, dtype=bool)
            for e in row_errors:
                failed[e.index] = True
                if errors is not None:
                    errors.append({
                        "column": spec.name, "udf_name": u.name, "udf_fingerprint": u.fingerprint,
                        "row_id": int(row_ids[e.index].as_py()), "row_version": int(row_versions[e.index].as_py()),
                        "error_type": e.error_type, "message": e.message, "traceback": e.traceback,
                        "attempts": e.attempts,
                    })
            runs[key] = (values, failed)
        else:
            udf_rows[spec.name] = udf_rows.get(spec.name, 0)
        values, failed = runs[key]
        if spec.field is not None:
            values = values.flatten()[values.type.get_field_index(spec.field)]  # flatten keeps parent NULLs
        out[spec.name] = values
        marker = repeat_string(spec.fingerprint, n)
        if failed.any():
            marker = pc.if_else(pa.array(failed), pa.scalar(None, pa.string()), marker)  # pyright: ignore[reportAttributeAccessIssue]  (generated at import)
        out[computed_marker(spec.name)] = marker
    return out


class RowStore:
    """UDF results checkpointed by row identity for one set of UDF columns: a
    :class:`CheckpointStore` under ``<root>/<signature of the UDFs>/``.

    Lookups are by identity, not by batch, so the results are found however
    the rows are batched the next time: after a source compaction, or a new
    plan over the same rows. The index holds what was saved before this store
    was opened (a crashed run's work); rows saved since belong to this task and
    are not looked up."""

    def __init__(self, root: str, specs: list[ColumnSpec], lookup: bool = True) -> None:
        sig = hashlib.sha256(json.dumps([[c.name, c.fingerprint, c.field] for c in specs]).encode()).hexdigest()
        self.store = CheckpointStore(objects.join(root, sig[:16]))
        self._index: CheckpointIndex | None = None if lookup else CheckpointIndex([])

    @property
    def index(self) -> CheckpointIndex:
        if self._index is None:
            self._index = self.store.index()
        return self._index

    @property
    def empty(self) -> bool:
        """Nothing saved before this store was opened: no row can be found."""
        return len(self.index.ids) == 0

    def save(self, ids: np.ndarray, vers: np.ndarray, ins: "Callable[[], np.ndarray]", values: dict[str, pa.Array],
             errors: list[dict]) -> None:
        """Save results; ``ins`` gives the rows' input identities (built only when saved)."""
        self.store.save(ids, vers, ins(), values, errors)

    def flush(self) -> None:
        pass


class PacedRowStore(RowStore):
    """A :class:`RowStore` that holds results in memory and saves them as one
    checkpoint when its pacer says they took long enough to compute.

    Held results are bounded: past :data:`HOLD_BYTES`, the oldest are let go
    while the UDF time they cost stays within :data:`RELEASE_SHARE` of the
    target. A cheap UDF's results would never be saved (its task ends before a
    checkpoint's worth of time), and holding all of them kept a task's whole
    output in memory, with the input batches their identities reference: every
    batch in fresh memory, faulted in page by page (measured, 200,000 rows of
    256 floats in, 384 out: ~540 MB held, 1.75 CPU-s for the task against 1.27
    once let go of, most of the difference system time). What was let go still
    counts as unsaved work: the save after it comes that much sooner
    (``CheckpointPacer.unsaved``), so a crash loses no more UDF time than before."""

    def __init__(self, root: str, specs: list[ColumnSpec], lookup: bool, target_seconds: float) -> None:
        super().__init__(root, specs, lookup)
        self.pacer = CheckpointPacer(target_seconds=target_seconds)
        self._held: list[list] = []  # [ids, vers, ins, values, errors, bytes, UDF seconds]
        self._timed = 0  # held entries whose UDF seconds are known (see computed)
        self._held_bytes = 0
        self.released_seconds = 0.0  # UDF time of the results let go of: in no checkpoint

    def save(self, ids, vers, ins, values, errors) -> None:
        # a copy: the caller may go on to change its dict (a one-pass backfill stamps the markers it returns)
        size = ids.nbytes + vers.nbytes + sum(v.get_total_buffer_size() for v in values.values())
        self._held.append([ids, vers, ins, dict(values), list(errors), size, 0.0])
        self._held_bytes += size

    def computed(self, rows: int, seconds: float) -> bool:
        """Record a slice's UDF time (its results saved to the store just
        before); True when the held results should be saved now (:meth:`flush`)."""
        fresh = self._held[self._timed:]
        for h in fresh:
            h[6] = seconds / len(fresh)
        self._timed = len(self._held)
        if self.pacer.computed(rows, seconds):
            return True
        self._release()
        return False

    def _release(self) -> None:
        """Let go of the oldest held results past :data:`HOLD_BYTES`, while their
        UDF time fits in :data:`RELEASE_SHARE` of the target."""
        allowed = self.pacer.target_seconds * RELEASE_SHARE
        n = 0
        while (self._held_bytes > HOLD_BYTES and n < self._timed
               and self.released_seconds + self._held[n][6] <= allowed):
            self._held_bytes -= self._held[n][5]
            self.released_seconds += self._held[n][6]
            n += 1
        if n:
            del self._held[:n]
            self._timed -= n

    def flush(self) -> None:
        self.pacer.unsaved(self.released_seconds)  # those results are in no checkpoint still
        if not self._held:
            return
        held, self._held, self._timed, self._held_bytes = self._held, [], 0, 0
        names = list(held[0][3])
        self.store.save(
            np.concatenate([h[0] for h in held]), np.concatenate([h[1] for h in held]),
            np.concatenate([h[2]() for h in held]),
            {n: pa.concat_arrays([h[3][n] for h in held]) for n in names}, [e for h in held for e in h[4]],
        )


# A paced store holds at most this many bytes of results (and the inputs they
# reference) beyond what is let go of; see PacedRowStore.
HOLD_BYTES = 32 * 1024 * 1024
# ... letting go of results that cost at most this share of the checkpoint
# target in UDF time (per task): the saves that follow come that much sooner.
RELEASE_SHARE = 0.25


def checkpointed_udf_columns(
    specs: list[ColumnSpec],
    inputs: pa.RecordBatch | None,
    row_ids: pa.Array,
    row_versions: pa.Array,
    udf_rows: dict[str, int],
    errors: list[dict] | None,
    store: "RowStore | None",
    input_ids: "Callable[[], np.ndarray] | None" = None,
    resumed: dict[str, int] | None = None,
) -> dict[str, pa.Array]:
    """:func:`compute_udf_columns` for the rows whose results ``store`` lacks;
    the others are read back. New results are saved before they are used.

    ``input_ids`` gives the rows' input identities; it is called only when
    something is looked up or saved (a cheap UDF's paced store saves nothing)."""
    if not specs or store is None:
        return compute_udf_columns(specs, inputs, row_ids, row_versions, udf_rows, errors)
    ids = np.asarray(row_ids.to_numpy(zero_copy_only=False), dtype=np.int64)
    vers = np.asarray(row_versions.to_numpy(zero_copy_only=False), dtype=np.int64)
    identities = input_ids or (lambda: np.full(len(ids), "", dtype=object))
    index = store.index
    pos = np.full(len(ids), -1, dtype=np.int64) if store.empty else index.lookup(ids, vers, identities())
    found = pos >= 0
    if not store.empty:
        progress.resumed(int(found.sum()))
    for c in specs:
        udf_rows.setdefault(c.name, 0)
        if resumed is not None:  # (rows a NULL input gave NULL without a call are not counted, as when computed)
            mask = getattr(c.udf, "called_rows", None) if inputs is not None and found.any() else None
            called = mask(inputs) if mask is not None else None
            resumed[c.name] = resumed.get(c.name, 0) + int((found if called is None else found & called).sum())
    names = [n for c in specs for n in (c.name, computed_marker(c.name))]
    if found.all():
        if errors is not None:
            errors.extend(index.errors_for(ids))
        return index.values(pos, names)
    todo = ~found
    batch_errors: list[dict] = []
    if found.any():  # only the rows the store lacks (a filter copies: none when every row is to compute)
        mask = pa.array(todo)
        inputs, row_ids, row_versions = (inputs.filter(mask) if inputs is not None else None,
                                         row_ids.filter(mask), row_versions.filter(mask))
    fresh = compute_udf_columns(specs, inputs, row_ids, row_versions, udf_rows, batch_errors)
    store.save(ids[todo], vers[todo], lambda: identities()[todo], fresh, batch_errors)
    if errors is not None:
        errors.extend(batch_errors)
    if not found.any():
        return fresh
    if errors is not None:
        errors.extend(index.errors_for(ids[found]))
    old = index.values(pos[found], names)
    order = np.empty(len(ids), dtype=np.int64)
    order[np.flatnonzero(found)] = np.arange(int(found.sum()))
    order[np.flatnonzero(todo)] = int(found.sum()) + np.arange(int(todo.sum()))
    return {n: pa.concat_arrays([old[n], fresh[n]]).take(pa.array(order)) for n in names}


def compute_rows(
    ds: lance.LanceDataset,
    definition: ViewDefinition,
    schema: pa.Schema,
    filter_sql: str | None,
) -> pa.Table:
    """Compute view rows over a whole dataset in this process (no Spark)."""
    udf_rows: dict[str, int] = {}
    batches = list(_compute_batches(ds, definition, schema, ds.schema, filter_sql, 8192, udf_rows))
    table = pa.Table.from_batches(batches, schema=schema)
    if definition.shuffle or definition.limit is not None:
        keys = shuffle_keys(table.column(SOURCE_ROW_ID).to_numpy(), definition.seed if definition.shuffle else None)
        order = np.lexsort((table.column(SOURCE_ROW_ID).to_numpy(), keys))
        table = table.take(pa.array(order))
        if definition.limit is not None:
            table = table.slice(0, definition.limit)
    return table


def _checkpoint_path(spec: TaskSpec) -> str | None:
    if not spec.checkpoint_dir:
        return None
    return objects.join(spec.checkpoint_dir, f"{spec.task_id}.json")


def load_checkpoint(spec: TaskSpec) -> TaskResult | None:
    path = _checkpoint_path(spec)
    raw = objects.read_text(path) if path else None
    if raw is not None:
        try:
            result = TaskResult.from_json(raw)
        except (ValueError, TypeError):  # not whole (an OS crash after its rename, before its data: not fsynced)
            return None
        result.resumed = True
        # nothing of it is computed in this run: all its rows are resumed
        for name, n in result.udf_rows.items():
            result.udf_rows_resumed[name] = result.udf_rows_resumed.get(name, 0) + n
        result.udf_rows = {name: 0 for name in result.udf_rows}
        return result
    return None


def _save_checkpoint(spec: TaskSpec, result: TaskResult) -> None:
    path = _checkpoint_path(spec)
    if not path:
        return
    # Whole or absent (a temporary file renamed), not fsynced (~2 ms of a small
    # refresh): it names view fragments Lance wrote without an fsync either, so
    # an fsync of the checkpoint alone kept nothing more across an OS crash; a
    # process crash loses nothing written. One that does not read back whole
    # counts as absent (load_checkpoint): the task runs again.
    objects.write_text(path, result.to_json(), durable=False)


def _merge_with_view(spec: TaskSpec, view_schema: pa.Schema, batches: list[pa.RecordBatch]) -> pa.Table:
    """Rows with freshly computed ``spec.recompute`` columns and every other
    column copied from the view at ``spec.view_version``."""
    fresh = pa.Table.from_batches(batches) if batches else None
    if fresh is None or fresh.num_rows == 0:
        return view_schema.empty_table()
    view = objects.dataset(spec.view_uri, version=spec.view_version)
    rewritten = {*(spec.recompute or []), *(computed_marker(c) for c in spec.recompute or [])}
    keep = [n for n in view_schema.names if n not in rewritten]
    wanted = column_ids(fresh, SOURCE_ROW_ID)
    if len(wanted) <= _BY_ID_MAX:
        chunk = ", ".join(map(str, wanted.tolist()))
        old = view.to_table(columns=keep, filter=f"{SOURCE_ROW_ID} IN ({chunk})", blob_handling=blobs.BYTES)
    else:  # many rows (a column-adding Merge moved them all): one pass over the view, its rows of ``wanted`` kept
        parts = []
        for batch in view.to_batches(columns=keep, blob_handling=blobs.BYTES):
            hit = isin(column_ids(batch, SOURCE_ROW_ID), wanted)  # pyright: ignore[reportArgumentType]  (a batch reads as a table here)
            if hit.any():
                parts.append(batch.filter(pa.array(hit)))
        old = pa.Table.from_batches(parts) if parts else view.schema.empty_table().select(keep)
    # Match by key with a positional take, not an Arrow join: joins cannot carry
    # list, struct or other nested non-key columns (embeddings).
    pos = positions(wanted, column_ids(old, SOURCE_ROW_ID))
    if (pos < 0).any():
        raise RuntimeError(f"{int((pos < 0).sum())} rows to recompute are missing from the view")
    old = old.take(pa.array(pos))
    fresh = fresh.drop_columns([SOURCE_ROW_ID])  # (the row's version: the source's now, moved or not)
    columns = {n: old.column(n) for n in keep}
    columns.update({n: fresh.column(n) for n in fresh.column_names})
    return pa.table({n: columns[n] for n in view_schema.names}).cast(view_schema)


WRITE_CHUNK_ROWS = 65_536
_BY_ID_MAX = 50_000  # rows of the view a task copies found by id (one filtered scan); more: one pass over the view


def _coalesced(batches, rows: int = WRITE_CHUNK_ROWS, max_bytes: int | None = None):
    """Consecutive batches joined into chunks of at most about ``rows`` rows
    (and ``max_bytes``), as they come: Lance writes large chunks faster (1M
    rows in 8,192-row chunks: 0.16 s; in 65,536-row chunks: 0.09 s). A batch
    already that large passes as it is."""
    group: list[pa.RecordBatch] = []
    size = nbytes = 0
    for b in batches:
        b_bytes = 0 if max_bytes is None else b.nbytes  # (summing buffer sizes is not free)
        if group and (size + b.num_rows > rows or (max_bytes is not None and nbytes + b_bytes > max_bytes)):
            yield from _joined(group)
            group, size, nbytes = [], 0, 0
        group.append(b)
        size += b.num_rows
        nbytes += b_bytes
    yield from _joined(group)


def _joined(group: list[pa.RecordBatch]):
    if len(group) == 1:
        yield group[0]
    elif group:
        yield from pa.Table.from_batches(group).combine_chunks().to_batches()


class _FragmentsScan:
    """Several fragments of a dataset read by one scanner, in order."""

    def __init__(self, ds: lance.LanceDataset, fragments: list) -> None:
        self.ds, self.fragments = ds, fragments
        self.schema = ds.schema

    def scanner(self, **kwargs):
        return self.ds.scanner(fragments=self.fragments, scan_in_order=True, **kwargs)


# The task work of the view kinds whose tasks are not scans of source
# fragments (model.kinds: one registry per layer), as
# ``work(spec, definition, source, view_schema, udf_rows, errors, resumed, stats)`` (``stats``: what
# the task says of its rows beyond their count, e.g. a join's ``rows_replaced``):
KIND_TASKS: dict[str, Callable[..., Iterator[pa.RecordBatch]]] = {
    # a table-function view: whole partitions (execution.udtf_tasks)
    "udtf": lambda spec, d, ds, schema, udf_rows, errors, resumed, stats: udtf_batches(ds, d, schema, spec.partitions or [], udf_rows),
    # an aggregate view: its groups (execution.agg_tasks)
    "aggregate": lambda spec, d, ds, schema, udf_rows, errors, resumed, stats: agg_batches(ds, d, schema, spec.kind_args),
    # joins and GROUP BY in one view: the groups of the join kept under it (its source)
    "join_aggregate": lambda spec, d, ds, schema, udf_rows, errors, resumed, stats: agg_batches(ds, d, schema,
                                                                                       spec.kind_args),
    # a join view: the joined rows of some first-table rows (execution.join_tasks)
    "join": lambda spec, d, ds, schema, udf_rows, errors, resumed, stats: join_batches(
        d, schema, spec.kind_args or {}, udf_rows, errors, join_udf_call(spec, resumed), stats),
}


def join_udf_call(spec: TaskSpec, resumed: dict[str, int] | None = None) -> Callable:
    """A join task's UDF call (:data:`mv_assets.execution.join_tasks.UdfCall`),
    checkpointed as a query view's: the rows to compute in slices of
    ``checkpoint_size`` rows (or paced by time), each slice's results saved
    before they are used, by the view row's identity (its first-table row's
    id and version, and the ids and versions of the joined rows the UDF
    reads), so a failed task's retry computes only what no checkpoint holds."""
    stores: dict[str, RowStore | None] = {}

    def call(c: ColumnSpec, inputs: pa.RecordBatch, ids: pa.Array, versions: pa.Array,
             identities: Callable[[], np.ndarray], udf_rows: dict, errors: list) -> dict[str, pa.Array]:
        if c.name not in stores:
            stores[c.name] = _row_store(spec.batch_checkpoint_dir, [c], spec.batch_resume, spec.checkpoint_seconds)
        store = stores[c.name]
        if store is None or not len(ids):
            return compute_udf_columns([c], inputs, ids, versions, udf_rows, errors)
        parts, at = [], 0
        while at < len(ids):
            n = store.pacer.next_rows() if isinstance(store, PacedRowStore) else spec.batch_size
            started = time.perf_counter()
            parts.append(checkpointed_udf_columns(
                [c], inputs.slice(at, n), ids.slice(at, n), versions.slice(at, n), udf_rows, errors, store,
                lambda at=at, n=n: identities()[at:at + n], resumed))
            if isinstance(store, PacedRowStore) and store.computed(min(n, len(ids) - at),
                                                                    time.perf_counter() - started):
                store.flush()
            at += n
        return {k: pa.concat_arrays([p[k] for p in parts]) for k in parts[0]}
    return call


def _task_batches(spec: TaskSpec, definition: ViewDefinition, ds, view_schema: pa.Schema, udf_rows: dict,
                  errors: list[dict], resumed: dict, clock: StageClock | None = None, stats: dict | None = None):
    """The task's view batches, computed as they are consumed. Parts sharing a
    predicate (whole small fragments) are read by one scan; kinds whose work
    is not such a scan by their :data:`KIND_TASKS` entry."""
    work = KIND_TASKS.get(definition.kind)
    if work is not None:
        yield from work(spec, definition, ds, view_schema, udf_rows, errors, resumed, stats)
        return
    for predicate, group in itertools.groupby(spec.parts, key=lambda part: part[1]):
        fragments = []
        for fragment_id, _, _ in group:
            fragment = ds.get_fragment(int(fragment_id))
            if fragment is None:
                raise RuntimeError(
                    f"source fragment {fragment_id} does not exist at version {spec.src_version} of {spec.src_uri}"
                )
            fragments.append(fragment)
        scan = fragments[0] if len(fragments) == 1 else _FragmentsScan(ds, fragments)
        if kind_of(definition).children:  # a chunk view: children of the parents (execution.chunk_tasks)
            yield from chunk_batches(scan, definition, view_schema, predicate, spec.batch_size, udf_rows, errors,
                                     view_uri=spec.view_uri, view_version=spec.view_version,
                                     reuse_rows=spec.reuse_rows)
            continue
        yield from _compute_batches(
            scan, definition, view_schema,
            ds.schema, predicate, spec.batch_size, udf_rows, spec.recompute, errors, spec.batch_checkpoint_dir,
            spec.batch_resume, resumed, spec.checkpoint_seconds, overlap=_overlaps(spec, definition), clock=clock,
        )


# Below this many rows a task does its steps one after the other: starting the
# threads would cost more than the overlap saves.
OVERLAP_MIN_ROWS = 8192


def _overlaps(spec: TaskSpec, definition: ViewDefinition) -> bool:
    """Whether the task reads, computes and writes at once: a query view's
    task computing UDF columns over enough rows."""
    return kind_of(definition).row_per_source_row and bool(definition.udf_columns) and spec.rows >= OVERLAP_MIN_ROWS


def run_task(spec: TaskSpec, definition_raw: bytes) -> TaskResult:
    """Compute one task and write its rows as new (uncommitted) view fragments.

    Idempotent: a task whose checkpoint exists returns the checkpointed result
    without recomputing anything.
    """
    with progress.task(spec.rows):
        done = load_checkpoint(spec)
        if done is not None:
            progress.resumed(spec.rows)  # a finished task of an interrupted run
            return done
        return _run_task(spec, definition_raw)


def _run_task(spec: TaskSpec, definition_raw: bytes) -> TaskResult:
    start = time.perf_counter()
    clock = stage_clock()  # None unless stage timings are asked for
    set_up, cpu = UDF.setup_seconds_here(), (time.process_time() if clock is not None else 0.0)
    definition = decode_definition(definition_raw)
    ds = objects.dataset(spec.src_uri, version=spec.src_version)
    # (a blob column as its bytes, large_binary marked for blob encoding: Lance's writer stores it as a blob)
    view_schema = logical_schema(objects.dataset(spec.view_uri, version=spec.view_version).schema)
    udf_rows: dict[str, int] = {c.name: 0 for c in definition.udf_columns}
    errors: list[dict] = []
    resumed: dict[str, int] = {}
    stats: dict = {}
    batches = _task_batches(spec, definition, ds, view_schema, udf_rows, errors, resumed, clock, stats)
    metas: list = []
    rows_path = None
    if spec.recompute is None and not definition.shuffle and _overlaps(spec, definition):
        # UDF columns: each batch is written while the next ones are computed (execution.pipeline)
        def write(it: Iterator[pa.RecordBatch]) -> list:
            started, waits = time.perf_counter(), StageClock()
            if clock is not None:  # the writer's waits for the next batch are not writing
                it = waits.timed_iter(it, "wait_s")
            metas = objects.write_fragments(
                pa.RecordBatchReader.from_batches(view_schema, _coalesced(it, max_bytes=OVERLAP_BATCH_BYTES)),
                spec.view_uri, schema=view_schema, max_rows_per_file=spec.max_rows_per_file)
            if clock is not None:
                clock.add("write_s", time.perf_counter() - started - waits.seconds.get("wait_s", 0.0))
            return metas

        metas = write_behind(batches, write)
        rows_written = sum(int(f.physical_rows or 0) for f in metas)
    else:
        # Computed first, then written: streaming the batches into Lance's writer was
        # slower for plain columns (its threads pull them from Python: 1M rows 0.18 s vs 0.14 s).
        if spec.recompute is None:
            table = pa.Table.from_batches(_coalesced(batches), schema=view_schema)
        else:
            table = _merge_with_view(spec, view_schema, list(batches))
        rows_written = table.num_rows
        written = time.perf_counter()
        if table.num_rows and definition.shuffle:
            # A shuffled view is written in one global order at the commit (see
            # refresh.shuffled_fragments): hand the rows over, not view files.
            rows_path = objects.join(spec.checkpoint_dir or spec.view_uri.rsplit("/", 1)[0],
                                     f"{spec.task_id}.rows.arrow")
            objects.write_arrow(rows_path, table)
        elif table.num_rows:
            metas = objects.write_fragments(table, spec.view_uri, schema=view_schema,
                                            max_rows_per_file=spec.max_rows_per_file)
        if clock is not None:
            clock.add("write_s", time.perf_counter() - written)
    result = TaskResult(
        task_id=spec.task_id,
        metas=metas,
        rows_written=rows_written,
        udf_rows=udf_rows,
        udf_rows_resumed=resumed,
        seconds=time.perf_counter() - start,
        worker_pid=os.getpid(),
        errors=errors,
        rows_path=rows_path,
        stages=_stages(clock, set_up, cpu),
        rows_replaced=int(stats.get("rows_replaced", 0)),
        first_fragments=list(stats.get("first_fragments", [])),
    )
    if _worth_a_checkpoint(spec, definition, result):
        _save_checkpoint(spec, result)
    return result


def _stages(clock: StageClock | None, set_up: float, cpu: float) -> dict[str, float]:
    """A task's stage timings (empty unless asked for): the UDFs' set-up made
    in the task (``UDF.setup_seconds_here()`` was ``set_up`` at its start)
    moved out of ``udf_s`` into ``setup_s``, and its CPU seconds since ``cpu``."""
    if clock is None:
        return {}
    setup = UDF.setup_seconds_here() - set_up  # made in the task's first UDF call: not the UDF's steady time
    if "udf_s" in clock.seconds:
        clock.add("udf_s", -setup)
    if setup or "udf_s" in clock.seconds:
        clock.add("setup_s", setup)
    clock.add("cpu_s", time.process_time() - cpu)
    return dict(clock.seconds)


def _worth_a_checkpoint(spec: TaskSpec, definition: ViewDefinition, result: TaskResult) -> bool:
    """Whether a finished task saves its checkpoint. Not a task that took less
    than a checkpoint's worth of time, of a view without UDF columns or
    chunker, or the only task of its refresh: computing it again after a crash
    costs less than the checkpoint's write and removal cost every refresh (~1-2 ms)."""
    quick = spec.checkpoint_seconds is not None and result.seconds < spec.checkpoint_seconds
    return not quick or bool((definition.udf_columns or definition.function) and not spec.only_task)
