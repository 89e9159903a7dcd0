"""Consistency checks of a view against its source (engine code, no dagster).

Each check returns a :class:`CheckOutcome`; the Dagster layer turns them into
asset check results.
"""

import json
import math
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mv_assets.model.blobs import BYTES
from mv_assets.model.definition import SOURCE_ROW_ID, SOURCE_ROW_VERSION, computed_marker, stored_columns
from mv_assets.model.kinds import kind_of
from mv_assets.model.markers import ROW_VERSION_COLUMN, stale_sql
from mv_assets.model.names import CHUNK_INDEX, PARTITION, Alias
from mv_assets.model.planning import column_ids as _ids
from mv_assets.model.planning import isin, positions, select_limited, values_differ
from mv_assets.model.udf import input_values
from mv_assets.model.udtf_view import WHOLE_SOURCE, partition_key
from mv_assets.storage import objects
from mv_assets.storage.changes import STATE_KEY, commits_since, written_fragments
from mv_assets.storage.error_log import read_errors
from mv_assets.storage.lance_compat import with_filter_columns
from mv_assets.storage.refs import TableRef, ViewRef
from mv_assets.storage.state import read_refresh_state

__all__ = ["CheckOutcome", "SCOPES", "check_view", "check_computed_columns", "RefreshWindow", "last_refresh_window"]

# What a view's checks cover: "full", every row of the view against the whole
# source; "last_refresh", only what the view's newest refresh changed (the view
# rows it wrote or removed, the source rows changed between the versions it
# moved), read by filtered scans: O(rows changed), not O(view rows).
SCOPES = ("full", "last_refresh")


@dataclass
class CheckOutcome:
    name: str
    passed: bool
    description: str
    metadata: dict = field(default_factory=dict)


