"""Executor side of a backfill: the tasks runners run for ``ops.backfill``,
named by the ``*_TASK`` references (``module:function``, resolved on the
executor), and what they share with the driver's planning and commit.

* :func:`run_fused_task` (``FUSED_TASK``): one pass, for UDF columns:
  per fragment, compute the rows that need it and write the fragment's new
  column file, results checkpointed by time and row identity.
* :func:`run_compute_task` (``COMPUTE_TASK``): the staged path's compute
  stage: checkpoint batches of results, skipping those already saved.
* :func:`run_write_task` (``WRITE_TASK``): the staged path's write stage:
  one fragment's new column file from checkpoint batches.

Tasks take a JSON payload and the job's shared bytes, return JSON, and open
Lance themselves; nothing here imports ``ops``.
"""

import concurrent.futures
import functools
import json
import os
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
from lance.fragment import DataFile, FragmentMetadata

from mv_assets.execution import blobs, progress
from mv_assets.execution.pipeline import prefetched
from mv_assets.execution.tasks import (
    OVERLAP_BATCH_BYTES,
    PacedRowStore,
    checkpointed_udf_columns,
    compute_udf_columns,
    input_identity,
    paced,
    repeat_string,
    udf_batch_rows,
    without_inputs,
)
from mv_assets.model.definition import (
    SOURCE_ROW_ID,
    SOURCE_ROW_VERSION,
    ColumnSpec,
    computed_marker,
    is_marker,
)
from mv_assets.model.markers import stamp
from mv_assets.model.names import Alias, input_alias, input_marker_alias
from mv_assets.model.planning import column_ids as _ids
from mv_assets.model.planning import positions
from mv_assets.storage import checkpoints as ckpt
from mv_assets.storage import objects
from mv_assets.storage.checkpoints import CheckpointStore
from mv_assets.storage.lance_compat import field_ids, take_rows, with_filter_columns

__all__ = [
    "COMPUTE_TASK", "WRITE_TASK", "FUSED_TASK", "run_compute_task", "run_write_task", "run_fused_task",
    "input_columns", "read_rows", "write_fragment_file", "column_field_ids",
]

COMPUTE_TASK = "mv_assets.execution.backfill_tasks:run_compute_task"
WRITE_TASK = "mv_assets.execution.backfill_tasks:run_write_task"
FUSED_TASK = "mv_assets.execution.backfill_tasks:run_fused_task"

_IN_ID, _IN_VER = Alias.INPUT_ID, Alias.INPUT_VERSION
_IN_ADDR = Alias.INPUT_ADDRESS  # address of the input row at the input version (to read it fast)
_TARGET_ADDR = Alias.TARGET_ADDRESS


def input_columns(specs: list[ColumnSpec], schema: pa.Schema) -> list[str]:
    """The columns the UDFs of ``specs`` read, each once (a UDF reading the
    whole row: every column but markers and a view's source identity)."""
    cols: list[str] = []
    for c in specs:
        if c.udf is None:
            continue
        needed = c.udf.input_columns or [
            n for n in schema.names if not is_marker(n) and n not in (SOURCE_ROW_ID, SOURCE_ROW_VERSION)
        ]
        for n in needed:
            if n not in cols:
                cols.append(n)
    return cols


# -- staged path: compute stage ---------------------------------------------


