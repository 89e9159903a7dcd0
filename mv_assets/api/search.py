"""Vector, full-text and hybrid search on tables and views, as Geneva and
lancedb spell it: ``t.search(vector)``, ``t.search("text", query_type="fts")``,
``t.search(query_type="hybrid").vector(v).text("words")``, then ``.where()``,
``.select()``, ``.limit()``, ``.nprobes()``, ``.refine_factor()``,
``.distance_type()``, ``.with_row_id()`` and ``.to_arrow()`` /
``.to_pandas()`` / ``.to_list()`` / ``.to_batches()``.

Results carry the user's columns (a view's internal key and marker columns are
left out) and the score columns lancedb gives: ``_distance`` (vector),
``_score`` (full text), ``_relevance_score`` (hybrid: reciprocal rank fusion
of the two, as lancedb's default ``RRFReranker``). Rows an index does not
cover yet are searched by a flat scan, so results never miss new rows.
"""

from typing import Any

import lance
import numpy as np
import pyarrow as pa

from mv_assets.model.names import is_internal_column
from mv_assets.storage import indexes

__all__ = ["SearchQuery", "is_text_query", "is_vector_query"]

DEFAULT_LIMIT = 10
RRF_K = 60  # lancedb's RRFReranker default


def is_vector_query(query: Any) -> bool:
    if isinstance(query, (pa.Array, pa.ChunkedArray, np.ndarray)):
        return True
    return isinstance(query, (list, tuple)) and len(query) > 0 and all(
        isinstance(x, (int, float, np.number)) and not isinstance(x, bool) for x in query)


def is_text_query(query: Any) -> bool:
    return isinstance(query, str)


def _as_vector(query: Any) -> np.ndarray:
    if isinstance(query, pa.ChunkedArray):
        query = query.combine_chunks()
    if isinstance(query, pa.Array):
        query = query.to_numpy(zero_copy_only=False)
    v = np.asarray(query, dtype=np.float32)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"a vector query is one non-empty list of numbers, got shape {v.shape}")
    return v