def check_view(view: ViewRef, scope: str = "full", since_version: int | None = None) -> list[CheckOutcome]:
    """Run every check on ``view`` at the source version it reflects.

    ``scope="full"``: every row of the view against the whole source.
    ``scope="last_refresh"``: only what the newest refresh changed (see
    :func:`check_last_refresh`); the same checks by name, each description
    saying what it covered. Where no such window can be read (the first
    refresh, history cleaned up, a rewrite of the whole view or source in
    between) it runs the full checks and says why in each description.
    ``since_version`` (with ``"last_refresh"``): the window starts at this
    view version instead of the previous refresh (a run that refreshed the
    view more than once checks all it changed)."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(map(repr, SCOPES))}, not {scope!r}")
    if since_version is not None and scope != "last_refresh":
        raise ValueError('since_version goes with scope="last_refresh"')
    _require_reflected_versions(view)
    if scope == "last_refresh" and view.definition.kind == "join":
        window = last_refresh_window(view, since_version)
        if isinstance(window, RefreshWindow):
            window = _join_last_refresh(view, window)
        if not isinstance(window, str):
            return window
        return [_full_because(o, window) for o in _check_all(view)]
    if scope == "last_refresh" and not kind_of(view.definition).by_fragment and len(view.definition.sources) > 1:
        # a join aggregate's refresh may touch rows of any fragment: no narrower window is kept
        return [_full_because(o, "a join view's checks read the whole join") for o in _check_all(view)]
    if scope == "last_refresh":
        window = last_refresh_window(view, since_version)
        if isinstance(window, RefreshWindow):
            return check_last_refresh(view, window)
        return [_full_because(o, window) for o in _check_all(view)]
    return _check_all(view)


def _require_reflected_versions(view: ViewRef) -> None:
    """The checks read each source at the version the view reflects: one
    another tool's cleanup removed is said in our words (Lance's "not found"
    of its manifest came out): refresh the view, then check it."""
    state = read_refresh_state(view.dataset())
    reflected = dict(state.sources or {}) or ({view.source: state.source_version}
                                               if state.source_version is not None else {})
    for name, version in reflected.items():
        uri = view.layout.table_uri(name)
        try:
            objects.dataset(uri, version=version)
        except (ValueError, OSError) as exc:
            if not objects.is_dataset(uri):
                return  # (a source gone: the checks say so themselves)
            raise ValueError(
                f"cannot check view {view.name!r}: version {version} of {name!r}, which the view reflects, is no "
                "longer in its history (cleaned up outside mv_assets?); refresh the view, then check it") from exc


def _full_because(outcome: CheckOutcome, why: str) -> CheckOutcome:
    outcome.description = f"{outcome.description} (checked in full: {why})"
    outcome.metadata["scope"] = "full"
    return outcome


def _check_all(view: ViewRef) -> list[CheckOutcome]:
    own = _KIND_CHECKS.get(view.definition.kind)  # (kinds whose rows are not one per source row)
    if own is not None:
        return own(view)
    definition = view.definition
    state = read_refresh_state(view.dataset())
    version = state.source_version or view.source_dataset().version
    src = objects.dataset(view.source_uri, version=version)
    view_ds = view.dataset()
    udfs = [c.name for c in definition.udf_columns]
    view_tbl = view_ds.to_table(columns=[SOURCE_ROW_ID] + udfs + list(_markers_held(view_ds.schema, udfs)))
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
    out.append(_matches_source_query(view, src, state, keys, version))
    out.append(_values_match_source(view, src, state, version))
    out.append(_udf_values_present(view, src, view_tbl, keys))
    return out


def _matches_source_query(view: ViewRef, src, state, keys: np.ndarray, version: int) -> CheckOutcome:
    """The view's rows (source row ids ``keys``) are those of its query over
    the source at ``version``: none missing, none extra, none twice."""
    definition = view.definition
    if state.source_version is None:
        return CheckOutcome(
            "matches_source_query",
            True,
            "not checked: the view has only been refreshed partition by partition so far",
            {"view_rows": int(len(keys))},
        )
    if kind_of(definition).children:
        return _chunks_match_query(view, src, keys, version)
    expected = _ids(src.to_table(columns=[], filter=definition.filter, with_row_id=True), "_rowid")
    if definition.limit is not None:
        expected = select_limited(expected, definition.limit, definition.seed if definition.shuffle else None)
    missing = expected[~isin(expected, keys)]
    extra = keys[~isin(keys, expected)]
    dupes = int(len(keys) - len(np.unique(keys)))
    return CheckOutcome(
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


def _markers_held(schema: pa.Schema, udfs: list[str]) -> dict[str, str]:
    """The computed markers of these UDF columns that the view holds, to read with them."""
    return {m: quote(m) for c in udfs if (m := computed_marker(c)) in schema.names}


def _lacking(table: pa.Table, name: str) -> np.ndarray:
    """Rows of ``table`` without a value of UDF column ``name``: NULL and (where
    ``table`` holds its computed marker) not computed. A NULL the UDF returned
    is its value: the row's marker says it was computed; a row that failed
    under ``on_error="skip"``, or was never computed, has none."""
    lacking = table.column(name).is_null().to_numpy(zero_copy_only=False)
    marker = computed_marker(name)
    if marker in table.column_names:
        lacking &= table.column(marker).is_null().to_numpy(zero_copy_only=False)
    return lacking


def _udf_values_present(view: ViewRef, src, view_tbl: pa.Table, keys: np.ndarray) -> CheckOutcome:
    """No UDF value of the view (``view_tbl``: its UDF columns and their
    computed markers, ``keys`` its source row ids) is missing where the UDF's
    inputs are present. A NULL the UDF returned is a value: its row's marker
    says it was computed (a row that failed under ``on_error="skip"``, or
    was never computed, has none)."""
    definition = view.definition
    missing_values: dict[str, int] = {}
    for spec in definition.udf_columns:
        if view_tbl.column(spec.name).null_count == 0:
            missing_values[spec.name] = 0
            continue
        null_keys = keys[_lacking(view_tbl, spec.name)]
        inputs = spec.udf.input_columns if spec.udf is not None else []
        if not len(null_keys) or not inputs or not spec.the_udf.skip_nulls:
            missing_values[spec.name] = int(len(null_keys))
            continue
        rows = src.to_table(
            columns=inputs, filter=f"_rowid IN ({', '.join(str(int(k)) for k in null_keys)})", with_row_id=True
        )
        has_all = np.ones(rows.num_rows, dtype=bool)
        for c in spec.the_udf.input_paths:  # (a struct's field: NULL where it is)
            has_all &= ~input_values(rows, c).is_null().to_numpy(zero_copy_only=False)
        missing_values[spec.name] = int(has_all.sum())
    if kind_of(definition).children:  # its added columns are computed from its own rows (as a table's)
        missing_values.update(_row_columns_missing(view.dataset()))
    return CheckOutcome(
        "udf_values_present",
        all(v == 0 for v in missing_values.values()),
        "no UDF value is missing where its inputs are present",
        {"missing_by_column": missing_values},
    )


def _row_columns_missing(ds, old=None) -> dict[str, int]:
    """Rows of each UDF column computed from the dataset's own rows (a chunk
    view's) without a current value: never computed, failed, or computed by
    other code or for an older version of the row (``old``: of the rows
    written since that version only, read from the fragments that changed)."""
    out = {}
    for spec in stored_columns(ds.schema):
        if spec.kind == "udf":
            # (the row version is projected: Lance 14 errs on a filter naming it after compaction otherwise)
            flt = stale_sql(spec.name, spec.fingerprint, versioned=True)
            cols = {Alias.ROW_VERSION: "_row_last_updated_at_version"}
            if old is None:
                stale = ds.to_table(columns=cols, filter=flt)
            else:
                frags = _fragments_written(ds, old)
                since = (f"(_row_created_at_version > {int(old.version)} OR "
                         f"_row_last_updated_at_version > {int(old.version)}) AND ({flt})")
                stale = (ds.scanner(columns=with_filter_columns(cols, since), filter=since, fragments=frags).to_table()
                         if frags else pa.table({}))
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


def _misnumbered(rows: pa.Table) -> int:
    """Parents (``SOURCE_ROW_ID``) of ``rows`` whose chunks (``CHUNK_INDEX``)
    are not numbered 0..k-1 once each."""
    pairs = pa.table({"k": rows.column(SOURCE_ROW_ID), "i": rows.column(CHUNK_INDEX)})
    per = pairs.group_by("k").aggregate([("i", "count"), ("i", "count_distinct"), ("i", "max"), ("i", "min")])
    return int(pc.sum(pc.or_(pc.not_equal(per["i_count"], per["i_count_distinct"]),  # pyright: ignore[reportAttributeAccessIssue]
                             pc.or_(pc.not_equal(per["i_min"], 0),  # pyright: ignore[reportAttributeAccessIssue]
                                    pc.not_equal(pc.add(per["i_max"], 1), per["i_count"])))).as_py() or 0)  # pyright: ignore[reportAttributeAccessIssue]


def _chunks_match_query(view: ViewRef, src, keys: np.ndarray, version: int) -> CheckOutcome:
    """A chunk view's ``matches_source_query``: every row's parent passes the
    query, and each parent's rows are numbered 0..k-1, once each. (A passing
    parent without rows may have yielded no chunks: the chunker is not run
    again to tell.)"""
    expected = _ids(src.to_table(columns=[], filter=view.definition.filter, with_row_id=True), "_rowid")
    extra = np.unique(keys[~isin(keys, expected)])
    bad = _misnumbered(view.dataset().to_table(columns=[SOURCE_ROW_ID, CHUNK_INDEX]))
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
    # (blob columns compared by their bytes: the descriptors say where each copy's bytes are)
    held = ds.to_table(columns=[SOURCE_ROW_ID, SOURCE_ROW_VERSION, *projection], blob_handling=BYTES)
    source = src.to_table(
        columns={"__v": "_row_last_updated_at_version", **projection}, with_row_id=True, blob_handling=BYTES
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


# ---------------------------------------------------------------------------
# Checks of the newest refresh only (scope="last_refresh")

_REWRITES = ("Overwrite", "Restore", "Clone")  # after one of these, row ids and versions mean other rows
_IN_CHUNK = 10_000  # ids per ``_rowid IN (...)`` filter


@dataclass(frozen=True)
class RefreshWindow:
    """What the view's newest refresh changed: view versions ``(view_from,
    view_now]`` (``view_from``: the previous refresh's commit; ``view_to``: the
    newest refresh's; commits after it, another tool's writes included, are in
    the window too), source versions ``(source_from, source_to]``."""

    view_from: int
    view_to: int
    view_now: int
    source_from: int
    source_to: int
    scoped: bool  # the newest or the previous refresh covered some source fragments only
    scope: tuple[int, ...] | None  # the newest refresh's source fragments (None: the whole source)

    def describe(self) -> str:
        return (f"view versions {self.view_from} -> {self.view_now}, source versions "
                f"{self.source_from} -> {self.source_to}")


def last_refresh_window(view: ViewRef, since_version: int | None = None) -> "RefreshWindow | str":
    """The newest refresh's window, or why there is none (a sentence): the
    view's first refresh (every row is new), a cleaned-up history, an
    Overwrite or Restore of the view or of the source within the window.
    ``since_version``: from that view version (the refresh it reflected then
    gives the source version the window starts at)."""
    ds = view.dataset()
    records: list[tuple[int, dict]] = []
    v = ds.version
    def enough() -> bool:
        return len(records) >= 2 and (since_version is None or records[-1][0] <= since_version) or (
            since_version is not None and bool(records) and records[-1][0] <= since_version)

    while v >= 1 and not enough():
        try:
            txn = objects.read_transaction(ds, v)
        except Exception:
            return f"the view's history before version {v} was cleaned up"
        raw = ((txn.transaction_properties or {}) if txn is not None else {}).get(STATE_KEY)
        if raw:
            records.append((v, json.loads(raw)))
        elif records and txn is not None and type(txn.operation).__name__ in _REWRITES:
            break  # (the view written anew: no refresh before it counts)
        v -= 1
    if not records:
        return "the view was never refreshed"
    (view_to, new), (view_from, old) = records[0], records[-1]
    if since_version is not None:
        if view_from > since_version or old.get("source_version") is None:
            return f"the view's first refresh is after version {since_version}: every row is new"
        view_from = since_version  # (no refresh since: new is old, the window holds other tools' writes only)
    elif len(records) < 2 or old.get("source_version") is None:
        return "the newest refresh is the view's first: every row is new"
    for w in range(view_from + 1, ds.version + 1):
        txn = objects.read_transaction(ds, w)
        if txn is not None and type(txn.operation).__name__ in _REWRITES:
            return f"view version {w} is an {type(txn.operation).__name__}"
    source_from, source_to = int(old["source_version"]), int(new["source_version"])
    if source_to < source_from:
        return f"the newest refresh went back to source version {source_to}"
    src = objects.dataset(view.source_uri, version=source_to)
    for w in range(source_from + 1, source_to + 1):
        try:
            txn = objects.read_transaction(src, w)
        except Exception:
            return f"the source's history at version {w} was cleaned up"
        if txn is not None and type(txn.operation).__name__ in _REWRITES:
            return f"source version {w} is an {type(txn.operation).__name__}"
    inside = [r for v, r in records if v > view_from] or [new]
    scopes = [r.get("scope") for r in inside]
    scope = None if any(f is None for f in scopes) else tuple(sorted({int(f) for fs in scopes for f in fs or ()}))
    return RefreshWindow(view_from, view_to, ds.version, source_from, source_to,
                         scoped=new.get("scope") is not None or old.get("scope") is not None, scope=scope)


def _version_meta(fragment) -> str:
    j = fragment.metadata.to_json()
    return json.dumps([j.get("created_at_version_meta"), j.get("last_updated_at_version_meta"), j.get("row_id_meta")],
                      sort_keys=True)


def _fragments_written(ds, old, only: "tuple[int, ...] | None" = None) -> list:
    """Fragments of ``ds`` that may hold rows created or updated after
    ``old``'s version (``only``: of these fragment ids); every other fragment
    is skipped unread.

    While the commits since are appends, deletes, rewriting updates and
    backfills, those are the fragments written since (their ids above every
    id then: ``storage.changes.written_fragments``, read from the commits).
    Otherwise, those whose row-version metadata differs from what they had then
    (new fragments included; a row's versions live there): of ``only`` alone
    when given, else of every fragment (at 10,000 fragments, ~1 s a side:
    what made a one-fragment run grow with the fragment count)."""
    since = int(old.version)
    commits = commits_since(ds, since)
    moved = written_fragments(ds, since, commits) if commits is not None else None
    if moved is not None:
        return [f for f in moved if only is None or f.fragment_id in only]
    if only is not None:
        pairs = [(ds.get_fragment(i), old.get_fragment(i)) for i in sorted(set(only))]
        return [f for f, o in pairs if f is not None and (o is None or _version_meta(o) != _version_meta(f))]
    before = {f.fragment_id: _version_meta(f) for f in old.get_fragments()}
    return [f for f in ds.get_fragments() if before.get(f.fragment_id) != _version_meta(f)]


def _written_since(ds, old, columns: dict, only: "tuple[int, ...] | None" = None, created_too: bool = True) -> pa.Table:
    """Rows of ``ds`` created or updated after ``old``'s version (``columns``
    plus ``_rowid`` and their versions ``__u`` / ``__c``), from the fragments
    that changed only."""
    since = int(old.version)
    flt = f"_row_last_updated_at_version > {since}"
    if created_too:
        flt = f"_row_created_at_version > {since} OR {flt}"
    cols = {**columns, "__u": "_row_last_updated_at_version", "__c": "_row_created_at_version"}
    frags = _fragments_written(ds, old, only)
    if not frags:
        return ds.scanner(columns=cols, with_row_id=True, limit=0).to_table()
    return ds.scanner(columns=with_filter_columns(cols, flt), filter=flt, fragments=frags,
                      with_row_id=True).to_table().select([*cols, "_rowid"])


def _by_ids(ds, ids: np.ndarray, columns: "dict | list", where: str | None = None) -> pa.Table:
    """Rows of ``ds`` with these row ids (and passing ``where``), by filtered
    scans Lance answers from the row-id index: only those rows are read."""
    ids = np.unique(np.asarray(ids, np.int64))
    parts = []
    for i in range(0, len(ids), _IN_CHUNK) if len(ids) else ():
        flt = f"_rowid IN ({', '.join(str(int(x)) for x in ids[i:i + _IN_CHUNK])})"
        if where:
            flt = f"({flt}) AND ({where})"
        parts.append(ds.scanner(columns=columns, filter=flt, with_row_id=True).to_table())
    if not parts:
        return ds.scanner(columns=columns, with_row_id=True, limit=0).to_table()
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _deleted_ids(ds, since: int) -> np.ndarray:
    """Row ids deleted from ``ds`` after version ``since`` (Lance's delta)."""
    if ds.version <= since:
        return np.empty(0, np.int64)
    return _ids(ds.delta(begin_version=since, end_version=ds.version).get_deleted_row_ids().read_all())


@dataclass
class _Changes:
    """What one refresh window holds: view rows written (``written``) and
    removed (``removed``: their values at ``view_from``), source rows written
    in the window (ids) and deleted in it."""

    written: pa.Table
    removed: pa.Table
    source_written: np.ndarray
    source_deleted: np.ndarray
    outside: int  # view rows written after the newest refresh's commit: by another tool

    def covered(self, w: RefreshWindow) -> dict:
        return {"scope": "last_refresh", "window": w.describe(), "view_rows_written": self.written.num_rows,
                "view_rows_removed": self.removed.num_rows, "source_rows_written": int(len(self.source_written)),
                "source_rows_deleted": int(len(self.source_deleted))}

    def what(self) -> str:
        return (f"the {self.written.num_rows:,} view rows written and {self.removed.num_rows:,} removed since the "
                f"previous refresh, and the {len(self.source_written):,} source rows written and "
                f"{len(self.source_deleted):,} deleted in between")


def _changes(view: ViewRef, w: RefreshWindow, columns: dict, key_columns: list[str]) -> _Changes:
    ds = view.dataset()
    old = objects.dataset(view.uri, version=w.view_from)
    written = _written_since(ds, old, columns)
    removed_ids = _deleted_ids(ds, w.view_from)
    rewritten = _ids(written.filter(pc.less_equal(written.column("__c"), w.view_from)), "_rowid")  # pyright: ignore[reportAttributeAccessIssue]
    removed = _by_ids(old, np.concatenate([removed_ids, rewritten]), key_columns)
    src = objects.dataset(view.source_uri, version=w.source_to)
    src_old = objects.dataset(view.source_uri, version=w.source_from)
    src_written = _ids(_written_since(src, src_old, {}, w.scope, created_too=False), "_rowid")
    src_deleted = _deleted_ids(src, w.source_from)
    src_deleted = src_deleted[~isin(src_deleted, src_written)] if len(src_deleted) else src_deleted
    outside = int(pc.sum(pc.or_(pc.greater(written.column("__u"), w.view_to),  # pyright: ignore[reportAttributeAccessIssue]
                                pc.greater(written.column("__c"), w.view_to))).as_py() or 0)  # pyright: ignore[reportAttributeAccessIssue]
    return _Changes(written, removed, np.unique(src_written), np.unique(src_deleted), outside)


def check_last_refresh(view: ViewRef, w: RefreshWindow) -> list[CheckOutcome]:
    """The view's checks over what its newest refresh changed only.

    Read: the view rows created or updated since the previous refresh (from
    the fragments whose row versions changed), the view rows removed since
    (their keys, at the previous refresh's version), the source rows written
    between the two source versions (from the fragments that changed) and
    deleted between them, and the source rows of those keys at both versions
    (by row id). Memory and reads grow with those rows, not with the view.

    The key-set checks account per key: the rows the view holds now of a key
    are the rows it held before the refresh, less those removed, plus those
    written; "held before" is taken as what the query gave at the previous
    source version, which the checks of that refresh verified. A view refreshed
    partition by partition (or with a limit) has no such baseline: its key sets
    are compared for the rows written only, and its descriptions say so."""
    return _KIND_LAST_REFRESH.get(view.definition.kind, _query_last_refresh)(view, w)


@dataclass
class _QueryWindow:
    """What a query or chunk view's checks over its newest refresh read (see
    :func:`check_last_refresh`)."""

    view: ViewRef
    w: RefreshWindow
    ch: _Changes
    covered: dict  # the metadata every outcome carries: what was checked
    what: str  # the same, said
    src: lance.LanceDataset  # the source at the newest refresh's version
    src_old: lance.LanceDataset  # the source at the previous refresh's version
    chunks: bool  # a chunk view
    baseline: bool  # its rows before the refresh are the query's at ``w.source_from`` (not scoped, no limit)
    w_keys: np.ndarray  # source row ids of the view rows written
    d_keys: np.ndarray  # source row ids of the view rows removed
    keys: np.ndarray  # every key the refresh touched (source rows written or deleted, view rows written or removed)
    exist_now: np.ndarray  # of ``keys``, the source rows at ``w.source_to``
    pass_now: np.ndarray  # of ``keys``, those passing the view's filter there


def _query_last_refresh(view: ViewRef, w: RefreshWindow) -> list[CheckOutcome]:
    definition = view.definition
    chunks = kind_of(definition).children
    projection = definition.projection
    udfs = [c.name for c in definition.udf_columns]
    columns = {SOURCE_ROW_ID: SOURCE_ROW_ID, SOURCE_ROW_VERSION: SOURCE_ROW_VERSION,
               **({CHUNK_INDEX: CHUNK_INDEX} if chunks else {}), **{c: quote(c) for c in projection},
               **{c: quote(c) for c in udfs}, **_markers_held(view.dataset().schema, udfs)}
    ch = _changes(view, w, columns, [SOURCE_ROW_ID])
    covered = ch.covered(w)
    src = objects.dataset(view.source_uri, version=w.source_to)
    src_old = objects.dataset(view.source_uri, version=w.source_from)
    w_keys, d_keys = _ids(ch.written, SOURCE_ROW_ID), _ids(ch.removed, SOURCE_ROW_ID)
    keys = np.unique(np.concatenate([ch.source_written, ch.source_deleted, w_keys, d_keys]))
    exist_now = _ids(_by_ids(src, keys, []), "_rowid")
    pass_now = _ids(_by_ids(src, keys, [], definition.filter), "_rowid") if definition.filter else exist_now
    q = _QueryWindow(view, w, ch, covered, ch.what(), src, src_old, chunks, not w.scoped and definition.limit is None,
                     w_keys, d_keys, keys, exist_now, pass_now)
    return [_orphans_in_window(q), _query_in_window(q), _values_in_window(q), _udfs_in_window(q)]


def _orphans_in_window(q: _QueryWindow) -> CheckOutcome:
    """no_orphan_rows: every row written has its source row; no deleted source
    row is left (accounted per key)."""
    definition, ch, w_keys = q.view.definition, q.ch, q.w_keys
    orphans = np.unique(w_keys[~isin(w_keys, q.exist_now)])
    left = np.empty(0, np.int64)
    if q.baseline:
        before = _pass_before(q.src_old, ch.source_deleted, definition.filter)
        held = _held_now(ch.source_deleted, before, q.d_keys, w_keys, q.chunks)
        left = ch.source_deleted[held > 0]
    return CheckOutcome(
        "no_orphan_rows", len(orphans) == 0 and len(left) == 0,
        f"every view row this refresh wrote has its source row at source version {q.w.source_to}"
        + (", and no source row deleted since the previous refresh is left in the view" if q.baseline else "")
        + f": checked {q.what}",
        {**q.covered, "orphan_rows": int(len(orphans)), "deleted_source_rows_left": int(len(left)),
         "sample": [int(x) for x in np.concatenate([orphans, left])[:10]]})


def _query_in_window(q: _QueryWindow) -> CheckOutcome:
    """matches_source_query, over the keys the refresh touched."""
    definition, w, what, covered, keys, w_keys = q.view.definition, q.w, q.what, q.covered, q.keys, q.w_keys
    if q.chunks:
        return _chunks_last_refresh(q.ch, w, q.pass_now, covered, what)
    if q.baseline:
        before = _pass_before(q.src_old, keys, definition.filter)
        held = _held_now(keys, before, q.d_keys, w_keys, False)
        expected = isin(keys, q.pass_now).astype(np.int64)
        missing, extra = keys[held < expected], keys[(held > expected) & (held <= 1)]
        dupes = keys[held > 1]
        return CheckOutcome(
            "matches_source_query", not (len(missing) or len(extra) or len(dupes)),
            f"the view holds, of the {len(keys):,} keys this refresh touched, exactly the rows its query gives over "
            f"the source at version {w.source_to}: none missing, none extra, none twice (its rows before the "
            f"refresh taken as the query's at version {w.source_from}): checked {what}",
            {**covered, "keys_checked": int(len(keys)), "expected_rows": int(expected.sum()), "missing": int(len(missing)),
             "extra": int(len(extra)), "duplicates": int(len(dupes)),
             "sample": [int(x) for x in np.concatenate([missing, extra, dupes])[:10]]})
    extra = np.unique(w_keys[~isin(w_keys, q.pass_now)]) if definition.limit is None else np.empty(0, np.int64)
    dupes = int(len(w_keys) - len(np.unique(w_keys)))
    why = ("a limited view's rows depend on every source row" if definition.limit is not None
           else "the view was refreshed partition by partition: no one source version to account from")
    return CheckOutcome(
        "matches_source_query", len(extra) == 0 and dupes == 0,
        f"every view row this refresh wrote passes the view query over the source at version {w.source_to}, "
        f"none twice (rows not written are not compared: {why}; the full check compares them): checked {what}",
        {**covered, "extra": int(len(extra)), "duplicates": dupes, "sample": [int(x) for x in extra[:10]]})


def _values_in_window(q: _QueryWindow) -> CheckOutcome:
    """values_match_source: the rows written hold their source row's version
    and the query's values."""
    projection, ch, w_keys = q.view.definition.projection, q.ch, q.w_keys
    meta: dict = {**q.covered, "rows_written_outside_refreshes": ch.outside, "rows_behind_source": 0,
                  "values_differing": {}}
    if not q.chunks:
        source = _by_ids(q.src, w_keys, {"__v": "_row_last_updated_at_version", **projection})
        pos = positions(w_keys, _ids(source, "_rowid"))
        found = pos >= 0
        meta["rows_behind_source"] = int(
            (_ids(ch.written, SOURCE_ROW_VERSION)[found] != _ids(source, "__v")[pos[found]]).sum())
        meta["values_differing"] = _differing(ch.written.filter(pa.array(found)), source.take(pa.array(pos[found])),
                                              list(projection))
    passed = meta["rows_written_outside_refreshes"] == 0 and meta["rows_behind_source"] == 0 and not meta[
        "values_differing"]
    return CheckOutcome(
        "values_match_source", passed,
        "no view row was written outside a refresh since the previous one"
        + ("" if q.chunks else f", and every row this refresh wrote holds its source row's version and the values the "
                               f"view query gives over the source at version {q.w.source_to}") + f": checked {q.what}",
        meta)


def _udfs_in_window(q: _QueryWindow) -> CheckOutcome:
    """udf_values_present, over the rows written."""
    view, ch, w_keys = q.view, q.ch, q.w_keys
    missing_values: dict[str, int] = {}
    inputs_by = {c.name: (c.udf.input_columns if c.udf is not None else [], c.the_udf.skip_nulls,
                          c.udf.input_paths if c.udf is not None else [])
                 for c in view.definition.udf_columns}
    for name in (c.name for c in view.definition.udf_columns):
        null_keys = w_keys[_lacking(ch.written, name)]
        inputs, skip_nulls, paths = inputs_by[name]
        if not len(null_keys) or not inputs or not skip_nulls:
            missing_values[name] = int(len(null_keys))
            continue
        rows = _by_ids(q.src, null_keys, inputs)
        has_all = np.ones(rows.num_rows, dtype=bool)
        for c in paths:  # (a struct's field: NULL where it is)
            has_all &= ~input_values(rows, c).is_null().to_numpy(zero_copy_only=False)
        missing_values[name] = int(has_all.sum())
    if q.chunks:  # its added columns, computed from its own rows: the rows written since
        missing_values.update(_row_columns_missing(view.dataset(), objects.dataset(view.uri, version=q.w.view_from)))
    return CheckOutcome(
        "udf_values_present", all(v == 0 for v in missing_values.values()),
        f"no UDF value is missing where its inputs are present, in the {ch.written.num_rows:,} rows written since "
        "the previous refresh", {**q.covered, "missing_by_column": missing_values})


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _pass_before(src_old, keys: np.ndarray, filter_sql: str | None) -> np.ndarray:
    """Of ``keys``, the source rows that passed the query at the old version."""
    return _ids(_by_ids(src_old, keys, [], filter_sql), "_rowid")


def _held_now(keys: np.ndarray, passed_before: np.ndarray, removed: np.ndarray, written: np.ndarray,
              chunks: bool) -> np.ndarray:
    """Rows the view holds now per key: held before (one per key passing at
    the old version; a chunk view: as many as it removed, at least one), less
    removed, plus written."""
    def count(of: np.ndarray) -> np.ndarray:
        u, n = np.unique(of, return_counts=True)
        pos = positions(keys, u)
        return np.where(pos >= 0, n[np.maximum(pos, 0)] if len(u) else 0, 0)
    before = isin(keys, passed_before).astype(np.int64)
    gone = count(removed)
    if chunks:  # a parent's chunk count before is not known: held when it passed, all of it removed or kept
        return np.where(gone > 0, 0, before) + count(written)
    return before - gone + count(written)


def _differing(mine_rows: pa.Table, theirs_rows: pa.Table, names: list[str]) -> dict[str, int]:
    out = {}
    for name in names:
        differ = int(values_differ(mine_rows.column(name), theirs_rows.column(name)).sum())
        if differ:
            out[name] = differ
    return out


def _chunks_last_refresh(ch: _Changes, w: RefreshWindow, pass_now: np.ndarray, covered: dict,
                         what: str) -> CheckOutcome:
    """A chunk view's ``matches_source_query`` over the parents this refresh
    wrote chunks of: each passes the query, and its chunks are numbered
    0..k-1 once each (a parent rewritten gets all its chunks written anew)."""
    extra = np.unique(_ids(ch.written, SOURCE_ROW_ID)[~isin(_ids(ch.written, SOURCE_ROW_ID), pass_now)])
    bad = _misnumbered(ch.written) if ch.written.num_rows else 0
    return CheckOutcome(
        "matches_source_query", len(extra) == 0 and bad == 0,
        f"every parent this refresh wrote chunks of passes the view query over the source at version {w.source_to}, "
        f"and its chunks are numbered 0..k-1 once each: checked {what}",
        {**covered, "parents_written": int(len(np.unique(_ids(ch.written, SOURCE_ROW_ID)))),
         "parents_not_passing": int(len(extra)), "parents_with_bad_numbering": bad})


def _udtf_last_refresh(view: ViewRef, w: RefreshWindow) -> list[CheckOutcome]:
    """A table-function view's checks over the partitions this refresh wrote
    or removed rows of."""
    ch = _changes(view, w, {PARTITION: PARTITION}, [PARTITION])
    touched = set(ch.written.column(PARTITION).to_pylist()) | set(ch.removed.column(PARTITION).to_pylist())
    held = set()
    if touched:
        ds = view.dataset()
        held = {p for p in touched if ds.count_rows(filter=f"{quote(PARTITION)} = {_sql_text(p)}")}
    udtf = view.definition.table_function
    src = objects.dataset(view.source_uri, version=w.source_to)
    by = udtf.partition_by
    if by is None:
        have = {WHOLE_SOURCE} if src.count_rows(filter=view.definition.filter) else set()
    elif held:  # the passing source rows of the partitions touched only
        where = " OR ".join(_group_sql((by,), [json.loads(p)]) for p in sorted(held))
        flt = f"({view.definition.filter}) AND ({where})" if view.definition.filter else where
        have = {partition_key(v) for v in src.to_table(columns=[by], filter=flt).column(by).unique().to_pylist()}
    else:
        have = set()
    orphans = sorted(held - have)
    covered = ch.covered(w)
    return [
        CheckOutcome("no_orphan_rows", not orphans,
                     f"every partition this refresh wrote or removed rows of that the view holds has passing source "
                     f"rows at version {w.source_to}: checked {len(touched):,} partitions ({ch.what()})",
                     {**covered, "partitions_checked": len(touched), "orphan_partitions": len(orphans),
                      "sample": orphans[:10]}),
        CheckOutcome("values_match_source", ch.outside == 0,
                     f"no view row was written outside a refresh since the previous one: checked {ch.what()}",
                     {**covered, "rows_written_outside_refreshes": ch.outside}),
    ]


def _sql_text(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _agg_last_refresh(view: ViewRef, w: RefreshWindow) -> list[CheckOutcome]:
    """An aggregate view's checks over the groups this refresh wrote or
    removed: each is recomputed from scratch over the source rows of that
    group (a filtered scan on its keys), compared as the full check does."""
    from mv_assets.execution.agg_tasks import groups_from_rows
    from mv_assets.model.agg_view import GROUP, Aggregate

    agg = Aggregate.from_definition(view.definition)
    view_ds = view.dataset()
    ch = _changes(view, w, {GROUP: GROUP}, [GROUP])
    touched = sorted(set(ch.written.column(GROUP).to_pylist()) | set(ch.removed.column(GROUP).to_pylist()))
    covered = {**ch.covered(w), "groups_checked": len(touched)}
    src = objects.dataset(view.source_uri, version=w.source_to)
    got_parts, exp_parts = [], []
    for i in range(0, len(touched), 500):
        part = touched[i:i + 500]
        in_list = ", ".join(_sql_text(g) for g in part)
        got_parts.append(view_ds.to_table(filter=f"{quote(GROUP)} IN ({in_list})"))
        where = " OR ".join(_group_sql(agg.keys, json.loads(g)) for g in part)
        flt = f"({view.definition.filter}) AND ({where})" if view.definition.filter else where
        exp_parts.append(src.to_table(columns=agg.input_columns, filter=flt))
    got = pa.concat_tables(got_parts) if got_parts else view_ds.schema.empty_table()
    rows = pa.concat_tables(exp_parts) if exp_parts else src.schema.empty_table().select(agg.input_columns)
    expected = groups_from_rows(rows, agg, view_ds.schema)
    want = {k: i for i, k in enumerate(expected.column(GROUP).to_pylist())}
    have = {k: i for i, k in enumerate(got.column(GROUP).to_pylist())}
    orphans, missing = sorted(set(have) - set(want)), sorted(set(want) - set(have))
    differ = []
    exp_rows, got_rows = expected.to_pylist(), got.to_pylist()
    for key in sorted(set(want) & set(have)):
        e, g = exp_rows[want[key]], got_rows[have[key]]
        differ += [{"group": key, "column": a.name, "expected": e[a.name], "view": g[a.name]}
                   for a in agg.aggs if not _same_output(e[a.name], g[a.name])]
    twice = len(got) - len(have)
    what = f"the {len(touched):,} groups this refresh wrote or removed ({ch.what()})"
    return [
        CheckOutcome("no_orphan_rows", not orphans,
                     f"every group this refresh touched that the view holds has passing source rows at version "
                     f"{w.source_to}: checked {what}",
                     {**covered, "orphan_groups": len(orphans), "sample": orphans[:10]}),
        CheckOutcome("values_match_source", not (orphans or missing or differ or twice or ch.outside),
                     f"every group this refresh touched equals the aggregate recomputed over the source at version "
                     f"{w.source_to}, and no view row was written outside a refresh since the previous one: checked "
                     f"{what}",
                     {**covered, "groups_expected": len(want), "groups_missing": len(missing),
                      "groups_extra": len(orphans), "groups_twice": twice, "values_differing": len(differ),
                      "rows_written_outside_refreshes": ch.outside, "sample": (differ or missing)[:5]}),
    ]


def _group_sql(keys: "tuple[str, ...]", values: list) -> str:
    """The SQL predicate of one group: its keys equal these values (NULL: IS NULL)."""
    terms = []
    for k, v in zip(keys, values, strict=True):
        if v is None:
            terms.append(f"{quote(k)} IS NULL")
        elif isinstance(v, bool):
            terms.append(f"{quote(k)} = {'true' if v else 'false'}")
        elif isinstance(v, (int, float)):
            terms.append(f"{quote(k)} = {v!r}")
        else:
            terms.append(f"{quote(k)} = {_sql_text(v)}")
    return "(" + " AND ".join(terms) + ")" if terms else "true"  # (no keys: the one group of every row)


def _join_checks(view: ViewRef) -> list[CheckOutcome]:
    """A join view's checks (the names every row-keyed view's checks have):
    the join computed anew from each source at the version the view reflects
    (plain, SQL and key columns; no UDF is called), compared with the view row
    by row, keyed by the stable row ids of the source rows each came from."""
    from mv_assets.execution.join_tasks import read_first
    from mv_assets.model.join_view import Join

    definition = view.definition
    join = Join.of(definition)
    state = read_refresh_state(view.dataset())
    versions = state.sources or {}
    view_ds = view.dataset()
    held = view_ds.to_table(columns=_join_held_columns(definition, join, view_ds.schema),
                                   blob_handling=BYTES)  # (a blob column compared by its bytes)
    if not versions:
        never = "not checked: the view was never refreshed"
        return [CheckOutcome(n, held.num_rows == 0, never, {"view_rows": held.num_rows})
                for n in ("no_orphan_rows", "matches_source_query", "values_match_source", "udf_values_present")]
    datasets = [objects.dataset(view.layout.table_uri(n) if i else view.source_uri, version=versions[n])
                for i, n in enumerate(join.sources)]
    return _join_compare(definition, join, datasets, held, read_first(datasets[0], join.reads(0)), None)


def _join_held_columns(definition, join, schema: "pa.Schema | None" = None) -> list[str]:
    from mv_assets.model.join_view import row_id_column

    udfs = [c.name for c in definition.udf_columns]
    return ([row_id_column(i) for i in range(len(join.sources))]
            + [c.name for c in definition.columns if c.kind != "udf"] + udfs
            + list(_markers_held(schema, udfs) if schema is not None else []))


def _join_compare(definition, join, datasets: list, held: pa.Table, first: pa.Table,
                  covered: "tuple[str, dict] | None") -> list[CheckOutcome]:
    """The checks of the view rows ``held`` against the join of the
    first-table rows ``first`` (read at the view's versions): every view row
    of those rows, and no other (``covered``: what a last-refresh check
    covers, said and in each outcome's metadata; None: the whole view)."""
    from mv_assets.execution.join_tasks import evaluated, joined_rows
    from mv_assets.model.join_view import row_id_column

    keys = [row_id_column(i) for i in range(len(join.sources))]
    plain = [c.name for c in definition.columns if c.kind != "udf"]
    at = ", ".join(f"{n} v{d.version}" for n, d in zip(join.sources, datasets, strict=True))
    scope = "" if covered is None else f" (last refresh: {covered[0]})"
    meta = {} if covered is None else covered[1]
    orphans = {}
    for i, ds in enumerate(datasets):
        ids = np.asarray(held.column(keys[i]).drop_null().to_numpy(), np.int64)
        if covered is None:
            every = _ids(ds.to_table(columns=[], with_row_id=True), "_rowid")
        else:  # (only the ids the rows checked name, looked up by id)
            every = _ids(_by_ids(ds, ids, []), "_rowid")
        orphans[join.names[i]] = int((~isin(ids, every)).sum())
    out = [CheckOutcome("no_orphan_rows", not any(orphans.values()),
                        f"every view row's source rows exist at {at}{scope}", {"orphan_rows_by_source": orphans, **meta})]
    rel = evaluated(joined_rows(first, datasets, join), join)
    expected = pa.table({**{k: rel.column(k).fill_null(-1) for k in keys},
                         **{c.name: rel.column(f"__x__{c.name}") if c.kind == "sql" else
                            rel.column(_staged_of(join, c)) for c in definition.columns if c.kind != "udf"}})
    have = held.select(keys + plain)
    for k in keys[1:]:
        have = have.set_column(have.schema.get_field_index(k), k, have.column(k).fill_null(-1))
    counted = _key_counts(expected, keys), _key_counts(have, keys)
    missing = sum(max(0, n - counted[1].get(k, 0)) for k, n in counted[0].items())
    extra = sum(max(0, n - counted[0].get(k, 0)) for k, n in counted[1].items())
    out.append(CheckOutcome("matches_source_query", missing == 0 and extra == 0,
                            f"the view's rows (by their source rows) equal the join at {at}{scope}",
                            {"expected_rows": expected.num_rows, "view_rows": held.num_rows, "missing": missing,
                             "extra": extra, **meta}))
    differ = _join_differing(expected, have, keys, plain)
    out.append(CheckOutcome("values_match_source", not any(differ.values()),
                            f"plain and SQL columns equal the join at {at}{scope}",
                            {"differing_by_column": differ, **meta}))
    missing_values = {}
    for c in definition.udf_columns:
        inputs = [rel.column(staged_name_of(join, r)) for r in c.the_udf.input_columns]
        present = np.ones(rel.num_rows, dtype=bool)
        for col in inputs:
            present &= ~np.asarray(col.is_null().to_numpy(zero_copy_only=False))
        expect_values = int(present.sum()) if c.the_udf.skip_nulls else rel.num_rows
        if computed_marker(c.name) in held.column_names:  # rows not computed (failed, skipped) have no marker
            missing_values[c.name] = int(_lacking(held, c.name).sum())
        else:
            missing_values[c.name] = max(0, expect_values - (held.num_rows - held.column(c.name).null_count))
    out.append(CheckOutcome("udf_values_present", not any(missing_values.values()),
                            f"no UDF value is missing where its inputs are present{scope}",
                            {"missing_by_column": missing_values, **meta}))
    return out


def _join_last_refresh(view: ViewRef, w: RefreshWindow) -> "list[CheckOutcome] | str":
    """A join view's checks over what its newest refresh changed: the
    first-table rows whose view rows the window touches, found apart from the
    refresh's own plan (no arrangement; scans by key and by row id):

    - the first table's rows written or deleted between the two refreshes;
    - the first-table rows of the view rows written or removed since the previous refresh;
    - for each joined table, its rows written or deleted in its own window: the
      view rows holding them now, and the first-table rows their keys (now and
      before) reach down the chain (the rows that may match them).

    Each such first-table row's view rows are compared with its join at the
    versions the view reflects. Or why it cannot be (a sentence: checked in full)."""
    from mv_assets.execution.join_tasks import read_first
    from mv_assets.model.join_view import Join, row_id_column
    from mv_assets.ops.join_refresh import reach

    definition = view.definition
    join = Join.of(definition)
    before = read_refresh_state(objects.dataset(view.uri, version=w.view_from)).sources
    after = read_refresh_state(objects.dataset(view.uri, version=w.view_to)).sources
    if not before or not after or set(before) != set(after) or any(after[n] < before[n] for n in before):
        return "the previous refresh recorded no version of every source"
    datasets = [objects.dataset(view.layout.table_uri(n) if i else view.source_uri, version=after[n])
                for i, n in enumerate(join.sources)]
    view_ds, old_view = view.dataset(), objects.dataset(view.uri, version=w.view_from)
    first = [_ids(_written_since(view_ds, old_view, {SOURCE_ROW_ID: SOURCE_ROW_ID}), SOURCE_ROW_ID),
             _ids(_by_ids(old_view, _deleted_ids(view_ds, w.view_from), [SOURCE_ROW_ID]), SOURCE_ROW_ID)]
    changed: dict[str, int] = {}
    for i, (name, ds) in enumerate(zip(join.sources, datasets, strict=True)):
        if before[name] == after[name]:
            continue
        old = objects.dataset(ds.uri, version=before[name])
        right = list(join.step_of(i).right) if i else []
        written = _written_since(ds, old, {c: f"`{c}`" for c in right})
        deleted = _deleted_ids(ds, before[name])
        changed[name] = written.num_rows + len(deleted)
        if i == 0:
            first += [_ids(written), deleted]
            continue
        gone = np.concatenate([_ids(written), deleted])
        holding = view_ds.scanner(columns=[SOURCE_ROW_ID], filter=pc.field(row_id_column(i)).isin(  # pyright: ignore[reportAttributeAccessIssue]
            pa.array(gone, pa.int64()))).to_table() if len(gone) else None
        if holding is not None:
            first.append(_ids(holding, SOURCE_ROW_ID))
        then = _by_ids(old, gone, right)  # (their keys before: the rows they matched then)
        for rows in (written.select(right), then.select(right)):
            if rows.num_rows:
                first.append(reach(join, datasets, i, rows))
    ids = np.unique(np.concatenate(first)) if first else np.empty(0, np.int64)
    held = (view_ds.scanner(columns=_join_held_columns(definition, join, view_ds.schema), blob_handling=BYTES,
                            filter=pc.field(SOURCE_ROW_ID).isin(pa.array(ids, pa.int64()))).to_table()  # pyright: ignore[reportAttributeAccessIssue]
            if len(ids) else view_ds.scanner(columns=_join_held_columns(definition, join, view_ds.schema), limit=0
                                             ).to_table())
    covered = {"scope": "last_refresh", "window": w.describe(), "first_rows_checked": int(len(ids)),
               "source_rows_changed": changed, "view_rows_checked": held.num_rows}
    what = f"the {len(ids):,} first-table rows its window touches, {held.num_rows:,} view rows"
    return _join_compare(definition, join, datasets, held,
                         read_first(datasets[0], join.reads(0), ids=ids), (what, covered))


def staged_name_of(join, ref: str) -> str:
    from mv_assets.model.join_view import staged_name

    return staged_name(*join.refs[ref])


def _staged_of(join, c) -> str:
    return staged_name_of(join, c.expr or c.name)


def _key_counts(t: pa.Table, keys: list[str]) -> dict[tuple, int]:
    counts = t.group_by(keys, use_threads=False).aggregate([([], "count_all")])
    cols = [counts.column(k).to_pylist() for k in keys]
    return dict(zip(zip(*cols, strict=True), counts.column("count_all").to_pylist(), strict=True))


def _join_differing(expected: pa.Table, have: pa.Table, keys: list[str], columns: list[str]) -> dict[str, int]:
    """View rows whose columns differ from the expected row of the same source rows."""
    if not columns:
        return {}
    e = expected.rename_columns([c if c in keys else f"__e__{c}" for c in expected.column_names])
    both = have.join(e, keys=keys, join_type="inner", use_threads=False)
    theirs = both.select([f"__e__{c}" for c in columns]).rename_columns(columns)
    return _differing(both.select(columns), theirs, columns)


# The checks of kinds whose rows are not one per source row (model.kinds: one registry per layer),
# in full and over the newest refresh (a join view's: in full, see check_view)
# (a join aggregate: its groups checked against the join under it, as an aggregate view's against its source)
_KIND_CHECKS = {"udtf": _udtf_checks, "aggregate": _agg_checks, "join": _join_checks, "join_aggregate": _agg_checks}
_KIND_LAST_REFRESH = {"udtf": _udtf_last_refresh, "aggregate": _agg_last_refresh,
                      "join_aggregate": _agg_last_refresh}
