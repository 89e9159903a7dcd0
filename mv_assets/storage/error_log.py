"""The catalog's errors table: one record per row a UDF failed on.

Records are keyed by the *stable* row id (for a view: the source row id the
view row is keyed by), never by a physical address, so they stay meaningful
after compaction. The table is a Lance dataset at
``<catalog>/_mv_assets/errors.lance``; appends from concurrent jobs commit
independently.
"""

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import lance
import pyarrow as pa

from mv_assets.model.definition import sql_literal
from mv_assets.model.errors import UdfError
from mv_assets.model.names import PRIMARY_KEY_METADATA_KEY
from mv_assets.storage import objects
from mv_assets.storage.lance_compat import take_rows
from mv_assets.storage.layout import Layout

__all__ = ["ErrorRecord", "ERRORS_SCHEMA", "append_errors", "read_errors", "rename_errors", "record_failure",
           "failures_unrecorded"]

ERRORS_SCHEMA = pa.schema(
    [
        pa.field("job_id", pa.string(), nullable=False),
        pa.field("table", pa.string(), nullable=False),
        pa.field("column", pa.string(), nullable=False),
        pa.field("udf_name", pa.string()),
        pa.field("udf_fingerprint", pa.string()),
        pa.field("row_id", pa.int64(), nullable=False),
        pa.field("row_version", pa.int64()),
        pa.field("error_type", pa.string()),
        pa.field("message", pa.string()),
        pa.field("traceback", pa.string()),
        pa.field("attempts", pa.int32()),
        pa.field("created_at", pa.timestamp("us", tz="UTC")),
    ]
)


@dataclass(frozen=True)
class ErrorRecord:
    """A row a UDF failed on: which job, column, UDF version and stable row id."""

    job_id: str
    table: str
    column: str
    udf_name: str | None
    udf_fingerprint: str | None
    row_id: int
    row_version: int | None
    error_type: str | None
    message: str | None
    traceback: str | None
    attempts: int | None
    created_at: object


def errors_uri(layout: Layout) -> str:
    return layout.errors_uri()


def append_errors(layout: Layout, table: str, job_id: str, records: list[dict]) -> int:
    """Append error records (dicts from the executors); returns how many.
    Those the job recorded already are not appended again: a refresh stopped
    between recording its errors and its commit is run again under the same
    job id, and its errors were counted twice."""
    records = _not_recorded(layout, table, job_id, records)
    if not records:
        return 0
    now = pa.scalar(int(time.time() * 1_000_000), pa.timestamp("us", tz="UTC"))
    rows = {name: [] for name in ERRORS_SCHEMA.names}
    for r in records:
        for name in ERRORS_SCHEMA.names:
            if name == "job_id":
                rows[name].append(job_id)
            elif name == "table":
                rows[name].append(table)
            elif name == "created_at":
                rows[name].append(now.as_py())
            else:
                rows[name].append(r.get(name))
    data = pa.table(rows, schema=ERRORS_SCHEMA)
    uri = errors_uri(layout)
    mode = "append" if objects.is_dataset(uri) else "create"
    try:
        objects.write_dataset(data, uri, schema=ERRORS_SCHEMA, mode=mode)
    except OSError:
        if mode != "create":
            raise
        objects.write_dataset(data, uri, schema=ERRORS_SCHEMA, mode="append")  # created concurrently
    return data.num_rows


def _not_recorded(layout: Layout, table: str, job_id: str, records: list[dict]) -> list[dict]:
    """Of ``records``, those the errors table holds no record of for this job
    (same column, row id and row version)."""
    uri = errors_uri(layout)
    if not records or not objects.is_dataset(uri):
        return records
    held = objects.dataset(uri).to_table(
        columns=["column", "row_id", "row_version"],
        filter=f"`table` = {sql_literal(table)} AND job_id = {sql_literal(job_id)}").to_pylist()
    if not held:
        return records
    seen = {(h["column"], h["row_id"], h["row_version"]) for h in held}
    return [r for r in records if (r.get("column"), r.get("row_id"), r.get("row_version")) not in seen]


_FAILURES_RECORDED = contextvars.ContextVar("mv_assets_failures_recorded", default=True)


@contextmanager
def failures_unrecorded() -> Iterator[None]:
    """Meanwhile (in this thread), a UDF failure that stops a job is named in
    its error but not written to the errors table: a view created with data
    whose first refresh fails is dropped, and bad input leaves nothing behind
    (not even in the errors table's history)."""
    token = _FAILURES_RECORDED.set(False)
    try:
        yield
    finally:
        _FAILURES_RECORDED.reset(token)


def record_failure(
    layout: Layout, table: str, job_id: str, error: UdfError, rows: lance.LanceDataset, rows_of: str
) -> None:
    """A UDF failure that stops a job (on_error "fail"): name it after ``table``
    and the row's primary key value (read from ``rows``, the dataset the row ids
    belong to: ``rows_of``), and record the failed row like a skipped one."""
    key = None
    pk = (rows.schema.metadata or {}).get(PRIMARY_KEY_METADATA_KEY.encode())
    if pk and error.row_id is not None and error.rows == 1:
        try:
            value = take_rows(rows, [error.row_id], [pk.decode()]).column(0)
            key = (pk.decode(), value[0].as_py()) if len(value) else None
        except (OSError, ValueError) as exc:  # the row is gone: the row id alone names it
            error.add_note(f"primary key of row {error.row_id} not found: {exc}")
    error.attribute(table=table, rows_of=rows_of, key=key)
    if _FAILURES_RECORDED.get():
        append_errors(layout, table, job_id, [error.record()])


def drop_errors(layout: Layout, table: str, columns: list[str] | None = None) -> None:
    """Forget the error records of a dropped table or view, or (``columns``)
    of its dropped columns (a new one of the same name starts clean)."""
    uri = errors_uri(layout)
    if objects.is_dataset(uri):
        ds, where = objects.dataset(uri), f"`table` = {sql_literal(table)}"
        if columns is not None:
            if not columns:
                return
            where += f" AND `column` IN ({', '.join(sql_literal(c) for c in columns)})"
        if ds.count_rows(where):  # (a delete that matches nothing still commits a version)
            ds.delete(where)


def rename_errors(layout: Layout, table: str, renamed: dict[str, str]) -> None:
    """The error records of a table's renamed columns (``{old: new}``), under
    their new names: a column's failures follow it, and one added later
    under the old name starts clean."""
    uri = errors_uri(layout)
    if not renamed or not objects.is_dataset(uri):
        return
    ds = objects.dataset(uri)
    for old, new in renamed.items():
        where = f"`table` = {sql_literal(table)} AND `column` = {sql_literal(old)}"
        if ds.count_rows(where):  # (an update that matches nothing still commits a version)
            ds.update({"column": sql_literal(new)}, where=where)


def read_errors(
    layout: Layout,
    table: str | None = None,
    *,
    job_id: str | None = None,
    column: str | None = None,
    error_type: str | None = None,
) -> list[ErrorRecord]:
    """Error records matching every given filter, oldest first."""
    uri = errors_uri(layout)
    if not objects.is_dataset(uri):
        return []
    parts = []
    for name, value in (("table", table), ("job_id", job_id), ("column", column), ("error_type", error_type)):
        if value is not None:
            parts.append(f"`{name}` = {sql_literal(value)}")
    data = objects.dataset(uri).to_table(filter=" AND ".join(parts) or None)
    data = data.sort_by([("created_at", "ascending"), ("row_id", "ascending")])
    return [ErrorRecord(**r) for r in data.to_pylist()]
