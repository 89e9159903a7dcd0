"""Indexes on tables and views, declared once and kept covering every row.

Lance indexes cover the fragments they were built over; rows written later are
searched by a flat scan (results stay right, searches get slower) until the
index is updated. A view's rows are rewritten by its refreshes, so the engine
keeps its indexes up to date itself:

* after every refresh that commits rows (and every backfill or column load),
  :func:`catch_up` adds the fragments an index does not cover to it
  (``optimize_indices``: new rows are assigned to the existing partitions, no
  retraining, and merged into the index: one segment stays one). When more
  than half the rows are not covered (a full rebuild replaced them, say), the
  index is built again from scratch instead: an incremental update would keep
  partitions trained on rows that are gone;
* a full refresh that replaces every row (a Lance ``Overwrite``, which drops
  the indexes) builds each index that was there again, with the parameters it
  was declared with;
* ``optimize()`` updates them too.

What an index was declared with (type, column, parameters) is kept in the
dataset's Lance config under ``mv_assets.index.<name>``, so it travels with the
data; an index made by another tool through Lance directly has no declaration
until the engine has to rebuild it, when one is read from its statistics. An
index declared on a table or view with no rows yet is *pending*: recorded, and
built by the first catch-up that finds rows.

This module is storage: no dagster, no Spark.
"""

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa

from mv_assets.model.names import is_internal_column
from mv_assets.storage import keys, objects

__all__ = [
    "VECTOR_INDEX_TYPES", "SCALAR_INDEX_TYPES", "FTS_INDEX_TYPE", "IndexSpec", "IndexInfo", "create_index",
    "drop_index", "list_indexes", "index_stats", "catch_up", "specs_to_rebuild", "vector_columns", "pick_vector_column",
]

CONFIG_PREFIX = "mv_assets.index."
VECTOR_INDEX_TYPES = ("IVF_FLAT", "IVF_PQ", "IVF_SQ", "IVF_HNSW_FLAT", "IVF_HNSW_SQ", "IVF_HNSW_PQ")
SCALAR_INDEX_TYPES = ("BTREE", "BITMAP", "LABEL_LIST")
FTS_INDEX_TYPE = "INVERTED"
METRICS = ("l2", "cosine", "dot", "hamming")
# an index with more than this share of its rows outside it is built again, not updated
REBUILD_UNCOVERED_SHARE = 0.5


@dataclass(frozen=True)
class IndexSpec:
    """What an index is: its name, column, Lance index type and the Lance
    keyword arguments it is built with."""

    name: str
    column: str
    index_type: str
    params: dict[str, Any] = field(default_factory=dict)
    pending: bool = False  # declared before there were rows to build it from

    @property
    def kind(self) -> str:
        if self.index_type in VECTOR_INDEX_TYPES:
            return "vector"
        return "fts" if self.index_type == FTS_INDEX_TYPE else "scalar"

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "column": self.column, "index_type": self.index_type,
                           "params": self.params, "pending": self.pending}, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> "IndexSpec":
        d = json.loads(raw)
        return cls(d["name"], d["column"], d["index_type"], dict(d.get("params") or {}), bool(d.get("pending")))


@dataclass(frozen=True)
class IndexInfo:
    """An index as ``list_indices()`` shows it, with how many rows it covers.

    ``num_unindexed_rows`` are rows of fragments the index does not cover yet
    (searched by a flat scan until the next catch-up)."""

    name: str
    index_type: str
    columns: list[str]
    num_indexed_rows: int
    num_unindexed_rows: int
    pending: bool = False
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def coverage(self) -> float:
        total = self.num_indexed_rows + self.num_unindexed_rows
        return 1.0 if total == 0 else self.num_indexed_rows / total

    def __str__(self) -> str:
        state = "pending (no rows yet)" if self.pending else f"{self.coverage:.0%} of {self.num_indexed_rows + self.num_unindexed_rows:,} rows"
        return f"{self.name} ({self.index_type} on {', '.join(self.columns)}): {state}"


# -- declarations -------------------------------------------------------------

def _declared(ds: lance.LanceDataset) -> dict[str, IndexSpec]:
    out = {}
    for k, v in ds.config().items():
        if k.startswith(CONFIG_PREFIX):
            try:
                spec = IndexSpec.from_json(v)
            except (ValueError, KeyError, TypeError):
                continue  # not ours to read: ignored
            out[spec.name] = spec
    return out


def _declare(uri: str, specs: list[IndexSpec]) -> None:
    if specs:
        objects.dataset(uri).update_config({CONFIG_PREFIX + s.name: s.to_json() for s in specs})


def _undeclare(uri: str, names: list[str]) -> None:
    ds = objects.dataset(uri)
    gone = [CONFIG_PREFIX + n for n in names if CONFIG_PREFIX + n in ds.config()]
    if gone:
        ds.delete_config_keys(gone)


