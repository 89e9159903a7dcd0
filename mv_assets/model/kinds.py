"""View kinds, chosen once: what every layer asks of a view's kind.

A view's kind is decided by its stored definition (``ViewDefinition.kind``:
``"query"``, or its function's ``"kind"``) and looked up here once; the
layers above keep one registry each, keyed by the same names:

* **model** (here): :class:`ViewKind`, what the kind *is*: its sources, what
  a row of its plan counts, whether a source fragment refreshes on its own;
* **ops**: ``ops.kinds.PLANNERS``, the kind's planner;
* **execution**: ``execution.tasks.KIND_TASKS``, the kind's task work;
* **api**: ``api.catalog``'s schema by kind (``ViewKind.schema_module``);
* **dagster**: the wiring asks :func:`kind_of` for labels and partitioning.

Adding a kind is one module per layer and one line in each registry (see
docs/architecture.md, "Adding a view kind").

>>> kind_of({"source": "t", "columns": []}).a_noun, kind_of({"function": {"kind": "aggregate"}}).unit
('a materialized view', 'groups')
>>> kind_of({"source": "a", "function": {"kind": "join", "sources": ["a", "b"]}}).sources_of(
...     {"source": "a", "function": {"kind": "join", "sources": ["a", "b"]}})
['a', 'b']
"""

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ViewKind", "KINDS", "kind_of", "kind_name"]


def _one_source(definition: dict) -> list[str]:
    return [definition["source"]] if definition.get("source") else []


def _join_sources(definition: dict) -> list[str]:
    return list((definition.get("function") or {}).get("sources") or _one_source(definition))


def _tables_read(definition: dict) -> list[str]:
    """A join aggregate's tables as its users see them (lineage): its join's
    tables, each once, without the join kept under it (model.join_agg_view)."""
    from mv_assets.model.names import JOIN_UNDER_PREFIX

    return [s for s in dict.fromkeys(_join_sources(definition)) if not s.startswith(JOIN_UNDER_PREFIX)]


@dataclass(frozen=True)
class ViewKind:
    """What every layer asks of a kind of view."""

    name: str
    noun: str  # how messages name such a view ("chunk view")

    @property
    def a_noun(self) -> str:
        """The noun with its article ("an aggregate view")."""
        return ("an " if self.noun[0] in "aeiou" else "a ") + self.noun
    unit: str  # what a row of its refresh plan counts ("rows", "parents", "partitions", "groups")
    # a fragment of its (first) source refreshes on its own: a Dagster partition maps to it
    by_fragment: bool
    # each view row is one source row's (its key is that row's stable id): a row's
    # columns can be checked against its source row, added columns computed from it
    row_per_source_row: bool
    # the module whose ``view_schema(definition, datasets)`` gives the view's schema
    schema_module: str
    # why add_columns() does not apply to such a view (None: it does)
    no_added_columns: str | None = None
    sources_of: Callable[[dict], list[str]] = _one_source
    # its rows are children of one source row each (keyed by parent, numbered within
    # it); columns added to it are computed from its own rows, as a table's
    children: bool = False

    def __repr__(self) -> str:
        return f"ViewKind({self.name!r})"

    def schema(self, definition: Any, datasets: list) -> Any:
        """The Arrow schema of a view of this kind over its sources' ``datasets``
        (validates the query against them: bad SQL, names or types raise ValueError)."""
        return importlib.import_module(self.schema_module).view_schema(definition, datasets)


KINDS: dict[str, ViewKind] = {k.name: k for k in (
    ViewKind("query", "materialized view", "rows", True, True, "mv_assets.model.definition"),
    ViewKind("chunker", "chunk view", "parents", True, False, "mv_assets.model.chunk_view", children=True),
    ViewKind("udtf", "table-function view", "partitions", False, False, "mv_assets.model.udtf_view",
             "its rows come from no one source row; add the column to the UDTF's output_schema"),
    ViewKind("aggregate", "aggregate view", "groups", False, False, "mv_assets.model.agg_view",
             "its rows are groups; add an aggregate to its agg()"),
    ViewKind("join", "join view", "rows", False, False, "mv_assets.model.join_view",
             "its rows come from several tables; add the column to the join's select()", _join_sources),
    ViewKind("join_aggregate", "aggregate view", "groups", False, False, "mv_assets.model.join_agg_view",
             "its rows are groups; add an aggregate to its agg()", _tables_read),
)}


def kind_name(definition: Any) -> str:
    """The kind's name of a definition (a ``ViewDefinition`` or its stored JSON)."""
    if isinstance(definition, dict):
        function = definition.get("function") or {}
        if isinstance(function, str):
            function = json.loads(function)
        return function.get("kind") or "query"
    return definition.kind


def kind_of(definition: Any) -> ViewKind:
    """The :class:`ViewKind` of a definition (a ``ViewDefinition`` or its stored JSON);
    a kind this version does not know is refused in words."""
    name = kind_name(definition)
    kind = KINDS.get(name)
    if kind is None:
        raise ValueError(f"a {name!r} view, which this version of mv_assets does not know (kinds: {sorted(KINDS)})")
    return kind