def run_compute_task(payload: str, shared: bytes) -> str:
    """Executor side: compute the batches of one task (skipping checkpointed ones)."""
    start = time.perf_counter()
    task = json.loads(payload)
    job = json.loads(shared)
    specs = [ColumnSpec.from_json(c) for c in job["specs"]]
    store = CheckpointStore(job["checkpoint_dir"])
    plan_rows = objects.read_arrow(job["plan_path"])
    ds = objects.dataset(job["input_uri"], version=job["input_version"])
    inputs = input_columns(specs, ds.schema)
    udf_rows: dict[str, int] = {}
    errors: list[dict] = []
    resumed = computed = resumed_rows = 0
    todo = []
    for key, lo, hi in task["batches"]:
        if store.has(key):
            errors.extend(store.read(key)[1])
            resumed += 1
            resumed_rows += hi - lo
            progress.resumed(hi - lo)  # (not among the rows planned: those are the rows to compute)
        else:
            todo.append((key, lo, hi))
    if todo:
        # Read the inputs of every batch still to do in one pass (a scan per
        # fragment), then compute and checkpoint batch by batch.
        columns = {specs[0].name: specs[0].expr} if specs[0].kind == "sql" else inputs
        taken = read_rows(ds, columns, pa.concat_tables([plan_rows.slice(lo, hi - lo) for _, lo, hi in todo]))
        taken_ids = _ids(taken, "_rowid")
        order = np.argsort(taken_ids, kind="stable")
        index = (taken, taken_ids[order], order)
        for key, lo, hi in todo:
            ids, vers, ins, values, errs = _compute_batch(
                ds, specs, inputs, plan_rows.slice(lo, hi - lo), udf_rows, index, not job.get("is_view", False)
            )
            store.save(ids, vers, ins, values, errs, key=key)
            errors.extend(errs)
            computed += 1
            progress.advance(hi - lo)
    return json.dumps(
        {
            "udf_rows": sum(udf_rows.get(c.name, 0) for c in specs[:1]),
            "errors": errors,
            "resumed": resumed,
            "rows_resumed": resumed_rows,
            "computed": computed,
            "seconds": time.perf_counter() - start,
            "pid": os.getpid(),
        }
    )


def read_rows(ds: lance.LanceDataset, columns: list[str] | dict, batch_rows: pa.Table) -> pa.Table:
    """The input rows of a batch (and ``_rowid``), in any order.

    Dense runs of addresses within a fragment are read with a range scan of
    that fragment (several times faster than a take); scattered rows by
    stable row id. A SQL column's expression (``columns`` a dict) failing in
    a range scan is evaluated again on the batch's own rows only (taken by
    id): the range held rows it fails on that are not the backfill's (rows
    outside a view, rows ``where=`` left out)."""
    addrs = _ids(batch_rows, _IN_ADDR)
    frags = addrs >> 32
    parts, scattered = [], []
    for fid in np.unique(frags):
        sel = frags == fid
        a = addrs[sel]
        lo, hi = int(a.min()), int(a.max())
        if hi - lo + 1 <= 2 * len(a):
            fragment = ds.get_fragment(int(fid))
            try:
                parts.append(ds.scanner(
                    columns=columns if isinstance(columns, dict) else list(columns), with_row_id=True,
                    filter=f"_rowaddr >= {lo} AND _rowaddr <= {hi}", fragments=[fragment],
                    blob_handling=blobs.BYTES,
                ).to_table())
                continue
            except (ValueError, OSError, pa.ArrowException):
                if not isinstance(columns, dict) or hi - lo + 1 == len(a):  # (every row of the range is the batch's)
                    raise
        scattered.append(batch_rows.column(_IN_ID).filter(pa.array(sel)))
    if scattered:
        ids = pa.concat_arrays([c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in scattered])
        cols = {**columns, "_rowid": "_rowid"} if isinstance(columns, dict) else list(columns) + ["_rowid"]
        parts.append(take_rows(ds, ids, cols))
    return pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]