# -- validation ---------------------------------------------------------------

def _is_float_vector(t: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(t) and (pa.types.is_floating(t.value_type) or pa.types.is_uint8(t.value_type))


def vector_columns(schema: pa.Schema) -> list[str]:
    """Visible columns holding fixed-size vectors (what vector search can use)."""
    return [f.name for f in schema if not is_internal_column(f.name) and _is_float_vector(f.type)]


def pick_vector_column(schema: pa.Schema, table: str, requested: str | None, default: str | None = None) -> str:
    """The vector column an index or a search uses: ``requested`` as given
    (the caller checks it), the ``default`` name when the table has it, else
    the table's only vector column; ValueError when there is none or several."""
    if requested and (requested != default or requested in schema.names):
        return requested
    candidates = vector_columns(schema)
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ValueError(f"{table!r} has no vector column (a fixed-size list of floats) to index or search")
    raise ValueError(f"{table!r} has several vector columns {candidates}: name one with vector_column_name=")


def _column(schema: pa.Schema, column: Any, table: str) -> pa.Field:
    if not isinstance(column, str) or not column:
        raise ValueError(f"an index is built on one column name, got {column!r}")
    visible = [n for n in schema.names if not is_internal_column(n)]
    if column not in visible:
        raise ValueError(f"{table!r} has no column {column!r} to index; its columns are {visible}")
    return schema.field(column)


def check_spec(schema: pa.Schema, spec: IndexSpec, table: str) -> None:
    """ValueError in our words when ``spec`` cannot be built on ``schema`` (before anything is written)."""
    f = _column(schema, spec.column, table)
    t = f.type
    if spec.kind == "vector":
        if not _is_float_vector(t):
            raise ValueError(
                f"a vector index ({spec.index_type}) needs a fixed-size list of floats, such as an embedding; "
                f"{table}.{spec.column} is {t}"
            )
        metric = str(spec.params.get("metric", "l2")).lower()
        if metric not in METRICS:
            raise ValueError(f"unknown metric {spec.params.get('metric')!r}; use one of {list(METRICS)}")
    elif spec.kind == "fts":
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)
                or (pa.types.is_list(t) and pa.types.is_string(t.value_type))):
            raise ValueError(f"a full-text index needs a string column; {table}.{spec.column} is {t}")
    elif spec.index_type == "LABEL_LIST":
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            raise ValueError(f"a LABEL_LIST index needs a list column; {table}.{spec.column} is {t}")
    elif spec.index_type in SCALAR_INDEX_TYPES:
        if pa.types.is_nested(t) or _is_float_vector(t):
            raise ValueError(f"a {spec.index_type} index needs a scalar column; {table}.{spec.column} is {t}")
    else:
        raise ValueError(
            f"unknown index type {spec.index_type!r}; vector: {list(VECTOR_INDEX_TYPES)}, "
            f"scalar: {list(SCALAR_INDEX_TYPES)}, full-text: {FTS_INDEX_TYPE}"
        )


# -- building -----------------------------------------------------------------

def _build(ds: lance.LanceDataset, spec: IndexSpec, replace: bool = True) -> None:
    if spec.kind == "vector":
        ds.create_index(spec.column, index_type=spec.index_type, name=spec.name, replace=replace, **spec.params)
    else:
        ds.create_scalar_index(spec.column, index_type=spec.index_type,  # pyright: ignore[reportArgumentType]  (checked: check_spec)
                               name=spec.name, replace=replace, **spec.params)


def _lance_error(exc: Exception) -> str:
    text = str(exc).split(", /")[0].split(" at /")[0]
    return text.strip() or type(exc).__name__


