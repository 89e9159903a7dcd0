"""Assets: wiring only, the engine does the work.

* a base table -> an observable source asset (data version: the newest Lance
  version whose commit changes rows; compactions and column backfills do not);
* its computed columns -> assets materialized by a checkpointed backfill,
  checked after it (values_current, no_failed_rows), with their column lineage;
* a view -> an asset materialized with its UDF columns (downstream assets,
  code version = UDF fingerprint); a view over a view brings its upstream
  views along.

Every asset downstream of a base table is partitioned by that table's
fragments (one partitions definition per base table, single-run backfills),
so one run can carry a whole lineage: the sensor's run after a change, and
"Materialize all" in the UI (the backfill daemon puts parent and child in the
same run). Views over a base table refresh a partition on its own; computed
columns, views over views and views with a limit refresh as a whole in any
partition run, and record every partition the run names.
"""

import functools
import time
import warnings
from collections.abc import Callable, Collection
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, NoReturn

import dagster as dg
from dagster._core.definitions.data_version import DATA_VERSION_TAG  # not exported by dagster
from dagster._core.definitions.source_asset import (  # not exported by dagster
    SYSTEM_METADATA_KEY_SOURCE_ASSET_OBSERVATION as _NO_ASSET_EVENTS,
)
from dagster._core.events import DagsterEventType  # not exported by dagster

from mv_assets.api import progress
from mv_assets.api.declare import apply as apply_declared
from mv_assets.api.declare import reconcile
from mv_assets.api.table import MaterializedView, Table
from mv_assets.dagster.catalog import TableInfo
from mv_assets.dagster.io_manager import IO_MANAGER_KEY
from mv_assets.dagster.pipes_client import PipesLauncher, launch_view
from mv_assets.dagster.resource import MvAssetsResource
from mv_assets.model.agg_view import agg_text
from mv_assets.model.errors import UdfError
from mv_assets.model.kinds import kind_of
from mv_assets.model.markers import recompute_words
from mv_assets.model.policy import RefreshPolicy
from mv_assets.model.sql_names import columns_read

__all__ = [
    "RESOURCE_KEY", "TAG_SOURCE_VERSION", "TAG_SCOPE", "CHECK_NAMES", "CODE_CHECK", "COLUMN_CHECK_NAMES", "code_check_evaluations", "safe_name", "partitions_def_name",
    "source_asset", "lineage_asset", "fragment_keys", "fragment_observation", "observe_fragments",
    "unobserved_fragments",
]

RESOURCE_KEY = "mv_assets"
TAG_SOURCE_VERSION = "mv_assets/source_version"
TAG_SCOPE = "mv_assets/scope"
# on a sensor's run: the views it records, not refreshes (comma-separated): refreshed outside the
# runs that named their partitions, which Dagster records behind (see dagster.sensors._recorded_behind)
TAG_RECORD_ONLY = "mv_assets/record_only"
CHECK_NAMES = ("matches_source_query", "no_orphan_rows", "values_match_source", "udf_values_present")
UDTF_CHECK_NAMES = ("no_orphan_rows",)  # a table-function view's (ops.checks._udtf_checks)
AGG_CHECK_NAMES = ("no_orphan_rows", "values_match_source")  # an aggregate view's (ops.checks._agg_checks)
# a join view's (ops.checks._join_checks): the join computed anew from every source, compared row by row
JOIN_CHECK_NAMES = ("no_orphan_rows", "matches_source_query", "values_match_source", "udf_values_present")
CODE_CHECK = "udf_code_current"  # on UDF columns of views declared in code
CHECK_DESCRIPTIONS = {  # what each check of a view verifies (mv_assets.ops.checks), as the UI shows it
    "matches_source_query": (
        "The view holds exactly the rows its query gives over the source at the version it reflects: the same "
        "keys, none missing, none extra, none twice (a chunk view: every chunk's parent passes the query and "
        "each parent's chunks are numbered 0..k-1)."
    ),
    "no_orphan_rows": "Every row of the view still has its source row at the source version the view reflects.",
    "values_match_source": (
        "Values, not only keys: no row of the view was written outside a refresh (by another tool), every row "
        "holds its source row's version, and its copied and SQL columns equal what the view's query gives over "
        "the source at the version the view reflects (UDF columns are vouched for by their rows' versions)."
    ),
    "udf_values_present": (
        "No UDF value is missing where the UDF's inputs are present (a row a UDF failed on under "
        'on_error="skip" counts as missing: see `mv-assets errors`).'
    ),
    CODE_CHECK: (
        "Every row of the column was computed by the UDF code declared now; fails while rows computed by other "
        "code remain (after a code change, or a recompute that failed). Row counts in the metadata."
    ),
}
AGG_CHECK_DESCRIPTIONS = {
    "no_orphan_rows": "Every group the view holds still has source rows passing its query at the source version "
                      "the view reflects.",
    "values_match_source": "Every group's key and aggregates equal the aggregate recomputed from scratch over the "
                           "source at the version the view reflects (floats to a relative 1e-9); no group missing "
                           "or extra.",
}
CHECK_SCOPE_NOTE = (  # what a view check reads, by how it runs (see docs/dagster.md, "Checks at scale")
    " With a materialization it checks what the refresh changed only (the view rows it wrote or removed, the "
    "source rows changed in between: O(rows changed)); executed on its own (the Checks tab's Execute, the "
    "full_checks_TABLE schedule) it checks every row. The result's description says which."
)
COLUMN_CHECK_NAMES = ("values_current", "no_failed_rows")  # a table's computed columns' (ops.checks)
COLUMN_CHECK_DESCRIPTIONS = {  # warnings: a backfill (materializing the column) mends them
    "values_current": (
        "Every row's value is current: computed by the column's code as stored now, from the row as it is now. "
        "Warns while rows are stale: never computed, failed, computed by older code, or whose inputs were written "
        "since (by mv_assets or any other tool: a plain Lance update, merge_insert, Spark). Counts by cause in the "
        "metadata; materializing the column backfills exactly those rows."
    ),
    "no_failed_rows": (
        'No row of the column is left without a value by a UDF that raised on it (on_error="skip" writes an error '
        "record and leaves the row NULL). Warns with the count and the first row's error; see `mv-assets errors`, "
        "and retry with `table.retry_errors(column)`."
    ),
}
JOIN_CHECK_DESCRIPTIONS = {
    "no_orphan_rows": "Every row of the view still has its source row in each source it came from (the first "
                      "table and every joined table or view) at the versions the view reflects.",
    "matches_source_query": (
        "The view holds exactly the rows of the join over its sources at the versions it reflects, each as many "
        "times as the join gives it (rows told apart by the stable row ids of the source rows each came from): "
        "none missing, none extra."
    ),
    "values_match_source": "Every copied and SQL column of each row equals the join's value for the same source "
                           "rows at the versions the view reflects.",
    "udf_values_present": CHECK_DESCRIPTIONS["udf_values_present"],
}
JOIN_CHECK_SCOPE_NOTE = (  # what a join view's check reads (ops.checks: _join_last_refresh, _join_checks)
    " With a materialization it checks the first-table rows the refresh's window touches (the view rows written "
    "or removed, each source's rows changed in between and the first-table rows their keys reach, found by "
    "filtered scans); executed on its own (the Checks tab's Execute, the full_checks_TABLE schedule) it "
    "computes the whole join. The result's description says which."
)
UDTF_CHECK_DESCRIPTIONS = {
    "no_orphan_rows": (
        "Every partition (partition_by value) the view holds rows of still has source rows passing its query "
        "at the source version the view reflects."
    ),
}
# Per-partition metadata is computed for runs of at most this many partitions.
PER_PARTITION_LIMIT = 2000


def safe_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)


def partitions_def_name(source: str) -> str:
    return f"{safe_name(source)}__fragments"


def fragment_keys(keys) -> tuple[list[int], list[str]]:
    """Partition keys as fragment ids, and the keys that are not fragment ids."""
    ids, bad = [], []
    for k in keys:
        try:
            value = int(k)
        except (TypeError, ValueError):
            bad.append(k)
            continue
        if value < 0 or str(value) != str(k):
            bad.append(k)
        else:
            ids.append(value)
    return ids, bad


def _resources_text(spec: dict) -> str:
    """A UDF's (or function's) resource hints in words, "" without any."""
    hints = spec.get("resources")
    if not hints:
        return ""
    parts = [f"num_cpus={hints.get('num_cpus', 1.0):g}", f"num_gpus={hints.get('num_gpus', 0.0):g}"]
    if hints.get("memory") is not None:
        parts.append(f"memory={hints['memory']}")
    return f"; asks for {', '.join(parts)} per task"


def _udf_text(udf: dict, field: str | None = None) -> str:
    inputs = ", ".join(udf.get("input_paths") or udf.get("input_columns") or ["<all columns>"])  # (info.vals: a field)
    part = f", field `{field}` of its result" if field else ""
    return (f"UDF `{udf['name']}`({inputs}) -> {udf['data_type']}{part}; code fingerprint {udf['fingerprint']}"
            f"{_resources_text(udf)}")


def _spec_text(source: str | None, col: dict) -> str:
    """A stored column spec in words: where a view's (or a table's computed) column comes from."""
    if col["kind"] == "column":
        return f"Copied from `{source}`.`{col.get('expr') or col['name']}`."
    if col["kind"] == "sql":
        return f"SQL: `{col.get('expr') or ''}`."
    return f"{_udf_text(col['udf'], col.get('field'))}."


def column_descriptions(info: TableInfo) -> dict[str, str]:
    """What each column of a table or view is, from stored metadata (no UDF
    unpickled): a view's copied, SQL and UDF columns, an aggregate's keys and
    functions, a chunk or table-function view's outputs; a table's computed
    columns. Plain columns of a base table have none."""
    if not info.is_view:
        return {c["name"]: "Computed column: " + _spec_text(info.name, c) for c in info.columns}
    return _COLUMN_TEXTS.get(info.kind, _query_column_texts)(info)


def _join_column_texts(info: TableInfo) -> dict[str, str]:
    """A join view's: names as written resolve to (source, column) through the stored refs."""
    join = info.join
    assert join is not None
    out = {}
    for c in info.definition.get("columns", []):
        if c["kind"] == "column":
            i, col = join.refs[c.get("expr") or c["name"]]
            out[c["name"]] = f"Copied from `{join.sources[i]}`.`{col}`."
        else:
            out[c["name"]] = _spec_text(info.source, c)
    return out


def _agg_column_texts(info: TableInfo) -> dict[str, str]:
    function = info.definition["function"]
    out = {k: f"Group key: `{info.source}`.`{k}`." for k in function["keys"]}
    out.update({n: f"Aggregate: {agg_text(fn, c, *q)} over each group's rows of `{info.source}`."
                for n, fn, c, *q in function["aggs"]})
    return out