def _compute_batch(
    ds: lance.LanceDataset, specs: list[ColumnSpec], inputs: list[str], batch_rows: pa.Table, udf_rows: dict,
    index: tuple[pa.Table, np.ndarray, np.ndarray], versioned: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, pa.Array], list[dict]]:
    """Results of one checkpoint batch: input identity (ids, versions, input
    markers), values with their markers, errors.

    ``index`` is the task's input rows (read once) with their ids sorted. The
    input dataset is pinned at the version the plan checked identities
    against, so a row id found there has the planned row version; rows not
    found (deleted since) are left out. (Reading _row_last_updated_at_version
    by id trips a Lance projection bug after updates.)"""
    ids = batch_rows.column(_IN_ID)
    vers = batch_rows.column(_IN_VER)
    taken, sorted_ids, order = index
    want_ids = ids.to_numpy()
    if len(sorted_ids):
        p = np.minimum(np.searchsorted(sorted_ids, want_ids), len(sorted_ids) - 1)
        pos = np.where(sorted_ids[p] == want_ids, order[p], -1)
    else:
        pos = np.full(len(want_ids), -1, dtype=np.int64)
    matched = pos >= 0
    take_idx = pa.array(pos[matched])
    errors: list[dict] = []
    keep = pa.array(matched)
    m_ids, m_vers = ids.filter(keep), vers.filter(keep)
    m_ins = np.asarray(batch_rows.column(ckpt.INPUTS).filter(keep).to_pylist(), dtype=object)
    columns: dict[str, pa.Array] = {}
    if specs[0].kind == "sql":
        spec = specs[0]
        columns[spec.name] = taken.column(spec.name).take(take_idx).combine_chunks()
        columns[computed_marker(spec.name)] = repeat_string(spec.fingerprint, len(m_ids))
    else:
        input_batch = pa.RecordBatch.from_arrays(
            [taken.column(c).take(take_idx).combine_chunks() for c in inputs], names=inputs
        ) if inputs else pa.RecordBatch.from_pydict({})
        columns.update(compute_udf_columns(specs, input_batch, m_ids, m_vers, udf_rows, errors))
    if versioned:  # a table's markers name the row version the inputs were read at
        for spec in specs:
            columns[computed_marker(spec.name)] = stamp(columns[computed_marker(spec.name)], m_vers)
    as_int = (lambda a: np.asarray(a.to_numpy(zero_copy_only=False), dtype=np.int64))  # noqa: E731
    return as_int(m_ids), as_int(m_vers), m_ins, columns, errors


# -- writing a fragment's column file ------------------------------------------


def column_field_ids(ds: lance.LanceDataset, names: list[str]) -> tuple[list[int], set[int]]:
    """Leaf field ids of ``names`` (what a data file lists) and all their ids."""
    walked = field_ids(ds, names)
    return [i for i, leaf in walked if leaf], {i for i, _ in walked}


def write_fragment_file(
    ds: lance.LanceDataset, fragment_id: int, names: list[str], offsets: np.ndarray, values: pa.Table,
    nulls: list[str] | None = None,
) -> FragmentMetadata:
    """A new data file with ``names`` for every physical row of the fragment:
    ``values`` at ``offsets``, current values elsewhere (deleted rows NULL).
    ``nulls``: more columns (markers of columns computed from these), NULL at
    ``offsets``, as they are elsewhere."""
    extra = [n for n in nulls or [] if n not in names and n in ds.schema.names]
    if extra:
        values = values.select(names)
        for n in extra:
            values = values.append_column(ds.schema.field(n), pa.nulls(values.num_rows, ds.schema.field(n).type))
        names = names + extra
    frag = ds.get_fragment(fragment_id)
    if frag is None:
        raise RuntimeError(f"fragment {fragment_id} of {ds.uri} disappeared while writing a column")
    meta = frag.metadata
    physical = meta.physical_rows
    schema = pa.schema([ds.schema.field(n) for n in names])
    if len(offsets) == physical:  # every physical row written: nothing to keep
        full = values.select(names).cast(schema)
    else:
        current = frag.to_table(columns=names, with_row_address=True)
        cur_off = (_ids(current, "_rowaddr") & 0xFFFFFFFF).astype(np.int64)
        idx = np.full(physical, -1, dtype=np.int64)
        idx[cur_off] = np.arange(len(cur_off))
        idx[offsets] = len(cur_off) + np.arange(len(offsets))
        combined = pa.concat_tables([current.select(names).cast(schema), values.select(names).cast(schema)])
        full = combined.take(pa.array(idx, mask=idx < 0))
    name = f"{uuid.uuid4().hex}.lance"
    path = objects.join(ds.uri, "data", name)
    version = ds.data_storage_version
    with objects.file_writer(path, schema, version=version) as writer:
        for b in full.to_batches(max_chunksize=65_536):
            writer.write_batch(b)
    leaves, every = column_field_ids(ds, names)
    major, minor = (int(x) for x in version.split("."))
    files = []
    for d in meta.files:
        fields = [(-2 if f in every else f) for f in d.fields]
        if all(f == -2 for f in fields):
            continue  # every column of this file is replaced
        files.append(DataFile(d.path, fields, d.column_indices, d.file_major_version, d.file_minor_version,
                              d.file_size_bytes, d.base_id))
    files.append(DataFile(name, leaves, list(range(len(leaves))), major, minor, objects.size(path)))
    meta.files = files
    return meta


