"""Views that are not materialized (``db.create_view``): a stored query,
computed when read.

The definition (the query's filter, columns, UDFs, shuffle and limit, as a
materialized view stores it) is kept in ``<catalog>/_mv_assets/views/<name>.json``;
there is no dataset and no refresh: every read evaluates the query over the
source's latest version in this process (UDFs included, so a view with an
expensive UDF costs that UDF on every read: materialize it instead). Views are
read-only. Their source cannot be dropped while they exist, and a column they
read cannot be dropped or renamed (as for materialized views).
"""

from typing import Any

import pyarrow as pa

from mv_assets.model.definition import ViewDefinition
from mv_assets.model.kinds import kind_of
from mv_assets.model.names import is_internal_column
from mv_assets.storage import objects
from mv_assets.storage.layout import Layout

__all__ = ["View", "view_path", "view_names", "read_view_definition", "write_view_definition", "remove_view"]


def view_path(layout: Layout, name: str) -> str:
    return layout.state("views", f"{name}.json")


def view_names(layout: Layout) -> list[str]:
    """Names of the catalog's (not materialized) views, sorted."""
    return sorted(e[: -len(".json")] for e in objects.listdir(layout.state("views")) if e.endswith(".json"))


def read_view_definition(layout: Layout, name: str) -> str | None:
    """The stored definition (JSON) of view ``name``, or None."""
    return objects.read_text(view_path(layout, name))


def write_view_definition(layout: Layout, name: str, definition: ViewDefinition) -> bool:
    """Store a new view's definition; False when the name was taken meanwhile."""
    return objects.write_text(view_path(layout, name), definition.encode().decode(), create=True)


def remove_view(layout: Layout, name: str) -> None:
    objects.remove(view_path(layout, name))


class View:
    """A view that is not materialized: its rows are its query's over the
    source's latest version, computed each time it is read."""

    def __init__(self, connection: Any, name: str, raw: str) -> None:
        self.connection = connection
        self.name = name
        self._raw = raw
        self._definition: ViewDefinition | None = None

    def __repr__(self) -> str:
        return f"View({self.name!r}, source={self.source!r})"

    @property
    def definition(self) -> ViewDefinition:
        if self._definition is None:
            self._definition = ViewDefinition.decode(self._raw)
        return self._definition

    @property
    def source(self) -> str:
        import json

        return json.loads(self._raw)["source"]

    def _datasets(self) -> list:
        """Every source's dataset at its latest version (a join: each table's)."""
        return [self.connection.open_table(n)._dataset() for n in self.definition.sources]

    @property
    def schema(self) -> pa.Schema:
        """The view's columns (its query's output)."""
        full = kind_of(self.definition).schema(self.definition, self._datasets())
        return pa.schema([f for f in full if not is_internal_column(f.name)])

    def to_arrow(self) -> pa.Table:
        """The query's rows over its sources' latest versions, computed now."""
        from mv_assets.api.query import rows_in_process

        return rows_in_process(self.definition, self._datasets())

    def to_pandas(self) -> Any:
        return self.to_arrow().to_pandas()

    def head(self, n: int = 5) -> pa.Table:
        return self.to_arrow().slice(0, n)

    def count_rows(self, filter: str | None = None) -> int:
        if filter is not None:
            raise ValueError("count_rows(filter=) is not supported on a view that is not materialized")
        return self.to_arrow().num_rows

    def __len__(self) -> int:
        return self.count_rows()

    def __bool__(self) -> bool:
        return True