def _query_column_texts(info: TableInfo) -> dict[str, str]:
    """A query view's, a chunk view's (inherited columns, outputs, columns computed from its
    own rows) and a table-function view's (outputs)."""
    function = info.definition.get("function") or {}
    children = kind_of(info.definition).children
    out = {}
    for c in info.definition.get("columns", []):
        out[c["name"]] = _spec_text(info.source, c)
        if children and c["kind"] == "column":
            out[c["name"]] = f"Inherited from the parent row: `{info.source}`.`{c.get('expr') or c['name']}`."
    label = "chunker" if children else "UDTF"
    inputs = ", ".join(function.get("input_columns") or ["<all columns>"])
    for name in function.get("output_schema") or {}:
        out[name] = (f"Output of {label} `{function['name']}`({inputs}); code fingerprint "
                     f"{function.get('fingerprint')}{_resources_text(function)}.")
    for c in info.row_columns:  # a chunk view's columns computed from its own rows
        out[c["name"]] = "Computed from the view's rows: " + _spec_text(info.name, c)
    return out


# what each column of a view is, by kind (model.kinds: one registry per layer); others as a query view's
_COLUMN_TEXTS = {"join": _join_column_texts, "aggregate": _agg_column_texts, "join_aggregate": _agg_column_texts}


def _table_metadata(info: TableInfo) -> dict:
    """Dagster's standard keys: the catalog shows the table's columns (with
    their types and what each is) and where it lives. Internal columns (keys,
    markers: ``__...``) are never shown."""
    described = column_descriptions(info)
    return {
        "dagster/table_name": info.name,
        "dagster/uri": info.uri,
        "dagster/column_schema": dg.TableSchema(columns=[
            dg.TableColumn(name, type_, description=described.get(name))
            for name, type_ in info.schema if not name.startswith("__")
        ]),
    }


def _code_references(udf: dict) -> dict:
    """Where the UDF's code is: the UI links the column asset to it."""
    if "source_file" not in udf:
        return {}
    with warnings.catch_warnings():  # code references are a beta API of Dagster
        warnings.simplefilter("ignore")
        ref = dg.LocalFileCodeReference(file_path=udf["source_file"], line_number=int(udf.get("source_line") or 1))
        return {"dagster/code_references": dg.CodeReferencesMetadataValue(code_references=[ref])}


def source_asset(info: TableInfo, pdef=None):
    """The table as an observable source asset. With ``pdef`` (the table has
    views or computed columns) it is partitioned by its fragments like
    everything downstream, each partition's data version its fragment's: a
    partition downstream depends on its own fragment only, so an append
    leaves the partitions it did not touch in sync."""
    description = f"Lance table {info.name}. Its data version is the newest Lance version that changed rows"
    description += (" of each fragment (a partition per fragment)." if pdef is not None else ".")
    if info.code_changes is not None and info.code_changes.problems:  # a view declared under its name
        description += " The code cannot be applied: " + "; ".join(info.code_changes.problems)

    @dg.observable_source_asset(
        key=dg.AssetKey([info.name]),
        group_name="sources",
        description=description,
        metadata=_table_metadata(info),
        tags={"dagster/kind/lance": ""},
        partitions_def=pdef,
        io_manager_key=IO_MANAGER_KEY,  # (a parameter named after it gets the Table)
    )
    def _observe(context, mv_assets: MvAssetsResource):
        table = mv_assets.reader().open_table(info.name)
        if pdef is None:
            return dg.DataVersion(str(table.data_version()))
        known, _ = fragment_keys(context.instance.get_dynamic_partitions(pdef.name))
        # the fragments the instance does not know as they are (see unobserved_fragments), and
        # those never observed: "Observe sources" on a fresh source observes every partition
        versions = unobserved_fragments(context.instance, table, known, also=set(known))
        return dg.DataVersionsByPartition({str(f): v for f, v in versions.items()})

    return _observe


def unreadable_asset(name: str, why: str) -> dg.AssetSpec:
    """A table or view whose Lance dataset cannot be read (damaged files): shown
    in the asset graph with the reason, not materializable, without lineage
    (its definition cannot be read either), so the graph never hides it."""
    return dg.AssetSpec(
        dg.AssetKey([name]),
        description=(
            f"UNREADABLE: {why}. It has no lineage and no runs here until its Lance dataset can be read; "
            f"mv-assets status lists it too. Restore its files, or drop it (db.drop_table({name!r})) and "
            "create it again."
        ),
        kinds={"lance"},
        metadata={"load_state": "UNREADABLE", "reason": why},
        tags={"mv_assets/state": "unreadable"},
        group_name="unreadable",
    )


def source_observation(table: Table, version: int, current: int | None = None) -> dg.AssetObservation:
    """The table's observation at ``version`` (a table without partitions);
    ``current``: its data version, when already read."""
    current = table.data_version() if current is None else current
    return dg.AssetObservation(
        asset_key=dg.AssetKey([table.name]),
        metadata={"lance_version": version, "data_version": current},
        tags={"dagster/data_version": str(current)},
    )


def fragment_observation(table: Table, fragment: int, data_version: str) -> dg.AssetObservation:
    """The observation of one fragment (a partition of the table's source asset)."""
    return dg.AssetObservation(
        asset_key=dg.AssetKey([table.name]), partition=str(fragment),
        metadata={"lance_version": table.version, "data_version": data_version},
        tags={"dagster/data_version": data_version},
    )


def unobserved_fragments(instance, table: Table, fragments, also: Collection[int] = ()) -> dict[int, str]:
    """The data versions of those of ``fragments`` (ids; those still in the
    table) that the instance does not know as they are: what is left to
    observe (one scan, one query).

    A fragment observed before is known at its latest observation's data
    version. A fragment never observed is known at its first one: Lance
    writes a fragment once, and an update moves rows to new fragments, so
    its rows change only by deletions (``v7`` -> ``v7-1``). So a fragment is
    observed only once a row of it was deleted (or its data version differs
    from its latest observation): a source of N fragments written once costs
    no observation at all, not N (materializations of a never-observed
    fragment point at no observation of it, see :func:`observe_fragments`).
    ``also``: fragments to observe whatever their version, if never observed."""
    versions = table.fragment_data_versions(fragments)
    if not versions:
        return {}
    seen = instance.event_log_storage.get_latest_tags_by_partition(
        dg.AssetKey([table.name]), DagsterEventType.ASSET_OBSERVATION, [DATA_VERSION_TAG],
        asset_partitions=[str(f) for f in versions],
    )
    known = {f: seen.get(str(f), {}).get(DATA_VERSION_TAG) for f in versions}
    return {f: v for f, v in versions.items()
            if known[f] != v and (known[f] is not None or not never_changed(v) or f in also)}


def never_changed(data_version: str) -> bool:
    """A fragment's data version as written: none of its rows deleted since."""
    return "-" not in data_version


def _record_id_now(instance) -> int:
    """A storage id no later event is at or before: where a materialization
    of a never-observed fragment points (any later observation of it is
    after, and none is before)."""
    try:
        latest = instance.event_log_storage.get_maximum_record_id()
    except NotImplementedError:  # a storage that cannot say: 1 (every later observation is after it)
        latest = None
    return max(int(latest or 0), 1)


def observe_fragments(context, table: Table, fragments: list[int],
                      read: int | None = None) -> dict[int, tuple[str, int | None]]:
    """The input a materialization records for each of ``fragments`` (those
    still in the table) of the source it read at version ``read`` (None: the
    latest): the fragment's data version then, and the storage id of an
    observation of the fragment, which Dagster compares with its latest
    observation (stale when the data versions differ). Fragments the
    instance does not know as they are (:func:`unobserved_fragments`) are
    observed now (a scan and three queries, whatever the count), every
    fragment never observed included: the source asset's partitions then
    show their data versions and the asset its last observation in the UI
    (before, a source whose fragments were never deleted from read "Never
    observed" all along), and to automation conditions an unobserved source
    partition counts as missing. The observations are logged as one batch
    (one transaction per 1,000 where the storage writes batches, see
    :func:`_record_batch`). A fragment logged now points at no observation of
    it yet (the latest storage id now; the batch is stored when the step's
    events are): Dagster compares data versions, equal until a row of it is
    deleted. A fragment changed since ``read`` (a write after the version the
    run was pinned to) points before the observation of its change: the
    partition shows Unsynced, as it is."""
    versions = table.fragment_data_versions(fragments)
    if not versions:
        return {}
    then = (table.fragment_data_versions(list(versions), version=read)
            if read is not None and read != table.version else {})
    moved = {fid for fid, v in then.items() if v != versions[fid]}
    unseen = unobserved_fragments(context.instance, table, list(versions), also=set(versions))
    _record_batch(context, [fragment_observation(table, fid, version) for fid, version in unseen.items()])
    key = dg.AssetKey([table.name])
    ids = context.instance.get_latest_storage_id_by_partition(
        key, DagsterEventType.ASSET_OBSERVATION, {str(f) for f in versions})
    now = _record_id_now(context.instance) if len(ids) < len(versions) else None
    out = {fid: (version, ids.get(str(fid), now)) for fid, version in versions.items()}
    for fid in moved:
        out[fid] = (then[fid], _pointer_before(context.instance, key, fid, versions[fid]))
    return out


def _pointer_before(instance, key: dg.AssetKey, fragment: int, current: str) -> int:
    """A storage id before the first observation of ``fragment`` at its
    ``current`` data version (after any observation of another version): a
    materialization pointing there reads as made before that change."""
    records = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[str(fragment)]), limit=100).records  # newest first
    first_current = records[0].storage_id
    for r in records:
        if (r.event_log_entry.tags or {}).get(DATA_VERSION_TAG) != current:
            return r.storage_id
        first_current = r.storage_id
    return first_current - 1


def _query_what(info: TableInfo, where: str, lim: str, cols: str) -> str:
    return f"Materialized view over {info.source}{where}{lim}: {cols}"


def _join_what(info: TableInfo, where: str, lim: str, cols: str) -> str:
    return f"Join view over {_join_text(info)}{where}: {cols}"


def _grouping(info: TableInfo) -> str:
    """An aggregate's keys and outputs in words: ``group by lang; n = count(*)``."""
    function = info.definition["function"]
    keys = ", ".join(k for k in function["keys"]) or "nothing (one group)"
    outs = ", ".join(f"{n} = {agg_text(fn, c, *q)}" for n, fn, c, *q in function["aggs"])
    return f"group by {keys}; {outs}"


def _agg_what(info: TableInfo, where: str, lim: str, cols: str) -> str:
    return (f"Aggregate view over {info.source}{where}: {_grouping(info)}; a refresh applies the "
            "changed rows to the groups they touch")


def _join_agg_what(info: TableInfo, where: str, lim: str, cols: str) -> str:
    return (f"Aggregate view over the join of {', '.join(info.sources)}: {_grouping(info)}; a refresh "
            "brings the join up to date by the delta rule, then applies its changed rows to the groups they touch")


def _udtf_what(info: TableInfo, where: str, lim: str, cols: str) -> str:
    function = info.definition["function"]
    by = function.get("partition_by")
    return (f"Table-function view over {info.source}{where}: udtf {function['name']} over "
            f"{f'each {by} partition' if by else 'the whole source'}, giving rows of "
            f"{', '.join(function['output_schema'])}; a refresh recomputes the partitions whose rows changed")


def _chunk_what(info: TableInfo, where: str, lim: str, cols: str) -> str:
    function = info.definition["function"]
    return (f"Chunk view over {info.source}{where}: each row split by {function['kind']} {function['name']} "
            f"into rows of {', '.join(function['output_schema'])}, each inheriting {cols or 'no column'}")