# -- staged path: write stage ----------------------------------------------------


def run_write_task(payload: str, shared: bytes) -> str:
    """Executor side: write one fragment's new column file from checkpoint batches."""
    task, job = json.loads(payload), json.loads(shared)
    ds = objects.dataset(job["uri"], version=job["version"])
    assign = objects.read_arrow(task["assign"])
    batch = assign.column("batch").to_numpy()
    row = assign.column("row").to_numpy()
    needed = np.unique(batch)
    index = CheckpointStore(job["checkpoint_dir"]).index([job["keys"][int(b)] for b in needed])
    # positions in the index: the needed files are concatenated in order
    sizes = np.array([t.num_rows for t in index.tables], dtype=np.int64)
    base = np.zeros(int(needed.max()) + 1, dtype=np.int64)
    base[needed] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    values = pa.table(index.values(base[batch] + row, job["names"]))
    meta = write_fragment_file(ds, task["fragment_id"], job["names"], assign.column("offset").to_numpy(), values,
                               job.get("nulls"))
    progress.advance(assign.num_rows)
    return json.dumps(meta.to_json())


# -- one pass: compute and write per fragment, checkpoints by time -------------


def run_fused_task(payload: str, shared: bytes) -> str:
    """Executor side, one pass: for each fragment, compute the column for its
    rows that need it and write the fragment's new column file (values handed
    to Lance in memory, not through checkpoint files).

    UDF results are checkpointed by time and by row identity (stable id, row
    version, markers of computed inputs: the refresh's row store): a cheap UDF
    writes no checkpoint, an expensive one saves every
    ``$MV_ASSETS_CHECKPOINT_SECONDS`` of work, and a run after a crash or a
    commit conflict finds those results whatever fragments the rows are in.
    A view's rows are identified by their source row, whose inputs are read
    from the source at the version the plan matched them at."""
    task, job = json.loads(payload), json.loads(shared)
    start = time.perf_counter()
    specs = [ColumnSpec.from_json(c) for c in job["specs"]]
    ds = objects.dataset(job["uri"], version=job["version"])
    store = PacedRowStore(job["rows_dir"], specs, True, job["checkpoint_seconds"])
    udf_rows: dict[str, int] = {}
    errors: list[dict] = []
    resumed: dict[str, int] = {}
    parts = _view_input_batches(task, job, specs) if "plan_path" in job else _table_input_batches(ds, task, job, specs)

    def read():
        """(fragment, inputs, identity, batch) per batch, then batch None at the fragment's end."""
        for fid, inputs, batches, identity in parts:
            for batch in paced(batches, store, udf_batch_rows(specs), OVERLAP_BATCH_BYTES):
                yield fid, inputs, identity, batch
            yield fid, inputs, identity, None

    # Overlapped (execution.pipeline): the next batches are read while the UDF
    # runs, and a fragment's column file is written while the next one computes.
    fragments: list[dict] = []
    writing: concurrent.futures.Future | None = None
    out, offsets = [], []
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mv_assets-write") as writer:
        for fid, inputs, identity, batch in prefetched(read()):
            if batch is None:  # the fragment is computed: write its file
                if out:
                    if writing is not None:
                        fragments.append(writing.result().to_json())
                    writing = writer.submit(write_fragment_file, ds, fid, job["names"], np.concatenate(offsets),
                                            pa.concat_tables(out), job.get("nulls"))
                out, offsets = [], []
                continue
            if batch.num_rows == 0:
                continue
            started = time.perf_counter()
            values = checkpointed_udf_columns(
                specs, pa.RecordBatch.from_arrays([batch.column(input_alias(c)) for c in inputs], names=inputs),
                batch.column("_rowid").cast(pa.int64()), batch.column(Alias.ROW_VERSION).cast(pa.int64()),
                udf_rows, errors, store,
                functools.partial(identity, without_inputs(batch, [input_alias(c) for c in inputs])), resumed,
            )
            if store.computed(batch.num_rows, time.perf_counter() - started):
                store.flush()
            progress.advance(batch.num_rows)
            if "plan_path" not in job:  # a table's markers name the row version the inputs were read at
                for spec in specs:
                    marker = computed_marker(spec.name)
                    values[marker] = stamp(values[marker], batch.column(Alias.ROW_VERSION).cast(pa.int64()))
            out.append(pa.table({n: values[n] for n in job["names"]}))
            offsets.append((_ids(batch, "_rowaddr") & 0xFFFFFFFF).astype(np.int64))
        if writing is not None:
            fragments.append(writing.result().to_json())
    return json.dumps({
        "fragments": fragments, "udf_rows": udf_rows.get(specs[0].name, 0),
        "resumed": resumed.get(specs[0].name, 0), "errors": errors, "seconds": time.perf_counter() - start,
    })


