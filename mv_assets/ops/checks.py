"""Consistency checks of a view against its source (engine code, no dagster).

Each check returns a :class:`CheckOutcome`; the Dagster layer turns them into
asset check results.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.model.definition import SOURCE_ROW_ID, SOURCE_ROW_VERSION, computed_marker, stored_columns
from mv_assets.model.markers import ROW_VERSION_COLUMN, stale_sql
from mv_assets.model.names import CHUNK_INDEX, PARTITION, Alias
from mv_assets.model.planning import column_ids as _ids
from mv_assets.model.planning import isin, positions, select_limited
from mv_assets.model.udtf_view import WHOLE_SOURCE, partition_key
from mv_assets.storage import objects
from mv_assets.storage.error_log import read_errors
from mv_assets.storage.refs import TableRef, ViewRef
from mv_assets.storage.state import read_refresh_state

__all__ = ["CheckOutcome", "check_view", "check_computed_columns"]


@dataclass
class CheckOutcome:
    name: str
    passed: bool
    description: str
    metadata: dict = field(default_factory=dict)


def check_view(view: ViewRef) -> list[CheckOutcome]:
    """Run every check on ``view`` at the source version it reflects."""
    definition = view.definition
    if definition.kind == "udtf":
        return _udtf_checks(view)
    if definition.kind == "aggregate":
        return _agg_checks(view)
    state = read_refresh_state(view.dataset())
    version = state.source_version or view.source_dataset().version
    src = objects.dataset(view.source_uri, version=version)
    view_tbl = view.dataset().to_table(columns=[SOURCE_ROW_ID] + [c.name for c in definition.udf_columns])
    keys = _ids(view_tbl, SOURCE_ROW_ID)
    out: list[CheckOutcome] = []

    all_ids = _ids(src.to_table(columns=[], with_row_id=True), "_rowid")
    orphans = keys[~isin(keys, all_ids)]
    out.append(
        CheckOutcome(
            "no_orphan_rows",
            len(orphans) == 0,
            f"every view row has its source row at source version {version}",
            {"orphan_rows": int(len(orphans)), "sample": [int(x) for x in orphans[:10]]},
        )
    )

    if state.source_version is None:
        out.append(
            CheckOutcome(
                "matches_source_query",
                True,
                "not checked: the view has only been refreshed partition by partition so far",
                {"view_rows": int(len(keys))},
            )
        )
    elif definition.kind == "chunker":
        out.append(_chunks_match_query(view, src, keys, version))
    else:
        expected = _ids(src.to_table(columns=[], filter=definition.filter, with_row_id=True), "_rowid")
        if definition.limit is not None:
            expected = select_limited(expected, definition.limit, definition.seed if definition.shuffle else None)
        missing = expected[~isin(expected, keys)]
        extra = keys[~isin(keys, expected)]
        dupes = int(len(keys) - len(np.unique(keys)))
        out.append(
            CheckOutcome(
                "matches_source_query",
                len(missing) == 0 and len(extra) == 0 and dupes == 0,
                f"row count and key set equal the view query over the source at version {version}",
                {
                    "expected_rows": int(len(expected)),
                    "view_rows": int(len(keys)),
                    "missing": int(len(missing)),
                    "extra": int(len(extra)),
                    "duplicates": dupes,
                },
            )
        )

    out.append(_values_match_source(view, src, state, version))

    missing_values: dict[str, int] = {}
    for spec in definition.udf_columns:
        col = view_tbl.column(spec.name)
        if col.null_count == 0:
            missing_values[spec.name] = 0
            continue
        null_keys = keys[col.is_null().to_numpy(zero_copy_only=False)]
        inputs = spec.udf.input_columns if spec.udf is not None else []
        if not inputs or not spec.the_udf.skip_nulls:
            missing_values[spec.name] = int(len(null_keys))
            continue
        rows = src.to_table(
            columns=inputs, filter=f"_rowid IN ({', '.join(str(int(k)) for k in null_keys)})", with_row_id=True
        )
        has_all = np.ones(rows.num_rows, dtype=bool)
        for c in inputs:
            has_all &= ~rows.column(c).is_null().to_numpy(zero_copy_only=False)
        missing_values[spec.name] = int(has_all.sum())
    if definition.kind == "chunker":  # its added columns are computed from its own rows (as a table's)
        missing_values.update(_row_columns_missing(view.dataset()))
    out.append(
        CheckOutcome(
            "udf_values_present",
            all(v == 0 for v in missing_values.values()),
            "no UDF value is missing where its inputs are present",
            {"missing_by_column": missing_values},
        )
    )
    return out


def _row_columns_missing(ds) -> dict[str, int]:
    """Rows of each UDF column computed from the dataset's own rows (a chunk
    view's) without a current value: never computed, failed, or computed by
    other code or for an older version of the row."""
    out = {}
    for spec in stored_columns(ds.schema):
        if spec.kind == "udf":
            # (the row version is projected: Lance 14 errs on a filter naming it after compaction otherwise)
            stale = ds.to_table(columns={Alias.ROW_VERSION: "_row_last_updated_at_version"},
                                filter=stale_sql(spec.name, spec.fingerprint, versioned=True))
            out[spec.name] = stale.num_rows
    return out


def _udtf_checks(view: ViewRef) -> list[CheckOutcome]:
    """A table-function view's checks: its rows are a partition's output, not
    one per source row. ``no_orphan_rows``: every partition the view holds
    rows of has passing source rows at the version it reflects;
    ``values_match_source``: no view row was written outside a refresh. (A
    partition with rows and no view rows may have given an empty output: the
    UDTF is not run again to tell.)"""
    udtf = view.definition.table_function
    state = read_refresh_state(view.dataset())
    version = state.source_version or view.source_dataset().version
    src = objects.dataset(view.source_uri, version=version)
    held = set(view.dataset().to_table(columns=[PARTITION]).column(PARTITION).unique().to_pylist())
    by = udtf.partition_by
    if by is None:
        have = {WHOLE_SOURCE} if src.count_rows(filter=view.definition.filter) else set()
    else:
        values = src.to_table(columns=[by], filter=view.definition.filter).column(by).unique()
        have = {partition_key(v) for v in values.to_pylist()}
    orphans = sorted(held - have)
    written = 0
    if state.view_version is not None:
        written = view.dataset().count_rows(
            filter=f"_row_created_at_version > {int(state.view_version)} "
                   f"OR _row_last_updated_at_version > {int(state.view_version)}")
    return [
        CheckOutcome("no_orphan_rows", not orphans,
                     f"every partition the view holds rows of has passing source rows at version {version}",
                     {"partitions_in_view": len(held), "orphan_partitions": len(orphans), "sample": orphans[:10]}),
        CheckOutcome("values_match_source", written == 0, "no view row was written outside a refresh",
                     {"rows_written_outside_refreshes": written}),
    ]


def _agg_checks(view: ViewRef) -> list[CheckOutcome]:
    """An aggregate view's checks. ``no_orphan_rows``: every group the view
    holds has passing source rows at the version it reflects;
    ``values_match_source``: every group's key, aggregates and hidden state
    equal the aggregate recomputed from scratch over the source at that
    version (float sums and averages to a relative 1e-9; NaN equals NaN,
    infinities compare exactly), and no group is missing or extra."""
    from mv_assets.execution.agg_tasks import groups_from_rows
    from mv_assets.model.agg_view import GROUP, Aggregate

    agg = Aggregate.from_definition(view.definition)
    view_ds = view.dataset()
    state = read_refresh_state(view_ds)
    version = state.source_version or view.source_dataset().version
    src = objects.dataset(view.source_uri, version=version)
    expected = groups_from_rows(src.to_table(columns=agg.input_columns, filter=view.definition.filter), agg,
                                view_ds.schema)
    got = view_ds.to_table()
    want = {k: i for i, k in enumerate(expected.column(GROUP).to_pylist())}
    have = {k: i for i, k in enumerate(got.column(GROUP).to_pylist())}
    orphans = sorted(set(have) - set(want))
    missing = sorted(set(want) - set(have))
    differ = []
    outputs = [a.name for a in agg.aggs]
    exp_rows, got_rows = expected.to_pylist(), got.to_pylist()
    for key in sorted(set(want) & set(have)):
        e, g = exp_rows[want[key]], got_rows[have[key]]
        for name in outputs:
            a, b = e[name], g[name]
            if not _same_output(a, b):
                differ.append({"group": key, "column": name, "expected": a, "view": b})
    return [
        CheckOutcome("no_orphan_rows", not orphans,
                     f"every group the view holds has passing source rows at version {version}",
                     {"groups_in_view": len(have), "orphan_groups": len(orphans), "sample": orphans[:10]}),
        CheckOutcome("values_match_source", not (orphans or missing or differ),
                     f"every group equals the aggregate recomputed over the source at version {version}",
                     {"groups_expected": len(want), "groups_missing": len(missing), "groups_extra": len(orphans),
                      "values_differing": len(differ), "sample": (differ or missing)[:5]}),
    ]


def _same_output(a, b) -> bool:
    """Two values of an aggregate's output: floats within a relative 1e-9 (NaN
    equals NaN, an infinity only itself), anything else equal.

    >>> [_same_output(*p) for p in [(1.0, 1.0 + 1e-12), (float("nan"), float("nan")), (float("inf"), float("inf")),
    ...                              (float("inf"), float("nan")), (float("-inf"), float("inf")), (None, 0.0)]]
    [True, True, True, False, False, False]
    """
    if not (isinstance(a, float) and isinstance(b, float)):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _chunks_match_query(view: ViewRef, src, keys: np.ndarray, version: int) -> CheckOutcome:
    """A chunk view's ``matches_source_query``: every row's parent passes the
    query, and each parent's rows are numbered 0..k-1, once each. (A passing
    parent without rows may have yielded no chunks: the chunker is not run
    again to tell.)"""
    expected = _ids(src.to_table(columns=[], filter=view.definition.filter, with_row_id=True), "_rowid")
    extra = np.unique(keys[~isin(keys, expected)])
    rows = view.dataset().to_table(columns=[SOURCE_ROW_ID, CHUNK_INDEX])
    pairs = pa.table({"k": rows.column(SOURCE_ROW_ID), "i": rows.column(CHUNK_INDEX)})
    per = pairs.group_by("k").aggregate([("i", "count"), ("i", "count_distinct"), ("i", "max"), ("i", "min")])
    bad = int(pc.sum(pc.or_(pc.not_equal(per["i_count"], per["i_count_distinct"]),  # pyright: ignore[reportAttributeAccessIssue]
                            pc.or_(pc.not_equal(per["i_min"], 0),  # pyright: ignore[reportAttributeAccessIssue]
                                   pc.not_equal(pc.add(per["i_max"], 1), per["i_count"])))).as_py() or 0)  # pyright: ignore[reportAttributeAccessIssue]
    return CheckOutcome(
        "matches_source_query", len(extra) == 0 and bad == 0,
        f"every row's parent passes the view query over the source at version {version}, and each parent's "
        "chunks are numbered 0..k-1 once each",
        {"parents_expected": int(len(expected)), "parents_in_view": int(len(np.unique(keys))), "view_rows": int(len(keys)),
         "rows_of_parents_not_passing": int(isin(keys, extra).sum()), "parents_with_bad_numbering": bad},
    )


def _values_match_source(view: ViewRef, src, state, version: int) -> CheckOutcome:
    """Values, not only keys: no view row was written outside a refresh (a row
    created or updated after the view's last refresh commit: our later commits
    keep row versions), every row holds its source row's version, and the
    plain and SQL columns equal the view query evaluated over the source at
    the reflected version (UDF columns are not recomputed: their rows'
    versions vouch for them)."""
    ds = view.dataset()
    meta: dict = {"rows_written_outside_refreshes": 0, "rows_behind_source": 0, "values_differing": {}}
    if state.view_version is not None:
        written = ds.to_table(
            columns={"u": "_row_last_updated_at_version", "c": "_row_created_at_version"},
            filter=f"_row_created_at_version > {int(state.view_version)} "
                   f"OR _row_last_updated_at_version > {int(state.view_version)}",
        )
        meta["rows_written_outside_refreshes"] = written.num_rows
    if state.source_version is None or state.scoped_since_whole:
        # refreshed partition by partition since the last whole refresh: rows may
        # hold other source versions than any one version of the source
        passed = meta["rows_written_outside_refreshes"] == 0
        return CheckOutcome("values_match_source", passed,
                            "no view row was written outside a refresh (values not compared: the view was refreshed "
                            "partition by partition since its last whole refresh)", meta)
    projection = view.definition.projection
    held = ds.to_table(columns=[SOURCE_ROW_ID, SOURCE_ROW_VERSION, *projection])
    source = src.to_table(
        columns={"__v": "_row_last_updated_at_version", **projection}, with_row_id=True
    )
    pos = positions(_ids(held, SOURCE_ROW_ID), _ids(source, "_rowid"))
    found = pos >= 0
    take = pa.array(pos[found])
    meta["rows_behind_source"] = int(
        (_ids(held, SOURCE_ROW_VERSION)[found] != _ids(source, "__v")[pos[found]]).sum()
    )
    for name in projection:
        mine = held.column(name).filter(pa.array(found))
        theirs = source.column(name).take(take)
        try:
            same = pc.fill_null(pc.equal(mine, theirs.cast(mine.type)), False)  # pyright: ignore[reportAttributeAccessIssue]
            both_null = pc.and_(pc.is_null(mine), pc.is_null(theirs))  # pyright: ignore[reportAttributeAccessIssue]
            differ = int(len(mine) - pc.sum(pc.or_(same, both_null)).as_py()) if len(mine) else 0  # pyright: ignore[reportAttributeAccessIssue]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # a type Arrow cannot compare: compare as Python
            differ = sum(1 for a, b in zip(mine.to_pylist(), theirs.to_pylist(), strict=True) if a != b)
        if differ:
            meta["values_differing"][name] = differ
    passed = (meta["rows_written_outside_refreshes"] == 0 and meta["rows_behind_source"] == 0
              and not meta["values_differing"])
    return CheckOutcome(
        "values_match_source", passed,
        f"no view row was written outside a refresh, and every row holds its source row's version and the "
        f"values the view query gives over the source at version {version}",
        meta,
    )


def check_computed_columns(table: TableRef, columns: list[str] | None = None) -> dict[str, list[CheckOutcome]]:
    """The checks of a table's computed columns (``columns``: those only; a
    chunk view's columns computed from its own rows too), at the table's
    latest version, per column:

    * ``values_current``: every row's value is current, computed by the
      column's code as stored now from the row as it is now. The stale rows
      are counted by why: never computed, failed (an error record, its
      value NULL), computed by older code, or computed from inputs written
      since (a write by any tool moves the row's version: see
      :mod:`mv_assets.model.markers`).
    * ``no_failed_rows`` (UDF columns): no row whose UDF failed under
      ``on_error="skip"`` is still without a current value (as
      ``column_status()`` counts them), with the first such row's error.

    Row ids in the metadata (``sample_row_ids``: up to ten) are stable row ids.

    Counts, not scans of the stale rows (a table never backfilled may hold
    millions): four counts per column, one read of its error records and one
    scan of the rows they name."""
    ds = table.dataset()
    total = ds.count_rows()
    out: dict[str, list[CheckOutcome]] = {}
    for spec in stored_columns(ds.schema):
        if columns is not None and spec.name not in columns:
            continue
        fingerprint = spec.fingerprint
        m = f"`{computed_marker(spec.name)}`"
        stale_filter = stale_sql(spec.name, fingerprint, versioned=True)
        older_filter = f"{m} IS NOT NULL AND {m} NOT LIKE '{fingerprint}@%'"  # (fingerprints are hex)
        stale = ds.count_rows(filter=stale_filter)
        by_cause = {"never": 0, "older": 0, "rewritten": 0}
        failed_ids: list[int] = []
        last_error: dict = {}
        sample: list[int] = []
        if stale:
            by_cause["never"] = ds.count_rows(filter=f"{m} IS NULL")
            by_cause["older"] = ds.count_rows(filter=older_filter)
            by_cause["rewritten"] = stale - by_cause["never"] - by_cause["older"]
            # (the row version is projected: Lance 14 errs on a filter naming it after compaction otherwise)
            projection = {"m": m, Alias.ROW_VERSION: ROW_VERSION_COLUMN}
            sample = sorted(int(i) for i in _ids(
                ds.scanner(columns=projection, filter=stale_filter, with_row_id=True, limit=10).to_table()))
            errors = read_errors(table.layout, table.name, column=spec.name) if spec.kind == "udf" else []
            last_error = {e.row_id: e for e in errors}  # oldest first: each row's latest error wins
            if last_error:  # the rows they name that are still stale: failed, whatever their marker says
                rows = ds.scanner(columns=projection, with_row_id=True, filter=(
                    f"(_rowid IN ({', '.join(str(int(i)) for i in sorted(last_error))})) AND {stale_filter}")
                ).to_table()
                failed_ids = sorted(int(i) for i in _ids(rows))
                marker = rows.column("m")
                unset = marker.is_null().to_numpy(zero_copy_only=False)
                same_code = pc.fill_null(pc.starts_with(marker, f"{fingerprint}@"), False).to_numpy(  # pyright: ignore[reportAttributeAccessIssue]
                    zero_copy_only=False)
                by_cause["never"] -= int(unset.sum())
                by_cause["older"] -= int((~unset & ~same_code).sum())
                by_cause["rewritten"] -= int((~unset & same_code).sum())
        counts = {
            "rows": int(total),
            "rows_current": int(total - stale),
            "rows_stale": int(stale),
            "rows_never_computed": by_cause["never"],
            "rows_failed": len(failed_ids),
            "rows_older_code": by_cause["older"],
            "rows_inputs_rewritten": by_cause["rewritten"],
            "table_version": int(ds.version),
            "code_fingerprint": fingerprint,
            "sample_row_ids": sample,
        }
        out[spec.name] = [_values_current(spec.name, counts)]
        if spec.kind == "udf":
            out[spec.name].append(_no_failed_rows(spec.name, total, failed_ids, last_error))
    return out


def _values_current(column: str, c: dict) -> CheckOutcome:
    if not c["rows_stale"]:
        text = (f"all {c['rows']:,} rows of {column} are current: computed by the current code "
                f"({c['code_fingerprint']}) from the rows as they are now")
        return CheckOutcome("values_current", True, text, c)
    why = [f"{c[k]:,} {label}" for k, label in (
        ("rows_never_computed", "never computed"), ("rows_failed", "failed"),
        ("rows_older_code", "computed by older code"), ("rows_inputs_rewritten", "whose inputs were written since"),
    ) if c[k]]
    todo = ("they failed: see the no_failed_rows check" if c["rows_failed"] == c["rows_stale"]
            else "materialize the column: its backfill computes exactly those")
    text = f"{c['rows_stale']:,} of {c['rows']:,} rows of {column} are stale ({', '.join(why)}); {todo}"
    return CheckOutcome("values_current", False, text, c)


def _no_failed_rows(column: str, total: int, failed_ids: list[int], last_error: dict) -> CheckOutcome:
    md: dict = {"rows": int(total), "rows_failed": len(failed_ids), "sample_row_ids": failed_ids[:10]}
    if not failed_ids:
        return CheckOutcome("no_failed_rows", True, f"no row of {column} failed", md)
    first = last_error[failed_ids[0]]
    message = f"{first.error_type}: {first.message}" if first.error_type else str(first.message)
    md.update({"first_error": message, "first_error_row_id": failed_ids[0], "first_error_job_id": first.job_id})
    text = (f"{len(failed_ids):,} of {total:,} rows of {column} failed and have no value (first, row "
            f"{failed_ids[0]}: {message}); see `mv-assets errors`, retry with table.retry_errors({column!r})")
    return CheckOutcome("no_failed_rows", False, text, md)