# what a view is, said in its asset's description, by kind (model.kinds: one registry per layer)
_WHAT = {"query": _query_what, "join": _join_what, "aggregate": _agg_what, "udtf": _udtf_what, "chunker": _chunk_what,
         "join_aggregate": _join_agg_what}


# where a lineage's refreshes compute, as the resource's runner says: (asset kind, words)
ENGINES = {"spark": ("spark", "on Spark"), "inline": ("python", "in the run's process (the inline runner)")}


def _view_description(info: TableInfo, engine: str = "spark") -> str:
    """The view asset's description, in plain text: Dagster's Catalog list shows
    descriptions as they are (markdown is rendered on the asset page only)."""
    cols = ", ".join(c["name"] for c in info.columns)
    where = f" where {info.filter}" if info.filter else ""
    lim = f", limited to {info.limit} rows" if info.limit is not None else ""
    how = (
        f"One partition per fragment of {info.root}"
        if info.scoped
        else f"Refreshed as a whole in any partition run (partitions: fragments of {info.root})"
        + ("; its upstream views are brought up to date first" if info.over_view else "")
    )
    what = _WHAT[info.kind](info, where, lim, cols)
    if info.join is not None:
        how += f"; a change of any of its sources ({', '.join(info.join.sources)}) refreshes it"
    text = f"{what}. {how}; refreshed incrementally {ENGINES[engine][1]}. Policy: {info.policy.describe()}."
    diff = info.code_changes
    if diff is not None:
        # what is true whatever runs after the definitions' load: a state as of the
        # load ("the code changed") would read wrong after the next run
        text += (" Declared in code: a materialization makes the view follow the code first (creates it, swaps"
                 " changed UDFs in, adds new columns); each UDF column's udf_code_current check says whether"
                 " rows computed by other code remain.")
    if diff is not None and diff.problems:
        text += " The code cannot be applied: " + "; ".join(diff.problems)
    return text


def _join_text(info: TableInfo) -> str:
    """A join view's sources and keys in words: ``clips inner join videos on
    clips.video_id = videos.vid, left join channels using channel_id``."""
    join = info.join
    assert join is not None
    parts = [join.sources[0]]
    for step in join.steps:
        table, name = join.sources[step.index], join.names[step.index]
        if step.using:
            on = "using " + ", ".join(step.right)
        else:
            on = "on " + " and ".join(f"{join.names[i]}.{c} = {name}.{r}"
                                      for (i, c), r in zip(step.left, step.right, strict=True))
        parts.append(f"{step.how} join {table}{f' as {name}' if name != table else ''} {on}")
    return ", ".join(parts)


def _udf_description(owner: str, col: dict) -> str:
    u = col["udf"]
    inputs = ", ".join(u.get("input_paths") or u.get("input_columns") or ["<all columns>"])
    hints = _resources_text(u)
    return (f"UDF column {col['name']} of {owner}: {u['name']}({inputs}) -> {u['data_type']}. Code fingerprint "
            f"{u['fingerprint']}{'. It a' + hints[3:] if hints else ''}.")


def _freshness(policy: RefreshPolicy):
    """A ttl view is expected to be refreshed within its ttl: the UI shows it as
    warning after one ttl plus a sensor margin, failing after two."""
    if policy.kind != "ttl" or policy.ttl_seconds is None:
        return None
    ttl = timedelta(seconds=policy.ttl_seconds)
    margin = timedelta(minutes=1)
    return dg.FreshnessPolicy.time_window(fail_window=2 * ttl + margin, warn_window=ttl + margin)


def _status_metadata(view) -> dict:
    s = view.status()
    return {
        "load_state": s.load_state,
        "valid": s.valid,
        "load_number": s.load_number,
        "node": s.node or "",
        "versions_behind": s.versions_behind,
        "stale_count": s.stale_count,
        "refresh_policy": s.policy,
    }


def _index_metadata(view) -> dict:
    """A view's indexes and the rows each covers, as the asset page shows them
    (kept up to date by every refresh: see mv_assets.storage.indexes)."""
    found = view.list_indices()
    if not found:
        return {}
    lines = ["| index | type | column | rows covered |", "|---|---|---|---|"]
    for i in found:
        covered = ("pending (no rows yet)" if i.pending else
                   f"{i.num_indexed_rows:,} of {i.num_indexed_rows + i.num_unindexed_rows:,} ({i.coverage:.0%})")
        lines.append(f"| {i.name} | {i.index_type} | {', '.join(i.columns)} | {covered} |")
    return {"indexes": dg.MetadataValue.md("\n".join(lines)),
            "index_coverage": round(min(i.coverage for i in found), 6)}


def _named_in(text: str, names: list[str]) -> list[str]:
    """The ``names`` a SQL text reads (model.sql_names: not those inside a string literal)."""
    return columns_read(text, names)


def column_reads(info: TableInfo, source_names: list[str]) -> dict[str, list[str]]:
    """What each column of a view reads of its source (``source_names``: the
    source's visible columns), from the stored definition (no UDF unpickled):
    a copied column its source column, a SQL column the columns its SQL
    names, a UDF column its UDF's inputs (all columns when it takes the
    row); an aggregate view's outputs their aggregated column (none for
    ``count(*)``), its keys themselves; a chunk or table-function view's
    outputs the function's inputs, a chunk view's inherited columns their
    parent column."""
    d = info.definition
    function = d.get("function") or {}
    if "aggs" in function:  # an aggregate view: its keys, and each output its aggregated column
        out = {k: [k] for k in function["keys"]}
        out.update({n: [c] if c else [] for n, _fn, c, *_q in function["aggs"]})
        return out
    out = {}
    for c in d.get("columns", []):
        if c["kind"] == "column":
            out[c["name"]] = [c.get("expr") or c["name"]]
        elif c["kind"] == "sql":
            out[c["name"]] = _named_in(c.get("expr") or "", source_names)
        elif c["kind"] == "udf":
            out[c["name"]] = list(c["udf"].get("input_columns") or source_names)
    for name in function.get("output_schema") or {}:
        out[name] = list(function.get("input_columns") or source_names)
    return out


def join_column_reads(info: TableInfo) -> dict[str, list[tuple[str, str]]]:
    """What each column of a join view reads, as ``(source, column)`` pairs,
    from the stored names (``refs``: each name as written -> its source and
    column): a copied column its one column, a SQL column the names its SQL
    uses, a UDF column its inputs."""
    join = info.join
    assert join is not None
    names = list(join.refs)

    def of(refs: list[str]) -> list[tuple[str, str]]:
        pairs = [join.refs[r] for r in refs if r in join.refs]
        return [(join.sources[i], c) for i, c in dict.fromkeys(pairs)]

    out = {}
    for c in info.definition.get("columns", []):
        if c["kind"] == "column":
            out[c["name"]] = of([c.get("expr") or c["name"]])
        elif c["kind"] == "sql":
            out[c["name"]] = of(_named_in(c.get("expr") or "", names))
        elif c["kind"] == "udf":
            out[c["name"]] = of(list(c["udf"].get("input_columns") or []))
    return out


def _join_column_lineage(info: TableInfo, tables: dict[str, TableInfo]) -> dg.TableColumnLineage:
    """A join view's ``dagster/column_lineage``: each column <- the columns of
    each source it reads, on that source's asset (a computed column of a
    source: on that column's asset)."""
    def dep(source: str, column: str) -> dg.TableColumnDep:
        computed = source in tables and column in tables[source].computed
        return dg.TableColumnDep(asset_key=dg.AssetKey([source, column] if computed else [source]), column_name=column)

    return dg.TableColumnLineage(deps_by_column={
        name: [dep(s, c) for s, c in cols] for name, cols in join_column_reads(info).items()
        if cols and not name.startswith("__")
    })


def _column_lineage(info: TableInfo, src: TableInfo) -> dg.TableColumnLineage:
    """``dagster/column_lineage``: each view column <- the source columns it
    reads, on the source's asset or, for a computed column of the source
    (an asset of its own), on that column's asset."""
    def dep(column: str) -> dg.TableColumnDep:
        key = [src.name, column] if column in src.computed and column in info.reads else [src.name]
        return dg.TableColumnDep(asset_key=dg.AssetKey(key), column_name=column)

    reads = column_reads(info, [n for n, _ in src.schema])
    return dg.TableColumnLineage(deps_by_column={
        name: [dep(c) for c in cols] for name, cols in reads.items() if cols and not name.startswith("__")
    })


_MINUTE_STEPS = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30)
_HOUR_STEPS = (1, 2, 3, 4, 6, 8, 12)