def _table_input_batches(ds: lance.LanceDataset, task: dict, job: dict, specs: list[ColumnSpec]):
    """Per fragment of a table: (id, input columns, scanned batches of its rows
    to compute, input identity of a batch)."""
    inputs = input_columns(specs, ds.schema)
    computed_inputs = [c for c in inputs if computed_marker(c) in ds.schema.names]
    projection = {input_alias(c): f"`{c}`" for c in inputs}
    projection.update({input_marker_alias(c): f"`{computed_marker(c)}`" for c in computed_inputs})
    projection[Alias.ROW_VERSION] = "_row_last_updated_at_version"
    for fid in task["fragments"]:
        fragment = ds.get_fragment(int(fid))
        if fragment is None:
            raise RuntimeError(f"fragment {fid} of {ds.uri} disappeared while backfilling")
        columns = with_filter_columns(projection, job["predicate"])
        scanner = fragment.scanner(
            columns=columns, filter=job["predicate"], with_row_id=True, with_row_address=True,
            blob_handling=blobs.BYTES, **blobs.scan_options(fragment, columns, job["predicate"], 8192),
        )
        yield int(fid), inputs, scanner.to_batches(), functools.partial(input_identity, computed_inputs=computed_inputs)


def _identity_of_plan(batch: pa.RecordBatch) -> np.ndarray:
    return np.asarray(batch.column(ckpt.INPUTS).to_pylist(), dtype=object)


def _view_input_batches(task: dict, job: dict, specs: list[ColumnSpec]):
    """Per view fragment of the task's plan rows (sorted by view address): its
    rows with their inputs read from the source at the plan's version (range
    scans of dense runs, else by stable id), identified by their source row."""
    plan = objects.read_arrow(job["plan_path"]).slice(task["lo"], task["hi"] - task["lo"])
    src = objects.dataset(job["input_uri"], version=job["input_version"])
    inputs = input_columns(specs, src.schema)
    taken = read_rows(src, {input_alias(c): f"`{c}`" for c in inputs}, plan)
    pos = positions(_ids(plan, _IN_ID), _ids(taken, "_rowid"))
    if (pos < 0).any():
        raise RuntimeError(f"{int((pos < 0).sum())} source rows of the plan are missing at version {src.version}")
    taken = taken.take(pa.array(pos))
    rows = pa.table({
        **{input_alias(c): taken.column(input_alias(c)) for c in inputs},
        "_rowid": plan.column(_IN_ID), Alias.ROW_VERSION: plan.column(_IN_VER),
        "_rowaddr": plan.column(_TARGET_ADDR), ckpt.INPUTS: plan.column(ckpt.INPUTS),
    })
    fids = _ids(plan, _TARGET_ADDR) >> 32
    for fid in task["fragments"]:
        sel = np.flatnonzero(fids == fid)
        if len(sel):
            part = rows.slice(int(sel[0]), len(sel))
            yield int(fid), inputs, part.to_batches(max_chunksize=8192), _identity_of_plan