def create_index(uri: str, spec: IndexSpec, *, replace: bool, table: str) -> IndexInfo:
    """Build ``spec`` on the dataset at ``uri`` and declare it (pending when
    the dataset has no rows yet). ValueError before anything is written when
    the spec cannot apply, or an index of that name exists and not ``replace``."""
    ds = objects.dataset(uri)
    check_spec(ds.schema, spec, table)
    existing = {i.name for i in list_indexes(ds)}
    if spec.name in existing and not replace:
        raise ValueError(f"{table!r} already has an index named {spec.name!r}; pass replace=True to build it again")
    if ds.count_rows() == 0:
        _declare(uri, [IndexSpec(spec.name, spec.column, spec.index_type, spec.params, pending=True)])
        return IndexInfo(spec.name, spec.index_type, [spec.column], 0, 0, pending=True, params=spec.params)
    try:
        _build(ds, spec, replace=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ValueError(f"cannot build index {spec.name!r} on {table}.{spec.column}: {_lance_error(exc)}") from exc
    _declare(uri, [spec])
    return next(i for i in list_indexes(objects.dataset(uri)) if i.name == spec.name)


def drop_index(uri: str, name: str, table: str) -> None:
    ds = objects.dataset(uri)
    names = {i.name for i in list_indexes(ds)}
    if name not in names:
        raise ValueError(f"{table!r} has no index named {name!r}; it has {sorted(names)}")
    if name in {d.name for d in ds.describe_indices()}:
        ds.drop_index(name)
    _undeclare(uri, [name])


# -- what is there ------------------------------------------------------------

def _coverage(ds: lance.LanceDataset) -> dict[str, tuple[str, list[str], set[int]]]:
    """Per index name: Lance type, columns and the fragment ids it covers."""
    out: dict[str, tuple[str, list[str], set[int]]] = {}
    for ix in ds.describe_indices():
        if ix.name.startswith("__"):  # Lance's own system indexes
            continue
        frags: set[int] = set()
        for seg in ix.segments:
            frags |= {int(f) for f in seg.fragment_ids}
        out[ix.name] = (ix.index_type, list(ix.field_names), frags)
    return out


def _live_rows(ds: lance.LanceDataset) -> dict[int, int]:
    """Rows per fragment, from the manifest (no deletion file is read)."""
    out = {}
    for f in ds.get_fragments():
        md = f.metadata
        deleted = md.deletion_file.num_deleted_rows if md.deletion_file is not None else 0
        out[f.fragment_id] = md.physical_rows - (deleted or 0)
    return out


def _type_name(lance_type: str) -> str:
    t = lance_type.upper()
    return FTS_INDEX_TYPE if t in ("INVERTED", "FTS") else t  # BTree -> BTREE, Bitmap -> BITMAP, ...


def list_indexes(ds: lance.LanceDataset) -> list[IndexInfo]:
    """Every index on the dataset (declared pending ones included), with the
    rows it covers. Cheap: no index file is read."""
    declared = _declared(ds)
    built = _coverage(ds)
    out: list[IndexInfo] = []
    if built:
        rows = _live_rows(ds)
        for name, (t, cols, frags) in sorted(built.items()):
            indexed = sum(n for fid, n in rows.items() if fid in frags)
            spec = declared.get(name)
            out.append(IndexInfo(name, spec.index_type if spec else _type_name(t), cols, indexed,
                                 sum(rows.values()) - indexed, params=spec.params if spec else {}))
    for name, spec in sorted(declared.items()):
        if name not in built and spec.pending:  # (a built one dropped through Lance directly is gone)
            out.append(IndexInfo(name, spec.index_type, [spec.column], 0, ds.count_rows(), pending=True,
                                 params=spec.params))
    return out


def index_stats(ds: lance.LanceDataset, name: str, table: str) -> dict[str, Any]:
    """Statistics of one index (Lance's, with the coverage counted here)."""
    info = {i.name: i for i in list_indexes(ds)}
    if name not in info:
        raise ValueError(f"{table!r} has no index named {name!r}; it has {sorted(info)}")
    i = info[name]
    out: dict[str, Any] = {"name": name, "index_type": i.index_type, "columns": i.columns,
                           "num_indexed_rows": i.num_indexed_rows, "num_unindexed_rows": i.num_unindexed_rows,
                           "pending": i.pending}
    if not i.pending:
        st = ds.stats.index_stats(name)
        out["num_indices"] = st.get("num_indices")
        seg = (st.get("segments") or st.get("indices") or [{}])[0]
        if "metric_type" in seg:
            out["distance_type"] = seg["metric_type"]
        if "num_partitions" in seg:
            out["num_partitions"] = seg["num_partitions"]
    return out


def _spec_from_stats(ds: lance.LanceDataset, name: str, lance_type: str, column: str) -> IndexSpec | None:
    """A declaration for an index made through Lance directly (read from its statistics)."""
    t = _type_name(lance_type)
    try:
        st = ds.stats.index_stats(name)
    except Exception:
        return None
    seg = (st.get("segments") or st.get("indices") or [{}])[0]
    params: dict[str, Any] = {}
    if t in VECTOR_INDEX_TYPES:
        if "metric_type" in seg:
            params["metric"] = seg["metric_type"]
        if "num_partitions" in seg:
            params["num_partitions"] = seg["num_partitions"]
        sub = seg.get("sub_index") or {}
        if "num_sub_vectors" in sub and t.endswith("PQ"):
            params["num_sub_vectors"] = sub["num_sub_vectors"]
    elif t == FTS_INDEX_TYPE:
        p = seg.get("params") or {}
        params = {k: p[k] for k in ("base_tokenizer", "language", "with_position", "max_token_length", "lower_case",
                                    "stem", "remove_stop_words", "ascii_folding") if k in p}
    elif t not in SCALAR_INDEX_TYPES:
        return None
    return IndexSpec(name, column, t, params)


def specs_to_rebuild(ds: lance.LanceDataset) -> list[IndexSpec]:
    """The indexes of ``ds`` as declarations, for building them again after a
    commit that replaces every row (a Lance ``Overwrite`` drops them):
    declared ones as declared, others read from their statistics."""
    declared = _declared(ds)
    out = []
    for name, (t, cols, _) in sorted(_coverage(ds).items()):
        spec = declared.get(name) or _spec_from_stats(ds, name, t, cols[0])
        if spec is not None:
            out.append(spec)
    out += [s for n, s in sorted(declared.items()) if s.pending and all(o.name != n for o in out)]
    return out


# -- keeping them fresh ---------------------------------------------------------

@dataclass
class CatchUp:
    """What :func:`catch_up` did (for results and logs)."""

    updated: list[str] = field(default_factory=list)  # incrementally (optimize_indices)
    rebuilt: list[str] = field(default_factory=list)  # from scratch
    failed: dict[str, str] = field(default_factory=dict)  # name: why (search stays right, by flat scan)

    @property
    def did_anything(self) -> bool:
        return bool(self.updated or self.rebuilt or self.failed)


def catch_up(uri: str, rebuild: list[IndexSpec] | None = None, version: int | None = None, *,
             consolidate: bool = False, ds: lance.LanceDataset | None = None) -> CatchUp:
    """Make every index of the dataset at ``uri`` cover every row.

    ``rebuild``: declarations of indexes a commit just dropped (see
    :func:`specs_to_rebuild`), built again. Pending declarations are built
    once there are rows. An index covering less than half the rows is built
    again from its declaration; one covering more is updated in place. A
    failure does not raise (the rows are committed and searches stay right,
    by flat scan): it is warned about and reported. ``version``: the one a
    commit just made (default: the latest); ``ds``: that version, open already.

    A table's primary key index is kept by its own, lazier rule
    (:func:`mv_assets.storage.keys.upkeep`; ``consolidate``: ``optimize()``,
    its segments merged into one)."""
    done = CatchUp()
    if ds is None or version is None or ds.version != version:
        ds = objects.dataset(uri, version=version)
    built = _coverage(ds)
    declared = _declared(ds)
    if keys.primary_key(ds) is not None:
        kept = keys.upkeep(uri, consolidate=consolidate, version=version)
        if kept is not None:
            (done.rebuilt if kept[1] in ("built", "rebuilt") else done.updated).append(kept[0])
        built.pop(keys.index_name(ds) or "", None)  # (not updated eagerly below)
    if not built and not declared and not rebuild:
        return done
    todo = {s.name: s for s in (rebuild or []) if s.name not in built}
    todo.update({n: s for n, s in declared.items() if n not in built and s.pending})
    stale: list[str] = []
    if built:
        rows = _live_rows(ds)
        total = sum(rows.values())
        for name, (t, cols, frags) in built.items():
            uncovered = sum(n for fid, n in rows.items() if fid not in frags)
            if not uncovered:
                continue
            spec = declared.get(name)
            if uncovered > REBUILD_UNCOVERED_SHARE * total:
                spec = spec or _spec_from_stats(ds, name, t, cols[0])
                if spec is not None:
                    todo[name] = spec
                    continue
            stale.append(name)
    if stale:
        try:
            # merged into the index rather than added as a delta segment: a search reads one
            # segment (two made searches of a 1M-row view 1.2x slower; merging costs ~1.4x the update)
            ds.optimize.optimize_indices(index_names=stale, num_indices_to_merge=1)
            done.updated += stale
        except Exception as exc:
            for n in stale:
                done.failed[n] = _lance_error(exc)
    if todo:
        ds = objects.dataset(uri)
        has_rows = ds.count_rows() > 0
        declare = []
        for name, spec in sorted(todo.items()):
            if not has_rows:
                if not spec.pending:
                    declare.append(IndexSpec(spec.name, spec.column, spec.index_type, spec.params, pending=True))
                continue
            try:
                _build(objects.dataset(uri), IndexSpec(spec.name, spec.column, spec.index_type, spec.params))
                done.rebuilt.append(name)
                if spec.pending or declared.get(name) != spec:
                    declare.append(IndexSpec(spec.name, spec.column, spec.index_type, spec.params))
            except Exception as exc:
                done.failed[name] = _lance_error(exc)
                if not spec.pending and name not in declared:
                    declare.append(IndexSpec(spec.name, spec.column, spec.index_type, spec.params, pending=True))
        _declare(uri, declare)
    for name, why in done.failed.items():
        warnings.warn(f"index {name!r} of {uri} was not brought up to date ({why}); searches stay right "
                      "(rows outside an index are scanned) and the next refresh or optimize() tries again",
                      stacklevel=2)
    return done