def ttl_cron(ttl_seconds: float) -> str:
    """The coarsest simple cron that ticks at least once every ``ttl_seconds``
    (rounded down to steps that divide an hour or a day; a day at most)."""
    minutes = max(1, int(ttl_seconds // 60))
    if minutes < 60:
        return f"*/{max(s for s in _MINUTE_STEPS if s <= minutes)} * * * *"
    hours = minutes // 60
    if hours < 24:
        step = max(s for s in _HOUR_STEPS if s <= hours)
        return "0 * * * *" if step == 1 else f"0 */{step} * * *"
    return "0 0 * * *"


def automation_condition(policy: RefreshPolicy) -> dg.AutomationCondition | None:
    """The AutomationCondition standing for a view's refresh policy (automation
    "conditions"): eager -> eager(); cron -> on_cron(schedule); ttl ->
    on_cron(:func:`ttl_cron`) (a refresh at the latest a ttl after the source
    moved, never while it did not: on_cron waits for the deps to update);
    manual and staleness (it counts changed rows, which no condition sees) ->
    none."""
    if policy.kind == "eager":
        return dg.AutomationCondition.eager()
    if policy.kind == "cron":
        assert policy.cron is not None
        return dg.AutomationCondition.on_cron(policy.cron)
    if policy.kind == "ttl":
        assert policy.ttl_seconds is not None
        return dg.AutomationCondition.on_cron(ttl_cron(policy.ttl_seconds))
    return None


def _view_specs(info: TableInfo, tables: dict[str, TableInfo], conditions: bool = False, engine: str = "spark"):
    """The asset specs of one view and its UDF columns, and its check specs
    (``conditions``: with the AutomationCondition of the view's policy)."""
    condition = automation_condition(info.policy) if conditions else None
    view_key = dg.AssetKey([info.name])
    src = tables[info.source]  # type: ignore[index]
    deps = _view_deps(info, src, tables)
    lineage = _join_column_lineage(info, tables) if info.join is not None else _column_lineage(info, src)
    group = safe_name(info.name)
    specs = [
        dg.AssetSpec(
            view_key,
            deps=deps,
            description=_view_description(info, engine),
            kinds={"lance", ENGINES[engine][0]},
            metadata={
                **_table_metadata(info),
                "dagster/column_lineage": lineage,
                "source": info.source,
                **({"sources": ", ".join(info.sources)} if info.join is not None else {}),
                "filter": info.filter or "",
                "refresh_policy": info.policy.describe(),
            },
            tags={**info.ownership.tags, "mv_assets/policy": info.policy.kind},
            owners=list(info.ownership.owners),
            freshness_policy=_freshness(info.policy),
            automation_condition=condition,
            group_name=group,
            skippable=True,
        ).with_io_manager_key(IO_MANAGER_KEY)  # (a parameter named after it gets the view)
    ]
    col_keys = {}
    for col in info.udf_columns:
        key = dg.AssetKey([info.name, col["name"]])
        col_keys[col["name"]] = key
        description = _udf_description(info.name, col)
        if info.declared is not None:
            # (never a state as of the definitions' load: it would read wrong after the next run)
            description += (
                " Declared in code: its code version is this fingerprint. Materializing it recomputes the rows"
                " computed by other code; the udf_code_current check says whether any remain."
            )
        specs.append(
            dg.AssetSpec(
                key,
                deps=[view_key],
                description=description,
                kinds={"python", ENGINES[engine][0]},
                code_version=col["udf"]["fingerprint"],
                metadata={"udf": col["udf"]["name"], "data_type": col["udf"]["data_type"], **_code_references(col["udf"])},
                owners=list(info.ownership.owners),  # the view's: a part of it
                tags=dict(info.ownership.tags),
                automation_condition=condition,
                group_name=group,
                skippable=True,
            ).with_io_manager_key(IO_MANAGER_KEY)
        )
    return specs, _view_check_specs(info, view_key, col_keys), view_key, col_keys


def _view_deps(info: TableInfo, src: TableInfo, tables: dict[str, TableInfo]) -> list[dg.AssetDep]:
    """What a view's asset depends on: its source, the source's computed
    columns it reads, and a join view's joined sources (and their columns)."""
    deps = [dg.AssetDep(dg.AssetKey([src.name]))] + [
        dg.AssetDep(dg.AssetKey([src.name, c])) for c in src.computed if c in info.reads
    ]
    # A join view's joined sources: every partition of it reads all of each (it refreshes as a whole),
    # whatever their partitions are (another lineage's fragments, or none)
    every = dg.AllPartitionMapping()
    for joined in info.joined:
        if joined in tables:
            deps.append(dg.AssetDep(dg.AssetKey([joined]), partition_mapping=every))
            deps += [dg.AssetDep(dg.AssetKey([joined, c]), partition_mapping=every)
                     for c in info.joined_reads.get(joined, [])]
    return deps


def _view_check_specs(info: TableInfo, view_key: dg.AssetKey, col_keys: dict[str, dg.AssetKey]
                      ) -> list[dg.AssetCheckSpec]:
    """A view's checks (by its kind), and a declared view's UDF columns' code check."""
    # rows per partition or per group: other checks
    names = {"udtf": UDTF_CHECK_NAMES, "aggregate": AGG_CHECK_NAMES, "join": JOIN_CHECK_NAMES,
             "join_aggregate": AGG_CHECK_NAMES}.get(info.kind, CHECK_NAMES)
    described = {**CHECK_DESCRIPTIONS, **{"udtf": UDTF_CHECK_DESCRIPTIONS, "aggregate": AGG_CHECK_DESCRIPTIONS,
                                          "join": JOIN_CHECK_DESCRIPTIONS,
                                          "join_aggregate": AGG_CHECK_DESCRIPTIONS}.get(info.kind, {})}
    note = {"join": JOIN_CHECK_SCOPE_NOTE}.get(info.kind, CHECK_SCOPE_NOTE)
    check_specs = [dg.AssetCheckSpec(name, asset=view_key, description=described[name] + note)
                   for name in names]
    if info.declared is not None:
        # Dagster shows no asset-level staleness for partitioned assets: this check
        # marks a column whose code changed on the asset itself, on its page and its
        # lineage-graph node (not in the Catalog list: for a partitioned asset the OSS
        # UI shows partition counts only there); evaluated by the sensor and by the
        # column's materialization. Severity ERROR: a failed WARN check leaves the node's footer green.
        check_specs += [
            dg.AssetCheckSpec(CODE_CHECK, asset=key, description=CHECK_DESCRIPTIONS[CODE_CHECK])
            for key in col_keys.values()
        ]
    return check_specs


def code_check_evaluations(info: TableInfo, db) -> dict[dg.AssetKey, tuple[bool, str, dict]]:
    """For each UDF column of a view declared in code: whether every row of it
    is current under the code declared now, a sentence saying so, and the row
    counts. It follows the rows (the engine's ``column_status``), not the code
    stored in the catalog: a recompute that failed, was cancelled or is still
    running stored the new code but left the rows stale."""
    if info.declared is None:
        return {}
    diff = reconcile(db, info.name, info.declared_definition)
    if diff.create:
        text = "the view is declared in code and not created yet: materialize it"
        return {dg.AssetKey([info.name, col["name"]]): (False, text, {}) for col in info.udf_columns}
    view = db.open_table(info.name)
    status = {c["column"]: c for c in view.column_status()}
    rows = view.count_rows()
    out = {}
    for col in info.udf_columns:
        key = dg.AssetKey([info.name, col["name"]])
        fingerprint = col["udf"]["fingerprint"]
        if col["name"] in diff.altered + diff.added or col["name"] not in status:
            # the catalog holds other code (or no column yet): no row is computed by the declared code
            current, failed = 0, 0
            text = (f"the UDF code changed (now {fingerprint}): {rows} of {rows} rows are stale, computed by "
                    "other code; materialize the column") if col["name"] in diff.altered else (
                f"a new UDF column ({fingerprint}): none of the {rows} rows is computed yet; materialize the column")
        else:
            current, failed = status[col["name"]]["current"], status[col["name"]]["failed"]
            stale = rows - current
            if stale:
                text = (f"{stale} of {rows} rows are stale: not computed by the current code ({fingerprint})"
                        f"{f', {failed} failed' if failed else ''}; materialize the column")
            else:
                text = f"all {rows} rows are current: computed by the current code ({fingerprint})"
        md = {"rows": rows, "rows_current": current, "rows_stale": rows - current, "rows_failed": failed}
        out[key] = (rows == current, text, md)
    return out


def computed_column_reads(info: TableInfo) -> dict[str, list[str]]:
    """What each computed column of a table (of a chunk view: its columns
    computed from its own rows) reads of that table, from the stored
    metadata (no UDF unpickled): a UDF column its UDF's inputs (every other
    visible column when it takes the whole row), a SQL column the columns
    its SQL names."""
    names = [n for n, _ in info.schema if not n.startswith("__")]
    out = {}
    for col in info.row_columns if info.is_view else info.columns:
        others = [n for n in names if n != col["name"]]
        if col.get("udf"):
            out[col["name"]] = list(col["udf"].get("input_columns") or others)
        else:
            out[col["name"]] = _named_in(col.get("expr") or "", others)
    return out


def _computed_column_metadata(info: TableInfo, col: dict, reads: list[str], computed: set[str]) -> dict:
    """``dagster/column_lineage`` (the column <- the table's columns it reads: a
    computed one from that column's asset, any other from the table's) and
    ``dagster/column_schema`` (the column, its type and what computes it)."""
    name = col["name"]
    types = dict(info.schema)
    deps = [dg.TableColumnDep(asset_key=dg.AssetKey([info.name, c] if c in computed else [info.name]), column_name=c)
            for c in reads]
    return {
        "dagster/column_lineage": dg.TableColumnLineage(deps_by_column={name: deps} if deps else {}),
        "dagster/column_schema": dg.TableSchema(columns=[
            dg.TableColumn(name, types.get(name, "unknown"), description=column_descriptions(info).get(name))]),
    }


def _column_specs(info: TableInfo, condition: dg.AutomationCondition | None = None, engine: str = "spark"):
    """The asset specs of a base table's computed columns (of a chunk view's:
    the columns computed from its own rows), with ``condition``, and their
    check specs (``COLUMN_CHECK_NAMES``: SQL columns have no failed rows)."""
    table_key = dg.AssetKey([info.name])
    specs, keys, checks = [], {}, []
    reads = computed_column_reads(info)
    cols = info.row_columns if info.is_view else info.columns
    computed = {c["name"] for c in cols}
    for col in cols:
        key = dg.AssetKey([info.name, col["name"]])
        keys[col["name"]] = key
        udf = col.get("udf")
        inputs = reads.get(col["name"], [])
        specs.append(
            dg.AssetSpec(
                key,
                # the table, and the computed columns it reads (filled first: added before it)
                deps=[table_key, *(dg.AssetKey([info.name, c]) for c in inputs if c in computed)],
                description=_column_description(info.name, col),
                kinds={"python", ENGINES[engine][0]} if udf else {"sql"},
                code_version=udf["fingerprint"] if udf else None,
                metadata={
                    **(
                        {"udf": udf["name"], "data_type": udf["data_type"], **_code_references(udf)}
                        if udf
                        else {"expression": col.get("expr", "")}
                    ),
                    **_computed_column_metadata(info, col, inputs, computed),
                },
                group_name=safe_name(info.name) if info.is_view else "sources",
                automation_condition=condition,
                skippable=True,
            ).with_io_manager_key(IO_MANAGER_KEY)
        )
        checks += [dg.AssetCheckSpec(n, asset=key, description=COLUMN_CHECK_DESCRIPTIONS[n])
                   for n in COLUMN_CHECK_NAMES if udf or n == "values_current"]
    return specs, keys, checks


def _run_column_checks(context, info: TableInfo, keys: dict[str, dg.AssetKey], wanted: set):
    """The selected checks of a table's computed columns (of a chunk view's),
    evaluated by the engine after the run's backfills: warnings, with the
    counts as metadata."""
    columns = [n for n, k in keys.items() if any((k, c) in wanted for c in COLUMN_CHECK_NAMES)]
    if not columns:
        return
    table = getattr(context.resources, RESOURCE_KEY).connection().open_table(info.name)
    for name, outcomes in table.check_columns(columns).items():
        for outcome in outcomes:
            if (keys[name], outcome.name) in wanted:
                yield dg.AssetCheckResult(
                    asset_key=keys[name], check_name=outcome.name, passed=outcome.passed,
                    severity=dg.AssetCheckSeverity.WARN, description=outcome.description,
                    metadata=_check_metadata(outcome.metadata),
                )


def lineage_asset(table: TableInfo, tree: list[TableInfo], tables: dict[str, TableInfo], pdef,
                  conditions: bool = False, engine: str = "spark", pipes: PipesLauncher | None = None):
    """One multi-asset for everything downstream of a base table: its computed
    columns, its views and views over them (``tree``, in lineage order).

    One op, so a run carries any part of the lineage and refreshes it in
    order; each asset still materializes on its own (the op is subsettable),
    and partitions record their own numbers. With ``pipes``, each view's
    refresh and checks run in ``python -m mv_assets.pipes`` launched through
    it (:mod:`mv_assets.dagster.pipes_client`).
    """
    # conditions: a table's computed columns are backfilled eagerly (views reading them wait for them)
    specs, column_keys, checks = _column_specs(table, dg.AutomationCondition.eager() if conditions else None, engine)
    views: dict[str, tuple[dg.AssetKey, dict[str, dg.AssetKey]]] = {}
    row_keys: dict[str, dict[str, dg.AssetKey]] = {}
    for info in tree:
        v_specs, v_checks, view_key, col_keys = _view_specs(info, tables, conditions, engine)
        # a chunk view's row columns: backfilled after its refresh, on the view's condition
        r_specs, row_keys[info.name], r_checks = _column_specs(
            info, automation_condition(info.policy) if conditions else None, engine)
        specs += v_specs + r_specs
        checks += v_checks + r_checks
        views[info.name] = (view_key, col_keys)

    @dg.multi_asset(
        name=f"{safe_name(table.name)}_lineage",  # (refresh_<table> is the job: its graph has that name)
        specs=specs,
        check_specs=checks,
        can_subset=True,
        partitions_def=pdef,
        backfill_policy=dg.BackfillPolicy.single_run() if pdef is not None else None,
        required_resource_keys={RESOURCE_KEY},
        op_tags={"dagster/kind/spark": ""},
    )
    def _refresh(context: dg.AssetExecutionContext):
        selected = context.selected_asset_keys
        before: dict[str, int | None] = {}  # views this run refreshed, at their version before: checked since
        remote: dict[str, list[dg.AssetCheckResult] | None] = {}  # checks a Pipes process ran, by view
        try:
            if any(k in selected for k in column_keys.values()):
                _backfill_columns(context, table, column_keys)
            for info in tree:
                view_key, col_keys = views[info.name]
                if any(k in selected for k in (view_key, *col_keys.values())):
                    before.setdefault(info.name, _view_version(context, info.name))
                    remote[info.name] = _materialize(context, info, view_key, col_keys, pdef is not None,
                                                     tables=tables, pipes=pipes,
                                                     since=before[info.name])
                if any(k in selected for k in row_keys[info.name].values()):
                    _backfill_columns(context, info, row_keys[info.name])
            if pdef is not None:
                _compact_if_due(context, table)
        except UdfError as exc:
            raise _udf_failure(exc) from exc
        wanted = {(k.asset_key, k.name) for k in context.selected_asset_check_keys}
        yield from _run_column_checks(context, table, column_keys, wanted)
        for info in tree:
            view_key, col_keys = views[info.name]
            if any(key == view_key for key, _ in wanted):
                names = {n for key, n in wanted if key == view_key}
                if pipes is None:
                    yield from _run_checks(context, info, view_key, names, info.name in before, before.get(info.name))
                else:
                    yield from _pipes_checks(context, pipes, info, view_key, names, remote.get(info.name))
            code_keys = {k for k in col_keys.values() if (k, CODE_CHECK) in wanted}
            if code_keys:
                db = getattr(context.resources, RESOURCE_KEY).connection()
                for key, (passed, text, md) in code_check_evaluations(info, db).items():
                    if key in code_keys:
                        yield dg.AssetCheckResult(
                            asset_key=key, check_name=CODE_CHECK, passed=passed, description=text, metadata=md
                        )
            yield from _run_column_checks(context, info, row_keys[info.name], wanted)
        yield from _outputs(context, order)

    keys = {name: [vk, *cols.values(), *row_keys[name].values()] for name, (vk, cols) in views.items()}
    # lineage order (Dagster wants outputs upstream first): the table's columns, then each view's assets
    order = [*column_keys.values(), *(k for info in tree for k in keys[info.name])]
    return _refresh, keys, list(column_keys.values())


def _outputs(context, order: list):
    """The step's outputs, one per selected asset, once its work is done: an
    asset of the user's downstream of a view (or of a column) in the same run
    runs after it (Dagster skips a step whose upstream output was not
    yielded). Their materializations are the events :func:`_record` logged,
    one per partition with its own numbers and data version: the outputs
    carry the metadata key with which Dagster makes no asset event of an
    output (its own, for the observations of source assets), or each
    partition would show twice. ``order``: the lineage's assets, upstream first."""
    selected = context.selected_asset_keys
    for key in (k for k in order if k in selected):
        yield dg.Output(None, output_name=context.assets_def.get_output_name_for_asset_key(key),
                        metadata={_NO_ASSET_EVENTS: True})


def _compact_if_due(context, table: TableInfo) -> None:
    """The source table's compaction policy, after the lineage's refreshes:
    compact it once it has more fragments than the policy allows (views see
    no change; the sensor's next tick retires the partitions merged)."""
    handle = getattr(context.resources, RESOURCE_KEY).connection().open_table(table.name)
    if handle.compaction_policy is None:
        return
    before = handle.fragment_count()
    if handle.compact_if_due():
        context.log.info(f"{table.name}: compacted by its compaction policy: {before:,} fragments -> "
                         f"{handle.fragment_count():,} (the sensor retires the partitions of those merged)")


def _udf_failure(exc: UdfError) -> dg.Failure:
    """A UDF that raised on a row (on_error="fail") as the run's failure: the
    engine's sentence (column, UDF, row, remedy) and the same as metadata."""
    md: dict[str, Any] = {
        "table": exc.table or "", "column": exc.column or "", "udf": exc.udf, "error_type": exc.error_type,
    }
    if exc.row_id is not None:
        md["row_id"] = exc.row_id
        md["row_of"] = exc.rows_of or ""
    if exc.rows > 1:
        md["batch_rows"] = exc.rows
    if exc.key is not None:
        md["primary_key"] = f"{exc.key[0]}={exc.key[1]}"
    if exc.traceback:
        md["udf_traceback"] = dg.MetadataValue.text(exc.traceback)
    return dg.Failure(description=str(exc), metadata=md)


def _view_version(context, name: str) -> int | None:
    """The view's Lance version now (None: not created yet)."""
    db = getattr(context.resources, RESOURCE_KEY).connection()
    return db.open_view(name).version if name in db.table_names() else None


def _run_checks(context, info: TableInfo, view_key, names: set[str], refreshed: bool = False,
                since: int | None = None):
    """The view's selected checks: after this run refreshed it, what the run
    changed only (the view since version ``since``, O(rows changed)); in a
    run of the checks alone (the Checks tab's Execute, the full-checks
    schedule), every row."""
    resource: MvAssetsResource = getattr(context.resources, RESOURCE_KEY)
    view = resource.connection().open_view(info.name)
    outcomes = (view.check(scope="last_refresh", since_version=since) if refreshed and since is not None
                else view.check(scope="last_refresh") if refreshed else view.check())
    for outcome in outcomes:
        if outcome.name in names:
            yield dg.AssetCheckResult(
                asset_key=view_key,
                check_name=outcome.name,
                passed=outcome.passed,
                description=outcome.description,
                metadata=_check_metadata(outcome.metadata),
            )


def _check_metadata(metadata: dict) -> dict:
    return {k: dg.MetadataValue.json(v) if isinstance(v, (dict, list)) else v for k, v in metadata.items()}


def _version_tags(code_version: str | None, data_version, inputs: dict | None = None,
                  pointers: dict | None = None) -> dict[str, str]:
    """What Dagster records with the materializations it makes from outputs
    (code version, data version, input data versions): logged ones need them
    too, or the UI cannot tell a changed UDF. ``pointers``: the storage id of
    the input partition's event the data version was read from (a source
    fragment's observation); others are left NULL, which Dagster never
    reports stale for partitioned inputs."""
    tags = {"dagster/data_version": str(data_version), "dagster/code_version": code_version or "none"}
    for key, version in (inputs or {}).items():
        pointer = (pointers or {}).get(key)
        tags[f"dagster/input_data_version/{key.to_user_string()}"] = str(version)
        tags[f"dagster/input_event_pointer/{key.to_user_string()}"] = "NULL" if pointer is None else str(pointer)
    return tags


def _record(context, key: dg.AssetKey, partition: str | None, metadata: dict, tags: dict,
            batch: list | None = None) -> None:
    """Record one materialization (of one partition, or of a run without
    partitions): the op's assets are skippable, so these events are what the
    UI shows, each with its own numbers. With ``batch``, kept there for
    :func:`_record_batch`."""
    event = dg.AssetMaterialization(asset_key=key, partition=partition, metadata=metadata, tags=tags)
    if batch is None:
        context.log_event(event)
    else:
        batch.append(event)


def _record_batch(context, events: list[dg.AssetMaterialization] | list[dg.AssetObservation]) -> None:
    """Log a run's materializations (or observations) as one batch per asset, as Dagster logs
    those of a partition range's output: where the instance's storage writes
    batches (``DAGSTER_EVENT_BATCH_SIZE`` set; Postgres, or
    ``mv_assets.dagster.storage`` on SQLite) a batch is one transaction, not
    one per event (~200 s of event storage at 10,000 partitions on SQLite).
    Without batching, Dagster stores them one by one, as ``log_event`` does."""
    from dagster._core.events import DagsterEvent, DagsterEventBatchMetadata, generate_event_batch_id

    op_context = getattr(context, "op_execution_context", context)
    step = getattr(op_context, "_step_execution_context", None)
    logged = getattr(op_context, "_events", None)
    if step is None or not isinstance(logged, list) or len(events) < 2:
        for event in events:  # (not inside a step Dagster runs: one by one)
            context.log_event(event)
        return
    by_asset: dict[dg.AssetKey, list] = {}
    for event in events:
        by_asset.setdefault(event.asset_key, []).append(event)
    for same in by_asset.values():
        batch_id = generate_event_batch_id()
        for i, event in enumerate(same):
            # what log_event does, with the batch's id: stored when the batch ends (or fills)
            last = DagsterEventBatchMetadata(batch_id, i == len(same) - 1)
            logged.append(DagsterEvent.asset_observation(step, event, last) if isinstance(event, dg.AssetObservation)
                          else DagsterEvent.asset_materialization(step, event, last))


def _run_partitions(context: dg.AssetExecutionContext) -> list[str]:
    if context.has_partition_key_range or context.has_partition_key:
        return list(context.partition_keys)
    return []  # a run without partitions (say "Execute all" on the checks tab): the whole view


def _apply_code(context, info: TableInfo, db) -> None:
    """A view declared in code: make the catalog match it first (create the view,
    swap the UDF of columns whose code changed, add new columns)."""
    if info.declared is None:
        return
    try:
        diff = apply_declared(db, info.name, info.declared)
    except ValueError as exc:
        raise dg.Failure(description=f"{info.name!r} cannot follow its code: {exc}") from exc
    if not diff.in_sync:
        done = (["created the view from its code"] if diff.create else []) + (
            [f"swapped in the new code of {', '.join(diff.altered)} (rows it computed before are stale until "
             "recomputed)"] if diff.altered else []) + ([f"added {', '.join(diff.added)}"] if diff.added else []) + (
            ["set its owners and tags"] if diff.ownership and not diff.create else []) + (
            ["set its refresh policy"] if diff.policy and not diff.create else [])
        context.log.info(f"{info.name}: applied the code: {'; '.join(done)}")


@contextmanager
def _progress(context, what: str):
    """Log the progress of the engine's work started inside (rows done of
    planned, rate, time left, rows from checkpoints) to the run log, every
    $MV_ASSETS_PROGRESS_SECONDS (10) while it runs: work that ends sooner logs none."""
    with progress.listen(lambda p: context.log.info(f"{what}: {p}")):
        yield


def _pinned_version(context, info: TableInfo, view) -> int | None:
    """The source version a refresh of a view over a base table goes to: the
    sensor's pinned one (never behind the view), or None (the latest)."""
    tags = context.run.tags
    pinned = int(tags[TAG_SOURCE_VERSION]) if TAG_SOURCE_VERSION in tags else None
    in_run = context.run.asset_selection or set()
    if any(dg.AssetKey([info.source_name, c]) in in_run for c in info.reads):
        pinned = None  # this run backfills a column the view reads: refresh after it, to the latest version
    current = view.source_version
    if pinned is not None and current is not None and pinned < current:
        pinned = current  # another run got further already: never go back
    return pinned


def _refresh_view(context, info: TableInfo, view, fragments: list[int] | None, recompute):
    """Refresh the view (views over views bring their upstream along first)."""
    if info.over_view:
        # A view over a view never fails because its upstream is behind: the
        # upstream chain is brought up to date first (each refresh waits for a
        # running refresh of the same view, so concurrent runs line up).
        db = view.connection
        chain = db.upstream(info.name)
        for i, name in enumerate(chain):
            up = db.open_view(name)
            if up.pending_source_versions() or up.refresh_state().scoped_since_whole:
                with _progress(context, f"{name} (upstream of {info.name}): refresh"), db.refreshing_after(chain[:i]):
                    r = up.refresh()
                context.log.info(f"brought upstream view {name} to source v{r.to_version} first")
        # (a source write landing since the chain was brought up is the next run's)
        with _progress(context, f"{info.name}: refresh"), db.refreshing_after(chain):
            return view.refresh(recompute=recompute)
    pinned = _pinned_version(context, info, view)
    what = f"{info.name}: refresh" + (f" of {', '.join(recompute)}" if recompute else "")
    with _progress(context, what):
        return view.refresh(src_version=pinned, fragments=fragments, recompute=recompute)


def _covers_every_fragment(table: Table, fragments: list[int]) -> bool:
    """Whether ``fragments`` name every fragment of ``table`` (fragments
    listed only when they may: a run of a few partitions of a table of many
    lists none)."""
    chosen = set(fragments)
    return len(chosen) >= table.fragment_count() and set(table.fragment_ids()) <= chosen


def _materialize(context, info: TableInfo, view_key, col_keys: dict, partitioned: bool, *,
                 tables: dict[str, TableInfo] | None = None,
                 pipes: PipesLauncher | None = None, since: int | None = None) -> list | None:
    """Refresh the view for the run's partitions (in this process, or through
    ``pipes``) and record its materializations. Through Pipes: the check
    results the Pipes process reported (None: it ran no checks)."""
    resource: MvAssetsResource = getattr(context.resources, RESOURCE_KEY)
    db = resource.connection() if pipes is None else resource.reader()  # (through Pipes: no Spark here)
    _apply_code(context, info, db)
    view = db.open_view(info.name)
    selected = context.selected_asset_keys
    columns = [n for n, k in col_keys.items() if k in selected]
    keys = _run_partitions(context) if partitioned else []
    fragments, bad = fragment_keys(keys)
    if bad:
        raise dg.Failure(
            description=(
                f"partition keys {bad} of {info.name!r} are not fragment ids of {info.source!r}: partitions "
                f"of this asset are source fragments (the {info.root}_changes sensor adds them and retires "
                "others). Pick existing partitions."
            )
        )
    sensor_run = context.run.tags.get(TAG_SCOPE) == "changes"
    root = db.open_table(info.root) if fragments else None  # (keys given: their fragments)
    if root is not None and not sensor_run:  # (a sensor's run may name retired ones: it refreshes the view whole)
        gone = sorted(set(fragments) - set(root.fragment_ids()))
        if gone:
            raise dg.Failure(
                description=(
                    f"partitions {[str(f) for f in gone]} of {info.name!r} are fragments {info.root!r} no longer "
                    "has (compacted or every row deleted: their rows, if any, are in other fragments now); the "
                    f"{info.root}_changes sensor retires them at its next tick. Pick existing partitions."
                )
            )
    whole = not info.scoped or root is None or sensor_run or _covers_every_fragment(root, fragments)
    started = time.perf_counter()
    checks = None
    if info.name in context.run.tags.get(TAG_RECORD_ONLY, "").split(","):
        # (what the view holds is recorded; a refresh would go against its policy, or its upstream's)
        context.log.info(f"{info.name}: recording {len(keys)} partition(s) as the view holds them (refreshed "
                         "outside the runs that named them); not refreshed")
        result, recomputed, never = None, {}, {}
    elif view_key not in context.selected_asset_keys and view.refresh_state().load_number == 0:
        _never_refreshed(info, columns)
    elif pipes is None:
        result, recomputed, never = _compute(context, info, view, view_key, columns, fragments, whole)
    else:
        report = view_key if view_key in selected else col_keys[columns[0]]  # (a key the step selected)
        result, recomputed, never, checks = _launch(context, pipes, info, view, view_key, columns, fragments,
                                                    whole, since, report)
        view = db.open_view(info.name)  # as the Pipes process left it
    duration = time.perf_counter() - started
    _log_outcome(context, info, result, recomputed, columns, duration, launched=pipes is not None, never=never)
    _record_run(
        context, info, db, view, view_key, col_keys, columns, keys if partitioned else [], fragments, whole, result,
        recomputed, duration, tables=tables or {}, never=never,
        unchanged=_unchanged_partitions(context, info, view_key, result, keys) if partitioned else {},
    )
    return checks


def _unchanged_partitions(context, info: TableInfo, view_key, result, keys: list[str]) -> dict[str, str]:
    """A join view's partitions whose rows a sensor's run left as they were,
    with the data version each keeps: a joined table's change reaches the
    first-table fragments holding rows that match its changed rows
    (``RefreshResult.first_fragments``: those and the fragments the first
    table's own changes touched), so only their partitions get a new data
    version and only they read as changed downstream; every partition the run
    names is recorded (it reflects the joined tables' new versions, and reads
    as up to date). Runs launched by hand, full refreshes and other kinds of
    views: none (every partition gets its data version from its inputs)."""
    touched = None if result is None else result.first_fragments
    if (info.kind != "join" or touched is None or not keys
            or context.run.tags.get(TAG_SCOPE) != "changes"):
        return {}
    chosen = {str(f) for f in touched}
    rest = [k for k in keys if k not in chosen]
    had = context.instance.event_log_storage.get_latest_tags_by_partition(
        view_key, DagsterEventType.ASSET_MATERIALIZATION, [DATA_VERSION_TAG], asset_partitions=rest) if rest else {}
    out = {k: v for k in rest if (v := had.get(k, {}).get(DATA_VERSION_TAG)) is not None}
    if out:
        shown = sorted(chosen & set(keys), key=int)
        context.log.info(
            f"{info.name}: rows changed in {len(keys) - len(out)} of the run's {len(keys)} partitions "
            f"({', '.join(shown[:20]) or 'none'}{', ...' if len(shown) > 20 else ''}): the first-table "
            f"fragments holding rows this refresh changed; the other {len(out)} keep their data version")
    return out


def _compute(context, info: TableInfo, view, view_key, columns: list[str], fragments: list[int], whole: bool):
    """In this process: the refresh, and the recompute of UDF columns whose
    code changed (or added since). The refresh's result (None: none), the
    recomputes by column, and how many rows of each no code had computed."""
    result = None
    recomputed: dict[str, Any] = {}  # column -> the backfill that recomputed its stale rows
    never: dict[str, int] = {}
    if view_key in context.selected_asset_keys:
        result = _refresh_view(context, info, view, None if whole else fragments, None)
    elif not whole:  # only UDF columns of some partitions: recompute them there
        result = _refresh_view(context, info, view, fragments, columns)
    if whole:
        # UDF columns whose code changed have stale rows: recompute exactly those
        for name in columns:
            if name in recomputed:  # (filled with a sibling of its multi-column UDF)
                continue
            where = view.recompute_where(name)
            plan = view.plan_backfill(name, where=where)
            if plan.rows:
                resuming = (f"; {plan.rows_checkpointed:,} of them have results checkpointed by an interrupted run"
                            if plan.rows_checkpointed else "")
                never[name] = view.rows_never_computed(name, where)
                what, rows = recompute_words(plan.rows, never[name])
                verb, why = what.split(" ", 1)
                context.log.info(f"{info.name}: {verb} {name} {why}: {rows}{resuming}")
                with _progress(context, f"{info.name}: recomputing {name}"):
                    done = view.backfill(name, where=where)
                for sibling in done.columns:  # a multi-column UDF fills its siblings too
                    recomputed[sibling] = done
                    never[sibling] = never[name]
    return result, recomputed, never


def _never_refreshed(info: TableInfo, columns: list[str]) -> NoReturn:
    """UDF columns materialized alone of a view never refreshed: their rows
    come with the view's refresh; nothing to record (it said every row was
    current, over an empty view, and ran the assets downstream over nothing)."""
    raise dg.Failure(
        description=f"{info.name!r} was never refreshed: its UDF columns ({', '.join(columns)}) are computed with its "
                    f"rows. Materialize {info.name!r} itself (the view's asset) first, or with them.",
        metadata={"view": info.name})


def _launch(context, pipes: PipesLauncher, info: TableInfo, view, view_key, columns: list[str],
            fragments: list[int], whole: bool, since: int | None, report_key: dg.AssetKey | None = None):
    """Through Dagster Pipes: what :func:`_compute` does, in ``python -m
    mv_assets.pipes`` where the client launches it, with the view's selected
    checks. Nothing to do (UDF columns alone, every row current): no launch."""
    refresh = view_key in context.selected_asset_keys or not whole
    wheres = {n: view.recompute_where(n) for n in columns} if whole else {}
    stale = [n for n, where in wheres.items() if view.plan_backfill(n, where=where).rows]
    if not refresh and not stale:
        return None, {}, {}, None
    never = {n: view.rows_never_computed(n, wheres[n]) for n in stale}
    request = {
        "fragments": None if whole else fragments,
        "src_version": None if info.over_view else _pinned_version(context, info, view),
        "recompute": columns if view_key not in context.selected_asset_keys and not whole else None,
        "backfill": stale, "upstream": info.over_view, "refresh": refresh, "since_version": since,
        "checks": sorted(k.name for k in context.selected_asset_check_keys if k.asset_key == view_key),
    }
    resource: MvAssetsResource = getattr(context.resources, RESOURCE_KEY)
    done = launch_view(context, pipes, resource, info.name, view_key, request, report_key)
    if refresh and done.result is None:  # (a launch that ran something else, and exited 0)
        raise dg.Failure(
            description=f"{info.name}: the Pipes launch ended without reporting a refresh: nothing says the view was "
                        f"refreshed (does the launched process run `python -m mv_assets.pipes`, with the extras "
                        f"the client passes?)", metadata={"view": info.name})
    return done.result, done.recomputed, never, done.checks


def _pipes_checks(context, pipes: PipesLauncher, info: TableInfo, view_key, names: set[str],
                  reported: list[dg.AssetCheckResult] | None):
    """The view's selected checks through Pipes: those the run's launch
    reported, or (the view not refreshed by this run) a launch of the checks
    alone, every row."""
    if reported is None:
        resource: MvAssetsResource = getattr(context.resources, RESOURCE_KEY)
        request = {"refresh": False, "upstream": False, "fragments": None, "checks": sorted(names)}
        reported = launch_view(context, pipes, resource, info.name, view_key, request).checks
    yield from (r for r in reported if r.check_name in names)


def _log_outcome(context, info: TableInfo, result, recomputed: dict, columns: list[str], duration: float,
                 launched: bool = False, never: dict[str, int] | None = None) -> None:
    """The run's lines of what it did (``launched``: through Pipes, whose
    process logged the refresh's line already)."""
    if result is not None and not launched:
        context.log.info(result.told(info.kind, duration))
    if result is not None and result.indexes:
        up = result.indexes
        context.log.info(
            f"{info.name}: indexes brought up to date after the commit: updated {up['updated'] or 'none'}, "
            f"rebuilt {up['rebuilt'] or 'none'}" + (f"; NOT updated {up['failed']} (searches stay right by "
                                                   "scanning the rows outside them)" if up["failed"] else "")
        )
    for done in {id(r): r for r in recomputed.values()}.values():
        resumed = f", {done.rows_resumed:,} from checkpoints" if done.rows_resumed else ""
        what, _ = _recompute_words(done, never)
        verb, why = what.split(" ", 1)
        new = _never_in(done, never)
        rows = ", ".join(([f"{done.rows_written - new:,} rows computed by other code rewritten"]
                          if done.rows_written > new else []) + ([f"{new:,} rows never computed written"] if new else []))
        context.log.info(
            f"{info.name}: {verb[:-3]}ed {', '.join(done.columns)} {why}: {rows or '0 rows written'} "
            f"({done.udf_rows_computed:,} computed{resumed}, {done.rows_failed:,} failed)"
        )
    if result is None and not recomputed:
        context.log.info(f"{info.name}: {', '.join(columns)}: every row is current: nothing to compute")


SCOPE_CHANGES = "changes since the last refresh"
SCOPE_FRAGMENTS = "selected fragments"
SCOPE_RECOMPUTE = "rows computed by other code (the UDF code changed)"
SCOPE_NEW = "rows never computed (a new UDF column)"
SCOPE_NOTHING = "nothing to compute: every row is current"


def _never_in(done, never: dict[str, int] | None) -> int:
    """Of the rows a recompute wrote, those no code had computed before."""
    return min((never or {}).get(done.columns[0], 0), done.rows_written)


def _recompute_words(done, never: dict[str, int] | None) -> tuple[str, str]:
    """:func:`recompute_words` of a recompute that wrote ``done.rows_written`` rows."""
    return recompute_words(done.rows_written, _never_in(done, never))


def _record_run(
    context, info: TableInfo, db, view, view_key, col_keys: dict, columns: list[str], keys: list[str],
    fragments: list[int], whole: bool, result, recomputed: dict, duration: float, *,
    tables: dict[str, TableInfo], unchanged: dict[str, str] | None = None, never: dict[str, int] | None = None,
) -> None:
    """Materialization events of the run: one per asset, or one per partition.

    A partition's numbers are its own (rows of its source fragment); the run's
    totals are labelled ``run_*``. Every view materialization's
    ``dagster/row_count`` (the asset page's "Row count") is the whole view's;
    ``partition_row_count`` is the partition's. Views refreshed as a whole
    (over views, limited, table-function) record only run totals: their rows
    are not counted per source fragment. ``unchanged``: partitions whose rows
    the run left as they were, with the data version each keeps
    (:func:`_unchanged_partitions`)."""
    selected = set(context.selected_asset_keys)
    # UDF columns of some partitions selected alone: their refresh brought the view's rows there to the
    # source's version; the view's partitions whose data version that moved are recorded too (below)
    along = _view_recorded(context, view_key, keys) if (
        view_key not in selected and not whole and keys and _moved(result)) else None
    if along is not None:
        selected.add(view_key)
    view_scope = SCOPE_CHANGES if whole else SCOPE_FRAGMENTS
    base_md, run_md, computed_key = _run_metadata(info, view, result, duration)
    # rows by source fragment: a partition's own only for views refreshed per fragment
    by_fragment = result.rows_by_fragment if result is not None and info.scoped else {}
    column_md = functools.partial(_column_metadata, info=info, result=result, recomputed=recomputed, never=never,
                                  view_scope=view_scope, base_md=base_md, by_fragment=by_fragment)
    fingerprints = {c["name"]: c["udf"]["fingerprint"] for c in info.udf_columns}
    view_inputs, partition_inputs = _run_inputs(context, info, db, view, result, fragments, keys, tables=tables)
    view_tags = _version_tags(None, view.version, view_inputs)
    col_tags = {n: _version_tags(fingerprints[n], view.version, {view_key: view.version}) for n in columns}
    view_rows = view.count_rows() if view_key in selected else 0
    view_md = {**run_md, "scope": view_scope, "dagster/row_count": view_rows}
    if not keys:  # a run without partitions: one event per asset
        if view_key in selected:
            md = {**view_md, computed_key: sum(result.rows_by_fragment.values()) if result is not None else 0,
                  **_status_metadata(view), **_index_metadata(view)}
            _record(context, view_key, None, md, view_tags)
        for name in columns:
            _record(context, col_keys[name], None, column_md(name, None), col_tags[name])
        return
    per_fragment = (
        view.rows_by_fragment(base_md["source_version"], fragments)
        if info.scoped and view_key in selected and len(fragments) <= PER_PARTITION_LIMIT
        and base_md["source_version"] is not None else {}
    )
    index_md = _index_metadata(view) if view_key in selected else {}
    batch: list[dg.AssetMaterialization] = []
    for key_str, fid in zip(keys, fragments, strict=True):
        inputs, pointers, held = partition_inputs(fid, key_str)
        held = (unchanged or {}).get(key_str, held)
        if view_key in selected and (along is None or along.get(key_str) != held):
            if along is not None:
                context.log.info(f"{info.name}: partition {key_str} refreshed with {', '.join(columns)} (its source "
                                 f"fragment's data version {held}): recorded for the view too")
            part_md = {**view_md, "source_fragment": fid, **index_md}
            if unchanged:
                part_md["rows_changed"] = key_str not in unchanged
            if info.scoped:
                part_md[computed_key] = int(by_fragment.get(fid, 0))
            if fid in per_fragment:
                part_md["partition_row_count"] = per_fragment[fid]
            _record(context, view_key, key_str, part_md, _version_tags(None, held, inputs, pointers), batch)
        for name in columns:  # (computed with the view's rows, in the same op: no pointer to them)
            tags = _version_tags(fingerprints[name], f"{held}@{fingerprints[name]}", {view_key: held})
            _record(context, col_keys[name], key_str, column_md(name, fid), tags, batch)
    if whole:
        _record_recomputed_elsewhere(context, info, view_key, col_keys, [n for n in columns if n in recomputed],
                                     keys, fingerprints, column_md, batch)
    _record_batch(context, batch)


def _record_recomputed_elsewhere(context, info: TableInfo, view_key, col_keys: dict, columns: list[str],
                                 keys: list[str], fingerprints: dict, column_md, batch: list) -> None:
    """UDF columns whose code changed, or added since, recomputed over the
    whole view by a run of a few partitions (a sensor's run of the new
    fragments): every other partition whose latest materialization was by
    other code, or that has none (a new column's), is current now too, and is
    recorded with the current code version (else Dagster shows it "has a new
    code version", or "Missing", until someone materializes it again, which
    would compute nothing). Its data version follows the view's partition as
    last recorded; its numbers are the rows of its fragment the recompute
    wrote."""
    if not columns:
        return
    current = context.instance.get_dynamic_partitions(partitions_def_name(info.root))
    ran = set(keys)
    for name in columns:
        # (a column partition's data version is "<the view partition's>@<code version>": the only tag
        # of the latest by partition Dagster lets one read, besides a few of its own)
        had = context.instance.event_log_storage.get_latest_tags_by_partition(
            col_keys[name], DagsterEventType.ASSET_MATERIALIZATION, [DATA_VERSION_TAG])
        by_other_code = [p for p in current if p not in ran and not str(
            had.get(p, {}).get(DATA_VERSION_TAG, "")).endswith(f"@{fingerprints[name]}")]
        stale = sorted(by_other_code, key=int)
        if not stale:
            continue
        held = _view_recorded(context, view_key, stale)
        verb = "computed" if not had else "recomputed"
        context.log.info(f"{info.name}: {name} {verb} in {len(stale)} partition(s) outside the run "
                         f"({', '.join(stale[:20])}{', ...' if len(stale) > 20 else ''}): recorded with its current "
                         f"code ({fingerprints[name]})")
        for key_str in stale:
            version = held.get(key_str)
            tags = _version_tags(fingerprints[name], f"{version}@{fingerprints[name]}",
                                 {view_key: version} if version is not None else None)
            _record(context, col_keys[name], key_str, column_md(name, int(key_str)), tags, batch)


def _moved(result) -> bool:
    """Whether a refresh went to another source version than the view's (its
    rows updated count the UDF values recomputed: not a sign)."""
    return result is not None and result.from_version != result.to_version


def _view_recorded(context, view_key, keys: list[str]) -> dict[str, str | None]:
    """The data version last recorded for each of the view's partitions ``keys``."""
    had = context.instance.event_log_storage.get_latest_tags_by_partition(
        view_key, DagsterEventType.ASSET_MATERIALIZATION, [DATA_VERSION_TAG], asset_partitions=keys)
    return {k: had.get(k, {}).get(DATA_VERSION_TAG) for k in keys}


def _run_inputs(
    context, info: TableInfo, db, view, result, fragments: list[int], keys: list[str], *,
    tables: dict[str, TableInfo],
) -> tuple[dict, Callable[[int, str], tuple[dict, dict, str]]]:
    """The inputs of a view's run: the whole view's (its source's data version,
    the source columns it reads, a join view's joined sources), and a function
    of a partition (its fragment id and key) giving its inputs (data versions,
    event pointers) and its own data version."""
    source = db.open_table(info.source_name)
    source_key = dg.AssetKey([info.source_name])
    source_version = source.version if info.over_view else source.data_version()
    view_inputs = {source_key: source_version}
    view_inputs.update({dg.AssetKey([info.source_name, c]): source.version for c in info.reads})
    # a join view's joined sources: inputs of every partition (each reads all of them)
    joined, joined_pointers = _joined_inputs(context, info, tables, db)
    view_inputs.update(joined)
    # A view over a base table: each partition's input is its own source
    # fragment, as observed (the run observes what the instance has not seen:
    # never observed, a partition would show Unsynced right after this run).
    # (not refreshed by this run: the fragments as the view read them)
    read = view.source_version if result is None else result.to_version
    if result is not None and info.kind == "join_aggregate":  # (its own source is the join under it: the first
        read = view.source_versions.get(info.source_name)      # table's version is the one it recorded)
    fragment_inputs = (observe_fragments(context, source, fragments, read)
                       if keys and not info.over_view else {})
    # A view over a view: each partition's inputs are the upstream view's partition and the upstream
    # columns it reads, as last materialized (Dagster reports it Unsynced when they change after).
    upstream_keys = [source_key, *(dg.AssetKey([info.source_name, c]) for c in info.reads)]
    upstream = _latest_materializations(context.instance, upstream_keys, keys) if keys and info.over_view else {}

    def partition_inputs(fid: int, key_str: str) -> tuple[dict, dict, str]:
        """A partition's inputs (data versions, event pointers) and its own data
        version: what it holds, its source fragment's rows as read (over a view:
        the upstream partitions'), so a run that changes nothing there leaves it."""
        # (a join view's: its joined sources' versions too, so a change of one is a new data version)
        also = "".join(f"|{k.to_user_string()}@{v}" for k, v in joined.items())
        if info.over_view:
            got = {k: upstream.get((k, key_str), ("none", None)) for k in upstream_keys}
            inputs = {k: v for k, (v, _) in got.items()}
            return ({**inputs, **joined}, {**{k: p for k, (_, p) in got.items()}, **joined_pointers},
                    "|".join(inputs.values()) + also)
        version, pointer = fragment_inputs.get(fid, ("gone", None))  # a fragment gone meanwhile (retired next)
        return {**view_inputs, source_key: version}, {source_key: pointer, **joined_pointers}, version + also

    return view_inputs, partition_inputs


def _run_metadata(info: TableInfo, view, result, duration: float) -> tuple[dict, dict, str]:
    """The metadata of every materialization of a view's run (versions, its
    duration), the run's totals (labelled ``run_*``) added to it, and the
    name of the count of what the refresh computed (rows; a chunk view's
    parents)."""
    base_md = {
        "source_version": view.source_version if result is None else result.to_version,
        "view_version": view.version,
        "run_duration_s": round(duration, 3),
        # a join view: the version of every source it reflects (source_version is its first source's)
        **({"source_versions": dg.MetadataValue.json(view.source_versions)} if info.join is not None else {}),
    }
    # a chunk view's refresh counts parents (documents), its rows are their chunks; an aggregate view's, groups
    unit = {"chunker": "parents", "aggregate": "groups", "join_aggregate": "groups"}.get(info.kind, "rows")
    computed_key = "parents_chunked" if unit == "parents" else "rows_computed"
    run_md = dict(base_md)
    if result is not None:
        run_md.update({
            "runner": result.runner, f"run_{unit}_inserted": result.rows_inserted,
            f"run_{unit}_updated": result.rows_updated, f"run_{unit}_deleted": result.rows_deleted,
            f"run_{computed_key}": sum(result.rows_by_fragment.values()),
        })
        details = getattr(result, "details", None) or {}
        # a join view's refresh: what its plan read, and the arrangements it probed (kept, caught up, loaded)
        run_md.update({f"run_{k}": dg.MetadataValue.json(details[k]) for k in ("work", "arrangements")
                       if details.get(k)})
    return base_md, run_md, computed_key


def _column_metadata(name: str, fid: int | None, *, info: TableInfo, result, recomputed: dict, view_scope: str,
                     base_md: dict, by_fragment: dict, never: dict[str, int] | None = None) -> dict:
    """The metadata of a UDF column's materialization (of partition ``fid``;
    None: of the run): what the run computed and recomputed of it."""
    refreshed = result is not None and name in result.udf_rows_computed
    done = recomputed.get(name)
    # (every row it wrote never computed: a new column's first fill)
    redone = SCOPE_NEW if done is not None and 0 < done.rows_written == _never_in(done, never) else SCOPE_RECOMPUTE
    scope = "; ".join([view_scope] * refreshed + [redone] * (done is not None)) or SCOPE_NOTHING
    md: dict[str, Any] = {**base_md, "scope": scope}
    if result is not None and refreshed:
        md["run_udf_rows_computed"] = result.udf_rows_computed[name] + (done.udf_rows_computed if done else 0)
    elif done is not None:
        md["run_udf_rows_computed"] = done.udf_rows_computed
    if done is not None:
        md["run_udf_rows_recomputed"] = done.rows_written
    if fid is None or info.scoped:  # a partition's own count: rows of its fragment this run computed
        rows = (sum(by_fragment.values()) if fid is None else int(by_fragment.get(fid, 0))) if refreshed else 0
        if done is not None:
            rows += sum(done.rows_by_fragment.values()) if fid is None else int(done.rows_by_fragment.get(fid, 0))
        md["udf_rows_computed"] = rows
    if fid is not None:
        md["source_fragment"] = fid
    return md


def _joined_inputs(context, info: TableInfo, tables: dict[str, TableInfo], db) -> tuple[dict, dict]:
    """A join view's joined sources as inputs of its materializations: each
    one's data version (a base table's: the newest Lance version that changed
    rows, as its observations say; a view's: its Lance version; a computed
    column read: its table's version) and the storage id of the newest event
    of any of its partitions (None: none yet). Every partition of the view
    reads all of a joined source, so for a partitioned one Dagster reports the
    view's partitions Unsynced once a later event of any of its partitions
    brings a new data version; an unpartitioned one (a table read by joins
    only) is compared by data version, and observed now when the instance
    does not know it as it is (never observed, it would read as changed)."""
    inputs: dict[dg.AssetKey, Any] = {}
    for name in info.joined:
        if name not in db:
            continue
        handle = db.open_table(name)
        key = dg.AssetKey([name])
        version = handle.version if isinstance(handle, MaterializedView) else handle.data_version()
        if not isinstance(handle, MaterializedView) and name in tables and not tables[name].partitioned:
            seen = context.instance.fetch_observations(key, limit=1).records
            if not seen or (seen[0].event_log_entry.tags or {}).get(DATA_VERSION_TAG) != str(version):
                context.log_event(source_observation(handle, handle.version, version))
        inputs[key] = version
        inputs.update({dg.AssetKey([name, c]): handle.version for c in info.joined_reads.get(name, [])})
    return inputs, {k: _latest_event_id(context.instance, k) for k in inputs}


def _latest_event_id(instance, key: dg.AssetKey) -> int | None:
    """The storage id of the newest materialization or observation of any partition of ``key``."""
    ids = [r.storage_id for fetch in (instance.fetch_materializations, instance.fetch_observations)
           for r in fetch(key, limit=1).records]
    return max(ids) if ids else None


def _latest_materializations(instance, keys: list[dg.AssetKey], partitions: list[str]) -> dict:
    """``{(asset key, partition): (data version, storage id)}`` of the latest
    materialization of each (two queries per asset, whatever the count)."""
    out = {}
    storage = instance.event_log_storage
    for key in keys:
        tags = storage.get_latest_tags_by_partition(
            key, DagsterEventType.ASSET_MATERIALIZATION, [DATA_VERSION_TAG], asset_partitions=partitions)
        ids = instance.get_latest_storage_id_by_partition(key, DagsterEventType.ASSET_MATERIALIZATION, set(partitions))
        for p, sid in ids.items():
            out[(key, p)] = (tags.get(p, {}).get(DATA_VERSION_TAG, "none"), sid)
    return out


def _column_description(table: str, col: dict) -> str:
    if col["kind"] == "sql":
        return f"SQL column {col['name']} of {table}: {col['expr']}, computed for new rows as they arrive."
    return _udf_description(table, col).replace("UDF column", "Computed column", 1) + (
        " Materializing backfills the rows that lack a value from this code (checkpointed, resumable)."
    )


def _backfill_columns(context, info: TableInfo, keys: dict[str, dg.AssetKey]):
    """Materialize selected computed columns of a base table (or of a chunk
    view's rows): a backfill of the rows lacking a current value (exact in any
    partition run)."""
    resource: MvAssetsResource = getattr(context.resources, RESOURCE_KEY)
    table = resource.connection().open_table(info.name)
    done: dict[str, Any] = {}
    inputs: dict | None = None
    parts = _run_partitions(context)
    fingerprints = {c["name"]: (c.get("udf") or {}).get("fingerprint")
                    for c in (info.row_columns if info.is_view else info.columns)}
    # A chunk view's rows are partitioned by their parent's source fragment: the rows
    # each partition's backfill computed are its rows lacking a value before, less after.
    by_source: dict[str, dict[int, int]] = {}
    for name, key in keys.items():
        if key not in context.selected_asset_keys:
            continue
        if name not in done:
            lacking = None
            if info.is_view and parts:
                view = resource.connection().open_view(info.name)
                fids = [int(p) for p in parts if p.isdigit()]
                lacking = (view, view.source_version, fids, view.rows_by_fragment(
                    view.source_version or 0, fids, lacking=name) if view.source_version is not None else {})
            with _progress(context, f"{info.name}.{name}: backfill"):
                # (not the rows its UDF skipped under its current code: retry_errors retries them)
                result = table.backfill(name, where=table.recompute_where(name))
            if lacking is not None:
                view, at, fids, before = lacking
                after = view.rows_by_fragment(at, fids, lacking=name) if at is not None else {}
                computed = {f: before.get(f, 0) - after.get(f, 0) for f in fids}
                for c in result.columns:
                    by_source[c] = computed
            for c in result.columns:  # a multi-column UDF fills its siblings too
                done[c] = result
            if not result.rows_planned:
                context.log.info(f"{info.name}.{name}: every row has a current value: nothing to backfill")
            else:
                context.log.info(
                    f"{info.name}.{name}: backfill: {result.rows_written:,} rows written, {result.rows_failed:,} "
                    f"failed, {result.rows_skipped:,} changed meanwhile (left for the next backfill); "
                    f"{result.udf_rows_computed:,} computed, {result.rows_resumed:,} from checkpoints; "
                    f"job {result.job_id}"
                )
        r = done[name]
        totals = {
            "rows_written": r.rows_written,
            "rows_failed": r.rows_failed,
            "rows_skipped": r.rows_skipped,
            "udf_rows_computed": r.udf_rows_computed,
            "rows_resumed": r.rows_resumed,
            "batches_resumed": r.batches_resumed,
        }
        version = r.version if r.version is not None else table.version
        table_key = dg.AssetKey([info.name])
        if not parts:
            tags = _version_tags(fingerprints.get(name), version, {table_key: table.data_version()})
            _record(context, key, None, {"job_id": r.job_id, **totals, "table_version": version}, tags)
            continue
        if inputs is None:  # each partition's input: its own fragment (the table's), as observed
            inputs = {} if info.is_view else observe_fragments(context, table, fragment_keys(parts)[0])
        run_md = {"job_id": r.job_id, **{f"run_{k}": v for k, v in totals.items()}, "table_version": version}
        batch: list[dg.AssetMaterialization] = []
        for part in parts:  # the backfill covered every partition of the run: each records its own rows
            fid = int(part) if part.isdigit() else None
            rows = (by_source.get(name, {}) if info.is_view else r.rows_by_fragment).get(fid, 0) if fid is not None else 0
            if info.is_view:  # a chunk view's columns: their input is the view
                tags = _version_tags(fingerprints.get(name), version, {table_key: table.version})
            else:
                observed, pointer = inputs.get(fid, ("gone", None)) if fid is not None else ("gone", None)
                tags = _version_tags(fingerprints.get(name), version, {table_key: observed}, {table_key: pointer})
            _record(context, key, part, {**run_md, "rows_computed": rows, "source_fragment": fid}, tags, batch)
        _record_batch(context, batch)