class SearchQuery:
    """A vector, full-text or hybrid search over a table or view. Builder
    methods return the query itself (as lancedb's do); nothing is read until
    a ``to_*`` method."""

    def __init__(self, table: Any, query: Any = None, *, vector_column_name: str | None = None,
                 query_type: str = "auto", fts_columns: str | list[str] | None = None) -> None:
        qt = str(query_type).lower()
        if qt not in ("auto", "vector", "fts", "hybrid"):
            raise ValueError(f"query_type must be 'auto', 'vector', 'fts' or 'hybrid', got {query_type!r}")
        self._table = table
        self._vector: np.ndarray | None = None
        self._text: str | None = None
        if qt == "auto":
            if is_text_query(query):
                qt = "fts"
            elif is_vector_query(query):
                qt = "vector"
            else:
                raise ValueError(f"search() takes a vector (list / numpy / Arrow array of numbers) or a text "
                                 f"string, got {type(query).__name__}")
        if qt == "vector":
            if not is_vector_query(query):
                raise ValueError(f"a vector search needs a vector, got {type(query).__name__}")
            self._vector = _as_vector(query)
        elif qt == "fts":
            if not is_text_query(query):
                raise ValueError(f"a full-text search needs a string, got {type(query).__name__}")
            self._text = query
        elif query is not None:  # hybrid with one of them given up front
            if is_text_query(query):
                self._text = query
            elif is_vector_query(query):
                self._vector = _as_vector(query)
            else:
                raise ValueError(f"a hybrid search takes .vector(...) and .text(...), got {type(query).__name__}")
        self._type = qt
        self._vector_column = vector_column_name
        self._fts_columns = [fts_columns] if isinstance(fts_columns, str) else (list(fts_columns) if fts_columns else None)
        self._where: str | None = None
        self._prefilter = True
        self._columns: list[str] | dict[str, str] | None = None
        self._limit: int | None = DEFAULT_LIMIT
        self._offset = 0
        self._nprobes: int | None = None
        self._refine: int | None = None
        self._metric: str | None = None
        self._ef: int | None = None
        self._with_row_id = False
        self._fast = False

    # -- builder ---------------------------------------------------------------
    def vector(self, vector: Any) -> "SearchQuery":
        if self._type not in ("hybrid", "vector"):
            raise ValueError(".vector() belongs to a vector or hybrid search")
        self._vector = _as_vector(vector)
        return self

    def text(self, text: str) -> "SearchQuery":
        if self._type not in ("hybrid", "fts"):
            raise ValueError(".text() belongs to a full-text or hybrid search")
        if not isinstance(text, str):
            raise ValueError(f".text() takes a string, got {type(text).__name__}")
        self._text = text
        return self

    def where(self, where: str, prefilter: bool = True) -> "SearchQuery":
        """Keep rows matching the SQL ``where``: before the search (prefilter,
        the default: ``limit`` results all match) or after it."""
        if not isinstance(where, str) or not where.strip():
            raise ValueError("where() takes a non-empty SQL predicate string")
        self._where, self._prefilter = where, bool(prefilter)
        return self

    def select(self, columns: list[str] | dict[str, str]) -> "SearchQuery":
        if isinstance(columns, dict):
            self._columns = dict(columns)
        elif isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
            self._columns = list(columns)
        else:
            raise ValueError("select() takes a list of column names or {name: SQL}")
        return self

    def limit(self, limit: int | None) -> "SearchQuery":
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
            raise ValueError(f"limit must be a positive int (or None), got {limit!r}")
        self._limit = limit
        return self

    def offset(self, offset: int) -> "SearchQuery":
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        self._offset = offset
        return self

    def nprobes(self, nprobes: int) -> "SearchQuery":
        self._nprobes = int(nprobes)
        return self

    def refine_factor(self, refine_factor: int) -> "SearchQuery":
        self._refine = int(refine_factor)
        return self

    def ef(self, ef: int) -> "SearchQuery":
        self._ef = int(ef)
        return self

    def distance_type(self, distance_type: str) -> "SearchQuery":
        m = str(distance_type).lower()
        if m not in indexes.METRICS:
            raise ValueError(f"unknown distance type {distance_type!r}; use one of {list(indexes.METRICS)}")
        self._metric = m
        return self

    metric = distance_type

    def with_row_id(self, with_row_id: bool = True) -> "SearchQuery":
        self._with_row_id = bool(with_row_id)
        return self

    def fast_search(self) -> "SearchQuery":
        """Search only what the indexes cover (skips the flat scan of new rows)."""
        self._fast = True
        return self

    # -- running ---------------------------------------------------------------
    def _ds(self) -> lance.LanceDataset:
        return self._table._dataset()

    def _visible(self, ds: lance.LanceDataset) -> list[str] | dict[str, str]:
        if self._columns is not None:
            names = self._columns if isinstance(self._columns, list) else []
            internal = [c for c in names if is_internal_column(c)]
            missing = [c for c in names if c not in ds.schema.names]
            if missing or internal:
                raise ValueError(f"{self._table.name!r} has no columns {missing or internal}")
            return self._columns
        return [n for n in ds.schema.names if not is_internal_column(n)]

    def _vector_col(self, ds: lance.LanceDataset) -> str:
        col = indexes.pick_vector_column(ds.schema, self._table.name, self._vector_column)
        candidates = indexes.vector_columns(ds.schema)
        if col not in candidates:
            raise ValueError(f"{self._table.name!r} has no vector column {col!r}; its vector columns are {candidates}")
        return col

    def _fts_cols(self, ds: lance.LanceDataset) -> list[str] | None:
        indexed = [i.columns[0] for i in indexes.list_indexes(ds)
                   if i.index_type == indexes.FTS_INDEX_TYPE and not i.pending]
        if not indexed:
            raise ValueError(f"{self._table.name!r} has no full-text index: create one with "
                             "create_fts_index(column) first")
        if self._fts_columns:
            missing = [c for c in self._fts_columns if c not in indexed]
            if missing:
                raise ValueError(f"no full-text index on {missing}; the indexed columns are {indexed}")
        return self._fts_columns

    def _run(self, kind: str, limit: int | None) -> pa.Table:
        ds = self._ds()
        cols = self._visible(ds)
        kwargs: dict[str, Any] = {"columns": cols, "with_row_id": True}
        if self._where:
            kwargs.update(filter=self._where, prefilter=self._prefilter)
        if kind == "vector":
            if self._vector is None:
                raise ValueError("the search has no vector: give one to search() or .vector()")
            col = self._vector_col(ds)
            dim = ds.schema.field(col).type.list_size
            if self._vector.size != dim:
                raise ValueError(f"the query vector has {self._vector.size} values; {col!r} holds {dim}")
            nearest: dict[str, Any] = {"column": col, "q": self._vector, "k": limit or ds.count_rows() or 1}
            if self._nprobes is not None:
                nearest["nprobes"] = self._nprobes
            if self._refine is not None:
                nearest["refine_factor"] = self._refine
            if self._metric is not None:
                nearest["metric"] = self._metric
            if self._ef is not None:
                nearest["ef"] = self._ef
            kwargs["nearest"] = nearest
            if self._fast:
                kwargs["fast_search"] = True
        else:
            if self._text is None:
                raise ValueError("the search has no text: give it to search() or .text()")
            fts = self._fts_cols(ds)
            kwargs["full_text_query"] = {"query": self._text, "columns": fts} if fts else self._text
            if limit is not None:
                kwargs["limit"] = limit
        try:
            return ds.to_table(**kwargs)
        except (OSError, ValueError) as exc:
            text = str(exc).split(", /")[0]
            raise ValueError(f"search on {self._table.name!r} failed: {text}") from exc

    def to_arrow(self) -> pa.Table:
        fetch = None if self._limit is None else self._limit + self._offset
        if self._type == "hybrid":
            out = self._hybrid(fetch)
        else:
            out = self._run("vector" if self._type == "vector" else "fts", fetch)
        if self._offset:
            out = out.slice(self._offset)
        if not self._with_row_id and "_rowid" in out.column_names:
            out = out.drop_columns(["_rowid"])
        return out

    def _hybrid(self, fetch: int | None) -> pa.Table:
        if self._vector is None or self._text is None:
            raise ValueError("a hybrid search needs both .vector(...) and .text(...)")
        vec = self._run("vector", fetch)
        fts = self._run("fts", fetch)
        scores: dict[int, float] = {}
        for t in (vec, fts):
            for rank, rid in enumerate(t.column("_rowid").to_pylist()):
                scores[rid] = scores.get(rid, 0.0) + 1.0 / (RRF_K + rank + 1)
        rows = pa.concat_tables([vec.drop_columns(["_distance"]), fts.drop_columns(["_score"])])
        _, first = np.unique(rows.column("_rowid").to_numpy(), return_index=True)
        rows = rows.take(pa.array(first))
        rel = pa.array([scores[r] for r in rows.column("_rowid").to_pylist()], pa.float32())
        rows = rows.append_column("_relevance_score", rel)
        rows = rows.sort_by([("_relevance_score", "descending"), ("_rowid", "ascending")])
        return rows if fetch is None else rows.slice(0, fetch)

    def to_pandas(self):
        return self.to_arrow().to_pandas()

    def to_list(self) -> list[dict]:
        return self.to_arrow().to_pylist()

    def to_batches(self, batch_size: int | None = None):
        return self.to_arrow().to_batches(max_chunksize=batch_size)

    def __repr__(self) -> str:
        return (f"SearchQuery({self._table.name!r}, type={self._type}, where={self._where!r}, "
                f"limit={self._limit})")
