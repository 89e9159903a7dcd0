"""Index calls on tables and views, with Geneva's (and lancedb's) names and
parameters: ``create_index`` (vector), ``create_scalar_index``,
``create_fts_index``, ``list_indices``, ``index_stats``, ``drop_index``.

An index on a view is kept covering every row by the engine (see
:mod:`mv_assets.storage.indexes`): each refresh brings it up to date, a full
rebuild builds it again, ``optimize()`` updates it. An index declared on a
view or table with no rows yet is built by the first refresh (or write
followed by ``optimize()``) that gives it rows.
"""

import warnings
from typing import Any, Literal

import lance

from mv_assets.storage import indexes, objects
from mv_assets.storage.indexes import IndexInfo, IndexSpec

__all__ = ["Indexed", "VECTOR_COLUMN_NAME"]

VECTOR_COLUMN_NAME = "vector"  # Geneva's and lancedb's default vector column


class Indexed:
    """Index methods of :class:`~mv_assets.api.table.Table` (and so of views)."""

    name: str
    uri: str
    connection: Any

    def _dataset(self, version: int | None = None) -> lance.LanceDataset: ...

    def _index_lock(self):
        # the lock of the table's refreshes and column writes: an index build
        # never races a commit of the engine's on the same dataset
        return self.connection._refresh_lock(self.name, 600.0)

    def _create(self, spec: IndexSpec, replace: bool) -> IndexInfo:
        with self._index_lock(), objects.reusing_handles():
            return indexes.create_index(self.uri, spec, replace=replace, table=self.name)

    def create_index(
        self,
        metric: str = "L2",
        num_partitions: int | None = None,
        num_sub_vectors: int | None = None,
        vector_column_name: str = VECTOR_COLUMN_NAME,
        replace: bool = True,
        accelerator: Any = None,
        index_cache_size: int | None = None,
        *,
        index_type: Literal["IVF_FLAT", "IVF_PQ", "IVF_SQ", "IVF_HNSW_FLAT", "IVF_HNSW_SQ", "IVF_HNSW_PQ"] = "IVF_PQ",
        num_bits: int = 8,
        max_iterations: int = 50,
        sample_rate: int = 256,
        m: int = 20,
        ef_construction: int = 300,
        name: str | None = None,
    ) -> IndexInfo:
        """A vector index on ``vector_column_name`` (default ``"vector"``, or
        the table's only vector column). Returns what was built (or declared:
        ``pending`` on a table or view without rows yet)."""
        column = indexes.pick_vector_column(self._dataset().schema, self.name, vector_column_name, VECTOR_COLUMN_NAME)
        itype = str(index_type).upper()
        params: dict[str, Any] = {"metric": str(metric).lower()}
        if num_partitions is not None:
            params["num_partitions"] = int(num_partitions)
        if itype in ("IVF_PQ", "IVF_HNSW_PQ"):
            if num_sub_vectors is not None:
                params["num_sub_vectors"] = int(num_sub_vectors)
            params["num_bits"] = int(num_bits)
        if itype.startswith("IVF_HNSW"):
            params.update(m=int(m), ef_construction=int(ef_construction))
        params.update(max_iters=int(max_iterations), sample_rate=int(sample_rate))
        if accelerator is not None:
            params["accelerator"] = accelerator
        if index_cache_size is not None:
            params["index_cache_size"] = int(index_cache_size)
        return self._create(IndexSpec(name or f"{column}_idx", column, itype, params), replace)

    def create_scalar_index(
        self,
        column: str,
        *,
        replace: bool = True,
        index_type: Literal["BTREE", "BITMAP", "LABEL_LIST"] = "BTREE",
        name: str | None = None,
    ) -> IndexInfo:
        """A scalar index (BTREE, BITMAP or LABEL_LIST) speeding up filters on ``column``."""
        itype = str(index_type).upper()
        if itype not in indexes.SCALAR_INDEX_TYPES:
            raise ValueError(f"unknown scalar index type {index_type!r}; use one of {list(indexes.SCALAR_INDEX_TYPES)}")
        return self._create(IndexSpec(name or f"{column}_idx", column, itype, {}), replace)

    def create_fts_index(
        self,
        field_names: str | list[str],
        *,
        ordering_field_names: str | list[str] | None = None,
        replace: bool = False,
        writer_heap_size: int | None = 1024 * 1024 * 1024,
        tokenizer_name: str | None = None,
        with_position: bool = True,
        base_tokenizer: Literal["simple", "raw", "whitespace"] = "simple",
        language: str = "English",
        max_token_length: int | None = 40,
        lower_case: bool = True,
        stem: bool = False,
        remove_stop_words: bool = False,
        ascii_folding: bool = False,
        name: str | None = None,
        **kwargs: Any,
    ) -> list[IndexInfo]:
        """A full-text (Lance INVERTED) index on each of ``field_names``.

        ``ordering_field_names`` and ``writer_heap_size`` belong to the
        tantivy-based index Lance no longer uses: accepted, warned about when
        given. ``tokenizer_name`` in the old form (``"en_stem"``, ``"raw"``,
        ...) is read as language/stemming/base tokenizer."""
        fields = [field_names] if isinstance(field_names, str) else list(field_names)
        if not fields or not all(isinstance(f, str) and f for f in fields):
            raise ValueError(f"create_fts_index takes a column name or a list of them, got {field_names!r}")
        if name is not None and len(fields) > 1:
            raise ValueError("name= applies to one field; several fields get one index each, named <field>_idx")
        if ordering_field_names:
            warnings.warn("ordering_field_names is a tantivy option; Lance's full-text index orders by score only: "
                          "ignored", stacklevel=2)
        if writer_heap_size != 1024 * 1024 * 1024:
            warnings.warn("writer_heap_size is a tantivy option; Lance's full-text index sizes its own memory: ignored",
                          stacklevel=2)
        for k in kwargs:
            warnings.warn(f"create_fts_index({k}=...) does not apply to Lance's full-text index: ignored", stacklevel=2)
        if tokenizer_name:
            t = tokenizer_name.lower()
            if t in ("raw", "whitespace", "simple"):
                base_tokenizer = t  # type: ignore[assignment]
            elif t != "default":
                lang, _, rest = t.partition("_")
                languages = {"en": "English", "fr": "French", "de": "German", "es": "Spanish", "it": "Italian",
                             "pt": "Portuguese", "ru": "Russian", "nl": "Dutch", "sv": "Swedish"}
                if lang not in languages:
                    raise ValueError(f"unknown tokenizer_name {tokenizer_name!r}; use e.g. 'default', 'raw', 'en_stem'")
                language, stem = languages[lang], rest == "stem"
        params = {"with_position": bool(with_position), "base_tokenizer": base_tokenizer, "language": language,
                  "lower_case": bool(lower_case), "stem": bool(stem), "remove_stop_words": bool(remove_stop_words),
                  "ascii_folding": bool(ascii_folding)}
        if max_token_length is not None:
            params["max_token_length"] = int(max_token_length)
        specs = [IndexSpec(name or f"{f}_idx", f, indexes.FTS_INDEX_TYPE, params) for f in fields]
        schema = self._dataset().schema
        for s in specs:  # every field checked before any index is built
            indexes.check_spec(schema, s, self.name)
        return [self._create(s, replace) for s in specs]

    def list_indices(self) -> list[IndexInfo]:
        """Every index: name, ``index_type``, ``columns`` and the rows it covers."""
        return indexes.list_indexes(self._dataset())

    def index_stats(self, index_name: str) -> dict[str, Any]:
        """``num_indexed_rows``, ``num_unindexed_rows``, ``index_type``,
        ``distance_type`` (vector indexes), ``num_indices`` of one index."""
        return indexes.index_stats(self._dataset(), index_name, self.name)

    def drop_index(self, name: str) -> None:
        """Remove an index (and its declaration: no refresh builds it again)."""
        with self._index_lock(), objects.reusing_handles():
            indexes.drop_index(self.uri, name, self.name)

    def optimize_indices(self) -> dict:
        """Bring every index up to date now (what each refresh does for a view)."""
        with self._index_lock(), objects.reusing_handles():
            done = indexes.catch_up(self.uri)
        return {"updated": done.updated, "rebuilt": done.rebuilt, "failed": done.failed}
